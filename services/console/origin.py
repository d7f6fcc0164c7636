"""Which requests the console answers, and which may change state.

**The Host.** A request must name the console as browsers reach it: its ``Host`` header is
checked against the configured origin (``DISPO_CONSOLE_ORIGIN``), else against the address
it binds (a loopback address also as ``localhost`` and the other loopback names); anything
else is refused (421) before any route. A page of another site whose name resolves to the console's address (DNS
rebinding) is so refused, and the same-origin check below compares with a Host that is the
console's own. A console bound to every address with no origin configured has no name to
check: it answers any Host (docs/console.md says to configure the origin then).

**Cross-site request forgery**: a form sent to the console from another site's page is
refused before it reaches a route. The sign-in cookie is ``SameSite=Strict`` already, so a
browser does not attach it to a cross-site request; this is the second, independent check
(OWASP's "verifying origin with standard headers"): every state-changing request (any method
but GET, HEAD, OPTIONS) must carry an ``Origin`` — or, failing that, a ``Referer`` — whose
host and port are the request's own ``Host``. Browsers send ``Origin`` with every POST; a
request that carries neither is refused too.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from dispo.console.settings import ConsoleSettings
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DEFAULT_PORTS = {"http": 80, "https": 443}
# Addresses that mean "every address of this host": no name to check a Host against.
WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def same_origin(method: str, host: str, origin: str, referer: str) -> bool:
    """Whether a request with these headers may change state."""
    if method.upper() in SAFE_METHODS:
        return True
    source = origin if origin and origin != "null" else referer
    if not source or not host:
        return False
    parts = urlsplit(source)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


def _host_port(netloc: str, scheme: str) -> tuple[str, int] | None:
    """``host[:port]`` as (lower-case name, port; the scheme's when none is given); None when
    it is no host and port."""
    try:
        parts = urlsplit(f"//{netloc}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or parts.username is not None or parts.path:
        return None
    return parts.hostname.lower(), port if port is not None else DEFAULT_PORTS[scheme]


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def console_hosts(settings: ConsoleSettings) -> tuple[str, frozenset[tuple[str, int]]] | None:
    """The scheme a Host is read with and the (host, port) pairs the console answers to; None
    when it binds every address (or a port the system picks) and has no origin configured:
    any Host is answered."""
    if settings.origin:
        parts = urlsplit(settings.origin)
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS or not parts.hostname:
            raise ValueError(f"DISPO_CONSOLE_ORIGIN: scheme://host[:port], not {settings.origin!r}")
        found = _host_port(parts.netloc, scheme)
        if found is None:
            raise ValueError(f"DISPO_CONSOLE_ORIGIN: scheme://host[:port], not {settings.origin!r}")
        return scheme, frozenset({found})
    if settings.host in WILDCARDS or not settings.port:
        return None
    host = settings.host.strip("[]").lower()
    names = {host, "localhost", "127.0.0.1", "::1"} if _loopback(host) else {host}
    return "http", frozenset((name, settings.port) for name in names)


def known_host(host: str, answered: tuple[str, frozenset[tuple[str, int]]] | None) -> bool:
    """Whether a request with ``Host: host`` names the console (:func:`console_hosts`)."""
    if answered is None:
        return True
    scheme, pairs = answered
    return _host_port(host, scheme) in pairs


class SameOriginWrites:
    """ASGI middleware: a request naming another Host gets 421, a state-changing request
    from another origin 403."""

    def __init__(self, app: ASGIApp, settings: ConsoleSettings | None = None) -> None:
        self.app = app
        self.hosts = console_hosts(settings) if settings is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            host = headers.get("host", "")
            if not known_host(host, self.hosts):
                refused = PlainTextResponse(
                    "refused: the request names another host than this console's"
                    " (DISPO_CONSOLE_ORIGIN)",
                    status_code=421,
                )
                await refused(scope, receive, send)
                return
            if not same_origin(
                scope["method"], host, headers.get("origin", ""), headers.get("referer", "")
            ):
                refused = PlainTextResponse(
                    "refused: a form sent from another site (its Origin is not this console)",
                    status_code=403,
                )
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)


__all__ = ["SameOriginWrites", "console_hosts", "known_host", "same_origin"]
