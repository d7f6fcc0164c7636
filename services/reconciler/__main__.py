from dispo.libs.service import run_service
from dispo.reconciler import app, drift


async def setup(rt) -> None:  # noqa: ANN001 - dispo.libs.service.Runtime
    await app.setup(rt)
    await drift.install(rt)  # DriftService, its tables and the 5-minute drift check


run_service("reconciler", setup, migrations=app.MIGRATIONS)
