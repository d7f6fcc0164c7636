"""A downstream's HTTP health check, the one the executor's breakers and the reconciler's
release of demoted work both use: any 2xx answer from its health URL is healthy."""

from __future__ import annotations

import httpx
from dispo.libs.error_text import truncate_error


async def check_health(client: httpx.AsyncClient, url: str, timeout: float) -> tuple[bool, str]:
    """(healthy, why not). A downstream without a health URL counts as healthy."""
    if not url:
        return True, ""
    try:
        response = await client.get(url, timeout=timeout)
    except (TimeoutError, httpx.HTTPError, OSError) as error:
        return False, truncate_error(f"health check failed: {error!r}")
    if 200 <= response.status_code < 300:
        return True, ""
    return False, f"health check answered HTTP {response.status_code}"


__all__ = ["check_health"]
