"""Integrations with other systems: Ray Data batch inference across a cluster (ray_data.py)."""
