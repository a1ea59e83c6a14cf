"""What is kept while the profiler runs, and the rank's sidecar it becomes."""
