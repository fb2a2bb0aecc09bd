"""The gRPC services clients call: ``proto.API`` (``api_service``), ``liftlog.Batches`` and
``liftlog.Cluster``, with the collaborators they are typed against through ``ports``: the publisher,
PublishAsync's call object, partition reads, subscriptions, cursors, consumer groups, access control and
the errors clients see.

May import: ``server.ops``, ``server.control``, ``server.partitions``, ``server.nats`` and the server's
shared modules.
"""
