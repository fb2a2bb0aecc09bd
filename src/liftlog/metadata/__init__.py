"""Cluster metadata: which streams exist, their partitions, leaders and flags.

``model`` is the sans-IO state machine changed by operations; ``store``
persists it for a standalone server (issue 4 replaces that with Raft);
``placement`` chooses the replicas and preferred leader of new partitions.
"""

from .model import (
    ChangeIsr,
    ChangeLeader,
    CreateStream,
    DeleteStream,
    EventTimestamps,
    InvalidStreamError,
    Metadata,
    MetadataError,
    NoSuchPartitionError,
    NoSuchStreamError,
    Operation,
    PartitionMeta,
    PartitionState,
    RegisterServer,
    ServerMeta,
    SetPartitionState,
    SetPaused,
    SetReadonly,
    SetServerLiveness,
    StaleEpochError,
    StreamExistsError,
    StreamMeta,
    StreamSettings,
    partition_subject,
    validate_stream_name,
    validate_subject,
)
from .placement import PlacementError, ServerInfo, place_partitions
from .store import CorruptMetadataError, MetadataFile

__all__ = [
    "ChangeIsr",
    "ChangeLeader",
    "CorruptMetadataError",
    "CreateStream",
    "DeleteStream",
    "EventTimestamps",
    "InvalidStreamError",
    "Metadata",
    "MetadataError",
    "MetadataFile",
    "NoSuchPartitionError",
    "NoSuchStreamError",
    "Operation",
    "PartitionMeta",
    "PartitionState",
    "PlacementError",
    "RegisterServer",
    "ServerInfo",
    "ServerMeta",
    "SetPartitionState",
    "SetPaused",
    "SetReadonly",
    "SetServerLiveness",
    "StaleEpochError",
    "StreamExistsError",
    "StreamMeta",
    "StreamSettings",
    "partition_subject",
    "place_partitions",
    "validate_stream_name",
    "validate_subject",
]
