"""What an operator runs beside the services: the ``dispo`` command (:mod:`.cli`), the local
stack it starts and stops (:mod:`.stack`) and the benchmarks (:mod:`.bench`).

These sit above the services and may import them; the kernel (``dispo.libs``) and the
services never import this package (docs/architecture.md, ADR-0087).
"""

import dispo.libs  # noqa: F401  (sets gRPC's fork mode before grpc loads)
