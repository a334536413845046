"""Search objectives: seconds and GPU-hours per token by hand, the time × GPU-hours front by hand,
ranking by each objective, and --num-nodes-range / --objective on the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import parse_section
from itercast.errors import ConfigError
from itercast.search.objectives import (
    check_objective,
    objective_values,
    pareto_front,
    time_cost_front,
    token_figures,
)
from itercast.search.plan_search import SearchRequest, run_search
from itercast.search.plan_space import SpaceOptions

MODEL = {"family": "llama", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8}
MODEL |= {"num_query_groups": 4, "seq_length": 256, "vocab_size": 1000}
OPTIONS = SpaceOptions(micro_batch_sizes=(1, 2), max_context_parallel=2, max_virtual_pipeline=2)


def request_over(node_counts: tuple[int, ...], **fields) -> SearchRequest:
    base = parse_section("plan", {"global_batch_size": 16})
    model = parse_section("model", MODEL)
    system = parse_section("system", {"preset": "dgx-h100", "num_nodes": 1})
    return SearchRequest(model, system, base, node_counts, OPTIONS, **fields)  # type: ignore[arg-type]


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


@pytest.mark.parametrize("nodes", ["4:2", "0:2", "0", "1.5:3", "a:b", "2,x", "1,0", "2:"])
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


def test_without_variability_every_distribution_figure_is_the_deterministic_step():
    # all CVs 0: every sample is the graph's own step, so p50 = p95 = p99 = mean = step_time_s
    from itercast.stochastic.variability import VariabilityModel

    still = VariabilityModel(0.0, 0.0, 0.0, 0.0, 0.0)
    result = run_search(request_over((1,), objective="p95", top_k=3, variability=still, distribution_samples=200))
    for r in result.plans:
        d = r["distribution"]
        assert d["p50_s"] == d["p95_s"] == d["p99_s"] == pytest.approx(r["step_time_s"], rel=1e-12)
        assert d["mean_s"] == pytest.approx(r["step_time_s"], rel=1e-12)
    assert result.ranking_note == "p95 keeps the deterministic order of the 3 plans"


def test_p95_ranks_a_steady_plan_above_a_faster_noisy_one(monkeypatch):
    # A: 10 s deterministic, its whole step one lognormal task of CV-parameter 0.1: p95 = 10·e^(1.645·0.1)
    # = 11.79 s; B: 10.5 s, no noise. Deterministically A first; by p95 B first, A second
    from scipy.stats import norm

    from itercast.search import plan_search
    from itercast.stochastic.variability import StepDistribution

    z = norm.ppf((np.arange(20_000) + 0.5) / 20_000)
    samples = {10.0: 10.0 * np.exp(0.1 * z), 10.5: np.full(20_000, 10.5)}
    monkeypatch.setattr(plan_search, "build_transformer_step", lambda job: job)
    monkeypatch.setattr(plan_search, "Job", type("J", (), {"from_dicts": staticmethod(lambda m, p, s: p["t"])}))
    monkeypatch.setattr(plan_search, "graph_distribution", lambda t, vm, n: StepDistribution(t, samples[t]))
    best = [{"plan": {"t": 10.0}, "num_nodes": 1}, {"plan": {"t": 10.5}, "num_nodes": 1}]
    note = plan_search._rank_by_distribution(request_over((1,), objective="p95"), best)
    assert [r["plan"]["t"] for r in best] == [10.5, 10.0]
    assert best[1]["distribution"]["p95_s"] == pytest.approx(10.0 * np.exp(0.1 * 1.6449), rel=1e-3)
    assert note == "p95 changes the ranking: its first plan is #2 deterministically; 2 of 2 plans move"
    # by the median A stays first: 10·e^0 = 10 s < 10.5 s
    best = [{"plan": {"t": 10.0}, "num_nodes": 1}, {"plan": {"t": 10.5}, "num_nodes": 1}]
    assert plan_search._rank_by_distribution(request_over((1,), objective="p50"), best).startswith("p50 keeps")
