"""The metadata shell: the Raft group over NATS (``metadata_raft``), the metadata service that proposes
changes and, on the controller, carries out its cores' decisions (``cluster``), failover and the activity
stream.

May import: ``server.partitions``, ``server.nats`` and the server's shared modules.
"""
