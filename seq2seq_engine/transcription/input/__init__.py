"""Input: each input's audio as the 30 s windows the engine decodes (streamed cuts, clip spans, VAD-packed speech)."""
