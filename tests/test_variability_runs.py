"""The run level (VariabilityModel.run_cv) and step-to-step correlation (step_autocorrelation) of the
variability model: the AR(1) sums by hand, the sampled chain, the run factor, and time to train."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from itercast.cli import app
from itercast.graph.execgraph import Category, GraphBuilder
from itercast.stochastic.time_to_train import FailureModel, time_to_train
from itercast.stochastic.variability import (
    GraphSampler,
    StepGraph,
    VariabilityModel,
    ar1,
    ar1_mean_variance_factor,
    graph_attribution,
    graph_distribution,
    graph_sensitivity,
    p95_shift_per_cv,
    paired_standard_error,
)

NO_FAILURES = FailureModel(mtbf_per_gpu_s=math.inf, checkpoint_s=0.0, restart_s=0.0)


def one_task(duration_s: float = 2.0) -> StepGraph:
    b = GraphBuilder()
    b.task("step", b.resource(0, "compute"), duration_s, Category.COMPUTE, "gemm")
    return StepGraph(b.build(), 1, 1)


def shared_only(step_cv: float = 0.0, run_cv: float = 0.0, rho: float = 0.0) -> VariabilityModel:
    return VariabilityModel(0.0, 0.0, 0.0, 0.0, 0.0, step_cv=step_cv, run_cv=run_cv, step_autocorrelation=rho)


def test_ar1_mean_of_two_steps_by_hand():
    # Var((x1 + x2)/2) = (σ² + σ² + 2ρσ²)/4 = σ²/4 · (2 + 2·0.5) = 0.75 σ² = σ²/2 · 1.5
    assert ar1_mean_variance_factor(2, 0.5) == pytest.approx(1.5)
    # n = 3, ρ = 0.5: (3σ² + 2·(2·0.5 + 1·0.25)σ²)/9 = 5.5σ²/9 = σ²/3 · 1.8333
    assert ar1_mean_variance_factor(3, 0.5) == pytest.approx(5.5 / 3)
    # independent steps, and the large-N limit (1 + ρ)/(1 − ρ) = 1.5/0.5 = 3
    assert ar1_mean_variance_factor(7, 0.0) == pytest.approx(1.0)
    assert ar1_mean_variance_factor(10**7, 0.5) == pytest.approx(3.0, rel=1e-6)


def test_sampled_ar1_keeps_its_marginal_and_lag1():
    z = np.random.default_rng(0).standard_normal(200_000)
    x = ar1(z, 0.6)
    # x_0 = z_0; the lag-1 estimate's standard error is about (1 − ρ²)/√N = 0.64/447 = 0.0014
    assert x[0] == z[0]
    assert np.corrcoef(x[1:], x[:-1])[0, 1] == pytest.approx(0.6, abs=0.01)
    assert x.var() == pytest.approx(1.0, abs=0.02)


def test_sampler_step_factor_is_ar1_along_consecutive_samples():
    # the log of a 2 s step × exp(σx − σ²/2) is linear in x: its lag-1 correlation is x's, ρ = 0.6
    sampler = GraphSampler(one_task(), shared_only(step_cv=0.1, rho=0.6))
    log_step = np.log(sampler(np.random.default_rng(1), 100_000)[0])
    assert np.corrcoef(log_step[1:], log_step[:-1])[0, 1] == pytest.approx(0.6, abs=0.01)


class FixedNormals:
    """A generator whose standard normals are given: the run factors' draws, by hand."""

    def __init__(self, values: list[float]) -> None:
        self.values = np.array(values)

    def standard_normal(self, size: int) -> np.ndarray:
        assert size == self.values.size
        return self.values


def test_run_cv_gives_each_run_one_factor_by_hand():
    # run_cv 10%: σ = √ln(1.01) = 0.099751; two runs of 3 steps with z = +1 and −1:
    # run 0: 2 s × e^{σ − σ²/2} = 2 × e^{0.094776} = 2.19883 s, run 1: 2 × e^{−σ − σ²/2} = 2 × e^{−0.104727}
    # = 1.80114 s; their ratio e^{2σ} = e^{0.199502} = 1.22080
    sampler = GraphSampler(one_task(2.0), shared_only(run_cv=0.10), run_steps=3)
    steps = sampler(FixedNormals([1.0, -1.0]), 6)[0]  # type: ignore[arg-type]
    assert steps[:3] == pytest.approx([2.19883] * 3, rel=1e-5)
    assert steps[3:] == pytest.approx([1.80114] * 3, rel=1e-5)
    assert steps[:3].mean() / steps[3:].mean() == pytest.approx(1.22080, rel=1e-5)


def test_one_run_ignores_run_cv_and_pooled_runs_widen_by_it():
    graph = one_task(2.0)
    one_run = graph_distribution(graph, shared_only(run_cv=0.10), 2000, seed=0).samples_s
    assert one_run == pytest.approx(np.full(2000, 2.0))
    # pooled: each step of a fresh run, log-σ √ln(1.01) = 0.0998 (standard error 0.0998/√(2·20,000) ≈ 0.0005)
    pooled = graph_distribution(graph, shared_only(run_cv=0.10), 20_000, seed=0, across_runs=True).samples_s
    assert np.log(pooled).std() == pytest.approx(0.0998, abs=0.002)


def test_correlation_leaves_one_step_quantiles_alone():
    # step_cv 10%: σ = 0.099751; p95 = 2 s × e^{1.6449σ − σ²/2} = 2 × e^{0.164080 − 0.004975} = 2.34493 s
    for rho in (0.0, 0.8):
        dist = graph_distribution(one_task(2.0), shared_only(step_cv=0.10, rho=rho), 40_000, seed=3)
        assert dist.quantiles()["p95_s"] == pytest.approx(2.34493, rel=0.005)


def test_time_to_train_p95_with_run_cv_by_hand():
    # 1000 steps of 2 s, no failures: 2000 s times the run's factor; run_cv 5%: σ = √ln(1.0025) = 0.0499688,
    # p95 = 2000 × e^{1.6449σ − σ²/2} = 2000 × e^{0.082194 − 0.001248} = 2000 × 1.084311 = 2168.62 s
    ttt = time_to_train(2.0, 1000, 8, NO_FAILURES, run_cv=0.05)
    assert ttt.expected_s == pytest.approx(2000.0)
    assert ttt.quantiles_s["p95_s"] == pytest.approx(2168.62, rel=0.005)


def test_time_to_train_p95_of_correlated_steps_by_hand():
    # 100 steps of 1 s, step_cv 10%, ρ 0.5, no run factor: g(100, 0.5) = 3 − 2·0.5·(1 − 0.5¹⁰⁰)/(100·0.25)
    # = 2.96; the mean's log-variance ln(1.01)/100 × 2.96 = 0.00995033 × 0.0296 = 0.000294530, σ = 0.0171619;
    # p95 = 100 × e^{1.6449σ − σ²/2} = 100 × e^{0.028230 − 0.000147} = 102.848 s (independent steps: 101.64 s)
    ttt = time_to_train(1.0, 100, 8, NO_FAILURES, step_cv=0.10, step_autocorrelation=0.5)
    assert ttt.quantiles_s["p95_s"] == pytest.approx(102.848, rel=0.002)


def test_model_refuses_a_correlation_outside_minus_one_to_one():
    with pytest.raises(ValueError, match=r"step_autocorrelation: expected a number in \(-1, 1\); got 1.0"):
        VariabilityModel(step_autocorrelation=1.0)


def test_cli_across_runs_and_a_bad_correlation():
    args = ["variability", "--model", "gpt3-1.3b", "--system", "dgx-h100", "--samples", "300", "--json"]
    one = json.loads(CliRunner().invoke(app, [*args, "--run-cv", "0.05"]).stdout)
    pooled = json.loads(CliRunner().invoke(app, [*args, "--run-cv", "0.05", "--across-runs"]).stdout)
    assert not one["across_runs"] and pooled["across_runs"] and pooled["model"]["run_cv"] == 0.05
    assert pooled["p99_s"] - pooled["p50_s"] > one["p99_s"] - one["p50_s"]
    # the run level is a source of the attribution across runs only; within one run a note says so
    assert "run_cv" in [r["source"] for r in pooled["attribution"]] and pooled["notes"] == []
    assert "run_cv" not in [r["source"] for r in one["attribution"]]
    assert len(one["notes"]) == 1 and "run level (--run-cv 0.05) not in" in one["notes"][0]
    table = CliRunner().invoke(app, [*args[:-1], "--run-cv", "0.05"])
    assert table.exit_code == 0 and "run level (--run-cv 0.05) not in" in table.output
    bad = CliRunner().invoke(app, [*args, "--step-autocorrelation", "1.5"])
    assert bad.exit_code == 2 and "1.5" in bad.output


def test_the_command_takes_the_shared_step_factor():
    """`variability --step-cv 0.1` with every other noise off: every task of a step scales by one
    log-normal factor of mean 1, so p95 / deterministic = exp(1.6449 σ − σ²/2), σ² = ln(1 + 0.1²)."""
    zero = ["--compute-cv", "0", "--comm-cv", "0", "--network-cv", "0", "--gpu-cv", "0", "--moe-imbalance-cv", "0"]
    out = CliRunner().invoke(
        app, ["variability", "--example", "--step-cv", "0.1", *zero, "--samples", "20000", "--json"]
    )
    assert out.exit_code == 0, out.output
    d = json.loads(out.output)
    sigma = math.sqrt(math.log(1 + 0.01))  # 0.09975
    assert d["p95_s"] / d["deterministic_s"] == pytest.approx(
        math.exp(1.6449 * sigma - sigma**2 / 2), rel=0.01
    )  # 1.1725
    bad = CliRunner().invoke(app, ["variability", "--example", "--step-cv", "-0.1"])
    assert bad.exit_code == 2


# A one-task graph of 10 ms with only the run level (run_cv c = 10%), one step per run (across_runs):
# each step is 10 ms × a log-normal of mean 1 and CV c, σ² = ln(1 + c²) = ln(1.01) = 0.0099503,
# σ = 0.0997513, μ = −σ²/2, so p95 = 10 ms × exp(μ + 1.6449σ) = 10 × e^{0.164081 − 0.004975} = 11.7246 ms.
# Run_cv halved (c = 5%): σ² = ln(1.0025) = 0.0024969, σ = 0.0499688: p95 = 10 × e^{0.082194 − 0.001248}
# = 10.8431 ms, a p95 change of 10.8431 / 11.7246 − 1 = −7.518%.
# Monte Carlo: the sample 95th percentile of N standard normals has a standard error of
# √(0.95·0.05/N) / φ(1.6449) = √(0.0475/20,000) / 0.10314 = 0.0149 at N = 20,000; the base p95 moves by
# σ·0.0149 = 0.15% of itself, the halved/base ratio, e^{(σ½ − σ)z − …}, by 0.0498·0.925·0.0149 = 0.0007 (the
# same draws of z for both: common random numbers). Tolerances below are about 4 standard errors.
TEN_MS = 0.010
P95_RUN_10 = 0.0117246  # s
P95_CHANGE_RUN_HALVED = -0.07518


def test_attribution_across_runs_names_the_run_level_by_hand():
    model = shared_only(run_cv=0.10)
    base = graph_distribution(one_task(TEN_MS), model, 20_000, seed=0, across_runs=True)
    assert base.quantiles()["p95_s"] == pytest.approx(P95_RUN_10, rel=0.006)
    rows = graph_attribution(one_task(TEN_MS), model, 20_000, seed=0, across_runs=True)
    assert [r["source"] for r in rows] == ["run_cv"]
    assert rows[0]["p95_change"] == pytest.approx(P95_CHANGE_RUN_HALVED, abs=0.003)


def test_attribution_within_one_run_leaves_the_run_level_out():
    # within one run the run's factor is 1: the same figures as without run_cv, and no run_cv row
    noisy = VariabilityModel(compute_cv=0.10, comm_cv=0.0, network_cv=0.0, gpu_cv=0.0, moe_imbalance_cv=0.0)
    with_run = VariabilityModel(**{**noisy.__dict__, "run_cv": 0.10})
    assert graph_attribution(one_task(TEN_MS), with_run, 2_000) == graph_attribution(one_task(TEN_MS), noisy, 2_000)
    assert graph_attribution(one_task(TEN_MS), shared_only(run_cv=0.10), 2_000) == []


def test_sensitivity_adds_class_noise_to_the_run_level_base_by_hand():
    """The 10 ms task's class (gemm) gets a log-normal of CV 0.25 more: σ_F² = ln(1.0625) = 0.0606246.
    Across runs the base already holds the run's factor (σ_R² = 0.0099503), and the product of the two
    is log-normal with σ² = 0.0705750, σ = 0.265659: p95 = 10 ms × e^{1.6449·0.265659 − 0.0352875}
    = 14.9436 ms; dp95 per CV = (14.9436 − 11.7246) ms / 0.25 = 12.876 ms. Within one run the base is
    the bare 10 ms: p95 = 10 × e^{1.6449·0.246221 − 0.0303123} = 14.5455 ms, dp95 per CV
    = 4.5455 / 0.25 = 18.182 ms. Standard errors at N = 200,000 (z's p95: 0.0047): the noisy p95
    0.27 × 14.94 × 0.0047 = 0.019 ms, the base 0.0998 × 11.72 × 0.0047 = 0.0055 ms, so dp95 per CV
    (0.019 + 0.0055) / 0.25 = 0.1 ms at most (less: the two share the run's draws); 3% is 0.39 ms, about
    4 standard errors, and 12.9 vs 18.2 ms differ by 30%."""
    model = shared_only(run_cv=0.10)
    across = graph_sensitivity(one_task(TEN_MS), model, 0.25, 200_000, seed=0, across_runs=True)
    within = graph_sensitivity(one_task(TEN_MS), model, 0.25, 200_000, seed=0)
    assert [r["class"] for r in across] == ["gemm"]
    assert across[0]["dp95_per_cv_s"] == pytest.approx(0.012876, rel=0.03)
    assert within[0]["dp95_per_cv_s"] == pytest.approx(0.018182, rel=0.03)


def test_a_constant_shift_has_no_sampling_error():
    """Every sample 2 ms slower: the p95 moves by exactly 2 ms, 8 ms per unit of CV at δ 0.25, and every
    paired resample moves by the same 2 ms, so the standard error is 0."""
    base = np.random.default_rng(3).lognormal(-5.0, 0.3, 4_000)
    shift_s, se_s = p95_shift_per_cv(base, base + 0.002, 0.25)
    assert shift_s == pytest.approx(0.008, rel=1e-9)
    assert se_s == pytest.approx(0.0, abs=1e-15)


def test_sensitivity_standard_error_is_the_p95s_by_hand():
    """Within one run the base is the bare 10 ms, so the error is the noisy p95's alone. A sample p95 of
    N draws has standard error √(p(1 − p)/N) / f(q); for the log-normal of σ = 0.246221 (CV 0.25, the
    test above) f(q) = φ(z)/(q·σ), z = 1.644854, φ(z) = e^{−1.352772}/√(2π) = 0.103136, q = 14.5455 ms:
    √(0.0475/20,000) × 14.5455 × 0.246221 / 0.103136 = 0.0015411 × 34.725 ms = 0.053515 ms, per unit of CV
    0.21406 ms. The bootstrap's own error is of order N^(−1/4) ≈ 8%: 15% allowed. The estimate of
    18.182 ms (the test above) lies within 3 of these standard errors."""
    model = shared_only(run_cv=0.10)
    (row,) = graph_sensitivity(one_task(TEN_MS), model, 0.25, 20_000, seed=0)
    assert row["dp95_per_cv_se_s"] == pytest.approx(0.21406e-3, rel=0.15)
    assert abs(row["dp95_per_cv_s"] - 0.018182) < 3 * row["dp95_per_cv_se_s"]


def test_a_paired_statistic_that_every_resample_holds_has_no_sampling_error():
    """Every sample 1.1 times its base: any paired resample's p95 is 1.1 times its base's, so the change
    +10% has no sampling error (unpaired resamples would give it one)."""
    base = np.random.default_rng(5).lognormal(-5.0, 0.3, 4_000)

    def p95_change(b: np.ndarray, o: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.percentile(o, 95, axis=axis) / np.percentile(b, 95, axis=axis) - 1

    assert float(p95_change(base, 1.1 * base)) == pytest.approx(0.1, rel=1e-12)
    assert paired_standard_error(base, 1.1 * base, p95_change) == pytest.approx(0.0, abs=1e-12)


def test_attribution_p95_change_and_its_standard_error_by_hand():
    """One 10 ms task, compute_cv 0.2 alone, halved to 0.1: σ1 = √ln 1.04 = 0.198042, σ2 = √ln 1.01 = 0.099751,
    the same draws z (common random numbers), so both p95s sit at z's sample p95 and their ratio is
    e^{(σ2 − σ1)·1.644854 − (σ2² − σ1²)/2} = e^{−0.161675 + 0.014635} = 0.86326: a −13.674% change. Its
    standard error is that of z's sample p95, √(0.0475/N)/φ(1.644854) = 0.0015411/0.103136 = 0.014943 at
    N = 20,000, times |σ2 − σ1| · 0.86326 = 0.084851: 0.1268 points. 15% allowed for the bootstrap's own error."""
    model = VariabilityModel(compute_cv=0.2, comm_cv=0.0, network_cv=0.0, gpu_cv=0.0, moe_imbalance_cv=0.0)
    (row,) = graph_attribution(one_task(TEN_MS), model, 20_000, seed=0)
    assert row["source"] == "compute_cv"
    assert row["p95_change_se"] == pytest.approx(0.001268, rel=0.15)
    assert abs(row["p95_change"] - (-0.13674)) < 3 * row["p95_change_se"]


def test_a_stages_compute_is_its_slowest_data_parallel_replicas():
    """Two 1 s compute tasks in a row on one stage of 2 replicas, compute_cv 0.1 alone (σ = √ln 1.01 =
    0.099751): a replica takes e^(σz1 − σ²/2) + e^(σz2 − σ²/2) s, and the step is the longer replica's. By
    hand to first order, 2 + σ·√2·E[max of 2 normals] = 2 + 0.099751 · 1.414214 · 0.564190 = 2.07959 s;
    an independent draw of both replicas (second order included) gives the reference the sampler must meet,
    within 0.1% (200,000 steps: standard error ~0.0002 s)."""
    b = GraphBuilder()
    r = b.resource(0, "compute")
    first = b.task("a", r, 1.0, Category.COMPUTE, "gemm")
    b.task("b", r, 1.0, Category.COMPUTE, "gemm", [first])
    noise = VariabilityModel(0.1, 0.0, 0.0, 0.0, 0.0)
    n, rng = 200_000, np.random.default_rng(1)
    one = GraphSampler(StepGraph(b.build(), 1, 1), noise)(rng, n).sum(axis=0)
    two = GraphSampler(StepGraph(b.build(), 1, 1, replicas=2), noise)(rng, n).sum(axis=0)
    sigma = math.sqrt(math.log(1.01))
    z = np.random.default_rng(2).standard_normal((n, 2, 2))
    replicas = np.exp(sigma * z - sigma * sigma / 2).sum(axis=2)  # each replica's two tasks
    assert one.mean() == pytest.approx(2.0, rel=1e-3)  # one replica: no maximum, mean 1 a task
    assert two.mean() == pytest.approx(replicas.max(axis=1).mean(), rel=1e-3)
    assert two.mean() == pytest.approx(2 + sigma * math.sqrt(2) * 0.564190, rel=1e-3)
    assert np.percentile(two, 95) == pytest.approx(np.percentile(replicas.max(axis=1), 95), rel=2e-3)


def test_variability_refuses_a_job_that_would_never_finish_in_one_line():
    # 8 GPUs of 1e-9 h MTBF fail every 4.5e-7 s: no checkpoint of 300 s ever completes
    args = ["variability", "--model", "gpt3-1.3b", "--system", "dgx-h100", "--set", "model.num_layers=2"]
    res = CliRunner().invoke(app, [*args, "--samples", "200", "--steps", "1000", "--mtbf-hours", "1e-9"])
    assert res.exit_code == 2 and "the job would not finish: its 8 GPUs fail every 4.5e-07 s" in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
