"""The machine a bench runs on, and the CPU time its processes used, read from ``/proc``.

    describe()                          # cores, memory, CPU model, load average
    tree_cpu_seconds({"gateway": pid})  # user+system seconds of each process and its descendants
    busy_cpu_seconds()                  # CPU seconds the whole machine has spent busy since boot

A process's figure is its own time, the time of the children it has reaped (``cutime`` /
``cstime``: PostgreSQL's postmaster reaps each backend that ends) and the time of every
live descendant (PostgreSQL's running backends), so a difference of two samples counts a
backend that started or ended in between exactly once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK")


def describe() -> dict[str, Any]:
    return {
        "cores": os.cpu_count() or 0,
        "memory_bytes": _meminfo_total(),
        "cpu_model": _cpu_model(),
        "loadavg_before": [float(v) for v in (PROC / "loadavg").read_text().split()[:3]],
    }


def _meminfo_total() -> int:
    for line in (PROC / "meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def _cpu_model() -> str:
    for line in (PROC / "cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def process_times(pid: int) -> tuple[int, float, float] | None:
    """(parent pid, own seconds, reaped children's seconds); ``None`` once it is gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = raw[raw.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state): ppid is field 4, utime..cstime fields 14..17.
    ppid = int(fields[1])
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return ppid, (utime + stime) / TICKS, (cutime + cstime) / TICKS


def tree_cpu_seconds(roots: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) of each named process with all its descendants."""
    table: dict[int, tuple[int, float, float]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (stat := process_times(int(entry.name))) is not None:
            table[int(entry.name)] = stat
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    result = {}
    for name, root in roots.items():
        total, pending = 0.0, [root]
        while pending:
            pid = pending.pop()
            if pid in table:
                _, own, reaped = table[pid]
                total += own + reaped
                pending.extend(children.get(pid, ()))
        result[name] = total
    return result


def self_cpu_seconds() -> float:
    """This process's own CPU seconds (the load generator's)."""
    times = os.times()
    return times.user + times.system


def busy_cpu_seconds() -> float:
    """CPU seconds all cores together have spent not idle since boot (``/proc/stat``)."""
    values = [int(v) for v in (PROC / "stat").read_text().splitlines()[0].split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already in user).
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / TICKS
