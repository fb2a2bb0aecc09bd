"""Who may call what: each RPC's action and resource, checked before its handler runs.

With ``tls.client.authz.enabled`` every call is checked against the policies
(``liftlog.security.authz``): from Liftbridge's model and policy files when
``tls.client.authz.model`` and ``.policy`` are set (reloaded on SIGHUP), else
from the cluster metadata, which every server applies at the same Raft index
(managed with ``liftlog.Cluster``'s AddPolicy, RevokePolicy and ListPolicies,
``liftlog acl``). A refused call ends with PERMISSION_DENIED naming the
identity, the resource and the action. PublishAsync checks each request and
answers a refused one with ``PublishAsyncError.PERMISSION_DENIED``, as
Liftbridge does, while the call goes on.

Subjects are checked too, because a stream reads (and a publish reaches)
whatever its subject matches, not only what its name suggests:

- CreateStream needs the action on the stream's subject as well as on its
  name, and the caller must be allowed to Subscribe to every existing stream
  whose partition subjects overlap the new stream's (wildcards both ways):
  else it would read that stream's messages, and what it publishes would land
  there. The refusal names the stream it would expose.
- PublishToSubject needs Publish on every stream its subject reaches.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from liftlog.api.errors import Reason
from liftlog.metadata import StreamMeta, subjects_overlap
from liftlog.rpc import Method, ServerContext, StatusCode
from liftlog.security.authz import Authorizer, identity_of
from liftlog.server.api.failures import RpcFailure, abort_with
from liftlog.server.ratelimit import LogLimiter

if TYPE_CHECKING:
    from google.protobuf.message import Message as ProtoMessage

__all__ = ["ACTIONS", "AccessControl"]

log = logging.getLogger(__name__)
_warn = LogLimiter(log)

#: The resource a call's request names; each method's request type has the field its function reads.
Resource = Callable[[Any], str]


class _Streamed(Protocol):
    @property
    def stream(self) -> str: ...


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class _Subjected(Protocol):
    @property
    def subject(self) -> str: ...


def _stream(request: _Streamed) -> str:
    return str(request.stream)


def _name(request: _Named) -> str:
    return str(request.name)


def _subject(request: _Subjected) -> str:
    return str(request.subject)


def _anything(_request: object) -> str:
    return "*"


#: Method path -> (action, the resource of its request). Paths not listed are refused when authorization is on.
ACTIONS: dict[str, tuple[str, Resource]] = {
    "/proto.API/CreateStream": ("CreateStream", _name),
    "/proto.API/DeleteStream": ("DeleteStream", _name),
    "/proto.API/PauseStream": ("PauseStream", _name),
    "/proto.API/SetStreamReadonly": ("SetStreamReadonly", _name),
    "/proto.API/Subscribe": ("Subscribe", _stream),
    "/proto.API/FetchMetadata": ("FetchMetadata", _anything),
    "/proto.API/FetchPartitionMetadata": ("FetchPartitionMetadata", _stream),
    "/proto.API/Publish": ("Publish", _stream),
    "/proto.API/PublishToSubject": ("PublishToSubject", _subject),
    "/proto.API/SetCursor": ("SetCursor", _stream),
    "/proto.API/FetchCursor": ("FetchCursor", _stream),
    "/proto.API/JoinConsumerGroup": ("JoinConsumerGroup", _anything),
    "/proto.API/LeaveConsumerGroup": ("LeaveConsumerGroup", _anything),
    "/proto.API/FetchConsumerGroupAssignments": ("FetchConsumerGroupAssignments", _anything),
    "/proto.API/ReportConsumerGroupCoordinator": ("ReportConsumerGroupCoordinator", _anything),
    # liftlog's batched paths need the rights of the calls they stand for.
    "/liftlog.Batches/Fetch": ("Subscribe", _stream),
    "/liftlog.Batches/Publish": ("Publish", _stream),
}
#: Checked per request, inside the call (see serve_publish_async).
PER_REQUEST = frozenset({"/proto.API/PublishAsync"})
_CLUSTER_PREFIX = "/liftlog.Cluster/"


class AccessControl:
    """The policy decisions of this server; ``authorizer`` None means authorization is off."""

    def __init__(self, authorizer: Authorizer | None) -> None:
        self.authorizer = authorizer

    @property
    def enabled(self) -> bool:
        return self.authorizer is not None

    def refusal(self, context: ServerContext, resource: str, action: str) -> RpcFailure | None:
        """None if the caller may do ``action`` on ``resource``; else the PERMISSION_DENIED to answer."""
        authorizer = self.authorizer
        if authorizer is None:
            return None
        identity = identity_of(context.peer_certificate())
        if authorizer.allowed(identity, resource, action):
            return None
        who = f"identity {identity!r}" if identity else "a client without a certificate"
        message = f"permission denied: {who} may not {action} on {resource!r}"
        _warn.warning("%s (from %s)", message, context.peer(), key=f"denied:{identity}:{action}")
        return RpcFailure(StatusCode.PERMISSION_DENIED, Reason.PERMISSION_DENIED, message)

    def subject_refusal(
        self,
        context: ServerContext,
        subjects: Iterable[str],
        streams: Iterable[StreamMeta],
        action: str,
        why: str,
    ) -> RpcFailure | None:
        """None if the caller may do ``action`` on every stream with a partition subject that overlaps one of
        ``subjects``; else the PERMISSION_DENIED naming the first that it may not (``why`` says what the call
        would do to it)."""
        if self.authorizer is None:
            return None
        subjects = tuple(subjects)
        for stream in streams:
            for part in stream.partitions.values():
                mine = next((s for s in subjects if subjects_overlap(s, part.subject)), None)
                if mine is None:
                    continue
                failure = self.refusal(context, stream.name, action)
                if failure is not None:
                    return RpcFailure(
                        StatusCode.PERMISSION_DENIED,
                        Reason.PERMISSION_DENIED,
                        f"{failure.message}, and subject {mine!r} overlaps its partition {part.id}'s subject "
                        f"{part.subject!r}: {why}",
                    )
                break
        return None

    def guard(self, methods: Iterable[Method]) -> list[Method]:
        """``methods`` with a check before each handler (unchanged when authorization is off)."""
        if self.authorizer is None:
            return list(methods)
        return [self._guarded(m) for m in methods]

    def _guarded(self, method: Method) -> Method:
        if method.path in PER_REQUEST:
            return method
        entry = ACTIONS.get(method.path)
        if entry is None and method.path.startswith(_CLUSTER_PREFIX):
            entry = (method.path.removeprefix(_CLUSTER_PREFIX), _anything)
        if entry is None:
            entry = (method.path.rsplit("/", 1)[-1], _anything)
        action, resource_of = entry
        inner: Callable[..., Any] = method.handler
        refusal = self.refusal

        async def handler(request: ProtoMessage, context: ServerContext) -> object:
            failure = refusal(context, resource_of(request), action)
            if failure is not None:
                await abort_with(context, failure)
            return await inner(request, context)

        async def streaming_handler(request: ProtoMessage, context: ServerContext) -> AsyncIterator[object]:
            failure = refusal(context, resource_of(request), action)
            if failure is not None:
                await abort_with(context, failure)
            result = inner(request, context)
            if hasattr(result, "__anext__"):  # a handler that yields its messages
                try:
                    async for response in result:
                        yield response
                finally:
                    await result.aclose()  # its clean-up (a subscription's slot) now, not when collected
            else:  # one that writes them itself
                await result

        return Method(
            path=method.path,
            handler=streaming_handler if method.server_streaming else handler,
            request_type=method.request_type,
            client_streaming=method.client_streaming,
            server_streaming=method.server_streaming,
        )
