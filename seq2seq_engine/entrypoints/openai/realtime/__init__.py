"""WebSocket /v1/realtime?intent=transcription: the route, each socket's handler, its session and OpenAI's events."""
