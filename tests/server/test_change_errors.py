"""A metadata change that fails says what happened: no leader, not committed in time, or committed but pending here.

Real servers in this process on a real nats-server; reconcile or proposals are held back to make each case.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import pytest

from liftlog.api.errors import Reason
from liftlog.metadata import StreamExistsError
from liftlog.metadata.controller import CreateStreamRequest
from liftlog.metadata.protocol import CreateStreamChange, decode_reply, encode_reply
from liftlog.rpc import StatusCode
from liftlog.server.api.api_service import failure_from
from liftlog.server.control.cluster import (
    ChangeNotAppliedError,
    ChangeOutcomeUnknownError,
    ControllerFailedError,
    NoMetadataLeaderError,
    _error_of,
    _refusal_of,
)
from liftlog.server.server import Server

from .conftest import in_process_server

pytestmark = pytest.mark.timeout(60)


def _create(name: str) -> CreateStreamChange:
    return CreateStreamChange(CreateStreamRequest(name, name))


def _hold_reconcile(server: Server) -> asyncio.Event:
    """Keep ``server`` from acting on metadata changes until the returned event is set."""
    streams = server.streams
    assert streams is not None
    release = asyncio.Event()
    reconcile = streams.reconcile

    async def held() -> None:
        await release.wait()
        await reconcile()

    streams.reconcile = held  # type: ignore[method-assign]
    return release


@pytest.fixture
def namespace() -> str:
    return f"errors-{secrets.token_hex(4)}"


async def test_committed_but_not_acted_on_here_names_the_index_and_what_to_do(
    tmp_path: Path, nats_url: str, namespace: str
) -> None:
    server = in_process_server(tmp_path / "a", nats_url, namespace, "a")
    await server.start()
    try:
        assert server.cluster is not None and server.streams is not None
        release = _hold_reconcile(server)
        with pytest.raises(ChangeNotAppliedError) as err:
            await server.cluster.request(_create("held"), timeout=1.0)
        message = str(err.value)
        assert f"creating stream 'held' is committed (metadata index {err.value.index})" in message
        assert "server a has not acted on it within 1 s" in message
        assert "do not repeat the request" in message and "liftlog stream describe held" in message
        assert "held" in server.cluster.metadata.streams  # committed indeed
        release.set()
        assert await server.streams.wait_reconciled(err.value.index, 5)
        assert ("held", 0) in server.streams.partitions
    finally:
        await server.stop()


async def test_a_forwarded_change_committed_but_pending_on_the_forwarding_server(
    tmp_path: Path, nats_url: str, namespace: str
) -> None:
    a = in_process_server(tmp_path / "a", nats_url, namespace, "a")
    b = in_process_server(tmp_path / "b", nats_url, namespace, "b", seed=False)
    await a.start()
    try:
        await b.start()
        assert b.cluster is not None and a.cluster is not None
        await asyncio.wait_for(b.cluster.registered.wait(), 20)
        assert b.cluster.leader_id == "a"
        _hold_reconcile(b)
        with pytest.raises(ChangeNotAppliedError, match="server b has not acted on it"):
            await b.cluster.request(_create("pending"), timeout=2.0)
        assert "pending" in a.cluster.metadata.streams
        # The controller's own refusal comes through as itself.
        with pytest.raises(StreamExistsError):
            await b.cluster.request(_create("pending"), timeout=2.0)
    finally:
        await b.stop()
        await a.stop()


async def test_a_leader_that_cannot_commit_says_the_outcome_is_unknown(
    tmp_path: Path, nats_url: str, namespace: str
) -> None:
    server = in_process_server(tmp_path / "a", nats_url, namespace, "a")
    await server.start()
    try:
        cluster = server.cluster
        assert cluster is not None

        async def never_committed(op: object) -> tuple[int, object]:
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        cluster._propose = never_committed  # type: ignore[method-assign]
        with pytest.raises(ChangeOutcomeUnknownError) as err:
            await cluster.request(_create("limbo"), timeout=0.5)
        message = str(err.value)
        assert message.startswith("creating stream 'limbo' may or may not take effect")
        assert "server a, proposed it but could not commit it within 0.5 s" in message
        assert "before repeating it" in message
    finally:
        await server.stop()


async def test_without_a_leader_nothing_is_committed_and_the_message_keeps_liftbridges_words(
    tmp_path: Path, nats_url: str, namespace: str
) -> None:
    # One of two founding voters: no majority, so no leader is ever elected.
    settings: dict[str, Any] = {"clustering.raft.bootstrap.peers": "a,ghost"}
    server = in_process_server(tmp_path / "a", nats_url, namespace, "a", seed=False, **settings)
    await server.start()
    try:
        assert server.cluster is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(NoMetadataLeaderError) as err:
            await server.cluster.request(_create("nowhere"), timeout=0.5)
        assert loop.time() - started < 2
        assert str(err.value).startswith(
            "no known metadata leader: creating stream 'nowhere' was not committed within 0.5 s: "
            "no server has been elected metadata leader"
        )
    finally:
        await server.stop()


def test_the_controllers_answers_keep_their_kind_over_nats() -> None:
    for exc in (ChangeOutcomeUnknownError("x may or may not take effect"), ControllerFailedError("disk broke")):
        back = _error_of(decode_reply(encode_reply(_refusal_of(exc))))  # type: ignore[arg-type]
        assert type(back) is type(exc) and str(back) == str(exc)


@pytest.mark.parametrize(
    ("exc", "code", "reason"),
    [
        (NoMetadataLeaderError("why"), StatusCode.INTERNAL, Reason.INTERNAL),
        (
            ChangeNotAppliedError("creating stream 'x'", 7, "a", 5, "`cmd`"),
            StatusCode.DEADLINE_EXCEEDED,
            Reason.NOT_APPLIED,
        ),
        (ChangeOutcomeUnknownError("m"), StatusCode.DEADLINE_EXCEEDED, Reason.OUTCOME_UNKNOWN),
        (ControllerFailedError("m"), StatusCode.INTERNAL, Reason.INTERNAL),
    ],
)
def test_status_codes_clients_do_not_retry_blindly(exc: Exception, code: StatusCode, reason: Reason) -> None:
    failure = failure_from(exc)  # type: ignore[arg-type]
    assert (failure.code, failure.reason, failure.message) == (code, reason, str(exc))
