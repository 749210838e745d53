"""Block manager and scheduler: the control side of continuous batching."""
