"""Settings for the whole test process, made before any test module imports grpc."""

from __future__ import annotations

import os

# grpcio is a test client (and, in one interop test, a server) here. With its fork support on, a fork while
# its threads are busy runs half its handlers ("Other threads are currently calling into gRPC, skipping fork()
# handlers"), and Spark launches its JVM by fork and exec: in one full run the child died before exec and
# no SparkSession could start (JAVA_GATEWAY_EXITED, after an epoll_wait "Bad file descriptor" from grpc's
# poller). A child that only execs needs none of grpc's fork handling.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
