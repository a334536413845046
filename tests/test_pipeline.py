"""Pipeline schedules: pass orders, in-flight micro-batches, and step times computed by hand."""

from __future__ import annotations

import pytest
from helpers import pipeline_builder, tiny_job

from itercast.parallel.schedules import Pass, in_flight_microbatches, one_f_one_b, schedule
from itercast.sim.engine import simulate


def test_one_f_one_b_order_on_the_first_of_two_stages():
    F = lambda m: Pass(True, 0, m)  # noqa: E731
    B = lambda m: Pass(False, 0, m)  # noqa: E731
    assert one_f_one_b(0, 2, 4) == [F(0), F(1), B(0), F(2), B(1), F(3), B(2), B(3)]


@pytest.mark.parametrize("name,chunks", [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2)])
def test_every_pass_runs_once_and_forward_precedes_backward(name, chunks):
    for stage in range(4):
        passes = schedule(name, stage, 4, 8, chunks)
        assert sorted(passes) == sorted(Pass(f, c, m) for f in (True, False) for c in range(chunks) for m in range(8))
        for c in range(chunks):
            for m in range(8):
                assert passes.index(Pass(True, c, m)) < passes.index(Pass(False, c, m))


def test_in_flight_microbatches_match_megatron():
    # 1F1B: stage s holds p − s micro-batches; GPipe holds all; interleaved: p·(1 + (p−1)/(p·v)) on stage 0.
    assert [in_flight_microbatches("1f1b", s, 4, 8) for s in range(4)] == [4, 3, 2, 1]
    assert in_flight_microbatches("gpipe", 0, 4, 8) == 8
    assert in_flight_microbatches("interleaved-1f1b", 0, 4, 8, 2) == 4 * (1 + 3 / 8)


@pytest.mark.parametrize(
    "schedule_name,chunks,expected_s",
    [
        # 2 stages × 4 micro-batches, forward 1 s, backward 2 s per stage, free sends:
        ("gpipe", 1, (4 + 2 - 1) * 3.0),  # (M + p − 1)(tf + tb) = 15
        ("1f1b", 1, (4 + 2 - 1) * 3.0),  # same bubble as GPipe: 15
        ("interleaved-1f1b", 2, 4 * 3.0 + (2 - 1) * 3.0 / 2),  # M(tf+tb) + (p−1)(tf+tb)/v = 13.5
    ],
)
def test_two_stage_pipeline_step_time(schedule_name, chunks, expected_s):
    job = tiny_job(
        tensor_parallel=4, pipeline_parallel=2, virtual_pipeline=chunks, schedule=schedule_name, global_batch_size=4
    )
    assert simulate(pipeline_builder(job, 1.0, 2.0).build()).step_time_s == pytest.approx(expected_s, abs=1e-12)


def test_one_f_one_b_with_sends_traced_by_hand():
    # 0.25 s sends: traced by hand in the issue note, last backward of stage 0 ends at 16.0 s.
    job = tiny_job(tensor_parallel=4, pipeline_parallel=2, schedule="1f1b", global_batch_size=4)
    assert simulate(pipeline_builder(job, 1.0, 2.0, p2p_s=0.25).build()).step_time_s == pytest.approx(16.0)


def test_gpipe_pays_each_send_once_on_the_way_down_and_once_back():
    job = tiny_job(tensor_parallel=4, pipeline_parallel=2, schedule="gpipe", global_batch_size=4)
    assert simulate(pipeline_builder(job, 1.0, 2.0, p2p_s=0.25).build()).step_time_s == pytest.approx(15.5)


def test_four_stage_interleaving_shrinks_the_bubble_by_the_chunk_count():
    plain = tiny_job(tensor_parallel=2, pipeline_parallel=4, schedule="1f1b", global_batch_size=8)
    inter = tiny_job(
        tensor_parallel=2, pipeline_parallel=4, virtual_pipeline=2, schedule="interleaved-1f1b", global_batch_size=8
    )
    assert simulate(pipeline_builder(plain, 1.0, 2.0).build()).step_time_s == pytest.approx(8 * 3 + 3 * 3)
    assert simulate(pipeline_builder(inter, 1.0, 2.0).build()).step_time_s == pytest.approx(8 * 3 + 3 * 3 / 2)


def test_fsdp_gathers_each_unit_before_every_forward_and_backward():
    # ZeRO-3, 8 GPUs of data parallelism, 2 micro-batches; a pass has 10 units (embedding, 8 layers,
    # head), each preceded by its own parameter all-gather: 2 micro-batches × 2 passes × 10 = 40.
    from itercast.workloads.transformer import TransformerStepBuilder

    job = tiny_job(zero_stage=3, global_batch_size=16)
    g = TransformerStepBuilder(job).build()
    gathers = sum(1 for t in range(g.num_tasks) if g.names[g.name[t]].startswith("fsdp_all_gather"))
    scatters = sum(1 for t in range(g.num_tasks) if g.names[g.name[t]].startswith("grad_reduce_scatter"))
    # sharded gradients leave after every micro-batch's backward, one reduce-scatter per unit
    assert (job.num_microbatches, gathers, scatters) == (2, 40, 20)


def test_fsdp_with_pipeline_parallelism_gathers_per_stage_and_micro_batch():
    # ZeRO-3 × pp 2 (4-way DP), 4 micro-batches: stage 0 holds the embedding and 4 layers, stage 1
    # 4 layers and the head, 5 units each; every forward and backward of every micro-batch gathers
    # each unit (FSDP reshards after use): 2 stages × 4 micro-batches × 2 passes × 5 = 80 gathers,
    # and one gradient reduce-scatter per unit and micro-batch: 2 × 4 × 5 = 40.
    from itercast.workloads.transformer import TransformerStepBuilder

    job = tiny_job(zero_stage=3, pipeline_parallel=2, global_batch_size=16)
    g = TransformerStepBuilder(job).build()
    gathers = sum(1 for t in range(g.num_tasks) if g.names[g.name[t]].startswith("fsdp_all_gather"))
    scatters = sum(1 for t in range(g.num_tasks) if g.names[g.name[t]].startswith("grad_reduce_scatter"))
    assert (job.plan.dp, job.num_microbatches, gathers, scatters) == (4, 4, 80, 40)


def test_recompute_full_costs_one_more_forward():
    from itercast.predict import predict

    base = predict(tiny_job(tensor_parallel=8, global_batch_size=4))
    full = predict(tiny_job(tensor_parallel=8, global_batch_size=4, recompute="full"))
    assert full.step_time_s > base.step_time_s
    assert full.family_time_s["gemm"] == pytest.approx(base.family_time_s["gemm"] * 4 / 3, rel=0.05)
