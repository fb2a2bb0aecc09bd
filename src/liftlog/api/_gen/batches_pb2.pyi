from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class PublishRequest(_message.Message):
    __slots__ = ("stream", "partition", "records", "count", "ackPolicy", "expectedOffset")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ACKPOLICY_FIELD_NUMBER: _ClassVar[int]
    EXPECTEDOFFSET_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partition: int
    records: bytes
    count: int
    ackPolicy: int
    expectedOffset: int
    def __init__(self, stream: _Optional[str] = ..., partition: _Optional[int] = ..., records: _Optional[bytes] = ..., count: _Optional[int] = ..., ackPolicy: _Optional[int] = ..., expectedOffset: _Optional[int] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("baseOffset", "count", "partitionSubject", "receptionTimestamp", "commitTimestamp", "duplicate", "recordOffsets", "duplicateRecords")
    BASEOFFSET_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    PARTITIONSUBJECT_FIELD_NUMBER: _ClassVar[int]
    RECEPTIONTIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    COMMITTIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    RECORDOFFSETS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATERECORDS_FIELD_NUMBER: _ClassVar[int]
    baseOffset: int
    count: int
    partitionSubject: str
    receptionTimestamp: int
    commitTimestamp: int
    duplicate: bool
    recordOffsets: _containers.RepeatedScalarFieldContainer[int]
    duplicateRecords: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, baseOffset: _Optional[int] = ..., count: _Optional[int] = ..., partitionSubject: _Optional[str] = ..., receptionTimestamp: _Optional[int] = ..., commitTimestamp: _Optional[int] = ..., duplicate: _Optional[bool] = ..., recordOffsets: _Optional[_Iterable[int]] = ..., duplicateRecords: _Optional[_Iterable[int]] = ...) -> None: ...

class RecordBatchEnvelope(_message.Message):
    __slots__ = ("records", "count", "ackInbox", "correlationId", "ackPolicy", "expectedOffset")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ACKINBOX_FIELD_NUMBER: _ClassVar[int]
    CORRELATIONID_FIELD_NUMBER: _ClassVar[int]
    ACKPOLICY_FIELD_NUMBER: _ClassVar[int]
    EXPECTEDOFFSET_FIELD_NUMBER: _ClassVar[int]
    records: bytes
    count: int
    ackInbox: str
    correlationId: str
    ackPolicy: int
    expectedOffset: int
    def __init__(self, records: _Optional[bytes] = ..., count: _Optional[int] = ..., ackInbox: _Optional[str] = ..., correlationId: _Optional[str] = ..., ackPolicy: _Optional[int] = ..., expectedOffset: _Optional[int] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("stream", "partition", "offset", "endOffset", "maxBytes", "maxWaitMs", "readISRReplica", "resume")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ENDOFFSET_FIELD_NUMBER: _ClassVar[int]
    MAXBYTES_FIELD_NUMBER: _ClassVar[int]
    MAXWAITMS_FIELD_NUMBER: _ClassVar[int]
    READISRREPLICA_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partition: int
    offset: int
    endOffset: int
    maxBytes: int
    maxWaitMs: int
    readISRReplica: bool
    resume: bool
    def __init__(self, stream: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., endOffset: _Optional[int] = ..., maxBytes: _Optional[int] = ..., maxWaitMs: _Optional[int] = ..., readISRReplica: _Optional[bool] = ..., resume: _Optional[bool] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("batches", "highWatermark", "logStartOffset", "nextOffset", "subject")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    HIGHWATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOGSTARTOFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXTOFFSET_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    batches: bytes
    highWatermark: int
    logStartOffset: int
    nextOffset: int
    subject: str
    def __init__(self, batches: _Optional[bytes] = ..., highWatermark: _Optional[int] = ..., logStartOffset: _Optional[int] = ..., nextOffset: _Optional[int] = ..., subject: _Optional[str] = ...) -> None: ...
