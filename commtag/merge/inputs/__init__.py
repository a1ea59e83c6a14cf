"""What the ranks wrote: discovery, reading, run checks, the selection."""
