"""Security: authenticated server-to-server messages (``cluster_auth``)."""
