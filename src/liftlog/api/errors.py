"""Why an RPC failed, in a form both the server and our client agree on.

Liftbridge clients only see a gRPC status code and a message, so the server
keeps Liftbridge's codes and wording. It also attaches one trailing-metadata
entry, ``liftlog-error: <reason>``, so our client can raise a precise
exception without parsing messages. Other clients ignore the entry.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = ["ERROR_KEY", "NOT_LEADER_MESSAGE", "Reason"]

#: Trailing-metadata key carrying a :class:`Reason` value.
ERROR_KEY: Final = "liftlog-error"

#: Liftbridge's exact FAILED_PRECONDITION message; its clients match on it to re-route.
NOT_LEADER_MESSAGE: Final = "Server not partition leader"


class Reason(enum.StrEnum):
    """Machine-readable cause of a failed RPC (the value of ``liftlog-error``)."""

    STREAM_EXISTS = "stream_exists"  # ALREADY_EXISTS
    NO_SUCH_STREAM = "no_such_stream"  # NOT_FOUND
    NO_SUCH_PARTITION = "no_such_partition"  # NOT_FOUND
    NO_SUCH_GROUP = "no_such_group"  # NOT_FOUND: a consumer group
    NOT_LEADER = "not_leader"  # FAILED_PRECONDITION
    READONLY = "readonly"  # FAILED_PRECONDITION
    PAUSED = "paused"  # FAILED_PRECONDITION (subscribe without resume)
    INCORRECT_OFFSET = "incorrect_offset"  # FAILED_PRECONDITION
    REFUSED = "refused"  # FAILED_PRECONDITION: the cluster's state does not allow the change now (liftlog.Cluster)
    TOO_LARGE = "too_large"  # INVALID_ARGUMENT
    INVALID_ARGUMENT = "invalid_argument"  # INVALID_ARGUMENT
    OUT_OF_RANGE = "out_of_range"  # OUT_OF_RANGE: an offset outside the partition's log (liftlog.Batches/Fetch)
    ACK_TIMEOUT = "ack_timeout"  # DEADLINE_EXCEEDED
    NOT_APPLIED = "not_applied"  # DEADLINE_EXCEEDED: a metadata change is committed, not yet acted on here
    OUTCOME_UNKNOWN = "outcome_unknown"  # DEADLINE_EXCEEDED: a metadata change may or may not be committed
    STREAM_DELETED = "stream_deleted"  # NOT_FOUND, ends a subscription
    UNAVAILABLE = "unavailable"  # UNAVAILABLE (NATS down, shutting down)
    UNIMPLEMENTED = "unimplemented"  # UNIMPLEMENTED
    LIMIT_EXCEEDED = "limit_exceeded"  # RESOURCE_EXHAUSTED: a server limit; the message names its setting
    INTERNAL = "internal"  # INTERNAL
    PERMISSION_DENIED = "permission_denied"  # PERMISSION_DENIED: the message names identity, resource and action
    ENCRYPTION = "encryption"  # INTERNAL: an encrypted stream's data cannot be encrypted or decrypted on the server
