"""seq2seq-engine: a vLLM-style inference engine for encoder/decoder (BART, Whisper) and decoder-only models."""
from seq2seq_engine.inputs import (EncoderDecoderInputs, ExplicitEncoderDecoderPrompt, TextPrompt, TokensPrompt,
                                   zip_enc_dec_prompts)
from seq2seq_engine.sampling_params import SamplingParams

__version__ = "0.1.0"

__all__ = ["EncoderDecoderInputs", "ExplicitEncoderDecoderPrompt", "SamplingParams", "TextPrompt", "TokensPrompt",
           "zip_enc_dec_prompts", "__version__"]
