"""The partition data plane: each replica's log, intake and acks (``partition``), the stream manager that
opens, leads, follows and closes them (``streams``), replication between servers (``replicator``), the
ack router, group commit, duplicate screening and the stored-message encoding.

May import: ``server.nats`` and the server's shared modules.
"""
