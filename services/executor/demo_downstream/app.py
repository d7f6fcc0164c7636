"""Demo downstream: counts every call and every effect per ``Idempotency-Key``.

    python -m dispo.executor.demo_downstream --port 8181

Routes:
- ``POST|PUT /<anything>``: an action call. The first call with a key performs the
  "effect"; later calls with the same key are counted but do not repeat it — unless
  switched to ``{"dedupe": false}``, when every call that gets through performs the effect
  again (a downstream that trusts its caller never to repeat a call).
- ``GET /healthz``: 200, or 503 when switched down.
- ``GET /effects/{key}``: the status probe: ``{"done": bool, "calls": n}``.
- ``GET /calls``: ``{"calls": {key: n}, "effects": {key: n}, "bodies": {key: text},
  "held": n}``; ``bodies`` holds the request body of each effect as received.
- ``POST /control``: switches, JSON with any of
  ``{"fail": {"status": 500, "times": 2, "path": "/labels"}}`` (fail the next calls),
  ``{"down": true}`` (every call 503 and health 503),
  ``{"delay_ms": 200}`` (answer slowly),
  ``{"late_ms": 3000}`` (perform the effect, then answer only after that long: past the
  caller's timeout, the call looks failed although its effect happened; 0 switches it off),
  ``{"dedupe": false}`` (count an effect for every call, see above; ``true`` again by default),
  ``{"hold": {"path": "/reviews"}}`` (keep matching calls open until released; the call
  is counted, its effect is not recorded), ``{"release": true}``, ``{"reset": true}``.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Rule:
    status: int
    times: int
    path: str = ""


@dataclass
class State:
    calls: dict[str, int] = field(default_factory=dict)
    effects: dict[str, int] = field(default_factory=dict)
    bodies: dict[str, str] = field(default_factory=dict)
    fail: list[Rule] = field(default_factory=list)
    down: bool = False
    delay_ms: int = 0
    late_ms: int = 0
    dedupe: bool = True
    hold_path: str | None = None
    held: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)


def _matches(prefix: str, path: str) -> bool:
    return not prefix or path.startswith(prefix)


def build_app() -> web.Application:
    state = State()
    app = web.Application()
    app["state"] = state

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ok": not state.down}, status=503 if state.down else 200)

    async def effect(request: web.Request) -> web.Response:
        key = request.match_info["key"]
        return web.json_response({"done": key in state.effects, "calls": state.calls.get(key, 0)})

    async def calls(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "calls": state.calls,
                "effects": state.effects,
                "bodies": state.bodies,
                "held": state.held,
            }
        )

    async def control(request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("reset"):
            for recorded in (state.calls, state.effects, state.bodies, state.fail):
                recorded.clear()
            state.down, state.delay_ms, state.hold_path = False, 0, None
            state.late_ms, state.dedupe = 0, True
            state.release.set()
            state.release = asyncio.Event()
        if "fail" in body:
            f = body["fail"]
            state.fail.append(
                Rule(int(f.get("status", 500)), int(f.get("times", 1)), f.get("path", ""))
            )
        if "down" in body:
            state.down = bool(body["down"])
        if "delay_ms" in body:
            state.delay_ms = int(body["delay_ms"])
        if "late_ms" in body:
            state.late_ms = int(body["late_ms"])
        if "dedupe" in body:
            state.dedupe = bool(body["dedupe"])
        if "hold" in body:
            state.hold_path = (
                (body["hold"] or {}).get("path", "") if body["hold"] is not None else None
            )
        if body.get("release"):
            state.hold_path = None
            state.release.set()
            state.release = asyncio.Event()
        return web.json_response({"ok": True})

    async def act(request: web.Request) -> web.Response:
        key = request.headers.get("Idempotency-Key", "")
        state.calls[key] = state.calls.get(key, 0) + 1
        if state.down:
            return web.json_response({"error": "down"}, status=503)
        if state.delay_ms:
            await asyncio.sleep(state.delay_ms / 1000)
        if state.hold_path is not None and _matches(state.hold_path, request.path):
            state.held += 1
            await state.release.wait()
            state.held -= 1
            return web.json_response({"error": "released without effect"}, status=503)
        for rule in state.fail:
            if rule.times > 0 and _matches(rule.path, request.path):
                rule.times -= 1
                return web.json_response({"error": "injected"}, status=rule.status)
        first = key not in state.effects
        state.effects[key] = state.effects.get(key, 0) + (1 if first or not state.dedupe else 0)
        if first and request.can_read_body:
            state.bodies[key] = await request.text()
        if state.late_ms:  # the effect is done; the answer comes too late
            await asyncio.sleep(state.late_ms / 1000)
        return web.json_response({"ok": True, "key": key, "replayed": not first})

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
    )


if __name__ == "__main__":
    main()
