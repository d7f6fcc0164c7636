"""Alembic env of the drift records: same schema as the reconciler, own version table,
so this branch migrates independently of the reconciler's recovery migrations."""

from alembic import context

config = context.config
context.configure(
    connection=config.attributes["connection"],
    version_table_schema=config.attributes["schema"],
    version_table="alembic_version_drift",
    transactional_ddl=True,
)
with context.begin_transaction():
    context.run_migrations()
