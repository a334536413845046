"""ZeRO's state sharded within groups of data-parallel ranks and replicated across them (PlanConfig.zero_shard_ranks):
Megatron-Core's partial distributed optimizer reduce-scatters a bucket within its instance and all-reduces the shard
across instances (param_and_grad_buffer.py start_grad_sync), gathers within the instance; FSDP's hybrid sharding alike
for ZeRO-3; InternLM's zero1 all-reduces gradients over every rank and gathers within the group. Counted by hand.

MODEL (test_golden): 60,352 parameters on its one stage (test_zero_grad_reduce's count)."""

from __future__ import annotations

import json
import re

import pytest
from helpers import fast_vs_graph, tiny_job
from test_frameworks import GPT3, PLAN, plans
from test_frameworks import MODEL as DENSE
from test_golden import MODEL, SYSTEM
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import Job, parse_section
from itercast.errors import ConfigError
from itercast.hardware.topology import GroupPlacement
from itercast.memory import estimate_memory
from itercast.search.launch_settings import launch_settings
from itercast.search.layer_costs import job_layer_costs
from itercast.search.plan_space import SpaceOptions, enumerate_plans
from itercast.workloads.transformer import Groups, dp_collective_s, local_optimizer_params

PARAMS = 12 * 64**2 + 13 * 64 + 128 * 64 + 32 * 64 + 2 * 64  # 60,352 (the final LayerNorm's 2 · 64 included)
MOE = DENSE | {"num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 128}


def job(zero: int, shard: int | None, dp: int = 8, **plan: object) -> Job:
    fields = {"data_parallel": dp, "global_batch_size": dp, "zero_stage": zero, "zero_shard_ranks": shard, **plan}
    system = {**SYSTEM, "node": {**SYSTEM["node"], "gpus_per_node": dp}, "num_nodes": 1}
    return Job.from_dicts(MODEL, fields, system)


def test_the_shard_group_is_innermost_and_its_copies_stride_over_it():
    # tp 2, dp 16 on 8-GPU nodes, shards of 4: a shard group's ranks 0, 2, 4, 6 share node 0; its copies stride 8
    j = Job.from_dicts(
        MODEL | {"num_attention_heads": 4},
        {"tensor_parallel": 2, "data_parallel": 16, "global_batch_size": 16, "zero_stage": 1, "zero_shard_ranks": 4},
        {"preset": "dgx-h100", "num_nodes": 4},
    )
    g = Groups.of(j)
    assert g.grad == GroupPlacement(16, 4, 4, 2)
    assert g.shard == GroupPlacement(4, 1, 4, 2) and g.replica == GroupPlacement(4, 4, 1)
    assert g.zero == g.shard
    assert Groups.of(job(1, None)).zero == Groups.of(job(1, None)).grad


def test_reductions_to_shards_add_an_all_reduce_of_a_shard_across_the_copies():
    """A collective of b bytes over n ranks taking 1 ms + b ns; 1,000 bf16 parameters (2,000 bytes), shards of 4 over
    8 ranks (2 copies): a reduce-scatter within the 4 (1e-3 + 2000e-9) then an all-reduce of the 500-byte shard across
    the 2 (1e-3 + 500e-9); a gather within the 4 only; an all-reduce over all 8, as without sharding."""
    calls: list[tuple[str, float, int]] = []

    def collective_s(kind: str, nbytes: float, group: GroupPlacement) -> float:
        calls.append((kind, nbytes, group.size))
        return 0.0 if nbytes == 0 or group.size == 1 else 1e-3 + nbytes * 1e-9

    lone = GroupPlacement(1, 1, 1)
    grad, shard, replica = GroupPlacement(8, 1, 8), GroupPlacement(4, 1, 4), GroupPlacement(2, 1, 2)
    groups = Groups(lone, lone, grad, lone, lone, False, lone, lone, lone, lone, shard, replica)
    params = (0.0, 1000.0)
    assert dp_collective_s(collective_s, groups, "reduce_scatter", params, 2) == pytest.approx(2e-3 + 2500e-9)
    assert ("all_reduce", 500.0, 2) in calls
    assert dp_collective_s(collective_s, groups, "all_gather", params, 2) == pytest.approx(1e-3 + 2000e-9)
    assert dp_collective_s(collective_s, groups, "all_reduce", params, 2) == pytest.approx(1e-3 + 2000e-9)
    assert calls[-2] == ("all_reduce", 2000.0, 8)  # the last call is the experts' empty group
    # InternLM's zero1 = 4: a broadcast from each of the 4 ranks of a quarter each, 4 · (1e-3 + 500e-9)
    assert dp_collective_s(collective_s, groups, "broadcast_per_rank", params, 2) == pytest.approx(4 * (1e-3 + 500e-9))


@pytest.mark.parametrize(
    ("zero", "shard", "weights", "grads", "optimizer"),
    [
        # bf16 weights 2 B, fp32 gradients 4 B (Megatron's default buffer), fp32 copy + Adam m, v 12 B, each divided by
        # the ranks that shard it: ZeRO-1 the optimizer, ZeRO-2 the gradients too (ZeRO-3: the next test)
        (1, None, 2 * PARAMS, 4 * PARAMS, 12 * PARAMS / 8),
        (1, 2, 2 * PARAMS, 4 * PARAMS, 12 * PARAMS / 2),
        (2, 4, 2 * PARAMS, 4 * PARAMS / 4, 12 * PARAMS / 4),
    ],
)
def test_each_copy_holds_a_whole_state_over_its_shard_ranks(zero, shard, weights, grads, optimizer):
    j = job(zero, shard)
    m = estimate_memory(j)
    assert (m.weights_bytes, m.gradients_bytes, m.optimizer_bytes) == (
        pytest.approx(weights),
        pytest.approx(grads),
        pytest.approx(optimizer),
    )
    assert local_optimizer_params(j, Groups.of(j), (0.0, PARAMS)) == pytest.approx(PARAMS / (shard or 8))


def test_zero3_shards_its_weights_over_the_shard_ranks_beside_the_gathered_layers():
    """ZeRO-3 over shards of 4 rather than all 8 ranks: the weights' shard grows from 2 B / 8 to 2 B / 4 a parameter
    (the layers gathered for compute are the same either way), gradients and optimizer state alike."""
    full, half = estimate_memory(job(3, None)), estimate_memory(job(3, 4))
    assert half.weights_bytes - full.weights_bytes == pytest.approx(2 * PARAMS / 4 - 2 * PARAMS / 8)
    assert half.optimizer_bytes == pytest.approx(12 * PARAMS / 4)


def test_the_fast_path_prices_partial_sharding_as_the_graph_does():
    """Llama 2 7B on 4 DGX H100 nodes, data parallel 16-32, shards of 8 (one node at tp 1, two at tp 2): ZeRO-1 and
    ZeRO-3 (FSDP's hybrid sharding), gathers overlapped or not: the fast path within 2% of the graph."""
    for zero in (1, 3):
        plans = [
            {
                "tensor_parallel": tp,
                "data_parallel": 32 // tp,
                "global_batch_size": 64,
                "zero_stage": zero,
                "zero_shard_ranks": 8,
                "overlap_param_gather": overlap,
            }
            for tp in (1, 2)
            for overlap in (False, True)
        ]
        jobs, rel = fast_vs_graph("llama2-7b", {"preset": "dgx-h100", "num_nodes": 4}, plans)
        assert len(jobs) == 4 and max(rel) < 0.02, (zero, rel)


@pytest.mark.parametrize(
    ("zero", "shard", "extra", "message"),
    [
        (0, 2, {}, "plan.zero_shard_ranks(2) shards ZeRO's state: needs zero_stage >= 1; got 0"),
        (1, 3, {}, "plan.zero_shard_ranks(3) does not divide data_parallel(8) × context_parallel(1) = 8"),
        (3, 2, {"zero3_fetch": "deepspeed"}, "plan.zero_shard_ranks: DeepSpeed's ZeRO-3 (zero3_fetch deepspeed)"),
    ],
)
def test_shards_the_plan_cannot_hold_are_one_line_errors(zero, shard, extra, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        job(zero, shard, **extra)


def test_predict_says_how_the_state_is_sharded():
    args = ["predict", "--example", "--set", "plan.zero_stage=1", "--set", "plan.zero_shard_ranks=8"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0 and "ZeRO 1 sharded within 8 ranks" in result.output


def _searched(*extra: str) -> dict:
    """The plan `itercast search --example` ranks first with ZeRO's state sharded within 8 ranks, and its launch."""
    args = ["search", "--example", "--json", "--top", "1", "--workers", "1", "--set", "plan.zero_shard_ranks=8"]
    result = CliRunner().invoke(app, [*args, *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["plans"][0]


def test_megatron_core_searches_partial_distributed_optimizers_and_launches_them():
    top = _searched()
    p = top["plan"]
    ranks = p["data_parallel"] * p["context_parallel"]
    copies = ranks // 8
    assert p["zero_shard_ranks"] == 8 and p["zero_stage"] >= 1 and copies * 8 == ranks
    assert f"--num-distributed-optimizer-instances {copies}" in top["launch"]


def test_torchtitan_searches_hsdp_and_launches_it():
    top = _searched("--framework", "torchtitan")
    p = top["plan"]
    shard = 8 // p["context_parallel"]  # torchtitan's FSDP mesh is dp_shard × cp
    assert p["zero_stage"] in (2, 3)
    assert f"data_parallel_shard_degree = {shard}" in top["launch"]
    assert f"data_parallel_replicate_degree = {p['data_parallel'] // shard}" in top["launch"]


@pytest.mark.parametrize(("framework", "stages"), [("megatron-core", {1, 2, 3}), ("torchtitan", {2, 3})])
def test_the_search_keeps_only_plans_that_shard_within_groups_of_four(framework, stages):
    """16 GPUs, shards of 4: every plan a ZeRO stage the framework shards in groups (Megatron-Core's instances with
    its distributed optimizer and Megatron-FSDP, torchtitan's HSDP with FSDP2), data × context ranks a multiple of 4
    and context parallel ranks dividing 4; plans with 1 or 2 data-parallel ranks are gone."""
    found = plans(framework, zero_shard_ranks=4)
    assert {p["zero_stage"] for p in found} == stages
    ranks = [p["data_parallel"] * p["context_parallel"] for p in found]
    assert all(r % 4 == 0 for r in ranks) and {4, 8, 16} <= set(ranks)
    assert all(4 % p["context_parallel"] == 0 for p in found)


def test_nemo_launches_the_instances_as_a_ddp_override():
    plan = {**PLAN, "zero_stage": 1, "data_parallel": 32, "zero_shard_ranks": 8}
    assert "trainer.strategy.ddp.num_distributed_optimizer_instances=4" in launch_settings("nemo", plan, GPT3)


def test_deepspeed_refuses_partial_sharding_in_one_line():
    args = ["search", "--example", "--framework", "deepspeed", "--set", "plan.zero_shard_ranks=8"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "plan.zero_shard_ranks: deepspeed is searched with ZeRO's state over every" in (
        result.output
    )


def test_the_slicer_holds_a_layers_state_over_the_shard_ranks():
    """The stage slicer's bytes per layer (search/layer_costs): 2 B bf16 weights, 4 B fp32 gradients and 12 B of fp32
    copy and Adam moments over the 2 ranks of a shard (of 8 data-parallel ranks), 2 + 4 + 6 = 12 B a parameter."""
    job = tiny_job(tensor_parallel=1, data_parallel=8, global_batch_size=8, zero_stage=1, zero_shard_ranks=2)
    costs, _ = job_layer_costs(job)
    assert costs.static_bytes[1] == pytest.approx(job.model.layer_params_per_rank(1) * (2 + 4 + 12 / 2))


def _shards(framework: str, model: dict | None = None) -> dict[tuple[int, int, int, int], set[int | None]]:
    """plan.zero_shard_ranks the search tries, per (tp, pp, cp, dp), among its ZeRO ≥ 1 plans of 16 H100 on 2 nodes
    (test_frameworks' space: the field not fixed)."""
    out: dict[tuple[int, int, int, int], set[int | None]] = {}
    for p in plans(framework) if model is None else _plans_of(framework, model):
        if p["zero_stage"]:
            key = (p["tensor_parallel"], p["pipeline_parallel"], p["context_parallel"], p["data_parallel"])
            out.setdefault(key, set()).add(p["zero_shard_ranks"])
    return out


def _plans_of(framework: str, model: dict) -> list[dict]:
    options = SpaceOptions(micro_batch_sizes=(1,), max_context_parallel=1, framework=framework)
    system = parse_section("system", {"preset": "dgx-h100", "num_nodes": 2})
    base = parse_section("plan", {"global_batch_size": 32})
    table, _ = enumerate_plans(parse_section("model", model), system, base, 16, options)  # type: ignore[arg-type]
    return [table.plan_fields(r) for r in range(len(table))]


def test_the_search_tries_shard_groups_of_whole_nodes():
    """8 GPUs a node hold 8 / tp data × context ranks of a stage (tensor ranks innermost); the search tries groups
    of whole nodes, 2 ranks or more and fewer than dp × cp, besides every rank (None). By hand: tp 1 dp 16: 8;
    tp 2 dp 8: 4 (8 would be all); tp 4 dp 4: 2; tp 8 dp 2: a group of one, none; pp 2 dp 8: one node is all 8;
    cp 2 dp 8: 8 of the 16 data × context ranks."""
    found = _shards("megatron-core")
    assert found[(1, 1, 1, 16)] == {None, 8}
    assert found[(2, 1, 1, 8)] == {None, 4}
    assert found[(4, 1, 1, 4)] == {None, 2}
    assert found[(8, 1, 1, 2)] == {None}
    assert found[(1, 2, 1, 8)] == {None}
    assert found[(1, 1, 2, 8)] == {None, 8}
    assert all(p["zero_shard_ranks"] is None for p in plans("megatron-core") if not p["zero_stage"])


def test_only_frameworks_that_shard_in_groups_search_it():
    """torchtitan's HSDP with FSDP2 (ZeRO 2-3) for dense models only (its experts' meshes are not priced), Megatron-Core
    for an MoE model too, not DeepSpeed (MiCS and hpZ unpriced)."""
    assert {p["zero_stage"] for p in plans("torchtitan") if p["zero_shard_ranks"]} == {2, 3}
    assert _shards("torchtitan")[(1, 1, 1, 16)] == {None, 8}
    assert not [p for p in plans("deepspeed") if p["zero_shard_ranks"]]
    titan_moe = _shards("torchtitan", MOE)
    assert titan_moe and all(shards == {None} for shards in titan_moe.values())
    assert _shards("megatron-core", MOE)[(1, 1, 1, 16)] == {None, 8}


def _moe_job(ep: int, shard: int | None, tp: int = 1) -> Job:
    plan = {"tensor_parallel": tp, "data_parallel": 16 // tp, "expert_parallel": ep, "expert_tensor_parallel": 1}
    plan |= {"global_batch_size": 16, "zero_stage": 1, "zero_shard_ranks": shard, "sequence_parallel": tp > 1}
    return Job.from_dicts(MOE, plan, {"preset": "dgx-h100", "num_nodes": 2})


def test_the_experts_data_parallel_ranks_split_by_the_same_copies():
    """16 GPUs on 2 nodes, tp 1, ep 2, shards of 8 (2 copies): the experts' 8 data-parallel ranks 0, 2, …, 14 (stride
    ep = 2, 4 a node) split as Megatron-Core's intra- and inter-partial expert groups: the innermost 8 / 2 = 4, ranks
    0, 2, 4, 6 on node 0, and their 2 copies at stride 2 · 4 = 8, ranks 0 and 8 on two nodes."""
    g = Groups.of(_moe_job(2, 8))
    assert g.expert_grad == GroupPlacement(8, 2, 4, 2)
    assert g.expert_shard == GroupPlacement(4, 1, 4, 2) and g.expert_replica == GroupPlacement(2, 2, 1)
    assert g.expert_zero == g.expert_shard
    assert Groups.of(_moe_job(2, None)).expert_zero == GroupPlacement(8, 2, 4, 2)


def test_experts_reduce_within_their_shard_and_all_reduce_it_across_the_copies():
    """A collective of b bytes taking 1 ms + b ns (none over one rank); 1,000 bf16 expert parameters (2,000 bytes) and
    none else, expert shards of 4 with 2 copies: a reduce-scatter within the 4 (1e-3 + 2000e-9), then the 500-byte
    shard all-reduced across the 2 (1e-3 + 500e-9); gathered within the 4 only."""

    def collective_s(kind: str, nbytes: float, group: GroupPlacement) -> float:
        return 0.0 if nbytes == 0 or group.size == 1 else 1e-3 + nbytes * 1e-9

    g = Groups.of(_moe_job(2, 8))
    assert dp_collective_s(collective_s, g, "reduce_scatter", (1000.0, 0.0), 2) == pytest.approx(2e-3 + 2500e-9)
    assert dp_collective_s(collective_s, g, "all_gather", (1000.0, 0.0), 2) == pytest.approx(1e-3 + 2000e-9)
    assert local_optimizer_params(_moe_job(2, 8), g, (1000.0, 0.0)) == pytest.approx(1000 / 4)


def test_an_expert_copy_must_hold_whole_expert_data_parallel_ranks():
    """tp 1, ep 4, shards of 2 over 16 ranks: 8 copies of the experts' 16 / 4 = 4 data-parallel ranks, half a rank
    each: a one-line error quoting Megatron-Core's assertion. Shards of 4: one rank a copy, fine."""
    with pytest.raises(ConfigError, match=re.escape("each of the 8 copies would hold tensor_parallel(1) × 2 / (")):
        _moe_job(4, 2)
    assert Groups.of(_moe_job(4, 4)).expert_shard == GroupPlacement(1, 1, 1)


def test_a_searched_sharded_plan_is_priced_as_it_is_alone():
    """Each ZeRO-1 plan of the space sharded within 8 ranks (tp 1, dp 16), priced in the whole table by one fast path
    and alone by another: the same step time and memory (the shard column reaches the groups and the memory)."""
    from itercast.parallel.plan_table import PlanTable
    from itercast.search.fast_estimate import FastEstimator

    model = parse_section("model", DENSE)
    system = parse_section("system", {"preset": "dgx-h100", "num_nodes": 2})
    base = parse_section("plan", {"global_batch_size": 32})
    options = SpaceOptions(micro_batch_sizes=(1,), max_context_parallel=1)
    table, _ = enumerate_plans(model, system, base, 16, options)  # type: ignore[arg-type]
    whole = FastEstimator(model, system).evaluate(table)
    rows = [r for r in range(len(table)) if table.cols["shard"][r] == 8 and table.cols["zero"][r] == 1]
    assert rows
    for r in rows:
        job = Job(model, parse_section("plan", table.plan_fields(r)), system)  # type: ignore[arg-type]
        alone = FastEstimator(model, system).evaluate(PlanTable.of_jobs([job]))
        for key in ("step_time_s", "memory_per_gpu_bytes", "memory_optimizer_bytes"):
            assert whole[key][r] == pytest.approx(alone[key][0], rel=1e-12), key
    unsharded = [r for r in range(len(table)) if table.cols["shard"][r] == 0 and table.cols["zero"][r] == 1]
    pair = {tuple(table.cols[k][r] for k in table.cols if k != "shard"): r for r in unsharded}
    r = rows[0]
    other = pair[tuple(table.cols[k][r] for k in table.cols if k != "shard")]
    # fp32 copy and Adam moments, 12 B a parameter, over 8 ranks rather than 16
    ratio = whole["memory_optimizer_bytes"][r] / whole["memory_optimizer_bytes"][other]
    assert ratio == pytest.approx(2.0)


def test_the_fast_path_prices_an_moe_models_partial_sharding_as_the_graph_does():
    """Mixtral 8x7B on 4 DGX H100 nodes, tp 2 (etp 2), ep 8, data parallel 16, shards of 8 (two copies of the
    experts' 2 data-parallel ranks, one each) and of 16: ZeRO-1, gathers overlapped or not: the fast path within 2%
    of the graph."""
    plans = [
        {
            "tensor_parallel": 2,
            "data_parallel": 16,
            "expert_parallel": 8,
            "sequence_parallel": True,
            "global_batch_size": 32,
            "zero_stage": 1,
            "zero_shard_ranks": shard,
            "overlap_param_gather": overlap,
        }
        for shard in (8, 16)
        for overlap in (False, True)
    ]
    jobs, rel = fast_vs_graph("mixtral-8x7b", {"preset": "dgx-h100", "num_nodes": 4}, plans)
    assert len(jobs) == 4 and max(rel) < 0.02, rel


def test_every_sharded_moe_plan_the_search_keeps_is_a_valid_job():
    """tp 4 × etp 4 × ep 4 on 16 GPUs leaves dp 4, whose whole-node shard of 2 would give each expert copy
    4 · 2 / 16 of a rank: the search drops it; every sharded MoE plan it keeps validates as a job."""
    found = [p for p in _plans_of("megatron-core", MOE) if p["zero_shard_ranks"]]
    assert found
    kept = {(p["tensor_parallel"], p["expert_parallel"], p["expert_tensor_parallel"]) for p in found}
    assert (4, 4, 4) not in kept and (4, 4, 1) in kept
    system = {"preset": "dgx-h100", "num_nodes": 2}
    for p in found:
        Job.from_dicts(MOE, p, system)
