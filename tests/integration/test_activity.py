"""The activity stream with real servers: every metadata change readers should see, in order, ids increasing,
signed on NATS, and complete across a controller failover."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import nats
import pytest

from liftlog.api import api_pb2, api_pb2_grpc
from liftlog.cli.activity import describe_event
from liftlog.security.cluster_auth import generate_key_file

from .harness import LiftlogProcess, NatsProcess, eventually
from .test_cluster import Cluster, create, formed, rpc


def events(address: str) -> list[dict[str, Any]]:
    """Every event of __activity as this server serves it, repeats (same id) dropped."""
    req = api_pb2.SubscribeRequest(
        stream="__activity", startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST, readISRReplica=True
    )
    with grpc.insecure_channel(address) as channel:
        got = [describe_event(m.value) for m in list(api_pb2_grpc.APIStub(channel).Subscribe(req, timeout=10))[1:]]
    out: list[dict[str, Any]] = []
    for e in got:
        if not out or e["id"] > out[-1]["id"]:
            out.append(e)
        else:
            assert any(seen == e for seen in out), f"a repeated id with other content: {e}"
    return out


def summary(evs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["op"], e.get("stream", "")) for e in evs]


def changes(address: str, *names: str) -> None:
    for name in names:
        create(address, name, partitions=2)
        rpc(address, "PauseStream", api_pb2.PauseStreamRequest(name=name, partitions=[1], resumeAll=True))
        rpc(address, "SetStreamReadonly", api_pb2.SetStreamReadonlyRequest(name=name, readonly=True))
        rpc(address, "DeleteStream", api_pb2.DeleteStreamRequest(name=name))


def expected(*names: str) -> list[tuple[str, str]]:
    out = []
    for name in names:
        out += [("CREATE_STREAM", name), ("PAUSE_STREAM", name), ("SET_STREAM_READONLY", name), ("DELETE_STREAM", name)]
    return out


def test_every_change_is_an_event_in_order_and_forgeries_are_not(tmp_path: Path, nats_server: NatsProcess) -> None:
    key = tmp_path / "cluster.key"
    generate_key_file(key)
    proc = LiftlogProcess(
        tmp_path / "data",
        "--namespace",
        "activity-one",
        "--set",
        "activity.stream.enabled=true",
        "--set",
        f"clustering.auth.key.file={key}",
        nats_url=nats_server.url,
    ).start()
    try:
        eventually(lambda: events(proc.address) or None, 20, "the activity stream")
        changes(proc.address, "a1", "a2")

        async def forge() -> None:  # an unsigned event on the stream's subject: dropped, never stored
            nc = await nats.connect(nats_server.url)
            fake = api_pb2.ActivityStreamEvent(id=10**9, op=api_pb2.DELETE_STREAM)
            fake.deleteStreamOp.stream = "forged"
            await nc.publish(
                "activity-one.activity", api_pb2.Message(value=fake.SerializeToString()).SerializeToString()
            )
            await nc.flush()
            await nc.close()

        asyncio.run(forge())
        with pytest.raises(grpc.RpcError) as refused:  # nor through the API, which publishes for clients
            rpc(proc.address, "PublishToSubject", api_pb2.PublishToSubjectRequest(subject="activity-one.activity"))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "reserved" in (
            refused.value.details() or ""
        )
        create(proc.address, "after")
        want = [("CREATE_STREAM", "__activity"), *expected("a1", "a2"), ("CREATE_STREAM", "after")]
        got = eventually(lambda: ((e := events(proc.address)) and summary(e) == want and e) or None, 15, "every event")
        ids = [e["id"] for e in got]
        assert ids == sorted(set(ids))
        pause = got[2]
        assert (pause["partitions"], pause["resumeAll"]) == ([1], True)
        assert got[1]["partitions"] == [0, 1] and got[3]["readonly"] is True
    finally:
        proc.kill()


@pytest.mark.slow
@pytest.mark.cluster
def test_a_controller_failover_loses_no_event(tmp_path: Path, nats_server: NatsProcess) -> None:
    c = Cluster(tmp_path, nats_server.url)
    ids = ["a", "b", "c"]
    for sid in ids:
        c.add(sid, ",".join(ids), "--set", "activity.stream.enabled=true")
    try:
        c.start_all()
        controller = formed(c, set(ids))
        survivor = next(sid for sid in ids if sid != controller)
        eventually(lambda: events(c.servers[survivor].address) or None, 30, "the activity stream")
        changes(c.servers[survivor].address, "b1", "b2")
        c.servers[controller].kill()
        changes(c.servers[survivor].address, "b3")  # retried by the client helpers until a new controller takes it
        want = [("CREATE_STREAM", "__activity"), *expected("b1", "b2", "b3")]
        got = eventually(
            lambda: ((e := events(c.servers[survivor].address)) and summary(e) == want and e) or None,
            30,
            "every event after the failover",
        )
        assert [e["id"] for e in got] == sorted({e["id"] for e in got})
        c.servers[controller].start()
        assert eventually(lambda: summary(events(c.servers[controller].address)) == want or None, 30, "on the old one")
    finally:
        c.stop_all()


def test_the_activity_command(tmp_path: Path, nats_server: NatsProcess) -> None:
    from tests.cli.test_cli import invoke

    proc = LiftlogProcess(
        tmp_path / "data",
        "--namespace",
        "activity-cli",
        "--set",
        "activity.stream.enabled=true",
        nats_url=nats_server.url,
    ).start()
    try:
        eventually(lambda: events(proc.address) or None, 20, "the activity stream")
        create(proc.address, "shown", partitions=2)
        eventually(lambda: len(events(proc.address)) == 2 or None, 10, "two events")
        lines = invoke("activity", "-a", proc.address).stdout.splitlines()
        assert lines[0].split()[1:] == ["CREATE_STREAM", "stream=__activity", "partitions=0"]
        assert lines[1].split()[1:] == ["CREATE_STREAM", "stream=shown", "partitions=0,1"]
    finally:
        proc.kill()
