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
        return cls.from_columns([params for params, _ in rows], [generator for _, generator in rows], device)

    @classmethod
    def from_columns(cls, params: Sequence[SamplingParams], generators: Sequence[Optional[torch.Generator]],
                     device: DeviceLike = "cpu") -> "SamplingMetadata":
        """Row i samples with params[i] and generators[i]. Each run of rows sharing one params object (the
        requests of one generate() call) has its values read once and repeated over the run."""
        device = torch.device(device)
        temperatures, top_ps, top_ks, min_ps, row_generators = [], [], [], [], []
        random_rows, filtered_rows, plain_rows, max_num_logprobs = [], [], [], 0
        for p, start, end in identity_runs(params):
            count = end - start
            is_greedy = p.sampling_type == SamplingType.GREEDY
            temperatures += [1.0 if is_greedy else float(p.temperature)] * count
            top_ps += [float(p.top_p)] * count
            top_k = int(p.top_k) if p.top_k is not None and p.top_k > 0 else -1
            top_ks += [top_k] * count
            min_ps += [float(p.min_p)] * count
            row_generators += [None] * count if is_greedy else generators[start:end]
            max_num_logprobs = max(max_num_logprobs, p.logprobs or 0)
            if not is_greedy:
                random_rows += range(start, end)
                (filtered_rows if top_k > 0 or p.top_p < 1.0 else plain_rows).extend(range(start, end))

        def tensor(values, dtype):
            return to_device(torch.tensor(values, dtype=dtype, device="cpu"), device)

        return cls(
            temperatures=tensor(temperatures, torch.float32), top_ps=tensor(top_ps, torch.float32),
            min_ps=tensor(min_ps, torch.float32), generators=row_generators, plain_rows=plain_rows,
            filtered_rows=filtered_rows, top_k_list=top_ks, top_p_list=top_ps, min_p_list=min_ps,
            temperature_list=temperatures, all_greedy=not random_rows, max_num_logprobs=max_num_logprobs,
            device=device)


def identity_runs(items: Sequence) -> List[Tuple[object, int, int]]:
    """(item, start, end) of each run of consecutive entries that are one object."""
    runs, start = [], 0
    for index in range(1, len(items) + 1):
        if index == len(items) or items[index] is not items[start]:
            runs.append((items[start], start, index))
            start = index
    return runs
