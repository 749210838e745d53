"""Tokenizers: loading from a model directory and incremental detokenization of generated tokens."""
