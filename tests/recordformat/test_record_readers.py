"""Every reader of the record format decodes the same bytes to the records written.

Batches are written by the real encoder (several in a row, with the offset
gaps compaction leaves inside a batch and empty batches where it left
nothing), then read back by each reader of the format:

- ``liftlog.recordformat.walk_records``, the shared walk: the reference;
- storage's ``decode_records`` (the log's reads);
- the server's ``encode_messages`` (Subscribe's catch-up), its protobuf parsed back;
- the client's ``decode_batches`` (``Client.fetch``, liftlog subscriptions), with and without headers and fields;
- the Spark source's ``arrow_batch``, which takes only records whose headers leave them to columns and
  refuses the others (its caller then uses ``decode_batches``).

Each must give back the records with offsets in ``[start, limit)``, and where it says where the next read
starts, the same place. Two of them inline the walk in their own loop for speed: this is what keeps them
the same walk.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from liftlog.api import api_pb2
from liftlog.api.stored import StoredFields, decode_fields, encode_fields
from liftlog.client.batches import decode_batches
from liftlog.recordformat import BatchHeader, batch_headers, batches_end, decode_headers, walk_records
from liftlog.server.partitions.messages import encode_messages
from liftlog.storage import NewRecord
from liftlog.storage.records import decode_records, encode_batch, encode_empty_batch, iter_batch_headers, retain_records

pa = pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

from liftlog.spark.arrow_batches import arrow_batch  # noqa: E402
from liftlog.spark.reading import arrow_schema  # noqa: E402

STREAM, PARTITION, SUBJECT = "orders", 3, "orders.new"
FIELDS = "\x00fields"


@dataclass(frozen=True)
class Written:
    """A record as written, with what a reader should make of it."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]

    @property
    def user_headers(self) -> dict[str, bytes]:
        return {k: v for k, v in self.headers.items() if not k.startswith("\x00")}

    @property
    def fields(self) -> StoredFields:
        return decode_fields(self.headers[FIELDS]) if FIELDS in self.headers else StoredFields()

    @property
    def subject(self) -> str:
        return self.fields.subject or SUBJECT

    @property
    def columnar(self) -> bool:
        """Whether the Spark source takes it column-wise: no header but a publisher's hidden one, or only
        ``\\x00fields`` without a subject."""
        names = set(self.headers)
        return names <= {"\x00msgid"} or (names == {FIELDS} and not self.fields.subject)


user_names = st.text(max_size=8).filter(lambda name: not name.startswith("\x00"))
header_sets = st.one_of(
    st.just({}),
    st.builds(
        lambda subject, reply, inbox, cid, policy: {FIELDS: encode_fields(subject, reply, inbox, cid, policy)},
        st.sampled_from(["", "orders.eu"]),
        st.text(max_size=6),
        st.text(max_size=6),
        st.text(max_size=6),
        st.sampled_from([0, 1, 2]),
    ),
    st.builds(lambda msg_id: {"\x00msgid": msg_id}, st.binary(min_size=1, max_size=8)),
    st.dictionaries(user_names, st.binary(max_size=12), min_size=1, max_size=3),
).flatmap(
    lambda base: st.one_of(
        st.just(base),
        st.dictionaries(user_names, st.binary(max_size=12), max_size=2).map(lambda user: {**base, **user}),
    )
)
records = st.builds(
    NewRecord,
    st.one_of(st.binary(max_size=20), st.binary(min_size=200, max_size=700)),
    st.one_of(st.none(), st.binary(max_size=20)),
    header_sets,
    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
)
# Per batch: its records, and which of them compaction kept (None: all of them).
batches = st.lists(
    st.lists(records, min_size=1, max_size=8).flatmap(
        lambda rs: st.tuples(st.just(rs), st.one_of(st.none(), st.sets(st.integers(0, len(rs) - 1))))
    ),
    min_size=1,
    max_size=4,
)


def write(
    spec: list[tuple[list[NewRecord], set[int] | None]], base: int, default_ts: int
) -> tuple[bytes, list[Written]]:
    """The batches as stored, and the records they hold."""
    data, written, offset = b"", [], base
    for rs, kept in spec:
        batch = encode_batch(offset, 7, rs, default_ts)
        if kept is not None:
            header = next(iter_batch_headers(batch))
            retained = retain_records(batch, header, sorted(kept))
            batch = retained if retained is not None else encode_empty_batch(offset, len(rs) - 1, 7)
        data += batch
        for i, r in enumerate(rs):
            if kept is None or i in kept:
                ts = default_ts if r.timestamp is None else r.timestamp
                written.append(Written(offset + i, ts, r.key, r.value, dict(r.headers)))
        offset += len(rs)
    return data, written


def by_reference(data: bytes, start: int, limit: int) -> list[Written]:
    out = []
    for header in batch_headers(data, verify=True):
        for offset, ts, key_at, key_len, value_at, value_len, n_headers, end in walk_records(
            data, header, start, limit
        ):
            key = data[key_at : key_at + key_len] if key_len >= 0 else None
            value_end = value_at + value_len
            headers = decode_headers(memoryview(data), value_end, n_headers, end) if n_headers else {}
            out.append(Written(offset, ts, key, data[value_at:value_end], headers))
    return out


def by_storage(data: bytes, start: int, limit: int) -> list[Written]:
    return [
        Written(r.offset, r.timestamp, r.key, r.value, dict(r.headers))
        for header in iter_batch_headers(data, verify=True)
        for r in decode_records(memoryview(data), header, start, limit)
    ]


def by_server(data: bytes, headers: list[BatchHeader], start: int, limit: int) -> list[api_pb2.Message]:
    out: list[bytes] = []
    for header in headers:
        encode_messages(memoryview(data), header, start, limit, STREAM, PARTITION, SUBJECT, out, 10**9, 2**62)
    return [api_pb2.Message.FromString(m) for m in out]


def as_message(w: Written) -> api_pb2.Message:
    f = w.fields
    return api_pb2.Message(
        offset=w.offset,
        key=w.key or b"",
        value=w.value,
        timestamp=w.timestamp,
        stream=STREAM,
        partition=PARTITION,
        subject=w.subject,
        replySubject=f.reply,
        headers=w.user_headers,
        ackInbox=f.ack_inbox,
        correlationId=f.correlation_id,
        ackPolicy=f.ack_policy,  # type: ignore[arg-type]
    )


@settings(max_examples=400, deadline=None)
@given(
    spec=batches,
    base=st.sampled_from([0, 1, 127, 16383, 16384, 2**21 - 1, 2**40]),
    default_ts=st.sampled_from([0, -5, 1_763_884_800_123_456_789]),
    start_delta=st.integers(0, 12),
    end_cut=st.integers(0, 6),
)
def test_every_reader_decodes_the_same_bytes_to_the_records_written(
    spec: list[tuple[list[NewRecord], set[int] | None]], base: int, default_ts: int, start_delta: int, end_cut: int
) -> None:
    data, written = write(spec, base, default_ts)
    end = base + sum(len(rs) for rs, _ in spec)
    start = base + start_delta
    limit = max(start, end - end_cut)
    want = [w for w in written if start <= w.offset < limit]
    headers = list(iter_batch_headers(data, verify=True))
    assert sum(h.size for h in headers) == len(data)
    next_offset = batches_end(data, start, limit)

    assert by_reference(data, start, limit) == want
    assert by_storage(data, start, limit) == want
    assert by_server(data, headers, start, limit) == [as_message(w) for w in want]

    cols, client_next = decode_batches(data, start, limit, SUBJECT, headers=True, fields=True)
    assert client_next == next_offset
    assert cols.offsets == [w.offset for w in want]
    assert cols.timestamps == [w.timestamp for w in want]
    assert cols.keys == [w.key for w in want]
    assert cols.values == [w.value for w in want]
    assert cols.subjects == [w.subject for w in want]
    assert cols.headers == [w.user_headers for w in want]
    assert cols.fields == [w.fields for w in want]
    plain, _ = decode_batches(data, start, limit, SUBJECT)
    assert (plain.offsets, plain.keys, plain.values, plain.subjects) == (
        cols.offsets,
        cols.keys,
        cols.values,
        cols.subjects,
    )
    assert plain.headers == []
    assert plain.fields == []

    # The Spark source refuses bytes whose batches in range hold a record it cannot take column-wise.
    in_range = [w for w, h in _with_batches(written, headers) if h.last_offset >= start and h.base_offset < limit]
    got = arrow_batch(data, start, limit, arrow_schema(False), STREAM, PARTITION, SUBJECT)
    if not all(w.columnar for w in in_range):
        assert got is None
        return
    assert got is not None
    batch, spark_next = got
    assert spark_next == next_offset
    if not want:
        assert batch is None
        return
    assert batch is not None
    assert batch.column("offset").to_pylist() == [w.offset for w in want]
    assert batch.column("key").to_pylist() == [w.key for w in want]
    assert batch.column("value").to_pylist() == [w.value for w in want]
    assert batch.column("timestamp").cast(pa.int64()).to_pylist() == [w.timestamp // 1000 for w in want]
    assert batch.column("subject").to_pylist() == [SUBJECT] * len(want)
    assert batch.column("stream").to_pylist() == [STREAM] * len(want)
    assert batch.column("partition").to_pylist() == [PARTITION] * len(want)


def _with_batches(written: list[Written], headers: list[BatchHeader]) -> list[tuple[Written, BatchHeader]]:
    """Each record with the header of the batch that holds it."""
    return [(w, h) for w in written for h in headers if h.base_offset <= w.offset <= h.last_offset]
