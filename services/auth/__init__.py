"""The auth context: API tokens and webhook signing secrets, their tables (``auth`` schema)
and migrations, ``dispo.auth.v1.TokenService`` (served by the gateway's process) and the
credentials ``dispo up`` makes (docs/security.md, ADR-0040, ADR-0043).

- :mod:`.store`: the SQL of ``auth.tokens`` and ``auth.signing_secrets``;
- :mod:`.servicer`: ``dispo.auth.v1.TokenService`` (create, list, revoke);
- :mod:`.signing`: the keys webhook signing secrets are derived under;
- :mod:`.bootstrap`: the schema's migrations and the credentials ``dispo up`` hands over.

The check every server makes of a caller's token is the kernel's (:mod:`dispo.libs.auth`):
every service runs it, so it cannot live in one of them (ADR-0087).
"""

import dispo.libs  # noqa: F401  (sets gRPC's fork mode before grpc loads)
