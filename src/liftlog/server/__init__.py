"""The liftlog server process: composition root, configuration, embedded NATS and NATS ingestion."""
