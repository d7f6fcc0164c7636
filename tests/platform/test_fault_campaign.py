"""`dispo bench faults`: its figures from facts, and a bounded campaign end to end — real
processes SIGKILLed, nats-server killed, PostgreSQL stopped immediately, each restarted by
the stack, under a steady load against a downstream that counts every effect without
deduplicating. The campaign must lose nothing, leave nothing stuck and perform no
non-idempotent effect twice. No test looks at how long anything took."""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from dispo.tools.bench.fault_report import (
    NodeFacts,
    PhaseFacts,
    TaskFacts,
    build_campaign,
    campaign_result_name,
    exit_code,
    fault_row,
    render_campaign,
    table,
)
from dispo.tools.bench.faults import FAULTS

pytestmark = pytest.mark.long_file

DISPO = str(Path(sys.executable).parent / "dispo")

ONCE_DONE = NodeFacts("SUCCEEDED", idempotent=False, effects=1)
AGAIN_DONE = NodeFacts("SUCCEEDED", idempotent=True, effects=2)  # repeats are harmless


def phase() -> PhaseFacts:
    return PhaseFacts(
        fault="gateway SIGKILL",
        offered=6,
        accepted={"t1": 100.0, "t2": 101.0, "t3": 103.0, "t4": 104.0},
        refused=Counter({"UNAVAILABLE": 2}),
        retried=1,
        tasks=[
            TaskFacts("t1", "SUCCEEDED", 108.0, (ONCE_DONE, AGAIN_DONE), "k1"),
            TaskFacts(
                "t2", "SUCCEEDED", 105.0, (NodeFacts("SUCCEEDED", False, 3, "t2/a", 3),), "k2"
            ),
            TaskFacts("t3", "RUNNING", 110.0, (NodeFacts("UNKNOWN", False, 1),), "k3"),
            TaskFacts("t4", None),  # accepted, then unknown to the gateway
            # recorded by a Submit whose answer was lost, under a key that already had a task
            TaskFacts("t5", "SUCCEEDED", 109.0, (NodeFacts("SUCCEEDED", False, 0),), "k1"),
        ],
        fault_at=102.0,
    )


def test_a_phase_counts_what_was_lost_stuck_unknown_and_done_twice():
    row = fault_row(phase())
    assert (row["offered"], row["accepted"], row["refused"]) == (6, 4, {"UNAVAILABLE": 2})
    assert (row["lost"], row["lost_tasks"]) == (1, ["t4"])
    assert (row["stuck"], row["stuck_tasks"]) == (1, ["t3"])
    assert row["unknown_left"] == 1
    # t2's non-idempotent node ran three times; t1's idempotent repeat does not count.
    assert (row["duplicate_effects"], row["extra_effects"]) == (1, 2)
    assert row["duplicates"] == [{"key": "t2/a", "effects": 3, "attempts": 3, "last_error": ""}]
    assert row["second_tasks"] == 1  # t5 under t1's key
    assert row["succeeded_without_effect"] == 1
    assert row["retried_submits"] == 1
    # Accepted before the fault: t1 and t2, terminal at 108 and 105.
    assert (row["accepted_before_fault"], row["recover_seconds"]) == (2, 6.0)
    assert row["statuses"] == {"RUNNING": 1, "SUCCEEDED": 3}


def test_recovery_is_unknown_while_a_task_from_before_the_fault_is_unfinished():
    facts = phase()
    facts.fault_at = 103.5  # t3, still RUNNING, was accepted before it
    assert fault_row(facts)["recover_seconds"] is None
    facts.fault_at = 99.0  # nothing accepted before it
    assert fault_row(facts)["recover_seconds"] is None


def campaign(rows: list[dict]) -> dict:
    return build_campaign(
        created="2026-12-01T14:00:00+00:00",
        machine={"cores": 2, "memory_bytes": 2**30, "cpu_model": "x", "loadavg_before": [1.0]},
        config={"tasks_per_fault": 6, "executors": 2},
        rows=rows,
        machine_busy=(30.0, 20.0),
    )


def test_the_campaign_fails_on_anything_lost_stuck_or_done_twice():
    clean = PhaseFacts(
        "reconciler SIGKILL",
        1,
        accepted={"t1": 1.0},
        tasks=[TaskFacts("t1", "SUCCEEDED", 3.0, (ONCE_DONE,), "k1")],
        fault_at=2.0,
    )
    passed = campaign([fault_row(clean)])
    assert passed["verdict"] == {"lost": 0, "stuck": 0, "duplicate_effects": 0, "second_tasks": 0}
    assert exit_code(passed) == 0
    assert "passed" in render_campaign(passed)[-1]
    failed = campaign([fault_row(clean), fault_row(phase())])
    assert failed["verdict"] == {"lost": 1, "stuck": 1, "duplicate_effects": 1, "second_tasks": 1}
    assert exit_code(failed) == 1
    assert "FAILED" in render_campaign(failed)[-1]
    assert failed["machine"]["during_run"]["busy_cores"] == 1.5
    header, rule, *rows = table(failed)
    assert header.count("|") == rule.count("|") == rows[0].count("|")
    assert rows[1] == "| gateway SIGKILL | 4 | 2 | 1 | 1 | 1 | 1 | 6.0 |"
    assert campaign_result_name(failed) == "20261201T140000-faults-6x2-e2.json"
    json.dumps(failed, allow_nan=False)


def test_bounded_campaign_loses_nothing_and_repeats_no_effect(tmp_path):
    results = tmp_path / "results"
    done = subprocess.run(
        [
            DISPO,
            "bench",
            "faults",
            "--faults",
            ",".join(FAULTS),
            "--tasks-per-fault",
            "12",
            "--rate",
            "8",
            # Generous, so that a busy machine does not turn a slow call into a timeout.
            "--call-timeout-ms",
            "5000",
            "--results",
            str(results),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(done.stdout, done.stderr)  # shown when an assertion below fails
    [path] = results.iterdir()
    report = json.loads(path.read_text())
    rows = {row["fault"]: row for row in report["faults"]}
    assert list(rows) == [fault.description for fault in FAULTS.values()]
    for fault, row in rows.items():
        assert row["accepted"] > 0, fault
        assert (row["lost"], row["stuck"]) == (0, 0), (fault, row)
        assert (row["duplicate_effects"], row["second_tasks"]) == (0, 0), (fault, row)
        assert row["succeeded_without_effect"] == 0, (fault, row)
        assert row["unknown_left"] == 0, (fault, row)
        assert sum(row["statuses"].values()) >= row["accepted"], fault
    assert report["verdict"] == {"lost": 0, "stuck": 0, "duplicate_effects": 0, "second_tasks": 0}
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| fault | accepted |" in done.stdout
