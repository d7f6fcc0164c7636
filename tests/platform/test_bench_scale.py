"""`dispo bench scale`: a tiny load into every service's tables of a real stack, the same
operations measured before and after, the plans read back. No test looks at how fast
anything was: only that the rows were loaded, every operation was timed and explained, and
the plans name their indexes."""

import hashlib

from dispo.tools.bench.scale import TABLES, loaded_ids, plan_facts, seq_scans
from support.bench import run_bench


def test_a_plan_names_the_indexes_it_reads_and_the_tables_it_reads_whole():
    plan = {
        "Plan": {
            "Node Type": "Nested Loop",
            "Plans": [
                {"Node Type": "Index Scan", "Index Name": "tasks_pkey", "Relation Name": "tasks"},
                {
                    "Node Type": "Bitmap Heap Scan",
                    "Plans": [{"Node Type": "Bitmap Index Scan", "Index Name": "ix_tasks_labels"}],
                },
                {"Node Type": "Seq Scan", "Relation Name": "node_runs"},
            ],
        }
    }
    assert plan_facts(plan) == ({"tasks_pkey", "ix_tasks_labels"}, {"node_runs"})
    loaded = {"statements": {"a": {"seq_scans": ["node_runs"]}, "b": {"seq_scans": ["outbox"]}}}
    # An outbox holds only what is unsent: reading it whole is no big table's scan.
    assert seq_scans({"loaded": loaded}) == ["a"]


def test_the_probes_name_tasks_the_load_wrote():
    ids = loaded_ids(1000, 10)
    assert len(ids) == 10 and ids[0] == hashlib.md5(b"0").hexdigest()
    assert ids[1] == hashlib.md5(b"100").hexdigest()


def test_dispo_bench_scale_loads_every_table_and_measures_the_same_operations_twice(tmp_path):
    results = tmp_path / "results"
    path, result, out = run_bench(
        results, "scale", "--rows", "3000", "--tasks", "12", "--probes", "3", timeout=300
    )
    empty, loaded = result["empty"], result["loaded"]
    assert result["rows"] == 3000
    # The load's rows are in every table a task is kept in, three nodes each; the bench's
    # own tasks (a warm-up and 12 per run) are there too.
    assert set(loaded["tables"]) == set(TABLES)
    for table in ("gateway.tasks", "executor.task_runs", "reconciler.completions"):
        assert empty["tables"][table]["rows"] < 100
        assert loaded["tables"][table]["rows"] - empty["tables"][table]["rows"] >= 3000
    assert loaded["tables"]["executor.node_runs"]["rows"] >= 9000
    big = loaded["tables"]["gateway.tasks"]["bytes"]
    assert big > 3000 * 1000  # a real task's bytes in each row, not a stub
    # Every run of the submit bench ended its tasks.
    for phase in (empty, loaded):
        assert phase["submit"]["statuses"] == {"SUCCEEDED": phase["submit"]["config"]["tasks"]}
        assert set(phase["api"]) == {
            "GetTask",
            "ListTasks business, day",
            "ListTasks business, day, label",
            "ListTasks business, day, status",
            "CountTasks business, day",
        }
        assert all(op["n"] == 3 and op["p50_ms"] > 0 for op in phase["api"].values())
    statements = loaded["statements"]
    assert statements["GetTask"]["indexes"] == ["tasks_pkey"]
    assert "ix_tasks_business_created" in statements["ListTasks business, day"]["indexes"]
    assert "task_runs_pkey" in statements["executor claim (tasks_open_many)"]["indexes"]
    # An outbox is read whole or by outbox_unsent (it holds only what is unsent). Each
    # statement explained with its real parameters and timed, but the pass-end write (its
    # plan alone).
    assert statements["executor pass-end write (tasks_write_many)"]["n"] == 0
    assert all(s["n"] == 3 for n, s in statements.items() if "pass-end" not in n)
    assert not seq_scans(result)
    assert "ix_tasks_business_created" in out and "gateway.tasks" in out
