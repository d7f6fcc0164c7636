"""A stand-in for the ``openclaw`` CLI (a party outside Dispo), run as a real process: the
``cron`` commands the openclaw driver uses, on automations kept in a JSON file.

Its folder (``FAKE_OPENCLAW_DIR``) holds ``jobs.json`` (the automations), ``behaviour.json``
(how to misbehave, written by the test) and ``in-flight/`` (one file per running call).
``behaviour.json``: ``{"hold": ["cron add", ...], "apply_then_hold": bool, "skip": [...]}``:
a held command waits until the file ``release`` exists, before its effect or, with
``apply_then_hold``, after it (a call that timed out although OpenClaw did the work); a
skipped command never takes effect (it then waits like a held one, if held).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path

HOME = Path(os.environ["FAKE_OPENCLAW_DIR"])


def answer(data: dict, code: int = 0) -> None:
    print(json.dumps(data))
    sys.exit(code)


def fail(message: str) -> None:
    answer({"ok": False, "error": {"message": message}}, 1)


def option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


class Jobs:
    def __enter__(self) -> dict:
        self.lock = open(HOME / "lock", "w")
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        path = HOME / "jobs.json"
        self.jobs = json.loads(path.read_text()) if path.exists() else {}
        return self.jobs

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            (HOME / "jobs.json").write_text(json.dumps(self.jobs))
        self.lock.close()


def job_of(jobs: dict, job_id: str) -> dict:
    if job_id not in jobs:
        fail(f"cron job {job_id} not found")
    return jobs[job_id]


def effect(args: list[str]) -> dict:
    command = " ".join(args[:2])
    with Jobs() as jobs:
        if command == "cron add":
            key = option(args, "--declaration-key")
            found = next((j for j in jobs.values() if j["declarationKey"] == key), None)
            created = found is None
            if found is None:
                found = {"id": f"job-{len(jobs) + 1}-{os.getpid()}", "declarationKey": key}
                found.update(enabled=True, revision=0, content="")
                jobs[found["id"]] = found
            public = {k: found[k] for k in ("id", "declarationKey", "enabled")}
            return {"ok": True, "created": created, "job": public}
        if command == "cron list":
            return {
                "jobs": [
                    {k: j[k] for k in ("id", "declarationKey", "enabled")} for j in jobs.values()
                ]
            }
        job = job_of(jobs, args[2])
        if command == "cron rm":
            del jobs[job["id"]]
        elif command in ("cron enable", "cron disable"):
            job["enabled"] = command == "cron enable"
        elif command == "cron scratch" and "--set" in args:
            if int(option(args, "--expected-revision") or -1) != job["revision"]:
                fail("scratch changed concurrently")
            job["revision"] += 1
            job["content"] = option(args, "--set")
            return {"ok": True, "scratch": {"revision": job["revision"]}}
        elif command == "cron scratch":
            return {"scratch": {"revision": job["revision"], "content": job["content"]}}
        return {"ok": True}


def main() -> None:
    args = sys.argv[1:]
    command = " ".join(args[:2])
    behaviour_file = HOME / "behaviour.json"
    behaviour = json.loads(behaviour_file.read_text()) if behaviour_file.exists() else {}
    running = HOME / "in-flight"
    running.mkdir(exist_ok=True)
    mine = running / f"{os.getpid()}"
    mine.write_text(command)
    with open(HOME / "calls.log", "a") as log:
        log.write(command + "\n")
    held = command in behaviour.get("hold", [])
    skipped = command in behaviour.get("skip", [])

    def wait_for_release() -> None:
        while not (HOME / "release").exists():
            time.sleep(0.02)

    try:
        if held and not behaviour.get("apply_then_hold"):
            wait_for_release()
        result = {"ok": True} if skipped else effect(args)
        if held and behaviour.get("apply_then_hold"):
            wait_for_release()
    finally:
        mine.unlink(missing_ok=True)
    answer(result)


if __name__ == "__main__":
    main()
