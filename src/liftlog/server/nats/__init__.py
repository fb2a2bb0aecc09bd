"""NATS plumbing: the client type the server depends on, the embedded ``nats-server`` it can run, and the
authenticated connection that keeps clients off the cluster's own subjects.

May import: the server's shared modules (``server.changes``, ``server.ratelimit``, ...), never another
subpackage.
"""
