"""How publish_many cuts its input into batched-publish chunks (sans-IO part)."""

from __future__ import annotations

import pytest

from liftlog.client import OutgoingMessage
from liftlog.client.publish_batches import CHUNK_BYTES, _chunks, _prepared_chunks
from liftlog.client.types import PublishValue
from liftlog.storage.records import NewRecord, decode_new_records, encode_headers, encode_prepared, encode_records


async def chunk_sizes(values: list[bytes], size: int) -> list[int]:
    return [count async for _, _, count in _chunks(values, size, None, None)]


async def chunk_records(chunks) -> list[list[NewRecord]]:
    return [decode_new_records(data, count) async for _, data, count in chunks]


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
    # A str header value is sent UTF-8 encoded (as over PublishAsync: test_client.py).
    message = OutgoingMessage("v", key="k", headers={"h": "x"})
    values: list[PublishValue] = [message, b"plain", "text"]
    ((raw, data, count),) = [c async for c in _chunks(values, 10, b"default", {"d": b"1"})]
    assert raw == values
    records = decode_new_records(data, count)
    assert [(r.value, r.key, dict(r.headers)) for r in records] == [
        (b"v", b"k", {"h": b"x"}),
        (b"plain", b"default", {"d": b"1"}),
        (b"text", b"default", {"d": b"1"}),
    ]


async def test_records_go_out_as_they_are() -> None:
    record = NewRecord(b"v", b"k", {"h": b"x"})
    ((records),) = await chunk_records(_chunks([record, b"plain"], 10, b"default", None))
    assert (records[0].value, records[0].key, dict(records[0].headers)) == (b"v", b"k", {"h": b"x"})
    assert (records[1].value, records[1].key) == (b"plain", b"default")


async def test_async_input_is_chunked_too() -> None:
    async def gen():
        for i in range(5):
            yield b"%d" % i

    got = await chunk_records(_chunks(gen(), 2, None, None))
    assert [[r.value for r in c] for c in got] == [[b"0", b"1"], [b"2", b"3"], [b"4"]]


def test_prepared_records_encode_as_new_records_do() -> None:
    headers = {"h": b"x", "other": b""}
    prepared = [(None, b"v", b"", 0), (b"k", b"w", encode_headers(headers), 2), (b"", b"", b"", 0)]
    made = [NewRecord(b"v", None, {}, 0), NewRecord(b"w", b"k", headers, 0), NewRecord(b"", b"", {}, 0)]
    assert encode_prepared(prepared) == encode_records(made)


async def test_prepared_chunks_hold_at_most_the_window_and_about_chunk_bytes() -> None:
    small = [(None, b"x", b"", 0)] * 2500
    assert [n async for _, _, n in _prepared_chunks(small, 1000)] == [1000, 1000, 500]
    big = (None, b"b" * (CHUNK_BYTES - 100), b"", 0)
    chunks = [c async for c in _prepared_chunks([(None, b"s" * 1000, b"", 0)] * 2 + [big, big], 1000)]
    assert [n for _, _, n in chunks] == [2, 1, 1]
    assert [r.value for r in decode_new_records(chunks[0][1], 2)] == [b"s" * 1000] * 2
    assert [c async for c in _prepared_chunks([], 10)] == []


async def test_prepared_chunks_encode_each_chunk_as_encode_prepared_does() -> None:
    headers = encode_headers({"h": b"x"})
    records = [(None, b"v" * (i % 7), b"", 0) if i % 3 else (b"k%d" % i, b"w", headers, 1) for i in range(2300)]
    records.append((b"", b"", b"", 0))
    at = 0
    for _, data, n in [c async for c in _prepared_chunks(records, 1000)]:
        assert data == encode_prepared(records[at : at + n])
        at += n
    assert at == len(records)


def test_a_batch_ack_is_an_ordinary_ack() -> None:
    from liftlog.client import Ack, AckPolicy
    from liftlog.client.types import batch_ack

    made = batch_ack("s", "subj", 7, AckPolicy.ALL, 1, 2)
    assert made == Ack("s", "subj", "subj", 7, "", "", AckPolicy.ALL, 1, 2)
    assert hash(made) == hash(Ack("s", "subj", "subj", 7, "", "", AckPolicy.ALL, 1, 2))


def test_a_fast_made_message_is_an_ordinary_frozen_message() -> None:
    import dataclasses
    import pickle

    from liftlog.client import AckPolicy, Message
    from liftlog.client.types import message

    made = message(3, b"k", b"v", 9, "s", 1, "subj", "r", {"h": b"1"}, "in", "c", 1)
    plain = Message(3, b"k", b"v", 9, "s", 1, "subj", "r", {"h": b"1"}, "in", "c", AckPolicy.ALL)
    assert type(made) is Message and made == plain and hash(made) == hash(plain) and repr(made) == repr(plain)
    assert pickle.loads(pickle.dumps(made)) == plain and dataclasses.replace(made, offset=4).offset == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.offset = 5  # type: ignore[misc]
    assert message(0, None, b"", 0, "s", 0, "", "", {}, "", "", 99).ack_policy == AckPolicy.LEADER  # unknown number
