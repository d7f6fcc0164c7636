"""Completion: the facts of a finished task, each recorded on its own.

- :mod:`.facts`: *finished* (its terminal status snapshot), *notified* (its callback
  delivered) and *reconciled* (its nodes probed), with the notify and reconcile sweeps;
- :mod:`.in_flight`: callback deliveries under way, each on its own deadline;
- :mod:`.store`: their SQL.
"""
