"""The liftlog server process, in layers (each subpackage's docstring says what it may import):

- ``server`` and ``runner``: the composition root, which builds and wires everything, and the process
  around it (signals, logging, resource limits);
- ``api``: the gRPC services clients call;
- ``ops``: metrics, the HTTP endpoint, the log format;
- ``control``: the metadata Raft group and the metadata service (the controller's shell);
- ``partitions``: the data plane, every replica's log, intake, replication and acks;
- ``nats``: NATS plumbing.

The modules beside them (``config``, ``errors``, ``changes``, ``clock``, ``ratelimit``, ``throttle``,
``rlimits``, ``spin``, ``config_reference``) are shared by all and import none of the subpackages.
"""
