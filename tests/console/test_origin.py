"""Which requests the console lets change state (dispo.console.origin)."""

import pytest
from dispo.console.origin import console_hosts, known_host, same_origin
from dispo.console.settings import ConsoleSettings

HOST = "127.0.0.1:8180"


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "get"])
def test_reads_pass_whatever_their_origin(method):
    assert same_origin(method, HOST, "https://evil.example", "")


@pytest.mark.parametrize(
    "origin, referer",
    [
        ("http://127.0.0.1:8180", ""),
        ("HTTP://127.0.0.1:8180", ""),
        ("", "http://127.0.0.1:8180/failed?x=1"),
        ("null", "http://127.0.0.1:8180/pool"),  # an opaque origin: the Referer decides
    ],
)
def test_a_form_of_the_consoles_own_pages_passes(origin, referer):
    assert same_origin("POST", HOST, origin, referer)


@pytest.mark.parametrize(
    "origin, referer, host",
    [
        ("https://evil.example", "", HOST),
        ("http://127.0.0.1:8181", "", HOST),  # another port is another origin
        ("http://127.0.0.1", "", HOST),
        ("http://127.0.0.1:8180.evil.example", "", HOST),
        ("https://evil.example", "http://127.0.0.1:8180/tasks", HOST),  # Origin wins
        ("", "", HOST),
        ("null", "", HOST),
        ("javascript://127.0.0.1:8180", "", HOST),
        ("http://127.0.0.1:8180", "", ""),
    ],
)
def test_a_form_from_anywhere_else_is_refused(origin, referer, host):
    assert not same_origin("POST", host, origin, referer)


def test_a_console_on_a_loopback_address_answers_its_loopback_names_on_its_port():
    hosts = console_hosts(ConsoleSettings(host="127.0.0.1", port=8180))
    for host in ["127.0.0.1:8180", "localhost:8180", "LocalHost:8180", "[::1]:8180"]:
        assert known_host(host, hosts), host
    for host in [
        "evil.example:8180",  # a rebound name
        "evil.example",
        "127.0.0.1",  # port 80
        "127.0.0.1:8181",
        "127.0.0.2:8180",
        "127.0.0.1:8180.evil.example",
        "user@127.0.0.1:8180",
        "127.0.0.1:8180/x",
        "127.0.0.1:99999",
        "",
    ]:
        assert not known_host(host, hosts), host


def test_a_configured_origin_is_the_one_host_answered():
    hosts = console_hosts(ConsoleSettings(host="0.0.0.0", port=8180, origin="https://ops.example"))
    assert known_host("ops.example", hosts) and known_host("OPS.example:443", hosts)
    for host in ["ops.example:8180", "127.0.0.1:8180", "localhost:8180", "ops.example.evil:443"]:
        assert not known_host(host, hosts), host
    # bound to every address with no origin: no name to check, any Host is answered
    assert console_hosts(ConsoleSettings(host="0.0.0.0", port=8180)) is None
    assert known_host("anything:1", None)


@pytest.mark.parametrize("origin", ["ops.example", "ftp://ops.example", "https://", "https://a:x"])
def test_an_origin_that_is_no_origin_is_refused(origin):
    with pytest.raises(ValueError, match="DISPO_CONSOLE_ORIGIN"):
        console_hosts(ConsoleSettings(origin=origin))
