"""The parts of the scale-set generator; its command and manifest are :mod:`commtag.testing.scaleset`."""
