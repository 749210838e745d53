"""Decode: one window's decoding: its prompt, logits processors, language detection, fallback, hallucinations."""
