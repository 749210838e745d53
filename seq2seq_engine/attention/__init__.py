"""Attention types, metadata and backends (torch on CPU, xformers on CUDA)."""
