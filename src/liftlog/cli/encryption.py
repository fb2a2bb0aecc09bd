"""``liftlog encryption``: offline work on a stopped server's encrypted data."""

from __future__ import annotations

import os
from pathlib import Path

import click

from liftlog.cli.common import fail
from liftlog.cli.output import err_console, out_console

__all__ = ["encryption"]


@click.group()
def encryption() -> None:
    """Encryption at rest: move a stopped server's data to a new master key."""


@encryption.command()
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="the stopped server's data.dir",
)
@click.option(
    "--key-file",
    default="",
    help="the new master key (as encryption.key.file; default: LIFTBRIDGE_ENCRYPTION_KEY)",
)
@click.option(
    "--previous-key-file",
    "previous",
    multiple=True,
    help="a master key the data is encrypted under now (repeat for several)",
)
@click.option(
    "--reencrypt",
    is_flag=True,
    help="decrypt and encrypt every batch again under fresh data keys (slower; also upgrades old batches to "
    "the partition-bound format)",
)
@click.option("--dry-run", is_flag=True, help="read and check everything, write nothing")
def rewrap(data_dir: Path, key_file: str, previous: tuple[str, ...], reencrypt: bool, dry_run: bool) -> None:
    """Put every encrypted batch of a stopped server under a new master key.

    By default each batch's data key is unwrapped with the key that wrapped it and
    wrapped again with the new one: fast, and the ciphertext stays. --reencrypt
    encrypts the records again under fresh data keys. Every batch is checked
    (decrypted) before it is rewritten; segments are replaced whole, so the run can
    be stopped and started again. Afterwards the server needs only the new key:

    \b
      liftlog keygen --master-key new.key
      liftlog encryption rewrap --data-dir ./data --key-file new.key \\
          --previous-key-file old.key --dry-run
      liftlog encryption rewrap --data-dir ./data --key-file new.key --previous-key-file old.key
      liftlog server --data-dir ./data --set encryption.key.file=new.key ...

    Run it on every server; until all are done, servers need both keys
    (encryption.previous.key.files), since followers copy their leader's batches.
    """
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
    from rich.table import Table

    from liftlog.security.master_key import MasterKeyError, load_master_keys
    from liftlog.storage.encryption import BatchCipher
    from liftlog.storage.rewrap import RewrapError, RewrapReport, find_partitions, lock_data_dir, rewrap_partition

    try:
        current, older = load_master_keys(key_file, previous)
    except MasterKeyError as exc:
        fail(str(exc))
    if current is None:
        fail("give the new master key: --key-file FILE or LIFTBRIDGE_ENCRYPTION_KEY")
    cipher = BatchCipher(current, older)
    try:
        lock = lock_data_dir(data_dir)
    except RewrapError as exc:
        fail(str(exc))
    total = RewrapReport()
    try:
        parts = find_partitions(data_dir)
        size = sum(f.stat().st_size for p in parts for f in p.path.glob("*.log"))
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=err_console(),
            transient=True,
        ) as bar:
            task = bar.add_task("checking" if dry_run else ("re-encrypting" if reencrypt else "rewrapping"), total=size)
            for part in parts:
                bar.update(task, description=part.name)
                total.add(
                    rewrap_partition(
                        part,
                        cipher,
                        reencrypt=reencrypt,
                        dry_run=dry_run,
                        progress=lambda n: bar.advance(task, n),
                    )
                )
    except RewrapError as exc:
        fail(str(exc) + ("" if dry_run else " (segments already rewritten stay so; running again continues)"))
    finally:
        os.close(lock)

    table = Table(title="encrypted batches found", title_justify="left")
    table.add_column("master key")
    table.add_column("format", justify="right")
    table.add_column("batches", justify="right")
    for (key_id, version), n in sorted(total.before.items()):
        mark = " (new)" if key_id == current.id.hex() else ""
        table.add_row(key_id + mark, f"v{version}", f"{n:,}")
    out = out_console()
    out.print(table)
    verb = "would be" if dry_run else "were"
    changed = total.reencrypted if reencrypt else total.rewrapped
    out.print(
        f"{len(parts)} partitions, {total.bytes_read / 2**20:,.1f} MiB read: {changed:,} batches {verb} "
        f"{'re-encrypted' if reencrypt else 'rewrapped'} under {current.id.hex()}, {total.unchanged:,} already were, "
        f"{total.clear:,} are not encrypted; {total.segments_written} segment files written."
    )
    v1 = sum(n for (_, version), n in total.before.items() if version == 1)
    if v1 and not reencrypt:
        out.print(
            f"{v1:,} batches use the format before partition binding (v1); --reencrypt upgrades them.",
            style="yellow",
        )
