"""Model definitions (BART, Whisper, decoder-only) built on the engine's Attention layer."""
