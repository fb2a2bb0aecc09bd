"""Which ISR proposals reach the controller: only those of a leader the metadata still names, at the
partition epoch the leader core decided them against."""

from __future__ import annotations

import asyncio
from pathlib import Path

from liftlog.api import api_pb2
from liftlog.metadata import PartitionMeta
from liftlog.metadata.protocol import ControlRequest, IsrChange
from liftlog.replication.leader import ProposeIsr
from liftlog.server.partitions.partition import Partition, PartitionOptions
from liftlog.server.partitions.replicator import Replicator, ReplicatorSettings
from liftlog.server.server import Server
from liftlog.storage import LogConfig


class Controller:
    def __init__(self) -> None:
        self.requests: list[ControlRequest] = []

    async def request(self, change: ControlRequest) -> None:
        self.requests.append(change)


def leading_server(tmp_path: Path) -> tuple[Server, Controller, Replicator, Partition]:
    server = Server.__new__(Server)  # only the proposal path is under test
    controller = Controller()
    server.server_id, server.cluster = "a", controller  # type: ignore[assignment]

    async def no_report(*_: object) -> None:
        return None

    rep = Replicator(
        server_id="a",
        namespace="test",
        settings=ReplicatorSettings(),
        propose_isr=server._propose_isr,
        report_leader=no_report,
    )
    meta = PartitionMeta("orders", 0, "orders", "a", ["a", "b", "c"], ["a", "b", "c"], leader_epoch=3, epoch=7)
    part = Partition(
        meta,
        directory=tmp_path / "p0",
        options=PartitionOptions(LogConfig()),
        queue_group="",
        ack_sink=list[api_pb2.Ack]().append,
    )
    part.open_log()
    part.become_leader("a", 0, max_lag_ns=10**9)
    return server, controller, rep, part


ABC = ("a", "b", "c")


def proposal(isr: tuple[str, ...], reason: str, leader_epoch: int, decided_against: tuple[str, ...]) -> ProposeIsr:
    return ProposeIsr(isr, reason, leader_epoch, (ABC, decided_against))


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_the_leader_proposes_at_the_partition_epoch(tmp_path: Path) -> None:
    _, controller, rep, part = leading_server(tmp_path)
    rep.on_leader_actions(part, [proposal(("a", "b"), "c lags", 3, ABC)])
    await settle()
    assert controller.requests == [IsrChange("orders", 0, ("a", "b"), 7)]


async def test_a_leader_the_metadata_no_longer_names_proposes_nothing(tmp_path: Path) -> None:
    # The metadata is applied before the replica steps down. Sent now, the proposal would
    # carry the new partition epoch and be accepted, putting it back in the ISR before it truncated.
    _, controller, rep, part = leading_server(tmp_path)
    part.meta.leader, part.meta.leader_epoch, part.meta.isr, part.meta.epoch = "b", 4, ["b", "c"], 8
    rep.on_leader_actions(part, [proposal(("a", "b"), "c lags", 3, ABC)])
    await settle()
    assert controller.requests == []


async def test_a_proposal_from_an_earlier_leadership_of_the_same_leader_is_not_sent(tmp_path: Path) -> None:
    # A core held over from leader epoch 3 (its server was suspended while the metadata made it
    # leader again in epoch 4) must not replace the ISR the election chose.
    _, controller, rep, part = leading_server(tmp_path)
    part.meta.leader_epoch, part.meta.epoch = 4, 9
    rep.on_leader_actions(part, [proposal(("a", "b"), "c lags", 3, ABC)])
    await settle()
    assert controller.requests == []
    rep.on_leader_actions(part, [proposal(("a", "b"), "c lags", 4, ABC)])
    await settle()
    assert controller.requests == [IsrChange("orders", 0, ("a", "b"), 9)]


async def test_a_proposal_decided_against_an_isr_the_metadata_has_since_changed_is_not_sent(tmp_path: Path) -> None:
    # Found by the simulation (seed 156 with a reconcile lag): a shrink to (a) was applied (epoch 8),
    # in place, before the reconcile loop told the core. The core, still counting b, admitted c and
    # proposed (a, b, c); sent at epoch 8 it was accepted, and once the core learnt of the shrink its
    # HW passed b's and c's log ends: two ISR members without committed messages.
    _, controller, rep, part = leading_server(tmp_path)
    part.meta.isr, part.meta.epoch = ["a"], 8
    rep.on_leader_actions(part, [proposal(ABC, "c caught up", 3, ("a", "b"))])
    await settle()
    assert controller.requests == []
    rep.on_leader_actions(part, [proposal(("a", "c"), "c caught up", 3, ("a",))])
    await settle()
    assert controller.requests == [IsrChange("orders", 0, ("a", "c"), 8)]


async def test_a_proposal_keeps_the_epoch_it_was_decided_at_when_its_task_runs_late(tmp_path: Path) -> None:
    # Found by the simulation (seeds 38 and 156 with task lag): the leader admitted c against
    # epoch 7, then a shrink (epoch 8) dropped c and the HW passed c's log end. Built when the
    # task ran, the request carried epoch 8 and was accepted: c was in the ISR without every
    # committed message. Built when decided, epoch 7 is refused.
    _, controller, rep, part = leading_server(tmp_path)
    part.meta.isr = ["a", "b"]
    rep.on_leader_actions(part, [proposal(ABC, "c caught up", 3, ("a", "b"))])
    part.meta.isr, part.meta.epoch = ["a"], 8
    await settle()
    assert controller.requests == [IsrChange("orders", 0, ABC, 7)]
