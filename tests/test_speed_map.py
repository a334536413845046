"""Placement from a measured speed map (stochastic/placement.py map_speeds, read_speed_map), by hand on a
two-rank graph, and every bad speed map as one line (file, field, expected, got), exit 2 on the CLI; the
plan change beside it (search/job_slicing.py slice_job_at_speeds): the layers re-sliced over pipeline
stages of measured speeds, by hand on uniform layers."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import Job
from itercast.errors import ConfigError
from itercast.graph.execgraph import Category, GraphBuilder
from itercast.search.job_slicing import slice_job_at_speeds, stage_layers_of, unit_kinds_of
from itercast.search.layer_costs import job_layer_costs
from itercast.search.stage_slicing import LayerCosts, stage_candidates
from itercast.sim.engine import simulate
from itercast.stochastic.placement import map_speeds, read_speed_map, with_speeds
from itercast.stochastic.variability import build_transformer_step


def two_ranks():
    """Rank 0 computes 1 s, rank 1 computes 2 s, side by side: the step is the slower of the two."""
    b = GraphBuilder()
    b.task("a", b.resource(0, "compute"), 1.0, Category.COMPUTE, "gemm")
    b.task("b", b.resource(1, "compute"), 2.0, Category.COMPUTE, "gemm")
    return b.build()


def test_the_slow_gpus_go_together_to_the_rank_that_can_afford_them():
    # 2 GPUs per rank, GPU 1 at 0.6 and GPU 2 at 0.8. Rank order: rank 0 {0, 1} runs at 0.6, rank 1
    # {2, 3} at 0.8: max(1/0.6, 2/0.8) = 2.5 s. Best: both slow GPUs on rank 0 (its slowest 0.6), rank 1
    # at full speed: max(1/0.6, 2/1) = 2 s; the other way max(1, 2/0.6) = 3.333 s. Gain 2.5/2 = 1.25
    m = map_speeds(two_ranks(), 2, np.array([1.0, 0.6, 0.8, 1.0]))
    assert m.naive_s == pytest.approx(2.5) and m.best_s == pytest.approx(2.0) and m.gain == pytest.approx(1.25)
    assert m.best_gpus == ((1, 2), (0, 3)) and m.method == "exhaustive" and m.baseline_s == 2.0
    assert m.naive_speeds == (0.6, 0.8) and m.best_speeds == (0.6, 1.0)  # each rank at its slowest GPU


def three_ranks():
    """Ranks of 1, 2 and 3 s of compute side by side: the step is the slowest of w_r / (rank r's speed)."""
    b = GraphBuilder()
    for r, work_s in enumerate((1.0, 2.0, 3.0)):
        b.task(f"w{r}", b.resource(r, "compute"), work_s, Category.COMPUTE, "gemm")
    return b.build()


def test_the_heuristic_finds_the_optimum_of_every_gpu_assignment_on_a_tiny_case():
    # 6 GPUs at 0.5 … 1.0, 2 per rank. Every one of the 6! = 720 assignments of GPUs to rank slots,
    # by hand: step = max over ranks of work / (slowest of its two GPUs). The rank of 3 s needs the
    # two fastest (min 0.9): 3/0.9 = 3.333 s; then the rank of 2 s the next two (min 0.7): 2.857 s; the
    # rank of 1 s the slowest (min 0.5): 2 s. Rank order: ranks at 0.5, 0.7, 0.9: the same 3.333 s;
    # reversed (GPU 5 … 0) it would be 1/0.9, 2/0.7, 3/0.5 = 6 s
    speeds = [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    work_s = (1.0, 2.0, 3.0)
    brute = min(
        max(w / min(speeds[a], speeds[b]) for w, (a, b) in zip(work_s, (p[0:2], p[2:4], p[4:6]), strict=True))
        for p in itertools.permutations(range(6))
    )
    assert brute == pytest.approx(3 / 0.9)
    for limit, method in ((6, "exhaustive"), (0, "sorted pairing")):  # every block assignment; the heuristic
        m = map_speeds(three_ranks(), 2, np.array(speeds[::-1]), exhaustive_max_ranks=limit)
        assert m.method == method and m.best_s == pytest.approx(brute)
        assert m.best_gpus == ((4, 5), (2, 3), (0, 1))  # the 1 s rank takes GPUs 4 and 5 (0.6, 0.5)
        assert m.naive_s == pytest.approx(6.0) and m.gain == pytest.approx(6 / (3 / 0.9))


def test_the_p95_reranks_the_best_assignments_with_the_same_draws():
    # Without noise the p95 is the step: pricing it changes no choice, and the gains agree
    from itercast.stochastic.variability import StepGraph, VariabilityModel, graph_distribution

    step = StepGraph(three_ranks(), 1, 2)
    quiet = VariabilityModel(0.0, 0.0, 0.0, 0.0, 0.0)

    def p95(graph):
        return float(np.percentile(graph_distribution(StepGraph(graph, 1, 2), quiet, 200, 0).samples_s, 95))

    m = map_speeds(step.graph, 2, np.array([0.5, 0.6, 0.7, 0.8, 0.9, 1.0])[::-1], p95)
    assert m.best_p95_s == pytest.approx(3 / 0.9) and m.naive_p95_s == pytest.approx(6.0)
    assert m.p95_gain == pytest.approx(m.gain) and m.method == "exhaustive, the 5 best by the step re-ranked by p95"


def test_a_speed_map_names_gpus_or_nodes(tmp_path):
    path = tmp_path / "speeds.csv"
    path.write_text("gpu,speed\n1,0.6\n2,0.8\n")
    assert read_speed_map(path, 4, 2).tolist() == [1.0, 0.6, 0.8, 1.0]  # unnamed GPUs run at 1
    path.write_text("node,speed\n1,0.9\n")
    assert read_speed_map(path, 4, 2).tolist() == [1.0, 1.0, 0.9, 0.9]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu,speed\n4,0.9\n", "gpu 4: the job has 4 gpus"),
        ("node,speed\n2,0.9\n", "node 2: the job has 2 nodes"),
        ("gpu,speed\n1,0\n", "speed: expected a finite number > 0; got 0"),
        ("gpu,speed\n1,nan\n", "speed: expected a finite number > 0; got nan"),
        ("gpu,speed\n1,-2\n", "speed: expected a finite number > 0; got -2"),
        ("gpu,speed\none,1\n", "expected an integer gpu and a number speed"),
        ("rank,factor\n1,1\n", "header: expected columns gpu,speed or node,speed"),
        ("gpu,speed\n1,0.5\n1,0.6\n", "gpu 1 named twice"),
        ("gpu,speed\n0,1\n1,1\n2,1\n3,1\n0,1\n", "more rows than the job's 4 gpus"),
    ],
)
def test_a_bad_speed_map_is_one_line_naming_file_line_and_field(tmp_path, text, message):
    path = tmp_path / "speeds.csv"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_speed_map(path, 4, 2)


def test_the_cli_refuses_a_speed_map_of_gpus_the_job_does_not_have(tmp_path):
    path = tmp_path / "speeds.csv"
    path.write_text("gpu,speed\n5000,0.8\n")  # the example has 1,024 GPUs
    result = CliRunner().invoke(app, ["variability", "--example", "--samples", "100", "--speed-map", str(path)])
    assert result.exit_code == 2 and "gpu 5000: the job has 1024 gpus" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_cli_maps_a_speed_map_and_prices_both_mappings(tmp_path):
    # the example: 8 stages of 128 GPUs; one GPU per stage at 0.85 (GPUs 5, 133, …, 901). The 8 slow
    # GPUs fit one stage (8 ≤ 128), so the best mapping puts them all in one stage
    path = tmp_path / "speeds.csv"
    path.write_text("gpu,speed\n" + "".join(f"{128 * r + 5},0.85\n" for r in range(8)))
    result = CliRunner().invoke(
        app, ["variability", "--example", "--samples", "100", "--speed-map", str(path), "--json"]
    )
    assert result.exit_code == 0, result.output
    sm = json.loads(result.output)["speed_map"]
    assert len(sm["slowest_gpus_on_ranks"]) == 1 and len(sm["best_gpus_per_rank"]) == 8
    assert sm["baseline_s"] < sm["best_s"] < sm["naive_s"] and sm["gain"] == sm["naive_s"] / sm["best_s"]
    assert sm["p95_gain"] == sm["naive_p95_s"] / sm["best_p95_s"] and sm["p95_gain"] > 1
    # every stage holds one slow GPU under the rank order: all 8 at 0.85, nothing to re-balance, so the
    # plan change keeps the even 12 layers per stage (the plan as it was wins its tie) and gains nothing
    pc = sm["plan_change"]
    assert pc["stage_layers"] == pc["stage_layers_before"] == [12] * 8
    assert pc["plan_change_s"] == sm["naive_s"] and pc["gain"] == 1.0
    assert pc["combined_s"] <= sm["best_s"] and pc["helps_more_by_p95"] == "the mapping"


def test_the_slicer_gives_a_half_speed_stage_fewer_layers():
    # 16 layers of 1 s, no sends, 4 stages, stage 1 at 0.5 (its layers take 2 s), M = 8 micro-batches;
    # step = (M − 1)·max + Σ. Stage 1 with n layers, the other 16 − n over three stages as evenly as they go:
    #   n = 1: 5, 5, 5 and 2 → max 5, Σ 15 + 2 = 17 → 7·5 + 17 = 52
    #   n = 2: 5, 5, 4 and 4 → max 5, Σ 14 + 4 = 18 → 53
    #   n = 3: 5, 4, 4 and 6 → max 6, Σ 13 + 6 = 19 → 61
    # (any uneven split of the others raises the max by 1 s at least: +7). The even split 4, 4, 4, 4:
    # max 8, Σ 12 + 8 = 20 → 76
    layer = LayerCosts.of(np.ones(16))
    half = LayerCosts.of(np.full(16, 2.0))
    found = stage_candidates([layer, half, layer, layer], 8, slack=0.05)
    assert found[0].boundaries == [0, 5, 6, 11] and found[0].step_time_s == 52.0
    # one slicing per bottleneck (the least Σ for it): bottleneck 5 is n = 1's; 6 gives 61 > 52 · 1.05
    assert len(found) == 1


SMALL = {"family": "llama", "num_layers": 16, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 1024}
SMALL |= {"ffn_hidden_size": 4096, "vocab_size": 512}
PLAN = {"tensor_parallel": 2, "pipeline_parallel": 4, "global_batch_size": 8, "micro_batch_size": 1}
NODE = {"preset": "dgx-h100", "num_nodes": 1}  # 8 GPUs: tp 2 × pp 4, dp 1, 8 micro-batches


def test_the_plan_change_re_slices_around_a_half_speed_stage():
    # Transformer Engine's loss (one all-gather over the tp group) keeps the head short enough for the
    # lumped objective to prefer the slicing the simulation rejects; Megatron's three all-reduces do not
    job = Job.from_dicts(SMALL, PLAN | {"cross_entropy": "te"}, NODE)
    costs, _ = job_layer_costs(job)
    e, t, h, send = costs.time_s[0], costs.time_s[1], costs.time_s[-1], costs.send_s[0]
    # the units: embedding e, 16 layers of t, head h; a stage that is not the last sends (send). With
    # stage 1 at 0.5 (2t a layer) the lumped objective, as in the test above, wants 15 layers on the
    # other stages, 5 each: (5, 1, 5, 5), max 5t + max(e + send, h), Σ 17t + e + h + 3·send; runner-up
    # (5, 2, 5, 4), max 5t + e + send, Σ 18t + the same. The first wins when 7·(h − e − send) < t:
    assert 7 * (h - e - send) < t and e + send < h  # ≈ 7·(102 − 44 − 14) = 310 µs < 347 µs; 58 < 102 µs
    speed = np.array([1.0, 0.5, 1.0, 1.0])
    per_stage = [LayerCosts(costs.time_s / v, costs.send_s, costs.static_bytes, costs.activation_bytes) for v in speed]
    lumped = [stage_layers_of(sl, unit_kinds_of(job)) for sl in stage_candidates(per_stage, 8, slack=0.05)]
    assert lumped == [(5, 1, 5, 5), (5, 2, 5, 4)]
    # simulated, (5, 1, 5, 5) loses: its stages 2 and 3 both take 5 layers, and in 1F1B's steady state
    # stage 3's next forward waits for stage 2's backward and forward and two sends (5t + 2 sends a
    # micro-batch, above 5t + h); (5, 2, 5, 4) leaves stage 3 one layer of slack
    got = slice_job_at_speeds(job, speed)
    assert got.stage_layers == (5, 2, 5, 4) and got.job.plan.tensor_parallel == 2 and got.candidates == 2
    naive_s = simulate(with_speeds(build_transformer_step(job).graph, speed)).step_time_s
    assert got.step_s < naive_s
    assert got.step_s == simulate(got.step.graph).step_time_s  # the graph it returns is the one it timed


def test_an_interleaved_plan_is_re_sliced_by_its_stages_totals():
    # 16 layers, pp 4 × vp 2, stage 1 at 0.5: totals in proportion to the speeds, 16 × (1, 0.5, 1, 1) / 3.5 =
    # 4.571, 2.286, 4.571, 4.571, floors 4, 2, 4, 4 (14), the two largest remainders (0.571, stages 0 and 2) up:
    # (5, 2, 5, 4), bottleneck max(5, 2/0.5, 5, 4) = 5. Moving one layer from stage 0 or 2 to stage 3: (4, 2, 5, 5)
    # or (5, 2, 4, 5), also 5; to stage 1, (4, 3, 5, 4): 3/0.5 = 6. Each stage's total over its 2 chunks, the
    # first the larger, virtual stage c on stage c mod 4: (5, 2, 5, 4) → chunks 3, 1, 3, 2 then 2, 1, 2, 2
    from itercast.search.job_slicing import interleaved_layers

    speed = np.array([1.0, 0.5, 1.0, 1.0])
    found = interleaved_layers(16, 4, 2, speed)
    assert found[0] == (3, 1, 3, 2, 2, 1, 2, 2)
    assert {tuple(sum(f[s::4]) for s in range(4)) for f in found[:3]} == {(5, 2, 5, 4), (4, 2, 5, 5), (5, 2, 4, 5)}
    assert all(max(sum(f[s::4]) / speed[s] for s in range(4)) == 5 for f in found[:3])
    assert all(min(f) >= 1 and sum(f) == 16 for f in found)
    # the job: the plan as it was (2 layers a chunk) or one of these, whichever the simulation at the speeds prices
    # least, and not slower than as it was
    job = Job.from_dicts(SMALL, PLAN | {"virtual_pipeline": 2, "schedule": "interleaved-1f1b"}, NODE)
    got = slice_job_at_speeds(job, speed)
    naive_s = simulate(with_speeds(build_transformer_step(job).graph, speed)).step_time_s
    assert got.stage_layers in found[:3] and got.step_s < naive_s


def job_file(tmp_path, plan):
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({"model": SMALL, "plan": plan, "system": NODE}))  # YAML reads JSON
    return path


def test_the_cli_reports_the_plan_change_beside_the_mapping(tmp_path):
    speeds = tmp_path / "speeds.csv"
    speeds.write_text("gpu,speed\n2,0.5\n3,0.5\n")  # stage 1's two GPUs (tp 2) at half speed
    args = ["variability", str(job_file(tmp_path, PLAN)), "--samples", "100", "--speed-map", str(speeds)]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    sm = json.loads(result.output)["speed_map"]
    pc = sm["plan_change"]
    assert pc["stage_layers_before"] == [4, 4, 4, 4] and pc["stage_layers"] == [5, 2, 5, 4]
    assert pc["plan_change_s"] < sm["naive_s"] and pc["gain"] == sm["naive_s"] / pc["plan_change_s"]
    assert pc["p95_gain"] == sm["naive_p95_s"] / pc["plan_change_p95_s"]
    # re-slicing may keep the plan as it was, so it never loses to what it starts from
    assert pc["combined_s"] <= sm["best_s"] and pc["combined_gain"] == sm["naive_s"] / pc["combined_s"]
    table = CliRunner().invoke(app, args)
    assert table.exit_code == 0 and "[4, 4, 4, 4] → [5, 2, 5, 4]" in table.output.replace("\n", " ")


def test_without_a_pipeline_the_plan_change_says_so(tmp_path):
    speeds = tmp_path / "speeds.csv"
    speeds.write_text("gpu,speed\n2,0.5\n")
    flat = {**PLAN, "tensor_parallel": 8, "pipeline_parallel": 1}
    result = CliRunner().invoke(
        app, ["variability", str(job_file(tmp_path, flat)), "--samples", "100", "--speed-map", str(speeds), "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["speed_map"]["plan_change"] == "no pipeline to re-slice: pipeline_parallel is 1"
    dlrm = tmp_path / "dlrm.yaml"  # dlrm-small on the CPU host's 2 ranks, each table on one
    sharding = "{t0: {strategy: table_wise, ranks: [0]}, t1: {strategy: table_wise, ranks: [1]}, "
    sharding += "t2: {strategy: table_wise, ranks: [1]}, t3: {strategy: data_parallel, ranks: [0, 1]}}"
    system = "{preset: cpu-host, num_nodes: 1, node: {gpus_per_node: 2}}"
    dlrm.write_text(f"model: dlrm-small\nsystem: {system}\nplan: {{batch_per_rank: 256, sharding: {sharding}}}\n")
    speeds.write_text("gpu,speed\n1,0.5\n")
    result = CliRunner().invoke(app, ["variability", str(dlrm), "--samples", "100", "--speed-map", str(speeds)])
    assert result.exit_code == 0, result.output
    assert "no pipeline to re-slice: a DLRM's graph ranks are GPUs" in result.output.replace("\n", " ")
