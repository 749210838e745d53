"""Prompt types, parsing and preprocessing into EncoderDecoderInputs."""
from seq2seq_engine.inputs.data import (EncoderDecoderInputs, ExplicitEncoderDecoderPrompt, PromptType,
                                        SingletonInputs, SingletonPrompt, TextPrompt, TokensPrompt,
                                        zip_enc_dec_prompts)

__all__ = ["EncoderDecoderInputs", "ExplicitEncoderDecoderPrompt", "PromptType", "SingletonInputs",
           "SingletonPrompt", "TextPrompt", "TokensPrompt", "zip_enc_dec_prompts"]
