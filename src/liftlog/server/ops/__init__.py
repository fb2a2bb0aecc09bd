"""Operations: Prometheus metrics (a narrow view of the partitions, replicator and metadata, not the
``Server``), the HTTP endpoint for /metrics and health checks, the log format, and TLS files that reload.

May import: ``server.control``, ``server.partitions``, ``server.nats`` and the server's shared modules.
"""
