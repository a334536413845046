"""Transformer Engine 1.x DelayedScaling's amax reductions, counted by hand (TE 1.11 fp8.py
reduce_and_update_fp8_tensors, module/base.py set_meta_tensor; Megatron-Core core_v0.9.0 TransformerBlock,
whose fp8_autocast wraps a chunk's layers).

MODEL (test_golden): gpt, hidden 64, one layer of four Transformer Engine GEMMs (QKV, projection, MLP up and
down) and fused attention (a TE module of 3 "GEMMs"): 7 modules × 3 fp32 amax entries forward = 84 bytes,
× 2 backward = 56 bytes. The scale update rolls a 1,024-entry fp32 history (read and written: 8,192 bytes)
for each of the 4 GEMM operands whose amax is set: 32,768 bytes a pass. With `linear_calibration()` a
memory-bound kernel takes bytes / HBM (1e11 B/s) and a collective bus bytes / link (1e10 B/s); an all-reduce
over 2 ranks moves 2 · (2 − 1) / 2 = 1 × its bytes.
"""

from __future__ import annotations

import pytest
from test_fp8_recipes import FP8_SYSTEM
from test_golden import HBM, LINK, MODEL, SYSTEM, linear_calibration

import itercast.search.fast_estimate as fast_estimate
import itercast.workloads.transformer as transformer
from itercast.config.job import Job
from itercast.costs.analytic import AnalyticCostModel
from itercast.search.fast_estimate import FastEstimator
from itercast.workloads.transformer import TransformerStepBuilder
from itercast.workloads.transformer_ops import delayed_amax_bytes


def fp8_job(recipe: str = "delayed", layers: int = 1, **plan: object) -> Job:
    fields = {"dtype": "fp8", "fp8_recipe": recipe, "data_parallel": 1, "global_batch_size": 4, **plan}
    gpus = int(fields.get("tensor_parallel", 1)) * int(fields.get("pipeline_parallel", 1))  # type: ignore[call-overload]
    gpus *= int(fields["data_parallel"])  # type: ignore[call-overload]
    system = {**FP8_SYSTEM, "node": {**SYSTEM["node"], "gpus_per_node": gpus}, "num_nodes": 1}
    return Job.from_dicts(MODEL | {"num_layers": layers}, fields, system)


def test_a_layer_adds_its_modules_amax_entries_and_histories():
    j = fp8_job()
    assert delayed_amax_bytes(j.model, j.plan) == (84, 56, 32_768)
    # unfused attention is no TE module: 4 GEMMs' entries only
    plain = fp8_job(flash_attention=False)
    assert delayed_amax_bytes(plain.model, plain.plan) == (48, 32, 32_768)


def test_every_chunk_pass_reduces_the_stages_whole_buffer_and_updates_its_own_layers():
    """pp 2 × vp 2 over 4 layers (a layer a chunk), dp 2, 4 micro-batches: stage 0 holds 2 layers, so its
    buffers are 168 and 112 bytes, each all-reduced over its 2 data-parallel ranks on every one of its
    2 chunks × 4 micro-batches × 2 directions = 16 passes; each update rolls one layer's 32,768 bytes."""
    j = fp8_job(
        layers=4,
        pipeline_parallel=2,
        virtual_pipeline=2,
        schedule="interleaved-1f1b",
        data_parallel=2,
        global_batch_size=8,
    )
    b = TransformerStepBuilder(j, AnalyticCostModel(j.system, "fp8", linear_calibration()))
    g = b.build()
    on_stage0 = g.resource_rank[g.resource] == 0
    for prefix, forward_s, backward_s in (
        ("fp8_amax_all_reduce", 168 / LINK, 112 / LINK),
        ("fp8_amax_cat", 2 * 168 / HBM, 2 * 112 / HBM),
        ("fp8_scale_update", 32_768 / HBM, 32_768 / HBM),
    ):
        tasks = [t for t, n in enumerate(g.names) if n.startswith(prefix) and on_stage0[t]]
        assert len(tasks) == 16
        got = sorted({round(float(g.duration_s[t]), 15) for t in tasks})
        assert got == sorted({round(forward_s, 15), round(backward_s, 15)})


def test_the_reductions_block_the_step_in_the_graph_and_the_fast_path(monkeypatch):
    """One stage, tp 2, 4 micro-batches: each forward adds 2·84/HBM + 84/LINK + 32,768/HBM = 3.3776e-7 s,
    each backward 2·56/HBM + 56/LINK + 32,768/HBM = 3.3440e-7 s, all on the compute stream: 2.68864e-6 s."""
    j = fp8_job(tensor_parallel=2)
    cal = linear_calibration()
    expected = 4 * ((2 * 84 / HBM + 84 / LINK + 32_768 / HBM) + (2 * 56 / HBM + 56 / LINK + 32_768 / HBM))
    assert expected == pytest.approx(2.68864e-6)

    def step_s() -> tuple[float, float]:
        from itercast.predict import predict

        return predict(j, cal).step_time_s, float(FastEstimator(j.model, j.system, cal).step_time_s([j])[0])

    with_amax = step_s()
    monkeypatch.setattr(transformer, "amax_reduction_bytes", lambda job: [])
    monkeypatch.setattr(fast_estimate, "amax_reduction_bytes", lambda job: [])
    without = step_s()
    assert with_amax[0] - without[0] == pytest.approx(expected, rel=1e-9)
    assert with_amax[1] - without[1] == pytest.approx(expected, rel=1e-9)


def test_only_delayed_scaling_reduces_amaxes():
    for recipe in ("tensorwise", "rowwise"):
        g = TransformerStepBuilder(fp8_job(recipe)).build()
        assert not any(n.startswith("fp8_amax") for n in g.names)
