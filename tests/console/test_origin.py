"""Which requests the console lets change state (dispo.console.origin)."""

import pytest
from dispo.console.origin import same_origin

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
