"""The Perfetto file format both ways: writing it, reading it back, validating it."""
