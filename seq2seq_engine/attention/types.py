"""Attention types: which tokens give Q and K/V, and which cache a layer uses (docs/architecture.md §6)."""
import enum


class AttentionType(enum.Enum):
    ENCODER = "encoder"                  # encoder tokens attend to encoder tokens; no cache
    DECODER = "decoder"                  # decoder tokens attend causally to decoder tokens; self blocks
    ENCODER_DECODER = "encoder_decoder"  # decoder tokens attend to the encoder output; cross blocks
