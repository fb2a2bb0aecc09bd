"""Moving a stopped server's encrypted data to a new master key (``liftlog encryption rewrap``).

Two ways, per batch of every encrypted partition under ``<data dir>/streams``:

- **rewrap** (the default): the batch's data key is unwrapped with the master key that wrapped it and
  wrapped again with the new one. Nonce and ciphertext stay; only 46 bytes of the envelope change.
- **re-encrypt**: the batch is decrypted and encrypted again under a fresh data key, as envelope
  version 2 (bound to its partition). This also upgrades version 1 batches, at the cost of an
  AES-GCM pass over all the data.

Either way every batch keeps its size, so positions, the offset and time indexes, and the
replication protocol's view of the log are unchanged. Each batch is decrypted before it is
rewritten, so a damaged batch stops the run with its name instead of being carried on.

Each segment is written to ``<segment>.rewrap`` beside it, flushed, and renamed over the original
(the file's mtime is kept: retention reads it), so a crash leaves every segment either old or new,
and running again finishes the job: batches already under the new key (and, with re-encryption,
already version 2) are left alone. Bytes after the last whole batch (a torn write recovery will cut)
are copied as they are.
"""

from __future__ import annotations

import fcntl
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from liftlog.recordformat import BatchHeader

from .encryption import ATTR_ENCRYPTED, BatchCipher, EncryptionError, envelope_of, partition_context
from .errors import InvalidBatch, StorageError
from .records import iter_batch_headers

__all__ = ["PartitionDir", "RewrapReport", "find_partitions", "lock_data_dir", "rewrap_partition"]

_TEMP_SUFFIX = ".rewrap"


class RewrapError(StorageError):
    """The data cannot be rewrapped as asked; the message names the file and batch."""


@dataclass(frozen=True)
class PartitionDir:
    """One partition's log directory and what its batches are bound to."""

    path: Path
    stream: str
    partition: int
    created: int

    @property
    def context(self) -> bytes:
        return partition_context(self.stream, self.partition, self.created)

    @property
    def name(self) -> str:
        return f"{self.stream}/{self.partition}"


@dataclass
class RewrapReport:
    """What a run found (``before``) and did; counts of batches unless named bytes."""

    #: (master key id hex, envelope version) -> encrypted batches found.
    before: Counter[tuple[str, int]] = field(default_factory=Counter)
    rewrapped: int = 0
    reencrypted: int = 0
    #: Encrypted batches already as asked (under the new key; with re-encryption also version 2).
    unchanged: int = 0
    clear: int = 0
    segments_written: int = 0
    bytes_read: int = 0

    def add(self, other: RewrapReport) -> None:
        self.before.update(other.before)
        self.rewrapped += other.rewrapped
        self.reencrypted += other.reencrypted
        self.unchanged += other.unchanged
        self.clear += other.clear
        self.segments_written += other.segments_written
        self.bytes_read += other.bytes_read


def lock_data_dir(data_dir: Path) -> int:
    """Take the data directory's lock as a server does, so no server runs while the data changes.

    Returns the descriptor holding the lock (close it to release); RewrapError if a server holds it.
    """
    path = data_dir / "LOCK"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise RewrapError(f"cannot open {path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RewrapError(
            f"data directory {data_dir} is in use by a liftlog server (pid {holder}): stop it first"
        ) from None
    return fd


def find_partitions(data_dir: Path) -> list[PartitionDir]:
    """Every partition log under ``data_dir/streams``, in name order."""
    streams = data_dir / "streams"
    if not streams.is_dir():
        raise RewrapError(f"{data_dir} holds no streams (no {streams} directory): is it a liftlog data directory?")
    found: list[PartitionDir] = []
    for stream_dir in sorted(p for p in streams.iterdir() if p.is_dir()):
        marker = stream_dir / ".created"
        try:
            created = int(marker.read_text().strip())
        except (OSError, ValueError) as exc:
            raise RewrapError(f"cannot read the stream's creation time in {marker}: {exc}") from None
        for part_dir in sorted((p for p in stream_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=_as_int):
            found.append(PartitionDir(part_dir, stream_dir.name, int(part_dir.name), created))
    return found


def segment_files(part: PartitionDir) -> list[Path]:
    return sorted(part.path.glob("*.log"))


def rewrap_partition(
    part: PartitionDir,
    cipher: BatchCipher,
    *,
    reencrypt: bool = False,
    dry_run: bool = False,
    progress: Callable[[int], None] = lambda n: None,
) -> RewrapReport:
    """Rewrap (or re-encrypt) every encrypted batch of one partition under ``cipher``'s current key."""
    current = cipher.current
    if current is None:
        raise RewrapError("no new master key to rewrap under")
    report = RewrapReport()
    context = part.context
    for stale in part.path.glob("*" + _TEMP_SUFFIX):  # from a run that stopped midway
        if not dry_run:
            stale.unlink()
    for path in segment_files(part):
        data = path.read_bytes()
        out = bytearray()
        changed = False
        consumed = 0
        for header in _whole_batches(data):
            batch = memoryview(data)[header.position : header.position + header.size]
            consumed = header.position + header.size
            if not header.attributes & ATTR_ENCRYPTED:
                report.clear += 1
                out += batch
                continue
            version, key_id = envelope_of(data, header)
            report.before[(key_id.hex(), version)] += 1
            if key_id == current.id and (version == 2 or not reencrypt):
                report.unchanged += 1
                out += batch
                continue
            try:
                if reencrypt:
                    new = cipher.encrypt(cipher.decrypt(data, header, context), context=context)
                    report.reencrypted += 1
                else:
                    new = cipher.rewrap(data, header, context)
                    report.rewrapped += 1
            except EncryptionError as exc:
                raise RewrapError(f"{part.name}, segment {path.name}: {exc}") from None
            if len(new) != header.size:  # positions and indexes depend on it
                raise RewrapError(
                    f"{part.name}, segment {path.name}: the batch at base offset {header.base_offset} would change "
                    f"size ({header.size} -> {len(new)} bytes); nothing of this segment was written"
                )
            out += new
            changed = True
        out += data[consumed:]  # a torn tail, if any, stays for recovery to cut
        report.bytes_read += len(data)
        progress(len(data))
        if changed and not dry_run:
            _replace(path, bytes(out))
            report.segments_written += 1
    return report


def _whole_batches(data: bytes) -> Iterator[BatchHeader]:
    try:
        yield from iter_batch_headers(data)
    except InvalidBatch:
        return  # what follows cannot be a batch: copied as it is, for recovery to judge


def _replace(path: Path, content: bytes) -> None:
    stat = path.stat()
    temp = path.with_name(path.name + _TEMP_SUFFIX)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, stat.st_mode & 0o777)
    try:
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.utime(temp, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(temp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _as_int(p: Path) -> int:
    return int(p.name)
