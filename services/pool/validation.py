"""Checks on a new evaluation; bad input raises InvalidArgument / ResourceExhausted naming the field."""

from __future__ import annotations

import re

from dispo.libs.egress import AllowList, EgressRefused, join
from dispo.libs.errors import FieldViolation, InvalidArgument, ResourceExhausted
from dispo.libs.evaluation import LINE_RULE, MAX_ID_CHARS, Line
from dispo.libs.payload import PayloadError, parse_json_text
from dispo.libs.settings import DEMO_DOWNSTREAM_ORIGIN
from dispo.pool.domain import Evaluation, PoolPolicy
from dispo.pool.scoring import validate_rule

ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")  # the whole id: fullmatch
MAX_CASES = 200
MAX_RULES = 20
MAX_CONFIGURATION_BYTES = 64 * 1024
MAX_CASE_BODY_BYTES = 16 * 1024
MAX_WINDOW_SECONDS = 31 * 86400
MAX_SLOTS = 10_000
MAX_RUNS_PER_SLOT = 1_000
# The embedded default's allow-list (the demo downstream); the service passes the configured one.
DEFAULT_EGRESS = AllowList.parse(DEMO_DOWNSTREAM_ORIGIN)
DEFAULT_POLICY = PoolPolicy()


def validate_evaluation(
    ev: Evaluation, egress: AllowList = DEFAULT_EGRESS, policy: PoolPolicy = DEFAULT_POLICY
) -> None:
    """Refuse a bad evaluation, naming every wrong field; its ``target_url`` must be on the
    ``egress`` allow-list, no case's path may lead away from it, and it may ask for no more
    runs, in all and a second, than ``policy`` allows."""
    if len(ev.configuration_json.encode()) > MAX_CONFIGURATION_BYTES:
        raise ResourceExhausted(
            f"configuration_json exceeds {MAX_CONFIGURATION_BYTES} bytes", "configuration_json"
        )
    if len(ev.cases) > MAX_CASES:
        raise ResourceExhausted(f"at most {MAX_CASES} cases", "cases")
    bad: list[FieldViolation] = []

    def need(ok: bool, field: str, description: str) -> None:
        if not ok:
            bad.append(FieldViolation(field, description))

    need(bool(ID_PATTERN.fullmatch(ev.id)), "evaluation_id", "must match [a-z0-9][a-z0-9-]{0,63}")
    need(
        bool(ev.series.strip()) and len(ev.series) <= MAX_ID_CHARS,
        "series",
        f"required, at most {MAX_ID_CHARS} characters",
    )
    need(ev.line in (Line.FORMAL, Line.TRIAL), "line", LINE_RULE)
    need(
        bool(ev.period.strip()) and len(ev.period) <= MAX_ID_CHARS,
        "period",
        f"required, at most {MAX_ID_CHARS} characters",
    )
    # Intelligence stores the configuration as a JSON object: refuse here what it could not.
    try:
        configuration = parse_json_text(ev.configuration_json or "{}")
        need(isinstance(configuration, dict), "configuration_json", "must be a JSON object")
    except PayloadError as error:
        where = f"configuration_json.{error.path}" if error.path else "configuration_json"
        bad.append(FieldViolation(where, f"must be JSON: {error.reason}"))
    need(
        len(ev.analysis_model) <= MAX_ID_CHARS,
        "analysis_model",
        f"at most {MAX_ID_CHARS} characters",
    )
    try:
        egress.check(ev.target_url)
        target_ok = True
    except EgressRefused as refused:
        bad.append(FieldViolation("target_url", str(refused)))
        target_ok = False
    need(bool(ev.cases), "cases", "at least one case")
    seen: set[str] = set()
    for i, case in enumerate(ev.cases):
        need(
            bool(case.id.strip()) and len(case.id) <= MAX_ID_CHARS and case.id not in seen,
            f"cases[{i}].id",
            f"required, unique, at most {MAX_ID_CHARS} characters",
        )
        seen.add(case.id)
        need(case.method in ("GET", "POST"), f"cases[{i}].method", "must be GET or POST")
        need(case.path.startswith("/"), f"cases[{i}].path", "must start with /")
        if target_ok and case.path.startswith("/"):
            try:
                join(ev.target_url, case.path)
            except EgressRefused as refused:
                bad.append(FieldViolation(f"cases[{i}].path", str(refused)))
        need(
            len(case.body.encode()) <= MAX_CASE_BODY_BYTES,
            f"cases[{i}].body",
            f"at most {MAX_CASE_BODY_BYTES} bytes",
        )
        need(len(case.rules) <= MAX_RULES, f"cases[{i}].rules", f"at most {MAX_RULES} rules")
        for j, rule in enumerate(case.rules):
            if (reason := validate_rule(rule)) is not None:
                bad.append(FieldViolation(f"cases[{i}].rules[{j}]", reason))
    s = ev.schedule
    need(
        0 < s.window_seconds <= MAX_WINDOW_SECONDS,
        "window_seconds",
        f"must be in 1..{MAX_WINDOW_SECONDS}",
    )
    need(0 < s.slot_count <= MAX_SLOTS, "slot_count", f"must be in 1..{MAX_SLOTS}")
    need(
        0 < s.runs_per_slot <= MAX_RUNS_PER_SLOT,
        "runs_per_slot",
        f"must be in 1..{MAX_RUNS_PER_SLOT}",
    )
    if not bad:
        _check_runs(ev, policy, bad)
    if bad:
        raise InvalidArgument(violations=bad)


def _check_runs(ev: Evaluation, policy: PoolPolicy, bad: list[FieldViolation]) -> None:
    """The work one evaluation asks for: runs in all, and runs a second over its window."""
    s = ev.schedule
    runs = s.slot_count * s.runs_per_slot
    if runs > policy.max_runs_per_evaluation:
        bad.append(
            FieldViolation(
                "runs_per_slot",
                f"slot_count × runs_per_slot is {runs} runs; the limit is"
                f" {policy.max_runs_per_evaluation} runs per evaluation",
            )
        )
    elif runs / s.window_seconds > policy.max_runs_per_second:
        bad.append(
            FieldViolation(
                "window_seconds",
                f"{runs} runs in {s.window_seconds} s is {runs / s.window_seconds:.4g} runs a"
                f" second; the limit is {policy.max_runs_per_second:g} a second per"
                " evaluation: widen the window or ask for fewer runs",
            )
        )
