"""The token a command-line caller (the CLI, grpcurl's user, a script with the SDK) sends:
``--token``, else ``DISPO_TOKEN``, else the admin token ``dispo up`` wrote in its data
folder (:mod:`.bootstrap` writes it there as ``ADMIN_TOKEN_FILE``)."""

from __future__ import annotations

import os
from pathlib import Path

TOKEN_ENV = "DISPO_TOKEN"
ADMIN_TOKEN_FILE = "admin.token"


def caller_token(explicit: str | None = None, data_dir: Path | None = None) -> str:
    """The token a command-line caller sends: ``explicit`` (``--token``), else
    ``DISPO_TOKEN``, else the admin token ``dispo up`` wrote in ``data_dir``; empty if none."""
    if explicit:
        return explicit.strip()
    if os.environ.get(TOKEN_ENV, "").strip():
        return os.environ[TOKEN_ENV].strip()
    if data_dir is not None and (data_dir / ADMIN_TOKEN_FILE).exists():
        return (data_dir / ADMIN_TOKEN_FILE).read_text().strip()
    return ""
