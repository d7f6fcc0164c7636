"""The egress check (dispo.libs.egress): what it refuses and why, that what it lets through
is where the HTTP client sends, and that a joined path keeps the base's origin."""

from __future__ import annotations

import ipaddress
import socket

import httpx
import pytest
from dispo.libs.egress import (
    AllowList,
    EgressRefused,
    Origin,
    callback_subject,
    join,
    origin_of,
)
from yarl import URL

ALLOW = AllowList.parse(
    "http://127.0.0.1:8181, https://hooks.example.com http://[::1]:8182,"
    " https://*.partner.example, https://bücher.example"
)

ALLOWED = {
    "http://127.0.0.1:8181/hook": Origin("http", "127.0.0.1", 8181),
    "http://127.0.0.1:8181": Origin("http", "127.0.0.1", 8181),
    "https://hooks.example.com/dispo?x=1": Origin("https", "hooks.example.com", 443),
    "https://HOOKS.Example.com:443/": Origin("https", "hooks.example.com", 443),
    "http://[::1]:8182/cb": Origin("http", "::1", 8182),
    "http://[0:0:0:0:0:0:0:1]:8182/cb": Origin("http", "::1", 8182),
    "https://a.b.partner.example/x": Origin("https", "a.b.partner.example", 443),
    "https://bücher.example/": Origin("https", "xn--bcher-kva.example", 443),
}

# url -> a word of the reason
REFUSED = {
    "http://127.0.0.1:50051/": "allow-list",  # an internal service's port
    "http://169.254.169.254/latest/meta-data": "allow-list",
    "http://localhost:8181/": "allow-list",  # another name for a listed address
    "https://127.0.0.1:8181/": "allow-list",  # another scheme
    "http://hooks.example.com/": "allow-list",  # https only
    "https://partner.example/": "allow-list",  # a wildcard covers names under it only
    "https://evilpartner.example/": "allow-list",
    "http://127.0.0.1:8181@169.254.169.254/": "user",
    "http://user:pw@127.0.0.1:8181/": "user",
    "http://169.254.169.254\\@127.0.0.1:8181/": "backslash",
    "http://127.1:8181/": "dotted quad",
    "http://2130706433:8181/": "dotted quad",
    "http://0x7f.0.0.1:8181/": "dotted quad",
    "http://0x7f000001:8181/": "dotted quad",
    "http://0177.0.0.1:8181/": "not a valid URL",
    "http://127.0.0.1.:8181/": "dot",
    "http://hooks.example.com./": "dot",
    "http://%31%32%37.0.0.1:8181/": "percent",
    "http://[fe80::1%25eth0]:8182/": "zone",
    "http://[::ffff:127.0.0.1]:8181/": "allow-list",  # not 127.0.0.1 by its text
    "http://127.0.0.1:8181/#x": "fragment",
    "http://127.0.0.1:99999/": "port",
    "http://127.0.0.1:8181/a b": "spaces",
    "http://127.0.0.1:8181/\r\nX-Injected: 1": "control",
    "ftp://127.0.0.1:8181/": "http",
    "file:///etc/passwd": "http",
    "gopher://127.0.0.1:8181/": "http",
    "//127.0.0.1:8181/": "http",
    "127.0.0.1:8181": "http",
    "http:///path": "host",
    "http://ⓔxample.com/": "not a valid URL",
    "http://a..b/": "host name",
}


@pytest.mark.parametrize("url, origin", ALLOWED.items())
def test_allowed_urls_go_where_the_client_sends_them(url, origin):
    checked = ALLOW.check(url)
    assert origin_of(checked) == origin
    # What httpx puts on the wire for the checked URL: the same host and port.
    request = httpx.Request("POST", checked)
    host = request.url.raw_host.decode()
    if ":" in host:  # an IPv6 literal, the same address however written
        host = ipaddress.IPv6Address(host).compressed
    port = request.url.port or {"http": 80, "https": 443}[request.url.scheme]
    assert (host, port) == (origin.host, origin.port)
    # And what the executor's action client (aiohttp) sends it to: the same.
    sent = URL(str(checked), encoded=True)
    host = sent.raw_host or ""
    if ":" in host:
        host = ipaddress.IPv6Address(host).compressed
    assert (host, sent.port) == (origin.host, origin.port)


@pytest.mark.parametrize("url, reason", REFUSED.items())
def test_refused_urls_say_why(url, reason):
    with pytest.raises(EgressRefused) as refused:
        ALLOW.check(url)
    assert reason in str(refused.value), str(refused.value)


@pytest.mark.parametrize("host", ["127.1", "2130706433", "0x7f.0.0.1", "0177.0.0.1"])
def test_the_numeric_hosts_refused_do_reach_loopback(host):
    """Why they are refused: the resolver under the HTTP client reads each as 127.0.0.1."""
    assert socket.getaddrinfo(host, 80, type=socket.SOCK_STREAM)[0][4][0] == "127.0.0.1"


@pytest.mark.parametrize(
    "spec",
    ["http://127.0.0.1:8181/path", "ftp://x", "http://u@h", "https://*.10.0.0", "http://h:0"],
)
def test_a_wrong_allow_list_entry_is_named(spec):
    with pytest.raises(ValueError, match="egress allow-list entry"):
        AllowList.parse(spec)


def test_an_empty_allow_list_allows_nothing():
    with pytest.raises(EgressRefused):
        AllowList.parse("").check("http://127.0.0.1:8181/")


@pytest.mark.parametrize(
    "subject",
    ["callbacks.shop.done", "callbacks.shop.orders.v1-done", "callbacks.shop.a_b"],
)
def test_nats_callbacks_of_the_own_business(subject):
    assert callback_subject(f"nats:{subject}", "shop") == subject


@pytest.mark.parametrize(
    "subject",
    [
        "task.create",
        "task.status.x.succeeded",
        "callbacks.other.done",
        "callbacks.shop",
        "callbacks.shop.",
        "callbacks.shop.>",
        "callbacks.shop.*",
        "callbacks.shop..x",
        "callbacks.shop.a b",
        "callbacks.shopping.done",
        "//callbacks.shop.done",
        "callback.shop.done",
    ],
)
def test_nats_callbacks_elsewhere_are_refused(subject):
    with pytest.raises(EgressRefused, match="callbacks.shop."):
        callback_subject(f"nats:{subject}", "shop")


def test_a_dotted_business_has_no_nats_callbacks():
    """Business "a.b"'s subjects would lie under business "a"'s."""
    with pytest.raises(EgressRefused, match="without '.'"):
        callback_subject("nats:callbacks.a.b.done", "a.b")


@pytest.mark.parametrize(
    "base, path, url",
    [
        ("http://127.0.0.1:8181", "/labels/c-1", "http://127.0.0.1:8181/labels/c-1"),
        ("http://127.0.0.1:8181/", "/labels/c-1", "http://127.0.0.1:8181/labels/c-1"),
        ("http://h/api", "/x?y=1", "http://h/api/x?y=1"),
        ("http://h", "//evil.example/x", "http://h//evil.example/x"),  # a path, same host
        ("http://h", "/a%2F..%2Fb", "http://h/a%2F..%2Fb"),  # encoded: not a segment
        # Encoded dots that make no dot segment: part of a name, three dots, the query.
        ("http://h/api", "/a%2eb/c", "http://h/api/a%2eb/c"),
        ("http://h/api", "/%2e%2e%2e/x", "http://h/api/%2e%2e%2e/x"),
        ("http://h/api", "/x?q=/%2e%2e/", "http://h/api/x?q=/%2e%2e/"),
    ],
)
def test_join_keeps_the_base(base, path, url):
    assert str(join(base, path)) == url


@pytest.mark.parametrize(
    "base, path",
    [
        ("http://127.0.0.1:8181", "@169.254.169.254/x"),
        ("http://127.0.0.1:8181", ":9999/x"),
        ("http://127.0.0.1", ".evil.example/x"),
        ("http://h/api", "/../admin"),
        ("http://h/api", "/x/../../admin"),
        ("http://h", "/x#frag"),
        ("http://h", "/x y"),
        ("http://h", "/x\r\nHost: evil"),
        ("http://h", ""),
    ],
)
def test_join_refuses_a_path_that_leaves_the_base(base, path):
    with pytest.raises(EgressRefused):
        join(base, path)


@pytest.mark.parametrize("path", ["/%2e%2e/admin", "/x/%2E./y", "/.%2e/admin", "/%2e/x", "/x/%2e"])
def test_join_refuses_a_dot_segment_written_percent_encoded(path):
    """httpx sends ``/api/%2e%2e/admin`` as it stands, inside the base; a WHATWG parser
    (a browser's, Rust's ``url``, a proxy's) reads ``/admin``: refused, not interpreted."""
    with pytest.raises(EgressRefused, match="dot segment written percent-encoded"):
        join("http://h/api", path)
