"""The source's read task without Spark: exact ranges, Arrow columns, and ranges the partition no longer has."""

from __future__ import annotations

from typing import Any

import pytest

from liftlog.spark import reading
from liftlog.spark.blocking import BlockingClient, LiftlogSparkError
from liftlog.spark.offsets import OffsetRange
from liftlog.spark.reading import RangeReader

from .conftest import fill, make_stream


def rows(reader: RangeReader) -> list[dict[str, Any]]:
    return [row for batch in reader.batches() for row in batch.to_pylist()]


def test_a_range_reads_exactly_its_offsets(liftlog_server: Any, stream_name: str) -> None:
    make_stream(liftlog_server.address, stream_name)
    fill(liftlog_server.address, stream_name, {0: [b"m%d" % i for i in range(30)]})
    reader = RangeReader(
        (liftlog_server.address,), OffsetRange(stream_name, 0, 7, 19), include_headers=True, fail_on_data_loss=True
    )
    got = rows(reader)
    assert [r["offset"] for r in got] == list(range(7, 19))
    assert [r["value"] for r in got] == [b"m%d" % i for i in range(7, 19)]
    assert {r["stream"] for r in got} == {stream_name} and {r["partition"] for r in got} == {0}
    assert all(r["headers"] == [] and r["key"] is None for r in got)


def test_a_range_past_the_high_watermark(
    liftlog_server: Any, stream_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reading, "HW_WAIT_S", 0.3)
    make_stream(liftlog_server.address, stream_name)
    fill(liftlog_server.address, stream_name, {0: [b"x"] * 5})
    beyond = OffsetRange(stream_name, 0, 2, 9)
    strict = RangeReader((liftlog_server.address,), beyond, include_headers=False, fail_on_data_loss=True)
    with pytest.raises(LiftlogSparkError, match=r"offsets out of range .* needs offsets 2 to 8 .* end at 4"):
        rows(strict)
    lenient = RangeReader((liftlog_server.address,), beyond, include_headers=False, fail_on_data_loss=False)
    assert [r["offset"] for r in rows(lenient)] == [2, 3, 4]


def without_batch_fetch(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Make read tasks meet a server without liftlog.Batches (as a Liftbridge server is); counts the refusals."""
    from liftlog.client import UnimplementedError

    refused = {"n": 0}

    async def unimplemented(*args: Any) -> Any:
        refused["n"] += 1
        raise UnimplementedError("unknown service liftlog.Batches")

    monkeypatch.setattr(reading, "_fetch", unimplemented)
    return refused


@pytest.mark.parametrize("fetching", [True, False], ids=["fetch", "subscribe"])
def test_both_read_paths_give_the_same_rows(
    liftlog_server: Any, stream_name: str, monkeypatch: pytest.MonkeyPatch, fetching: bool
) -> None:
    from liftlog.client import AckPolicy, Client

    make_stream(liftlog_server.address, stream_name)
    fill(liftlog_server.address, stream_name, {0: [b"m%d" % i for i in range(20)]})

    async def keyed(client: Client) -> None:
        await client.publish(
            stream_name, b"last", key=b"k", headers={"h": b"1", "x": b""}, ack_policy=AckPolicy.ALL, msg_id="last-1"
        )

    with BlockingClient([liftlog_server.address]) as bc:
        bc.run(keyed)
    refused = without_batch_fetch(monkeypatch) if not fetching else {"n": 0}
    reader = RangeReader(
        (liftlog_server.address,), OffsetRange(stream_name, 0, 5, 21), include_headers=True, fail_on_data_loss=True
    )
    got = rows(reader)
    assert refused["n"] == (0 if fetching else 1), "a refused fetch falls back to Subscribe once"
    assert [r["offset"] for r in got] == list(range(5, 21))
    assert [r["value"] for r in got] == [b"m%d" % i for i in range(5, 20)] + [b"last"]
    assert got[-1]["key"] == b"k" and sorted((h["key"], h["value"]) for h in got[-1]["headers"]) == [
        ("Nats-Msg-Id", b"last-1"),
        ("h", b"1"),
        ("x", b""),
    ]
    assert all(r["key"] is None and r["headers"] == [] for r in got[:-1])
    assert {r["subject"] for r in got} == {stream_name}
    assert all(r["timestamp"].year >= 2026 for r in got)


def test_a_read_that_loses_its_server_resubscribes_from_the_next_offset(
    liftlog_server: Any, stream_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the Subscribe path, the leader going away mid-read (as _take reports it) costs a new subscription."""
    from liftlog.client import UnavailableError

    without_batch_fetch(monkeypatch)

    make_stream(liftlog_server.address, stream_name)
    fill(liftlog_server.address, stream_name, {0: [b"m%d" % i for i in range(50)]})
    real_take = reading._take
    calls = {"n": 0}

    async def flaky_take(sub: Any, limit: int, include_headers: bool) -> Any:
        calls["n"] += 1
        if calls["n"] <= 2:  # twice: 7 messages, then the connection drops
            chunk, _ = await real_take(sub, 7, include_headers)
            return chunk, UnavailableError("connection to the leader lost")
        return await real_take(sub, limit, include_headers)

    monkeypatch.setattr(reading, "_take", flaky_take)
    reader = RangeReader(
        (liftlog_server.address,), OffsetRange(stream_name, 0, 3, 40), include_headers=False, fail_on_data_loss=True
    )
    assert [r["offset"] for r in rows(reader)] == list(range(3, 40))  # no gap, no repeat
    assert calls["n"] >= 3

    monkeypatch.setattr(reading, "RESUBSCRIBES", 1)
    calls["n"] = 0
    with pytest.raises(LiftlogSparkError, match=r"failed 2 times, last at offset 17: connection to the leader lost"):
        rows(reader)


def test_an_unreachable_server_is_named_once() -> None:
    with BlockingClient(["127.0.0.1:1"], timeout=1.0) as bc, pytest.raises(LiftlogSparkError) as failure:
        bc.run(lambda client: client.fetch_metadata())
    message = str(failure.value)
    assert message.startswith("no liftlog server answered at 127.0.0.1:1: "), message
    assert message.count("no liftlog server answered") == 1, message


def test_a_worker_freezes_its_heap_once_after_its_first_whole_task(monkeypatch: pytest.MonkeyPatch) -> None:
    from liftlog.spark import source

    frozen: list[int] = []
    monkeypatch.setattr("liftlog.spark.source.gc.freeze", lambda: frozen.append(1))
    monkeypatch.setattr(source, "_worker_heap_frozen", False)

    def failing() -> Any:
        yield 1
        raise LiftlogSparkError("the read failed")

    with pytest.raises(LiftlogSparkError):
        list(source._freeze_when_done(failing()))
    assert frozen == []  # a failed task: perhaps not everything the tasks need is loaded yet
    batches = source._freeze_when_done(iter([1, 2]))
    assert next(batches) == 1 and frozen == []  # not while the task runs: its imports may not be done
    assert list(batches) == [2] and frozen == [1]
    assert list(source._freeze_when_done(iter([3]))) == [3] and frozen == [1]
