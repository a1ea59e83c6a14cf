"""What runs the stages: the options, the pipeline, the workers and the output."""
