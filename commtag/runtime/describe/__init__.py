"""What a collective call is in the eager profiler's terms: its group (uid, lane, Seq), its fields, its annotation."""
