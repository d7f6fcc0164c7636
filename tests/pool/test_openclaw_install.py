"""Installing OpenClaw takes minutes the first time: the install says what it does while it
runs (``dispo up`` prints it), with a real process standing in for npm."""

from __future__ import annotations

import sys

from dispo.pool.openclaw import Installing


def test_an_install_reports_while_it_runs(tmp_path):
    go = tmp_path / "go"
    lines: list[str] = []

    def progress(line: str) -> None:
        lines.append(line)
        if line.startswith("still installing"):
            go.touch()  # the install ends only once it has said it is still going

    waits = f"import pathlib, time\nwhile not pathlib.Path({str(go)!r}).exists(): time.sleep(0.01)"
    code, out = Installing("OpenClaw 1.2.3", progress, every=0.05).run(
        [sys.executable, "-c", f"{waits}\nprint('added 330 packages')"]
    )
    assert code == 0 and "added 330 packages" in out
    assert lines[0] == "installing OpenClaw 1.2.3 (the first time only; it can take minutes)"
    assert lines[1].startswith("still installing OpenClaw 1.2.3 (")
    assert lines[-1].startswith("installed OpenClaw 1.2.3 in ")


def test_a_failed_install_says_so_without_claiming_it_installed():
    lines: list[str] = []
    code, out = Installing("OpenClaw 1.2.3", lines.append).run(
        [sys.executable, "-c", "import sys; print('E404 not found'); sys.exit(1)"]
    )
    assert code == 1 and "E404" in out
    assert lines == ["installing OpenClaw 1.2.3 (the first time only; it can take minutes)"]
