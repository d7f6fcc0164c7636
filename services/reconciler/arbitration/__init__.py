"""Arbitration: conflicting effects of different businesses on one target.

- :mod:`.arbiter`: claims recorded at task.create, and the sweep deciding each target;
- :mod:`.compensation`: compensating cells submitted for the losers;
- :mod:`.policy`: which claim wins (pure);
- :mod:`.store`: their SQL.
"""
