"""Where Dispo sends on a caller's behalf: the egress allow-list, one check for every service.

A caller names two kinds of address: a task's ``callback_url`` (the reconciler POSTs the
completion notification there, or publishes it on NATS) and an evaluation's ``target_url``
(the pool's crons call it). Both are checked against one allow-list of origins — scheme,
host and port, ``DISPO_EGRESS_ALLOW`` — when they are submitted (gateway, pool) and, for
callbacks, again when the notification is sent (reconciler), since the list may have changed
in between. A ``nats:`` callback may only name a subject of the task's own business,
``callbacks.<business>.<token>…``. Calls to downstreams and evaluation targets are built
with :func:`join`, which keeps the base URL's origin and path whatever the appended path
holds.

Parsing is the sending client's own (:class:`httpx.URL`), and the checked ``httpx.URL`` is
what is sent: the text is never read a second time, by another parser. What a resolver would
read differently from how it looks is refused rather than interpreted (each case is in
``tests/platform/test_egress.py``):

- userinfo (``http://allowed@evil``, ``http://evil\\@allowed``): never sent, always refused;
- numeric hosts other than a canonical dotted quad: ``127.1``, ``2130706433``,
  ``0x7f.0.0.1`` and ``0177.0.0.1`` all reach 127.0.0.1 through ``getaddrinfo``;
- a trailing dot, percent-encoding or an empty label in a host name, an IPv6 zone id;
- a port outside 1..65535, a fragment, spaces, control characters and backslashes;
- in a joined path, a ``.`` or ``..`` segment written percent-encoded (``%2e%2e``,
  ``.%2E``): httpx sends it as it stands, a WHATWG parser (a browser's, Rust's ``url``) reads
  it as the dot segment and climbs.

Host names are compared in lower case in their IDNA (punycode) form, as httpx sends them;
IPv6 literals in their compressed form; a URL without a port has its scheme's (80, 443).
An entry ``https://*.example.com`` allows every host under ``example.com`` (not the name
itself) on port 443. A host name is trusted as DNS resolves it: list addresses to pin them.

    allow = AllowList.parse("http://127.0.0.1:8181, https://hooks.example.com")
    url = allow.check("https://hooks.example.com/dispo")   # the httpx.URL to send to
    allow.check("http://169.254.169.254/")                 # EgressRefused
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from functools import lru_cache

import httpx

SCHEMES = {"http": 80, "https": 443}
NATS_SCHEME = "nats:"
# The subjects of nats: callbacks (the CALLBACKS stream holds ``callbacks.>``).
CALLBACK_PREFIX = "callbacks."

_UNSAFE = re.compile(r"[\x00-\x20\x7f\\]")  # whitespace, control characters, backslash
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_HEX_LABEL = re.compile(r"0x[0-9a-f]*")
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")
_MAX_SUBJECT_TOKENS = 16


class EgressRefused(ValueError):
    """An address Dispo does not send to; the message says why (a field violation's text)."""


@dataclass(frozen=True)
class Origin:
    """Where a request goes: scheme, host (normalised) and port (never implied)."""

    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def parse_url(text: str) -> httpx.URL:
    """``text`` as the HTTP client reads it; EgressRefused for what it cannot read or for
    characters that different readers take differently (spaces, controls, backslash)."""
    if _UNSAFE.search(text):
        raise EgressRefused("must not contain spaces, control characters or backslashes")
    try:
        return httpx.URL(text)
    except (httpx.InvalidURL, ValueError, TypeError) as error:
        raise EgressRefused(f"not a valid URL: {error}") from None


def origin_of(url: httpx.URL) -> Origin:
    """The origin ``url`` is sent to; EgressRefused for an address that is not plainly one."""
    scheme = url.scheme
    if scheme not in SCHEMES:
        raise EgressRefused("must be an http:// or https:// URL")
    if url.userinfo:
        raise EgressRefused("must not carry a user name or password (user@host)")
    if url.fragment:
        raise EgressRefused("must not have a fragment (#...)")
    port = SCHEMES[scheme] if url.port is None else url.port
    if not 1 <= port <= 65535:
        raise EgressRefused("the port must be in 1..65535")
    return Origin(scheme, _host(url.raw_host.decode("ascii")), port)


def _host(raw: str) -> str:
    """``raw`` (httpx's encoded host: lower case, IDNA, IPv6 without brackets) normalised,
    or EgressRefused when a resolver could read it as another address than it shows."""
    if not raw:
        raise EgressRefused("must name a host")
    if "%" in raw:
        raise EgressRefused("the host must not be percent-encoded or carry an IPv6 zone id")
    if ":" in raw:
        try:
            return ipaddress.IPv6Address(raw).compressed
        except ValueError:
            raise EgressRefused(f"{raw!r} is not an IPv6 address") from None
    if raw.endswith("."):
        raise EgressRefused("the host must not end with a dot")
    labels = raw.split(".")
    if len(raw) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise EgressRefused(f"{raw!r} is not a host name")
    last = labels[-1]
    if last.isdigit() or _HEX_LABEL.fullmatch(last):
        # A resolver reads 127.1, 2130706433 and 0x7f.0.0.1 as 127.0.0.1 (inet_aton).
        try:
            address = ipaddress.IPv4Address(raw)
        except ValueError:
            address = None
        if address is None or str(address) != raw:
            raise EgressRefused(
                f"{raw!r}: a numeric host must be a dotted quad in decimal, such as 192.0.2.1"
            )
    return raw


@dataclass(frozen=True)
class AllowList:
    """The origins Dispo may send to on a caller's behalf (``DISPO_EGRESS_ALLOW``)."""

    origins: frozenset[Origin] = frozenset()
    # ``scheme://*.example.com:port``: (scheme, ".example.com", port)
    domains: frozenset[tuple[str, str, int]] = frozenset()

    @classmethod
    def parse(cls, spec: str) -> AllowList:
        """Entries ``scheme://host[:port]`` (or ``scheme://*.domain[:port]``), separated by
        commas or spaces; ValueError naming a wrong one."""
        origins: set[Origin] = set()
        domains: set[tuple[str, str, int]] = set()
        for entry in re.split(r"[,\s]+", spec.strip()):
            if not entry:
                continue
            wildcard = "://*." in entry
            try:
                url = parse_url(entry.replace("://*.", "://", 1) if wildcard else entry)
                if url.raw_path not in (b"", b"/") or url.query:
                    raise EgressRefused("an entry is scheme://host[:port], without a path")
                origin = origin_of(url)
                if wildcard and (":" in origin.host or origin.host.replace(".", "").isdigit()):
                    raise EgressRefused("a wildcard stands for host names, not addresses")
            except EgressRefused as error:
                raise ValueError(f"egress allow-list entry {entry!r}: {error}") from None
            if wildcard:
                domains.add((origin.scheme, "." + origin.host, origin.port))
            else:
                origins.add(origin)
        return cls(frozenset(origins), frozenset(domains))

    def allows(self, origin: Origin) -> bool:
        if origin in self.origins:
            return True
        return any(
            scheme == origin.scheme and port == origin.port and origin.host.endswith(domain)
            for scheme, domain, port in self.domains
        )

    def check(self, text: str) -> httpx.URL:
        """The URL to send to, when ``text`` is one and its origin is on the list; else
        EgressRefused saying why."""
        url = parse_url(text)
        origin = origin_of(url)
        if not self.allows(origin):
            raise EgressRefused(f"{origin} is not on the egress allow-list (DISPO_EGRESS_ALLOW)")
        return url

    def __str__(self) -> str:
        entries = [str(o) for o in self.origins]
        entries += [f"{s}://*{d}:{p}" for s, d, p in self.domains]
        return ", ".join(sorted(entries)) or "(nothing)"


def callback_subject(callback_url: str, business: str) -> str:
    """The subject of a ``nats:`` callback: one under ``callbacks.<business>.`` of the task's
    own business, each token letters, digits, ``_`` or ``-`` (no wildcards); else
    EgressRefused."""
    if "." in business:
        raise EgressRefused(
            "a nats: callback needs a business name without '.': its subjects would overlap"
            " another business's"
        )
    subject = callback_url.removeprefix(NATS_SCHEME)
    prefix = f"{CALLBACK_PREFIX}{business}."
    rest = subject.removeprefix(prefix).split(".")
    if (
        not subject.startswith(prefix)
        or len(rest) > _MAX_SUBJECT_TOKENS
        or not all(_TOKEN.fullmatch(token) for token in rest)
    ):
        raise EgressRefused(
            f"a nats: callback must be a subject under {prefix}> (the task's own business):"
            " tokens of letters, digits, '_' or '-'"
        )
    return subject


def check_callback(callback_url: str, business: str, allow: AllowList) -> httpx.URL | str:
    """Where a task's completion notification goes: the URL to POST to (on the allow-list),
    or the NATS subject (the task's business's); EgressRefused otherwise. The gateway calls
    it at Submit, the reconciler again before each delivery."""
    if callback_url.startswith(NATS_SCHEME):
        return callback_subject(callback_url, business)
    return allow.check(callback_url)


def _encoded_dot_segment(path: str) -> bool:
    """Whether a segment of ``path`` is "." or ".." once its percent-encoded dots are read
    as dots (and has one: a plain one is httpx's to resolve)."""
    for segment in path.lower().split("/"):
        if "%2e" in segment and segment.replace("%2e", ".") in (".", ".."):
            return True
    return False


@lru_cache(maxsize=256)
def _base(base_url: str) -> tuple[str, Origin, str]:
    """A base URL without its trailing slashes, its origin and its path prefix."""
    trimmed = base_url.rstrip("/")
    url = parse_url(trimmed)
    return trimmed, origin_of(url), url.raw_path.decode("ascii").rstrip("/") + "/"


def join(base_url: str, path: str) -> httpx.URL:
    """``base_url`` + ``path``: the URL of a downstream call or an evaluation's test case.

    ``path`` (a catalogue action's path with its payload values filled in, a test case's
    path) must start with ``/`` and may carry a query; the result keeps the base's origin and
    path prefix (``..`` segments cannot climb out of it), else EgressRefused. Payload values
    are percent-encoded when the gateway fills them in, so this holds for what the
    catalogue wrote; a path that still breaks it came from somewhere else."""
    if not path.startswith("/") or "#" in path:
        raise EgressRefused(f"the path {path!r} must start with '/' and have no fragment")
    if _encoded_dot_segment(path.partition("?")[0]):
        raise EgressRefused(f"the path {path!r} has a dot segment written percent-encoded")
    trimmed, origin, prefix = _base(base_url)
    url = parse_url(trimmed + path)
    if origin_of(url) != origin or not url.raw_path.decode("ascii").startswith(prefix):
        raise EgressRefused(f"the path {path!r} leads out of {base_url}")
    return url


__all__ = [
    "CALLBACK_PREFIX",
    "NATS_SCHEME",
    "AllowList",
    "EgressRefused",
    "Origin",
    "callback_subject",
    "check_callback",
    "join",
    "origin_of",
    "parse_url",
]
