"""ZeRO-1/2 gradient reductions and parameter gathers as each framework issues them (PlanConfig.zero_grad_reduce,
zero_param_gather), counted by hand: Megatron-Core's distributed optimizer reduce-scatters a bucket; DeepSpeed from
v0.12.4 all-reduces it and keeps its slices (zero/stage_1_and_2.py average_tensor -> allreduce_and_scatter); DeepSpeed
before v0.12.4 issues one dist.reduce per destination rank (average_tensor at v0.6.0), priced as dp reduce-scatters of
1/dp each. After the step Megatron-Core and DeepSpeed all-gather the updated shards; InternLM (July 2023,
hybrid_zero_optim.py broadcast_params) broadcasts each rank's shard in turn, priced as dp all-gathers of 1/dp each.

MODEL (test_golden): gpt, one layer of hidden 64 and FFN 256 (12·64² + 13·64 = 49,984 parameters), tied
vocabulary 128 × 64 = 8,192, learned positions 32 × 64 = 2,048 and the final LayerNorm's 2 · 64 = 128: 60,352
parameters. With
`linear_calibration()` a collective takes its bus bytes / link (1e10 B/s) and no latency; over n ranks a
reduce-scatter moves (n − 1)/n of its bytes, an all-reduce 2 (n − 1)/n."""

from __future__ import annotations

import pytest
from helpers import fast_vs_graph, searched_top_plan
from test_golden import LINK, MODEL, SYSTEM, linear_calibration
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import Job
from itercast.costs.analytic import AnalyticCostModel
from itercast.hardware.topology import GroupPlacement
from itercast.memory import stage_params
from itercast.predict import predict
from itercast.workloads.transformer import (
    Groups,
    TransformerStepBuilder,
    dp_collective_s,
    grad_collective,
    param_collective,
)
from itercast.workloads.transformer_ops import zero_grad_reduce_note

PARAMS = 12 * 64**2 + 13 * 64 + 128 * 64 + 32 * 64 + 2 * 64  # 60,352


def job(zero: int, reduce: str = "reduce_scatter", dp: int = 4, gather: str = "all_gather") -> Job:
    plan = {
        "data_parallel": dp,
        "global_batch_size": dp,
        "zero_stage": zero,
        "zero_grad_reduce": reduce,
        "zero_param_gather": gather,
        "overlap_grad_reduce": False,
        "overlap_param_gather": False,
        "grad_reduce_dtype": "bf16",
    }
    system = {**SYSTEM, "node": {**SYSTEM["node"], "gpus_per_node": dp}, "num_nodes": 1}
    return Job.from_dicts(MODEL, plan, system)


@pytest.mark.parametrize(
    ("zero", "reduce", "kind"),
    [
        (0, "reduce_per_rank", "all_reduce"),  # ZeRO-0: DDP's all-reduce whatever the field says
        (1, "reduce_scatter", "reduce_scatter"),
        (1, "all_reduce", "all_reduce"),
        (2, "reduce_per_rank", "reduce_per_rank"),
        (3, "all_reduce", "reduce_scatter"),  # ZeRO-3 / FSDP: a reduce-scatter whatever the field says
    ],
)
def test_the_field_chooses_the_collective_of_zero_1_and_2_only(zero, reduce, kind):
    assert grad_collective(job(zero, reduce)) == kind


@pytest.mark.parametrize(
    ("per_rank", "each", "ranks", "latency_s", "params", "expected_s", "one_s"),
    [
        # DeepSpeed's reduce to each rank: 4 reduce-scatters of 1/4 of 1,000 bytes = 4 · (1e-3 + 250e-9) s
        ("reduce_per_rank", "reduce_scatter", 4, 1e-3, 500.0, 4 * (1e-3 + 250e-9), 1e-3 + 1000e-9),
        # InternLM's broadcast from each rank: 8 all-gathers of 1/8 of 4,000 bytes = 8 · (2e-3 + 500e-9) s
        ("broadcast_per_rank", "all_gather", 8, 2e-3, 2000.0, 8 * (2e-3 + 500e-9), 2e-3 + 4000e-9),
    ],
)
def test_one_collective_per_rank_pays_the_group_size_times_its_latency(
    per_rank, each, ranks, latency_s, params, expected_s, one_s
):
    """A collective of b bytes over n ranks taking its latency + b ns; the experts' empty group costs nothing;
    one collective of all the bytes (`each` itself) pays the latency once."""
    calls: list[tuple[str, float, int]] = []

    def collective_s(kind: str, nbytes: float, group: GroupPlacement) -> float:
        calls.append((kind, nbytes, group.size))
        return 0.0 if nbytes == 0 or group.size == 1 else latency_s + nbytes * 1e-9

    grad, lone = GroupPlacement(ranks, 1, ranks), GroupPlacement(1, 1, 1)
    groups = Groups(lone, lone, grad, lone, lone, False, lone, lone, lone, lone)
    assert dp_collective_s(collective_s, groups, per_rank, (0.0, params), 2) == pytest.approx(expected_s)
    assert calls[0] == (each, 2 * params / ranks, ranks)
    assert dp_collective_s(collective_s, groups, each, (0.0, params), 2) == pytest.approx(one_s)


def test_the_graph_reduces_the_stage_once_at_the_boundary_with_the_chosen_collective():
    """dp 4, no overlap: one gradient task of the stage's 60,352 bf16 gradients (120,704 bytes) after the last
    backward: a reduce-scatter 3/4 · 120,704 / LINK, an all-reduce twice that, one reduce per rank (no latency
    here) the reduce-scatter's time."""
    assert stage_params(job(1), 0) == (0.0, PARAMS)
    cal = linear_calibration()
    seconds = {}
    for reduce in ("reduce_scatter", "all_reduce", "reduce_per_rank"):
        j = job(1, reduce)
        g = TransformerStepBuilder(j, AnalyticCostModel(j.system, "bf16", cal)).build()
        (task,) = [
            t
            for t, n in enumerate(g.names)
            if n == f"grad_{grad_collective(j)}" and g.resource_rank[g.resource[t]] == 0
        ]
        seconds[reduce] = float(g.duration_s[task])
    assert seconds["reduce_scatter"] == pytest.approx(3 / 4 * 2 * PARAMS / LINK)
    assert seconds["all_reduce"] == pytest.approx(2 * 3 / 4 * 2 * PARAMS / LINK)
    assert seconds["reduce_per_rank"] == pytest.approx(seconds["reduce_scatter"])


def test_deepspeed_searches_all_reduce_its_zero_buckets_and_megatron_core_reduce_scatters_them():
    # the plans `itercast search --example --framework ...` ranks first, as its --json shows them
    assert searched_top_plan("deepspeed")["zero_grad_reduce"] == "all_reduce"
    assert searched_top_plan("megatron-core")["zero_grad_reduce"] == "reduce_scatter"


def test_predict_says_when_a_deepspeed_job_leaves_its_zero_buckets_at_megatrons_reduce_scatter():
    left = job(1).plan.model_copy(update={"pipeline_p2p": "deepspeed"})
    note = zero_grad_reduce_note(left)
    assert note is not None and note.startswith("plan.zero_grad_reduce is reduce_scatter (Megatron-Core's)")
    assert zero_grad_reduce_note(left.model_copy(update={"zero_grad_reduce": "all_reduce"})) is None
    assert zero_grad_reduce_note(left.model_copy(update={"zero_stage": 0})) is None  # DDP's all-reduce anyway
    assert zero_grad_reduce_note(job(1).plan) is None  # Megatron-Core's own reduce-scatter


@pytest.mark.parametrize(
    ("zero", "gather", "kind"),
    [
        (1, "all_gather", "all_gather"),
        (1, "broadcast_per_rank", "broadcast_per_rank"),
        (2, "broadcast_per_rank", "broadcast_per_rank"),
        (3, "broadcast_per_rank", "all_gather"),  # FSDP gathers every unit whatever the field says
    ],
)
def test_the_gather_field_chooses_the_collective_of_zero_1_and_2_only(zero, gather, kind):
    assert param_collective(job(zero, gather=gather)) == kind


def test_the_graph_gathers_the_stage_after_the_step_with_the_chosen_collective():
    """dp 4, no overlap: one gather of the stage's 60,352 bf16 parameters after the optimizer step. No latency here,
    so the four broadcasts of a quarter each take one all-gather's 3/4 · 120,704 / LINK."""
    cal = linear_calibration()
    for gather in ("all_gather", "broadcast_per_rank"):
        j = job(1, gather=gather)
        g = TransformerStepBuilder(j, AnalyticCostModel(j.system, "bf16", cal)).build()
        (task,) = [t for t, n in enumerate(g.names) if n == f"param_{gather}" and g.resource_rank[g.resource[t]] == 0]
        assert float(g.duration_s[task]) == pytest.approx(3 / 4 * 2 * PARAMS / LINK)


def test_the_fast_path_prices_the_broadcasts_as_the_graph_does():
    """ZeRO-1 on 16 DGX A100 nodes (data parallel 32-128), the gathers exposed after the step or overlapped with the
    next forward: the fast path within 2% of the graph, and 128 broadcasts dearer than one all-gather."""
    exposed = {}
    for gather in ("all_gather", "broadcast_per_rank"):  # a plan table's rows share this field
        plans = [
            {
                "tensor_parallel": tp,
                "data_parallel": 128 // tp,
                "global_batch_size": 256,
                "zero_stage": 1,
                "zero_grad_reduce": "all_reduce",
                "zero_param_gather": gather,
                "overlap_param_gather": overlap,
            }
            for tp in (1, 4)
            for overlap in (False, True)
        ]
        jobs, rel = fast_vs_graph("llama2-7b", {"preset": "dgx-a100", "num_nodes": 16}, plans)
        assert len(jobs) == 4 and max(rel) < 0.02
        exposed[gather] = predict(jobs[0]).step_time_s  # tp 1, gathered after the step
    assert exposed["broadcast_per_rank"] > exposed["all_gather"]


@pytest.mark.parametrize("framework", ["megatron-core", "deepspeed"])
def test_search_frameworks_refuse_internlms_broadcasts_in_one_line(framework):
    args = ["search", "--example", "--framework", framework, "--set", "plan.zero_param_gather=broadcast_per_rank"]
    result = CliRunner().invoke(app, args)
    expected = f"plan.zero_param_gather: {framework} runs all_gather, the job sets broadcast_per_rank"
    assert result.exit_code == 2 and expected in result.output
