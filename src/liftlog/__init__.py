"""liftlog: a durable, replicated, Kafka-like message log for NATS."""

__version__ = "0.1.0"
