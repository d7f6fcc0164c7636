"""Recovery: failed and demoted work the reconciler holds until it runs again or ends.

- :mod:`.redrive`: intake from task.fail / task.demote, the redrive schedule and the one
  redrive every path uses;
- :mod:`.settlement`: UNKNOWN nodes settled by probe, idempotent re-run or an operator;
- :mod:`.release`: demoted work released as its downstreams recover, at a bounded rate;
  downstreams paused and resumed by operators;
- :mod:`.age_limits`: parked work past its age limit ends FAILED;
- :mod:`.operations`: operators' commands on parked tasks (redrive, redrive by filter,
  abandon);
- :mod:`.policy`: the redrive, release and probe policies (pure);
- :mod:`.store`: their SQL.
"""
