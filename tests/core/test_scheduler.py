"""Scheduler behaviour on small pools (block size 4, 16 blocks): cross tables, preemption, fairness."""
import itertools

import pytest
from scheduler_sim import make_group, make_scheduler, run_step, run_to_completion

from seq2seq_engine.config import CacheConfig, SchedulerConfig
from seq2seq_engine.core.scheduler import Scheduler
from seq2seq_engine.sequence import SequenceStatus


def _add(scheduler, ids, specs, max_tokens=4):
    groups = []
    for i, (decoder_len, encoder_len) in enumerate(specs):
        group = make_group(f"r{i}", decoder_len, encoder_len, 4, max_tokens, ids, arrival_time=float(i))
        scheduler.add_seq_group(group)
        groups.append(group)
    return groups


def test_cross_table_exists_after_prefill_and_vanishes_after_finish():
    scheduler, ids = make_scheduler(), itertools.count()
    (group,) = _add(scheduler, ids, [(2, 10)], max_tokens=3)
    record = run_step(scheduler)
    cross = record.cross_tables["r0"]
    assert len(cross) == 3  # ceil(10 / 4)
    assert scheduler.block_manager.get_cross_block_table(group) == cross
    assert record.num_encoder_tokens == 10 and record.num_batched_tokens == 2
    second = run_step(scheduler)
    assert second.cross_tables["r0"] == cross and second.num_encoder_tokens == 0
    run_to_completion(scheduler)
    assert group.is_finished()
    assert scheduler.block_manager.get_cross_block_table(group) is None
    assert scheduler.block_manager.get_num_free_gpu_blocks() == 16


@pytest.mark.parametrize("where", ["waiting", "running", "swapped"])
def test_abort_frees_self_and_cross_blocks_wherever_the_request_is(where):
    scheduler, ids = make_scheduler(), itertools.count()
    (group,) = _add(scheduler, ids, [(5, 9)], max_tokens=8)
    if where != "waiting":
        run_step(scheduler)
        assert scheduler.block_manager.get_num_free_gpu_blocks() == 16 - 2 - 3
    if where == "swapped":
        scheduler.running.remove(group)
        _swap_out(scheduler, group)
        assert scheduler.block_manager.get_num_free_cpu_blocks() == 16 - 5
    scheduler.abort_seq_group("r0")
    assert not scheduler.has_unfinished_seqs()
    assert all(seq.status == SequenceStatus.FINISHED_ABORTED for seq in group.get_seqs())
    assert scheduler.block_manager.get_cross_block_table(group) is None
    assert scheduler.block_manager.get_num_free_gpu_blocks() == 16
    assert scheduler.block_manager.get_num_free_cpu_blocks() == 16


def _swap_out(scheduler, group):
    scheduler.block_manager.swap_out(group)
    for seq in group.get_seqs(SequenceStatus.RUNNING):
        seq.status = SequenceStatus.SWAPPED
    scheduler.swapped.append(group)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_lets_every_request_finish_in_a_pool_too_small_for_all(mode):
    # Each request needs 1 prompt block + up to 4 output blocks + 2 cross blocks; 6 of them need far more than 16.
    scheduler, ids = make_scheduler(preemption_mode=mode), itertools.count()
    groups = _add(scheduler, ids, [(3, 8)] * 6, max_tokens=14)
    records = run_to_completion(scheduler)
    assert sum(r.preempted for r in records) > 0
    assert all(g.is_finished() and g.first_seq.get_output_len() == 14 for g in groups)
    assert all(g.first_seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED for g in groups)
    assert scheduler.block_manager.get_num_free_gpu_blocks() == 16
    assert scheduler.block_manager.get_num_free_cpu_blocks() == 16
    if mode == "swap":
        assert scheduler.block_manager.cross_block_tables == {}


def test_fcfs_has_no_starvation_and_finishes_in_arrival_order():
    scheduler, ids = make_scheduler(num_gpu_blocks=8, max_num_seqs=2), itertools.count()
    groups = _add(scheduler, ids, [(4, 0)] * 6, max_tokens=6)
    finish_step = {}
    step = 0
    while scheduler.has_unfinished_seqs():
        run_step(scheduler)
        step += 1
        for group in groups:
            if group.is_finished():
                finish_step.setdefault(group.request_id, step)
        assert step < 200
    order = sorted(finish_step, key=lambda rid: (finish_step[rid], int(rid[1:])))
    assert order == [g.request_id for g in groups]


def test_priority_policy_admits_lowest_priority_value_first():
    scheduler, ids = make_scheduler(policy="priority", max_num_seqs=1), itertools.count()
    low = make_group("low", 3, 0, 4, 2, ids, arrival_time=0.0, priority=5)
    high = make_group("high", 3, 0, 4, 2, ids, arrival_time=1.0, priority=0)
    scheduler.add_seq_group(low)
    scheduler.add_seq_group(high)
    assert run_step(scheduler).scheduled_ids == ["high"]


def test_decodes_come_before_new_prefills_and_batch_is_prefills_first():
    scheduler, ids = make_scheduler(), itertools.count()
    _add(scheduler, ids, [(3, 4)], max_tokens=5)
    run_step(scheduler)
    late = make_group("late", 2, 4, 4, 5, ids, arrival_time=9.0)
    scheduler.add_seq_group(late)
    record = run_step(scheduler)
    assert record.scheduled_ids == ["late", "r0"]
    assert record.prefill_ids == ["late"]
    assert record.num_batched_tokens == 2 + 1 and record.num_encoder_tokens == 4


def test_token_budget_counts_encoder_tokens_and_limits_prefills():
    scheduler, ids = make_scheduler(max_num_batched_tokens=40, max_model_len=32, max_encoder_len=32), itertools.count()
    _add(scheduler, ids, [(2, 16)] * 3, max_tokens=2)
    first = run_step(scheduler)
    assert first.scheduled_ids == ["r0", "r1"]  # 3 × 18 tokens would exceed 40
    assert first.num_batched_tokens + first.num_encoder_tokens <= 40


def test_max_num_seqs_caps_the_batch():
    scheduler, ids = make_scheduler(max_num_seqs=2), itertools.count()
    _add(scheduler, ids, [(2, 0)] * 4, max_tokens=3)
    assert all(r.num_seqs <= 2 for r in run_to_completion(scheduler))


def test_too_long_requests_are_ignored_with_a_reason_not_dropped():
    scheduler, ids = make_scheduler(num_gpu_blocks=4, max_model_len=64), itertools.count()
    big = make_group("big", 20, 0, 4, 2, ids)  # 5 blocks > 4-block pool
    ok = make_group("ok", 3, 0, 4, 2, ids, arrival_time=1.0)
    scheduler.add_seq_group(big)
    scheduler.add_seq_group(ok)
    record = run_step(scheduler)
    assert record.ignored_ids == ["big"] and record.scheduled_ids == ["ok"]
    assert "KV-cache blocks" in big.ignored_reason
    assert big.first_seq.status == SequenceStatus.FINISHED_IGNORED
    assert SequenceStatus.get_finished_reason(big.first_seq.status) == "length"
    long_encoder = make_group("enc", 2, 65, 4, 2, ids, arrival_time=2.0)
    scheduler.add_seq_group(long_encoder)
    assert run_step(scheduler).ignored_ids == ["enc"]
    assert "max_encoder_len=64" in long_encoder.ignored_reason


def test_chunked_prefill_splits_decoder_only_prompts_but_never_an_encoder():
    scheduler, ids = make_scheduler(max_num_batched_tokens=8, enable_chunked_prefill=True,
                                    max_model_len=64, max_encoder_len=64), itertools.count()
    dec_only = make_group("dec", 20, 0, 4, 2, ids)
    scheduler.add_seq_group(dec_only)
    chunks = []
    while dec_only.is_prefill():
        metadata, outputs = scheduler.schedule()
        chunks.append(outputs.scheduled_seq_groups[0].token_chunk_size)
        assert metadata[0].do_sample == (sum(chunks) == 20)
        dec_only.update_num_computed_tokens(chunks[-1])
    assert chunks == [8, 8, 4]
    scheduler.abort_seq_group("dec")
    enc_dec = make_group("encdec", 3, 7, 4, 2, ids)
    scheduler.add_seq_group(enc_dec)
    _, outputs = scheduler.schedule()
    assert outputs.scheduled_seq_groups == []  # 3 + 7 > 8: waits rather than chunking the encoder ...
    assert outputs.ignored_seq_groups == [enc_dec]  # ... and as it never fits, it is ignored with a reason
    assert "max_num_batched_tokens=8" in enc_dec.ignored_reason


def test_scheduler_requires_block_counts():
    with pytest.raises(ValueError, match="num_gpu_blocks"):
        Scheduler(SchedulerConfig(), CacheConfig())
