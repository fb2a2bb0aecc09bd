"""The controller's failover driven by hand: metadata applied in memory, log end offsets from a fake."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from liftlog.metadata import (
    ChangeLeader,
    CreateStream,
    DeleteStream,
    Metadata,
    MetadataError,
    Operation,
    PartitionMeta,
    PartitionState,
    RegisterServer,
    ServerMeta,
    SetPartitionState,
    SetServerLiveness,
    StreamMeta,
    StreamSettings,
)
from liftlog.metadata.protocol import (
    LeaderConfirmation,
    LeaderReport,
    LogEnd,
    LogEndQuery,
    decode_log_end_query,
    encode_log_end,
)
from liftlog.server.failover import Failover

S = 1_000_000_000


class Controller:
    """A Failover over in-memory metadata; ``leos`` answers the log end offset questions."""

    def __init__(self, isr: list[str], *, unclean: bool | None = None, server_unclean: bool = False) -> None:
        self.meta = Metadata()
        for sid in "abc":
            self.meta.apply(RegisterServer(ServerMeta(sid, "127.0.0.1", 1), 1))
        stream = StreamMeta("s", "s", "", 1, StreamSettings(unclean_leader_election=unclean))
        stream.partitions[0] = PartitionMeta("s", 0, "s", "a", ["a", "b", "c"], list(isr))
        self.meta.apply(CreateStream(stream))
        self.ops: list[Operation] = []
        self.leos: dict[str, int] = {"b": 10, "c": 12}
        self.leo_queries: list[LogEndQuery] = []
        self.now = 100 * S
        self.failover = Failover(
            metadata=lambda: self.meta,
            propose=self.propose,
            nats=SimpleNamespace(request=self.request),
            prefix="ns.raft.metadata.",
            clock=lambda: self.now,
            confirm_timeout_ns=2 * S,
            unclean_default=server_unclean,
            rebalance_after_ns=0,
        )

    async def propose(self, op: Operation) -> object:
        self.ops.append(op)
        try:
            return self.meta.apply(op)
        except MetadataError as exc:
            return exc

    async def request(self, subject: str, data: bytes, timeout: float) -> Any:
        replica = subject.split(".")[-2]
        if replica not in self.leos:
            raise TimeoutError
        self.leo_queries.append(decode_log_end_query(data))
        return SimpleNamespace(data=encode_log_end(LogEnd(self.leos[replica])))

    @property
    def partition(self) -> PartitionMeta:
        return self.meta.partition("s", 0)

    def dead(self, *ids: str) -> None:
        for sid in ids:
            self.meta.apply(SetServerLiveness(sid, False, self.now))
            self.leos.pop(sid, None)

    def report(self, reporter: str) -> LeaderReport:
        p = self.partition
        return LeaderReport("s", 0, reporter, p.leader, p.epoch, p.leader_epoch)


async def test_a_majority_of_reports_elects_the_follower_with_the_largest_log_end() -> None:
    c = Controller(["a", "b", "c"])
    await c.failover.report(c.report("b"))
    assert c.ops == []  # one of two in-sync followers is not a majority
    await c.failover.report(c.report("c"))
    assert [type(op).__name__ for op in c.ops] == ["SetPartitionState", "SetPartitionState"]
    assert (c.partition.state, c.partition.candidate) == (PartitionState.CANDIDATE_FOUND, "c")
    assert set(c.leo_queries) == {LogEndQuery("s", 0)}, "each live replica was asked for its log end"
    await c.failover.confirm(LeaderConfirmation("s", 0, "b"))  # not the candidate: ignored
    assert c.partition.leader == "a"
    await c.failover.confirm(LeaderConfirmation("s", 0, "c"))
    p = c.partition
    assert (p.leader, p.isr, p.leader_epoch, p.state) == ("c", ["b", "c"], 1, PartitionState.ONLINE)
    assert isinstance(c.ops[-1], ChangeLeader)


async def test_a_dead_leaders_partition_is_elected_on_the_next_tick_and_a_silent_candidate_is_replaced() -> None:
    c = Controller(["a", "b", "c"])
    c.dead("a")
    await c.failover.tick()
    assert c.partition.candidate == "c"
    c.now += 2 * S  # c never confirms
    await c.failover.tick()
    assert (c.partition.state, c.partition.candidate) == (PartitionState.CANDIDATE_FOUND, "b")
    c.now += 2 * S
    await c.failover.tick()
    assert c.partition.state is PartitionState.OFFLINE


async def test_an_offline_partition_waits_for_an_in_sync_replica_without_churning_the_log() -> None:
    c = Controller(["a", "b"])
    c.dead("a", "b")
    await c.failover.tick()
    assert c.partition.state is PartitionState.OFFLINE
    settled = len(c.ops)
    for _ in range(5):
        await c.failover.tick()  # c is alive but not in sync: nothing to do, nothing proposed
    assert len(c.ops) == settled
    c.meta.apply(SetServerLiveness("b", True, c.now))
    c.leos["b"] = 7
    await c.failover.tick()
    assert (c.partition.state, c.partition.candidate) == (PartitionState.CANDIDATE_FOUND, "b")


async def test_unclean_election_per_stream_overrides_the_server() -> None:
    clean = Controller(["a"])
    clean.dead("a")
    await clean.failover.tick()
    assert clean.partition.state is PartitionState.OFFLINE

    unclean = Controller(["a"], unclean=True)
    unclean.dead("a")
    await unclean.failover.tick()
    assert unclean.partition.candidate == "c"  # the largest log end among the out-of-sync replicas
    await unclean.failover.confirm(LeaderConfirmation("s", 0, "c"))
    assert (unclean.partition.leader, unclean.partition.isr) == ("c", ["c"])

    overridden = Controller(["a"], unclean=False, server_unclean=True)
    overridden.dead("a")
    await overridden.failover.tick()
    assert overridden.partition.state is PartitionState.OFFLINE


async def test_a_stale_election_step_is_refused_without_harm() -> None:
    c = Controller(["a", "b", "c"])
    c.dead("a")
    stale = SetPartitionState("s", 0, PartitionState.OFFLINE, "", c.partition.epoch)
    await c.failover.tick()  # moves the partition epoch on
    result = await c.propose(stale)
    assert isinstance(result, MetadataError) and "not" in str(result)
    assert c.partition.state is PartitionState.CANDIDATE_FOUND


async def test_a_partition_deleted_mid_election_does_not_stall_the_others() -> None:
    c = Controller(["a", "b", "c"])
    other = StreamMeta("t", "t", "", 2, StreamSettings())
    other.partitions[0] = PartitionMeta("t", 0, "t", "a", ["a", "b", "c"], ["a", "b", "c"])
    c.meta.apply(CreateStream(other))
    c.dead("a")
    await c.failover.tick()
    assert [c.meta.partition(s, 0).candidate for s in "st"] == ["c", "c"]
    c.meta.apply(DeleteStream("s"))
    c.now += 2 * S  # neither candidate confirmed; s's next step fails, t's must still be taken
    await c.failover.tick()
    assert (c.meta.partition("t", 0).state, c.meta.partition("t", 0).candidate) == (PartitionState.CANDIDATE_FOUND, "b")
