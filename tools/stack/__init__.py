"""The one-machine stack: embedded PostgreSQL, nats-server, and the service processes."""
