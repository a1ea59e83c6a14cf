"""``python launch/gen_scaleset.py ...``: the scale-set generator, :mod:`commtag.testing.scaleset`."""

import sys

from commtag.testing.scaleset import main

if __name__ == "__main__":
    sys.exit(main())
