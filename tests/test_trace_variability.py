"""Variability fitted on a trace's repeated steps: pools by hand, and the zero-spread case by hand."""

from __future__ import annotations

import numpy as np
import pytest
from kineto_fixtures import call, kernel, step, write

from itercast.stochastic.trace_variability import fit_trace_variability, trace_attribution, trace_step_distribution
from itercast.traces.kineto import read_traces
from itercast.traces.replay_graph import build_replay_graph


def three_steps(tmp_path):
    """Steps of 100 µs at 0, 1000, 2000: launch at +10 (5 µs), GEMM from +20 lasting 40, 50, 60 µs,
    cudaDeviceSynchronize from +30 that waits for the GEMM and then takes 5 µs."""
    events = []
    for i, gemm_us in enumerate((40, 50, 60)):
        t0 = 1000 * i
        events += [
            step(i + 1, t0, 100),
            call("cudaLaunchKernel", t0 + 10, 5, corr=i + 1),
            kernel("volta_sgemm_128x64", t0 + 20, gemm_us, corr=i + 1),
            call("cudaDeviceSynchronize", t0 + 30, gemm_us - 10 + 5),
        ]
    return build_replay_graph(read_traces([write(tmp_path / "t.json", events)]))


def test_pools_are_the_ratios_to_the_median(tmp_path):
    rg = three_steps(tmp_path)
    model = fit_trace_variability(rg)
    assert sorted(model.step_factors["gemm"].tolist()) == pytest.approx([0.8, 1.0, 1.2])
    assert model.residuals["gemm"].tolist() == pytest.approx([1.0, 1.0, 1.0])  # one GEMM a step: no residual
    assert model.steps_used == 3


def test_no_spread_gives_the_median_step_by_hand(tmp_path):
    """With every ratio pulled to 1, calls and kernels take their medians: host 10 + 5 + 15 µs to the
    sync, the GEMM 20–70 (launch at 10, measured latency 10), sync until 70 then 5 µs; host gaps keep
    their measured durations, so the gap to the step end is the step's own 35, 25, 15 µs: steps of
    110, 100 and 90 µs."""
    rg = three_steps(tmp_path)
    model = fit_trace_variability(rg)
    none = {c: 0.0 for c in model.classes}
    steps = trace_step_distribution(rg, model, samples=50, seed=1, shrink=none).step_s
    assert steps.shape == (3, 50) and np.allclose(steps, np.array([110e-6, 100e-6, 90e-6])[:, None])
    # with the spread, the same seed reproduces; the GEMM's pool makes the steps vary
    a = trace_step_distribution(rg, model, samples=200, seed=3).pooled()
    b = trace_step_distribution(rg, model, samples=200, seed=3).pooled()
    assert np.array_equal(a, b) and a.std() > 0
    attribution = trace_attribution(rg, model, samples=200, seed=3)
    assert set(attribution) == {"gemm", "host"}


def test_fit_on_some_steps_only(tmp_path):
    rg = three_steps(tmp_path)
    model = fit_trace_variability(rg, fit_steps=[0, 2])  # GEMMs of 40 and 60 µs: median 50
    assert sorted(model.step_factors["gemm"].tolist()) == pytest.approx([0.8, 1.2])


def test_nccl_kernels_are_classed_by_collective_kind(tmp_path):
    # one step: a GEMM, then an NCCL all-gather, a reduce-scatter and a send/recv kernel
    from itercast.stochastic.trace_variability import task_classes

    names = ["volta_sgemm_128x64", "ncclDevKernel_AllGather_RING_LL", "ncclKernel_ReduceScatter_RING_LL_Sum_bf16"]
    names.append("ncclDevKernel_SendRecv")
    events = [step(1, 0, 1000)]
    for i, name in enumerate(names):
        events += [call("cudaLaunchKernel", 10 + 100 * i, 5, corr=i + 1), kernel(name, 20 + 100 * i, 50, corr=i + 1)]
    classes = task_classes(build_replay_graph(read_traces([write(tmp_path / "t.json", events)])))
    gpu = [c for c in classes if c not in ("", "host")]
    assert gpu == ["gemm", "nccl all-gather", "nccl reduce-scatter", "nccl send/recv"]
