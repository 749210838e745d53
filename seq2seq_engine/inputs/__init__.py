"""Prompt types, parsing and preprocessing into EncoderDecoderInputs."""
from seq2seq_engine.inputs.data import (EncoderDecoderInputs, ExplicitEncoderDecoderPrompt, PromptType, SingletonInputs,
                                        SingletonPrompt, TextPrompt, TokensPrompt, zip_enc_dec_prompts)
from seq2seq_engine.inputs.parse import (ParsedExplicitPrompt, ParsedPrompt, ParsedSingletonPrompt,
                                         is_explicit_encoder_decoder_prompt, parse_explicit_prompt,
                                         parse_multi_modal_data, parse_prompt, parse_singleton_prompt, parse_token_ids)
from seq2seq_engine.inputs.preprocess import InputPreprocessor

__all__ = ["EncoderDecoderInputs", "ExplicitEncoderDecoderPrompt", "PromptType", "SingletonInputs",
           "SingletonPrompt", "TextPrompt", "TokensPrompt", "zip_enc_dec_prompts",
           "ParsedExplicitPrompt", "ParsedPrompt", "ParsedSingletonPrompt", "is_explicit_encoder_decoder_prompt",
           "parse_explicit_prompt", "parse_multi_modal_data", "parse_prompt", "parse_singleton_prompt",
           "parse_token_ids", "InputPreprocessor"]
