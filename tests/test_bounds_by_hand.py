"""Three bounds a formula can overshoot without a coarser test noticing, computed by hand: a tied
head on one stage holds no parameters of its own, the last gradient bucket hides behind the part of
the backward that follows its release, and a stage holds at most m micro-batches in flight."""

from __future__ import annotations

import numpy as np
import pytest
from test_golden import LINK, linear_calibration
from test_step_by_hand import PARAMS, job

from itercast.predict import predict
from itercast.search.fast_estimate import _bucket_tails, _exposed, _first_chunk_exposed
from itercast.search.stage_slicing import LayerCosts, slice_exact


def summed_seconds(j, prefix: str) -> float:
    """Total seconds of the step graph's tasks whose name starts with `prefix` (linear calibration)."""
    g = predict(j, linear_calibration()).sim.graph
    return sum(float(g.duration_s[t]) for t in range(g.num_tasks) if g.names[g.name[t]].startswith(prefix))


def test_zero3_on_one_stage_gathers_and_reduces_a_tied_head_once():
    # one stage, tied head: the 60,352 parameters (the final LayerNorm's 128 with them) are gathered once per pass
    # in bf16 over dp 2
    # ((n − 1)/n · 2 bytes each) and their fp32 gradients reduce-scattered once ((n − 1)/n · 4 bytes);
    # a head counted apart from the embedding would add V·h = 8,192 parameters to both
    j = job(data_parallel=2, zero_stage=3)
    assert summed_seconds(j, "fsdp_all_gather.F") == pytest.approx(1 / 2 * 2 * PARAMS / LINK)
    assert summed_seconds(j, "grad_reduce_scatter") == pytest.approx(1 / 2 * 4 * PARAMS / LINK)


def test_the_last_bucket_hides_behind_the_backward_after_its_release():
    # one chunk, 10 s of reduction in 4 buckets over an 8 s backward: bucket i is released at
    # 8·(i + 1)/4 s; on one stream the last ends at max(10/4, 10 − 8·3/4) = 4 s after the pass
    one = _exposed(np.array([10.0]), np.array([4.0]), np.array([8.0]), np.array([1]), np.array([1]))
    assert one == pytest.approx([4.0])
    # two chunks two stages apart, 2 buckets each, 3 s passes: chunk k from the end is released
    # k·2·3 s early; window 3·(2 − 1)/2 = 1.5: max(2.5, 5 − 1.5, 10 − 6 − 1.5) = 3.5
    two = _exposed(np.array([10.0]), np.array([4.0]), np.array([3.0]), np.array([2]), np.array([2]))
    assert two == pytest.approx([3.5])


def test_a_stage_holds_no_more_micro_batches_than_there_are():
    # two layers of 1 byte static and 2 bytes of activations each, 3 bytes per GPU, 2 stages, one
    # micro-batch: stage 0 holds 1 + 2·min(2, 1) = 3 bytes: it fits (with 2 in flight it would need 5)
    costs = LayerCosts.of(np.ones(2), np.zeros(2), np.ones(2), np.full(2, 2.0))
    assert slice_exact(costs, 2, 1, 3.0).boundaries == [0, 1]


def test_only_the_first_stages_first_chunk_is_split_into_buckets():
    # 8 layers, 2 stages × 2 chunks of 2 layers, a 1-parameter bucket (each unit closes one), ZeRO-1
    # over dp 2. Megatron-Core splits only stage 0's chunk 0 (embedding, layers 0-1: 3 buckets); every
    # other chunk reduces and gathers in one: 3 + 1 + 1 + 1 = 6 tasks of each kind (10 if every
    # chunk were split: 3 + 2 (layers 4-5) + 2 (layers 2-3) + 3 (layers 6-7, head))
    j = job(
        {"num_layers": 8},
        pipeline_parallel=2,
        virtual_pipeline=2,
        schedule="interleaved-1f1b",
        data_parallel=2,
        zero_stage=1,
        grad_bucket_size_params=1,
        micro_batch_size=1,
        global_batch_size=4,
    )
    g = predict(j, linear_calibration()).sim.graph
    names = [g.names[g.name[t]] for t in range(g.num_tasks)]
    assert sum(n.startswith("grad_reduce_scatter") for n in names) == 6
    assert sum(n.startswith("param_all_gather") for n in names) == 6


def test_megatron_bucketing_exposes_the_first_chunk_whole_when_interleaved():
    # 2 stages × 2 chunks, 3 s passes, a stage 4 s (pass + send) behind the one before it. Stage 0:
    # chunk 0's 5 s in 2 buckets of one 1.5 s layer each, chunk 1's 5 s in one bucket released 2·3 s
    # earlier, done 1 s before the end. Under Megatron-LM's align_grad_reduce both of chunk 0's buckets
    # leave at its end: 5 + max(0, 5 − 2·3) = 5 (released one by one it would be max(5/2, 5 − 1.5,
    # 5 + (5 − 6)) = 4). Stage 1: both chunks whole, 5, ending one hop early: 5 − 4 = 1. The excess: 5
    one = np.array([1.0])
    g = {"first_stage": 0 * one, "second_stage": one, "last_stage": one}
    g |= {f"{n}_grad0": 5 * one for n in ("first", "second", "last")}
    g |= {f"{n}_grad_later": 5 * one for n in ("first", "second", "last")}
    buckets = {"first": [(2.5, ["l"]), (2.5, ["l"])], "second": [(5.0, ["l", "l"])], "last": [(5.0, ["l", "l"])]}
    for n, chunk0 in buckets.items():
        g |= {k: v * one for k, v in _bucket_tails(f"{n}_grad", chunk0).items()}
    f = {name: (1.5 if name == "lb" else 0.0) * one for name in ("lb", "eb", "mb", "hb")}
    got = _first_chunk_exposed(g, f, "grad", 3 * one, 4 * one, 2 * one, 2 * one)
    assert got == pytest.approx([5.0])
    # the parameter gathers are released bucket by bucket as before (Megatron's forward pre-hooks): the same
    # chunk-0 buckets give max(5/2, 5 − 1.5, 5 + (5 − 6)) = 4
    g |= {f"{n}_gather0": 5 * one for n in ("first", "second", "last")}
    g |= {f"{n}_gather_later": 5 * one for n in ("first", "second", "last")}
    for n, chunk0 in buckets.items():
        g |= {k: v * one for k, v in _bucket_tails(f"{n}_gather", chunk0).items()}
    f |= {name: (1.5 if name == "lf" else 0.0) * one for name in ("lf", "ef", "mf", "hf")}
    assert _first_chunk_exposed(g, f, "gather", 3 * one, 4 * one, 2 * one, 2 * one) == pytest.approx([4.0])


def test_interleaved_first_chunks_reductions_leave_after_its_last_backward():
    # Megatron-LM's align_grad_reduce: stage 0's chunk 0 (embedding, layers 0-1: 3 one-unit buckets) starts
    # reducing only when its last backward (micro-batch 1 of 2 a rank) ends; without interleaving, the stage's
    # one chunk (embedding, layers 0-3: 5 buckets) releases its first bucket mid-pass
    plan = dict(data_parallel=2, zero_stage=1, grad_bucket_size_params=1, micro_batch_size=1, global_batch_size=4)
    for v, after_pass in ((2, True), (1, False)):
        interleaved = {"virtual_pipeline": 2, "schedule": "interleaved-1f1b"} if v == 2 else {}
        j = job({"num_layers": 8}, pipeline_parallel=2, **interleaved, **plan)
        r = predict(j, linear_calibration())
        g, start, end = r.sim.graph, r.sim.start_s, r.sim.end_s
        stage0 = [t for t in range(g.num_tasks) if g.resource_rank[g.resource[t]] == 0]
        name = {t: g.names[g.name[t]] for t in stage0}
        grads = [start[t] for t in stage0 if name[t].startswith("grad_reduce_scatter.m1.c0.")]
        backward = max(end[t] for t in stage0 if name[t].startswith("B1.c0."))
        assert len(grads) == (3 if v == 2 else 5) and bool(min(grads) >= backward) == after_pass


def test_a_later_stages_chunk_reductions_wait_one_backward_per_stage_rank():
    # Megatron-LM's backward_step_helper_postprocess launches a chunk's grad sync `pipeline_parallel_rank`
    # backward passes after the chunk's last one ("at the same time across the pipeline-parallel group"):
    # stage 1 of 2, 2 chunks, 2 micro-batches a rank. Its backward order (schedule): chunk 1's last backward
    # is followed by one more backward pass; chunk 1's buckets leave when that one ends, not before
    from itercast.parallel.schedules import schedule

    plan = dict(data_parallel=2, zero_stage=1, grad_bucket_size_params=1, micro_batch_size=1, global_batch_size=4)
    j = job({"num_layers": 8}, pipeline_parallel=2, virtual_pipeline=2, schedule="interleaved-1f1b", **plan)
    r = predict(j, linear_calibration())
    g, start, end = r.sim.graph, r.sim.start_s, r.sim.end_s
    stage1 = [t for t in range(g.num_tasks) if g.resource_rank[g.resource[t]] == 1]
    name = {t: g.names[g.name[t]] for t in stage1}
    backwards = [ps for ps in schedule("interleaved-1f1b", 1, 2, 2, 2) if not ps.forward]
    k = max(i for i, ps in enumerate(backwards) if ps.chunk == 1)
    assert k + 1 < len(backwards)  # one backward follows it on this stage

    def pass_end(ps) -> float:
        return max(end[t] for t in stage1 if name[t].startswith(f"B{ps.microbatch}.c{ps.chunk}."))

    grads = [start[t] for t in stage1 if name[t].startswith("grad_reduce_scatter.") and ".c1." in name[t]]
    assert grads and min(grads) >= pass_end(backwards[k + 1]) > pass_end(backwards[k])
