"""Debian's headless Chromium, driven by Playwright's Python client: never a browser
download. Installed from the Debian packages when missing (as .ci/run does)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from playwright.async_api import Browser, async_playwright

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def ensure_chromium() -> Path:
    if not CHROMIUM.exists():
        apt = shutil.which("apt-get")
        assert apt is not None, "no /usr/bin/chromium and no apt-get to install it"
        subprocess.run([apt, "update", "-qq"], check=True, capture_output=True)
        subprocess.run([apt, "install", "-y", "-qq", "chromium"], check=True, capture_output=True)
    return CHROMIUM


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """The Debian Chromium, headless, until the block ends."""
    executable = ensure_chromium()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(executable), args=ARGS)
        try:
            yield browser
        finally:
            await browser.close()
