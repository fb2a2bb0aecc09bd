"""How publish_many cuts its input into batched-publish chunks (sans-IO part)."""

from __future__ import annotations

from liftlog.client import OutgoingMessage
from liftlog.client.publish_batches import CHUNK_BYTES, _chunks
from liftlog.storage.records import NewRecord


async def chunk_sizes(values: list[object], size: int) -> list[int]:
    return [len(records) async for _, records in _chunks(values, size, None, None)]  # type: ignore[arg-type]


async def test_chunks_hold_at_most_the_window() -> None:
    assert await chunk_sizes([b"x"] * 2500, 1000) == [1000, 1000, 500]
    assert await chunk_sizes([b"x"] * 3, 1) == [1, 1, 1]
    assert await chunk_sizes([], 10) == []


async def test_a_big_message_starts_a_chunk_of_its_own() -> None:
    """So a chunk stays under NATS's max payload: small ones, then one close to the limit, are two chunks."""
    big = b"b" * (CHUNK_BYTES - 100)
    assert await chunk_sizes([b"s" * 1000, b"s" * 1000, big, b"s"], 1000) == [2, 2]
    assert await chunk_sizes([big, big], 1000) == [1, 1]


async def test_each_message_keeps_its_key_and_headers() -> None:
    values = [OutgoingMessage("v", key="k", headers={"h": "x"}), b"plain", "text"]
    ((raw, records),) = [c async for c in _chunks(values, 10, b"default", {"d": b"1"})]  # type: ignore[arg-type]
    assert raw == values
    assert [(r.value, r.key, dict(r.headers)) for r in records] == [
        (b"v", b"k", {"h": b"x"}),
        (b"plain", b"default", {"d": b"1"}),
        (b"text", b"default", {"d": b"1"}),
    ]


async def test_records_go_out_as_they_are() -> None:
    record = NewRecord(b"v", b"k", {"h": b"x"})
    ((_, records),) = [c async for c in _chunks([record, b"plain"], 10, b"default", None)]
    assert records[0] is record  # no conversion: the Spark sink's rows
    assert (records[1].value, records[1].key) == (b"plain", b"default")


async def test_async_input_is_chunked_too() -> None:
    async def gen():  # type: ignore[no-untyped-def]
        for i in range(5):
            yield b"%d" % i

    got = [records async for _, records in _chunks(gen(), 2, None, None)]
    assert [[r.value for r in c] for c in got] == [[b"0", b"1"], [b"2", b"3"], [b"4"]]


def test_a_batch_ack_is_an_ordinary_ack() -> None:
    from liftlog.client import Ack, AckPolicy
    from liftlog.client.types import batch_ack

    made = batch_ack("s", "subj", 7, AckPolicy.ALL, 1, 2)
    assert made == Ack("s", "subj", "subj", 7, "", "", AckPolicy.ALL, 1, 2)
    assert hash(made) == hash(Ack("s", "subj", "subj", 7, "", "", AckPolicy.ALL, 1, 2))
