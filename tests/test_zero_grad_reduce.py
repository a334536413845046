"""ZeRO-1/2 gradient reductions as each framework issues them (PlanConfig.zero_grad_reduce), counted by hand:
Megatron-Core's distributed optimizer reduce-scatters a bucket; DeepSpeed from v0.12.4 all-reduces it and keeps
its slices (zero/stage_1_and_2.py average_tensor -> allreduce_and_scatter); DeepSpeed before v0.12.4 issues one
dist.reduce per destination rank (average_tensor at v0.6.0), priced as dp reduce-scatters of 1/dp each.

MODEL (test_golden): gpt, one layer of hidden 64 and FFN 256 (12·64² + 13·64 = 49,984 parameters), tied
vocabulary 128 × 64 = 8,192, learned positions 32 × 64 = 2,048: 60,224 parameters (the final LayerNorm's 2 · 64 are
not among a stage's parameters in itercast: memory.stage_params). With
`linear_calibration()` a collective takes its bus bytes / link (1e10 B/s) and no latency; over n ranks a
reduce-scatter moves (n − 1)/n of its bytes, an all-reduce 2 (n − 1)/n."""

from __future__ import annotations

import pytest
from helpers import searched_top_plan
from test_golden import LINK, MODEL, SYSTEM, linear_calibration

from itercast.config.job import Job
from itercast.costs.analytic import AnalyticCostModel
from itercast.hardware.topology import GroupPlacement
from itercast.memory import stage_params
from itercast.workloads.transformer import Groups, TransformerStepBuilder, dp_collective_s, grad_collective
from itercast.workloads.transformer_ops import zero_grad_reduce_note

PARAMS = 12 * 64**2 + 13 * 64 + 128 * 64 + 32 * 64  # 60,224


def job(zero: int, reduce: str = "reduce_scatter", dp: int = 4) -> Job:
    plan = {
        "data_parallel": dp,
        "global_batch_size": dp,
        "zero_stage": zero,
        "zero_grad_reduce": reduce,
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


def test_one_reduce_per_rank_pays_the_group_size_times_a_reduce_scatters_latency():
    """A collective of b bytes over n ranks taking 1 ms + b ns: n reduce-scatters of 1/n of 1,000 bytes each over 4
    ranks = 4 · (1e-3 + 250e-9) s; the experts' empty group costs nothing."""
    calls: list[tuple[str, float, int]] = []

    def collective_s(kind: str, nbytes: float, group: GroupPlacement) -> float:
        calls.append((kind, nbytes, group.size))
        return 0.0 if nbytes == 0 or group.size == 1 else 1e-3 + nbytes * 1e-9

    grad, lone = GroupPlacement(4, 1, 4), GroupPlacement(1, 1, 1)
    groups = Groups(lone, lone, grad, lone, lone, False, lone, lone, lone, lone)
    seconds = dp_collective_s(collective_s, groups, "reduce_per_rank", (0.0, 500.0), 2)
    assert seconds == pytest.approx(4 * (1e-3 + 250e-9))
    assert calls[0] == ("reduce_scatter", 250.0, 4)
    assert dp_collective_s(collective_s, groups, "reduce_scatter", (0.0, 500.0), 2) == pytest.approx(1e-3 + 1000e-9)


def test_the_graph_reduces_the_stage_once_at_the_boundary_with_the_chosen_collective():
    """dp 4, no overlap: one gradient task of the stage's 60,224 bf16 gradients (120,448 bytes) after the last
    backward: a reduce-scatter 3/4 · 120,448 / LINK, an all-reduce twice that, one reduce per rank (no latency
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
