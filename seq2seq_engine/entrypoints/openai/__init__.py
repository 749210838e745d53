"""The OpenAI-compatible HTTP server (`seq2seq-engine serve MODEL`): FastAPI on uvicorn over one engine loop thread."""
