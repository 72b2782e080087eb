"""Every relative link in the README and the docs names a file or folder of the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    ROOT / "benchmarks" / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    links = [m.group(1).split("#")[0] for m in LINK.finditer(text)]
    return [x for x in links if x and not re.match(r"[a-z]+:", x)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    missing = [x for x in relative_links(page) if not (page.parent / x).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to what is not there: {missing}"
