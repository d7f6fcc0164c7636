"""`dispo up` bounds its processes' logs: a log over its size is copied to `<name>.log.1` (older
copies shifted, the oldest beyond the count dropped) and emptied, while the process writing
it writes on into the same file."""

import asyncio
import stat
import sys

from dispo.libs.clock import ManualClock
from dispo.libs.process import ManagedProcess, ProcessSpec
from dispo.sdk import AsyncClient, cells
from dispo.tools.stack.logs import LogSettings, backup, log_rotation, rotate, rotate_folder
from support import eventually
from support.stack import RunningStack

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


async def test_dispo_up_rotates_its_services_logs_as_they_write(tmp_path):
    """The whole stack with tiny bounds: logs are rotated while every process writes on, each
    log keeps its name (what `tail -f` and the guides read) and at most its copies."""
    stack = RunningStack.fresh(tmp_path)
    stack.env |= {
        "DISPO_LOG_MAX_BYTES": "4000",
        "DISPO_LOG_BACKUPS": "2",
        "DISPO_LOG_CHECK_SECONDS": "0.2",
    }
    logs = stack.data_dir / "logs"
    try:
        await stack.up()
        async with AsyncClient(stack.address("gateway"), token=stack.token) as client:
            for i in range(80):  # a task is a line in each service's log
                task = await client.submit("rotated", [cells.noop()], idempotency_key=f"r{i}")
                assert (await client.wait(task.task_id, timeout=60)).status == "SUCCEEDED"
        executor = logs / "executor.log"
        await eventually(
            lambda: backup(executor, 2).exists(), timeout=30, wanted="the executor's log rotated"
        )
        # the process writes on into the same file, at its start
        async with AsyncClient(stack.address("gateway"), token=stack.token) as client:
            task = await client.submit("rotated", [cells.noop()], idempotency_key="after")
            await client.wait(task.task_id, timeout=60)
        await eventually(
            lambda: (
                task.task_id in executor.read_text()
                or task.task_id in backup(executor, 1).read_text()
            ),
            timeout=30,
            wanted="the executor's line about the last task",
        )
        assert b"\0" not in executor.read_bytes()
        names = {p.name for p in logs.iterdir()}
        assert not [n for n in names if n.endswith(".log.3")], names  # two copies at most
        await stack.down()
    finally:
        stack.kill()
