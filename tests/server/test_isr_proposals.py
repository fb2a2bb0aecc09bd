"""Which ISR proposals a server sends to the controller: only those of a leader the metadata still names."""

from __future__ import annotations

from pathlib import Path

from liftlog.metadata import PartitionMeta
from liftlog.metadata.protocol import ControlRequest, IsrChange
from liftlog.server.partition import Partition, PartitionOptions
from liftlog.server.server import Server
from liftlog.storage import LogConfig


class Controller:
    def __init__(self) -> None:
        self.requests: list[ControlRequest] = []

    async def request(self, change: ControlRequest) -> None:
        self.requests.append(change)


def leading_server(tmp_path: Path) -> tuple[Server, Controller, Partition]:
    server = Server.__new__(Server)  # only the proposal callback is under test
    controller = Controller()
    server.server_id, server.cluster = "a", controller  # type: ignore[assignment]
    meta = PartitionMeta("orders", 0, "orders", "a", ["a", "b", "c"], ["a", "b", "c"], leader_epoch=3, epoch=7)
    part = Partition(
        meta, directory=tmp_path / "p0", options=PartitionOptions(LogConfig()), queue_group="", ack_sink=list().append
    )
    part.open_log()
    part.become_leader("a", 0, max_lag_ns=10**9)
    return server, controller, part


async def test_the_leader_proposes_at_the_partition_epoch(tmp_path: Path) -> None:
    server, controller, part = leading_server(tmp_path)
    await server._propose_isr(part, ("a", "b"), "c lags")
    assert controller.requests == [IsrChange("orders", 0, ("a", "b"), 7)]


async def test_a_leader_the_metadata_no_longer_names_proposes_nothing(tmp_path: Path) -> None:
    # Metadata is applied in place before the partition steps down. The deposed leader's proposal would
    # carry the new partition epoch and be accepted, putting it back in the ISR before it truncated.
    server, controller, part = leading_server(tmp_path)
    part.meta.leader, part.meta.leader_epoch, part.meta.isr, part.meta.epoch = "b", 4, ["b", "c"], 8
    await server._propose_isr(part, ("a", "b"), "c lags")
    assert controller.requests == []
