"""The pages' live feed (server-sent events): a fragment is sent when it changed, never
again as it was, so an unchanged part of a page is not redrawn under the user's pointer."""

from dispo.console import app as console_app
from dispo.libs.clock import ManualClock


class Stepping(ManualClock):
    """A clock whose sleeps pass at once, moving it on by what they asked for."""

    async def sleep(self, seconds: float) -> None:
        self.advance(seconds)


class Page:
    """A request whose page stays open for ``renders`` looks, then closes."""

    def __init__(self, renders: int) -> None:
        self.left = renders

    async def is_disconnected(self) -> bool:
        self.left -= 1
        return self.left < 0


async def test_a_fragment_is_sent_only_when_it_differs_from_the_last_one_sent(monkeypatch):
    monkeypatch.setattr(console_app, "KEEPALIVE_SECONDS", 3.0)
    looks = iter(
        [
            [("detail", "<p>FAILED</p>"), ("graph", "[1]")],
            [("detail", "<p>FAILED</p>"), ("graph", "[1]")],  # nothing changed
            [("detail", "<p>FAILED, held</p>"), ("graph", "[1]")],
            [("detail", "<p>FAILED, held</p>"), ("graph", "[1]")],
            [("detail", "<p>FAILED, held</p>"), ("graph", "[1]")],
            [("detail", "<p>FAILED, held</p>"), ("graph", "[1]")],
            [("detail", "<p>FAILED</p>"), ("graph", "[2]")],  # back as it was first: sent
        ]
    )

    async def render():
        return next(looks)

    response = console_app._stream(Page(7), render, interval=1.0, clock=Stepping())
    sent = [chunk async for chunk in response.body_iterator]
    assert sent == [
        "event: detail\ndata: <p>FAILED</p>\n\n",
        "event: graph\ndata: [1]\n\n",
        "event: detail\ndata: <p>FAILED, held</p>\n\n",
        ": nothing changed\n\n",  # three looks without a change
        "event: detail\ndata: <p>FAILED</p>\n\n",
        "event: graph\ndata: [2]\n\n",
    ]


async def test_the_keepalive_counts_the_time_the_looks_took(monkeypatch):
    """Looks that take 2 s each at a 1 s interval: a comment every 15 s of the clock (every
    fifth unchanged look), not every fifteenth look (45 s, past a proxy's idle timeout)."""
    monkeypatch.setattr(console_app, "KEEPALIVE_SECONDS", 15.0)
    clock = Stepping()

    async def render():
        clock.advance(2.0)
        return [("detail", "<p>RUNNING</p>")]

    response = console_app._stream(Page(11), render, interval=1.0, clock=clock)
    sent = [chunk async for chunk in response.body_iterator]
    assert sent == [
        "event: detail\ndata: <p>RUNNING</p>\n\n",  # 2 s
        ": nothing changed\n\n",  # five looks later: 17 s, 15 s after the last one sent
        ": nothing changed\n\n",  # 32 s
    ]
