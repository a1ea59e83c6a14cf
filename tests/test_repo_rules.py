"""Rules about the repository itself that the linter cannot check."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for folder in ("commtag", "tests", "launch") for p in (ROOT / folder).rglob("*.py"))

#: A noqa with its codes and nothing after them; the reason goes after " - ".
_BARE_NOQA = re.compile(r"#\s*noqa(?::\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)?\s*$")


def test_every_noqa_says_why():
    bare = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            for path in SOURCES
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if _BARE_NOQA.search(line)]
    assert not bare, "a noqa without its reason (write `# noqa: CODE - why`):\n" + "\n".join(bare)
