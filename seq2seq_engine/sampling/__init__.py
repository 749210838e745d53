"""Sampler and logits processors."""
