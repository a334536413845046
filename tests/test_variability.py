"""Variability on the step graph: exact without noise, order statistics per stage, attribution, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import tiny_job
from scipy import stats
from typer.testing import CliRunner

from itercast.cli import app
from itercast.cli.variability_cmds import _deadline_interval
from itercast.graph.execgraph import Category, GraphBuilder
from itercast.measurements import Measurement
from itercast.profile.db import ProfileDB
from itercast.stochastic.variability import (
    GraphSampler,
    StepDistribution,
    StepGraph,
    StepSampler,
    VariabilityModel,
    attribution,
    noise_from_profile,
    step_distribution,
)
from itercast.workloads.transformer import TransformerStepBuilder


def test_without_variability_every_quantile_is_the_deterministic_step():
    d = step_distribution(
        tiny_job(tensor_parallel=2, pipeline_parallel=2, global_batch_size=8), VariabilityModel(0, 0, 0, 0), 50
    )
    assert set(d.quantiles().values()) == {d.deterministic_s}
    assert d.slowdown == pytest.approx(1.0, rel=1e-12)  # a mean of equal floats: last-bit rounding


def test_a_stage_runs_at_its_slowest_gpu():
    # gpu_cv only: every compute task of a stage gets the same factor, the maximum of dp·tp·cp draws
    job = tiny_job(tensor_parallel=2, pipeline_parallel=2, global_batch_size=8)  # dp = 2: 4 GPUs per stage
    graph = TransformerStepBuilder(job).build()
    sampler = StepSampler(job, graph, VariabilityModel(0, 0, 0, 0.1))
    dur = sampler(np.random.default_rng(0), 20_000)
    compute = np.flatnonzero((graph.category == Category.COMPUTE) & (graph.duration_s > 0))
    ratio = dur[compute] / graph.duration_s[compute, None]
    stage = graph.resource_rank[graph.resource[compute]]
    first = compute[stage == 0]
    assert np.allclose(ratio[stage == 0], ratio[stage == 0][0])  # one factor per stage and sample
    sigma = np.sqrt(np.log1p(0.01))
    brute = np.exp(sigma * np.random.default_rng(1).standard_normal((20_000, 4)) - sigma**2 / 2).max(axis=1)
    assert stats.ks_2samp(ratio[np.flatnonzero(stage == 0)[0]], brute).statistic < 0.02
    assert first.size and np.all(
        dur[graph.category != Category.COMPUTE] == graph.duration_s[graph.category != Category.COMPUTE, None]
    )


def test_more_gpus_per_stage_make_the_step_slower_on_average():
    def slowdown(nodes: int) -> float:  # tp 2, same 4 micro-batches per replica; 8 or 64 GPUs per stage
        job = tiny_job(num_nodes=nodes, tensor_parallel=2, global_batch_size=16 * nodes)
        return step_distribution(job, VariabilityModel(0, 0, 0, 0.05), 2000).slowdown

    assert 1.0 < slowdown(1) < slowdown(8)


def test_attribution_names_the_only_source_that_varies():
    job = tiny_job(tensor_parallel=2, pipeline_parallel=2, global_batch_size=8)
    rows = attribution(job, VariabilityModel(compute_cv=0.1, comm_cv=0, network_cv=0, gpu_cv=0), 2000)
    assert [r["source"] for r in rows] == ["compute_cv"] and rows[0]["spread_change"] < -0.3


def test_a_spread_of_a_millionth_of_the_step_has_no_change_to_report():
    """compute_cv 1e-7: a p50→p99 spread of about 2.3 · 1e-7 of the step, under SPREAD_FLOOR's 0.1%; halving the
    CV halved it, which read as '−50%' of a spread nobody can see (a user probe's DLRM: 15 ns of 1.4 ms)."""
    job = tiny_job(tensor_parallel=2, pipeline_parallel=2, global_batch_size=8)
    (row,) = attribution(job, VariabilityModel(compute_cv=1e-7, comm_cv=0, network_cv=0, gpu_cv=0), 500)
    assert row["source"] == "compute_cv" and row["spread_change"] is None and row["spread_change_se"] is None


def test_cli_json_has_quantiles_and_time_to_train():
    res = CliRunner().invoke(
        app,
        [
            "variability",
            "--model",
            "gpt3-1.3b",
            "--system",
            "dgx-h100",
            "--samples",
            "500",
            "--steps",
            "1000",
            "--deadline-hours",
            "100",
            "--within-s",
            "100",
            "--slow-gpus",
            "2",
            "--slow-factor",
            "1.5",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert {"p50_s", "p90_s", "p95_s", "p99_s", "attribution", "time_to_train", "p_within", "placement"} <= set(out)
    assert out["placement"]["worth"] >= 1.0
    # expected interruptions: the job's failure rate × the expected wall time, 8 GPUs at 50,000 h each
    t = out["time_to_train"]
    assert t["p50_s"] <= t["p90_s"] <= t["p95_s"] <= t["p99_s"]  # seconds, named as the step's quantiles
    assert t["expected_interruptions"] == pytest.approx(8 / (50_000 * 3600) * t["expected_s"], rel=1e-9)
    assert out["sensitivity"] and {"class", "dp95_per_cv_s", "critical_path_share"} <= set(out["sensitivity"][0])
    assert out["p50_s"] <= out["p90_s"] <= out["p95_s"] <= out["p99_s"] and out["p_within"]["probability"] == 1.0


def test_cli_text_says_a_rare_interruption_and_the_deadline_in_the_quantiles_unit():
    """User probe 6: 0.167 expected interruptions printed as '0 interruptions expected', and a deadline of 0.078 s
    beside quantiles in ms. Expected here: the JSON's count at two significant digits; the --within-s given in
    the unit the step takes (a gpt3-1.3b step on 8 H100 is over a second: '100.000 s')."""
    args = ["variability", "--model", "gpt3-1.3b", "--system", "dgx-h100", "--samples", "200", "--steps", "1000"]
    args += ["--within-s", "100"]
    out = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    n = out["time_to_train"]["expected_interruptions"]
    assert 0 < n < 0.1  # 8 GPUs at 50,000 h each over about a thousand steps of a few seconds
    text = " ".join(CliRunner().invoke(app, args).stdout.split())
    assert f"{n:.2g} interruptions expected" in text and "0 interruptions expected" not in text
    assert "P(step ≤ 100.000 s) 100.0%" in text


def test_cdf_plot_is_a_png(tmp_path):
    import pytest

    pytest.importorskip("matplotlib")
    from itercast.report.plots import step_cdf_png

    path = step_cdf_png(np.random.default_rng(0).normal(1.0, 0.01, 500), 0.98, tmp_path / "cdf.png", "t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_noise_from_a_profiling_database_is_the_median_cv_of_its_repeats(tmp_path):
    db = ProfileDB(tmp_path / "p.db")
    dev = db.device("synthetic", {})
    rows = [Measurement("gemm", "mm", 1e6, 1.0, time_std_s=cv, repeats=5) for cv in (0.1, 0.2, 0.3)]
    rows += [Measurement("conv", "conv2d_fwd", 1e6, 2.0, time_std_s=1.0, repeats=2)]  # too few repeats
    rows += [Measurement("elementwise", "add", 1e6, 1.0, time_std_s=0.9, repeats=5)]  # not a compute family
    rows += [Measurement("collective", "all_reduce", 1e6, 2.0, 2, time_std_s=1.0, repeats=10)]
    db.add(dev, rows)
    assert noise_from_profile(db.measurements()) == {"compute_cv": 0.2, "comm_cv": 0.5}
    cli = ["variability", "--model", "gpt3-1.3b", "--system", "dgx-h100", "--samples", "200", "--json"]
    res = CliRunner().invoke(app, [*cli, "--noise-from-db", str(tmp_path / "p.db")])
    assert res.exit_code == 0, res.output
    model = json.loads(res.stdout)["model"]
    assert (model["compute_cv"], model["comm_cv"], model["gpu_cv"]) == (0.2, 0.5, 0.05)
    res = CliRunner().invoke(app, ["variability", "--example", "--noise-from-db", str(tmp_path / "none.db")])
    assert res.exit_code != 0 and "no such profiling database" in res.output


def sampled_ratios(job, model: VariabilityModel, category: Category, n: int = 20_000) -> np.ndarray:
    """Sampled over deterministic durations (tasks × n) of the step's tasks of `category` that take time."""
    graph = TransformerStepBuilder(job).build()
    tasks = np.flatnonzero((graph.category == category) & (graph.duration_s > 0))
    return StepSampler(job, graph, model)(np.random.default_rng(0), n)[tasks] / graph.duration_s[tasks, None]


def lognormal_draws(cv: float, shape: tuple[int, ...]) -> np.ndarray:
    """Log-normal factors of mean 1 and coefficient of variation cv: σ² = ln(1 + cv²), μ = −σ²/2."""
    sigma = np.sqrt(np.log1p(cv * cv))
    return np.random.default_rng(1).lognormal(-(sigma**2) / 2, sigma, shape)


def test_a_compute_task_varies_as_the_slowest_of_its_tensor_and_context_parallel_peers():
    # tp 2 × cp 2: the task stands for 4 GPUs that meet at the next collective: the maximum of 4
    # draws (order statistics), against drawing the 4 and keeping the largest. One data-parallel replica
    # (pp 2 fills the node): no slowest replica's sum to condition on (test_variability_runs has that)
    job = tiny_job(tensor_parallel=2, context_parallel=2, pipeline_parallel=2, global_batch_size=2)
    ratio = sampled_ratios(job, VariabilityModel(0.1, 0, 0, 0), Category.COMPUTE)[0]
    assert stats.ks_2samp(ratio, lognormal_draws(0.1, (20_000, 4)).max(axis=1)).statistic < 0.02
    alone_job = tiny_job(pipeline_parallel=8, global_batch_size=8)
    alone = sampled_ratios(alone_job, VariabilityModel(0.1, 0, 0, 0), Category.COMPUTE)[0]
    assert stats.ks_2samp(alone, lognormal_draws(0.1, (20_000,))).statistic < 0.02


def test_communication_noise_has_mean_one_and_the_requested_cv():
    ratio = sampled_ratios(
        tiny_job(tensor_parallel=2, global_batch_size=4), VariabilityModel(0, 0.2, 0, 0), Category.COMMUNICATION
    )
    assert ratio.mean() == pytest.approx(1.0, abs=3e-3)  # one task alone: 1 ± 0.2 / √20,000 = 1.4e-3
    assert ratio[0].std() == pytest.approx(0.2, rel=0.03)


def test_the_network_factor_is_shared_by_every_communication_task_of_a_step():
    ratio = sampled_ratios(
        tiny_job(tensor_parallel=2, global_batch_size=4), VariabilityModel(0, 0, 0.1, 0), Category.COMMUNICATION, 1000
    )
    assert ratio.shape[0] > 1 and np.allclose(ratio, ratio[0])  # one factor per sample for all tasks
    assert ratio[0].std() == pytest.approx(0.1, rel=0.15)  # and it varies from step to step


def test_sensitivity_follows_the_critical_path_not_the_cv():
    # rank 0: a 1 s GEMM; rank 1 beside it: a 0.2 s DP all-gather. No other noise. Adding CV δ = 0.25
    # to the GEMM: the step is the GEMM's lognormal, p95 = e^(1.645σ − σ²/2) with σ² = ln(1 + δ²):
    # σ = 0.24622, p95 = e^(1.6449·0.24622 − 0.03031) = e^(0.37470) = 1.45455 s, so dp95/δ = 0.45455 / 0.25
    # = 1.818 s per CV.
    # The all-gather would need a factor of 5 to matter: 0 s per CV, however noisy it is
    from itercast.graph.execgraph import Category, GraphBuilder
    from itercast.stochastic.variability import StepGraph, VariabilityModel, graph_sensitivity

    b = GraphBuilder()
    b.task("gemm", b.resource(0, "compute"), 1.0, Category.COMPUTE, "gemm")
    b.task("ag", b.resource(1, "dp_comm"), 0.2, Category.COMMUNICATION, "dp_all_gather")
    step = StepGraph(b.build(), 1, 1)
    quiet = VariabilityModel(0.0, 0.0, 0.0, 0.0, 0.0)
    got = {r["class"]: r for r in graph_sensitivity(step, quiet, delta_cv=0.25, samples=20_000)}
    assert got["gemm"]["dp95_per_cv_s"] == pytest.approx(1.818, rel=0.03)
    assert got["gemm"]["critical_path_share"] == 1.0 and got["gemm"]["critical_path_s"] == 1.0
    assert got["all-gather × DP"]["dp95_per_cv_s"] == 0.0
    assert got["all-gather × DP"]["critical_path_s"] == 0.0 and got["all-gather × DP"]["total_s"] == 0.2


def test_collectives_are_named_by_kind_and_group():
    from itercast.stochastic.variability import class_label

    assert class_label("tp_reduce_scatter") == "reduce-scatter × TP"
    assert class_label("ep_alltoall") == "all-to-all × EP"
    assert class_label("pp_p2p") == "send/recv × PP"
    assert class_label("etp_all_gather") == "all-gather × expert TP"
    assert class_label("gemm") == "gemm"


def test_a_step_ending_exactly_at_the_target_is_within_it():
    dist = StepDistribution(1.0, np.array([1.0, 2.0, 3.0, 4.0]))
    # P(step ≤ t): at t = 2 s the samples 1 and 2 s, 2 of 4 (the one ending at 2 s included); at 1.5 s, 1 of 4
    assert dist.probability_within(2.0) == 0.5
    assert dist.probability_within(1.5) == 0.25


def test_rows_timed_exactly_the_minimum_number_of_repeats_give_the_noise():
    rows = [Measurement("gemm", "mm", 1e6, 1.0, time_std_s=cv, repeats=3) for cv in (0.1, 0.3)]
    rows += [Measurement("collective", "all_reduce", 1e6, 2.0, 2, time_std_s=0.5, repeats=3)]
    # 3 repeats meet min_repeats 3: compute CV the median of 0.1 / 1 and 0.3 / 1 = 0.2; comm 0.5 / 2.0 = 0.25
    assert noise_from_profile(rows, min_repeats=3) == pytest.approx({"compute_cv": 0.2, "comm_cv": 0.25})


def test_the_routers_load_scales_only_the_routed_experts_share_of_a_task():
    # One 1 s compute task, half of it the routed experts' work (share 0.5); only moe_imbalance_cv = 0.2
    # varies. Its duration is 1 s × (1 + 0.5 (L − 1)), L log-normal of mean 1 and CV 0.2: mean 1 s,
    # std 0.5 × 0.2 = 0.1 s, and never below the unrouted half (L > 0: above 1 − 0.5 = 0.5 s)
    b = GraphBuilder()
    b.task("expert_gemm", b.resource(0, "compute"), 1.0, Category.COMPUTE, "gemm")
    step = StepGraph(b.build(), 1, 1, expert_share=np.array([0.5]))
    model = VariabilityModel(0.0, 0.0, 0.0, 0.0, moe_imbalance_cv=0.2)
    dur = GraphSampler(step, model)(np.random.default_rng(0), 20_000)[0]
    assert dur.mean() == pytest.approx(1.0, abs=3e-3)  # standard error 0.1 / √20,000 = 7e-4
    assert dur.std() == pytest.approx(0.1, rel=0.03)
    assert dur.min() > 0.5


def test_the_summary_names_the_interval_that_best_meets_the_deadline_only_where_it_beats_the_least_expected():
    t = {"deadline_probability": 0.90, "best_deadline_probability": 0.99, "deadline_interval_s": 1800.0}
    assert _deadline_interval(t) == " (99.0% checkpointing every 30 min, the best for the deadline)"
    assert _deadline_interval({**t, "best_deadline_probability": 0.90}) == ""
    assert _deadline_interval({**t, "best_deadline_probability": None}) == ""
