"""``python -m commtag.merge DIR`` (or under ``torchrun --nproc-per-node=N -m commtag.merge DIR``)."""

from commtag.cli import main

raise SystemExit(main(["merge", *__import__("sys").argv[1:]]))
