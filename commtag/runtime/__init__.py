"""The runtime wing: what runs inside the training process."""
