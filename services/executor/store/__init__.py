"""Every SQL statement of the executor, one module per table group, each statement named
entity first and guard second (``nodes_set_status_if_many``) and list-shaped: a single
task is a list of one (River's ``JobSetStateIfRunningMany``).

- :mod:`.task_runs`: the ``task_runs`` rows: recording, leases, status, cancel flag;
- :mod:`.node_runs`: the ``node_runs`` rows: claims, guarded moves, redrives;
- :mod:`.status_events`: a task's snapshot and its events in the outbox, with the task
  rows a pass's end writes (one statement, ADR-0058);
- :mod:`.worker_runs`: worker runs offered, taken, completed (ADR-0099);
- :mod:`.queues`: when each worker was last seen on each queue, what each queue has
  (ADR-0101);
- :mod:`.signals`: the signals a task was sent, kept until a waiting node takes one;
- :mod:`.retention`: finished tasks past their business's retention, deleted with their
  nodes and worker runs (ADR-0105);
- :mod:`.pauses`: the paused businesses (ADR-0109);
- :mod:`.rows`: what a row reads as.

The rules: every move is checked against ``NODE_TRANSITIONS`` / ``TASK_TRANSITIONS``
before anything is written (an undeclared move raises ``IllegalTransition`` and nothing is
written), every ``UPDATE`` carries its expected state (and, for a running node, its owner)
in its ``WHERE`` clause, and ``RETURNING`` says which rows moved: a row missing from it is
a race another writer won, reported to the caller. Rows are locked in ``task_id`` order,
so two executors locking overlapping batches queue behind each other instead of
deadlocking. The rows travel as arrays through ``unnest``: one statement per kind of write
whatever the number of tasks. Everything runs on the driver port
(:mod:`dispo.libs.db.driver`) in the caller's transaction.
"""
