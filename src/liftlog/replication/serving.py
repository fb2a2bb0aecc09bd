"""Whether a leader serves a follower's fetch or epoch question, or refuses it and why.

Both ask in the follower's leader epoch, for one incarnation of the stream (its creation
timestamp: a stream deleted and created again under its name is another log). The server's
replicator and the whole-cluster simulation answer with these rules, in this order:

- a replica that does not lead (this incarnation) refuses with NOT_LEADER, never with "no such
  epoch": that answer would make the follower truncate its whole log;
- another incarnation is UNKNOWN_PARTITION (a fetch) or NOT_LEADER (an epoch question);
- another leader epoch is STALE_EPOCH, with the leader's epoch: a follower behind it truncates
  by epoch first, and a deposed leader that has not heard of its successor must not count a
  newer follower's fetch towards its high watermark;
- a fetch offset outside the log is OFFSET_OUT_OF_RANGE, with the log start.

Sans-IO: the leader's replica as plain values in (``leader_epoch`` None: not leading), a
:class:`FetchError` or None out.
"""

from __future__ import annotations

from .protocol import EpochOffsetRequest, FetchError, FetchErrorCode, PartitionFetch

__all__ = ["epoch_question_refusal", "fetch_refusal"]


def fetch_refusal(
    server_id: str, leader_epoch: int | None, created: int, log_start: int, log_end: int, fetch: PartitionFetch
) -> FetchError | None:
    """Why the leader must not serve ``fetch``, or None to serve it."""
    if leader_epoch is None:
        return FetchError(FetchErrorCode.NOT_LEADER, f"{server_id} does not lead it", -1, -1)
    if fetch.created != created:
        why = f"{server_id} has the stream created at {created}, not at {fetch.created}"
        return FetchError(FetchErrorCode.UNKNOWN_PARTITION, why, -1, -1)
    if fetch.leader_epoch != leader_epoch:
        why = f"leader epoch is {leader_epoch}, not {fetch.leader_epoch}"
        return FetchError(FetchErrorCode.STALE_EPOCH, why, leader_epoch, log_start)
    if fetch.offset < log_start or fetch.offset > log_end:
        why = f"offset {fetch.offset} is outside {log_start}..{log_end}"
        return FetchError(FetchErrorCode.OFFSET_OUT_OF_RANGE, why, leader_epoch, log_start)
    return None


def epoch_question_refusal(
    server_id: str, leader_epoch: int | None, created: int, log_start: int, question: EpochOffsetRequest
) -> FetchError | None:
    """Why the leader must not answer ``question`` (where the follower's epoch ends), or None to answer."""
    if leader_epoch is None or question.created != created:
        return FetchError(FetchErrorCode.NOT_LEADER, f"{server_id} does not lead it", -1, -1)
    if question.current_epoch != leader_epoch:
        # A deposed leader that has not heard of its successor, or one that is ahead of the follower.
        why = f"leader epoch is {leader_epoch}, not {question.current_epoch}"
        return FetchError(FetchErrorCode.STALE_EPOCH, why, leader_epoch, log_start)
    return None
