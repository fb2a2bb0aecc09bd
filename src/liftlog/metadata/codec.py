"""Metadata operations and snapshots as bytes: what the metadata Raft log and its snapshots hold.

Operations are JSON objects tagged by ``"op"``; a snapshot is the JSON of
``Metadata.to_dict``, zlib-compressed because it travels in one NATS message
(InstallSnapshot) and NATS caps payloads at 1 MiB by default. JSON keeps the
log readable with standard tools and lets fields be added without a new format.
"""

from __future__ import annotations

import json
import zlib
from typing import TYPE_CHECKING

from .model import (
    AddPolicy,
    ChangeGroupCoordinator,
    ChangeIsr,
    ChangeLeader,
    CompleteReassignment,
    CreateStream,
    DeleteStream,
    JoinGroup,
    LeaveGroup,
    MarkActivityPublished,
    Metadata,
    Operation,
    PartitionState,
    Policy,
    ReassignPartition,
    RegisterServer,
    RemoveServer,
    RevokePolicy,
    ServerMeta,
    SetPartitionState,
    SetPaused,
    SetReadonly,
    SetServerLeaving,
    SetServerLiveness,
    StreamMeta,
)

if TYPE_CHECKING:
    from liftlog.jsontypes import JSONObject

__all__ = ["MetadataCodecError", "decode_operation", "decode_snapshot", "encode_operation", "encode_snapshot"]


class MetadataCodecError(ValueError):
    """Bytes that are not an operation or snapshot this version understands."""


def encode_operation(op: Operation) -> bytes:
    body: JSONObject
    match op:
        case RegisterServer():
            body = {"op": "register_server", "server": op.server.to_dict(), "timestamp": op.timestamp}
        case SetServerLiveness():
            body = {"op": "set_server_liveness", "id": op.id, "alive": op.alive, "timestamp": op.timestamp}
        case CreateStream():
            body = {"op": "create_stream", "stream": op.stream.to_dict()}
        case DeleteStream():
            body = {"op": "delete_stream", "name": op.name}
        case SetPaused():
            body = {
                "op": "set_paused",
                "name": op.name,
                "partitions": list(op.partitions),
                "paused": op.paused,
                "timestamp": op.timestamp,
                "resume_all": op.resume_all,
            }
        case SetReadonly():
            body = {
                "op": "set_readonly",
                "name": op.name,
                "partitions": list(op.partitions),
                "readonly": op.readonly,
                "timestamp": op.timestamp,
            }
        case ChangeIsr():
            body = {"op": "change_isr", "name": op.name, "partition": op.partition, "isr": list(op.isr)}
            body["epoch"] = op.epoch
        case ChangeLeader():
            body = {"op": "change_leader", "name": op.name, "partition": op.partition, "leader": op.leader}
            body |= {"isr": list(op.isr), "epoch": op.epoch}
        case SetPartitionState():
            body = {"op": "set_partition_state", "name": op.name, "partition": op.partition}
            body |= {"state": op.state.value, "candidate": op.candidate, "epoch": op.epoch}
        case ReassignPartition():
            body = {"op": "reassign_partition", "name": op.name, "partition": op.partition}
            body |= {"target": list(op.target), "epoch": op.epoch}
        case CompleteReassignment():
            body = {"op": "complete_reassignment", "name": op.name, "partition": op.partition, "epoch": op.epoch}
        case SetServerLeaving():
            body = {"op": "set_server_leaving", "id": op.id, "leaving": op.leaving}
        case RemoveServer():
            body = {"op": "remove_server", "id": op.id}
        case AddPolicy() | RevokePolicy():
            kind = "add_policy" if isinstance(op, AddPolicy) else "revoke_policy"
            p = op.policy
            body = {"op": kind, "subject": p.subject, "resource": p.resource, "action": p.action}
        case MarkActivityPublished():
            body = {"op": "mark_activity_published", "index": op.index}
        case JoinGroup():
            body = {
                "op": "join_group",
                "group": op.group,
                "consumer": op.consumer,
                "streams": list(op.streams),
                "coordinator": op.coordinator,
            }
        case LeaveGroup():
            body = {"op": "leave_group", "group": op.group, "consumer": op.consumer, "expired": op.expired}
        case ChangeGroupCoordinator():
            body = {"op": "change_group_coordinator", "group": op.group, "coordinator": op.coordinator}
            body["epoch"] = op.epoch
        case _:  # pragma: no cover
            raise TypeError(f"unknown metadata operation {op!r}")
    return json.dumps(body, separators=(",", ":")).encode()


def decode_operation(data: bytes) -> Operation:
    try:
        body = json.loads(data)
        kind = body["op"]
        if kind == "register_server":
            return RegisterServer(ServerMeta.from_dict(body["server"]), int(body["timestamp"]))
        if kind == "set_server_liveness":
            return SetServerLiveness(str(body["id"]), bool(body["alive"]), int(body["timestamp"]))
        if kind == "create_stream":
            return CreateStream(StreamMeta.from_dict(body["stream"]))
        if kind == "delete_stream":
            return DeleteStream(str(body["name"]))
        if kind == "set_paused":
            return SetPaused(
                str(body["name"]),
                tuple(int(p) for p in body["partitions"]),
                bool(body["paused"]),
                int(body["timestamp"]),
                bool(body.get("resume_all", False)),
            )
        if kind == "set_readonly":
            return SetReadonly(
                str(body["name"]),
                tuple(int(p) for p in body["partitions"]),
                bool(body["readonly"]),
                int(body["timestamp"]),
            )
        if kind == "change_isr":
            return ChangeIsr(str(body["name"]), int(body["partition"]), _names(body["isr"]), int(body["epoch"]))
        if kind == "change_leader":
            return ChangeLeader(
                str(body["name"]),
                int(body["partition"]),
                str(body["leader"]),
                _names(body["isr"]),
                int(body["epoch"]),
            )
        if kind == "set_partition_state":
            return SetPartitionState(
                str(body["name"]),
                int(body["partition"]),
                PartitionState(body["state"]),
                str(body["candidate"]),
                int(body["epoch"]),
            )
        if kind == "reassign_partition":
            return ReassignPartition(
                str(body["name"]), int(body["partition"]), _names(body["target"]), int(body["epoch"])
            )
        if kind == "complete_reassignment":
            return CompleteReassignment(str(body["name"]), int(body["partition"]), int(body["epoch"]))
        if kind == "set_server_leaving":
            return SetServerLeaving(str(body["id"]), bool(body["leaving"]))
        if kind == "remove_server":
            return RemoveServer(str(body["id"]))
        if kind == "mark_activity_published":
            return MarkActivityPublished(int(body["index"]))
        if kind == "join_group":
            return JoinGroup(
                str(body["group"]), str(body["consumer"]), _names(body["streams"]), str(body["coordinator"])
            )
        if kind == "leave_group":
            return LeaveGroup(str(body["group"]), str(body["consumer"]), bool(body["expired"]))
        if kind == "change_group_coordinator":
            return ChangeGroupCoordinator(str(body["group"]), str(body["coordinator"]), int(body["epoch"]))
        if kind in ("add_policy", "revoke_policy"):
            policy = Policy(str(body["subject"]), str(body["resource"]), str(body["action"]))
            return AddPolicy(policy) if kind == "add_policy" else RevokePolicy(policy)
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:  # int(inf), nested too deep
        raise MetadataCodecError(f"malformed metadata operation: {exc}") from exc
    raise MetadataCodecError(f"unknown metadata operation {kind!r}")


def _names(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list of server ids, got {type(value).__name__}")
    return tuple(str(v) for v in value)


def encode_snapshot(metadata: Metadata) -> bytes:
    return zlib.compress(json.dumps(metadata.to_dict(), separators=(",", ":")).encode())


def decode_snapshot(data: bytes) -> Metadata:
    if not data:
        return Metadata()
    try:
        body = json.loads(zlib.decompress(data))
        if not isinstance(body, dict):
            raise TypeError(f"expected a JSON object, got {type(body).__name__}")
        return Metadata.from_dict(body)
    except (zlib.error, ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
        raise MetadataCodecError(f"malformed metadata snapshot: {exc}") from exc
