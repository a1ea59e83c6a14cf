"""Test and benchmark infrastructure: used by tests/ and launch/, never by the library itself.

It lives in the package so that both can import it without editing ``sys.path``
(``python launch/bench_merge.py`` and ``pytest`` alike). Nothing here is imported by
``import commtag``.
"""

from __future__ import annotations

from pathlib import Path

#: Real traces written by other projects, kept in the repository with their PROVENANCE.md and
#: licences. commtag.testing ships only in a checkout (the wheel leaves it out), so this is the
#: checkout's own folder.
PUBLIC_TRACES = Path(__file__).resolve().parents[2] / "tests" / "data" / "public"
