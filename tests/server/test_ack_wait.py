"""Waiting for a publish's ack: the ack timeout, a server that stops, a caller that goes away."""

from __future__ import annotations

import asyncio

import pytest

from liftlog.api import api_pb2
from liftlog.api.errors import Reason
from liftlog.rpc import StatusCode
from liftlog.server.api.failures import RpcFailure
from liftlog.server.api.publisher import Publisher


def api(ack_timeout: float = 5.0) -> Publisher:
    """A Publisher with only what waiting for acks reads (its ack timeout)."""
    service = Publisher.__new__(Publisher)
    service._ack_timeout = ack_timeout
    return service


async def test_no_ack_in_time_is_deadline_exceeded_and_the_wait_is_given_up() -> None:
    future: asyncio.Future[api_pb2.Ack] = asyncio.get_running_loop().create_future()
    with pytest.raises(RpcFailure) as failure:
        await api(ack_timeout=0.05).until_acked(future, None)
    assert (failure.value.code, failure.value.reason) == (StatusCode.DEADLINE_EXCEEDED, Reason.ACK_TIMEOUT)
    assert "0.05s" in failure.value.message
    assert future.cancelled()  # the router drops a cancelled waiter


async def test_a_callers_shorter_timeout_wins_and_the_ack_timeout_bounds_a_longer_one() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(RpcFailure):
        await api(ack_timeout=30.0).until_acked(loop.create_future(), 0.05)
    assert loop.time() - started < 5
    with pytest.raises(RpcFailure) as failure:
        await api(ack_timeout=0.01).until_acked(loop.create_future(), 3600.0)
    assert "0.1s" in failure.value.message  # ten ack timeouts at most


async def test_an_ack_in_time_is_returned_and_nothing_is_cancelled_later() -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[api_pb2.Ack] = loop.create_future()
    loop.call_later(0.01, future.set_result, api_pb2.Ack(offset=7))
    service = api(ack_timeout=0.1)
    assert (await service.await_ack(future, None)).offset == 7
    await asyncio.sleep(0.2)  # past the deadline: the timer was cancelled, the future stays done
    assert not future.cancelled() and future.result().offset == 7


async def test_a_server_that_stops_answers_unavailable_not_a_timeout() -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[api_pb2.Ack] = loop.create_future()
    loop.call_later(0.01, future.cancel)  # what the ack router does when the server stops
    with pytest.raises(RpcFailure) as failure:
        await api(ack_timeout=5.0).await_ack(future, None)
    assert failure.value.code == StatusCode.UNAVAILABLE


async def test_a_caller_that_goes_away_is_cancelled_not_timed_out() -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[api_pb2.Ack] = loop.create_future()
    waiting = asyncio.ensure_future(api(ack_timeout=5.0).until_acked(future, None))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
