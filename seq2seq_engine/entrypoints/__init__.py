"""User-facing entry points: the LLM class and the command line."""
