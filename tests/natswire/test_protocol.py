"""The sans-IO NATS parser and encoders: what nats-server sends, split anywhere, and what it must refuse."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from liftlog.natswire.protocol import (
    ERR,
    INFO,
    MSG,
    OK,
    PING,
    PONG,
    NatsParser,
    NatsProtocolError,
    connect_command,
    encode_headers,
    pub_command,
    sub_command,
    unsub_command,
)

STREAM = (
    b'INFO {"server_id":"x","max_payload":1048576,"nonce":"abc"}\r\n'
    b"PING\r\n"
    b"MSG orders.eu 7 11\r\nhello world\r\n"
    b"MSG orders.eu 7 _INBOX.r 0\r\n\r\n"
    b"HMSG orders.eu 8 25 30\r\nNATS/1.0\r\nA: b\r\nC:  d\r\n\r\nhello\r\n"
    b"HMSG orders.eu 8 reply.to 12 12\r\nNATS/1.0\r\n\r\n\r\n"
    b"+OK\r\n"
    b"PONG\r\n"
    b"MSG bin 9 4\r\n\r\n\r\n\r\n"
    b"-ERR 'Permissions Violation for Publish to \"x\"'\r\n"
)
EXPECTED = [
    (INFO, {"server_id": "x", "max_payload": 1048576, "nonce": "abc"}),
    (PING,),
    (MSG, 7, "orders.eu", "", b"hello world", b""),
    (MSG, 7, "orders.eu", "_INBOX.r", b"", b""),
    (MSG, 8, "orders.eu", "", b"hello", b"NATS/1.0\r\nA: b\r\nC:  d\r\n\r\n"),
    (MSG, 8, "orders.eu", "reply.to", b"", b"NATS/1.0\r\n\r\n"),
    (OK,),
    (PONG,),
    (MSG, 9, "bin", "", b"\r\n\r\n", b""),  # a payload holding CRLFs is read by its size
    (ERR, 'Permissions Violation for Publish to "x"'),
]


def test_a_whole_buffer_parses_into_every_event() -> None:
    parser = NatsParser()
    assert parser.feed(STREAM) == EXPECTED
    assert parser.buffered == 0


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_split_of_the_stream_gives_the_same_events(cuts: list[int]) -> None:
    parser = NatsParser()
    events = []
    bounds = [0, *sorted(cuts), len(STREAM)]
    for start, stop in itertools.pairwise(bounds):
        events += parser.feed(STREAM[start:stop])
    assert events == EXPECTED
    assert parser.buffered == 0


def test_an_incomplete_message_waits_for_the_rest() -> None:
    parser = NatsParser()
    assert parser.feed(b"MSG a 1 5\r\nhel") == []
    assert parser.feed(b"lo") == []  # the payload, but not its CRLF
    assert parser.feed(b"\r\nPING\r\n") == [(MSG, 1, "a", "", b"hello", b""), (PING,)]


@pytest.mark.parametrize(
    "data",
    [
        b"MSG a 1 five\r\n",  # size not a number
        b"MSG a x 5\r\n",  # sid not a number
        b"MSG a 1 -1\r\n",  # negative size
        b"MSG a\r\n",  # too few fields
        b"MSG a 1 b c 5\r\n",  # too many fields
        b"MSG a 1 99999999999\r\n",  # announces more than any nats-server sends
        b"HMSG a 1 9 5\r\n",  # headers longer than the whole message
        b"HMSG a 1 x 5\r\n",
        b"INFO not json\r\n",
        b"INFO [1, 2]\r\n",
        b"HELLO there\r\n",
    ],
)
def test_what_is_not_nats_is_refused_naming_the_line(data: bytes) -> None:
    with pytest.raises(NatsProtocolError):
        NatsParser().feed(data)


def test_an_endless_control_line_is_refused_instead_of_buffered() -> None:
    parser = NatsParser()
    parser.feed(b"MSG " + b"a" * 1000)
    with pytest.raises(NatsProtocolError, match="control line"):
        parser.feed(b"b" * (70 * 1024))


def test_commands() -> None:
    assert pub_command("a.b", b"xyz") == b"PUB a.b 3\r\nxyz\r\n"
    assert pub_command("a.b", b"xyz", "r.1") == b"PUB a.b r.1 3\r\nxyz\r\n"
    headers = encode_headers({"K": "v"})
    assert headers == b"NATS/1.0\r\nK: v\r\n\r\n"
    assert pub_command("a", b"xy", "", headers) == b"HPUB a 18 20\r\n" + headers + b"xy\r\n"
    assert pub_command("a", b"xy", "r", headers) == b"HPUB a r 18 20\r\n" + headers + b"xy\r\n"
    assert sub_command("a.>", "", 3) == b"SUB a.> 3\r\n"
    assert sub_command("a.>", "q", 3) == b"SUB a.> q 3\r\n"
    assert unsub_command(3) == b"UNSUB 3\r\n"
    assert connect_command({"verbose": False}) == b'CONNECT {"verbose":false}\r\n'


@pytest.mark.parametrize("name,value", [("A\r\nB", "v"), ("A B", "v"), ("A:", "v"), ("", "v"), ("A", "v\r\nX: y")])
def test_headers_cannot_inject_lines(name: str, value: str) -> None:
    with pytest.raises(ValueError, match="invalid NATS header"):
        encode_headers({name: value})
