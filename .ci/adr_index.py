"""The index of docs/adr/README.md, written from the ADR files themselves.

Every ADR is ``docs/adr/NNNN-<slug>.md``, titled ``# ADR-NNNN: <sentence>``, and its next
paragraph starts with its status, ``**Status**: accepted`` or ``**Status**: superseded by
ADR-NNNN``, optionally followed by ``· **Amended by**: ADR-NNNN (why)`` and other fields::

    .venv/bin/python .ci/adr_index.py           # rewrite the index (and spell the statuses
                                                # of the form "Status: Accepted" as above)
    .venv/bin/python .ci/adr_index.py --check   # exit 1: an ADR out of form, or a stale index

tests/platform/test_adr_index.py runs the check.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

FOLDER = Path(__file__).resolve().parent.parent / "docs" / "adr"
BEGIN = "<!-- ADR index: written by `.venv/bin/python .ci/adr_index.py`, do not edit -->"
END = "<!-- end of ADR index -->"

FILE = re.compile(r"^(\d{4})-[a-z0-9-]+\.md$")
TITLE = re.compile(r"^# ADR-(\d{4}): (\S.*)$")
STATUS = re.compile(
    r"^\*\*Status\*\*: (accepted|superseded by ADR-\d{4}(?:(?:,| and) ADR-\d{4})*)(?: · |$)"
)
AMENDED = re.compile(r"\*\*Amended by\*\*: (.*?)(?: · \*\*|$)")
REF = re.compile(r"ADR-(\d{4})")
# A status line in another spelling, as the form above would have it.
LOOSE_STATUS = re.compile(r"^(?:\*\*)?Status(?:\*\*)?:\s*(?:\*\*)?accepted(?:\*\*)?", re.I | re.M)
LOOSE_CONTEXT = re.compile(r" · Context: ")


@dataclass(frozen=True)
class Adr:
    number: str
    file: str
    title: str
    status: str
    amended_by: tuple[str, ...]


def read(path: Path) -> Adr | str:
    """The ADR in ``path``, or what is wrong with its form."""
    name = path.name
    match = FILE.match(name)
    if not match:
        return f"{name}: not named NNNN-<lower-case-slug>.md"
    lines = path.read_text().splitlines()
    title = TITLE.match(lines[0]) if lines else None
    if not title or title.group(1) != match.group(1):
        return f"{name}: the first line is not '# ADR-{match.group(1)}: <sentence>'"
    header = " ".join(_header(lines[1:]))
    status = STATUS.match(header)
    if not status:
        return f"{name}: no '**Status**: accepted' or '**Status**: superseded by ADR-NNNN' after the title"
    amended = AMENDED.search(header)
    return Adr(
        number=match.group(1),
        file=name,
        title=title.group(2),
        status=status.group(1),
        amended_by=tuple(REF.findall(amended.group(1))) if amended else (),
    )


def spell(path: Path) -> None:
    """Rewrite ``path``'s status paragraph in the form above when it says "Status: Accepted"
    in another spelling."""
    text = path.read_text()
    head, sep, body = text.partition("\n## ")
    fixed = LOOSE_STATUS.sub("**Status**: accepted", head, count=1)
    fixed = LOOSE_CONTEXT.sub(" · **Context**: ", fixed, count=1)
    if fixed != head:
        path.write_text(fixed + sep + body)


def _header(lines: list[str]) -> list[str]:
    """The first paragraph after the title."""
    kept: list[str] = []
    for line in lines:
        if line.strip():
            kept.append(line.strip())
        elif kept:
            break
    return kept


def collect(folder: Path) -> tuple[list[Adr], list[str]]:
    """Every ADR of ``folder`` in number order, and the problems found."""
    adrs: list[Adr] = []
    problems: list[str] = []
    for path in sorted(folder.glob("*.md")):
        if path.name == "README.md":
            continue
        found = read(path)
        if isinstance(found, Adr):
            adrs.append(found)
        else:
            problems.append(found)
    numbers = [adr.number for adr in adrs]
    problems += [
        f"ADR-{n}: more than one file" for n in sorted(set(numbers)) if numbers.count(n) > 1
    ]
    for adr in adrs:
        for ref in [*REF.findall(adr.status), *adr.amended_by]:
            if ref not in numbers:
                problems.append(f"{adr.file}: names ADR-{ref}, which does not exist")
    return adrs, problems


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(adrs: list[Adr]) -> str:
    rows = ["| ADR | Decision | Status |", "|---|---|---|"]
    for adr in adrs:
        status = adr.status
        if adr.amended_by:
            status += ", amended by " + ", ".join(f"ADR-{n}" for n in adr.amended_by)
        rows.append(f"| [{adr.number}]({adr.file}) | {_cell(adr.title)} | {status} |")
    return "\n".join(rows)


def render(readme: str, adrs: list[Adr]) -> str:
    """``readme`` with the text between the markers replaced by the index of ``adrs``."""
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return f"{readme[:start]}\n{table(adrs)}\n{readme[end:]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    parser.add_argument("--folder", type=Path, default=FOLDER)
    args = parser.parse_args(argv)
    if not args.check:
        for path in args.folder.glob("[0-9]*.md"):
            spell(path)
    adrs, problems = collect(args.folder)
    for problem in problems:
        print(problem, file=sys.stderr)
    index = args.folder / "README.md"
    current = index.read_text()
    wanted = render(current, adrs)
    if args.check:
        if wanted != current:
            print(f"{index}: stale; run .venv/bin/python .ci/adr_index.py", file=sys.stderr)
        return 1 if problems or wanted != current else 0
    if wanted != current:
        index.write_text(wanted)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
