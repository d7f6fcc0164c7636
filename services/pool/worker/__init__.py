"""The pool-worker process: the local driver's crons as worker loops (``python -m dispo.pool.worker``)."""
