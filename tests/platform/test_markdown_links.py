"""Every relative link in the repository's Markdown leads somewhere: to a file or folder
that exists and, when it names an anchor in a Markdown file, to a heading of that file.
External links (http, https, mailto) are not fetched."""

import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# [text](target "title") and ![alt](target); the target ends at a space or the parenthesis.
INLINE = re.compile(r"!?\[[^\]]*\]\(\s*(?:<([^>]+)>|([^)\s]+))(?:\s+\"[^\"]*\")?\s*\)")
# [label]: target
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+).*?\1")
EXTERNAL = ("http://", "https://", "mailto:")


def markdown_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "*.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return [ROOT / path for path in listed if (ROOT / path).is_file()]


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans, which hold no links."""
    kept, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(CODE_SPAN.sub("", line))
    return "\n".join(kept)


def links(text: str) -> list[str]:
    body = prose(text)
    inline = [bracketed or bare for bracketed, bare in INLINE.findall(body)]
    return inline + REFERENCE.findall(body)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|__", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(path.read_text()).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    found |= set(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", path.read_text()))
    return frozenset(found)


def broken(source: Path, target: str) -> str | None:
    """Why ``target``, linked from ``source``, leads nowhere; None when it leads somewhere."""
    if target.startswith(EXTERNAL):
        return None
    path_part, _, anchor = target.partition("#")
    path_part = path_part.split("?", 1)[0]
    dest = (source.parent / path_part).resolve() if path_part else source
    if not dest.exists():
        return "no such file"
    if ROOT not in dest.parents and dest != ROOT:
        return "outside the repository"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"no heading #{anchor}"
    return None


def test_the_link_reader_finds_every_form_and_skips_code():
    text = (
        'See [a](a.md), ![b](img/b.png "B") and [c](<c d.md#e>).\n'
        "[ref]: docs/x.md\n"
        "`[not](code.md)`\n"
        "```\n[nor](fenced.md)\n```\n"
    )
    assert links(text) == ["a.md", "img/b.png", "c d.md#e", "docs/x.md"]
    assert slug("ADR-0033: Any `FAILED` task, resumes (x)") == "adr-0033-any-failed-task-resumes-x"
    readme = ROOT / "README.md"
    assert broken(readme, "docs/adr/0032-any-failed-task.md") == "no such file"
    assert broken(readme, "docs/glossary.md#no-such-heading") == "no heading #no-such-heading"
    assert broken(readme, "docs/glossary.md") is None
    assert broken(readme, "https://example.com/missing") is None


def test_every_relative_link_in_the_markdown_leads_somewhere():
    files = markdown_files()
    assert ROOT / "README.md" in files and ROOT / "docs" / "pipeline.md" in files
    failures = [
        f"{source.relative_to(ROOT)}: ({target}) {reason}"
        for source in files
        for target in links(source.read_text())
        if (reason := broken(source, target))
    ]
    assert not failures, "broken links:\n" + "\n".join(failures)
