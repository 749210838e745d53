"""Process-wide CPU platform settings: OpenMP wait policy (set before torch loads) and glibc malloc tuning."""
