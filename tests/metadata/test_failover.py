"""The controller's failover core driven by hand: metadata applied in memory, log end offsets from a dict."""

from __future__ import annotations

from liftlog.metadata import (
    ChangeIsr,
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
from liftlog.metadata.failover import AskLogEnds, FailoverAction, FailoverCore, Propose, Step
from liftlog.metadata.protocol import LeaderConfirmation, LeaderReport

S = 1_000_000_000


class Controller:
    """A FailoverCore over in-memory metadata; ``leos`` answers the log end offset questions."""

    def __init__(
        self,
        isr: list[str],
        *,
        unclean: bool | None = None,
        server_unclean: bool = False,
        rebalance_after_ns: int = 0,
    ) -> None:
        self.meta = Metadata()
        for sid in "abc":
            self.meta.apply(RegisterServer(ServerMeta(sid, "127.0.0.1", 1), 1))
        stream = StreamMeta("s", "s", "", 1, StreamSettings(unclean_leader_election=unclean))
        stream.partitions[0] = PartitionMeta("s", 0, "s", "a", ["a", "b", "c"], list(isr))
        self.meta.apply(CreateStream(stream))
        self.ops: list[Operation] = []
        self.leos: dict[str, int] = {"b": 10, "c": 12}
        self.asked: list[AskLogEnds] = []
        self.now = 100 * S
        self.core = FailoverCore(
            lambda: self.meta,
            confirm_timeout_ns=2 * S,
            unclean_default=server_unclean,
            rebalance_after_ns=rebalance_after_ns,
        )

    def run(self, actions: list[FailoverAction]) -> None:
        """Carry out ``actions`` and whatever their results lead to, as the server's shell does."""
        while actions:
            action = actions.pop(0)
            if isinstance(action, Propose):
                actions += self.core.proposed(action, self.propose(action.op))
            else:
                self.asked.append(action)
                leos = {r: self.leos[r] for r in action.replicas if r in self.leos}
                actions += self.core.log_ends(action.key, leos, self.now)

    def propose(self, op: Operation) -> object:
        self.ops.append(op)
        try:
            return self.meta.apply(op)
        except MetadataError as exc:
            return exc

    def tick(self) -> None:
        self.run(self.core.tick(self.now))

    def confirm(self, replica: str) -> None:
        self.run(self.core.confirm(LeaderConfirmation("s", 0, replica)))

    @property
    def partition(self) -> PartitionMeta:
        return self.meta.partition("s", 0)

    def dead(self, *ids: str) -> None:
        for sid in ids:
            self.meta.apply(SetServerLiveness(sid, False, self.now))
            self.leos.pop(sid, None)

    def report(self, reporter: str) -> None:
        p = self.partition
        self.run(self.core.report(LeaderReport("s", 0, reporter, p.leader, p.epoch, p.leader_epoch), self.now))


def test_a_majority_of_reports_elects_the_follower_with_the_largest_log_end() -> None:
    c = Controller(["a", "b", "c"])
    c.report("b")
    assert c.ops == []  # one of two in-sync followers is not a majority
    c.report("c")
    assert [type(op).__name__ for op in c.ops] == ["SetPartitionState", "SetPartitionState"]
    assert (c.partition.state, c.partition.candidate) == (PartitionState.CANDIDATE_FOUND, "c")
    assert c.asked == [AskLogEnds(("s", 0), ("a", "b", "c"))], "each live replica was asked for its log end"
    c.confirm("b")  # not the candidate: ignored
    assert c.partition.leader == "a"
    c.confirm("c")
    p = c.partition
    assert (p.leader, p.isr, p.leader_epoch, p.state) == ("c", ["b", "c"], 1, PartitionState.ONLINE)
    assert isinstance(c.ops[-1], ChangeLeader)


def test_a_dead_leaders_partition_is_elected_on_the_next_tick_and_a_silent_candidate_is_replaced() -> None:
    c = Controller(["a", "b", "c"])
    c.dead("a")
    c.tick()
    assert c.partition.candidate == "c"
    c.now += 2 * S  # c never confirms
    c.tick()
    assert (c.partition.state, c.partition.candidate) == (PartitionState.CANDIDATE_FOUND, "b")
    c.now += 2 * S
    c.tick()
    assert c.partition.state is PartitionState.OFFLINE


def test_an_offline_partition_waits_for_an_in_sync_replica_without_churning_the_log() -> None:
    c = Controller(["a", "b"])
    c.dead("a", "b")
    c.tick()
    assert c.partition.state is PartitionState.OFFLINE
    settled = len(c.ops)
    for _ in range(5):
        c.tick()  # c is alive but not in sync: nothing to do, nothing proposed
    assert len(c.ops) == settled
    c.meta.apply(SetServerLiveness("b", True, c.now))
    c.leos["b"] = 7
    c.tick()
    assert (c.partition.state, c.partition.candidate) == (PartitionState.CANDIDATE_FOUND, "b")


def test_unclean_election_per_stream_overrides_the_server() -> None:
    clean = Controller(["a"])
    clean.dead("a")
    clean.tick()
    assert clean.partition.state is PartitionState.OFFLINE

    unclean = Controller(["a"], unclean=True)
    unclean.dead("a")
    unclean.tick()
    assert unclean.partition.candidate == "c"  # the largest log end among the out-of-sync replicas
    unclean.confirm("c")
    assert (unclean.partition.leader, unclean.partition.isr) == ("c", ["c"])

    overridden = Controller(["a"], unclean=False, server_unclean=True)
    overridden.dead("a")
    overridden.tick()
    assert overridden.partition.state is PartitionState.OFFLINE


def test_a_stale_election_step_is_refused_without_harm() -> None:
    c = Controller(["a", "b", "c"])
    c.dead("a")
    stale = SetPartitionState("s", 0, PartitionState.OFFLINE, "", c.partition.epoch)
    c.tick()  # moves the partition epoch on
    result = c.propose(stale)
    assert isinstance(result, MetadataError) and "not" in str(result)
    assert c.partition.state is PartitionState.CANDIDATE_FOUND


def test_a_partition_deleted_mid_election_does_not_stall_the_others() -> None:
    c = Controller(["a", "b", "c"])
    other = StreamMeta("t", "t", "", 2, StreamSettings())
    other.partitions[0] = PartitionMeta("t", 0, "t", "a", ["a", "b", "c"], ["a", "b", "c"])
    c.meta.apply(CreateStream(other))
    c.dead("a")
    c.tick()
    assert [c.meta.partition(s, 0).candidate for s in "st"] == ["c", "c"]
    c.meta.apply(DeleteStream("s"))
    c.now += 2 * S  # neither candidate confirmed; s's next step fails, t's must still be taken
    c.tick()
    assert (c.meta.partition("t", 0).state, c.meta.partition("t", 0).candidate) == (PartitionState.CANDIDATE_FOUND, "b")


def test_a_step_under_way_is_not_started_twice() -> None:
    c = Controller(["a", "b", "c"])
    c.dead("a")
    first = c.core.tick(c.now)
    assert [(type(a), a.step) for a in first if isinstance(a, Propose)] == [(Propose, Step.ENTER_ELECTION)]
    assert c.core.tick(c.now) == [], "the election's first step has no result yet"
    c.run(first)
    assert c.partition.candidate == "c"
    assert c.core.tick(c.now) == [], "waiting for the candidate, within its confirmation time"


def test_a_proposal_that_fails_abandons_the_election_and_the_next_tick_starts_afresh() -> None:
    c = Controller(["a", "b", "c"])
    c.dead("a")
    (enter,) = c.core.tick(c.now)
    assert isinstance(enter, Propose)
    assert c.core.proposed(enter, RuntimeError("not the metadata leader any more")) == []
    assert not c.core.busy(("s", 0)) and ("s", 0) not in c.core.elections
    c.tick()
    assert (c.partition.state, c.partition.candidate) == (PartitionState.CANDIDATE_FOUND, "c")


def test_an_election_a_previous_controller_left_is_resumed_from_the_log_end_question() -> None:
    c = Controller(["a", "b", "c"])
    c.dead("a")
    c.meta.apply(SetPartitionState("s", 0, PartitionState.ELECTION, "", c.partition.epoch))
    actions = c.core.tick(c.now)
    assert actions == [AskLogEnds(("s", 0), ("b", "c"))], "already in ELECTION: no step to repeat"
    c.run(actions)
    assert c.partition.candidate == "c"


def test_replicas_that_do_not_say_where_their_log_ends_still_rank_after_those_that_do() -> None:
    c = Controller(["a", "b", "c"])
    c.dead("a")
    del c.leos["c"]  # alive, but silent to the question
    c.tick()
    assert c.partition.candidate == "b"


def test_reports_about_an_older_state_or_from_outside_the_isr_do_not_count() -> None:
    c = Controller(["a", "b"])
    p = c.partition
    c.run(c.core.report(LeaderReport("s", 0, "c", "a", p.epoch, p.leader_epoch), c.now))  # c is not in sync
    c.run(c.core.report(LeaderReport("s", 0, "b", "a", p.epoch - 1, p.leader_epoch), c.now))  # an older state
    c.run(c.core.report(LeaderReport("s", 0, "b", "x", p.epoch, p.leader_epoch), c.now))  # about another leader
    assert c.ops == []
    c.report("b")  # the only in-sync follower: a majority of one
    assert c.partition.candidate == "b"


def test_a_fenced_leader_hands_over_only_when_an_in_sync_replica_can_take_over() -> None:
    alone = Controller(["a"])
    p = alone.partition
    fenced = LeaderReport("s", 0, "a", "a", p.epoch, p.leader_epoch, fenced="fsync failed")
    alone.run(alone.core.report(fenced, alone.now))
    assert alone.ops == [], "no in-sync replica elsewhere: it keeps leading, readable"
    c = Controller(["a", "b"])
    c.run(c.core.report(fenced, c.now))
    assert c.partition.candidate == "b"
    c.confirm("b")
    assert (c.partition.leader, c.partition.leader_epoch) == ("b", 1)


def test_leadership_goes_back_to_the_preferred_replica_once_it_has_been_in_sync_long_enough() -> None:
    c = Controller(["a", "b", "c"], rebalance_after_ns=10 * S)
    c.dead("a")
    c.tick()
    c.confirm("c")
    assert c.partition.leader == "c"
    c.meta.apply(SetServerLiveness("a", True, c.now))
    c.tick()
    assert c.partition.leader == "c", "a is alive but not in sync"
    c.meta.apply(ChangeIsr("s", 0, ("b", "c", "a"), c.partition.epoch))
    c.tick()  # eligible from now on
    c.now += 9 * S
    c.tick()
    assert c.partition.leader == "c", "not yet in sync for long enough"
    c.dead("a")  # flaps: the wait starts again when it is back
    c.tick()
    c.meta.apply(SetServerLiveness("a", True, c.now))
    c.now += 5 * S
    c.tick()
    c.now += 9 * S
    c.tick()
    assert c.partition.leader == "c"
    c.now += 1 * S
    c.tick()
    assert (c.partition.leader, c.partition.state) == ("a", PartitionState.ONLINE)
    assert isinstance(c.ops[-1], ChangeLeader)
