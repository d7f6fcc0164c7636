from dispo.libs.db.migrations import run_env

run_env()
