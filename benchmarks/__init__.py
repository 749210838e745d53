"""Benchmarks of this engine against its peers: the scripts here, run as `python -m benchmarks.<name>`."""
