"""One stack per folder: a second `dispo up` on a live stack says what runs and starts
nothing; `dispo up --detach` runs one in the background and `dispo down` stops it; a stale
stack's leftovers are stopped, but never a process that merely reuses a recorded pid."""

import json
import os
import signal
import subprocess

import pytest
from dispo.tools.stack.ownership import start_ticks
from dispo.tools.stack.stack import SERVICES, STATE_FILE, read_state
from support import eventually
from support.stack import RunningStack, alive


@pytest.fixture
def stack(tmp_path):
    running = RunningStack.fresh(tmp_path)
    yield running
    running.kill()
    # a stack left in the background dies with its dispo up
    state = read_state(running.data_dir)
    if state and alive(state["pid"]):
        os.kill(state["pid"], signal.SIGKILL)


def recorded_pids(state: dict) -> dict[str, int]:
    return {
        name: info["pid"]
        for group in ("services", "companions", "infrastructure")
        for name, info in state[group].items()
    }


async def test_detached_stack_refuses_a_second_up_and_stops_with_down(stack):
    started = stack.run(*stack.up_arguments("--detach"))
    assert started.returncode == 0, started.stdout
    state = read_state(stack.data_dir)
    owner = state["pid"]
    pids = recorded_pids(state)
    assert alive(owner) and all(alive(pid) for pid in pids.values())
    for name in SERVICES:
        assert stack.address(name) in started.stdout
    assert "dispo down" in started.stdout
    assert stack.status()[0] == 0

    # a second dispo up, in the foreground or the background: it says what runs, and how
    # to stop it, and starts nothing
    for extra in ((), ("--detach",)):
        second = stack.run(*stack.up_arguments(*extra), timeout=60)
        assert second.returncode != 0
        assert f"already running in {stack.data_dir} (dispo up, pid {owner})" in second.stdout
        for name, pid in pids.items():
            assert f"{name}" in second.stdout and f"pid {pid}" in second.stdout
        for name in SERVICES:
            assert stack.address(name) in second.stdout
        assert "dispo down" in second.stdout
        assert read_state(stack.data_dir) == state  # nothing restarted, nothing replaced
    assert "exited; restarting" not in (stack.data_dir / "logs" / "up.log").read_text()

    stopped = stack.run("down")
    assert stopped.returncode == 0, stopped.stdout
    for name, pid in pids.items():
        assert f"{name}" in stopped.stdout and f"pid {pid}" in stopped.stdout
    assert not alive(owner) and not any(alive(pid) for pid in pids.values())
    assert read_state(stack.data_dir) is None
    code, report = stack.status()
    assert code == 3 and {info["status"] for info in report.values()} == {"UNREACHABLE"}

    again = stack.run("down")
    assert again.returncode == 0 and "no stack is running" in again.stdout


async def test_down_on_a_stale_stack_stops_only_the_recorded_processes(stack):
    # two processes a killed dispo up recorded: one still the very process, the other's
    # pid now belongs to another process (its recorded start time differs)
    leftover = subprocess.Popen(["sleep", "600"])
    stranger = subprocess.Popen(["sleep", "600"])
    try:
        stack.data_dir.mkdir(parents=True)
        state = {
            "pid": 2**22 + 1,  # beyond any pid: that dispo up is gone
            "ready": True,
            "database_url": "",
            "nats_url": "",
            "services": {
                "gateway": {
                    "address": stack.address("gateway"),
                    "pid": leftover.pid,
                    "started": start_ticks(leftover.pid),
                },
                "executor": {
                    "address": stack.address("executor"),
                    "pid": stranger.pid,
                    "started": start_ticks(stranger.pid) - 1,
                },
            },
            "companions": {},
            "infrastructure": {},
        }
        (stack.data_dir / STATE_FILE).write_text(json.dumps(state))

        stopped = stack.run("down", timeout=60)

        assert stopped.returncode == 0, stopped.stdout
        assert "lost its dispo up" in stopped.stdout
        assert f"gateway          pid {leftover.pid}" in stopped.stdout
        assert "executor" not in stopped.stdout
        await eventually(lambda: leftover.poll() is not None, wanted="the leftover stopped")
        assert leftover.returncode == -signal.SIGTERM
        assert stranger.poll() is None
        assert read_state(stack.data_dir) is None
    finally:
        for process in (leftover, stranger):
            process.kill()
            process.wait()


async def test_down_kills_a_dispo_up_that_does_not_stop_and_nothing_survives(stack):
    started = stack.run(*stack.up_arguments("--detach"))
    assert started.returncode == 0, started.stdout
    state = read_state(stack.data_dir)
    owner, pids = state["pid"], recorded_pids(state)
    os.kill(owner, signal.SIGSTOP)  # hung: the SIGTERM of dispo down is never handled

    stopped = stack.run("down", "--timeout", "1")

    assert stopped.returncode == 1, stopped.stdout
    assert "did not stop within 1 s; killing it" in stopped.stdout
    assert "still running" not in stopped.stdout
    assert not alive(owner) and not any(alive(pid) for pid in pids.values())
