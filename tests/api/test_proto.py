"""The generated descriptors match the wire contract of issue 3 (Liftbridge's api.proto).

Field numbers and types are what existing Liftbridge clients put on the wire;
a change here breaks them, so every message and enum of the contract is
spelled out below and compared with the compiled descriptors.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor

from liftlog.api import api_pb2, api_pb2_grpc

FILE = api_pb2.DESCRIPTOR

_SCALARS = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "bytes",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_UINT64: "uint64",
}


def _is_repeated(field: FieldDescriptor) -> bool:
    # `label` is deprecated in newer protobuf releases in favour of `is_repeated`.
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return bool(cast(Any, field).label == FieldDescriptor.LABEL_REPEATED)  # not in the newer stubs


def _base_type(field: FieldDescriptor) -> str:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        assert field.message_type is not None
        return str(field.message_type.full_name)
    if field.type == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        return str(field.enum_type.full_name)
    return _SCALARS[field.type]


def type_of(field: FieldDescriptor) -> str:
    """A field's type spelled as in a .proto file, with full names."""
    entry = field.message_type
    if field.type == FieldDescriptor.TYPE_MESSAGE and entry is not None and entry.GetOptions().map_entry:
        return f"map<{_base_type(entry.fields_by_name['key'])},{_base_type(entry.fields_by_name['value'])}>"
    base = _base_type(field)
    return f"repeated {base}" if _is_repeated(field) else base


def fields_of(message: Descriptor) -> dict[str, tuple[int, str]]:
    return {f.name: (f.number, type_of(f)) for f in message.fields}


NI64, NI32, NB = "proto.NullableInt64", "proto.NullableInt32", "proto.NullableBool"
HEADERS = "map<string,bytes>"
TS = "proto.PartitionEventTimestamps"

# Every message of issue 3, section 2: name -> {field: (number, type)}.
MESSAGES: dict[str, dict[str, tuple[int, str]]] = {
    "NullableInt64": {"value": (1, "int64")},
    "NullableInt32": {"value": (1, "int32")},
    "NullableBool": {"value": (1, "bool")},
    "CreateStreamRequest": {
        "subject": (1, "string"),
        "name": (2, "string"),
        "group": (3, "string"),
        "replicationFactor": (4, "int32"),
        "partitions": (5, "int32"),
        "retentionMaxBytes": (6, NI64),
        "retentionMaxMessages": (7, NI64),
        "retentionMaxAge": (8, NI64),
        "cleanerInterval": (9, NI64),
        "segmentMaxBytes": (10, NI64),
        "segmentMaxAge": (11, NI64),
        "compactMaxGoroutines": (12, NI32),
        "compactEnabled": (13, NB),
        "autoPauseTime": (14, NI64),
        "autoPauseDisableIfSubscribers": (15, NB),
        "minIsr": (16, NI32),
        "optimisticConcurrencyControl": (17, NB),
        "encryption": (18, NB),
        "uncleanLeaderElection": (1000, NB),  # liftlog's extension, far from Liftbridge's numbers
        "duplicateWindow": (1001, NI64),  # liftlog's: message ids are deduplicated within this many ms
    },
    "CreateStreamResponse": {},
    "DeleteStreamRequest": {"name": (1, "string")},
    "DeleteStreamResponse": {},
    "PauseStreamRequest": {"name": (1, "string"), "partitions": (2, "repeated int32"), "resumeAll": (3, "bool")},
    "PauseStreamResponse": {},
    "SetStreamReadonlyRequest": {
        "name": (1, "string"),
        "partitions": (2, "repeated int32"),
        "readonly": (3, "bool"),
    },
    "SetStreamReadonlyResponse": {},
    "Consumer": {"groupId": (1, "string"), "groupEpoch": (2, "uint64"), "consumerId": (3, "string")},
    "SubscribeRequest": {
        "stream": (1, "string"),
        "partition": (2, "int32"),
        "startPosition": (3, "proto.StartPosition"),
        "startOffset": (4, "int64"),
        "startTimestamp": (5, "int64"),
        "readISRReplica": (6, "bool"),
        "resume": (7, "bool"),
        "stopPosition": (8, "proto.StopPosition"),
        "stopOffset": (9, "int64"),
        "stopTimestamp": (10, "int64"),
        "consumer": (11, "proto.Consumer"),
    },
    "Message": {
        "offset": (1, "int64"),
        "key": (2, "bytes"),
        "value": (3, "bytes"),
        "timestamp": (4, "int64"),
        "stream": (5, "string"),
        "partition": (6, "int32"),
        "subject": (7, "string"),
        "replySubject": (8, "string"),
        "headers": (9, HEADERS),
        "ackInbox": (10, "string"),
        "correlationId": (11, "string"),
        "ackPolicy": (12, "proto.AckPolicy"),
    },
    "PublishRequest": {
        "key": (1, "bytes"),
        "value": (2, "bytes"),
        "stream": (3, "string"),
        "partition": (4, "int32"),
        "headers": (5, HEADERS),
        "ackInbox": (6, "string"),
        "correlationId": (7, "string"),
        "ackPolicy": (8, "proto.AckPolicy"),
        "expectedOffset": (9, "int64"),
    },
    "PublishAsyncError": {"code": (1, "proto.PublishAsyncError.Code"), "message": (2, "string")},
    "PublishResponse": {
        "ack": (1, "proto.Ack"),
        "asyncError": (2, "proto.PublishAsyncError"),
        "correlationId": (3, "string"),
    },
    "PublishToSubjectRequest": {
        "key": (1, "bytes"),
        "value": (2, "bytes"),
        "subject": (3, "string"),
        "headers": (4, HEADERS),
        "ackInbox": (5, "string"),
        "correlationId": (6, "string"),
        "ackPolicy": (7, "proto.AckPolicy"),
    },
    "PublishToSubjectResponse": {"ack": (1, "proto.Ack")},
    "Ack": {
        "stream": (1, "string"),
        "partitionSubject": (2, "string"),
        "msgSubject": (3, "string"),
        "offset": (4, "int64"),
        "ackInbox": (5, "string"),
        "correlationId": (6, "string"),
        "ackPolicy": (7, "proto.AckPolicy"),
        "receptionTimestamp": (8, "int64"),
        "commitTimestamp": (9, "int64"),
        "ackError": (10, "proto.Ack.Error"),
        # liftlog's extensions (message ids); Liftbridge clients ignore them.
        "duplicate": (1000, "bool"),
        "recordOffsets": (1001, "repeated int64"),
        "duplicateRecords": (1002, "repeated int32"),
    },
    "FetchMetadataRequest": {"streams": (1, "repeated string"), "groups": (2, "repeated string")},
    "FetchMetadataResponse": {
        "brokers": (1, "repeated proto.Broker"),
        "streamMetadata": (2, "repeated proto.StreamMetadata"),
        "groupMetadata": (3, "repeated proto.ConsumerGroupMetadata"),
    },
    "Broker": {
        "id": (1, "string"),
        "host": (2, "string"),
        "port": (3, "int32"),
        "partitionCount": (4, "int32"),
        "leaderCount": (5, "int32"),
    },
    "StreamMetadata": {
        "name": (1, "string"),
        "subject": (2, "string"),
        "error": (3, "proto.StreamMetadata.Error"),
        "partitions": (4, "map<int32,proto.PartitionMetadata>"),
        "creationTimestamp": (5, "int64"),
    },
    "ConsumerGroupMetadata": {
        "groupId": (1, "string"),
        "error": (2, "proto.ConsumerGroupMetadata.Error"),
        "coordinator": (3, "string"),
        "epoch": (4, "uint64"),
    },
    "PartitionEventTimestamps": {"firstTimestamp": (1, "int64"), "latestTimestamp": (2, "int64")},
    "PartitionMetadata": {
        "id": (1, "int32"),
        "leader": (2, "string"),
        "replicas": (3, "repeated string"),
        "isr": (4, "repeated string"),
        "highWatermark": (5, "int64"),
        "newestOffset": (6, "int64"),
        "paused": (7, "bool"),
        "readonly": (8, "bool"),
        "messagesReceivedTimestamps": (9, TS),
        "pauseTimestamps": (10, TS),
        "readonlyTimestamps": (11, TS),
        "logStartOffset": (1000, NI64),  # liftlog extension: where retention starts the log
        "fenced": (1001, "string"),  # liftlog extension: why this replica refuses writes
    },
    "FetchPartitionMetadataRequest": {"stream": (1, "string"), "partition": (2, "int32")},
    "FetchPartitionMetadataResponse": {"metadata": (1, "proto.PartitionMetadata")},
    "SetCursorRequest": {
        "stream": (1, "string"),
        "partition": (2, "int32"),
        "cursorId": (3, "string"),
        "offset": (4, "int64"),
    },
    "SetCursorResponse": {},
    "FetchCursorRequest": {"stream": (1, "string"), "partition": (2, "int32"), "cursorId": (3, "string")},
    "FetchCursorResponse": {"offset": (1, "int64")},
    "JoinConsumerGroupRequest": {
        "groupId": (1, "string"),
        "consumerId": (2, "string"),
        "streams": (3, "repeated string"),
    },
    "JoinConsumerGroupResponse": {
        "coordinator": (1, "string"),
        "epoch": (2, "uint64"),
        "consumerTimeout": (3, "int64"),
        "coordinatorTimeout": (4, "int64"),
    },
    "LeaveConsumerGroupRequest": {"groupId": (1, "string"), "consumerId": (2, "string")},
    "LeaveConsumerGroupResponse": {},
    "FetchConsumerGroupAssignmentsRequest": {
        "groupId": (1, "string"),
        "consumerId": (2, "string"),
        "epoch": (3, "uint64"),
    },
    "PartitionAssignment": {"stream": (1, "string"), "partitions": (2, "repeated int32")},
    "FetchConsumerGroupAssignmentsResponse": {
        "epoch": (1, "uint64"),
        "assignments": (2, "repeated proto.PartitionAssignment"),
    },
    "ReportConsumerGroupCoordinatorRequest": {
        "groupId": (1, "string"),
        "consumerId": (2, "string"),
        "coordinator": (3, "string"),
        "epoch": (4, "uint64"),
    },
    "ReportConsumerGroupCoordinatorResponse": {},
    "CreateStreamOp": {"stream": (1, "string"), "partitions": (2, "repeated int32")},
    "DeleteStreamOp": {"stream": (1, "string")},
    "PauseStreamOp": {"stream": (1, "string"), "partitions": (2, "repeated int32"), "resumeAll": (3, "bool")},
    "ResumeStreamOp": {"stream": (1, "string"), "partitions": (2, "repeated int32")},
    "SetStreamReadonlyOp": {"stream": (1, "string"), "partitions": (2, "repeated int32"), "readonly": (3, "bool")},
    "JoinConsumerGroupOp": {
        "groupId": (1, "string"),
        "consumerId": (2, "string"),
        "streams": (3, "repeated string"),
    },
    "LeaveConsumerGroupOp": {"groupId": (1, "string"), "consumerId": (2, "string"), "expired": (3, "bool")},
    "ActivityStreamEvent": {
        "id": (1, "uint64"),
        "op": (2, "proto.ActivityStreamOp"),
        "createStreamOp": (3, "proto.CreateStreamOp"),
        "deleteStreamOp": (4, "proto.DeleteStreamOp"),
        "pauseStreamOp": (5, "proto.PauseStreamOp"),
        "resumeStreamOp": (6, "proto.ResumeStreamOp"),
        "setStreamReadonlyOp": (7, "proto.SetStreamReadonlyOp"),
        "joinConsumerGroupOp": (8, "proto.JoinConsumerGroupOp"),
        "leaveConsumerGroupOp": (9, "proto.LeaveConsumerGroupOp"),
    },
}

# Every enum: full name -> [(value name, number)].
ENUMS: dict[str, list[tuple[str, int]]] = {
    "proto.StartPosition": [("NEW_ONLY", 0), ("OFFSET", 1), ("EARLIEST", 2), ("LATEST", 3), ("TIMESTAMP", 4)],
    "proto.StopPosition": [("STOP_ON_CANCEL", 0), ("STOP_OFFSET", 1), ("STOP_LATEST", 2), ("STOP_TIMESTAMP", 3)],
    "proto.AckPolicy": [("LEADER", 0), ("ALL", 1), ("NONE", 2)],
    "proto.PublishAsyncError.Code": [
        ("UNKNOWN", 0),
        ("BAD_REQUEST", 1),
        ("NOT_FOUND", 2),
        ("INTERNAL", 3),
        ("READONLY", 4),
        ("INCORRECT_OFFSET", 5),
        ("ENCRYPTION_FAILED", 6),
        ("PERMISSION_DENIED", 7),
    ],
    "proto.Ack.Error": [("OK", 0), ("UNKNOWN", 1), ("INCORRECT_OFFSET", 2), ("TOO_LARGE", 3), ("ENCRYPTION", 4)],
    "proto.StreamMetadata.Error": [("OK", 0), ("UNKNOWN_STREAM", 1)],
    "proto.ConsumerGroupMetadata.Error": [("OK", 0), ("UNKNOWN_GROUP", 1)],
    "proto.ActivityStreamOp": [
        ("CREATE_STREAM", 0),
        ("DELETE_STREAM", 1),
        ("PAUSE_STREAM", 2),
        ("RESUME_STREAM", 3),
        ("SET_STREAM_READONLY", 4),
        ("JOIN_CONSUMER_GROUP", 5),
        ("LEAVE_CONSUMER_GROUP", 6),
    ],
}

# Every RPC: name -> (request, response, client streaming, server streaming).
METHODS: dict[str, tuple[str, str, bool, bool]] = {
    "CreateStream": ("CreateStreamRequest", "CreateStreamResponse", False, False),
    "DeleteStream": ("DeleteStreamRequest", "DeleteStreamResponse", False, False),
    "PauseStream": ("PauseStreamRequest", "PauseStreamResponse", False, False),
    "SetStreamReadonly": ("SetStreamReadonlyRequest", "SetStreamReadonlyResponse", False, False),
    "Subscribe": ("SubscribeRequest", "Message", False, True),
    "FetchMetadata": ("FetchMetadataRequest", "FetchMetadataResponse", False, False),
    "FetchPartitionMetadata": ("FetchPartitionMetadataRequest", "FetchPartitionMetadataResponse", False, False),
    "Publish": ("PublishRequest", "PublishResponse", False, False),
    "PublishAsync": ("PublishRequest", "PublishResponse", True, True),
    "PublishToSubject": ("PublishToSubjectRequest", "PublishToSubjectResponse", False, False),
    "SetCursor": ("SetCursorRequest", "SetCursorResponse", False, False),
    "FetchCursor": ("FetchCursorRequest", "FetchCursorResponse", False, False),
    "JoinConsumerGroup": ("JoinConsumerGroupRequest", "JoinConsumerGroupResponse", False, False),
    "LeaveConsumerGroup": ("LeaveConsumerGroupRequest", "LeaveConsumerGroupResponse", False, False),
    "FetchConsumerGroupAssignments": (
        "FetchConsumerGroupAssignmentsRequest",
        "FetchConsumerGroupAssignmentsResponse",
        False,
        False,
    ),
    "ReportConsumerGroupCoordinator": (
        "ReportConsumerGroupCoordinatorRequest",
        "ReportConsumerGroupCoordinatorResponse",
        False,
        False,
    ),
}


def test_file_package_and_syntax() -> None:
    assert FILE.package == "proto"
    assert FILE.name == "api.proto"
    assert FILE.GetOptions().java_package == "io.liftbridge.proto"


def test_no_message_beyond_the_contract() -> None:
    assert sorted(FILE.message_types_by_name) == sorted(MESSAGES)
    assert sorted(FILE.enum_types_by_name) == sorted(n.removeprefix("proto.") for n in ENUMS if n.count(".") == 1)


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_message_fields(name: str) -> None:
    assert fields_of(FILE.message_types_by_name[name]) == MESSAGES[name]


def test_spot_checks_from_the_issue() -> None:
    create = api_pb2.CreateStreamRequest.DESCRIPTOR.fields_by_name["minIsr"]
    assert create.message_type is not None
    assert (create.number, create.message_type.full_name) == (16, "proto.NullableInt32")
    assert api_pb2.SubscribeRequest.DESCRIPTOR.fields_by_name["consumer"].number == 11
    assert api_pb2.Message.DESCRIPTOR.fields_by_name["ackPolicy"].number == 12
    expected = api_pb2.PublishRequest.DESCRIPTOR.fields_by_name["expectedOffset"]
    assert (expected.number, expected.type) == (9, FieldDescriptor.TYPE_INT64)
    commit = api_pb2.Ack.DESCRIPTOR.fields_by_name["commitTimestamp"]
    assert (commit.number, commit.type) == (9, FieldDescriptor.TYPE_INT64)
    readonly = api_pb2.PartitionMetadata.DESCRIPTOR.fields_by_name["readonlyTimestamps"]
    assert readonly.message_type is not None
    assert (readonly.number, readonly.message_type.name) == (11, "PartitionEventTimestamps")


def _enum(full_name: str) -> EnumDescriptor:
    parts = full_name.removeprefix("proto.").split(".")
    if len(parts) == 1:
        return FILE.enum_types_by_name[parts[0]]
    return FILE.message_types_by_name[parts[0]].enum_types_by_name[parts[1]]


@pytest.mark.parametrize("full_name", sorted(ENUMS))
def test_enum_values(full_name: str) -> None:
    assert [(v.name, v.number) for v in _enum(full_name).values] == ENUMS[full_name]


def test_service_methods_and_streaming_kinds() -> None:
    service = FILE.services_by_name["API"]
    assert service.full_name == "proto.API"
    actual = {
        m.name: (m.input_type.name, m.output_type.name, m.client_streaming, m.server_streaming) for m in service.methods
    }
    assert actual == METHODS
    assert len(actual) == 16


def test_stub_method_paths() -> None:
    # The generated stub must call /proto.API/<Method> with the matching gRPC call kind.
    kinds = {
        (False, False): "unary_unary",
        (False, True): "unary_stream",
        (True, False): "stream_unary",
        (True, True): "stream_stream",
    }
    calls: dict[str, tuple[str, str]] = {}

    class RecordingChannel:
        def __getattr__(self, kind: str) -> object:
            def make(path: str, **_: object) -> str:
                calls[path] = (kind, path)
                return path

            return make

    stub = api_pb2_grpc.APIStub(RecordingChannel())
    for name, (_, _, client_streaming, server_streaming) in METHODS.items():
        path = f"/proto.API/{name}"
        assert getattr(stub, name) == path
        assert calls[path][0] == kinds[(client_streaming, server_streaming)]


def test_servicer_registers_every_method() -> None:
    registered: dict[str, grpc.RpcMethodHandler] = {}

    class RecordingServer:
        def add_generic_rpc_handlers(self, handlers: tuple[grpc.GenericRpcHandler, ...]) -> None:
            for handler in handlers:
                for name in METHODS:
                    details = type("Details", (), {"method": f"/proto.API/{name}", "invocation_metadata": ()})()
                    found = handler.service(details)
                    if found is not None:
                        registered[name] = found

        def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
            assert service == "proto.API"
            assert sorted(handlers) == sorted(METHODS)

    api_pb2_grpc.add_APIServicer_to_server(api_pb2_grpc.APIServicer(), RecordingServer())
    assert sorted(registered) == sorted(METHODS)
    for name, (_, _, client_streaming, server_streaming) in METHODS.items():
        handler = registered[name]
        assert (handler.request_streaming, handler.response_streaming) == (client_streaming, server_streaming)


def test_messages_roundtrip_on_the_wire() -> None:
    request = api_pb2.CreateStreamRequest(
        subject="orders", name="orders", partitions=3, minIsr=api_pb2.NullableInt32(value=2)
    )
    decoded = api_pb2.CreateStreamRequest.FromString(request.SerializeToString())
    assert decoded == request
    assert decoded.HasField("minIsr")
    assert not decoded.HasField("retentionMaxBytes")
    # Tag of minIsr: field 16, wire type 2 (length-delimited) -> varint 0x82 0x01.
    assert b"\x82\x01\x02\x08\x02" in request.SerializeToString()


def test_stubs_over_a_real_channel() -> None:
    """The generated servicer and stub talk over a real loopback gRPC connection."""

    class Servicer(api_pb2_grpc.APIServicer):
        async def Publish(self, request: api_pb2.PublishRequest, context: object) -> api_pb2.PublishResponse:
            return api_pb2.PublishResponse(ack=api_pb2.Ack(stream=request.stream, correlationId=request.correlationId))

        async def PublishAsync(
            self, requests: AsyncIterator[api_pb2.PublishRequest], context: object
        ) -> AsyncIterator[api_pb2.PublishResponse]:
            async for request in requests:
                yield api_pb2.PublishResponse(correlationId=request.correlationId)

    async def scenario() -> None:
        server = grpc.aio.server()
        api_pb2_grpc.add_APIServicer_to_server(Servicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = api_pb2_grpc.APIStub(channel)
                response = await stub.Publish(api_pb2.PublishRequest(stream="s", correlationId="1"), timeout=5)
                assert (response.ack.stream, response.ack.correlationId) == ("s", "1")

                async def requests() -> AsyncIterator[api_pb2.PublishRequest]:
                    for i in range(3):
                        yield api_pb2.PublishRequest(stream="s", correlationId=str(i))

                answers = [r.correlationId async for r in stub.PublishAsync(requests(), timeout=5)]
                assert answers == ["0", "1", "2"]

                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.FetchCursor(api_pb2.FetchCursorRequest(), timeout=5)
                assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        finally:
            await server.stop(None)

    asyncio.run(scenario())
