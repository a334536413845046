"""The closed-form fast path agrees with the graph simulation on a grid of small plans."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import fast_vs_graph, pipeline_builder, tiny_job

from itercast.memory import estimate_memory
from itercast.parallel.schedules import in_flight_microbatches, schedule
from itercast.search.fast_estimate import FastEstimator
from itercast.search.plan_table import PlanTable
from itercast.sim.engine import simulate


def grid() -> list[dict]:
    """Every combination of the plan fields the closed form treats differently, on 32 GPUs."""
    plans = []
    fields = itertools.product(
        [1, 2, 8], [1, 2, 4], [1, 2], ["1f1b", "gpipe", "interleaved-1f1b"], [0, 1, 2, 3], [False, True]
    )
    for tp, pp, cp, sched, zero, sp in fields:
        if (sched == "interleaved-1f1b" and pp == 1) or (sp and tp == 1):
            continue
        if (pp == 1 and sched != "1f1b") or tp * pp * cp > 32:
            continue
        plans.append(
            dict(
                tensor_parallel=tp,
                pipeline_parallel=pp,
                context_parallel=cp,
                schedule=sched,
                virtual_pipeline=2 if sched == "interleaved-1f1b" else 1,
                zero_stage=zero,
                sequence_parallel=sp,
            )
        )
    # recompute, batch and overlap vary along the grid (every plan once) rather than across it
    for i, plan in enumerate(plans):
        plan["recompute"] = ("none", "selective", "full")[i % 3]
        plan["global_batch_size"] = (64, 256)[i // 3 % 2]
        plan["overlap_grad_reduce"] = plan["overlap_param_gather"] = i // 6 % 2 == 0
    return plans


def test_fast_path_agrees_with_graph_simulation_on_a_grid():
    valid, rel = fast_vs_graph("gpt3-1.3b", {"preset": "dgx-h100", "num_nodes": 4}, grid())
    assert {j.plan.zero_stage for j in valid} == {0, 1, 2, 3} and len(valid) > 100
    fsdp_pp = np.array([j.plan.zero_stage == 3 and j.plan.pipeline_parallel > 1 for j in valid])
    # Measured on this grid without ZeRO-3 × pipeline: mean 0.5%, worst 4.4% (ZeRO-2 under GPipe:
    # the DP stream's backlog behind uneven buckets; interleaving with 4 micro-batches).
    assert rel[~fsdp_pp].mean() < 0.01 and rel[~fsdp_pp].max() < 0.07
    zero3 = np.array([j.plan.zero_stage == 3 and j.plan.pipeline_parallel == 1 for j in valid])
    assert rel[zero3].max() < 0.01  # FSDP's per-unit gathers in closed form
    # ZeRO-3 with pipeline parallelism, 54 plans: mean 3.3%, worst 12.6% (the per-unit bound ignores
    # how 1F1B interleaves passes on the one DP stream); README "fast path". The search re-scores
    # its top plans with the graph.
    assert fsdp_pp.sum() > 40 and rel[fsdp_pp].mean() < 0.04 and rel[fsdp_pp].max() < 0.14


def test_fast_memory_is_the_memory_model_row_by_row():
    fe = FastEstimator({"preset": "gpt3-1.3b"}, {"preset": "dgx-h100", "num_nodes": 4})
    valid = [j for j in fe.jobs(grid())[0] if j is not None]
    fast = fe.evaluate(PlanTable.of_jobs(valid))["memory_per_gpu_bytes"]
    assert np.allclose(fast, [estimate_memory(j).total_bytes for j in valid], rtol=1e-12)


@pytest.mark.parametrize("name,chunks", [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 3)])
@pytest.mark.parametrize("stages,micro", [(1, 1), (2, 2), (4, 4), (4, 8), (3, 12)])
def test_in_flight_closed_form_equals_walking_the_schedule(name, chunks, stages, micro):
    for stage in range(stages):
        held = peak = 0
        for p in schedule(name, stage, stages, micro, chunks):
            held += 1 if p.forward else -1
            peak = max(peak, held)
        assert in_flight_microbatches(name, stage, stages, micro, chunks) == pytest.approx(peak / chunks)


@pytest.mark.parametrize("schedule,vp", [("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 2)])
def test_fast_pipeline_formula_is_exact_for_uniform_stages(schedule, vp):
    job = tiny_job(tensor_parallel=2, pipeline_parallel=4, virtual_pipeline=vp, schedule=schedule, global_batch_size=8)
    graph_s = simulate(pipeline_builder(job, 1.0, 2.0).build()).step_time_s
    M, p, t = 8, 4, 3.0
    assert graph_s == pytest.approx(M * t + (p - 1) * t / vp)  # the fast path's pipeline term


def test_invalid_plans_are_reported_not_dropped():
    fe = FastEstimator({"preset": "gpt3-1.3b"}, {"preset": "dgx-h100"})
    jobs, errors = fe.jobs([{"tensor_parallel": 2}, {"tensor_parallel": 3}])
    assert jobs[0] is not None and jobs[1] is None
    assert errors[0] == "" and "not divisible by tensor_parallel(3)" in errors[1]
