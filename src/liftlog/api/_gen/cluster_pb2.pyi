from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GroupsRequest(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, groups: _Optional[_Iterable[str]] = ...) -> None: ...

class GroupMember(_message.Message):
    __slots__ = ("consumerId", "streams", "assignments")
    class AssignmentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: PartitionList
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[PartitionList, _Mapping]] = ...) -> None: ...
    CONSUMERID_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    consumerId: str
    streams: _containers.RepeatedScalarFieldContainer[str]
    assignments: _containers.MessageMap[str, PartitionList]
    def __init__(self, consumerId: _Optional[str] = ..., streams: _Optional[_Iterable[str]] = ..., assignments: _Optional[_Mapping[str, PartitionList]] = ...) -> None: ...

class PartitionList(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class GroupStatus(_message.Message):
    __slots__ = ("id", "coordinator", "epoch", "members")
    ID_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    id: str
    coordinator: str
    epoch: int
    members: _containers.RepeatedCompositeFieldContainer[GroupMember]
    def __init__(self, id: _Optional[str] = ..., coordinator: _Optional[str] = ..., epoch: _Optional[int] = ..., members: _Optional[_Iterable[_Union[GroupMember, _Mapping]]] = ...) -> None: ...

class GroupsResponse(_message.Message):
    __slots__ = ("groups", "unknown")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupStatus]
    unknown: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupStatus, _Mapping]]] = ..., unknown: _Optional[_Iterable[str]] = ...) -> None: ...

class Policy(_message.Message):
    __slots__ = ("subject", "resource", "action")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    subject: str
    resource: str
    action: str
    def __init__(self, subject: _Optional[str] = ..., resource: _Optional[str] = ..., action: _Optional[str] = ...) -> None: ...

class PolicyRequest(_message.Message):
    __slots__ = ("policy",)
    POLICY_FIELD_NUMBER: _ClassVar[int]
    policy: Policy
    def __init__(self, policy: _Optional[_Union[Policy, _Mapping]] = ...) -> None: ...

class PolicyResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPoliciesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPoliciesResponse(_message.Message):
    __slots__ = ("policies", "enforced", "fromFiles")
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    ENFORCED_FIELD_NUMBER: _ClassVar[int]
    FROMFILES_FIELD_NUMBER: _ClassVar[int]
    policies: _containers.RepeatedCompositeFieldContainer[Policy]
    enforced: bool
    fromFiles: bool
    def __init__(self, policies: _Optional[_Iterable[_Union[Policy, _Mapping]]] = ..., enforced: _Optional[bool] = ..., fromFiles: _Optional[bool] = ...) -> None: ...

class PartitionReplicas(_message.Message):
    __slots__ = ("stream", "partition", "replicas")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partition: int
    replicas: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, stream: _Optional[str] = ..., partition: _Optional[int] = ..., replicas: _Optional[_Iterable[str]] = ...) -> None: ...

class ReassignRequest(_message.Message):
    __slots__ = ("partitions", "spread")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    SPREAD_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionReplicas]
    spread: bool
    def __init__(self, partitions: _Optional[_Iterable[_Union[PartitionReplicas, _Mapping]]] = ..., spread: _Optional[bool] = ...) -> None: ...

class ReplicaProgress(_message.Message):
    __slots__ = ("id", "logEnd", "inSync")
    ID_FIELD_NUMBER: _ClassVar[int]
    LOGEND_FIELD_NUMBER: _ClassVar[int]
    INSYNC_FIELD_NUMBER: _ClassVar[int]
    id: str
    logEnd: int
    inSync: bool
    def __init__(self, id: _Optional[str] = ..., logEnd: _Optional[int] = ..., inSync: _Optional[bool] = ...) -> None: ...

class Reassignment(_message.Message):
    __slots__ = ("stream", "partition", "current", "target", "leader", "leaderLogEnd", "replicas", "leaderLogStart")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADERLOGEND_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LEADERLOGSTART_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partition: int
    current: _containers.RepeatedScalarFieldContainer[str]
    target: _containers.RepeatedScalarFieldContainer[str]
    leader: str
    leaderLogEnd: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaProgress]
    leaderLogStart: int
    def __init__(self, stream: _Optional[str] = ..., partition: _Optional[int] = ..., current: _Optional[_Iterable[str]] = ..., target: _Optional[_Iterable[str]] = ..., leader: _Optional[str] = ..., leaderLogEnd: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaProgress, _Mapping]]] = ..., leaderLogStart: _Optional[int] = ...) -> None: ...

class ReassignResponse(_message.Message):
    __slots__ = ("reassignments",)
    REASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    reassignments: _containers.RepeatedCompositeFieldContainer[Reassignment]
    def __init__(self, reassignments: _Optional[_Iterable[_Union[Reassignment, _Mapping]]] = ...) -> None: ...

class DecommissionRequest(_message.Message):
    __slots__ = ("server",)
    SERVER_FIELD_NUMBER: _ClassVar[int]
    server: str
    def __init__(self, server: _Optional[str] = ...) -> None: ...

class DecommissionResponse(_message.Message):
    __slots__ = ("reassignments",)
    REASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    reassignments: _containers.RepeatedCompositeFieldContainer[Reassignment]
    def __init__(self, reassignments: _Optional[_Iterable[_Union[Reassignment, _Mapping]]] = ...) -> None: ...

class ElectPreferredLeadersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ElectPreferredLeadersResponse(_message.Message):
    __slots__ = ("changed",)
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    changed: int
    def __init__(self, changed: _Optional[int] = ...) -> None: ...

class ReassignmentsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReassignmentsResponse(_message.Message):
    __slots__ = ("serverId", "reassignments", "leaving")
    SERVERID_FIELD_NUMBER: _ClassVar[int]
    REASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    serverId: str
    reassignments: _containers.RepeatedCompositeFieldContainer[Reassignment]
    leaving: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, serverId: _Optional[str] = ..., reassignments: _Optional[_Iterable[_Union[Reassignment, _Mapping]]] = ..., leaving: _Optional[_Iterable[str]] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerStatus(_message.Message):
    __slots__ = ("id", "host", "port", "rack", "alive", "livenessChanged", "voter", "controller", "partitionCount", "leaderCount", "leaving")
    ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    LIVENESSCHANGED_FIELD_NUMBER: _ClassVar[int]
    VOTER_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    PARTITIONCOUNT_FIELD_NUMBER: _ClassVar[int]
    LEADERCOUNT_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    id: str
    host: str
    port: int
    rack: str
    alive: bool
    livenessChanged: int
    voter: bool
    controller: bool
    partitionCount: int
    leaderCount: int
    leaving: bool
    def __init__(self, id: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., rack: _Optional[str] = ..., alive: _Optional[bool] = ..., livenessChanged: _Optional[int] = ..., voter: _Optional[bool] = ..., controller: _Optional[bool] = ..., partitionCount: _Optional[int] = ..., leaderCount: _Optional[int] = ..., leaving: _Optional[bool] = ...) -> None: ...

class PartitionStatus(_message.Message):
    __slots__ = ("stream", "partition", "state", "leader", "candidate", "replicas", "isr", "server", "reason")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partition: int
    state: str
    leader: str
    candidate: str
    replicas: _containers.RepeatedScalarFieldContainer[str]
    isr: _containers.RepeatedScalarFieldContainer[str]
    server: str
    reason: str
    def __init__(self, stream: _Optional[str] = ..., partition: _Optional[int] = ..., state: _Optional[str] = ..., leader: _Optional[str] = ..., candidate: _Optional[str] = ..., replicas: _Optional[_Iterable[str]] = ..., isr: _Optional[_Iterable[str]] = ..., server: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ClusterStatusResponse(_message.Message):
    __slots__ = ("serverId", "controller", "term", "commitIndex", "appliedIndex", "servers", "streamCount", "partitionCount", "attention", "openFilesLimit", "fenced", "segmentFilesOpen", "segmentFilesBudget", "clusterAuth", "droppedInternal", "encryptionKeys")
    class DroppedInternalEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SERVERID_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COMMITINDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIEDINDEX_FIELD_NUMBER: _ClassVar[int]
    SERVERS_FIELD_NUMBER: _ClassVar[int]
    STREAMCOUNT_FIELD_NUMBER: _ClassVar[int]
    PARTITIONCOUNT_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_FIELD_NUMBER: _ClassVar[int]
    OPENFILESLIMIT_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    SEGMENTFILESOPEN_FIELD_NUMBER: _ClassVar[int]
    SEGMENTFILESBUDGET_FIELD_NUMBER: _ClassVar[int]
    CLUSTERAUTH_FIELD_NUMBER: _ClassVar[int]
    DROPPEDINTERNAL_FIELD_NUMBER: _ClassVar[int]
    ENCRYPTIONKEYS_FIELD_NUMBER: _ClassVar[int]
    serverId: str
    controller: str
    term: int
    commitIndex: int
    appliedIndex: int
    servers: _containers.RepeatedCompositeFieldContainer[ServerStatus]
    streamCount: int
    partitionCount: int
    attention: _containers.RepeatedCompositeFieldContainer[PartitionStatus]
    openFilesLimit: int
    fenced: _containers.RepeatedCompositeFieldContainer[PartitionStatus]
    segmentFilesOpen: int
    segmentFilesBudget: int
    clusterAuth: bool
    droppedInternal: _containers.ScalarMap[str, int]
    encryptionKeys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, serverId: _Optional[str] = ..., controller: _Optional[str] = ..., term: _Optional[int] = ..., commitIndex: _Optional[int] = ..., appliedIndex: _Optional[int] = ..., servers: _Optional[_Iterable[_Union[ServerStatus, _Mapping]]] = ..., streamCount: _Optional[int] = ..., partitionCount: _Optional[int] = ..., attention: _Optional[_Iterable[_Union[PartitionStatus, _Mapping]]] = ..., openFilesLimit: _Optional[int] = ..., fenced: _Optional[_Iterable[_Union[PartitionStatus, _Mapping]]] = ..., segmentFilesOpen: _Optional[int] = ..., segmentFilesBudget: _Optional[int] = ..., clusterAuth: _Optional[bool] = ..., droppedInternal: _Optional[_Mapping[str, int]] = ..., encryptionKeys: _Optional[_Iterable[str]] = ...) -> None: ...

class Cursor(_message.Message):
    __slots__ = ("stream", "partition", "cursorId", "offset")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    CURSORID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partition: int
    cursorId: str
    offset: int
    def __init__(self, stream: _Optional[str] = ..., partition: _Optional[int] = ..., cursorId: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...
