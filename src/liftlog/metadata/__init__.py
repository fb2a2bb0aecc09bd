"""Cluster metadata: which streams exist, their partitions, leaders and flags.

``model`` is the sans-IO state machine changed by operations; ``store``
persists it for a standalone server (issue 4 replaces that with Raft);
``placement`` chooses the replicas and preferred leader of new partitions.
"""

from .model import (
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
    SetPaused,
    SetReadonly,
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
    "PlacementError",
    "ServerInfo",
    "SetPaused",
    "SetReadonly",
    "StreamExistsError",
    "StreamMeta",
    "StreamSettings",
    "partition_subject",
    "place_partitions",
    "validate_stream_name",
    "validate_subject",
]
