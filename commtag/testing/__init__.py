"""Test and benchmark infrastructure: used by tests/ and launch/, never by the library itself.

It lives in the package so that both can import it without editing ``sys.path``
(``python launch/bench_merge.py`` and ``pytest`` alike). Nothing here is imported by
``import commtag``.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Real traces written by other projects (with their PROVENANCE.md), shared by every checkout
#: next to the repository and never copied into it; COMMTAG_PUBLIC_TRACES points elsewhere.
PUBLIC_TRACES = Path(os.environ.get("COMMTAG_PUBLIC_TRACES")
                     or Path(__file__).resolve().parents[2].parent / "shared" / "data" / "public-traces")
