"""The pool service."""

import dispo.libs  # noqa: F401  (sets gRPC's fork mode before grpc loads)
