"""Demo downstream: counts every call and every effect per ``Idempotency-Key``.

    python -m dispo.executor.demo_downstream --port 8181

Routes:
- ``POST|PUT /<anything>``: an action call. The first call with a key performs the
  "effect"; later calls with the same key are counted but do not repeat it, unless
  switched to ``{"dedupe": false}``: then every call that gets through performs the effect
  again and counts it (a downstream that ignores the key, as a non-idempotent one does).
- ``GET /healthz``: 200, or 503 when switched down.
- ``GET /effects/{key}``: the status probe: ``{"done": bool, "calls": n}``. Switched to
  ``{"fence": true}`` it fences what it has not seen done: it records the key with the
  attempt the probe names (``X-Dispo-Attempt``) and answers ``"fenced": true``; from then on
  a request under the key with that attempt or an earlier one is refused (409) and one
  still under way does not perform its effect. A later attempt goes through.
- ``GET /calls``: ``{"calls": {key: n}, "effects": {key: n}, "bodies": {key: text},
  "paths": {key: path}, "held": n, "refused": {key: n}, "late": n, "most_at_once": n,
  "busiest_second": n}``; ``bodies`` and ``paths`` hold the request body and path of each
  key's first effect as received, ``refused`` the requests a fence refused, ``late`` the
  calls whose late effect is still to land, ``most_at_once`` the most action calls it had
  under way at once and ``busiest_second`` the most that began in one whole second (since
  the last reset: what a downstream's limits promise it).
- ``POST /control``: switches, JSON with any of
  ``{"fail": {"status": 500, "times": 2, "path": "/labels"}}`` (fail the next calls; with
  ``"effect": true`` after performing the effect, with ``"retry_after": "3"`` sending that
  ``Retry-After``),
  ``{"drop": {"times": 1, "path": "/labels", "effect": true}}`` (reset the connection
  instead of answering, after performing the effect if asked),
  ``{"down": true}`` (every call 503 and health 503),
  ``{"delay_ms": 200}`` (answer slowly),
  ``{"late_ms": 3000}`` (perform the effect, then answer only after that long: past the
  caller's timeout, the call looks failed although its effect happened; 0 switches it off),
  ``{"late_effect": {"ms": 4000, "times": 1, "path": "/once"}}`` (matching calls perform
  their effect that long after they arrive, then answer: a call the caller gave up on
  still acts later, unless its key was fenced meanwhile),
  ``{"fence": true}`` (the probe fences, above),
  ``{"hold": {"path": "/reviews"}}`` (keep matching calls open until released; the call
  is counted, its effect is not recorded and the released call answers 503; with
  ``"effect": true`` the effect is performed first and the released call answers 200 —
  an answer that comes too late; with ``"times": n`` only the next n matching calls),
  ``{"answer": {"path": "/out", "body": {...}, "times": 1}}`` (a successful matching
  call, its effect performed, answers this JSON body instead of the usual one; with
  ``"text": "..."`` and ``"content_type"`` it answers that text as written; with
  ``"repeat": n`` the body's ``text`` is repeated n times — an output too large),
  ``{"dedupe": false}`` (see above; ``true`` again by default), ``{"release": true}``,
  ``{"reset": true}``.

A successful call answers ``{"ok": true, "key": ..., "replayed": bool}`` (the node's
output), with ``"ticket_id"`` for a call under ``/reviews/``: a review ticket's number,
the same for every call under one key.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import socket
import struct
import time
from dataclasses import dataclass, field

from aiohttp import web
from dispo.libs.eventloop import new_event_loop


@dataclass
class Rule:
    status: int  # 0: reset the connection instead of answering
    times: int  # calls still to match; negative: every call
    path: str = ""
    effect: bool = False  # perform the effect first
    retry_after: str = ""

    def take(self, path: str) -> bool:
        """Does this rule apply to a call of ``path`` (and count it)?"""
        if self.times == 0 or not _matches(self.path, path):
            return False
        if self.times > 0:
            self.times -= 1
        return True


def _rule(body: dict, status: int, times: int = 1) -> Rule:
    return Rule(
        int(body.get("status", status)),
        int(body.get("times", times)),
        body.get("path", ""),
        bool(body.get("effect", False)),
        str(body.get("retry_after", "")),
    )


@dataclass
class State:
    calls: dict[str, int] = field(default_factory=dict)
    effects: dict[str, int] = field(default_factory=dict)
    bodies: dict[str, str] = field(default_factory=dict)
    # The path of each key's first effect.
    paths: dict[str, str] = field(default_factory=dict)
    fail: list[Rule] = field(default_factory=list)
    down: bool = False
    dedupe: bool = True
    delay_ms: int = 0
    late_ms: int = 0
    # Matching calls' effects land this long after they arrive (``late_effect``).
    late_effect: Rule | None = None
    late_effect_ms: int = 0
    fence: bool = False
    # Per key, the newest attempt a fencing probe fenced: requests up to it are refused.
    fenced: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    late: int = 0  # calls whose late effect is still to land
    hold: Rule | None = None
    held: int = 0
    # Answers given instead of the usual one, with the rule that picks their calls.
    answers: list[tuple[Rule, dict]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    # Action calls under way now, the most there were at once, and how many began in each
    # whole second of the clock (what a downstream's limits promise it, ADR-0108).
    at_once: int = 0
    most_at_once: int = 0
    per_second: dict[int, int] = field(default_factory=dict)


def _matches(prefix: str, path: str) -> bool:
    return not prefix or path.startswith(prefix)


def attempt_of(request: web.Request) -> int:
    """The attempt number a call or probe names (``X-Dispo-Attempt``; 0 when absent)."""
    try:
        return int(request.headers.get("X-Dispo-Attempt", "0"))
    except ValueError:
        return 0


def reset_connection(request: web.Request) -> web.StreamResponse:
    """Reset the call's connection (RST, no answer at all)."""
    transport = request.transport
    assert transport is not None
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
    return web.Response()  # never written: the connection is gone


def build_app() -> web.Application:
    state = State()
    app = web.Application()
    app["state"] = state

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ok": not state.down}, status=503 if state.down else 200)

    async def effect(request: web.Request) -> web.Response:
        key = request.match_info["key"]
        answer = {"done": key in state.effects, "calls": state.calls.get(key, 0)}
        if state.fence and not answer["done"]:
            fenced = max(attempt_of(request), state.fenced.get(key, 0))
            state.fenced[key] = fenced
            answer.update(fenced=True, fenced_attempt=fenced)
        return web.json_response(answer)

    async def calls(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "calls": state.calls,
                "effects": state.effects,
                "bodies": state.bodies,
                "paths": state.paths,
                "held": state.held,
                "refused": state.refused,
                "late": state.late,
                "most_at_once": state.most_at_once,
                "busiest_second": max(state.per_second.values(), default=0),
            }
        )

    async def control(request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("reset"):
            for recorded in (
                state.calls, state.effects, state.bodies, state.paths, state.fail, state.answers,
            ):  # fmt: skip
                recorded.clear()
            state.fenced.clear()
            state.refused.clear()
            state.per_second.clear()
            state.most_at_once = state.at_once
            state.down, state.dedupe, state.delay_ms, state.hold = False, True, 0, None
            state.late_ms, state.late_effect, state.fence = 0, None, False
            state.release.set()
            state.release = asyncio.Event()
        if "fail" in body:
            state.fail.append(_rule(body["fail"], 500))
        if "answer" in body:
            state.answers.append((_rule(body["answer"], 200, -1), body["answer"]))
        if "drop" in body:
            state.fail.append(_rule({**body["drop"], "status": 0}, 0))
        if "down" in body:
            state.down = bool(body["down"])
        if "dedupe" in body:
            state.dedupe = bool(body["dedupe"])
        if "late_ms" in body:
            state.late_ms = int(body["late_ms"])
        if "late_effect" in body:
            late = body["late_effect"]
            state.late_effect = None if late is None else _rule(late, 0, -1)
            state.late_effect_ms = int((late or {}).get("ms", 0))
        if "fence" in body:
            state.fence = bool(body["fence"])
        if "delay_ms" in body:
            state.delay_ms = int(body["delay_ms"])
        if "hold" in body:
            state.hold = None if body["hold"] is None else _rule(body["hold"] or {}, 0, -1)
        if body.get("release"):
            state.hold = None
            state.release.set()
            state.release = asyncio.Event()
        return web.json_response({"ok": True})

    async def perform(key: str, request: web.Request) -> bool:
        """The call's effect; True the first time for ``key``."""
        first = key not in state.effects
        if first or not state.dedupe:
            state.effects[key] = state.effects.get(key, 0) + 1
        if first and request.can_read_body:
            state.bodies[key] = await request.text()
        if first:
            state.paths[key] = request.path
        return first

    def refuse_fenced(key: str, request: web.Request) -> web.Response | None:
        """409 for a request under a key fenced up to its attempt (or a later one)."""
        if key in state.fenced and attempt_of(request) <= state.fenced[key]:
            state.refused[key] = state.refused.get(key, 0) + 1
            return web.json_response({"error": "fenced", "key": key}, status=409)
        return None

    async def act(request: web.Request) -> web.StreamResponse:
        state.at_once += 1
        state.most_at_once = max(state.most_at_once, state.at_once)
        second = int(time.time())
        state.per_second[second] = state.per_second.get(second, 0) + 1
        try:
            return await answer(request)
        finally:
            state.at_once -= 1

    async def answer(request: web.Request) -> web.StreamResponse:
        key = request.headers.get("Idempotency-Key", "")
        state.calls[key] = state.calls.get(key, 0) + 1
        if state.down:
            return web.json_response({"error": "down"}, status=503)
        if (refusal := refuse_fenced(key, request)) is not None:
            return refusal
        late = state.late_effect
        if late is not None and late.take(request.path):
            state.late += 1
            try:
                await asyncio.sleep(state.late_effect_ms / 1000)
            finally:
                state.late -= 1
            if (refusal := refuse_fenced(key, request)) is not None:  # fenced meanwhile
                return refusal
        if state.delay_ms:
            await asyncio.sleep(state.delay_ms / 1000)
        hold = state.hold
        if hold is not None and hold.take(request.path):
            if hold.effect:
                await perform(key, request)
            state.held += 1
            await state.release.wait()
            state.held -= 1
            if hold.effect:
                return web.json_response({"ok": True, "key": key, "late": True})
            return web.json_response({"error": "released without effect"}, status=503)
        for rule in state.fail:
            if rule.take(request.path):
                if rule.effect:
                    await perform(key, request)
                if rule.status == 0:
                    return reset_connection(request)
                headers = {"Retry-After": rule.retry_after} if rule.retry_after else None
                return web.json_response({"error": "injected"}, status=rule.status, headers=headers)
        first = await perform(key, request)
        if state.late_ms:  # the effect is done; the answer comes too late
            await asyncio.sleep(state.late_ms / 1000)
        for rule, given in state.answers:
            if rule.take(request.path):
                if "text" in given:
                    text = str(given["text"]) * int(given.get("repeat", 1))
                    kind = str(given.get("content_type", "application/json"))
                    return web.Response(text=text, content_type=kind)
                return web.json_response(given.get("body"))
        answer: dict[str, object] = {"ok": True, "key": key, "replayed": not first}
        if request.path.startswith("/reviews/"):  # a review ticket: its number, per key
            answer["ticket_id"] = "T-" + hashlib.sha256(key.encode()).hexdigest()[:8]
        return web.json_response(answer)

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/effects/{key:.+}", effect)
    app.router.add_get("/calls", calls)
    app.router.add_post("/control", control)
    app.router.add_route("POST", "/{tail:.*}", act)
    app.router.add_route("PUT", "/{tail:.*}", act)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description="Dispo demo downstream service")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8181)
    options = parser.parse_args()
    web.run_app(
        build_app(),
        host=options.host,
        port=options.port,
        print=lambda *_: print(f"demo downstream on {options.host}:{options.port}", flush=True),
        # A downstream as fast as the machine allows: the benches' CPU per task counts it.
        access_log=None,
        loop=new_event_loop(),  # uvloop's, as the services run on
    )


if __name__ == "__main__":
    main()
