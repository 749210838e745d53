"""seq2seq-engine: a vLLM-style inference engine for encoder/decoder (BART, Whisper) and decoder-only models."""
from seq2seq_engine.platforms.cpu_policy import apply_library_caps
from seq2seq_engine.platforms.openmp import apply_openmp_defaults

apply_openmp_defaults()  # before anything imports torch (see platforms/openmp.py)
apply_library_caps()     # SEQ2SEQ_ENGINE_CPU_ISA's caps for oneDNN, MKL, fbgemm and ATen, also before torch loads

from seq2seq_engine.beam_search_params import BeamSearchParams  # noqa: E402
from seq2seq_engine.generation_defaults import GenerationDefaults  # noqa: E402
from seq2seq_engine.inputs import (EncoderDecoderInputs, ExplicitEncoderDecoderPrompt, TextPrompt,  # noqa: E402
                                   TokensPrompt, zip_enc_dec_prompts)
from seq2seq_engine.lora_request import LoRARequest  # noqa: E402
from seq2seq_engine.outputs import CompletionOutput, RequestOutput  # noqa: E402
from seq2seq_engine.sampling_params import SamplingParams  # noqa: E402

__version__ = "0.1.0"

__all__ = ["BeamSearchParams", "CompletionOutput", "EncoderDecoderInputs", "ExplicitEncoderDecoderPrompt",
           "GenerationDefaults", "LLM", "LLMEngine", "LoRARequest", "RequestOutput", "SamplingParams", "TextPrompt",
           "TokensPrompt", "zip_enc_dec_prompts", "__version__"]


def __getattr__(name):
    # LLM and LLMEngine pull in torch and the models: import them on first use, not with the package.
    if name == "LLM":
        from seq2seq_engine.entrypoints.llm import LLM
        return LLM
    if name == "LLMEngine":
        from seq2seq_engine.engine.llm_engine import LLMEngine
        return LLMEngine
    raise AttributeError(f"module 'seq2seq_engine' has no attribute {name!r}")
