"""Cluster metadata: which streams exist, their partitions, leaders and flags.

``model`` is the sans-IO state machine changed by operations; ``store``
persists it for a standalone server (issue 4 replaces that with Raft);
``names`` holds the rules for stream names and subjects;
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
)
from .names import (
    check_stream_usable,
    subjects_overlap,
    validate_new_stream,
    validate_stream_name,
    validate_stream_subject,
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
    "check_stream_usable",
    "partition_subject",
    "place_partitions",
    "subjects_overlap",
    "validate_new_stream",
    "validate_stream_name",
    "validate_stream_subject",
    "validate_subject",
]
