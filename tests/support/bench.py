"""`dispo bench` run as a user runs it, from a test: the installed command, its result file
read back.

path, report, out = run_bench(tmp_path / "results", "submit", "--start", "--tasks", "8")
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from support.stack import DISPO


def run_bench(results: Path, *args: str, timeout: float = 240) -> tuple[Path, dict[str, Any], str]:
    """Run ``dispo bench ARGS --results RESULTS``; it must exit 0 and write one result
    file, whose path and report are returned with what it printed (also printed here: a
    failing test shows it)."""
    done = subprocess.run(
        [DISPO, "bench", *args, "--results", str(results)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    [path] = results.iterdir()
    return path, json.loads(path.read_text()), done.stdout
