"""The `--ray [ADDRESS]` flags of `seq2seq-engine transcribe|generate|summarize|translate`: the same job on a Ray
cluster (integrations/ray_jobs.py), its results handed back to the single-machine output writers."""
from __future__ import annotations

import argparse
import os
from typing import Any, Dict, Iterator, List, Sequence, Tuple

from seq2seq_engine.entrypoints.audio_files import AudioJob
from seq2seq_engine.entrypoints.engine_flags import lora_request_from_args
from seq2seq_engine.output_records import output_record
from seq2seq_engine.transcription.options import TranscriptionOptions
from seq2seq_engine.transcription.output.results import TranscriptionResult

# Rows per batch handed to a replica: each batch is one continuous batch in its engine.
DEFAULT_BATCH_SIZE = {"transcribe": 8, "text": 256}


def add_ray_arguments(parser: argparse.ArgumentParser, default_batch_size: int) -> None:
    from seq2seq_engine.integrations.ray_jobs import LOCAL, RAY_INSTALL_HINT

    group = parser.add_argument_group("Ray", f"run on a Ray cluster, one engine per replica ({RAY_INSTALL_HINT})")
    group.add_argument("--ray", nargs="?", const=LOCAL, default=None, metavar="ADDRESS",
                       help="run on Ray: 'auto' = the cluster this machine belongs to, an address (HOST:6379, "
                            "ray://HOST:10001), or nothing = start Ray on this machine")
    group.add_argument("--num-replicas", type=int, default=1, help="with --ray: engines (Ray actors) at once")
    group.add_argument("--cpus-per-replica", type=float, default=1.0,
                       help="with --ray: CPUs each replica reserves (and its torch threads)")
    group.add_argument("--ray-batch-size", type=int, default=default_batch_size,
                       help=f"with --ray: inputs per batch handed to a replica (default {default_batch_size})")


def check_ray_arguments(args: argparse.Namespace) -> None:
    """With --ray: ray must be installed (RayMissingError) and the sizes valid (ValueError); the Ray flags without
    --ray are an error."""
    from seq2seq_engine.integrations.ray_jobs import import_ray

    if args.ray is None:
        given = [flag for flag, name, default in (("--num-replicas", "num_replicas", 1),
                                                  ("--cpus-per-replica", "cpus_per_replica", 1.0))
                 if getattr(args, name) != default]
        if given:
            raise ValueError(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} --ray")
        return
    _job(args)
    import_ray()


def _job(args: argparse.Namespace) -> Any:
    from seq2seq_engine.integrations.ray_jobs import RayJob
    return RayJob(address=args.ray, num_replicas=args.num_replicas, cpus_per_replica=args.cpus_per_replica,
                  batch_size=args.ray_batch_size, progress=not args.quiet)


def _lora_fields(args: argparse.Namespace) -> Dict[str, Any]:
    """ReplicaConfig's LoRA fields for --lora: the adapter every row runs with, by its --lora-name, at its absolute
    path (the replicas read it from there)."""
    lora = lora_request_from_args(args)
    return {} if lora is None else {"lora": lora.lora_name, "lora_modules": {lora.lora_name: lora.lora_path}}


def transcribe_on_ray(args: argparse.Namespace, options: TranscriptionOptions, jobs: Sequence[AudioJob],
                      engine_kwargs: Dict[str, Any]) -> Iterator[Tuple[int, TranscriptionResult]]:
    """(input index, result) for each job as the cluster finishes it; relative paths are read from this folder."""
    from seq2seq_engine.integrations.ray_data import ReplicaConfig
    from seq2seq_engine.integrations.ray_jobs import transcribe_rows
    from seq2seq_engine.integrations.rows import row_to_result

    config = ReplicaConfig(args.model, engine_kwargs, transcription=options, working_dir=os.getcwd(),
                           **_lora_fields(args))
    rows = [{"index": index, "path": job.source} for index, job in enumerate(jobs)]
    for row in transcribe_rows(_job(args), config, rows):
        yield int(row["index"]), row_to_result(row)


def generate_records_on_ray(args: argparse.Namespace, prompts: List[Any], engine_kwargs: Dict[str, Any],
                            sampling: Dict[str, Any]) -> Iterator[dict]:
    """The output record of each prompt, in input order (text_cli's records, made from the replicas' rows)."""
    from seq2seq_engine.integrations.ray_data import ReplicaConfig
    from seq2seq_engine.integrations.ray_jobs import generate_rows_in_order
    from seq2seq_engine.integrations.rows import row_to_fields

    config = ReplicaConfig(args.model, engine_kwargs, sampling=sampling, src_lang=getattr(args, "src_lang", None),
                           tgt_lang=getattr(args, "tgt_lang", None), **_lora_fields(args))
    for row in generate_rows_in_order(_job(args), config, prompts):
        yield output_record(int(row["index"]), row_to_fields(row), row.get("error"))
