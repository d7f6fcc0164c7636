"""Node.js for the Node example (examples/node): the ``node`` of the nodejs wheel, and the
example's locked dependencies installed by ``npm ci`` when they are missing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from dispo.pool.openclaw import node_binary

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples" / "node"


def npm_ci(node: Path) -> None:
    """Install the example's locked dependencies when they are missing (npm ci, the
    versions of package-lock.json)."""
    if (EXAMPLE_DIR / "node_modules" / "@grpc" / "grpc-js").exists():
        return
    npm = node.parent.parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
    done = subprocess.run(
        [str(node), str(npm), "ci", "--no-audit", "--no-fund"],
        cwd=EXAMPLE_DIR,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": f"{node.parent}{os.pathsep}{os.environ['PATH']}"},
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"npm ci failed:\n{done.stdout}{done.stderr}")


def example_node() -> Path:
    """``node``, the example's dependencies installed (OpenClawUnavailable: no Node.js)."""
    node = node_binary()
    npm_ci(node)
    return node
