"""Liftbridge-compatible client API: protobuf messages, gRPC stubs, envelopes.

`api_pb2` holds the messages and enums of ``proto/api.proto`` and
`api_pb2_grpc` the ``proto.API`` service stubs and servicer base; `cluster_pb2` and
`cluster_pb2_grpc` are liftlog's own ``liftlog.Cluster`` admin service, `batches_pb2` and
`batches_pb2_grpc` its ``liftlog.Batches`` batched data path. All are
generated (see ``proto/generate.sh``) and committed. `liftlog.api.envelope`
encodes and decodes the envelopes that carry messages and acks over NATS.
"""

from liftlog.api._gen import api_pb2, api_pb2_grpc, batches_pb2, batches_pb2_grpc, cluster_pb2, cluster_pb2_grpc

__all__ = ["api_pb2", "api_pb2_grpc", "batches_pb2", "batches_pb2_grpc", "cluster_pb2", "cluster_pb2_grpc"]
