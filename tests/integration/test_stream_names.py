"""Stream names and subjects a real server refuses, through gRPC and the CLI, and what keeps working after.

Marked slow: the module starts real processes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator

import grpc
import pytest

from liftlog.api import api_pb2, api_pb2_grpc

from .harness import LiftlogProcess

pytestmark = pytest.mark.slow

NS = "liftbridge-default"  # the server's clustering.namespace (the default)

REFUSED = [
    (".x", "x", "stream name '.x': .*must not start or end with '.'"),
    ("a..b", "x", "stream name 'a..b': .*contain '..'"),
    ("...", "x", r"stream name '\.\.\.': .*must not start or end with '.'"),
    ("s", ">", "subject '>': it matches every subject"),
    ("s", "a\x00b", r"subject 'a\\x00b': it contains '\\x00'; .*control characters"),
    ("s", f"{NS}.raft.>", f"subject '{NS}.raft.>': it could match '{NS}.>', reserved for the cluster's internal"),
    ("s", "*.>", rf"subject '\*.>': it could match '{NS}.>'"),
]


@pytest.fixture
async def api(server: LiftlogProcess) -> AsyncIterator[api_pb2_grpc.APIStub]:
    async with grpc.aio.insecure_channel(server.address) as channel:
        yield api_pb2_grpc.APIStub(channel)


@pytest.mark.parametrize(("stream", "subject", "rule"), REFUSED)
async def test_create_stream_refuses_names_and_subjects_that_break_nats(
    api: api_pb2_grpc.APIStub, stream: str, subject: str, rule: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await api.CreateStream(api_pb2.CreateStreamRequest(name=stream, subject=subject), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert re.search(rule, info.value.details() or ""), info.value.details()


async def test_a_valid_stream_works_after_refusals(api: api_pb2_grpc.APIStub, name: str) -> None:
    for stream, subject, _ in REFUSED:
        with pytest.raises(grpc.aio.AioRpcError):
            await api.CreateStream(api_pb2.CreateStreamRequest(name=stream, subject=subject), timeout=10)
    await api.CreateStream(api_pb2.CreateStreamRequest(name=f"{name}.ok", subject=name), timeout=10)
    resp = await api.Publish(
        api_pb2.PublishRequest(stream=f"{name}.ok", value=b"v", ackPolicy=api_pb2.LEADER), timeout=10
    )
    assert resp.ack.offset == 0
    meta = await api.FetchMetadata(api_pb2.FetchMetadataRequest(), timeout=10)
    names = {s.name for s in meta.streamMetadata}
    assert f"{name}.ok" in names
    assert not names & {stream for stream, _, _ in REFUSED}


@pytest.mark.parametrize(("stream", "subject", "rule"), [REFUSED[0], REFUSED[3], REFUSED[5]])
def test_the_cli_prints_one_error_line(server: LiftlogProcess, stream: str, subject: str, rule: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "liftlog.cli.main",
            "stream",
            "create",
            stream,
            "--subject",
            subject,
            "-a",
            server.address,
        ],
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert re.search(rule, lines[0]), lines[0]
