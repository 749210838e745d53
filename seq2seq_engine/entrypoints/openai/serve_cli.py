"""`seq2seq-engine serve MODEL [MODEL ...] [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--max-upload-mb 25]
[--max-audio-seconds 10800] [--max-realtime-sessions 64] [--no-ui] [--enable-lora --lora-modules NAME=PATH ...
[--allow-runtime-lora-updating]] [engine flags]`: the OpenAI-compatible HTTP server (endpoints: README "Serving")
and its browser page at /. Several models share one server, one address and the process's cores; requests pick
theirs by `model`."""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Dict, Tuple

from seq2seq_engine.entrypoints.engine_flags import SWITCH_FLAG_NAMES, add_precision_arguments
from seq2seq_engine.entrypoints.openai.lora_registry import (RUNTIME_UPDATING_ENV, check_lora_modules, load_adapters,
                                                             parse_lora_module, runtime_updating_allowed)

EXIT_OK, EXIT_USAGE = 0, 2


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    configure_parser(parser)
    return parser


def configure_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("model", metavar="MODEL", nargs="+",
                        help="model directory, CTranslate2 Whisper directory, GGUF file or packaged name "
                             "(smollm2-135m, whisper-tiny.en, whisper-base); several serve side by side, each with "
                             "the engine flags below (its own KV cache of --kv-cache-space-gb)")
    parser.add_argument("--served-model-name", nargs="+", default=None,
                        help="the names clients send as `model`, one per MODEL (default: each MODEL)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' on every route but /health and /metrics")
    parser.add_argument("--max-upload-mb", type=float, default=25.0, help="largest request body (audio uploads)")
    parser.add_argument("--max-audio-seconds", type=float, default=3 * 3600.0,
                        help="longest audio an upload may hold once decoded (default 10800: 3 hours; inf: no limit); "
                             "longer uploads get a 413 before they are transcribed")
    parser.add_argument("--max-realtime-sessions", type=int, default=64,
                        help="most /v1/realtime transcription sessions open at once, all models together (default "
                             "64); one more gets an error event and is closed (1013: try again later)")
    parser.add_argument("--no-ui", dest="ui", action="store_false",
                        help="do not serve the browser page at / (then / is a 404 like any unknown path)")
    engine = parser.add_argument_group("engine")
    add_precision_arguments(engine)
    engine.add_argument("--seed", type=int, default=0)
    engine.add_argument("--block-size", type=int, default=16)
    engine.add_argument("--kv-cache-space-gb", type=float, default=4.0)
    engine.add_argument("--swap-space-gb", type=float, default=1.0)
    engine.add_argument("--max-num-seqs", type=int, default=256)
    engine.add_argument("--max-num-batched-tokens", type=int, default=None)
    engine.add_argument("--max-model-len", type=int, default=None)
    engine.add_argument("--max-logprobs", type=int, default=20)
    engine.add_argument("--enable-chunked-prefill", action="store_true")
    engine.add_argument("--preemption-mode", default="recompute", choices=["recompute", "swap"])
    _add_lora_arguments(parser, engine)
    return parser


def _lora_module(text: str) -> Any:
    try:
        return parse_lora_module(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _add_lora_arguments(parser: argparse.ArgumentParser, flags: Any) -> None:
    """vLLM's LoRA flags: the engine's (--enable-lora, --max-loras, ...) and the adapters the server serves."""
    flags.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters on the models")
    flags.add_argument("--max-loras", type=int, default=1, help="adapters one engine step may mix (default 1)")
    flags.add_argument("--max-lora-rank", type=int, default=16,
                       help="highest adapter rank: 8, 16, 32, 64, 128 or 256 (default 16)")
    flags.add_argument("--max-cpu-loras", type=int, default=None,
                       help="adapters kept read in host memory (default: --max-loras)")
    group = parser.add_argument_group("LoRA adapters")
    group.add_argument("--lora-modules", nargs="+", type=_lora_module, default=[], metavar="NAME=PATH",
                       help="PEFT adapter directories served as models named NAME, on the first MODEL, or as JSON "
                            '\'{"name": ..., "path": ..., "base_model_name": ...}\' on the model named; needs '
                            "--enable-lora")
    group.add_argument("--allow-runtime-lora-updating", action="store_true",
                       help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (also: "
                            f"{RUNTIME_UPDATING_ENV[0]}=true or {RUNTIME_UPDATING_ENV[1]}=true); reads any adapter "
                            "directory this process can read: for trusted clients only")


def engine_kwargs(args: argparse.Namespace) -> dict:
    names = ("dtype", "quantization", "kv_cache_dtype", "device", "seed", "block_size", "kv_cache_space_gb",
             "swap_space_gb", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "max_logprobs",
             "enable_chunked_prefill", "preemption_mode", "enforce_eager", "enable_lora", "max_loras",
             "max_lora_rank", "max_cpu_loras") + SWITCH_FLAG_NAMES
    return {name: getattr(args, name) for name in names}


def served_names(args: argparse.Namespace) -> list:
    """The name of each MODEL as clients send it; ValueError unless one per model, all different."""
    names = args.served_model_name or args.model
    if len(names) != len(args.model):
        raise ValueError(f"--served-model-name needs one name per MODEL: {len(args.model)} models, "
                         f"{len(names)} names")
    if len(set(names)) != len(names):
        raise ValueError(f"each served model needs its own name, got {names}; set --served-model-name")
    return list(names)


def server_settings(args: argparse.Namespace) -> Any:
    """The ServerSettings of parsed flags; ValueError for a value out of range."""
    from seq2seq_engine.entrypoints.openai.state import ServerSettings

    return ServerSettings(args.host, args.port, args.api_key, int(args.max_upload_mb * 1024 * 1024),
                          args.max_audio_seconds, args.max_realtime_sessions,
                          runtime_updating_allowed(args.allow_runtime_lora_updating), ui=args.ui)


def build(args: argparse.Namespace) -> Tuple[Dict[str, Any], Any, Any]:
    """(engines by served name, ServerSettings, LoRARegistry) of parsed flags: every engine built and every
    --lora-modules adapter read into its base model's engine; ValueError, TypeError or FileNotFoundError naming
    what is wrong."""
    from seq2seq_engine.engine.arg_utils import EngineArgs
    from seq2seq_engine.engine.llm_engine import LLMEngine

    names = served_names(args)
    modules = check_lora_modules(args.lora_modules, names, args.enable_lora)  # before any model is loaded
    settings = server_settings(args)
    engines = {name: LLMEngine.from_engine_args(EngineArgs(model=model, **engine_kwargs(args)))
               for name, model in zip(names, args.model)}
    return engines, settings, load_adapters(engines, modules)


def run(args: argparse.Namespace) -> int:
    from seq2seq_engine.entrypoints.openai.server import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        engines, settings, loras = build(args)
    except (ValueError, TypeError, FileNotFoundError) as error:
        sys.stderr.write(f"seq2seq-engine serve: error: {error}\n")
        return EXIT_USAGE
    try:
        serve(engines, settings, loras)
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled, once the server has stopped
        pass
    return EXIT_OK
