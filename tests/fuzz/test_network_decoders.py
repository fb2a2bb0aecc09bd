"""Fuzzing where outside bytes first enter a server: the HTTP/2 core of the gRPC API, and NATS messages on
a stream's subject.

The two properties of ``test_decoders``, for decoders that must never raise:

- ``ServerConnection.receive`` gets random bytes, and mutated valid client
  streams (preface, SETTINGS, request headers, gRPC messages, pings,
  window updates, resets), in random pieces; it returns events or closes
  the connection with a GOAWAY, never raises, and what it writes back is
  whole frames. The same pieces give the same events and bytes again.
- ``incoming_from_nats`` gets random payloads, and mutated Publish and
  record batch envelopes (also with their records damaged behind a valid
  CRC); every payload becomes an Incoming, a payload that is not an
  envelope is stored as it came.
"""

from __future__ import annotations

import gzip
import itertools
import struct

import hpack
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from tests.fuzz.common import BINARY, decodes_or_refuses, fuzz_settings, mutate, mutated, names

from liftlog.api import api_pb2
from liftlog.api._gen.batches_pb2 import RecordBatchEnvelope
from liftlog.api.batch_envelope import decode_record_batch, encode_record_batch
from liftlog.api.envelope import decode_publish_message, encode_publish_message
from liftlog.recordformat import RECORD_HEADER
from liftlog.rpc import wire
from liftlog.rpc.connection import BufferBudget
from liftlog.rpc.server_connection import (
    ConnectionLimits,
    ConnectionTerminated,
    MessageReceived,
    PingAcked,
    RequestEnded,
    RequestReceived,
    ServerConnection,
    StreamReset,
    WindowOpened,
)
from liftlog.rpc.wire import END_HEADERS, END_STREAM, FrameType, Setting
from liftlog.server.partitions.messages import Incoming, incoming_from_nats
from liftlog.storage import NewRecord
from liftlog.storage.records import encode_records

# -- liftlog.rpc.ServerConnection -----------------------------------------------------

EVENTS = (RequestReceived, MessageReceived, RequestEnded, StreamReset, WindowOpened, PingAcked, ConnectionTerminated)
#: Small limits, so that a short input reaches them: streams, windows, message and header sizes, rates.
TIGHT = ConnectionLimits(
    max_concurrent_streams=2,
    stream_window=1024,
    max_header_list_size=512,
    max_header_block_bytes=1024,
    max_message_bytes=600,
    max_buffered_bytes=2048,
    max_ping_strikes=2,
    settings_rate=(5, 1.0),
    reset_rate=(5, 1.0),
    junk_rate=(5, 1.0),
)
LIMITS = st.sampled_from([ConnectionLimits(), TIGHT])
START = wire.PREFACE + wire.settings_frame([])


def frame_types(data: bytes) -> list[int]:
    """The type of each frame in ``data``, which must be whole frames (what the server writes)."""
    types = []
    pos = 0
    while pos < len(data):
        assert len(data) - pos >= 9, "the server's output ends inside a frame header"
        length = int.from_bytes(data[pos : pos + 3], "big")
        assert len(data) - pos - 9 >= length, "the server's output ends inside a frame"
        types.append(data[pos + 3])
        pos += 9 + length
    return types


def serve(chunks: list[bytes], limits: ConnectionLimits) -> tuple[list[object], bytes]:
    """Feed ``chunks`` to a new server connection as an application would: every message taken and answered,
    every call ended. Returns the events and everything the server wrote."""
    budget = BufferBudget(8192)  # small: the fuzzer's clients run into it (servers share one by default)
    conn = ServerConnection(limits, budget)
    events: list[object] = []
    out = bytearray(conn.data_to_send())
    for i, chunk in enumerate(chunks):
        got = conn.receive(chunk, now=i * 0.01)
        assert all(isinstance(e, EVENTS) for e in got), got
        for event in got:
            if isinstance(event, MessageReceived):
                conn.consumed(event.stream_id, event.size)
                conn.send_message(event.stream_id, event.data[:16])
            elif isinstance(event, RequestEnded):
                conn.send_trailers(event.stream_id, 0)
        events += got
        out += conn.data_to_send()
        # The byte accounting that bounds what a peer can make us hold (white-box, as tests/rpc checks it).
        streams = conn._streams.values()
        assert conn._partial == sum(len(s.buf) for s in streams)
        assert conn._buffered == sum(s.held for s in streams)
        assert budget.used == conn.budget_charged <= budget.limit
        if not conn.closed:
            assert conn._footprint() <= budget.floor + conn.budget_charged, "held or granted beyond the budget"
        if conn.closed:
            assert any(isinstance(e, ConnectionTerminated) and not e.by_peer for e in events)
            assert conn.receive(b"\x00" * 9, now=i) == [], "a closed connection takes nothing more"
    types = frame_types(bytes(out))
    if conn.closed:
        assert FrameType.GOAWAY in types, "a connection closed without a GOAWAY"
    return events, bytes(out)


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at ``cuts``: frames split across reads."""
    bounds = [0, *sorted(min(c, len(data)) for c in cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


CUTS = st.lists(st.integers(0, 2100), max_size=4)


def _setting(setting: Setting) -> st.SearchStrategy[tuple[int, int]]:
    """A SETTINGS entry with a value RFC 9113 allows for it."""
    if setting == Setting.ENABLE_PUSH:
        values = st.integers(0, 1)
    elif setting == Setting.MAX_FRAME_SIZE:
        values = st.sampled_from([16_384, 65_535, 2**24 - 1])
    else:
        values = st.sampled_from([0, 1, 4096, 65_535, 2**31 - 1])
    return st.tuples(st.just(int(setting)), values)


@st.composite
def client_streams(draw: st.DrawFn) -> bytes:
    """What a gRPC client sends: preface, SETTINGS, then calls (headers, messages, the end) and control frames."""
    encoder = hpack.Encoder()
    settings = draw(st.lists(st.sampled_from(Setting).flatmap(_setting), max_size=3))
    out = wire.PREFACE + wire.settings_frame(settings) + wire.frame(FrameType.SETTINGS, wire.ACK, 0)
    for sid in range(1, 2 * draw(st.integers(1, 3)), 2):
        gzipped = draw(st.booleans())
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", draw(st.sampled_from(["/proto.API/Publish", "/liftlog.Batches/Fetch", "/x"]))),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        if gzipped:
            headers.append(("grpc-encoding", "gzip"))
        if draw(st.booleans()):
            headers.append(("grpc-timeout", draw(st.sampled_from(["5S", "100m", "1H", "99999999n"]))))
        if draw(st.booleans()):
            headers.append((draw(st.sampled_from(["x-id", "trace-bin"])), draw(st.sampled_from(["YWJj", "abc", "=="]))))
        block = encoder.encode(headers)
        split = draw(st.integers(0, len(block)))
        if split < len(block):  # HEADERS, then the rest in a CONTINUATION
            out += wire.frame(FrameType.HEADERS, 0, sid, block[:split])
            out += wire.frame(FrameType.CONTINUATION, END_HEADERS, sid, block[split:])
        else:
            out += wire.frame(FrameType.HEADERS, END_HEADERS, sid, block)
        for message in draw(st.lists(st.binary(max_size=40), max_size=3)):
            body = gzip.compress(message) if gzipped else message
            out += wire.frame(FrameType.DATA, 0, sid, struct.pack(">BL", int(gzipped), len(body)) + body)
        extra = draw(st.sampled_from(["end", "end", "reset", "window", "open"]))
        if extra == "end":
            out += wire.frame(FrameType.DATA, END_STREAM, sid, b"")
        elif extra == "reset":
            out += wire.rst_stream(sid, 8)
        elif extra == "window":
            out += wire.window_update(sid, 1000) + wire.frame(FrameType.DATA, END_STREAM, sid, b"")
    for control in draw(st.lists(st.sampled_from(["ping", "window", "priority", "goaway"]), max_size=2)):
        if control == "ping":
            out += wire.frame(FrameType.PING, 0, 0, b"12345678")
        elif control == "window":
            out += wire.window_update(0, 4096)
        elif control == "priority":
            out += wire.frame(FrameType.PRIORITY, 0, 1, b"\x00\x00\x00\x00\x10")
        else:
            out += wire.goaway(1, 0, b"bye")
    return out


def test_a_valid_client_stream_is_served() -> None:
    """The starting point of the mutations works: a call is received, its message read and its end seen."""
    encoder = hpack.Encoder()
    block = encoder.encode([(":method", "POST"), (":path", "/p"), ("content-type", "application/grpc")])
    data = (
        START
        + wire.frame(FrameType.HEADERS, END_HEADERS, 1, block)
        + wire.frame(FrameType.DATA, END_STREAM, 1, struct.pack(">BL", 0, 2) + b"hi")
    )
    events, out = serve([data], ConnectionLimits())
    assert [type(e) for e in events] == [RequestReceived, MessageReceived, RequestEnded]
    assert FrameType.HEADERS in frame_types(out)


@fuzz_settings(150)
@given(data=BINARY, start=st.sampled_from([b"", wire.PREFACE, START]), limits=LIMITS, cuts=CUTS)
@example(data=b"GET / HTTP/1.1\r\n\r\n", start=b"", limits=ConnectionLimits(), cuts=[])  # not HTTP/2
def test_server_connection_on_random_bytes(
    data: bytes, start: bytes, limits: ConnectionLimits, cuts: list[int]
) -> None:
    """Whatever reaches the API port, the HTTP/2 core answers with events or a GOAWAY, the same every time."""
    chunks = pieces(start + data, cuts)
    assert serve(chunks, limits) == serve(chunks, limits)


@fuzz_settings(150)
@given(valid=client_streams(), limits=LIMITS, cuts=CUTS, data=st.data())
def test_server_connection_on_mutated_client_streams(
    valid: bytes, limits: ConnectionLimits, cuts: list[int], data: st.DataObject
) -> None:
    """Damaged gRPC client streams, in pieces: events or a GOAWAY, never an exception, the same every time."""
    if data.draw(st.booleans()):  # past the preface: most damage lands on frames
        chunks = pieces(wire.PREFACE + mutate(data.draw, valid[len(wire.PREFACE) :]), cuts)
    else:
        chunks = pieces(mutate(data.draw, valid), cuts)
    assert serve(chunks, limits) == serve(chunks, limits)


# -- liftlog.server.partitions.messages.incoming_from_nats ---------------------------------------

PARTITION_SUBJECT = "orders.new"
SUBJECTS = st.sampled_from([PARTITION_SUBJECT, "orders.other"])

messages = st.builds(
    api_pb2.Message,
    key=st.binary(max_size=8),
    value=st.binary(max_size=32),
    headers=st.dictionaries(names, st.binary(max_size=8), max_size=2),
    ackInbox=names,
    correlationId=names,
    ackPolicy=st.integers(0, 2),
    offset=st.integers(-1, 2**40),
)
records = st.builds(
    NewRecord,
    st.binary(max_size=32),
    st.none() | st.binary(max_size=8),
    st.dictionaries(st.sampled_from(["h", "\x00fields", "\x00x", "ü"]), st.binary(max_size=8), max_size=2),
    st.none(),
)


@st.composite
def batch_envelopes(draw: st.DrawFn, damage: bool) -> bytes:
    """A batched publish as a client sends it; with ``damage``, its records are damaged under a valid CRC."""
    batch = draw(st.lists(records, min_size=1, max_size=4))
    encoded = encode_records(batch)
    if damage:
        encoded = mutate(draw, encoded)
    envelope = RecordBatchEnvelope(
        records=encoded,
        count=len(batch) + draw(st.sampled_from([0, 0, 1, -1])),
        ackInbox=draw(names),
        correlationId=draw(names),
        ackPolicy=draw(st.integers(0, 2)),
    )
    if draw(st.booleans()):
        envelope.expectedOffset = draw(st.integers(-1, 2**40))
    return encode_record_batch(envelope)


_BAD_NAME = struct.pack(">H", 1) + b"\xff" + struct.pack(">i", 1) + b"v"
#: A batch envelope whose one record has a header name that is not UTF-8.
BAD_NAME_ENVELOPE = encode_record_batch(
    RecordBatchEnvelope(records=RECORD_HEADER.pack(23 + len(_BAD_NAME), 0, 0, -1, 1, 1) + b"x" + _BAD_NAME, count=1)
)


def check_incoming(subject: str, reply: str, data: bytes) -> Incoming:
    """The property: an Incoming, always; a payload that is no envelope is stored as it came."""
    incoming = decodes_or_refuses(lambda d: incoming_from_nats(subject, reply, d, PARTITION_SUBJECT), data, ())
    assert isinstance(incoming, Incoming)
    if decode_publish_message(data) is None and decode_record_batch(data) is None:
        assert incoming.record.value == data and not incoming.more and incoming.encoded is None
    return incoming


@fuzz_settings(200)
@given(data=BINARY, subject=SUBJECTS, reply=st.sampled_from(["", "_INBOX.x"]))
@example(data=BAD_NAME_ENVELOPE, subject=PARTITION_SUBJECT, reply="_INBOX.x")  # raised InvalidBatch
@example(data=b"\xb9\x0e\x4c\x4c", subject=PARTITION_SUBJECT, reply="")
def test_nats_payloads_on_a_stream_subject(data: bytes, subject: str, reply: str) -> None:
    """Anyone may publish anything on a stream's subject: it is stored, never an exception in the intake."""
    check_incoming(subject, reply, data)
    check_incoming(subject, reply, b"\xb9" + data)  # past the first check of both envelopes


@fuzz_settings(200)
@given(
    publish=mutated(st.builds(encode_publish_message, messages, st.booleans())),
    batch=mutated(batch_envelopes(damage=False)),
    damaged=batch_envelopes(damage=True),
    subject=SUBJECTS,
    reply=st.sampled_from(["", "_INBOX.x"]),
)
def test_mutated_envelopes_on_a_stream_subject(
    publish: bytes, batch: bytes, damaged: bytes, subject: str, reply: str
) -> None:
    """Damaged Publish and batch envelopes, and batches whose records are damaged behind a valid CRC."""
    for data in (publish, batch, damaged):
        check_incoming(subject, reply, data)


@pytest.mark.parametrize("reply", ["", "_INBOX.x"])
def test_a_batch_with_a_header_name_that_is_not_utf8_is_a_plain_value(reply: str) -> None:
    """Such records were stored as they came without a reply subject (unreadable later) and raised
    InvalidBatch with one: now the batch is refused like any malformed one, and stored as a plain value."""
    incoming = incoming_from_nats(PARTITION_SUBJECT, reply, BAD_NAME_ENVELOPE, PARTITION_SUBJECT)
    assert incoming.encoded is None and incoming.record.value == BAD_NAME_ENVELOPE
