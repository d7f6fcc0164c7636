"""`dispo up` bounds its processes' logs: a log over its size is copied to `<name>.log.1` (older
copies shifted, the oldest beyond the count dropped) and emptied, while the process writing
it writes on into the same file."""

import asyncio
import stat
import sys

from dispo.libs.clock import ManualClock
from dispo.libs.process import ManagedProcess, ProcessSpec
from dispo.tools.stack.logs import LogSettings, backup, log_rotation, rotate, rotate_folder
from support import eventually

# Numbered lines, as fast as the process can write them, each a write of its own.
WRITER = """
import itertools, sys
for i in itertools.count():
    sys.stdout.write(f"line {i:09d} {'x' * 60}\\n")
    sys.stdout.flush()
"""


def numbers(text: bytes) -> list[int]:
    return [int(line.split()[1]) for line in text.splitlines() if line.startswith(b"line ")]


async def test_a_running_process_log_is_rotated_by_size_and_bounded(tmp_path):
    logs = tmp_path / "logs"
    writer = ManagedProcess(
        ProcessSpec("writer", [sys.executable, "-c", WRITER], {}, None, logs / "writer.log")
    )
    writer.spawn()
    path = writer.log_path
    try:
        # rotated four times with two copies kept: .1 and .2 remain, no .3
        for _ in range(4):
            await eventually(
                lambda: path.stat().st_size > 20_000, timeout=30, wanted="the log grown"
            )
            assert rotate_folder(logs, 20_000, 2) == ["writer.log"]
        await eventually(lambda: path.stat().st_size > 1000, timeout=30, wanted="written on")
        assert writer.running()
    finally:
        writer.kill()

    assert sorted(p.name for p in logs.iterdir()) == ["writer.log", "writer.log.1", "writer.log.2"]
    older, newer, current = (
        backup(path, 2).read_bytes(),
        backup(path, 1).read_bytes(),
        path.read_bytes(),
    )
    # the process wrote on at the start of the emptied file (it appends), not at its old
    # offset past a hole of zero bytes
    assert b"\0" not in current and b"\0" not in newer
    # each copy holds what was written before the next one, in order
    assert numbers(older)[-1] < numbers(newer)[0]
    assert numbers(newer)[-1] < numbers(current)[0]
    assert numbers(current) == list(range(numbers(current)[0], numbers(current)[-1] + 1))
    # a copy is as private as the log it was made from
    assert stat.S_IMODE(backup(path, 1).stat().st_mode) == 0o600


def test_a_log_within_its_size_or_with_rotation_off_is_left_alone(tmp_path):
    path = tmp_path / "a.log"
    path.write_text("x" * 100)
    assert not rotate(path, 100, 3)  # at its bound, not over it
    assert not rotate(path, 0, 3)  # 0: never
    assert not rotate(tmp_path / "missing.log", 10, 3)
    assert path.read_text() == "x" * 100 and not backup(path, 1).exists()
    # no copy kept: only emptied
    assert rotate(path, 10, 0)
    assert path.read_text() == "" and not backup(path, 1).exists()


async def test_the_rotation_checks_on_its_clock(tmp_path):
    path = tmp_path / "service.log"
    path.write_text("x" * 500)
    clock = ManualClock()
    rotation = log_rotation(
        tmp_path, LogSettings(max_bytes=100, backups=1, check_seconds=10), clock
    )
    running = asyncio.create_task(rotation.run())
    try:
        await eventually(lambda: rotation.passes == 1, timeout=10, wanted="a first pass")
        assert backup(path, 1).read_text() == "x" * 500 and path.read_text() == ""
        path.write_text("y" * 500)
        await asyncio.sleep(0.1)
        assert path.read_text() == "y" * 500  # no check before the interval
        clock.advance(10)
        await eventually(lambda: rotation.passes == 2, timeout=10, wanted="a second pass")
        assert backup(path, 1).read_text() == "y" * 500 and path.read_text() == ""
    finally:
        rotation.stop()
        await running
