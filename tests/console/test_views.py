"""What the console's pages make of the services' replies (dispo.console.views), rendered
through the pages' own templates: the colours that tell a downstream in trouble, and the
first period of a series, whose comparison has no baseline by nature."""

from dispo.console.app import HERE, templates
from dispo.console.views import COLOURS, JOB_COLOURS, downstream_rows, job_row
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
