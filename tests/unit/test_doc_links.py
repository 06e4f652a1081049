"""Every relative link of the README and docs/ leads somewhere: the file exists, and a
``#fragment`` names one of its headings (GitHub's anchors: lower case, punctuation but ``-`` and
``_`` dropped, spaces made ``-``). Moving a section from the README to docs/ cannot leave a link
pointing at the old place."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(`{3,}|~{3,})")


def prose(text: str) -> str:
    """The page without its fenced blocks (a report shown as an example holds links of its own)."""
    kept, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if m and fence is None:
            fence = m.group(1)
        elif fence is not None and line.strip() == fence:
            fence = None
        elif fence is None:
            kept.append(line)
    return "\n".join(kept)


def anchors(page: Path) -> set:
    found = set()
    for line in prose(page.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"^#{1,6} (.*)$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            found.add(slug)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_leads_somewhere(page):
    broken = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z]+:", target):
            continue     # https:, mailto:
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading #{fragment} in {dest.relative_to(REPO)}")
    assert not broken, "\n".join(broken)


def test_the_anchor_rule_is_githubs():
    page = REPO / "README.md"
    assert {"statuses-and-exit-codes", "1-install-and-run-the-main-job-on-this-machine",
            "tests"} <= anchors(page)
