"""Limits against a real server process: oversized CreateStream requests are refused at once, and the
server raises its open-file limit at start (issue 12: 100,000 partitions exhausted it and bricked the server).
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from liftlog.api import api_pb2, api_pb2_grpc, cluster_pb2, cluster_pb2_grpc

from .harness import LiftlogProcess, NatsProcess

#: The soft open-file limit the server starts with; it must raise it to the hard limit.
LOWERED = 256

_WITH_LOW_LIMIT = (
    "import os, resource, sys\n"
    "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), hard))\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


class LowLimitProcess(LiftlogProcess):
    """``liftlog server`` exec'd with a lowered soft RLIMIT_NOFILE (same pid, so /proc/<pid> is the server)."""

    def command(self) -> list[str]:
        return [sys.executable, "-c", _WITH_LOW_LIMIT, str(LOWERED), *super().command()]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, nats_server: NatsProcess) -> Iterator[LiftlogProcess]:
    """Default limits (no --set), started with a low soft open-file limit."""
    proc = LowLimitProcess(tmp_path_factory.mktemp("limits") / "data", nats_url=nats_server.url).start()
    yield proc
    proc.kill()


def rpc(address: str, method: str, request: object, timeout: float = 10.0) -> object:
    with grpc.insecure_channel(address) as channel:
        return getattr(api_pb2_grpc.APIStub(channel), method)(request, timeout=timeout)


def refused(address: str, request: api_pb2.CreateStreamRequest) -> tuple[grpc.RpcError, float]:
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        rpc(address, "CreateStream", request)
    return err.value, time.monotonic() - started


def serves(address: str, name: str) -> list[bytes]:
    """Create a stream, publish two messages and read them back."""
    rpc(address, "CreateStream", api_pb2.CreateStreamRequest(name=name, subject=name))
    for value in (b"one", b"two"):
        rpc(address, "Publish", api_pb2.PublishRequest(stream=name, value=value, ackPolicy=api_pb2.LEADER))
    with grpc.insecure_channel(address) as channel:
        req = api_pb2.SubscribeRequest(stream=name, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST)
        return [m.value for m in api_pb2_grpc.APIStub(channel).Subscribe(req, timeout=10)][1:]


def test_100000_partitions_are_refused_at_once_and_the_server_keeps_serving(server: LiftlogProcess) -> None:
    err, took = refused(server.address, api_pb2.CreateStreamRequest(name="huge", subject="huge", partitions=100_000))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    details = err.details() or ""
    assert "partitions 100000" in details and "streams.max.partitions (1024)" in details
    assert took < 3
    meta = rpc(server.address, "FetchMetadata", api_pb2.FetchMetadataRequest(streams=["huge"]))
    assert meta.streamMetadata[0].error == api_pb2.StreamMetadata.UNKNOWN_STREAM  # type: ignore[attr-defined]
    assert serves(server.address, "after-huge") == [b"one", b"two"]


def test_one_byte_segments_are_refused(server: LiftlogProcess) -> None:
    request = api_pb2.CreateStreamRequest(name="tiny", subject="tiny", segmentMaxBytes=api_pb2.NullableInt64(value=1))
    err, _ = refused(server.address, request)
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    details = err.details() or ""
    assert "segmentMaxBytes 1 is smaller than streams.segment.max.bytes.min (65536)" in details
    assert serves(server.address, "after-tiny") == [b"one", b"two"]


def _soft_nofile(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft = line.split()[3]
            return resource.RLIM_INFINITY if soft == "unlimited" else int(soft)
    raise AssertionError("no 'Max open files' line")


@pytest.mark.skipif(not Path("/proc/self/limits").exists(), reason="reads /proc/<pid>/limits")
def test_the_server_raises_its_soft_open_file_limit_to_the_hard_limit(server: LiftlogProcess) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= LOWERED:
        pytest.skip(f"the hard open-file limit ({hard}) leaves nothing to raise")
    assert server.proc is not None
    soft = _soft_nofile(server.proc.pid)
    assert soft == hard
    assert f"open-file limit raised from {LOWERED} to" in server.output()
    with grpc.insecure_channel(server.address) as channel:
        status = cluster_pb2_grpc.ClusterStub(channel).Status(cluster_pb2.ClusterStatusRequest(), timeout=5)
    assert status.openFilesLimit == (0 if hard == resource.RLIM_INFINITY else hard)
