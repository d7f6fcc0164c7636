import asyncio

from dispo.libs.logging import configure_logging
from dispo.libs.settings import CommonSettings
from dispo.pool.worker.loop import main_async

settings = CommonSettings()
configure_logging(settings.log_format, settings.log_level, service="pool-worker")
asyncio.run(main_async())
