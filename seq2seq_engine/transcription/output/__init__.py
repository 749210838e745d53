"""Output: what `transcribe` returns per input, and its txt / json / srt / vtt renderings."""
