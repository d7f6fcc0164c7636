"""Who holds a secret: the token store read through a short cache, and refusals made cheaper
than a read.

A token found valid is kept for ``cache_seconds`` (``DISPO_AUTH_CACHE_SECONDS``), so a
server does not read the store on every call; that is also how long a revoked token can
still pass on a server that had it cached (the gateway, which revokes, forgets it at once).
Expiry is checked on every call against the service's clock.

A refusal must cost less than a request, or a flood of wrong tokens slows every caller
(ADR-0078). So a token the store does not hold, holds revoked, or that has expired, is
remembered as refused for ``refused_seconds`` (``DISPO_AUTH_REFUSED_CACHE_SECONDS``, on the
service's clock; at most :data:`MAX_REFUSED` of them): its next tries are refused with no
read. And each read of the store costs the calling peer (its address) one token of ``failures``
(:class:`~dispo.libs.ratelimit.TokenBuckets`, ``DISPO_AUTH_FAILURES_PER_SECOND`` and
``DISPO_AUTH_FAILURE_BURST``), given back when the token proves valid: a peer whose reads keep
failing is refused with ``RESOURCE_EXHAUSTED`` (and when to retry) before the database, while
the tokens already cached still pass. The gateway forgets a refusal when it creates a token
with that secret.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta

from dispo.libs.auth.lookup import token_by_hash
from dispo.libs.auth.tokens import Principal, secret_hash
from dispo.libs.clock import Clock
from dispo.libs.db import error_chain
from dispo.libs.db.driver import Database
from dispo.libs.errors import ResourceExhausted, Unauthenticated, Unavailable
from dispo.libs.ratelimit import TokenBuckets

# Tokens kept at most; past it the cache starts afresh (a bound, not an eviction policy).
MAX_CACHED = 10_000
# Refused tokens remembered at most; past it the expired ones go, then all of them.
MAX_REFUSED = 10_000
EXPIRED = "the token has expired"


def _no_token_store(error: BaseException) -> bool:
    return any(type(e).__name__ == "UndefinedTableError" for e in error_chain(error))


class TokenVerifier:
    def __init__(
        self,
        db: Database,
        clock: Clock,
        cache_seconds: float,
        *,
        refused_seconds: float = 0.0,
        failures: TokenBuckets | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.clock = clock
        self.cache_seconds = cache_seconds
        self.refused_seconds = refused_seconds
        self.failures = failures
        self._monotonic = monotonic
        self._cache: dict[str, tuple[float, Principal]] = {}
        # digest -> (until when it is refused without a read, the refusal's message)
        self._refused: dict[str, tuple[datetime, str]] = {}
        # Reads of the token store so far (what a refusal is meant to save).
        self.store_reads = 0

    async def principal(self, secret: str, peer: str = "") -> Principal:
        """The bearer of ``secret``; :class:`Unauthenticated` if it is unknown, revoked or
        expired; :class:`ResourceExhausted` when it would take a read of the store and
        ``peer`` (the caller's address) has spent its failures."""
        digest = secret_hash(secret)
        now = self._monotonic()
        hit = self._cache.get(digest)
        if hit is not None and hit[0] > now:
            found = hit[1]
        else:
            found = await self._read_admitted(digest, peer)
            if self.cache_seconds > 0:
                if len(self._cache) >= MAX_CACHED:
                    self._cache.clear()
                self._cache[digest] = (now + self.cache_seconds, found)
        if found.expires_at is not None and found.expires_at <= self.clock.now():
            self._cache.pop(digest, None)
            self._remember_refused(digest, EXPIRED)  # for good: an expiry is never moved
            raise Unauthenticated(EXPIRED)
        return found

    async def _read_admitted(self, digest: str, peer: str) -> Principal:
        """The bearer of ``digest`` from the store, unless it was refused lately or ``peer``
        may not make another read now."""
        refused = self._refused.get(digest)
        if refused is not None:
            if refused[0] > self.clock.now():
                raise Unauthenticated(refused[1])
            del self._refused[digest]
        if self.failures is not None:
            wait = self.failures.take(peer)
            if wait > 0:
                raise ResourceExhausted(
                    f"too many failed authentications from {peer or 'this caller'}: retry in"
                    f" {wait:.1f} s",
                    retry_after=wait,
                )
        try:
            found = await self._read(digest)
        except Unauthenticated as refusal:
            self._remember_refused(digest, refusal.message)
            raise
        except BaseException:
            self._give_back(peer)  # the store said nothing about the token
            raise
        self._give_back(peer)
        return found

    def _give_back(self, peer: str) -> None:
        if self.failures is not None:
            self.failures.give_back(peer, 1)

    def _remember_refused(self, digest: str, message: str) -> None:
        if self.refused_seconds <= 0:
            return
        now = self.clock.now()
        if len(self._refused) >= MAX_REFUSED:
            for known, (until, _) in list(self._refused.items()):
                if until <= now:
                    del self._refused[known]
            if len(self._refused) >= MAX_REFUSED:
                self._refused.clear()
        self._refused[digest] = (now + timedelta(seconds=self.refused_seconds), message)

    def forget_refused(self, secret: str) -> None:
        """Stop refusing ``secret`` without a read (a token with it was just created here)."""
        self._refused.pop(secret_hash(secret), None)

    async def _read(self, digest: str) -> Principal:
        self.store_reads += 1
        try:
            async with self.db.connection() as conn:
                record = await token_by_hash(conn, digest)
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
