"""Attention types, metadata and backends (torch on CPU, xformers on CUDA), and the Attention layer."""
from seq2seq_engine.attention.layer import Attention
from seq2seq_engine.attention.metadata import (AttentionMetadata, CrossAttentionMetadata, EncoderAttentionMetadata,
                                               SelfAttentionMetadata)
from seq2seq_engine.attention.types import AttentionType

__all__ = ["Attention", "AttentionMetadata", "AttentionType", "CrossAttentionMetadata", "EncoderAttentionMetadata",
           "SelfAttentionMetadata"]
