"""Who holds a secret: the token store read through a short cache.

A token found valid is kept for ``cache_seconds`` (``DISPO_AUTH_CACHE_SECONDS``), so a
server does not read the store on every call; that is also how long a revoked token can
still pass on a server that had it cached (the gateway, which revokes, forgets it at once).
Expiry is checked on every call against the service's clock. Unknown, revoked and expired
tokens are never cached: each try reads the store again.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dispo.libs.auth import store
from dispo.libs.auth.tokens import Principal, secret_hash
from dispo.libs.clock import Clock
from dispo.libs.db import error_chain
from dispo.libs.errors import Unauthenticated, Unavailable
from sqlalchemy.ext.asyncio import AsyncEngine

# Tokens kept at most; past it the cache starts afresh (a bound, not an eviction policy).
MAX_CACHED = 10_000


def _no_token_store(error: BaseException) -> bool:
    return any(type(e).__name__ == "UndefinedTableError" for e in error_chain(error))


class TokenVerifier:
    def __init__(
        self,
        engine: AsyncEngine,
        clock: Clock,
        cache_seconds: float,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.cache_seconds = cache_seconds
        self._monotonic = monotonic
        self._cache: dict[str, tuple[float, Principal]] = {}

    async def principal(self, secret: str) -> Principal:
        """The bearer of ``secret``; :class:`Unauthenticated` if it is unknown, revoked or
        expired."""
        digest = secret_hash(secret)
        now = self._monotonic()
        hit = self._cache.get(digest)
        if hit is not None and hit[0] > now:
            found = hit[1]
        else:
            found = await self._read(digest)
            if self.cache_seconds > 0:
                if len(self._cache) >= MAX_CACHED:
                    self._cache.clear()
                self._cache[digest] = (now + self.cache_seconds, found)
        if found.expires_at is not None and found.expires_at <= self.clock.now():
            self._cache.pop(digest, None)
            raise Unauthenticated("the token has expired")
        return found

    async def _read(self, digest: str) -> Principal:
        try:
            async with self.engine.connect() as conn:
                record = await store.token_by_hash(conn, digest)
        except Exception as error:
            if _no_token_store(error):
                raise Unavailable(
                    "the token store does not exist yet (the gateway creates it when it"
                    " starts); retry"
                ) from None
            raise
        if record is None:
            raise Unauthenticated("unknown token")
        if record.revoked_at is not None:
            raise Unauthenticated("the token has been revoked")
        return record.principal()

    def forget(self, token_id: str) -> None:
        """Drop ``token_id`` from the cache (it was just revoked here)."""
        for digest, (_, principal) in list(self._cache.items()):
            if principal.token_id == token_id:
                del self._cache[digest]
