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


def test_nccl_kernels_are_classed_by_collective_kind_and_process_group(tmp_path):
    # one step: a GEMM, then NCCL kernels: an all-gather on Megatron's tensor-parallel group, a
    # reduce-scatter on torch DeviceMesh's "mesh_dp_shard", a send/recv on a group named only "7" with
    # ranks [0, 4], and an all-reduce whose trace says nothing of its group
    from itercast.stochastic.trace_variability import attribution_classes, task_classes

    tp = {"Process Group Description": "TENSOR_MODEL_PARALLEL_GROUP", "Process Group Name": "3"}
    kernels = [
        ("volta_sgemm_128x64", {}),
        ("ncclDevKernel_AllGather_RING_LL", tp),
        ("ncclKernel_ReduceScatter_RING_LL_Sum_bf16", {"Process Group Description": "mesh_dp_shard"}),
        ("ncclDevKernel_SendRecv", {"Process Group Name": "7", "Process Group Ranks": "[0, 4]"}),
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", {}),
    ]
    events = [step(1, 0, 1000)]
    for i, (name, meta) in enumerate(kernels):
        events += [call("cudaLaunchKernel", 10 + 100 * i, 5, corr=i + 1)]
        events += [kernel(name, 20 + 100 * i, 50, corr=i + 1, **meta)]
    rg = build_replay_graph(read_traces([write(tmp_path / "t.json", events)]))
    assert [c for c in attribution_classes(rg) if c not in ("", "host")] == [
        "gemm",
        "nccl all-gather × TP",
        "nccl reduce-scatter × DP",
        "nccl send/recv × group 7 (ranks [0, 4])",
        "nccl all-reduce × unknown group",
    ]
    # fitting keeps NCCL one class: its kernels' step factors are drawn together
    assert [c for c in task_classes(rg) if c not in ("", "host")] == ["gemm"] + ["nccl"] * 4


def test_trace_sensitivity_by_hand(tmp_path):
    # three identical steps of 100 µs: launch 10–15 → GEMM 20–70 on stream 7; launch 16–19 → an NCCL
    # all-gather 22–32 on stream 9; cudaDeviceSynchronize from 30 waits for both (until 70), takes
    # 5 µs, and the measured gap to the step's end (25 µs) is kept. No spread is fitted (every
    # ratio 1). CV δ = 0.25 added to the GEMMs: step = 100 + 50 (f − 1) µs with f log-normal, its p95
    # e^(1.6449 σ − σ²/2), σ = √ln(1 + δ²) = 0.24622: 1.45455; p95 = 100 + 50 · 0.45455 = 122.73 µs,
    # dp95/δ = 22.73 µs / 0.25 = 90.9 µs per CV. The all-gather ends 38 µs before the GEMM: it would
    # need f > 4.8 (z > 6.5) to matter: 0 per CV
    from itercast.stochastic.trace_variability import trace_sensitivity

    events = []
    for i in range(3):
        t0 = 1000 * i
        events += [
            step(i + 1, t0, 100),
            call("cudaLaunchKernel", t0 + 10, 5, corr=2 * i + 1),
            kernel("volta_sgemm_128x64", t0 + 20, 50, corr=2 * i + 1),
            call("cudaLaunchKernel", t0 + 16, 3, corr=2 * i + 2),
            kernel("ncclDevKernel_AllGather_RING_LL", t0 + 22, 10, corr=2 * i + 2, stream=9),
            call("cudaDeviceSynchronize", t0 + 30, 45),
        ]
    rg = build_replay_graph(read_traces([write(tmp_path / "t.json", events)]))
    model = fit_trace_variability(rg)
    got = {r["class"]: r for r in trace_sensitivity(rg, model, delta_cv=0.25, samples=4_000)}
    assert got["gemm"]["dp95_per_cv_s"] == pytest.approx(90.9e-6, rel=0.05)
    # every GEMM is on the path (3 × 50 µs) of a trace 2,100 µs long (the third step ends at 2,000 + 100)
    assert got["gemm"]["total_s"] == pytest.approx(150e-6) and got["gemm"]["critical_path_s"] == pytest.approx(150e-6)
    assert got["gemm"]["critical_path_share"] == pytest.approx(150 / 2100)
    ag = got["nccl all-gather × unknown group"]
    assert ag["dp95_per_cv_s"] == 0.0 and ag["critical_path_s"] == 0.0 and ag["total_s"] == pytest.approx(30e-6)


def test_a_steps_class_factor_is_the_median_of_its_ratios_not_their_mean(tmp_path):
    """Two steps of three GEMMs: the first takes 10 then 30 µs (its median 20: ratios 0.5 and 1.5), the
    others 20 µs in both (ratios 1). Step 1's GEMM ratios 0.5, 1, 1 have median 1 (mean 0.83), step 2's
    1.5, 1, 1 median 1 (mean 1.17): step factors 1 and 1, and the residuals the ratios themselves."""
    events = []
    for i, first_us in enumerate((10, 30)):
        t0, corr = 1000 * i, 3 * i
        events += [
            step(i + 1, t0, 100),
            call("cudaLaunchKernel", t0 + 10, 1, corr=corr + 1),
            call("cudaLaunchKernel", t0 + 12, 1, corr=corr + 2),
            call("cudaLaunchKernel", t0 + 14, 1, corr=corr + 3),
            kernel("volta_sgemm_a", t0 + 20, first_us, corr=corr + 1),
            kernel("volta_sgemm_b", t0 + 20 + first_us, 20, corr=corr + 2),
            kernel("volta_sgemm_c", t0 + 40 + first_us, 20, corr=corr + 3),
            call("cudaDeviceSynchronize", t0 + 16, 49 + first_us),  # until the last GEMM's end + 5 µs
        ]
    model = fit_trace_variability(build_replay_graph(read_traces([write(tmp_path / "t.json", events)])))
    assert sorted(model.step_factors["gemm"].tolist()) == pytest.approx([1.0, 1.0])
    assert sorted(model.residuals["gemm"].tolist()) == pytest.approx([0.5, 1.0, 1.0, 1.0, 1.0, 1.5])


def test_the_cli_says_when_few_steps_carry_the_quantiles(tmp_path):
    # 3 profiled steps: every task's spread rests on 3 draws, and a p95 is seen once in 20 steps
    from typer.testing import CliRunner

    from itercast.cli import app

    three_steps(tmp_path)
    res = CliRunner().invoke(app, ["variability", "--trace", str(tmp_path / "t.json"), "--samples", "200", "--json"])
    assert res.exit_code == 0, res.output
    assert "3 profiled steps per rank: each task's spread is fitted on 3 draws" in res.output
    assert "a p95 is seen once in 20 steps" in res.output


def test_what_the_classes_leave_of_the_critical_path_is_said():
    from itercast.stochastic.variability import uncovered_note

    # 50% + 30% of the path in the classes: 80% covered, the other 20% said; 60% + 35% = 95%: nothing to say
    (note,) = uncovered_note([{"critical_path_share": 0.5}, {"critical_path_share": 0.3}])
    assert note.startswith("the kernel and collective classes cover 80% of the step's critical path: the other 20%")
    assert uncovered_note([{"critical_path_share": 0.6}, {"critical_path_share": 0.35}]) == []


def test_the_cli_says_a_trace_whose_path_is_host_gaps_varies_with_no_class(tmp_path):
    # three steps of 100 µs 1,000 µs apart: the trace's 2,100 µs path is mostly the gaps between steps
    import json

    from typer.testing import CliRunner

    from itercast.cli import app

    three_steps(tmp_path)
    res = CliRunner().invoke(app, ["variability", "--trace", str(tmp_path / "t.json"), "--samples", "200", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{") :])
    covered = sum(r["critical_path_share"] for r in out["sensitivity"])
    assert covered < 0.2 and out["uncovered"] == [
        f"the kernel and collective classes cover {covered:.0%} of the step's critical path: the other "
        f"{1 - covered:.0%} (host time between launches, gaps) varies with no noise source here, so the quantiles "
        "and the table of what to steady hold it fixed"
    ]
