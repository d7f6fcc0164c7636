"""Every Dispo entry point sets gRPC's fork mode before ``grpc`` is imported.

With gRPC's fork handlers on, a child started by a busy gRPC process could die of SIGSEGV
between fork and exec (the pool's ``openclaw`` child did). The variable is read once, when
``grpc`` loads, so what matters is that it is set by then — checked in a fresh interpreter per
entry point, the way ``python -m`` and the ``dispo`` script import them.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import importlib, os, sys

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "grpc" and "seen" not in Watch.__dict__:
            Watch.seen = os.environ.get("GRPC_ENABLE_FORK_SUPPORT")
        return None

sys.meta_path.insert(0, Watch())
importlib.import_module(sys.argv[1])
print(getattr(Watch, "seen", "grpc never imported"))
"""

ENTRY_POINTS = [
    "dispo.gateway.app",
    "dispo.executor.app",
    "dispo.reconciler.app",
    "dispo.intelligence.app",
    "dispo.pool.app",
    "dispo.tools.cli.main",
    "dispo.sdk",
]


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_fork_handlers_are_off_when_grpc_loads(module):
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, module], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "false", out.stdout + out.stderr
