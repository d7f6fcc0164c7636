"""Scoring rules of a test case, applied to one HTTP answer. Pure functions."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from dispo.libs.evaluation import Verdict
from dispo.pool.domain import RULE_KINDS, Rule, RunResult

MAX_REASON = 500


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


def check_rule(rule: Rule, answer: Answer) -> str | None:
    """None when the rule holds, else why not."""
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
        return None if re.search(rule.value, answer.body) else f"body does not match /{rule.value}/"
    if rule.kind in ("json_equals", "json_contains"):
        try:
            found = json_path(json.loads(answer.body), rule.path)
        except (ValueError, KeyError):
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
    if rule.kind in ("status", "latency_ms"):
        if not rule.value.isdigit():
            return "value must be a non-negative integer"
    elif rule.kind == "regex":
        try:
            re.compile(rule.value)
        except re.error as exc:
            return f"invalid regex: {exc}"
    elif rule.kind in ("json_equals", "json_contains"):
        if not rule.path:
            return "path is required"
        if rule.kind == "json_equals":
            try:
                json.loads(rule.value)
            except ValueError:
                return "value must be JSON"
    return None


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
