"""Consumer groups in the metadata (sans-IO): membership and epochs, balanced assignments, coordinator reports."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from liftlog.metadata import (
    ChangeGroupCoordinator,
    CreateStream,
    DeleteStream,
    JoinGroup,
    LeaveGroup,
    Metadata,
    NoSuchGroupError,
    PartitionMeta,
    RefusedError,
    RegisterServer,
    ServerMeta,
    StreamMeta,
    StreamSettings,
)
from liftlog.metadata.codec import decode_operation, decode_snapshot, encode_operation, encode_snapshot
from liftlog.metadata.groups import CoordinatorWitnesses, assign, choose_coordinator, plan_join
from liftlog.metadata.protocol import (
    GroupCoordinatorReport,
    GroupJoinChange,
    GroupLeaveChange,
    decode_request,
    encode_request,
)


def metadata(**streams: int) -> Metadata:
    md = Metadata()
    for sid in ("a", "b", "c"):
        md.apply(RegisterServer(ServerMeta(sid, "h", 1), 0))
    for name, n in streams.items():
        s = StreamMeta(name=name, subject=name, group="", creation_timestamp=1, settings=StreamSettings())
        for i in range(n):
            s.partitions[i] = PartitionMeta(stream=name, id=i, subject=name, leader="a", replicas=["a"], isr=["a"])
        md.apply(CreateStream(s))
    return md


def test_joins_and_leaves_move_the_epoch_and_the_last_leave_ends_the_group() -> None:
    md = metadata(orders=4)
    md.apply(plan_join(md, "g", "c1", ("orders",)))
    group = md.group("g")
    first = group.epoch
    md.apply(plan_join(md, "g", "c2", ("orders", "orders")))
    assert group.members == {"c1": ("orders",), "c2": ("orders",)} and group.epoch > first
    with pytest.raises(RefusedError, match="already a member"):
        md.apply(JoinGroup("g", "c1", ("orders",), "a"))
    with pytest.raises(RefusedError, match="stream does not exist"):
        md.apply(JoinGroup("g", "c3", ("ghost",), "a"))
    with pytest.raises(RefusedError, match="not a member"):
        md.apply(LeaveGroup("g", "c9"))
    with pytest.raises(NoSuchGroupError):
        md.apply(LeaveGroup("nope", "c1"))
    md.apply(LeaveGroup("g", "c1"))
    md.apply(LeaveGroup("g", "c2", expired=True))
    assert "g" not in md.groups


def test_a_new_group_gets_the_least_loaded_live_coordinator() -> None:
    md = metadata(s=1)
    coordinators = []
    for i in range(6):
        op = plan_join(md, f"g{i}", "c", ("s",))
        md.apply(op)
        coordinators.append(op.coordinator)
    assert sorted(coordinators) == ["a", "a", "b", "b", "c", "c"]
    assert choose_coordinator(md, exclude="a") in ("b", "c")


def test_deleting_a_stream_drops_it_from_its_groups() -> None:
    md = metadata(s1=2, s2=2)
    md.apply(plan_join(md, "g", "c1", ("s1", "s2")))
    before = md.group("g").epoch
    md.apply(DeleteStream("s2"))
    assert md.group("g").members == {"c1": ("s1",)} and md.group("g").epoch > before
    assert assign(md.group("g"), md) == {"c1": {"s1": [0, 1]}}


@settings(max_examples=200, deadline=None)
@given(
    members=st.dictionaries(
        st.sampled_from(["m1", "m2", "m3", "m4", "m5"]),
        st.lists(st.sampled_from(["s1", "s2", "s3"]), min_size=1, max_size=3, unique=True),
        min_size=1,
    ),
    counts=st.tuples(st.integers(1, 7), st.integers(1, 7), st.integers(1, 7)),
)
def test_every_partition_goes_to_exactly_one_subscriber_and_loads_stay_even(
    members: dict[str, list[str]], counts: tuple[int, int, int]
) -> None:
    md = metadata(s1=counts[0], s2=counts[1], s3=counts[2])
    for consumer, streams in members.items():
        md.apply(plan_join(md, "g", consumer, tuple(streams)))
    group = md.group("g")
    got = assign(group, md)
    assert got == assign(group, md)  # the same on every server
    for stream, n in zip(("s1", "s2", "s3"), counts, strict=True):
        holders = [(c, p) for c, mine in got.items() for p in mine.get(stream, [])]
        subscribed = [c for c, ss in members.items() if stream in ss]
        if subscribed:
            assert sorted(p for _, p in holders) == list(range(n))
            assert all(c in subscribed for c, _ in holders)
        else:
            assert holders == []
    if all(set(ss) == {"s1", "s2", "s3"} for ss in members.values()):
        loads = [sum(map(len, mine.values())) for mine in got.values()]
        assert max(loads) - min(loads) <= 1


def test_most_members_reporting_the_coordinator_replace_it() -> None:
    md = metadata(s=1)
    for c in ("c1", "c2", "c3"):
        md.apply(plan_join(md, "g", c, ("s",)))
    group = md.group("g")
    witnesses = CoordinatorWitnesses(window_ns=10)
    assert not witnesses.report(group, "c1", group.coordinator, group.epoch, now=0)
    assert not witnesses.report(group, "c1", group.coordinator, group.epoch, now=1)  # the same one twice
    assert witnesses.report(group, "c2", group.coordinator, group.epoch, now=2)
    assert not CoordinatorWitnesses(window_ns=10).report(group, "c3", group.coordinator, group.epoch, now=0)
    late = CoordinatorWitnesses(window_ns=10)
    late.report(group, "c1", group.coordinator, group.epoch, now=0)
    assert not late.report(group, "c2", group.coordinator, group.epoch, now=50)  # c1's report expired
    with pytest.raises(RefusedError, match="generation mismatch"):
        witnesses.report(group, "c1", group.coordinator, group.epoch - 1, now=3)
    with pytest.raises(RefusedError, match="not a member"):
        witnesses.report(group, "c9", group.coordinator, group.epoch, now=3)
    epoch = group.epoch
    md.apply(ChangeGroupCoordinator("g", "b", epoch))
    assert (group.coordinator, group.epoch > epoch) == ("b", True)
    with pytest.raises(RefusedError, match="epoch"):
        md.apply(ChangeGroupCoordinator("g", "c", epoch))


def test_groups_survive_the_codec_and_snapshots() -> None:
    md = metadata(s=3)
    for op in (
        JoinGroup("g", "c1", ("s",), "a"),
        JoinGroup("g", "c2", ("s",), "a"),
        LeaveGroup("g", "c1", expired=True),
        ChangeGroupCoordinator("g", "b", 3),
    ):
        assert decode_operation(encode_operation(op)) == op
        md.apply(op)
    restored = decode_snapshot(encode_snapshot(md))
    assert restored.groups == md.groups and restored.group_epoch == md.group_epoch
    for request in (
        GroupJoinChange("g", "c", ("s", "t")),
        GroupLeaveChange("g", "c", expired=True),
        GroupCoordinatorReport("g", "c", "a", 7),
    ):
        assert decode_request(encode_request(request)) == (request, None)
