"""What every answer of the console tells the browser (OWASP's secure headers).

A Content-Security-Policy runs only the console's own scripts (``/static``; each inline
script of a page carries the nonce made for that answer, :data:`NONCE`), loads nothing from
another origin and lets no other site frame a page (``frame-ancestors 'none'``, and
``X-Frame-Options: DENY`` for older browsers); ``X-Content-Type-Options: nosniff`` keeps a
browser from reading an answer as another type than it says; ``Referrer-Policy:
same-origin`` sends the console's addresses (task ids, searches) to no other site, and keeps
the ``Referer`` the same-origin check (:mod:`.origin`) may fall back on. Styles may be
inline: the pages colour statuses in ``style`` attributes and htmx adds its own.
"""

from __future__ import annotations

import secrets

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Where a page's templates find the nonce of the answer: ``request.state.csp_nonce``.
NONCE = "csp_nonce"


def content_security_policy(nonce: str) -> str:
    return "; ".join(
        [
            "default-src 'self'",
            f"script-src 'self' 'nonce-{nonce}'",
            "style-src 'self' 'unsafe-inline'",
            "img-src 'self' data:",
            "connect-src 'self'",
            "object-src 'none'",
            "base-uri 'none'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        ]
    )


def security_headers(nonce: str) -> dict[str, str]:
    return {
        "content-security-policy": content_security_policy(nonce),
        "x-frame-options": "DENY",
        "x-content-type-options": "nosniff",
        "referrer-policy": "same-origin",
    }


class SecurityHeaders:
    """ASGI middleware: a nonce for each HTTP request (in its state) and the headers of
    :func:`security_headers` on its answer, whoever answers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        nonce = secrets.token_urlsafe(18)
        scope.setdefault("state", {})[NONCE] = nonce
        added = [(k.encode(), v.encode()) for k, v in security_headers(nonce).items()]

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                given = list(message.get("headers", []))
                names = {name.lower() for name, _ in given}
                given += [(k, v) for k, v in added if k not in names]
                message = {**message, "headers": given}
            await send(message)

        await self.app(scope, receive, with_headers)


__all__ = ["NONCE", "SecurityHeaders", "content_security_policy", "security_headers"]
