"""Per-step sampling metadata: the sampling parameters of every sampled row, as tensors, built once per step."""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple, Union

import torch

from seq2seq_engine.sampling_params import SamplingParams, SamplingType

DeviceLike = Union[str, torch.device]


def to_device(tensor: torch.Tensor, device: DeviceLike) -> torch.Tensor:
    """A CPU tensor on `device` without waiting for the device: on CUDA staged through pinned memory and copied
    with non_blocking=True (a plain copy from pageable memory synchronises the stream); unchanged on the CPU."""
    device = torch.device(device)
    if device.type == "cpu":
        return tensor
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def make_generator(seed: int, device: DeviceLike = "cpu") -> torch.Generator:
    """A torch.Generator on `device` seeded with `seed`: a seeded request draws its sampling noise from it,
    so its tokens do not depend on the other requests in the batch."""
    generator = torch.Generator(device=torch.device(device))
    generator.manual_seed(int(seed))
    return generator


@dataclasses.dataclass
class SamplingMetadata:
    """Sampling parameters of the N rows of one step's logits (one row per sampled sequence).

    Tensors are [N] and live on `device`; row index lists and Python copies of the parameters are kept
    too, so the sampler can choose its code path without reading tensors back from the device.
    Greedy rows get temperature 1.0 in `temperatures` (they are never divided by it).
    """

    temperatures: torch.Tensor          # [N] float32
    top_ps: torch.Tensor                # [N] float32 (1.0: disabled)
    min_ps: torch.Tensor                # [N] float32 (0.0: disabled)
    generators: List[Optional[torch.Generator]]   # per row; None: the global RNG
    # Random rows split by whether they need the sorted (top-k / top-p) path.
    plain_rows: List[int]
    filtered_rows: List[int]
    top_k_list: List[int]               # -1: disabled
    top_p_list: List[float]
    min_p_list: List[float]
    temperature_list: List[float]
    all_greedy: bool
    max_num_logprobs: int               # 0 when no row asked for top logprobs
    device: torch.device

    @property
    def num_rows(self) -> int:
        return len(self.generators)

    @classmethod
    def build(cls, rows: Sequence[Tuple[SamplingParams, Optional[torch.Generator]]],
              device: DeviceLike = "cpu") -> "SamplingMetadata":
        device = torch.device(device)
        temperatures, top_ps, top_ks, min_ps, generators, greedy, num_logprobs = [], [], [], [], [], [], []
        for params, generator in rows:
            is_greedy = params.sampling_type == SamplingType.GREEDY
            greedy.append(is_greedy)
            temperatures.append(1.0 if is_greedy else float(params.temperature))
            top_ps.append(float(params.top_p))
            top_ks.append(int(params.top_k) if params.top_k is not None and params.top_k > 0 else -1)
            min_ps.append(float(params.min_p))
            generators.append(None if is_greedy else generator)
            num_logprobs.append(params.logprobs)
        random_rows = [i for i, g in enumerate(greedy) if not g]
        filtered_rows = [i for i in random_rows if top_ks[i] > 0 or top_ps[i] < 1.0]
        filtered = set(filtered_rows)
        plain_rows = [i for i in random_rows if i not in filtered]
        requested = [n for n in num_logprobs if n]

        def tensor(values, dtype):
            return to_device(torch.tensor(values, dtype=dtype, device="cpu"), device)

        return cls(
            temperatures=tensor(temperatures, torch.float32), top_ps=tensor(top_ps, torch.float32),
            min_ps=tensor(min_ps, torch.float32), generators=generators, plain_rows=plain_rows,
            filtered_rows=filtered_rows, top_k_list=top_ks, top_p_list=top_ps, min_p_list=min_ps,
            temperature_list=temperatures, all_greedy=not random_rows, max_num_logprobs=max(requested, default=0),
            device=device)
