"""Running rows through TranscribeBatch / GenerateBatch on a Ray cluster from a driver: connect, map, collect."""
from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Dict, Iterator, List, Optional

from seq2seq_engine.integrations.ray_data import GenerateBatch, ReplicaConfig, TranscribeBatch

RAY_INSTALL_HINT = "pip install seq2seq-engine[ray]"
LOCAL = "local"  # `--ray` without an address: start a Ray instance on this machine


class RayMissingError(RuntimeError):
    """`ray` (with Ray Data) is not installed."""


class RayJobError(RuntimeError):
    """The Ray job failed as a whole: no cluster at the address, a replica that could not start (e.g. the model is
    missing on its node), or a batch that failed on every retry. The message ends with the underlying error."""


def _root_cause(error: BaseException) -> str:
    """The last `SomeError: message` line of a Ray error's text (the replica's own exception), else its first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    causes = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
    return causes[-1] if causes else (lines[0] if lines else type(error).__name__)


def import_ray() -> Any:
    """The `ray` module with Ray Data loaded; RayMissingError naming the pip command when it is not installed."""
    try:
        import ray
        import ray.data  # noqa: F401  (Ray Data is the `ray[data]` extra)
    except ImportError as error:
        raise RayMissingError(f"running on Ray needs the ray package with Ray Data ({error}): "
                              f"{RAY_INSTALL_HINT}") from None
    return ray


@dataclasses.dataclass(frozen=True)
class RayJob:
    """Where and how wide a job runs: `address` ("auto": the cluster this machine belongs to; LOCAL: a new local
    Ray instance; else a cluster address such as "10.0.0.1:6379" or "ray://head:10001"), `num_replicas` (actors,
    one engine each), `cpus_per_replica` (Ray CPUs each actor reserves; also its torch threads), `gpus_per_replica`
    (Ray GPUs each actor reserves; None: 1 when the replicas' engines run on CUDA, else 0), `batch_size` (rows per
    batch handed to an actor), `progress` (Ray Data's progress bars)."""

    address: str = LOCAL
    num_replicas: int = 1
    cpus_per_replica: float = 1.0
    batch_size: int = 16
    progress: bool = True
    gpus_per_replica: Optional[float] = None

    def __post_init__(self) -> None:
        if not isinstance(self.num_replicas, int) or self.num_replicas < 1:
            raise ValueError(f"num_replicas (--num-replicas) must be an int >= 1, got {self.num_replicas!r}")
        if not self.cpus_per_replica > 0:
            raise ValueError(f"cpus_per_replica (--cpus-per-replica) must be > 0, got {self.cpus_per_replica!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {self.batch_size!r}")
        if self.gpus_per_replica is not None and not (isinstance(self.gpus_per_replica, (int, float))
                                                      and self.gpus_per_replica >= 0):
            raise ValueError(f"gpus_per_replica must be a number >= 0, got {self.gpus_per_replica!r}")

    def replica_gpus(self, config: ReplicaConfig) -> float:
        """The GPUs each replica reserves: `gpus_per_replica`, or by default 1 when `config`'s engines run on CUDA
        (engine_kwargs device "cuda" or "cuda:N") and 0 otherwise ("auto" reserves none: a replica on a node whose
        GPUs Ray gave to others would find them taken)."""
        if self.gpus_per_replica is not None:
            return float(self.gpus_per_replica)
        device = str(config.engine_kwargs.get("device") or "")
        return 1.0 if device == "cuda" or device.startswith("cuda:") else 0.0


def connect(job: RayJob) -> None:
    """Join the cluster at `job.address` (or start a local instance), unless this process is connected already."""
    ray = import_ray()
    if ray.is_initialized():
        return
    try:
        if job.address == LOCAL:
            ray.init(include_dashboard=False, log_to_driver=job.progress)
        else:
            ray.init(address=job.address, log_to_driver=job.progress)
    except (ConnectionError, RuntimeError, ValueError) as error:  # no cluster there, or a malformed address
        where = "start Ray on this machine" if job.address == LOCAL else f"connect to the Ray cluster {job.address!r}"
        raise RayJobError(f"cannot {where}: {error}") from error
    ray.data.DataContext.get_current().enable_progress_bars = job.progress


def run_rows(job: RayJob, rows: List[Dict[str, Any]], batch_class: type, config: ReplicaConfig) -> Iterator[dict]:
    """Each output row of `batch_class` over `rows`, as the cluster finishes them (not in input order). The rows
    are cut into blocks of `job.batch_size`, which Ray Data hands to whichever replica is free; an actor that dies
    is restarted and its batch retried (Ray Data's defaults: max_restarts=-1, max_task_retries=-1)."""
    ray = import_ray()
    connect(job)
    if not rows:
        return
    dataset = ray.data.from_items(rows, override_num_blocks=math.ceil(len(rows) / job.batch_size))
    gpus = job.replica_gpus(config)
    resources = {"num_cpus": job.cpus_per_replica, **({"num_gpus": gpus} if gpus else {})}
    dataset = dataset.map_batches(batch_class, fn_constructor_kwargs={"config": config},
                                  compute=ray.data.ActorPoolStrategy(size=job.num_replicas),
                                  batch_size=job.batch_size, **resources)
    try:
        yield from dataset.iter_rows()
    except ray.exceptions.RayError as error:
        raise RayJobError(f"the Ray job failed: {_root_cause(error)}") from error


def transcribe_rows(job: RayJob, config: ReplicaConfig, rows: List[Dict[str, Any]]) -> Iterator[dict]:
    """Audio rows (each with an `index` column to find its input by) through TranscribeBatch."""
    return run_rows(job, rows, TranscribeBatch, config)


def generate_rows_in_order(job: RayJob, config: ReplicaConfig, prompts: List[Any]) -> Iterator[dict]:
    """One output row of GenerateBatch per prompt, in input order, each as soon as it and all before it are done."""
    rows = [{"index": index, "prompt_json": json.dumps(prompt)} for index, prompt in enumerate(prompts)]
    ready: Dict[int, dict] = {}
    next_index: Optional[int] = 0
    for row in run_rows(job, rows, GenerateBatch, config):
        ready[int(row["index"])] = row
        while next_index in ready:
            yield ready.pop(next_index)
            next_index += 1
    if ready or next_index != len(rows):
        raise RuntimeError(f"the Ray job returned {next_index + len(ready)} of {len(rows)} rows")
