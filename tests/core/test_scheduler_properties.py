"""Hypothesis: random workloads through the scheduler keep budgets and block accounting, and all finish; requests
may hold several sampled sequences (best_of) or run a beam search (beams fork and die, sharing blocks)."""
import itertools
import math
import random
from collections import Counter

from hypothesis import given, settings, strategies as st
from scheduler_sim import EOS, make_beam_processor, make_group, make_scheduler, run_step

from seq2seq_engine.sequence import SequenceStatus

BLOCK_SIZE = 4

# (decoder len, encoder len, max_tokens, priority, kind, width): kind "n" samples `width` sequences (best_of),
# "beam" runs a beam search of that width.
request_spec = st.tuples(st.integers(1, 24), st.one_of(st.just(0), st.integers(1, 24)), st.integers(1, 12),
                         st.integers(0, 3), st.sampled_from(["n", "beam"]), st.integers(1, 3))
workload = st.fixed_dictionaries({
    "requests": st.lists(request_spec, min_size=1, max_size=12),
    "num_gpu_blocks": st.integers(8, 40),
    "num_cpu_blocks": st.integers(0, 40),
    "max_num_seqs": st.integers(1, 6),
    "max_num_batched_tokens": st.integers(8, 96),  # below 48 (the longest prompt) only with chunked prefill
    "preemption_mode": st.sampled_from(["recompute", "swap"]),
    "policy": st.sampled_from(["fcfs", "priority"]),
    "enable_chunked_prefill": st.booleans(),
    "abort_at": st.lists(st.tuples(st.integers(0, 40), st.integers(0, 11)), max_size=3),
    "seed": st.integers(0, 2**16),
})


def _check_step(scheduler, record, config):
    assert record.num_batched_tokens + record.num_encoder_tokens <= config["max_num_batched_tokens"]
    assert record.num_seqs <= config["max_num_seqs"]
    assert len(set(record.scheduled_ids)) == len(record.scheduled_ids)
    manager = scheduler.block_manager
    held_gpu, held_cpu = set(), set()
    holders, blocks = Counter(), {}
    for table in list(manager.block_tables.values()) + list(manager.cross_block_tables.values()):
        for block in table:
            holders[id(block)] += 1
            blocks[id(block)] = block
    for key, block in blocks.items():
        assert block.ref_count == holders[key]  # shared (forked) blocks count every table holding them
        held = held_gpu if block.device.name == "GPU" else held_cpu
        assert block.block_number not in held, "two block objects have one number"
        held.add(block.block_number)
    assert manager.get_num_free_gpu_blocks() == config["num_gpu_blocks"] - len(held_gpu)
    assert manager.get_num_free_cpu_blocks() == config["num_cpu_blocks"] - len(held_cpu)
    for group in scheduler.running:
        for seq in group.get_seqs(SequenceStatus.RUNNING):
            assert len(manager.block_tables[seq.seq_id]) * BLOCK_SIZE >= seq.data.get_num_computed_tokens()
        if group.encoder_len > 0:
            assert len(manager.cross_block_tables[group.request_id]) == math.ceil(group.encoder_len / BLOCK_SIZE)
        if group.beam_search is not None and not group.is_prefill():
            assert group.num_unfinished_seqs() <= group.beam_search.spec.beam_width


@settings(max_examples=150, deadline=None)
@given(workload)
def test_random_workloads_finish_within_budgets_and_return_every_block(config):
    if not config["enable_chunked_prefill"]:
        config = dict(config, max_num_batched_tokens=max(config["max_num_batched_tokens"], 48))
    scheduler = make_scheduler(
        num_gpu_blocks=config["num_gpu_blocks"], num_cpu_blocks=config["num_cpu_blocks"], block_size=BLOCK_SIZE,
        max_num_seqs=config["max_num_seqs"], max_num_batched_tokens=config["max_num_batched_tokens"],
        preemption_mode=config["preemption_mode"], policy=config["policy"],
        enable_chunked_prefill=config["enable_chunked_prefill"], max_model_len=48, max_encoder_len=48)
    ids = itertools.count()
    groups = []
    for i, (dec, enc, max_tokens, prio, kind, width) in enumerate(config["requests"]):
        # The engine refuses widths above max_num_seqs at request time.
        width = min(width, config["max_num_seqs"])
        groups.append(make_group(f"r{i}", dec, enc, BLOCK_SIZE, max_tokens, ids, arrival_time=float(i),
                                 priority=prio, best_of=width if kind == "n" else 1,
                                 beam_width=width if kind == "beam" else 0, max_model_len=48))
    for group in groups:
        scheduler.add_seq_group(group)
    aborts = {step: f"r{index}" for step, index in config["abort_at"]}
    beam_processor, rng = make_beam_processor(scheduler, ids), random.Random(config["seed"])
    step = 0
    while scheduler.has_unfinished_seqs():
        if step in aborts:
            scheduler.abort_seq_group(aborts[step])
        record = run_step(scheduler, beam_processor=beam_processor, rng=rng)
        _check_step(scheduler, record, config)
        step += 1
        assert step < 2000, "scheduler made no progress"
    for group in groups:
        _check_finished(group, aborts)
    assert scheduler.block_manager.get_num_free_gpu_blocks() == config["num_gpu_blocks"]
    assert scheduler.block_manager.get_num_free_cpu_blocks() == config["num_cpu_blocks"]
    assert not scheduler.block_manager.block_tables and not scheduler.block_manager.cross_block_tables


def _check_finished(group, aborts):
    statuses = {seq.status for seq in group.get_seqs()}
    assert all(SequenceStatus.is_finished(status) for status in statuses)
    if SequenceStatus.FINISHED_IGNORED in statuses:
        assert group.ignored_reason
    elif SequenceStatus.FINISHED_ABORTED in statuses:
        assert group.request_id in aborts.values()
    elif group.beam_search is not None:
        assert group.beam_search.finished and group.num_seqs() == group.beam_search.spec.beam_width
        for seq in group.get_seqs():
            if seq.status == SequenceStatus.FINISHED_STOPPED:
                assert seq.get_last_token_id() == EOS
            else:
                assert seq.get_output_len() == group.sampling_params.max_tokens
    else:
        assert group.num_seqs() == group.sampling_params.best_of
        assert all(seq.get_output_len() == group.sampling_params.max_tokens for seq in group.get_seqs())
