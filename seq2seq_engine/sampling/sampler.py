"""The sampler: greedy / random sampling with temperature, top-k, top-p and min-p, vectorised over rows.

Random rows sample with the exponential race: the token is argmax_i(w_i / q_i) with q_i ~ Exp(1) i.i.d. and
w_i proportional to the filtered probabilities (this picks token i with probability w_i / sum(w)). A row with a
generator draws its q from that generator only, always V uniforms per step, so a seeded request gets the same
tokens whatever else is in the batch.

Top-k / top-p rows are filtered without sorting the whole vocabulary: the top `kc` logits (torch.topk) are
enough when every top-k is <= kc, and for a top-p-only row when the top kc tokens already hold top_p of the mass;
rows that are not covered are redone with a larger kc (the last round is a full sort). On a GPU the first round is
the full sort: reading back which rows are covered would wait for the device.

On a GPU the sampler never waits for the device: index tensors go up from pinned memory without blocking, and
`SamplerOutput.to_host` brings a step's results down with one wait.
"""
from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Sequence

import torch
from torch import nn

from seq2seq_engine.kernels.native_greedy import greedy_logsumexp, greedy_lse_and_probs
from seq2seq_engine.sampling.metadata import SamplingMetadata, to_device

# Candidate counts tried, in order, for rows with top-p but no top-k (the last round is the whole vocabulary).
_TOP_P_CANDIDATE_ROUNDS = (256, 4096)


@dataclasses.dataclass
class PromptLogprobsOutput:
    """Logprobs of the prompt tokens scored in one step, log_softmax of the raw logits. Chunk i scores the
    decoder-prompt tokens first_token_indices[i] .. + num_tokens[i] - 1 of request request_ids[i]; the rows of
    the tensors are the chunks' tokens, in chunk order."""

    request_ids: List[str]
    first_token_indices: List[int]
    num_tokens: List[int]
    num_topk: List[int]                         # each chunk's request's prompt_logprobs
    token_ids: torch.Tensor                     # [T] the prompt tokens scored
    token_logprobs: torch.Tensor                # [T] float32
    topk_logprobs: Optional[torch.Tensor] = None    # [T, K], K = the largest num_topk (None when it is 0)
    topk_token_ids: Optional[torch.Tensor] = None   # [T, K] int64


@dataclasses.dataclass(frozen=True)
class SamplerOutput:
    sampled_token_ids: torch.Tensor             # [N] int64
    sampled_logprobs: torch.Tensor              # [N] float32: log_softmax(raw logits)[token]
    topk_logprobs: Optional[torch.Tensor] = None    # [N, K] float32, K = the most logprobs any row asked for
    topk_token_ids: Optional[torch.Tensor] = None   # [N, K] int64
    # Beam-search rows (added by the model runner): their indices among the N rows, and each row's top
    # candidates [len(beam_rows), C] of log_softmax(logits) after the logits processors.
    beam_rows: Optional[List[int]] = None
    beam_logprobs: Optional[torch.Tensor] = None
    beam_token_ids: Optional[torch.Tensor] = None
    # Prompt logprobs of the step's prefill chunks that asked for them (added by the model runner).
    prompt_logprobs: Optional[PromptLogprobsOutput] = None

    # Set by start_host_copy: the CUDA event its copies to the host were queued before.
    host_copy_done: Optional[Any] = None

    def to_host(self) -> "SamplerOutput":
        """This output with its tensors (prompt logprobs' too) on the CPU, copied without blocking and then waited
        for once: the one host sync of a GPU step. Returns self when nothing is on a CUDA device."""
        if self.host_copy_done is not None:
            self.host_copy_done.synchronize()   # this step's copies only, not the steps queued after it
            return dataclasses.replace(self, host_copy_done=None)
        moved = self._host_copies()
        if not moved:
            return self
        torch.cuda.current_stream().synchronize()
        return dataclasses.replace(self, **moved)

    def start_host_copy(self) -> "SamplerOutput":
        """This output with its tensors' copies to the host queued (not waited for); `to_host` waits for them.
        Returns self when nothing is on a CUDA device."""
        moved = self._host_copies()
        if not moved:
            return self
        done = torch.cuda.Event()
        done.record()
        return dataclasses.replace(self, host_copy_done=done, **moved)

    def _host_copies(self) -> dict:
        moved = _copies_to_host(self)
        prompt = self.prompt_logprobs
        prompt_moved = _copies_to_host(prompt) if prompt is not None else {}
        if prompt_moved:
            moved["prompt_logprobs"] = dataclasses.replace(prompt, **prompt_moved)
        return moved

    @classmethod
    def empty(cls, device: torch.device) -> "SamplerOutput":
        """No sampled row (a step of prompt chunks that sample nothing but may score prompt tokens)."""
        return cls(torch.empty(0, dtype=torch.long, device=device), torch.empty(0, device=device))


def _copies_to_host(record) -> dict:
    """Non-blocking CPU copies (into pinned memory) of a dataclass's CUDA tensor fields, by field name."""
    copies = {}
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if isinstance(value, torch.Tensor) and value.is_cuda:
            copies[field.name] = value.to("cpu", non_blocking=True)
    return copies


def _on(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`values` as a tensor on `device`, without waiting for the device (metadata.to_device)."""
    return to_device(torch.tensor(values, dtype=dtype), device)


def _uniform_rows(num_rows: int, width: int, generators: Sequence[Optional[torch.Generator]],
                  device: torch.device) -> torch.Tensor:
    """[num_rows, width] uniforms in [0, 1): row i from generators[i] when it has one, else the global RNG."""
    u = torch.empty(num_rows, width, device=device)
    if any(g is None for g in generators):
        u.uniform_()
    for i, g in enumerate(generators):
        if g is not None:
            u[i].uniform_(generator=g)
    return u


def _race(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The exponential race, in place on both arguments: argmax_i(w_i / q_i) with q_i = -log(u_i) ~ Exp(1),
    computed as argmin_i(w_i / log(u_i)) (one pass fewer). u = 0 gives q = inf, so that token loses this draw
    (probability 2**-24 per token, harmless) rather than winning it with w / 0."""
    return weights.div_(u.log_()).min(dim=-1).indices


class Sampler(nn.Module):
    """forward(logits [N, V], metadata) -> SamplerOutput."""

    def __init__(self, top_p_candidate_rounds: Sequence[int] = _TOP_P_CANDIDATE_ROUNDS) -> None:
        super().__init__()
        self.top_p_candidate_rounds = tuple(top_p_candidate_rounds)

    @torch.no_grad()
    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        if logits.dim() != 2 or logits.shape[0] != metadata.num_rows:
            raise ValueError(f"logits of shape {tuple(logits.shape)} for {metadata.num_rows} sampling rows")
        if logits.dtype != torch.float32:
            logits = logits.float()
        num_rows = logits.shape[0]
        if metadata.all_greedy:
            # One read of the logits gives the greedy tokens and lse (log_softmax(x)_i = x_i - lse).
            tokens, lse = greedy_logsumexp(logits)
        else:
            # One max and one softmax pass serve the greedy tokens, the logprobs and the untempered random rows.
            tokens, lse, probs = greedy_lse_and_probs(logits)
            if metadata.plain_rows:
                rows = self._index(metadata.plain_rows, num_rows, logits.device)
                tokens[rows] = self._sample_plain(logits, probs, metadata.plain_rows, rows, metadata)
            if metadata.filtered_rows:
                rows = self._index(metadata.filtered_rows, num_rows, logits.device)
                tokens[rows] = self._sample_filtered(logits, metadata.filtered_rows, rows, metadata)
        sampled_logprobs = logits.gather(1, tokens.unsqueeze(1)).squeeze(1) - lse
        topk_logprobs = topk_ids = None
        if metadata.max_num_logprobs > 0:
            k = min(metadata.max_num_logprobs, logits.shape[1])
            top_logits, topk_ids = logits.topk(k, dim=-1)
            topk_logprobs = top_logits - lse.unsqueeze(1)
        return SamplerOutput(tokens, sampled_logprobs, topk_logprobs, topk_ids)

    @staticmethod
    def _index(rows: List[int], num_rows: int, device: torch.device) -> Optional[torch.Tensor]:
        """An index tensor for `rows`, or a full slice when the rows are all of them in order."""
        if len(rows) == num_rows:
            return slice(None)
        return _on(rows, torch.long, device)

    # ------------------------------------------------------------------ rows without top-k / top-p
    def _sample_plain(self, logits: torch.Tensor, raw_probs: torch.Tensor, row_list: List[int], rows,
                      md: SamplingMetadata) -> torch.Tensor:
        """Rows without top-k / top-p. `raw_probs` (softmax of the raw logits) is used up in place."""
        if all(md.temperature_list[i] == 1.0 for i in row_list):
            probs = raw_probs[rows]
        else:
            probs = torch.softmax(logits[rows] / md.temperatures[rows].unsqueeze(1), dim=-1)
        if any(md.min_p_list[i] > 0.0 for i in row_list):
            threshold = probs.amax(dim=-1, keepdim=True).mul_(md.min_ps[rows].unsqueeze(1))
            probs.masked_fill_(probs < threshold, 0.0)
        u = _uniform_rows(len(row_list), probs.shape[1], [md.generators[i] for i in row_list], probs.device)
        return _race(probs, u)

    # ------------------------------------------------------------------ rows with top-k and/or top-p
    def _sample_filtered(self, logits: torch.Tensor, row_list: List[int], rows,
                         md: SamplingMetadata) -> torch.Tensor:
        vocab = logits.shape[1]
        device = logits.device
        x = logits[rows]
        if not all(md.temperature_list[i] == 1.0 for i in row_list):
            x = x / md.temperatures[rows].unsqueeze(1)
        n = len(row_list)
        has_k = [md.top_k_list[i] > 0 for i in row_list]
        ks = [min(md.top_k_list[i], vocab) if h else vocab for i, h in zip(row_list, has_k)]
        ps = [md.top_p_list[i] for i in row_list]
        # Seeded rows draw their V uniforms now, once, whatever the candidate rounds below do.
        seeded_u = {j: torch.empty(vocab, device=device).uniform_(generator=md.generators[i])
                    for j, i in enumerate(row_list) if md.generators[i] is not None}
        k_t = _on(ks, torch.long, device)
        p_t = md.top_ps[rows]
        has_k_t = _on(has_k, torch.bool, device)
        min_p_t = md.min_ps[rows] if any(md.min_p_list[i] > 0.0 for i in row_list) else None

        tokens = torch.empty(n, dtype=torch.long, device=device)
        pending = list(range(n))
        rounds = self.top_p_candidate_rounds if device.type == "cpu" else ()
        widths = [w for w in rounds if w < vocab] + [vocab]
        prev_kc = 0
        while pending:
            k_width = max((ks[j] for j in pending if has_k[j]), default=1)
            top_p_only = any(not has_k[j] for j in pending)
            kc = k_width
            if top_p_only:
                kc = max(kc, next(w for w in widths if w > prev_kc))
            prev_kc = kc = min(kc, vocab)
            sel = _on(pending, torch.long, device) if len(pending) < n else slice(None)
            chosen, covered = self._sample_candidates(
                x[sel], kc, k_t[sel], p_t[sel], has_k_t[sel], None if min_p_t is None else min_p_t[sel],
                [seeded_u.get(j) for j in pending], all_have_k=not top_p_only,
                any_top_p=any(ps[j] < 1.0 for j in pending))
            if covered is None:
                tokens[sel] = chosen
                break
            done = [r for r, ok in enumerate(covered) if ok]
            if done:
                tokens[_on([pending[r] for r in done], torch.long, device)] = chosen[_on(done, torch.long, device)]
            pending = [pending[r] for r, ok in enumerate(covered) if not ok]
        return tokens

    @staticmethod
    def _sample_candidates(xs: torch.Tensor, kc: int, k_t: torch.Tensor, p_t: torch.Tensor, has_k_t: torch.Tensor,
                           min_p_t: Optional[torch.Tensor], seeded_u: List[Optional[torch.Tensor]],
                           all_have_k: bool, any_top_p: bool):
        """Sample each row of `xs` among its top `kc` logits after top-k / top-p / min-p.

        Returns (tokens, covered): covered is None when every row is exact, else a per-row list of whether the
        row's top-p set fits in the kc candidates (rows that do not must be redone with more candidates).
        """
        vocab = xs.shape[1]
        device = xs.device
        if kc == vocab:
            vals, idx = xs.sort(dim=-1, descending=True)
        else:
            vals, idx = xs.topk(kc, dim=-1)
        keep = torch.arange(kc, device=device).unsqueeze(0) < k_t.unsqueeze(1)
        masked = vals.masked_fill(~keep, float("-inf"))
        covered = None
        if any_top_p:
            # Top-p acts on the distribution after top-k: normalise over the kept candidates for top-k rows,
            # over the whole vocabulary for the others.
            lse = masked.logsumexp(dim=-1)
            if not all_have_k:
                # logsumexp of the whole row from one softmax pass: max - log(softmax(x)_argmax).
                full_lse = vals[:, 0] - torch.softmax(xs, dim=-1).gather(1, idx[:, :1]).squeeze(1).log()
                lse = torch.where(has_k_t, lse, full_lse)
            probs = (masked - lse.unsqueeze(1)).exp_()
            cum = probs.cumsum(dim=-1)
            before = torch.zeros_like(cum)
            before[:, 1:] = cum[:, :-1]
            # The smallest prefix whose mass reaches top_p: token j stays iff the mass before it is < top_p.
            keep &= (before < p_t.unsqueeze(1)) | (p_t >= 1.0).unsqueeze(1)
            if kc < vocab and not all_have_k:
                covered = (has_k_t | (p_t >= 1.0) | (cum[:, -1] >= p_t)).tolist()
        # w = p / p_max over the kept candidates (0 elsewhere).
        w = (masked - vals[:, :1]).exp_().masked_fill_(~keep, 0.0)
        if min_p_t is not None:
            w.masked_fill_(w < min_p_t.unsqueeze(1), 0.0)
        u = torch.empty(xs.shape[0], kc, device=device)
        if any(s is None for s in seeded_u):
            u.uniform_()
        for r, s in enumerate(seeded_u):
            if s is not None:
                u[r] = s.gather(0, idx[r])
        choice = _race(w, u).unsqueeze(1)
        return idx.gather(1, choice).squeeze(1), covered
