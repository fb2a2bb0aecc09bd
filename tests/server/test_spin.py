"""The loop spinner: it polls for its window after the last publish, yields the CPU each turn, then stops."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import grpc
import pytest

from liftlog.api import api_pb2, api_pb2_grpc
from liftlog.metadata.controller import CreateStreamRequest
from liftlog.server.api.failures import RpcFailure
from liftlog.server.api.publisher import Publisher
from liftlog.server.partitions.acks import AckRouter
from liftlog.server.spin import LoopSpinner

from .conftest import in_process_server


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_it_spins_for_its_window_after_the_last_keep_hot_then_stops() -> None:
    clock = Clock()
    yields: list[float] = []
    spinner = LoopSpinner(asyncio.get_running_loop(), 0.001, clock=clock, yield_cpu=lambda: yields.append(clock.now))
    assert not spinner.spinning
    spinner.keep_hot()
    assert spinner.spinning
    for _ in range(5):
        await asyncio.sleep(0)
    assert spinner.turns >= 4 and len(yields) == spinner.turns  # one yield a turn
    clock.now = 0.0009
    spinner.keep_hot()  # a later publish moves the end of the window
    clock.now = 0.0015
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert spinner.spinning
    clock.now = 0.0020
    turns = spinner.turns
    for _ in range(3):
        await asyncio.sleep(0)
    assert not spinner.spinning and spinner.turns == turns


async def test_one_chain_of_turns_however_many_publishes() -> None:
    clock = Clock()
    spinner = LoopSpinner(asyncio.get_running_loop(), 1.0, clock=clock, yield_cpu=lambda: None)
    for _ in range(100):
        spinner.keep_hot()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert spinner.turns <= 3  # not 100 callbacks a turn
    clock.now = 2.0
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not spinner.spinning


async def test_cool_stops_the_spinning_at_the_next_turn() -> None:
    spinner = LoopSpinner(asyncio.get_running_loop(), 60.0, yield_cpu=lambda: None)
    spinner.keep_hot()
    await asyncio.sleep(0)
    assert spinner.spinning
    spinner.cool()  # the message came back: nothing left to wait for
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not spinner.spinning


def api_publishing(publish: Any, spinner: LoopSpinner) -> Publisher:
    """A Publisher with only what publish_payload reads."""
    service = Publisher.__new__(Publisher)
    service._publish = publish
    service._keep_hot = spinner.keep_hot
    service._acks = AckRouter("server")
    return service


async def test_a_publish_for_a_partition_led_here_keeps_the_loop_hot_others_do_not() -> None:
    sent: list[tuple[str, bytes]] = []

    async def publish(subject: str, payload: bytes) -> None:
        sent.append((subject, payload))

    spinner = LoopSpinner(asyncio.get_running_loop(), 0.01, yield_cpu=lambda: None)
    service = api_publishing(publish, spinner)
    await service.publish_payload("elsewhere", b"m")  # the ack comes from another server's intake
    assert sent == [("elsewhere", b"m")] and not spinner.spinning
    await service.publish_payload("orders", b"m", led_here=True)
    assert sent[-1] == ("orders", b"m") and spinner.spinning
    await asyncio.sleep(0.05)
    assert not spinner.spinning  # a real clock: the window passed, the loop sleeps again


async def test_a_failed_publish_does_not_spin() -> None:
    async def publish(subject: str, payload: bytes) -> None:
        raise ConnectionError("nats is gone")

    spinner = LoopSpinner(asyncio.get_running_loop(), 0.01, yield_cpu=lambda: None)
    with pytest.raises(RpcFailure, match="nats is gone"):
        await api_publishing(publish, spinner).publish_payload("orders", b"m", led_here=True)
    assert not spinner.spinning


async def test_a_server_spins_after_a_clients_publish_unless_told_not_to(tmp_path: Path, nats_url: str) -> None:
    for spin_us, spins in ((300, True), (0, False)):
        settings: dict[str, Any] = {"publish.spin.us": spin_us}
        server = in_process_server(tmp_path / f"data-{spin_us}", nats_url, f"spin-{secrets.token_hex(4)}", **settings)
        await server.start()
        try:
            assert (server.spinner is not None) == spins
            assert server.cluster is not None
            await asyncio.wait_for(server.cluster.create_stream(CreateStreamRequest("orders", "orders")), 10)
            async with grpc.aio.insecure_channel(server.address) as channel:
                api = api_pb2_grpc.APIStub(channel)
                for i in range(3):
                    response = await api.Publish(api_pb2.PublishRequest(stream="orders", value=b"v"), timeout=10)
                    assert response.ack.offset == i
            if server.spinner is not None:
                assert server.spinner.turns > 0 and server.spinner.window == 300e-6
        finally:
            await server.stop()
