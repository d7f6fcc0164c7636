"""`dispo bench soak`: a steady rate on a stack whose clock jumps a day at a time; the disk
sampled while each service's retention deletes the tasks older than a day. No test looks at
how fast anything was, nor at sizes: only that the samples exist, span the days, and that
retention kept the tasks held below what was submitted."""

from dispo.libs.business_policy import load_policy
from dispo.libs.clock import FileClock
from dispo.tools.bench.soak import JumpingClock, flat_after, policy_yaml, stream_bytes
from support.bench import run_bench


def test_the_jumping_clock_is_the_wall_plus_whole_days_as_a_file_clock_reads_it(tmp_path):
    clock = JumpingClock(tmp_path / "clock")
    clock.days = 3
    clock.write()
    ahead = FileClock(clock.path).now() - clock.now()
    assert abs(ahead.total_seconds()) < 1
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(2))
    assert load_policy(policy).default.retention_days == 2


def test_stream_bytes_sums_each_streams_files(tmp_path):
    stream = tmp_path / "jetstream" / "USERS" / "streams" / "TASKS" / "msgs"
    stream.mkdir(parents=True)
    (stream / "1.blk").write_bytes(b"x" * 100)
    (stream.parent / "meta.inf").write_bytes(b"y" * 10)
    assert stream_bytes(tmp_path) == {"TASKS": 110}


def test_dispo_bench_soak_samples_the_disk_while_retention_keeps_a_day(tmp_path):
    results = tmp_path / "results"
    path, result, out = run_bench(
        results,
        "soak",
        "--rate",
        "10",
        "--days",
        "3",
        "--day-seconds",
        "10",
        "--sample-seconds",
        "2",
        "--retention-interval",
        "1",
        timeout=300,
    )
    samples = result["samples"]
    assert result["submitted"] == 300 and result["submit_errors"] == 0
    assert {s["day"] for s in samples} >= {0, 1, 2}
    for s in samples:
        assert {"gateway.tasks", "executor.node_runs", "reconciler.completions"} <= set(
            s["tables_bytes"]
        )
        assert s["postgres_bytes"] == sum(s["tables_bytes"].values())
    assert {"TASKS", "TASK_STATUS"} <= set(samples[-1]["streams_bytes"])
    # Every service deleted the tasks past a day: a day later, fewer are held than were
    # submitted by then, in each service.
    last = samples[-1]
    assert last["day"] >= 2
    for table, held in last["tasks_held"].items():
        assert held < 250, (table, held)
    assert flat_after(result) == {}  # not past retention + 1 days: no plateau claimed
    assert "postgres MiB" in out
