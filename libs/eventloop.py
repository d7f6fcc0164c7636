"""The event loop a Dispo process runs on: uvloop's (less work per socket read and write and
per callback than asyncio's, which every message and statement pays), or the standard one
when asked or absent. Imports nothing else of Dispo, so a small process (the demo
downstream) takes it without the services' machinery."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def loop_factory(uvloop: bool = True) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's ``new_event_loop``, or None (asyncio's own) when not ``uvloop`` or not
    installed (a platform without it): what :class:`asyncio.Runner` takes."""
    if not uvloop:
        return None
    try:
        import uvloop as _uvloop
    except ImportError:
        return None
    return _uvloop.new_event_loop


def new_event_loop(uvloop: bool = True) -> asyncio.AbstractEventLoop:
    """A new loop from :func:`loop_factory`, for an API that takes a loop rather than a
    factory (aiohttp's ``run_app``)."""
    return (loop_factory(uvloop) or asyncio.new_event_loop)()
