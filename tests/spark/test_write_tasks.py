"""The sink's write task without Spark: Arrow batches in, messages out, and the exactly-once re-run scan."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from liftlog.client import OutgoingMessage
from liftlog.spark.blocking import LiftlogSparkError
from liftlog.spark.writing import ROW_HEADER, TXN_HEADER, Txn, _digest, write_batches

from .conftest import make_stream, read_all


def batch(values: list[bytes], keys: list[bytes | None] | None = None) -> pa.RecordBatch:
    columns = {"value": pa.array(values, pa.binary())}
    if keys is not None:
        columns["key"] = pa.array(keys, pa.binary())
    return pa.RecordBatch.from_pydict(columns)


def test_txn_tag_round_trip() -> None:
    txn = Txn("7f1c-query", 12, 3)
    assert Txn.parse(txn.tag) == ("7f1c-query", 12, 3)
    assert Txn.parse(b"not a tag") is None


def test_a_rerun_writes_only_what_the_failed_attempt_did_not(liftlog_server: Any, stream_name: str) -> None:
    addr = (liftlog_server.address,)
    make_stream(liftlog_server.address, stream_name, partitions=2)
    rows = [b"r%02d" % i for i in range(40)] + [b"dup", b"dup"]  # identical rows count as two
    keys: list[bytes | None] = [None if i % 3 else b"k%d" % i for i in range(len(rows))]
    txn = Txn("query-a", 5, 0)

    # Attempt 1 dies after writing its first 25 rows.
    first = write_batches(addr, iter([batch(rows[:25], keys[:25])]), default_stream=stream_name, txn=txn)
    assert first.total == 25 and first.skipped == 0
    # Attempt 2 gets the same rows in another order (a shuffle may reorder them) and writes the rest.
    order = list(reversed(range(len(rows))))
    second = write_batches(
        addr,
        iter([batch([rows[i] for i in order], [keys[i] for i in order])]),
        default_stream=stream_name,
        txn=txn,
    )
    assert second.skipped == 25 and second.total == len(rows) - 25
    messages = [m for p in range(2) for m in read_all(liftlog_server.address, stream_name, p)]
    assert sorted(m.value for m in messages) == sorted(rows)  # each row once, both 'dup's kept
    assert {m.headers[TXN_HEADER] for m in messages} == {b"query-a/5/0"}
    assert len({(m.headers[ROW_HEADER]) for m in messages}) == len(rows)

    # The next micro-batch writes everything: the scan stops at batch 5's messages.
    again = write_batches(addr, iter([batch(rows)]), default_stream=stream_name, txn=Txn("query-a", 6, 0))
    assert again.skipped == 0 and again.total == len(rows)
    # Another task of the same batch, or another query, is not confused with this one.
    other = write_batches(addr, iter([batch(rows[:3])]), default_stream=stream_name, txn=Txn("query-b", 5, 0))
    assert other.skipped == 0


def test_a_zombie_attempt_writing_beside_its_retry_stores_each_row_once(
    liftlog_server: Any, stream_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two attempts of one task that both scanned the partition before either wrote (the scan saw nothing of
    the other, as when a zombie attempt still writes beside its retry): the rows' message ids (task and row)
    make the server store each row once."""
    from liftlog.spark import writing

    addr = (liftlog_server.address,)
    make_stream(liftlog_server.address, stream_name)
    rows = [b"z%03d" % i for i in range(300)]
    txn = Txn("query-z", 1, 0)
    monkeypatch.setattr(writing, "existing_rows", lambda client, **kw: _nothing(client))
    first = write_batches(addr, iter([batch(rows)]), default_stream=stream_name, txn=txn)
    # The other attempt gets the rows in another order, with a key column: the per-row path, the same ids.
    second = write_batches(
        addr, iter([batch(list(reversed(rows)), [None] * len(rows))]), default_stream=stream_name, txn=txn
    )
    assert first.total == second.total == len(rows)  # both sent everything: neither saw the other
    messages = read_all(liftlog_server.address, stream_name)
    assert sorted(m.value for m in messages) == rows
    assert all(m.headers["Nats-Msg-Id"].startswith(b"query-z/1/0/") for m in messages)


async def _nothing(client: Any) -> set[bytes]:
    return set()


def test_without_txn_rows_are_written_again(liftlog_server: Any, stream_name: str) -> None:
    addr = (liftlog_server.address,)
    make_stream(liftlog_server.address, stream_name)
    for _ in range(2):
        write_batches(addr, iter([batch([b"a", b"b"])]), default_stream=stream_name, txn=None)
    assert [m.value for m in read_all(liftlog_server.address, stream_name)] == [b"a", b"b", b"a", b"b"]
    assert all(TXN_HEADER not in m.headers for m in read_all(liftlog_server.address, stream_name))


def test_bad_rows_fail_with_their_row_number(liftlog_server: Any, stream_name: str) -> None:
    addr = (liftlog_server.address,)
    make_stream(liftlog_server.address, stream_name)
    nulls = pa.RecordBatch.from_pydict({"value": pa.array([b"ok", None], pa.binary())})
    with pytest.raises(LiftlogSparkError, match=f"row 1 of the write to stream '{stream_name}' has a null value"):
        write_batches(addr, iter([nulls]), default_stream=stream_name, txn=None)
    reserved = pa.RecordBatch.from_pydict(
        {
            "value": pa.array([b"x"], pa.binary()),
            "headers": pa.array(
                [[{"key": TXN_HEADER, "value": b"forged"}]],
                pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
            ),
        }
    )
    with pytest.raises(LiftlogSparkError, match="reserved for liftlog's exactly-once writes"):
        write_batches(addr, iter([reserved]), default_stream=stream_name, txn=None)
    with pytest.raises(LiftlogSparkError, match="say which stream to write to"):
        write_batches(addr, iter([batch([b"x"])]), default_stream=None, txn=None)


def test_exactly_once_after_a_leader_change_mid_write(
    liftlog_server: Any, stream_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write cut off after some messages (as by a leader change) is resumed from the log, not resent blindly."""
    from liftlog.client import Client, UnavailableError
    from liftlog.spark import writing

    addr = (liftlog_server.address,)
    make_stream(liftlog_server.address, stream_name)
    real = Client.publish_prepared
    cuts = {"n": 0}

    async def cut_after_ten(self: Client, stream: str, records: Any, **kwargs: Any) -> Any:
        if cuts["n"] == 0:
            cuts["n"] += 1
            assert kwargs["resend_unacked"] is False  # exactly once: no blind resend by the client
            await real(self, stream, list(records)[:10], **kwargs)
            raise UnavailableError("the leader went away")
        return await real(self, stream, records, **kwargs)

    monkeypatch.setattr(Client, "publish_prepared", cut_after_ten)
    monkeypatch.setattr(writing, "REWRITE_BACKOFF_S", 0.0)
    rows = [b"r%02d" % i for i in range(30)]
    result = write_batches(addr, iter([batch(rows)]), default_stream=stream_name, txn=Txn("q", 0, 0))
    assert result.total == 30 and cuts["n"] == 1
    assert sorted(m.value for m in read_all(liftlog_server.address, stream_name)) == rows  # each once


def test_the_rerun_scan_crosses_compaction_gaps(
    liftlog_server: Any, stream_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan window that begins in a compacted-away gap is not the start of the log: keep reading back."""
    import time

    from liftlog.spark import writing

    from .conftest import fill

    monkeypatch.setattr(writing, "SCAN_WINDOW", 8)
    addr = (liftlog_server.address,)
    make_stream(
        liftlog_server.address, stream_name, compact_enabled=True, segment_max_bytes=512, cleaner_interval_ms=100
    )
    txn = Txn("query-c", 3, 0)
    rows = [b"mine-%d" % i for i in range(5)]
    keys: list[bytes | None] = [b"own-%d" % i for i in range(5)]
    write_batches(addr, iter([batch(rows, keys)]), default_stream=stream_name, txn=txn)
    # Then another writer's messages, all one key: compaction leaves one of them and long gaps.
    fill(liftlog_server.address, stream_name, {0: [OutgoingMessage(b"other", b"same") for _ in range(120)]})
    deadline = time.monotonic() + 20
    while len(read_all(liftlog_server.address, stream_name)) > 60:
        assert time.monotonic() < deadline, "compaction did not run"
        time.sleep(0.1)

    again = write_batches(addr, iter([batch(rows, keys)]), default_stream=stream_name, txn=txn)
    assert again.skipped == 5 and again.total == 0
    mine = [m.value for m in read_all(liftlog_server.address, stream_name) if m.value.startswith(b"mine")]
    assert sorted(mine) == rows


def test_the_row_digest_is_the_one_earlier_releases_wrote() -> None:
    """Row ids must not change between releases: a re-run after an upgrade would not find its rows."""
    import hashlib

    from liftlog.spark.writing import _digest

    def reference(
        stream: str, key: bytes | None, value: bytes, headers: dict[str, bytes], partition: int | None
    ) -> bytes:
        h = hashlib.blake2b(digest_size=12)
        for part in (stream.encode(), b"-" if key is None else b"+" + key, value, str(partition).encode()):
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
        for k, v in sorted(headers.items()):
            h.update(len(k).to_bytes(8, "big") + k.encode() + len(v).to_bytes(8, "big") + v)
        return h.digest()

    cases: tuple[tuple[str, bytes | None, bytes, dict[str, bytes], int | None], ...] = (
        ("s", None, b"v", {}, None),
        ("orders", b"k", b"", {"b": b"2", "a": b"1"}, 3),
        ("é", b"", b"x" * 300, {}, 0),
    )
    for args in cases:
        assert _digest(*args) == reference(*args)


def _with_headers(values: list[bytes], headers: list[dict[str, bytes]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "value": pa.array(values, pa.binary()),
            "headers": pa.array(
                [[{"key": k, "value": v} for k, v in h.items()] for h in headers],
                pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
            ),
            "partition": pa.array([i % 2 for i in range(len(values))], pa.int32()),
        }
    )


def test_many_batches_keep_their_order_headers_and_row_ids(liftlog_server: Any, stream_name: str) -> None:
    """Each batch is published while the next one's rows are made: per partition, rows stay in input order."""
    addr = (liftlog_server.address,)
    make_stream(liftlog_server.address, stream_name, partitions=2)
    batches = [
        _with_headers(
            [b"b%d-%04d" % (b, i) for i in range(1500)], [{"n": b"%d" % i} if i % 2 else {} for i in range(1500)]
        )
        for b in range(4)
    ]
    result = write_batches(addr, iter(batches), default_stream=stream_name, txn=Txn("q-order", 1, 0))
    assert result.total == 6000 and result.written == {f"{stream_name}/0": 3000, f"{stream_name}/1": 3000}
    for p in range(2):
        got = read_all(liftlog_server.address, stream_name, p)
        expected = [v for b in batches for i, v in enumerate(b.column("value").to_pylist()) if i % 2 == p]
        assert [m.value for m in got] == expected
        for m in got[:4]:
            user = {k: v for k, v in m.headers.items() if k not in (TXN_HEADER, ROW_HEADER, "Nats-Msg-Id")}
            assert user == ({"n": m.value.split(b"-")[1].lstrip(b"0")} if p else {})
            assert m.headers[TXN_HEADER] == b"q-order/1/0" and m.headers[ROW_HEADER]


def test_a_bad_row_while_the_previous_batch_is_being_published(liftlog_server: Any, stream_name: str) -> None:
    addr = (liftlog_server.address,)
    make_stream(liftlog_server.address, stream_name)
    good = batch([b"g%04d" % i for i in range(3000)])
    bad = pa.RecordBatch.from_pydict({"value": pa.array([b"ok"] * 700 + [None], pa.binary())})
    with pytest.raises(LiftlogSparkError, match=r"row 3700 .* has a null value"):
        write_batches(addr, iter([good, bad]), default_stream=stream_name, txn=Txn("q-bad", 0, 0))
    values = [m.value for m in read_all(liftlog_server.address, stream_name)]
    assert values == [b"g%04d" % i for i in range(len(values))], "what got in is a prefix of the first batch"


def test_a_server_without_batched_publish_gets_messages_one_by_one(
    liftlog_server: Any, stream_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Liftbridge has no liftlog.Batches: the sink falls back to publish_many (PublishAsync there)."""
    from liftlog.client import Client, UnimplementedError

    async def unimplemented(self: Client, *args: Any, **kwargs: Any) -> None:
        raise UnimplementedError("no liftlog.Batches here")

    monkeypatch.setattr(Client, "publish_prepared", unimplemented)
    addr = (liftlog_server.address,)
    make_stream(liftlog_server.address, stream_name)
    rows = [b"r%d" % i for i in range(20)]
    keys: list[bytes | None] = [b"k" if i == 3 else None for i in range(20)]
    result = write_batches(addr, iter([batch(rows, keys)]), default_stream=stream_name, txn=Txn("q-lb", 0, 0))
    assert result.total == 20
    got = read_all(liftlog_server.address, stream_name)
    assert [m.value for m in got] == rows and got[3].key == b"k"
    assert all(m.headers[TXN_HEADER] == b"q-lb/0/0" for m in got) and len({m.headers[ROW_HEADER] for m in got}) == 20


def _per_row(values: list[bytes], **columns: Any) -> pa.RecordBatch:
    """A batch the per-row path takes: an empty headers list per row (no headers, as for the column-wise one)."""
    header = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
    data = {"value": pa.array(values, pa.binary()), "headers": pa.array([[] for _ in values], header)}
    data.update(columns)
    return pa.RecordBatch.from_pydict(data)


def _plain(values: list[bytes], **columns: Any) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"value": pa.array(values, pa.binary()), **columns})


@pytest.mark.parametrize("routing", ["digest", "partition column", "stream column"])
def test_plain_batches_are_written_as_the_per_row_path_writes_them(
    liftlog_server: Any, stream_name: str, routing: str
) -> None:
    """Value-only batches take a column-wise path: the same messages, row ids, partitions and re-run skips."""
    addr = (liftlog_server.address,)
    rows = [b"v%03d" % i for i in range(300)] + [b"same"] * 3 + [b""]
    columns: dict[str, Any] = {}
    if routing == "partition column":
        columns["partition"] = pa.array([1] * len(rows), pa.int32())
    written = {}
    for name, make in (("plain", _plain), ("rows", _per_row)):
        target = f"{stream_name}-{name}"
        make_stream(liftlog_server.address, target, partitions=3)
        if routing == "stream column":
            columns["stream"] = pa.array([target] * len(rows))
        stream = None if routing == "stream column" else target
        txn = Txn("q", 1, 0)
        # Attempt 1 writes 100 rows; the re-run gets them all, reversed, and the other path writes the rest.
        first = write_batches(addr, iter([make(rows[:100], **_cut(columns, 100))]), default_stream=stream, txn=txn)
        other = _per_row if make is _plain else _plain
        rerun = write_batches(addr, iter([other(rows[::-1], **_reversed(columns))]), default_stream=stream, txn=txn)
        assert first.total == 100 and rerun.skipped == 100 and rerun.total == len(rows) - 100
        written[name] = {
            p: sorted((m.value, m.headers[ROW_HEADER], m.headers[TXN_HEADER]) for m in read_all(addr[0], target, p))
            for p in range(3)
        }
    # The re-runs above crossed paths (100 skipped, none twice), so both make the same row ids; and those are
    # the per-row digest of each row with its occurrence, in the partition the digest picks.
    for name, by_partition in written.items():
        target = f"{stream_name}-{name}"
        part = 1 if routing == "partition column" else None
        for p, messages in by_partition.items():
            for value, row_id, _ in messages:
                digest = _digest(target, None, value, {}, part)
                assert row_id.rsplit(b".", 1)[0] == digest.hex().encode()
                assert p == (1 if part is not None else int.from_bytes(digest[:4], "big") % 3)
        assert sorted(m[0] for ms in by_partition.values() for m in ms) == sorted(rows)
    same = sorted(m[1] for ms in written["plain"].values() for m in ms if m[0] == b"same")
    assert [r.rsplit(b".", 1)[1] for r in same] == [b"1", b"2", b"3"]
    if routing == "partition column":
        assert not written["plain"][0] and not written["plain"][2]
    else:
        assert all(written["plain"].values())  # digests spread keyless rows over the partitions


def _cut(columns: dict[str, Any], n: int) -> dict[str, Any]:
    return {k: v.slice(0, n) for k, v in columns.items()}


def _reversed(columns: dict[str, Any]) -> dict[str, Any]:
    return {k: pa.array(v.to_pylist()[::-1], v.type) for k, v in columns.items()}
