"""Scoring rules of a test case, applied to one HTTP answer. Pure functions.

A ``regex`` rule is a pattern supplied by whoever creates the evaluation, matched against a
body the target chose: it is compiled with RE2, whose matching time is linear in the body,
so no pattern can stall the worker (``(a+)+$`` takes as long as ``a+$``). Patterns RE2
cannot run in linear time (backreferences, lookaround) are refused when the evaluation is
created (:func:`validate_rule`); a rule stored before that check is scored as failed with
its reason, never raised.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

import re2
from dispo.libs.evaluation import Verdict
from dispo.libs.payload import PayloadError, parse_json_text
from dispo.pool.domain import RULE_KINDS, Rule, RunResult

MAX_REASON = 500
MAX_PATTERN_CHARS = 1000
# A status rule names an HTTP status code; a latency budget is at most an hour.
STATUS_RANGE = (100, 599)
MAX_LATENCY_BUDGET_MS = 3_600_000
_DIGITS = re.compile(r"[0-9]{1,10}")  # ASCII only: "²".isdigit() is True


@dataclass(frozen=True)
class Answer:
    status: int
    body: str
    latency_ms: int


def json_path(document: object, path: str) -> object:
    """Resolve ``$.a.b[0].c`` (or ``a.b.0.c``); raises KeyError when absent."""
    text = path.strip()
    if text.startswith("$"):
        text = text[1:]
    parts = [p for p in re.split(r"\.|\[(\d+)\]", text) if p]
    current = document
    for part in parts:
        if isinstance(current, list):
            try:
                current = current[int(part)]
            except (ValueError, IndexError):
                raise KeyError(path) from None
        elif isinstance(current, dict) and part in current:
            current = current[part]
        else:
            raise KeyError(path)
    return current


@functools.lru_cache(maxsize=256)
def compile_pattern(pattern: str) -> Any:
    """The RE2 program of ``pattern``; ``re2.error`` when RE2 cannot run it."""
    options = re2.Options()
    options.log_errors = False
    return re2.compile(pattern, options)


def _pattern_problem(pattern: str) -> str | None:
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"regex must be at most {MAX_PATTERN_CHARS} characters"
    try:
        compile_pattern(pattern)
    except re2.error as error:
        detail = error.args[0] if error.args else error
        if isinstance(detail, bytes):
            detail = detail.decode(errors="replace")
        return f"not a regex that runs in linear time (RE2 syntax): {detail}"
    return None


def check_rule(rule: Rule, answer: Answer) -> str | None:
    """None when the rule holds, else why not (a malformed rule does not hold)."""
    if (problem := _known_problem(rule)) is not None:
        return f"invalid rule: {problem}"
    if rule.kind == "status":
        return (
            None if answer.status == int(rule.value) else f"status {answer.status} != {rule.value}"
        )
    if rule.kind == "latency_ms":
        budget = int(rule.value)
        return (
            None if answer.latency_ms <= budget else f"latency {answer.latency_ms}ms > {budget}ms"
        )
    if rule.kind == "regex":
        matched = compile_pattern(rule.value).search(answer.body) is not None
        return None if matched else f"body does not match /{rule.value}/"
    if rule.kind in ("json_equals", "json_contains"):
        try:
            found = json_path(json.loads(answer.body), rule.path)
        except (ValueError, KeyError, RecursionError):
            return f"{rule.path} absent"
        if rule.kind == "json_equals":
            expected = json.loads(rule.value)
            return (
                None if found == expected else f"{rule.path} = {json.dumps(found)} != {rule.value}"
            )
        haystack = found if isinstance(found, str) else json.dumps(found)
        return None if rule.value in haystack else f"{rule.path} does not contain {rule.value!r}"
    return f"unknown rule kind {rule.kind!r}"


def validate_rule(rule: Rule) -> str | None:
    """Why a rule is malformed, or None."""
    if rule.kind not in RULE_KINDS:
        return f"kind must be one of {', '.join(f'RULE_KIND_{k.upper()}' for k in RULE_KINDS)}"
    if rule.kind == "status":
        low, high = STATUS_RANGE
        if not (_DIGITS.fullmatch(rule.value) and low <= int(rule.value) <= high):
            return f"value must be an HTTP status code, {low}..{high}"
    elif rule.kind == "latency_ms":
        if not (_DIGITS.fullmatch(rule.value) and int(rule.value) <= MAX_LATENCY_BUDGET_MS):
            return f"value must be a number of milliseconds, 0..{MAX_LATENCY_BUDGET_MS}"
    elif rule.kind == "regex":
        return _pattern_problem(rule.value)
    elif rule.kind in ("json_equals", "json_contains"):
        if not rule.path:
            return "path is required"
        if rule.kind == "json_equals":
            try:
                parse_json_text(rule.value)
            except PayloadError:
                return "value must be JSON"
    return None


# Rules are checked when the evaluation is created; scoring a run re-checks a rule stored
# earlier only once (an evaluation's rules are scored on every one of its runs).
_known_problem = functools.lru_cache(maxsize=1024)(validate_rule)


def score(rules: tuple[Rule, ...], answer: Answer) -> RunResult:
    """Share of rules that hold; pass only when all hold (no rules: a 2xx answer passes)."""
    if not rules:
        ok = 200 <= answer.status < 300
        return RunResult(
            Verdict.PASS if ok else Verdict.FAIL,
            1.0 if ok else 0.0,
            answer.latency_ms,
            "" if ok else f"status {answer.status}",
        )
    failures = [reason for rule in rules if (reason := check_rule(rule, answer))]
    value = (len(rules) - len(failures)) / len(rules)
    verdict = Verdict.FAIL if failures else Verdict.PASS
    return RunResult(verdict, value, answer.latency_ms, "; ".join(failures)[:MAX_REASON])


def error_result(reason: str, latency_ms: int = 0) -> RunResult:
    return RunResult(Verdict.ERROR, 0.0, latency_ms, reason[:MAX_REASON])
