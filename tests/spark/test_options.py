"""The liftlog Spark format's options, without Spark: names, defaults, and every mistake named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from liftlog.spark.options import (
    Assign,
    OptionError,
    StreamList,
    StreamPattern,
    parse_read_options,
    parse_write_options,
)

SERVERS = {"servers": "127.0.0.1:9292, 127.0.0.1:9293"}


def test_batch_defaults_read_everything_committed() -> None:
    o = parse_read_options({**SERVERS, "stream": "orders,events"}, streaming=False)
    assert o.servers == ("127.0.0.1:9292", "127.0.0.1:9293")
    assert o.subscription == StreamList(("orders", "events"))
    assert (o.starting_offsets, o.ending_offsets) == ("earliest", "latest")
    assert (o.fail_on_data_loss, o.include_headers, o.max_offsets_per_trigger) == (True, False, None)


def test_streaming_defaults_start_at_the_end_and_names_are_case_insensitive() -> None:
    o = parse_read_options(
        {"SERVERS": "h:1", "StreamPattern": "ord.*", "MAXOFFSETSPERTRIGGER": "500", "includeheaders": "TRUE"},
        streaming=True,
    )
    assert isinstance(o.subscription, StreamPattern) and o.subscription.pattern.fullmatch("orders")
    assert (o.starting_offsets, o.ending_offsets, o.max_offsets_per_trigger, o.include_headers) == (
        "latest",
        None,
        500,
        True,
    )


def test_offsets_and_assignments_as_json() -> None:
    o = parse_read_options(
        {
            **SERVERS,
            "assign": '{"orders":[1,0,1]}',
            "startingOffsets": '{"orders":{"0":23,"1":-2}}',
            "endingOffsets": '{"orders":{"0":50,"1":-1}}',
        },
        streaming=False,
    )
    assert o.subscription == Assign({"orders": (0, 1)})
    assert o.starting_offsets == {"orders": {0: 23, 1: -2}}
    assert o.ending_offsets == {"orders": {0: 50, 1: -1}}


def test_rate_limits_and_trigger_delay() -> None:
    o = parse_read_options(
        {
            **SERVERS,
            "stream": "s",
            "minOffsetsPerTrigger": "10",
            "maxOffsetsPerTrigger": "100",
            "maxTriggerDelay": "30s",
        },
        streaming=True,
    )
    assert (o.min_offsets_per_trigger, o.max_offsets_per_trigger, o.max_trigger_delay_ms) == (10, 100, 30_000)
    assert (
        parse_read_options(
            {**SERVERS, "stream": "s", "startingTimestamp": "1700000000000"}, streaming=False
        ).starting_timestamp
        == 1_700_000_000_000
    )


def test_options_spark_owns_are_let_through() -> None:
    o = parse_write_options({**SERVERS, "stream": "out", "checkpointLocation": "/tmp/x", "path": "p"})
    assert (o.servers, o.stream) == (("127.0.0.1:9292", "127.0.0.1:9293"), "out")


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"stream": "s"}, False, "option 'servers' is required"),
        ({"servers": "nohost", "stream": "s"}, False, "'nohost' is not host:port"),
        ({**SERVERS}, False, "exactly one of 'stream', 'streamPattern' or 'assign' (got none)"),
        ({**SERVERS, "stream": "a", "assign": '{"a":[0]}'}, False, "(got stream, assign)"),
        ({**SERVERS, "streamPattern": "("}, False, "is not a regular expression"),
        ({**SERVERS, "assign": '{"a":[]}'}, False, "stream 'a' needs a non-empty list"),
        ({**SERVERS, "assign": '{"a":[true]}'}, False, "stream 'a' needs a non-empty list"),  # not partition 1
        ({**SERVERS, "assign": "[1]"}, False, "must be a JSON object"),
        ({**SERVERS, "stream": "s", "startingOffsets": "first"}, False, "neither 'earliest', 'latest' nor JSON"),
        ({**SERVERS, "stream": "s", "startingOffsets": '{"s":{"x":1}}'}, False, "partition 'x'"),
        ({**SERVERS, "stream": "s", "startingOffsets": '{"s":{"0":-3}}'}, False, "-2 (earliest) / -1 (latest)"),
        ({**SERVERS, "stream": "s", "startingOffsets": "latest"}, False, "cannot be 'latest' in a batch query"),
        ({**SERVERS, "stream": "s", "endingOffsets": "earliest"}, False, "cannot be earliest"),
        ({**SERVERS, "stream": "s", "endingOffsets": "latest"}, True, "for batch queries only"),
        ({**SERVERS, "stream": "s", "maxOffsetsPerTrigger": "5"}, False, "for streaming queries only"),
        ({**SERVERS, "stream": "s", "maxOffsetsPerTrigger": "0"}, True, "must be at least 1, got 0"),
        ({**SERVERS, "stream": "s", "maxOffsetsPerTrigger": "many"}, True, "'many' is not a whole number"),
        (
            {**SERVERS, "stream": "s", "minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "5"},
            True,
            "minOffsetsPerTrigger (9) is larger than maxOffsetsPerTrigger (5)",
        ),
        ({**SERVERS, "stream": "s", "maxTriggerDelay": "1m"}, True, "only makes sense with 'minOffsetsPerTrigger'"),
        ({**SERVERS, "stream": "s", "minOffsetsPerTrigger": "1", "maxTriggerDelay": "soon"}, True, "not a duration"),
        ({**SERVERS, "stream": "s", "failOnDataLoss": "yes"}, False, "must be true or false"),
        ({**SERVERS, "stream": "s", "startingOffsets": "earliest", "startingTimestamp": "1"}, False, "not both"),
        (
            {**SERVERS, "stream": "s", "startingOffsets": '{"s":{"0":9}}', "endingOffsets": '{"s":{"0":3}}'},
            False,
            "endingOffsets 3 is before startingOffsets 9",
        ),
        ({**SERVERS, "stream": "s", "startingOfsets": "earliest"}, False, "did you mean 'startingOffsets'?"),
    ],
)
def test_mistakes_are_named(options: dict[str, str], streaming: bool, message: str) -> None:
    with pytest.raises(OptionError, match=re.escape(message)):
        parse_read_options(options, streaming=streaming)


def test_write_mistakes_are_named() -> None:
    with pytest.raises(OptionError, match="names one stream"):
        parse_write_options({**SERVERS, "stream": "a,b"})
    with pytest.raises(OptionError, match="unknown liftlog sink option 'startingOffsets'"):
        parse_write_options({**SERVERS, "startingOffsets": "earliest"})


def test_importing_the_options_does_not_import_pyspark() -> None:
    import subprocess
    import sys

    code = "import sys, liftlog.spark.options; print('pyspark' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_tls_options(tmp_path: Path) -> None:
    import trustme

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    ca_file = str(tmp_path / "ca.pem")
    read = parse_read_options(
        {"servers": "h:1", "stream": "s", "TLS.CA": ca_file, "tls.serverName": "db.example"}, streaming=False
    )
    assert read.tls is not None and (read.tls.ca, read.tls.server_name) == (ca_file, "db.example")
    assert parse_read_options({"servers": "h:1", "stream": "s"}, streaming=False).tls is None
    assert parse_write_options({"servers": "h:1", "tls.ca": ca_file}).tls == read.tls.__class__(ca=ca_file)
    with pytest.raises(OptionError, match=r"tls\.\*: cannot load the TLS CA file .*missing"):
        parse_read_options({"servers": "h:1", "stream": "s", "tls.ca": str(tmp_path / "missing")}, streaming=True)
    with pytest.raises(OptionError, match="needs its certificate"):
        parse_write_options({"servers": "h:1", "tls.key": ca_file})
