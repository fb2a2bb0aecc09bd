"""Authorization on a 3-server cluster with mTLS: every RPC checked, policies from the metadata applied by
every server, changed while clients run; and Liftbridge's policy files with SIGHUP reload."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from liftlog.api import api_pb2, api_pb2_grpc, batches_pb2, batches_pb2_grpc, cluster_pb2, cluster_pb2_grpc
from liftlog.client import Client, PermissionDeniedError, PublishAsyncFailed, TlsConfig
from liftlog.security.cluster_auth import generate_key_file

from .harness import NatsProcess
from .test_api_tls import Pki, TlsServerProcess, make_pki

pytestmark = pytest.mark.cluster

IDS = ("a", "b", "c")


@dataclass
class Secured:
    servers: dict[str, TlsServerProcess]
    pki: Pki
    identities: dict[str, tuple[str, str]]

    def tls(self, who: str) -> TlsConfig:
        cert, key = self.identities[who]
        return TlsConfig(ca=self.pki.ca_file, cert=cert, key=key)

    def addresses(self) -> list[str]:
        return [s.address for s in self.servers.values()]

    def channel(self, who: str, address: str | None = None) -> grpc.aio.Channel:
        cert, key = self.identities[who]
        credentials = grpc.ssl_channel_credentials(
            root_certificates=Path(self.pki.ca_file).read_bytes(),
            private_key=Path(key).read_bytes(),
            certificate_chain=Path(cert).read_bytes(),
        )
        return grpc.aio.secure_channel(address or self.addresses()[0], credentials)


def issue_identities(pki: Pki) -> dict[str, tuple[str, str]]:
    out = {}
    for who in ("root", "client1", "client2"):
        cert = pki.ca.issue_cert(f"{who}.example", common_name=who)
        pem, key = pki.root / f"{who}-id.pem", pki.root / f"{who}-id.key"
        cert.cert_chain_pems[0].write_to_path(str(pem))
        cert.private_key_pem.write_to_path(str(key))
        out[who] = (str(pem), str(key))
    return out


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, nats_server: NatsProcess) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("authz")
    pki = make_pki(root / "pki")
    cert = pki.issue("server")
    key_file = root / "cluster.key"
    generate_key_file(key_file)
    servers = {}
    for sid in IDS:
        args = ["--tls-cert", cert[0], "--tls-key", cert[1], "--namespace", f"authz-{os.getpid()}"]
        for setting in (
            "tls.client.auth.enabled=true",
            f"tls.client.auth.ca={pki.ca_file}",
            "tls.client.authz.enabled=true",
            f"clustering.auth.key.file={key_file}",
            "subscribe.max.concurrent.per.connection=2",
        ):
            args += ["--set", setting]
        servers[sid] = TlsServerProcess(
            root / sid, *args, nats_url=nats_server.url, server_id=sid, bootstrap=",".join(IDS)
        )
    for proc in servers.values():
        proc.start()
    yield Secured(servers, pki, issue_identities(pki))
    for proc in servers.values():
        proc.kill()


async def until_true(check: Callable[[], Any], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if await check():
            return
        assert time.monotonic() < deadline, f"{what} not reached within {timeout} s"
        await asyncio.sleep(0.2)


async def grant(secured: Secured, *rules: tuple[str, str, str], revoke: bool = False) -> None:
    """Add (or revoke) rules as root, and wait until every server enforces them."""
    async with Client(secured.addresses(), tls=secured.tls("root"), timeout=15) as admin:
        for rule in rules:
            await (admin.revoke_policy if revoke else admin.add_policy)(*rule)
        for address in secured.addresses():
            async with Client(address, tls=secured.tls("root")) as one:

                async def applied(one: Client = one) -> bool:
                    rules_there = (await one.list_policies()).rules
                    return all((r in rules_there) != revoke for r in rules)

                await until_true(applied, f"the policy change on {address}")


def denied(exc: grpc.aio.AioRpcError, identity: str, resource: str, action: str) -> None:
    assert exc.code() == grpc.StatusCode.PERMISSION_DENIED, exc
    assert exc.details() == f"permission denied: identity {identity!r} may not {action} on {resource!r}"


async def test_every_rpc_is_checked(secured: Secured) -> None:
    stream = "guarded"
    await grant(secured, ("client1", "*", "*"))  # client1 may do everything: it sets the stage
    async with Client(secured.addresses(), tls=secured.tls("client1")) as c1:
        await c1.create_stream(stream, stream)
        await c1.publish(stream, b"one")

    async with secured.channel("client2") as channel:
        api = api_pb2_grpc.APIStub(channel)
        calls: list[tuple[str, str, Any]] = [
            ("FetchMetadata", "*", lambda: api.FetchMetadata(api_pb2.FetchMetadataRequest())),
            ("CreateStream", "new", lambda: api.CreateStream(api_pb2.CreateStreamRequest(name="new", subject="n"))),
            ("DeleteStream", stream, lambda: api.DeleteStream(api_pb2.DeleteStreamRequest(name=stream))),
            ("PauseStream", stream, lambda: api.PauseStream(api_pb2.PauseStreamRequest(name=stream))),
            (
                "SetStreamReadonly",
                stream,
                lambda: api.SetStreamReadonly(api_pb2.SetStreamReadonlyRequest(name=stream, readonly=True)),
            ),
            (
                "FetchPartitionMetadata",
                stream,
                lambda: api.FetchPartitionMetadata(api_pb2.FetchPartitionMetadataRequest(stream=stream)),
            ),
            ("Publish", stream, lambda: api.Publish(api_pb2.PublishRequest(stream=stream, value=b"x"))),
            (
                "PublishToSubject",
                stream,
                lambda: api.PublishToSubject(api_pb2.PublishToSubjectRequest(subject=stream, value=b"x")),
            ),
            ("SetCursor", stream, lambda: api.SetCursor(api_pb2.SetCursorRequest(stream=stream, cursorId="c"))),
            ("FetchCursor", stream, lambda: api.FetchCursor(api_pb2.FetchCursorRequest(stream=stream, cursorId="c"))),
            (
                "Fetch",
                stream,
                lambda: batches_pb2_grpc.BatchesStub(channel).Fetch(batches_pb2.FetchRequest(stream=stream)),
            ),
            (
                "PublishBatch",
                stream,
                lambda: batches_pb2_grpc.BatchesStub(channel).Publish(batches_pb2.PublishRequest(stream=stream)),
            ),
            ("Status", "*", lambda: cluster_pb2_grpc.ClusterStub(channel).Status(cluster_pb2.ClusterStatusRequest())),
            (
                "AddPolicy",
                "*",
                lambda: cluster_pb2_grpc.ClusterStub(channel).AddPolicy(
                    cluster_pb2.PolicyRequest(policy=cluster_pb2.Policy(subject="client2", resource="*", action="*"))
                ),
            ),
        ]
        # The batched paths need the rights of the calls they stand for.
        action_of = {"Fetch": "Subscribe", "PublishBatch": "Publish"}
        for action, resource, call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call()
            denied(info.value, "client2", resource, action_of.get(action, action))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in api.Subscribe(api_pb2.SubscribeRequest(stream=stream)):
                pass
        denied(info.value, "client2", stream, "Subscribe")
        # PublishAsync goes on: each refused request gets its PERMISSION_DENIED.
        call = api.PublishAsync()
        await call.write(api_pb2.PublishRequest(stream=stream, value=b"x", correlationId="1"))
        answer = await call.read()
        await call.done_writing()
        assert answer.correlationId == "1"
        assert answer.asyncError.code == api_pb2.PublishAsyncError.PERMISSION_DENIED
        assert "identity 'client2' may not Publish on 'guarded'" in answer.asyncError.message

    # Nothing changed meanwhile.
    async with Client(secured.addresses(), tls=secured.tls("client1")) as c1:
        partition = await c1.fetch_partition_metadata(stream)
        assert partition.high_watermark == 0


async def test_a_client_without_a_certificate_cannot_connect(secured: Secured) -> None:
    from liftlog.client import UnavailableError

    with pytest.raises(UnavailableError):
        async with Client(secured.addresses()[0], tls=TlsConfig(ca=secured.pki.ca_file), retries=0) as c:
            await c.fetch_metadata()


async def test_policy_changes_apply_on_every_server_while_clients_run(secured: Secured) -> None:
    stream = "live"
    await grant(secured, ("client1", "*", "*"))
    async with Client(secured.addresses(), tls=secured.tls("client1")) as c1:
        await c1.create_stream(stream, stream)
    await grant(secured, ("client2", "*", "FetchMetadata"), ("client2", "live*", "Publish"))

    outcomes: list[str] = []
    stop = asyncio.Event()

    async def publisher() -> None:
        async with Client(secured.addresses(), tls=secured.tls("client2"), retries=0) as c2:
            while not stop.is_set():
                try:
                    await c2.publish(stream, b"m")
                    outcomes.append("ok")
                except PermissionDeniedError as exc:
                    assert "identity 'client2' may not Publish on 'live'" in exc.message
                    outcomes.append("denied")
                await asyncio.sleep(0.01)

    task = asyncio.create_task(publisher())
    try:
        await until_true(lambda: _async(outcomes.count("ok") >= 5), "publishing")
        await grant(secured, ("client2", "live*", "Publish"), revoke=True)
        mark = len(outcomes)
        await until_true(lambda: _async(outcomes[mark:].count("denied") >= 5), "refusals after the revoke")
        # Every server refuses now, not only the one that committed the change.
        for address in secured.addresses():
            async with Client(address, tls=secured.tls("client2"), retries=0) as one:
                with pytest.raises(PermissionDeniedError):
                    await one.publish_many(stream, [b"x"], partition=0)
        await grant(secured, ("client2", "live*", "Publish"))
        mark = len(outcomes)
        await until_true(lambda: _async(outcomes[mark:].count("ok") >= 5), "publishing again")
    finally:
        stop.set()
        await task
    policies = (await _list(secured)).rules
    assert ("client2", "live*", "Publish") in policies


async def _async(value: bool) -> bool:
    return value


async def _list(secured: Secured) -> Any:
    async with Client(secured.addresses(), tls=secured.tls("root")) as admin:
        return await admin.list_policies()


async def test_only_root_or_a_granted_identity_manages_policies(secured: Secured) -> None:
    async with Client(secured.addresses(), tls=secured.tls("client2"), retries=0) as c2:
        with pytest.raises(PermissionDeniedError, match="may not AddPolicy"):
            await c2.add_policy("client2", "*", "*")
    async with Client(secured.addresses(), tls=secured.tls("root")) as admin:
        with pytest.raises(PermissionDeniedError, match="identity 'root' may not CreateStream"):
            await admin.create_stream("roots-own", "roots-own")
        listed = await admin.list_policies()
        assert listed.enforced and not listed.from_files
        from liftlog.client import InvalidArgumentError

        with pytest.raises(InvalidArgumentError, match="without commas"):
            await admin.add_policy("a,b", "*", "*")


async def test_publish_async_refusals_reach_our_client(secured: Secured) -> None:
    await grant(secured, ("client1", "*", "*"))
    async with Client(secured.addresses(), tls=secured.tls("client1")) as c1:
        await c1.create_stream("async-guarded", "async-guarded", exist_ok=True)
    await grant(secured, ("client2", "*", "FetchMetadata"), ("client2", "*", "FetchPartitionMetadata"))
    async with Client(secured.addresses(), tls=secured.tls("client2"), retries=0) as c2:
        c2._batches_offered = False  # as against Liftbridge: publish_many over PublishAsync
        with pytest.raises(PublishAsyncFailed) as info:
            await c2.publish_many("async-guarded", [b"x", b"y"])
        assert isinstance(info.value, PermissionDeniedError)
        assert "identity 'client2' may not Publish on 'async-guarded'" in info.value.message


async def test_a_stream_cannot_be_created_to_read_or_feed_a_stream_one_may_not_read(secured: Secured) -> None:
    """Per-stream rights hold on subjects too: a user who may create streams cannot aim one at another's
    subject (to read it, or to have its publishes land there), whichever side holds the wildcard."""
    await grant(secured, ("client1", "*", "*"))
    async with Client(secured.addresses(), tls=secured.tls("client1")) as c1:
        await c1.create_stream("acl.orders.eu", "acl-orders", exist_ok=True)
        await c1.create_stream("acl.eu.*", "acl-europe", exist_ok=True)
    # client2 may create any stream and publish to any subject, but read or publish to no stream of client1's.
    may_create = [("client2", "*", "CreateStream"), ("client2", "*", "PublishToSubject")]
    await grant(secured, *may_create)
    try:
        async with secured.channel("client2") as channel:
            api = api_pb2_grpc.APIStub(channel)
            for name, subject, exposed, theirs in (
                ("spy1", "acl.orders.eu", "acl-orders", "acl.orders.eu"),  # the same subject
                ("spy2", "acl.orders.*", "acl-orders", "acl.orders.eu"),  # orders.* over orders.eu
                ("spy3", "acl.>", "acl-orders", "acl.orders.eu"),  # a '>' tail
                ("spy4", "acl.*.eu", "acl-orders", "acl.orders.eu"),  # a "*" token inside
                ("spy5", "acl.eu.de", "acl-europe", "acl.eu.*"),  # the reverse: theirs holds the wildcard
            ):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await api.CreateStream(api_pb2.CreateStreamRequest(name=name, subject=subject))
                assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert (info.value.details() or "").startswith(
                    f"permission denied: identity 'client2' may not Subscribe on {exposed!r}, and subject "
                    f"{subject!r} overlaps its partition 0's subject {theirs!r}"
                ), info.value.details()
            # A second partition listens on <subject>.1: that counts too.
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await api.CreateStream(api_pb2.CreateStreamRequest(name="spy6", subject="acl.eu", partitions=2))
            assert "'acl.eu.1' overlaps its partition 0's subject 'acl.eu.*'" in (info.value.details() or "")
            # What overlaps nothing of theirs is fine.
            await api.CreateStream(api_pb2.CreateStreamRequest(name="own", subject="acl.mine.>"))
            # PublishToSubject needs Publish on every stream the subject reaches.
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await api.PublishToSubject(api_pb2.PublishToSubjectRequest(subject="acl.eu.fr", value=b"forged"))
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "may not Publish on 'acl-europe'" in (info.value.details() or "")
        async with Client(secured.addresses(), tls=secured.tls("client1")) as c1:
            assert (await c1.fetch_partition_metadata("acl-europe")).high_watermark == -1, "nothing landed there"
            assert "spy1" not in (await c1.fetch_metadata()).streams
    finally:
        await grant(secured, *may_create, revoke=True)


async def test_creating_a_stream_needs_the_right_on_its_subject_too(secured: Secured) -> None:
    own = [("client2", "alice-*", "*")]
    await grant(secured, *own)
    try:
        async with secured.channel("client2") as channel:
            api = api_pb2_grpc.APIStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await api.CreateStream(api_pb2.CreateStreamRequest(name="alice-spy", subject="payments"))
            denied(info.value, "client2", "payments", "CreateStream")
            # Named as the rules allow, on a subject they allow: the usual name == subject works as it did.
            await api.CreateStream(api_pb2.CreateStreamRequest(name="alice-orders", subject="alice-orders"))
    finally:
        await grant(secured, *own, revoke=True)


#: Liftbridge's model and an example policy, as docs/security.md shows them.
EXAMPLES = Path(__file__).parents[2] / "docs" / "examples" / "authz"


async def test_liftbridge_policy_files_reloaded_on_sighup(tmp_path: Path, nats_server: NatsProcess) -> None:
    pki = make_pki(tmp_path / "pki")
    identities = issue_identities(pki)
    model, policy = EXAMPLES / "model.conf", tmp_path / "policy.csv"
    policy.write_text((EXAMPLES / "policy.csv").read_text())
    cert = pki.issue("server")
    args = ["--tls-cert", cert[0], "--tls-key", cert[1]]
    for setting in (
        "tls.client.auth.enabled=true",
        f"tls.client.auth.ca={pki.ca_file}",
        "tls.client.authz.enabled=true",
        f"tls.client.authz.model={model}",
        f"tls.client.authz.policy={policy}",
    ):
        args += ["--set", setting]
    proc = TlsServerProcess(tmp_path / "data", *args, nats_url=nats_server.url).start()
    try:
        cert1, key1 = identities["client1"]
        tls = TlsConfig(ca=pki.ca_file, cert=cert1, key=key1)
        async with Client(proc.address, tls=tls, retries=0) as c1:
            await c1.create_stream("foo", "foo")
            with pytest.raises(PermissionDeniedError, match="may not Publish on 'foo'"):
                await c1.publish("foo", b"x")
        policy.write_text(policy.read_text() + "p, client1, foo, Publish\n")
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGHUP)
        async with Client(proc.address, tls=tls, retries=0) as c1:
            for _ in range(50):
                try:
                    await c1.publish("foo", b"x")
                    break
                except PermissionDeniedError:
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError("SIGHUP did not reload the policy file")
        cert_root, key_root = identities["root"]
        async with Client(proc.address, tls=TlsConfig(ca=pki.ca_file, cert=cert_root, key=key_root)) as admin:
            listed = await admin.list_policies()
            assert listed.from_files and ("client1", "foo", "Publish") in listed.rules
            from liftlog.client import FailedPreconditionError

            with pytest.raises(FailedPreconditionError, match="edit that file and send the server SIGHUP"):
                await admin.add_policy("client2", "*", "*")
        assert "reloaded the authorization policies" in proc.output()
    finally:
        proc.kill()


async def test_a_checked_subscription_gives_back_its_slot_when_cancelled(secured: Secured) -> None:
    await grant(secured, ("client1", "*", "*"))
    async with Client(secured.addresses(), tls=secured.tls("client1")) as c1:
        await c1.create_stream("slots", "slots", exist_ok=True)
        await c1.publish("slots", b"x")
        leader = (await c1.fetch_metadata("slots")).streams["slots"].partitions[0].leader
    address = secured.servers[leader].address  # Subscribe is served by the partition's leader
    async with secured.channel("client1", address) as channel:
        api = api_pb2_grpc.APIStub(channel)
        # Twice the per-connection limit, one after another: each cancelled call frees its slot.
        for _ in range(4):
            call = api.Subscribe(api_pb2.SubscribeRequest(stream="slots", startPosition=api_pb2.EARLIEST))
            first = await asyncio.wait_for(call.read(), 10)
            assert first.value in (b"", b"x")
            call.cancel()
            await asyncio.sleep(0.2)
