"""The pages' live feed (server-sent events): a fragment is sent when it changed, never
again as it was, so an unchanged part of a page is not redrawn under the user's pointer."""

from dispo.console import app as console_app


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

    response = console_app._stream(Page(7), render, interval=1.0, sleep=_no_wait)
    sent = [chunk async for chunk in response.body_iterator]
    assert sent == [
        "event: detail\ndata: <p>FAILED</p>\n\n",
        "event: graph\ndata: [1]\n\n",
        "event: detail\ndata: <p>FAILED, held</p>\n\n",
        ": nothing changed\n\n",  # three looks without a change
        "event: detail\ndata: <p>FAILED</p>\n\n",
        "event: graph\ndata: [2]\n\n",
    ]


async def _no_wait(seconds: float) -> None:
    return None
