"""What the console's pages make of the services' replies (dispo.console.views), rendered
through the pages' own templates: the colours that tell a downstream in trouble, and the
first period of a series, whose comparison has no baseline by nature."""

import re

from dispo.console.app import HERE, templates
from dispo.console.views import (
    COLOURS,
    JOB_COLOURS,
    business_rows,
    downstream_rows,
    job_row,
    worker_queue_rows,
)
from dispo.libs.api.executor.v1 import executor_pb2 as epb
from dispo.libs.api.intelligence.v1 import intelligence_pb2 as ipb
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as rpb


def rendered(template: str, **context) -> str:
    return templates.env.get_template(template).render(**context)


def test_an_unhealthy_downstream_and_an_open_breaker_are_red_a_closed_one_green():
    rows = downstream_rows(
        [
            (
                rpb.DownstreamState(name="labels", probed=True, healthy=False, probe_error="503"),
                epb.Downstream(breaker_state=epb.BREAKER_STATE_OPEN),
            ),
            (
                rpb.DownstreamState(name="review", probed=True, healthy=True),
                epb.Downstream(breaker_state=epb.BREAKER_STATE_HALF_OPEN),
            ),
            (
                rpb.DownstreamState(name="notify", probed=True, healthy=True),
                epb.Downstream(breaker_state=epb.BREAKER_STATE_CLOSED),
            ),
            (rpb.DownstreamState(name="fresh"), None),  # not probed, no breaker reported
        ]
    )
    tones = {r.name: (r.health_tone, r.breaker_tone) for r in rows}
    assert tones == {
        "labels": ("bad", "bad"),
        "review": ("good", "warn"),
        "notify": ("good", "good"),
        "fresh": ("", ""),
    }
    page = rendered("_downstream_rows.html", downstreams=rows)
    assert '<td class="health bad" data-tone="bad">unhealthy (503)</td>' in page
    assert '<td class="breaker bad" data-tone="bad">OPEN</td>' in page
    assert '<td class="breaker warn" data-tone="warn">HALF_OPEN</td>' in page
    styles = (HERE / "static" / "console.css").read_text()
    assert f".bad {{ color: {COLOURS['FAILED']};" in styles  # red, as a FAILED task


def test_a_downstreams_limits_show_what_every_executor_holds_of_them():
    [limited, unpaced, unknown, per_business] = downstream_rows(
        [
            (
                rpb.DownstreamState(name="labels"),
                epb.Downstream(
                    max_concurrency=4, cluster_slots=3, max_calls_per_second=20,
                    cluster_per_second=12,
                ),
            ),
            (rpb.DownstreamState(name="review"), epb.Downstream(max_concurrency=8, cluster_slots=8)),
            (rpb.DownstreamState(name="fresh"), None),
            (
                rpb.DownstreamState(name="search"),
                epb.Downstream(
                    max_concurrency=8, cluster_slots=6, per_business_max_concurrency=2,
                    per_business_max_calls_per_second=5,
                ),
            ),
        ]
    )  # fmt: skip
    assert limited.limits == "3/4 at once, 12/20 a second"
    assert unpaced.limits == "8/8 at once" and unknown.limits == ""
    assert per_business.limits == "6/8 at once; a business 2 at once, 5 a second"
    page = rendered("_downstream_rows.html", downstreams=[limited])
    assert '<td class="limits">3/4 at once, 12/20 a second</td>' in page


def test_the_first_periods_comparison_reads_as_expected_not_as_a_failure():
    first = ipb.Job(
        kind=ipb.JOB_KIND_COMPARISON,
        evaluation_id="nightly-w01",
        status=ipb.JOB_STATUS_FAILED,
        error="no baseline for evaluation 'nightly-w01': series 'nightly' (formal line) has no"
        " completed period before '2026-W01' with configuration fingerprint 3f2a",
    )
    row = job_row(first)
    assert row.status == "NO BASELINE"
    assert JOB_COLOURS[row.status] == COLOURS["CANCELLED"] != COLOURS["FAILED"]  # grey
    page = rendered(
        "_job_detail.html",
        job=row,
        job_colours=JOB_COLOURS,
        no_baseline="NO BASELINE",
        narrative="",
        figures=[],
        clusters=[],
        worst=[],
        comparison=None,
    )
    assert "Expected: the first period of its series" in page
    # any other failure of a comparison, or of an analysis, stays a red FAILED
    for other in [
        ipb.Job(kind=ipb.JOB_KIND_COMPARISON, status=ipb.JOB_STATUS_FAILED, error="cannot compare"),
        ipb.Job(kind=ipb.JOB_KIND_ANALYSIS, status=ipb.JOB_STATUS_FAILED, error="no baseline for"),
    ]:
        assert job_row(other).status == "FAILED"


def test_a_tasks_outputs_and_result_are_shown_and_a_long_one_folded_expandable():
    from dispo.libs.api.common.v1 import common_pb2
    from dispo.libs.api.task.v1 import task_pb2
    from dispo.libs.payload import canonical_json, json_payload
    from dispo.sdk import TaskView

    short, long = {"ticket_id": "T-1f2e3d4c"}, {"blob": "x" * 300}
    task = task_pb2.Task(task_id="t1", business="b", status=common_pb2.TASK_STATUS_SUCCEEDED)
    for node_id, output in (("r.open", short), ("s.call", long), ("q.noop", None)):
        node = task.nodes.add(node_id=node_id, status=common_pb2.NODE_STATUS_SUCCEEDED)
        if output is not None:
            node.output.CopyFrom(json_payload(canonical_json(output)))
            node.output_bytes = len(canonical_json(output))
    task.result.CopyFrom(json_payload(canonical_json({"r.open": short, "s.call": long})))
    context = {"facts": [], "history": [], "recovery_state": "", "resumable": False}
    page = rendered("_task_detail.html", task=TaskView.from_proto(task), **context)
    rows = dict(re.findall(r'<tr data-node="([^"]+)">(.*?)</tr>', page, re.S))
    assert "<code>{&#34;ticket_id&#34;:&#34;T-1f2e3d4c&#34;}</code>" in rows["r.open"]
    assert "<details>" not in rows["r.open"]
    # longer than 200 characters: its beginning, the whole in a <details> that unfolds
    assert "<details><summary><code>{&#34;blob&#34;:&#34;" + "x" * 190 in rows["s.call"]
    assert "…</code></summary><pre>{\n  &#34;blob&#34;: &#34;" + "x" * 300 in rows["s.call"]
    assert '<td class="output"></td>' in rows["q.noop"]
    [result] = re.findall(r'<div id="result" class="output">(.*?)</div>', page, re.S)
    assert "<details>" in result and "T-1f2e3d4c" in result
    assert "outputs-unavailable" not in page

    task.outputs_unavailable = True
    task.ClearField("result")
    for node in task.nodes:
        node.ClearField("output")
    page = rendered("_task_detail.html", task=TaskView.from_proto(task), **context)
    assert 'id="outputs-unavailable"' in page and 'id="result"' not in page


def test_a_scheduled_task_shows_its_start_and_a_task_its_deadline():
    """A delayed task not started yet is marked scheduled, with its start, in the Tasks
    list and on its page; a deadline is shown on the page (ADR-0103)."""
    from datetime import UTC, datetime, timedelta

    from dispo.libs.api.common.v1 import common_pb2
    from dispo.libs.api.gateway.v1 import gateway_pb2
    from dispo.libs.api.task.v1 import task_pb2
    from dispo.libs.timestamps import set_timestamp
    from dispo.sdk import TaskSummary, TaskView

    now = datetime(2027, 1, 1, tzinfo=UTC)
    start, end = now + timedelta(hours=2), now + timedelta(hours=3)
    summary = gateway_pb2.TaskSummary(
        task_id="t1", business="b", status=common_pb2.TASK_STATUS_ACCEPTED
    )
    set_timestamp(summary.not_before, start)
    started = gateway_pb2.TaskSummary(task_id="t2", status=common_pb2.TASK_STATUS_RUNNING)
    set_timestamp(started.not_before, now - timedelta(hours=1))
    rows = rendered(
        "_task_rows.html",
        rows=[TaskSummary.from_proto(summary), TaskSummary.from_proto(started)],
        colours=COLOURS,
        now=now,
    )
    listed = dict(re.findall(r'<tr data-task="([^"]+)">(.*?)</tr>', rows, re.S))
    assert "scheduled, starts 2027-01-01 02:00:00" in listed["t1"]
    assert "scheduled" not in listed["t2"]

    task = task_pb2.Task(task_id="t1", business="b", status=common_pb2.TASK_STATUS_ACCEPTED)
    set_timestamp(task.not_before, start)
    set_timestamp(task.deadline, end)
    context = {"facts": [], "history": [], "recovery_state": "", "resumable": False}
    page = rendered("_task_detail.html", task=TaskView.from_proto(task), colours=COLOURS, **context)
    assert re.search(r'id="not-before">scheduled, starts 2027-01-01 02:00:00', page), page
    assert 'id="deadline">deadline 2027-01-01 03:00:00' in page


def test_a_queue_with_runs_and_no_live_worker_is_red_a_live_one_green():
    seen = epb.Queue(name="tickets", live_workers=2, live=True, taken=3, max_concurrency=4)
    seen.last_seen.FromSeconds(1_800_000_000)
    rows = worker_queue_rows([seen, epb.Queue(name="reports", offered=5), epb.Queue(name="idle")])
    assert [(r.name, r.health, r.health_tone) for r in rows] == [
        ("tickets", "live", "good"),
        ("reports", "no live worker", "bad"),  # its runs wait, then are demoted
        ("idle", "no live worker", ""),  # nothing waits on it
    ]
    assert rows[0].last_seen is not None and rows[1].last_seen is None
    page = rendered("_worker_queue_rows.html", worker_queues=rows)
    assert '<tr data-queue="tickets">' in page and '<td class="taken">3</td>' in page
    assert '<td class="health bad" data-tone="bad">no live worker</td>' in page
    assert '<td class="offered">5</td>' in page
    assert "No worker queue" in rendered("_worker_queue_rows.html", worker_queues=[])


def test_a_paced_queue_shows_its_runs_of_the_last_second_against_its_most_a_second():
    paced = epb.Queue(name="labels", max_calls_per_second=5, taken_last_second=4)
    rows = worker_queue_rows([paced, epb.Queue(name="free")])
    page = rendered("_worker_queue_rows.html", worker_queues=rows)
    assert re.search(r'data-queue="labels">(?s:.)*?<td class="per-second">4/5</td>', page), page
    assert re.search(r'data-queue="free">(?s:.)*?<td class="per-second">none</td>', page), page


def test_a_paused_business_shows_who_paused_it_its_depth_and_a_confirmed_resume():
    rows = business_rows(
        [
            (
                epb.BusinessState(
                    business="bulk",
                    weight=1,
                    paused=True,
                    paused_by="ops",
                    paused_reason="incident",
                ),
                1200,
            ),
            (epb.BusinessState(business="trust-safety", weight=4, waiting_here=3), 7),
        ]
    )
    page = rendered("_business_rows.html", businesses=rows)
    bulk, trust = page.split('<tr data-business="trust-safety">')
    assert '<td class="paused">paused by ops: incident</td>' in bulk
    assert '<td class="accepted">1200</td>' in bulk  # its paused depth
    assert 'hx-post="/businesses/bulk/resume" hx-confirm="Resume bulk?' in bulk
    assert "<td>4</td>" in trust and 'hx-post="/businesses/trust-safety/pause"' in trust
