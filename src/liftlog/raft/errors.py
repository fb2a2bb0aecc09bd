"""Errors raised to the caller of ``RaftNode``; each names the problem."""

from __future__ import annotations

__all__ = ["NotLeader", "ProposalDropped", "RaftError"]


class RaftError(Exception):
    """Base class of the raft core's errors."""


class NotLeader(RaftError):
    """This node is not the leader; ``leader_hint`` is the leader it knows of, if any."""

    def __init__(self, leader_hint: str | None, node_id: str | None = None) -> None:
        who = node_id or "this node"
        super().__init__(f"{who} is not the leader (leader: {leader_hint or 'unknown'})")
        self.leader_hint = leader_hint
        self.node_id = node_id


class ProposalDropped(RaftError):
    """The leader refused a request for the reason given (retry later, maybe elsewhere)."""
