"""Search objectives: seconds and GPU-hours per token by hand, the time × GPU-hours front by hand,
ranking by each objective, and --num-nodes-range / --objective on the command line."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import parse_section
from itercast.errors import ConfigError
from itercast.graph.execgraph import Category, GraphBuilder
from itercast.search import distribution_rank
from itercast.search.distribution_rank import DistributionOptions, rank_by_distribution
from itercast.search.objectives import (
    check_objective,
    objective_values,
    pareto_front,
    time_cost_front,
    token_figures,
)
from itercast.search.plan_search import SearchRequest, SearchResult, run_search
from itercast.search.plan_space import SpaceOptions
from itercast.stochastic.variability import StepGraph, VariabilityModel

MODEL = {"family": "llama", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8}
MODEL |= {"num_query_groups": 4, "seq_length": 256, "vocab_size": 1000}
OPTIONS = SpaceOptions(micro_batch_sizes=(1, 2), max_context_parallel=2, max_virtual_pipeline=2)


def request_over(node_counts: tuple[int, ...], **fields) -> SearchRequest:
    base = parse_section("plan", {"global_batch_size": 16})
    model = parse_section("model", MODEL)
    system = parse_section("system", {"preset": "dgx-h100", "num_nodes": 1})
    options = fields.pop("options", OPTIONS)
    return SearchRequest(model, system, base, node_counts, options, **fields)  # type: ignore[arg-type]


def test_seconds_and_gpu_hours_per_token_by_hand():
    # Llama 3 70B-like step: global batch 1024 × sequence 8192 = 8,388,608 tokens, 2.0 s on 64 GPUs
    f = token_figures(2.0, 1024, 8192, 64, token_budget=1e12)
    assert f["seconds_per_token"] == pytest.approx(2.0 / 8_388_608)  # 2.384e-7 s
    assert f["gpu_hours_per_token"] == pytest.approx(64 * 2.0 / 3600 / 8_388_608)  # 4.239e-9 GPU-h
    assert f["time_to_budget_s"] == pytest.approx(1e12 * 2.0 / 8_388_608)  # 238,419 s, 2.76 days
    assert f["gpu_hours_to_budget"] == pytest.approx(1e12 * 128 / 3600 / 8_388_608)  # 4,238.6 GPU-h
    assert "time_to_budget_s" not in token_figures(2.0, 1024, 8192, 64, token_budget=None)


def test_objectives_rank_by_hand():
    # plan A: 8 GPUs, 2.0 s (16 GPU-s per step); plan B: 16 GPUs, 1.2 s (19.2 GPU-s); global batch 16 × 256
    step_s, gpus = np.array([2.0, 1.2]), np.array([8, 16])
    tokens = 16 * 256
    assert list(objective_values("step", step_s, 16, 256, gpus, False)) == [2.0, 1.2]  # B first
    per_token = objective_values("tokens-per-s", step_s, 16, 256, gpus, False)
    assert per_token == pytest.approx([2.0 / tokens, 1.2 / tokens])  # B first
    cost = objective_values("gpu-hours-per-token", step_s, 16, 256, gpus, False)
    assert cost == pytest.approx([16 / 3600 / tokens, 19.2 / 3600 / tokens])  # A first
    # several global batches: `step` ranks per token (a larger batch's step does more)
    varied = objective_values("step", step_s, np.array([16, 32]), 256, gpus, True)
    assert varied == pytest.approx([2.0 / (16 * 256), 1.2 / (32 * 256)])


def test_pareto_front_keeps_only_undominated_points():
    time_s = np.array([1.0, 1.0, 2.0, 3.0, 3.0, 0.5])
    cost = np.array([5.0, 5.0, 4.0, 4.0, 1.0, 6.0])
    # 0.5 @ 6 (fastest), 1.0 @ 5 (first of two equal points), 2.0 @ 4, 3.0 @ 1 (cheapest);
    # 3.0 @ 4 is dominated by 2.0 @ 4 (as cheap, faster)
    assert pareto_front(time_s, cost, np.arange(6)) == [5, 0, 2, 4]


def test_time_cost_front_across_node_counts_by_hand():
    # global batch 1024 × 8192 tokens; GPU-seconds per step = GPUs × step
    def row(nodes: int, step_s: float) -> dict:
        plan = {"global_batch_size": 1024}
        return {"plan": plan, "num_nodes": nodes, "num_gpus": 8 * nodes, "fast_step_time_s": step_s}

    rows = [
        row(1, 3.75),  # A: 8 × 3.75 = 30 GPU-s, the cheapest: on the front
        row(2, 2.2),  # B: 16 × 2.2 = 35.2 GPU-s, slower and dearer than C: dominated
        row(4, 1.0),  # C: 32 × 1.0 = 32 GPU-s: on the front
        row(8, 0.6),  # D: 64 × 0.6 = 38.4 GPU-s, the fastest: on the front
        row(8, 0.7),  # E: 64 × 0.7 = 44.8 GPU-s, slower and dearer than D: dominated
    ]
    front = time_cost_front(rows, 8192, token_budget=1e12)
    assert [r["num_nodes"] for r in front] == [8, 4, 1]  # D, C, A: fastest first
    tokens = 1024 * 8192
    assert front[0]["fast_seconds_per_token"] == pytest.approx(0.6 / tokens)
    assert front[1]["fast_gpu_hours_per_token"] == pytest.approx(32 / 3600 / tokens)
    assert front[2]["fast_time_to_budget_s"] == pytest.approx(1e12 * 3.75 / tokens)


def test_search_reports_token_figures_and_ranks_by_gpu_hours():
    by_cost = run_search(request_over((1, 2), top_k=5, objective="gpu-hours-per-token"))
    tokens = 16 * 256
    for p in by_cost.plans:
        assert p["seconds_per_token"] == pytest.approx(p["step_time_s"] / tokens)
        assert p["gpu_hours_per_token"] == pytest.approx(p["num_gpus"] * p["step_time_s"] / 3600 / tokens)
    costs = [p["gpu_hours_per_token"] for p in by_cost.plans]
    assert costs == sorted(costs)
    by_step = run_search(request_over((1, 2), top_k=5))
    times = [p["step_time_s"] for p in by_step.plans]
    assert times == sorted(times)
    # the front: no fitting plan the fast path priced is both faster and cheaper per token
    front = by_step.to_dict()["pareto_time_gpu_hours"]
    assert front and {r["num_nodes"] for r in front} <= {1, 2}
    s_tok = [r["fast_seconds_per_token"] for r in front]
    gpu_h = [r["fast_gpu_hours_per_token"] for r in front]
    assert s_tok == sorted(s_tok) and gpu_h == sorted(gpu_h, reverse=True)


def test_an_unknown_objective_names_the_choices():
    with pytest.raises(ConfigError, match=r"--objective: expected step \| tokens-per-s \| gpu-hours-per-token"):
        check_objective("p96")
    with pytest.raises(ConfigError, match="--objective"):
        run_search(request_over((1,), objective="cost"))


def job_file(tmp_path) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({"model": MODEL, "plan": {"global_batch_size": 16}, "system": {"preset": "dgx-h100"}}))
    return str(path)


SMALL = ["--micro-batch-sizes", "1,2", "--max-context-parallel", "2", "--max-virtual-pipeline", "2", "--workers", "1"]


@pytest.mark.parametrize("nodes", ["4:2", "0:2", "0", "1.5:3", "a:b", "2,x", "1,0", "2:", "1:1025"])
def test_a_bad_node_range_is_one_line(tmp_path, nodes):
    out = CliRunner().invoke(app, ["search", job_file(tmp_path), *SMALL, "--num-nodes-range", nodes])
    assert out.exit_code == 2 and "Traceback" not in out.output
    assert "--num-nodes-range" in out.output and len(out.output.strip().splitlines()) == 1


def test_a_list_of_node_counts_gives_the_front_in_json(tmp_path):
    args = ["search", job_file(tmp_path), *SMALL, "--num-nodes-range", "2,1", "--top", "3", "--json"]
    out = CliRunner().invoke(app, [*args, "--objective", "gpu-hours-per-token", "--token-budget", "1e9"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["objective"] == "gpu-hours-per-token" and doc["token_budget"] == 1e9
    assert doc["pareto_time_gpu_hours"] and all("fast_time_to_budget_s" in r for r in doc["pareto_time_gpu_hours"])
    assert {p["num_gpus"] for p in doc["plans"]} <= {8, 16}
    bad = CliRunner().invoke(app, ["search", job_file(tmp_path), *SMALL, "--objective", "p96"])
    assert bad.exit_code == 2 and "--objective: expected" in bad.output
    # the table and the report call its plans by the objective that ranked them, not "fastest"
    text = " ".join(CliRunner().invoke(app, [*args[:-1], "--objective", "gpu-hours-per-token"]).output.split())
    assert "best by gpu-hours-per-token 3: graph simulation" in text and "fastest 3" not in text
    saved = tmp_path / "s.json"
    saved.write_text(out.stdout)
    report = CliRunner().invoke(app, ["report", "--result", str(saved), "-o", str(tmp_path / "r.html")])
    assert report.exit_code == 0, report.output
    page = (tmp_path / "r.html").read_text()
    assert "itercast search: the best by gpu-hours-per-token plans" in page and "token budget 1,000,000,000" in page
    assert "the fastest plans" not in page


def test_a_list_of_node_counts_prints_the_front_as_a_table_without_a_budget(tmp_path):
    args = ["search", job_file(tmp_path), *SMALL, "--num-nodes-range", "1,2", "--top", "3"]
    table = CliRunner().invoke(app, args)
    assert table.exit_code == 0, table.output
    doc = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    # the front's rows, as the JSON gives them: tokens per second (1 / seconds a token) and GPU-hours a
    # million tokens; no days or GPU-hours to a budget, none was given
    assert "time × GPU-hours per token front (fast path)" in table.output and "to budget" not in table.output
    for r in doc["pareto_time_gpu_hours"]:
        assert f"{1 / r['fast_seconds_per_token']:,.0f}" in table.output
        assert f"{r['fast_gpu_hours_per_token'] * 1e6:.3g}" in table.output


def test_without_variability_every_distribution_figure_is_the_deterministic_step():
    # all CVs 0: every sample is the graph's own step, so p50 = p95 = p99 = mean = step_time_s
    request = request_over((1,), objective="mean", top_k=3)
    still = DistributionOptions(VariabilityModel(0.0, 0.0, 0.0, 0.0, 0.0), samples=200, top=3)
    result = rank_by_distribution(run_search(request), request, still)
    for r in result.plans:
        d = r["distribution"]
        assert d["p50_s"] == d["p95_s"] == d["p99_s"] == pytest.approx(r["step_time_s"], rel=1e-12)
        assert d["mean_s"] == pytest.approx(r["step_time_s"], rel=1e-12)
    assert [r["deterministic_rank"] for r in result.plans] == [1, 2, 3]
    assert (
        result.ranking_note == "variability does not change the ranking: by mean the 3 plans sampled keep their order"
    )


def one_task(duration_s: float, category: Category) -> StepGraph:
    """A step that is one task on one GPU (a host task does not vary)."""
    b = GraphBuilder()
    b.task("step", b.resource(0, "compute"), duration_s, category, "gemm")
    return StepGraph(b.build(), gpus_per_task=1, gpus_per_rank=1)


def rank_graphs(
    monkeypatch,
    graphs: dict[str, StepGraph],
    objective: str,
    options: DistributionOptions,
    batches: dict[str, int] | None = None,
) -> SearchResult:
    """Plans named after their one-task step graphs, in the dict's (deterministic) order, sampled and
    re-ranked by `objective`; `batches`: each plan's global batch, searched over those sizes (else 16 each)."""
    monkeypatch.setattr(distribution_rank, "plan_job", lambda request, row: row["plan"]["name"])
    monkeypatch.setattr(distribution_rank, "build_transformer_step", lambda name, calibration: graphs[name])
    gbs = batches or dict.fromkeys(graphs, 16)
    plans = [
        {
            "plan": {"name": n, "global_batch_size": gbs[n]},
            "num_gpus": 8,
            "step_time_s": float(g.graph.duration_s.sum()),
        }
        for n, g in graphs.items()
    ]
    result = SearchResult(plans, [], [], [], 2, 2, 2, 0.0, 0.0, objective=objective)
    searched = replace(OPTIONS, global_batch_sizes=tuple(sorted(set(gbs.values()))))
    return rank_by_distribution(result, request_over((1,), objective=objective, options=searched), options)


def test_over_several_global_batches_the_distribution_ranks_per_sequence(monkeypatch):
    """A: 3.2486 s for 64 sequences (0.050759 s each), B: 12.8526 s for 256 (0.050205 s each), no variability:
    by p50 B stays first, as the step objective ranks them over several batches (per sequence), though its
    step is 4× A's."""
    graphs = {"B": one_task(12.8526, Category.COMPUTE), "A": one_task(3.2486, Category.COMPUTE)}
    still = DistributionOptions(VariabilityModel(0.0, 0.0, 0.0, 0.0, 0.0), samples=50, top=2)
    ranked = rank_graphs(monkeypatch, graphs, "p50", still, batches={"A": 64, "B": 256})
    assert [r["plan"]["name"] for r in ranked.plans] == ["B", "A"]
    assert ranked.ranking_note.startswith("variability does not change the ranking")


def two_plans(monkeypatch, objective: str, compute_cv: float) -> SearchResult:
    """Plan A: 10 s, all of it one compute task of CV `compute_cv`; plan B: 10.5 s, no variability.
    Deterministically A is first."""
    graphs = {"A": one_task(10.0, Category.COMPUTE), "B": one_task(10.5, Category.HOST)}
    options = DistributionOptions(VariabilityModel(compute_cv, 0.0, 0.0, 0.0, 0.0), samples=20_000, top=2)
    return rank_graphs(monkeypatch, graphs, objective, options)


def test_p95_ranks_a_steady_plan_above_a_faster_noisy_one(monkeypatch):
    # A's step is 10 s × a lognormal of mean 1 and CV c: σ = sqrt(ln(1 + c²)), p95 = 10·e^(1.6449σ − σ²/2)
    # (1.6449: the standard normal's 95th percentile). c = 0.15: σ = sqrt(ln 1.0225) = 0.14917,
    # p95 = 10·e^(0.24537 − 0.01113) = 10·e^0.23424 = 12.64 s > 10.5 s: by p95 B is first
    ranked = two_plans(monkeypatch, "p95", 0.15)
    assert [r["plan"]["name"] for r in ranked.plans] == ["B", "A"]
    assert [r["deterministic_rank"] for r in ranked.plans] == [2, 1]
    assert ranked.plans[1]["distribution"]["p95_s"] == pytest.approx(12.64, rel=5e-3)
    assert ranked.plans[0]["distribution"]["p95_s"] == 10.5
    assert ranked.ranking_note == (
        "variability changes the ranking: rank 1 by p95 is rank 2 deterministically; 2 of the 2 plans sampled move"
    )
    # the median does not flip: 10·e^(−σ²/2) = 10·e^−0.01113 = 9.889 s < 10.5 s
    by_median = two_plans(monkeypatch, "p50", 0.15)
    assert [r["plan"]["name"] for r in by_median.plans] == ["A", "B"]
    assert by_median.plans[0]["distribution"]["p50_s"] == pytest.approx(9.889, rel=5e-3)
    # nor does p95 when c is small: c = 0.02, σ = sqrt(ln 1.0004) = 0.019998,
    # p95 = 10·e^(0.032895 − 0.0002) = 10·e^0.032695 = 10.332 s < 10.5 s
    calm = two_plans(monkeypatch, "p95", 0.02)
    assert [r["plan"]["name"] for r in calm.plans] == ["A", "B"]
    assert calm.plans[0]["distribution"]["p95_s"] == pytest.approx(10.332, rel=1e-3)


def test_a_run_level_common_to_both_plans_keeps_their_order_by_hand(monkeypatch):
    """A: one 10 s compute task, B: one 10.1 s compute task, only the run level (run_cv c = 10%).
    Across runs each sample is a step of a fresh run, T × F, F log-normal of mean 1 and CV c:
    σ² = ln(1 + c²) = ln(1.01) = 0.0099503, σ = 0.0997513, p95 = T × e^{1.6449σ − σ²/2}
    = T × e^{0.164081 − 0.004975} = T × 1.17246: A 11.7246 s, B 11.8418 s. Both graphs have one shape and
    one seed, so B's samples are A's × 10.1/10 draw for draw (common random numbers) and every quantile
    ratio is the deterministic one, 1.01, exactly: the order stays. Monte Carlo: A's p95 has a standard
    error of σ × √(0.95·0.05/20,000)/φ(1.6449) = 0.0998 × 0.0149 = 0.15% of itself; 0.6% is 4 of them.
    Within one run the run's factor is 1: every sample is T itself."""
    model = VariabilityModel(0.0, 0.0, 0.0, 0.0, 0.0, run_cv=0.10)
    graphs = {"A": one_task(10.0, Category.COMPUTE), "B": one_task(10.1, Category.COMPUTE)}
    across = rank_graphs(monkeypatch, graphs, "p95", DistributionOptions(model, 20_000, top=2, across_runs=True))
    assert [r["plan"]["name"] for r in across.plans] == ["A", "B"]
    a, b = (r["distribution"] for r in across.plans)
    assert a["p95_s"] == pytest.approx(11.7246, rel=0.006)
    for key in ("p50_s", "p95_s", "p99_s", "mean_s"):
        assert b[key] / a[key] == pytest.approx(1.01, rel=1e-12)
    assert across.ranking_note.startswith("variability does not change the ranking")
    one_run = rank_graphs(monkeypatch, graphs, "p95", DistributionOptions(model, 2_000, top=2))
    assert [r["distribution"]["p95_s"] for r in one_run.plans] == pytest.approx([10.0, 10.1], rel=1e-12)


def test_the_run_level_on_the_command_line(tmp_path):
    # --across-runs: the run level is passed to the sampling (the json's model and across_runs), no note;
    # without it the table says the ranking leaves the run level out
    args = ["search", job_file(tmp_path), *SMALL, "--top", "2", "--objective", "p95", "--samples", "200"]
    out = CliRunner().invoke(app, [*args, "--run-cv", "0.05", "--across-runs", "--json"])
    assert out.exit_code == 0, out.output
    sampling = json.loads(out.stdout)["distribution"]
    assert sampling["model"]["run_cv"] == 0.05 and sampling["across_runs"] is True and sampling["notes"] == []
    table = CliRunner().invoke(app, [*args, "--run-cv", "0.05"])
    assert table.exit_code == 0, table.output
    assert "note: run level (--run-cv 0.05) not in the sampled steps ranked by p95" in " ".join(table.output.split())


def test_distribution_objective_on_the_command_line(tmp_path):
    args = ["search", job_file(tmp_path), *SMALL, "--top", "3", "--objective", "p95", "--samples", "200"]
    out = CliRunner().invoke(app, [*args, "--distribution-top", "2", "--compute-cv", "0.03", "--seed", "7", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert (
        doc["distribution"]["top"] == 2 and doc["distribution"]["samples"] == 200 and doc["distribution"]["seed"] == 7
    )
    assert doc["distribution"]["model"]["compute_cv"] == 0.03 and doc["distribution"]["across_runs"] is False
    assert doc["distribution"]["notes"] == []  # no --run-cv: nothing left out
    sampled = [p for p in doc["plans"] if p["distribution"] is not None]
    assert len(sampled) == 2 and doc["plans"][2]["distribution"] is None and doc["plans"][2]["deterministic_rank"] == 3
    p95s = [p["distribution"]["p95_s"] for p in sampled]
    assert p95s == sorted(p95s) and doc["ranking_note"].startswith("variability ")
    table = CliRunner().invoke(app, [*args, "--distribution-top", "2"])
    assert table.exit_code == 0, table.output
    assert "p95 s" in table.output and "det #" in table.output and "variability " in table.output
    # 2 of the 3 plans shown sampled: the title says so (user probe 11: it read "best by p95 3")
    assert "best by p95 2, then 1 unsampled: graph simulation" in table.output


@pytest.mark.parametrize(
    ("option", "value"), [("--objective", "p96"), ("--distribution-top", "0"), ("--distribution-top", "-3")]
)
def test_bad_distribution_options_are_one_line(tmp_path, option, value):
    args = ["search", job_file(tmp_path), *SMALL, "--objective", "p95", option, value]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 2 and "Traceback" not in out.output
    assert option in out.output and len(out.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--samples", "5000", "--compute-cv", "0.5"], "--samples, --compute-cv"),
        (["--across-runs", "--run-cv", "0.1"], "--run-cv, --across-runs"),
        (["--objective", "tokens-per-s", "--seed", "3"], "--seed"),
    ],
)
def test_sampling_options_under_a_deterministic_objective_are_one_error_line(options, named):
    """A probe found them accepted and ignored: the output identical with and without them."""
    args = ["search", "--model", "llama3-8b", "--system", "dgx-h100", "--set", "plan.global_batch_size=64", *options]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 2 and out.output.count("\n") == 1
    assert out.output.startswith(f"error: {named}: they sample the plans' steps for --objective p50|p95|p99|mean")
