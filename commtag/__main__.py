"""``python -m commtag``: the same as the ``commtag`` console script."""

from commtag.cli import main

raise SystemExit(main())
