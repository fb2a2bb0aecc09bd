"""The control protocol: what servers ask the controller and what it answers, as frozen types and one codec.

Pure encode/decode functions, no I/O. Every message is a JSON object (the
same bytes liftlog servers have always exchanged, so servers of different
versions still understand each other); a request's ``kind`` says which it
is, and a forwarded request carries the ``timeout`` the forwarding server
will wait, so the controller answers within it::

    create_stream     name, subject, group, partitions, replication_factor, settings {...}
    delete_stream     name
    pause / resume    name, partitions [...], resume_all
    readonly          name, partitions [...], readonly
    change_isr        name, partition, isr [...], epoch            (a partition leader)
    register_server   server {id, host, port, ...}                 (a server joining)
    report_leader     name, partition, reporter, leader, epoch, leader_epoch, fenced?   (a follower, or a
                      fenced leader handing over)
    confirm_leader    name, partition, replica                     (an election's candidate)
    reassign          moves [{name, partition, replicas [...]}], spread   (an administrator)
    decommission      server
    elect_preferred   (no fields)

    reply             {"index": n} once committed, or {"error": {"kind", "name"?, "partition"?, "message"?}}

Other exchanges, each on its own subject:

    log end query     {"name", "partition"}  ->  {"leo": n}        (the controller asks a replica)
    applied query     {"index", "timeout"}   ->  {"ok": bool}      (has a server acted on this change?)
    join              {"id"}                 ->  {"ok": bool, "error"?}   (add me to the metadata group)
    heartbeat         {"id"}                                       (every server, to the controller)

Decoders check every field's type and raise :class:`ProtocolError` naming
the message and the field; a request of an unknown kind is refused the
same way.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .controller import CreateStreamRequest
from .model import ServerMeta, StreamSettings

if TYPE_CHECKING:
    from liftlog.jsontypes import JSONObject

__all__ = [
    "Applied",
    "AppliedQuery",
    "Committed",
    "ControlRequest",
    "CreateStreamChange",
    "DecommissionChange",
    "DeleteStreamChange",
    "GroupCoordinatorReport",
    "GroupJoinChange",
    "GroupLeaveChange",
    "Heartbeat",
    "IsrChange",
    "JoinAnswer",
    "JoinRequest",
    "LeaderConfirmation",
    "LeaderReport",
    "LogEnd",
    "LogEndQuery",
    "PartitionMove",
    "PauseChange",
    "PolicyChange",
    "PreferredLeadersChange",
    "ProtocolError",
    "ReadonlyChange",
    "ReassignChange",
    "Refusal",
    "RefusalKind",
    "ServerRegistration",
    "decode_applied",
    "decode_applied_query",
    "decode_heartbeat",
    "decode_join",
    "decode_join_answer",
    "decode_log_end",
    "decode_log_end_query",
    "decode_reply",
    "decode_request",
    "encode_applied",
    "encode_applied_query",
    "encode_heartbeat",
    "encode_join",
    "encode_join_answer",
    "encode_log_end",
    "encode_log_end_query",
    "encode_reply",
    "encode_request",
]


class ProtocolError(ValueError):
    """A control message that is not one: not JSON, an unknown kind, a field missing or of the wrong type."""


# -- requests ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CreateStreamChange:
    request: CreateStreamRequest


@dataclass(frozen=True, slots=True)
class DeleteStreamChange:
    name: str


@dataclass(frozen=True, slots=True)
class PauseChange:
    """Pause (or resume) ``partitions`` of a stream, all of them when empty."""

    name: str
    partitions: tuple[int, ...]
    pause: bool
    resume_all: bool = False


@dataclass(frozen=True, slots=True)
class ReadonlyChange:
    name: str
    partitions: tuple[int, ...]
    readonly: bool


@dataclass(frozen=True, slots=True)
class IsrChange:
    """A partition leader's new in-sync replica set, for the partition epoch it knows."""

    name: str
    partition: int
    isr: tuple[str, ...]
    epoch: int


@dataclass(frozen=True, slots=True)
class ServerRegistration:
    server: ServerMeta


@dataclass(frozen=True, slots=True)
class LeaderReport:
    """A follower finds ``leader`` silent; or the leader itself hands over because its log is ``fenced``."""

    name: str
    partition: int
    reporter: str
    leader: str
    epoch: int
    leader_epoch: int
    fenced: str = ""


@dataclass(frozen=True, slots=True)
class LeaderConfirmation:
    """An election's candidate says it is ready to lead."""

    name: str
    partition: int
    replica: str


@dataclass(frozen=True, slots=True)
class PartitionMove:
    """Move one partition to ``replicas`` (the first is its preferred leader)."""

    name: str
    partition: int
    replicas: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ReassignChange:
    """Move partitions: to the replicas named, or (``spread``) as the controller plans over the live servers."""

    moves: tuple[PartitionMove, ...] = ()
    spread: bool = False


@dataclass(frozen=True, slots=True)
class DecommissionChange:
    """Move every replica off ``server``, then remove it from the cluster."""

    server: str


@dataclass(frozen=True, slots=True)
class PolicyChange:
    """Add (or revoke) an authorization rule, on every server."""

    subject: str
    resource: str
    action: str
    add: bool = True


@dataclass(frozen=True, slots=True)
class GroupJoinChange:
    """``consumer`` joins consumer group ``group`` (created if new) to consume ``streams``."""

    group: str
    consumer: str
    streams: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GroupLeaveChange:
    """``consumer`` leaves ``group``; ``expired`` when its coordinator stopped hearing from it."""

    group: str
    consumer: str
    expired: bool = False


@dataclass(frozen=True, slots=True)
class GroupCoordinatorReport:
    """Member ``consumer`` of ``group`` gets no answer from ``coordinator`` at group ``epoch``."""

    group: str
    consumer: str
    coordinator: str
    epoch: int


@dataclass(frozen=True, slots=True)
class PreferredLeadersChange:
    """Hand leadership back to each partition's preferred replica where it can take it now."""


ControlRequest = (
    CreateStreamChange
    | DeleteStreamChange
    | PauseChange
    | ReadonlyChange
    | IsrChange
    | ServerRegistration
    | LeaderReport
    | LeaderConfirmation
    | ReassignChange
    | DecommissionChange
    | PreferredLeadersChange
    | PolicyChange
    | GroupJoinChange
    | GroupLeaveChange
    | GroupCoordinatorReport
)


def encode_request(request: ControlRequest, timeout: float | None = None) -> bytes:
    body = _request_body(request)
    if timeout is not None:
        body["timeout"] = timeout
    return json.dumps(body).encode()


def _request_body(request: ControlRequest) -> JSONObject:
    match request:
        case CreateStreamChange(req):
            return {
                "kind": "create_stream",
                "name": req.name,
                "subject": req.subject,
                "group": req.group,
                "partitions": req.partitions,
                "replication_factor": req.replication_factor,
                "settings": req.settings.to_dict(),
            }
        case DeleteStreamChange(name):
            return {"kind": "delete_stream", "name": name}
        case PauseChange(name, partitions, pause, resume_all):
            kind = "pause" if pause else "resume"
            return {"kind": kind, "name": name, "partitions": list(partitions), "resume_all": resume_all}
        case ReadonlyChange(name, partitions, readonly):
            return {"kind": "readonly", "name": name, "partitions": list(partitions), "readonly": readonly}
        case IsrChange(name, partition, isr, epoch):
            return {"kind": "change_isr", "name": name, "partition": partition, "isr": list(isr), "epoch": epoch}
        case ServerRegistration(server):
            return {"kind": "register_server", "server": server.to_dict()}
        case LeaderReport():
            body: JSONObject = {
                "kind": "report_leader",
                "name": request.name,
                "partition": request.partition,
                "reporter": request.reporter,
                "leader": request.leader,
                "epoch": request.epoch,
                "leader_epoch": request.leader_epoch,
            }
            if request.fenced:
                body["fenced"] = request.fenced
            return body
        case LeaderConfirmation(name, partition, replica):
            return {"kind": "confirm_leader", "name": name, "partition": partition, "replica": replica}
        case ReassignChange(moves, spread):
            listed: list[JSONObject] = [
                {"name": m.name, "partition": m.partition, "replicas": list(m.replicas)} for m in moves
            ]
            return {"kind": "reassign", "moves": listed, "spread": spread}
        case DecommissionChange(server):
            return {"kind": "decommission", "server": server}
        case PreferredLeadersChange():
            return {"kind": "elect_preferred"}
        case PolicyChange(subject, resource, action, add):
            return {"kind": "policy", "subject": subject, "resource": resource, "action": action, "add": add}
        case GroupJoinChange(group, consumer, streams):
            return {"kind": "join_group", "group": group, "consumer": consumer, "streams": list(streams)}
        case GroupLeaveChange(group, consumer, expired):
            return {"kind": "leave_group", "group": group, "consumer": consumer, "expired": expired}
        case GroupCoordinatorReport(group, consumer, coordinator, epoch):
            return {
                "kind": "report_group_coordinator",
                "group": group,
                "consumer": consumer,
                "coordinator": coordinator,
                "epoch": epoch,
            }
    raise TypeError(f"not a control request: {request!r}")


def decode_request(data: bytes) -> tuple[ControlRequest, float | None]:
    """A request and the timeout its sender waits (None when it did not say)."""
    body = _object(data, "control request")
    f = _Fields(body, "control request")
    kind = f.text("kind")
    f.what = f"{kind!r} request"
    timeout = f.number("timeout") if "timeout" in body else None
    request: ControlRequest
    if kind == "create_stream":
        settings = f.mapping("settings") if "settings" in body else {}
        try:
            stream_settings = StreamSettings.from_dict(settings)
        except TypeError as exc:
            raise ProtocolError(f"{f.what}: bad settings: {exc}") from None
        request = CreateStreamChange(
            CreateStreamRequest(
                name=f.text("name"),
                subject=f.text("subject"),
                group=f.text("group", ""),
                partitions=f.integer("partitions", 1),
                replication_factor=f.integer("replication_factor", 1),
                settings=stream_settings,
            )
        )
    elif kind == "delete_stream":
        request = DeleteStreamChange(f.text("name"))
    elif kind in ("pause", "resume"):
        request = PauseChange(f.text("name"), f.integers("partitions"), kind == "pause", f.flag("resume_all", False))
    elif kind == "readonly":
        request = ReadonlyChange(f.text("name"), f.integers("partitions"), f.flag("readonly"))
    elif kind == "change_isr":
        request = IsrChange(f.text("name"), f.integer("partition"), f.texts("isr"), f.integer("epoch"))
    elif kind == "register_server":
        try:
            server = ServerMeta.from_dict(f.mapping("server"))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # int() of an infinite port overflows
            raise ProtocolError(f"{f.what}: bad server: {exc!r}") from None
        request = ServerRegistration(server)
    elif kind == "report_leader":
        request = LeaderReport(
            f.text("name"),
            f.integer("partition"),
            f.text("reporter"),
            f.text("leader"),
            f.integer("epoch"),
            f.integer("leader_epoch"),
            f.text("fenced", ""),
        )
    elif kind == "confirm_leader":
        request = LeaderConfirmation(f.text("name"), f.integer("partition"), f.text("replica"))
    elif kind == "reassign":
        raw = body.get("moves", [])
        if not isinstance(raw, list):
            raise ProtocolError(f"{f.what}: field 'moves' must be a list, not {type(raw).__name__}")
        moves = []
        for i, item in enumerate(raw):
            if not isinstance(item, dict):
                raise ProtocolError(f"{f.what}: move {i} must be an object")
            m = _Fields(item, f"{f.what} move {i}")
            moves.append(PartitionMove(m.text("name"), m.integer("partition"), m.texts("replicas")))
        request = ReassignChange(tuple(moves), f.flag("spread", False))
    elif kind == "decommission":
        request = DecommissionChange(f.text("server"))
    elif kind == "elect_preferred":
        request = PreferredLeadersChange()
    elif kind == "policy":
        request = PolicyChange(f.text("subject"), f.text("resource"), f.text("action"), f.flag("add"))
    elif kind == "join_group":
        request = GroupJoinChange(f.text("group"), f.text("consumer"), f.texts("streams"))
    elif kind == "leave_group":
        request = GroupLeaveChange(f.text("group"), f.text("consumer"), f.flag("expired", False))
    elif kind == "report_group_coordinator":
        request = GroupCoordinatorReport(f.text("group"), f.text("consumer"), f.text("coordinator"), f.integer("epoch"))
    else:
        raise ProtocolError(f"unknown control request kind {kind!r}")
    return request, timeout


# -- replies -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Committed:
    """The change is committed at this metadata index."""

    index: int


class RefusalKind(enum.Enum):
    STREAM_EXISTS = "stream_exists"
    NO_SUCH_STREAM = "no_such_stream"
    NO_SUCH_PARTITION = "no_such_partition"
    NO_SUCH_GROUP = "no_such_group"
    INVALID = "invalid"
    REFUSED = "refused"  # valid, but the cluster's state does not allow it now
    NOT_LEADER = "not_leader"  # the server asked is not the controller: ask the new one
    NO_LEADER = "no_leader"
    OUTCOME_UNKNOWN = "outcome_unknown"
    FAILED = "failed"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Refusal:
    kind: RefusalKind
    name: str = ""
    partition: int = -1
    message: str = ""


def encode_reply(reply: Committed | Refusal) -> bytes:
    if isinstance(reply, Committed):
        return json.dumps({"index": reply.index}).encode()
    error: JSONObject = {"kind": reply.kind.value}
    if reply.name:
        error["name"] = reply.name
    if reply.partition >= 0:
        error["partition"] = reply.partition
    if reply.message:
        error["message"] = reply.message
    return json.dumps({"error": error}).encode()


def decode_reply(data: bytes) -> Committed | Refusal:
    body = _object(data, "controller reply")
    if "index" in body:
        return Committed(_Fields(body, "controller reply").integer("index"))
    error = _Fields(body, "controller reply").mapping("error")
    f = _Fields(error, "controller refusal")
    kind_name = f.text("kind", "other")
    try:
        kind = RefusalKind(kind_name)
    except ValueError:  # a refusal newer than this server: its message still says what happened
        kind = RefusalKind.OTHER
    return Refusal(kind, f.text("name", ""), f.integer("partition", -1), f.text("message", ""))


# -- log end offsets ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogEndQuery:
    """The controller asks a replica how far its log of a partition goes (to pick the least lagging candidate)."""

    name: str
    partition: int


@dataclass(frozen=True, slots=True)
class LogEnd:
    """A replica's log end offset; -1 when it has no log of the partition open."""

    leo: int


def encode_log_end_query(query: LogEndQuery) -> bytes:
    return json.dumps({"name": query.name, "partition": query.partition}).encode()


def decode_log_end_query(data: bytes) -> LogEndQuery:
    f = _Fields(_object(data, "log end query"), "log end query")
    return LogEndQuery(f.text("name"), f.integer("partition"))


def encode_log_end(answer: LogEnd) -> bytes:
    return json.dumps({"leo": answer.leo}).encode()


def decode_log_end(data: bytes) -> LogEnd:
    return LogEnd(_Fields(_object(data, "log end answer"), "log end answer").integer("leo"))


# -- applied, join, heartbeat -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppliedQuery:
    """Has the server acted on metadata ``index``? It may wait ``timeout`` seconds to say yes."""

    index: int
    timeout: float


@dataclass(frozen=True, slots=True)
class Applied:
    ok: bool


@dataclass(frozen=True, slots=True)
class JoinRequest:
    server_id: str


@dataclass(frozen=True, slots=True)
class JoinAnswer:
    ok: bool
    error: str = ""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    server_id: str


def encode_applied_query(query: AppliedQuery) -> bytes:
    return json.dumps({"index": query.index, "timeout": query.timeout}).encode()


def decode_applied_query(data: bytes, default_timeout: float) -> AppliedQuery:
    body = _object(data, "applied query")
    f = _Fields(body, "applied query")
    return AppliedQuery(f.integer("index"), f.number("timeout") if "timeout" in body else default_timeout)


def encode_applied(answer: Applied) -> bytes:
    return json.dumps({"ok": answer.ok}).encode()


def decode_applied(data: bytes) -> Applied:
    return Applied(_Fields(_object(data, "applied answer"), "applied answer").flag("ok", False))


def encode_join(request: JoinRequest) -> bytes:
    return json.dumps({"id": request.server_id}).encode()


def decode_join(data: bytes) -> JoinRequest:
    return JoinRequest(_Fields(_object(data, "join request"), "join request").text("id"))


def encode_join_answer(answer: JoinAnswer) -> bytes:
    body: JSONObject = {"ok": answer.ok}
    if answer.error:
        body["error"] = answer.error
    return json.dumps(body).encode()


def decode_join_answer(data: bytes) -> JoinAnswer:
    f = _Fields(_object(data, "join answer"), "join answer")
    return JoinAnswer(f.flag("ok", False), f.text("error", ""))


def encode_heartbeat(beat: Heartbeat) -> bytes:
    return json.dumps({"id": beat.server_id}).encode()


def decode_heartbeat(data: bytes) -> Heartbeat:
    return Heartbeat(_Fields(_object(data, "heartbeat"), "heartbeat").text("id"))


# -- field checks --------------------------------------------------------------------

_MISSING: Any = object()


def _object(data: bytes, what: str) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise ProtocolError(f"{what} is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"{what} is not a JSON object but {type(body).__name__}")
    return body


class _Fields:
    """Typed reads of a decoded JSON object's fields, each failure a ProtocolError naming the field."""

    def __init__(self, body: dict[str, Any], what: str) -> None:
        self.body = body
        self.what = what

    def _get(self, key: str, default: object, kinds: type | tuple[type, ...], expected: str) -> Any:
        value = self.body.get(key, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise ProtocolError(f"{self.what}: field {key!r} is missing")
            return default
        # bool is an int to isinstance: a flag where a number belongs (or the reverse) is refused.
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in _as_tuple(kinds)):
            raise ProtocolError(f"{self.what}: field {key!r} must be {expected}, not {value!r}")
        return value

    def text(self, key: str, default: str = _MISSING) -> str:
        value: str = self._get(key, default, str, "a string")
        return value

    def integer(self, key: str, default: int = _MISSING) -> int:
        value: int = self._get(key, default, int, "an integer")
        return value

    def number(self, key: str) -> float:
        value = self._get(key, _MISSING, (int, float), "a number")
        try:
            return float(value)
        except OverflowError:  # an integer too large for a float
            raise ProtocolError(f"{self.what}: field {key!r} is a number too large for a float") from None

    def flag(self, key: str, default: bool = _MISSING) -> bool:
        value: bool = self._get(key, default, bool, "true or false")
        return value

    def mapping(self, key: str) -> dict[str, Any]:
        value: dict[str, Any] = self._get(key, _MISSING, dict, "an object")
        return value

    def integers(self, key: str) -> tuple[int, ...]:
        items = self._get(key, [], list, "a list of integers")
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
            raise ProtocolError(f"{self.what}: field {key!r} must be a list of integers, not {items!r}")
        return tuple(items)

    def texts(self, key: str) -> tuple[str, ...]:
        items = self._get(key, _MISSING, list, "a list of strings")
        if not all(isinstance(i, str) for i in items):
            raise ProtocolError(f"{self.what}: field {key!r} must be a list of strings, not {items!r}")
        return tuple(items)


def _as_tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)
