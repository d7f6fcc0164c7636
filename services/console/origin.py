"""Cross-site request forgery: a form sent to the console from another site's page is
refused before it reaches a route.

The sign-in cookie is ``SameSite=Strict`` already, so a browser does not attach it to a
cross-site request; this is the second, independent check (OWASP's "verifying origin with
standard headers"): every state-changing request (any method but GET, HEAD, OPTIONS) must
carry an ``Origin`` — or, failing that, a ``Referer`` — whose host and port are the
request's own ``Host``. Browsers send ``Origin`` with every POST; a request that carries
neither is refused too.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def same_origin(method: str, host: str, origin: str, referer: str) -> bool:
    """Whether a request with these headers may change state."""
    if method.upper() in SAFE_METHODS:
        return True
    source = origin if origin and origin != "null" else referer
    if not source or not host:
        return False
    parts = urlsplit(source)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


class SameOriginWrites:
    """ASGI middleware: a state-changing HTTP request from another origin gets 403."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            if not same_origin(
                scope["method"],
                headers.get("host", ""),
                headers.get("origin", ""),
                headers.get("referer", ""),
            ):
                refused = PlainTextResponse(
                    "refused: a form sent from another site (its Origin is not this console)",
                    status_code=403,
                )
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)


__all__ = ["SameOriginWrites", "same_origin"]
