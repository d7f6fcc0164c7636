"""The web console: pages over the services' gRPC APIs (docs/console.md)."""

import dispo.libs  # noqa: F401  (sets gRPC's fork mode before grpc loads)
