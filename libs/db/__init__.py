"""PostgreSQL access: one async engine per service, confined to the service's own schema."""

from dispo.libs.db.down import database_unreachable, error_chain, login_refused
from dispo.libs.db.engine import create_engine, normalize_url
from dispo.libs.db.migrations import migrate

__all__ = [
    "create_engine",
    "database_unreachable",
    "error_chain",
    "login_refused",
    "normalize_url",
    "migrate",
]
