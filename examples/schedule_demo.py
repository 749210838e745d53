"""Runs the real Scheduler and BlockSpaceManager on synthetic encoder/decoder requests with a fake model."""
import argparse
import itertools
import random
import sys

from seq2seq_engine.config import CacheConfig, SchedulerConfig
from seq2seq_engine.core.scheduler import Scheduler
from seq2seq_engine.inputs.data import EncoderDecoderInputs, SingletonInputs
from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.sequence import Sequence, SequenceGroup, SequenceStatus


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-requests", type=int, default=8)
    parser.add_argument("--num-gpu-blocks", type=int, default=24, help="device pool (also the CPU swap pool size)")
    parser.add_argument("--block-size", type=int, default=4)
    parser.add_argument("--preemption-mode", choices=["recompute", "swap"], default="recompute")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def make_requests(args: argparse.Namespace) -> list:
    """Requests with 1-8 decoder prompt tokens, 4-40 encoder tokens and 4-24 tokens to generate."""
    rng, seq_ids = random.Random(args.seed), itertools.count()
    groups = []
    for i in range(args.num_requests):
        decoder = SingletonInputs(prompt_token_ids=[2] + [7] * rng.randint(0, 7))
        encoder = SingletonInputs(prompt_token_ids=[5] * rng.randint(4, 40))
        params = SamplingParams(temperature=0.0, max_tokens=rng.randint(4, 24), ignore_eos=True)
        seq, encoder_seq = (Sequence(next(seq_ids), part, args.block_size) for part in (decoder, encoder))
        groups.append(SequenceGroup(f"r{i}", [seq], float(i), params, encoder_seq,
                                    EncoderDecoderInputs(decoder=decoder, encoder=encoder)))
    return groups


def run_step(scheduler: Scheduler, step: int) -> int:
    """Schedule, let the fake model append token 11 to every sampled sequence, free finished; print the step."""
    metadata_list, out = scheduler.schedule()
    for metadata, scheduled in zip(metadata_list, out.scheduled_seq_groups):
        group = scheduled.seq_group
        group.update_num_computed_tokens(scheduled.token_chunk_size)
        for seq in group.get_seqs(SequenceStatus.RUNNING) if metadata.do_sample else []:
            seq.append_token_id(11, {11: 0.0})
            if seq.get_output_len() >= group.sampling_params.max_tokens:
                seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED
                scheduler.free_seq(seq)
    names = [s.seq_group.request_id for s in out.scheduled_seq_groups]
    bm = scheduler.block_manager
    print(f"step {step:3d} | prefill {','.join(names[:out.num_prefill_groups]) or '-':<12} "
          f"decode {','.join(names[out.num_prefill_groups:]) or '-':<24} | tokens {out.num_batched_tokens:3d} "
          f"enc {out.num_encoder_tokens:3d} | preempted {out.preempted} swap out/in "
          f"{len(out.blocks_to_swap_out)}/{len(out.blocks_to_swap_in)} | free gpu {bm.get_num_free_gpu_blocks():3d} "
          f"cpu {bm.get_num_free_cpu_blocks():3d}")
    for group in out.ignored_seq_groups:
        print(f"         ignored {group.request_id}: {group.ignored_reason}")
    scheduler.free_finished_seq_groups()
    return out.preempted


def main(argv=None) -> int:
    args = parse_args(argv)
    cache = CacheConfig(block_size=args.block_size, num_gpu_blocks=args.num_gpu_blocks,
                        num_cpu_blocks=args.num_gpu_blocks)
    config = SchedulerConfig(max_num_batched_tokens=128, max_num_seqs=16, max_model_len=64, max_encoder_len=64,
                             preemption_mode=args.preemption_mode)
    scheduler = Scheduler(config, cache)
    groups = make_requests(args)
    for group in groups:
        scheduler.add_seq_group(group)
    steps = preemptions = 0
    while scheduler.has_unfinished_seqs() and steps < 10_000:
        steps += 1
        preemptions += run_step(scheduler, steps)
    bm = scheduler.block_manager
    leaked = (bm.num_total_gpu_blocks - bm.get_num_free_gpu_blocks() + bm.num_total_cpu_blocks
              - bm.get_num_free_cpu_blocks() + len(bm.block_tables) + len(bm.cross_block_tables))
    finished = sum(g.first_seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED for g in groups)
    generated = sum(g.first_seq.get_output_len() for g in groups)
    print(f"summary: {len(groups)} requests, {finished} finished, {len(groups) - finished} ignored, {steps} steps, "
          f"{generated} tokens generated, {preemptions} preemptions ({args.preemption_mode}), "
          f"unfinished {scheduler.get_num_unfinished_seq_groups()}, leaked blocks/tables {leaked}")
    return 1 if leaked or scheduler.has_unfinished_seqs() else 0


if __name__ == "__main__":
    sys.exit(main())
