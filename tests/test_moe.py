"""Mixture of experts, computed by hand: parameters, the layer pattern, the MoE layer's ops and
collectives, expert-data-parallel memory, validation, and the fast path against the graph.

Hand values use test_golden's linear calibration: a GEMM takes FLOPs / 1e12, a collective its bus
bytes / 1e10 (an all-to-all of B bytes over n ranks in one node moves B·(n − 1)/n).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import fast_vs_graph
from test_golden import HBM, LINK, PEAK, SYSTEM, linear_calibration
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import Job
from itercast.config.model import ModelConfig
from itercast.config.plan import torchtitan_expert_layout_ok
from itercast.costs.analytic import AnalyticCostModel
from itercast.errors import ConfigError
from itercast.memory import StageMemory, activation_bytes_per_token_layer, estimate_memory
from itercast.parallel.plan_table import PlanTable
from itercast.search.plan_space import SpaceOptions, enumerate_plans, imbalance_note
from itercast.workloads.transformer import Groups, TransformerStepBuilder, pass_cost
from itercast.workloads.transformer_ops import dispatch_share, flex_dispatch_note, layer_backward, layer_forward

# one MoE layer: h 64, 4 heads of 16, s 32, 4 experts of width 32, top-2; llama: SwiGLU, RMSNorm, untied
MOE = {"family": "llama", "num_layers": 1, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32}
MOE |= {"ffn_hidden_size": 128, "vocab_size": 128, "num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 32}


def moe_job(model: dict | None = None, gpus: int = 2, **plan) -> Job:
    plan = {"expert_parallel": 2, "data_parallel": gpus, **plan}
    node = {**SYSTEM["node"], "gpus_per_node": gpus}
    return Job.from_dicts({**MOE, **(model or {})}, plan, {**SYSTEM, "node": node, "num_nodes": 1})


def ops_by_name(job: Job, backward: bool = False) -> dict:
    ops = layer_backward(job.model, job.plan, moe=True) if backward else layer_forward(job.model, job.plan, moe=True)
    return {op.name: op for op in ops}


def layer_cost(job: Job, backward: bool = False):
    ops = list(ops_by_name(job, backward).values())
    return pass_cost(ops, AnalyticCostModel(job.system, "bf16", linear_calibration()), Groups.of(job))


def test_mixtral_parameters_by_hand():
    h, a, g, d, f, E, V, L = 4096, 32, 8, 128, 14336, 8, 32000, 32
    layer = h * (a + 2 * g) * d + h * h + E * 3 * h * f + h * E + 2 * h  # attention, experts, router, 2 RMSNorms
    total = L * layer + 2 * V * h + h  # the final RMSNorm: one weight
    m = Job.from_presets("mixtral-8x7b", "dgx-h100").model
    assert m.num_params() == total == 46_702_792_704  # Hugging Face's count of the released checkpoint
    assert m.num_params() == pytest.approx(46.7e9, rel=0.002)  # Jiang et al. 2024: 46.7B parameters
    # active: 2 of 8 experts per token (the paper's 12.9B active parameters, embeddings aside)
    active = L * (h * (a + 2 * g) * d + h * h + 2 * 3 * h * f + h * E)
    assert m.layers_forward_flops_per_token() == pytest.approx(2 * active + L * 4 * 4096 * h)


def test_moe_layer_pattern():
    m = ModelConfig(**{**MOE, "num_layers": 10, "moe_layer_freq": 2, "moe_first_dense_layers": 3})
    assert [i for i in range(10) if m.is_moe_layer(i)] == [4, 6, 8]
    assert m.num_moe_layers == 3 and int(m.moe_layers_before(5)) == 1


def test_moe_layer_ops_by_hand():
    j = moe_job()
    ops = ops_by_name(j)
    n, k, h, fe, e = 32, 2, 64, 32, 2  # tokens, top-k, hidden, expert width, bytes
    rows = n * k  # routed copies this rank sends (even load, no capacity)
    assert ops["router"].amount == 2 * n * h * 4
    assert ops["moe_dispatch"].amount == ops["moe_combine"].amount == rows * h * e
    assert ops["moe_dispatch"].comm_kind == "alltoall" and ops["moe_dispatch"].group == "ep"
    # two local experts, one GEMM each: SwiGLU up (gate + up) and down over the rank's rows
    assert ops["expert_up"].count == ops["expert_down"].count == 2
    assert ops["expert_up"].amount == 2 * rows * h * 2 * fe / 2
    assert ops["expert_down"].amount == 2 * rows * fe * h / 2
    assert "mlp_up" not in ops
    # Megatron-Core >= 0.13 sends each routed copy's fp32 routing probability in an all-to-all of its own
    assert ops["moe_dispatch.probs"].amount == rows * 4 and ops["moe_dispatch.probs"].comm_kind == "alltoall"
    assert ops["moe_dispatch.probs"].group == "ep" and not ops["moe_dispatch.probs"].overlaps
    fwd = layer_cost(j)
    a2a_s = rows * h * e * (2 - 1) / 2 / LINK  # all-to-all over 2 ranks: half the buffer leaves
    probs_s = rows * 4 * (2 - 1) / 2 / LINK
    assert fwd.family_s["ep_alltoall"] == pytest.approx(2 * a2a_s + probs_s)
    bwd_ops = ops_by_name(j, backward=True)
    assert bwd_ops["expert_up.dgrad"].count == bwd_ops["expert_up.wgrad"].count == 2
    assert layer_cost(j, backward=True).family_s["ep_alltoall"] == pytest.approx(2 * a2a_s + probs_s)
    # before Megatron-Core 0.13 the combine weighted the copies on the sending rank: no probabilities sent
    assert layer_cost(moe_job(moe_probs_alltoall=False)).family_s["ep_alltoall"] == pytest.approx(2 * a2a_s)


@pytest.mark.parametrize(
    ("fields", "load"),
    [
        ({"moe_capacity_factor": 1.5, "moe_pad_to_capacity": True}, 1.5),  # padded: always the capacity
        ({"moe_token_imbalance": 1.3}, 1.3),  # dropless: the busiest rank's share
        ({"moe_token_imbalance": 1.3, "moe_capacity_factor": 1.2}, 1.2),  # tokens beyond capacity dropped
    ],
)
def test_capacity_and_imbalance_scale_the_routed_rows(fields, load):
    ops = ops_by_name(moe_job(fields))
    assert ops["moe_dispatch"].amount == pytest.approx(load * 32 * 2 * 64 * 2)
    assert ops["expert_down"].amount == pytest.approx(load * 2 * 32 * 2 * 32 * 64 / 2)


def test_shared_experts_hide_the_all_to_alls():
    a2a_s = 32 * 2 * 64 * 2 / 2 / LINK
    probs_s = 32 * 2 * 4 / 2 / LINK  # the routing probabilities' all-to-all, after the shared fc1: exposed
    # Megatron-Core's default: the shared experts run in turn with the all-to-alls, both passes exposed
    j = moe_job({"moe_shared_ffn_hidden_size": 64})
    assert layer_cost(j).family_s["ep_alltoall"] == pytest.approx(2 * a2a_s + probs_s)
    assert layer_cost(j, backward=True).family_s["ep_alltoall"] == pytest.approx(2 * a2a_s + probs_s)
    fwd = layer_cost(moe_job({"moe_shared_ffn_hidden_size": 64}, moe_shared_expert_overlap=True))
    shared_up_s = 2 * 32 * 64 * 2 * 64 / PEAK  # gate + up of width 64 over 32 tokens
    shared_down_s = 2 * 32 * 64 * 64 / PEAK
    assert shared_up_s > a2a_s > shared_down_s
    # --moe-shared-expert-overlap: the dispatch hides behind the shared experts' up projection, the combine
    # partly behind the down
    assert fwd.family_s["ep_alltoall"] == pytest.approx(a2a_s - shared_down_s + probs_s)
    # plan.moe_a2a_overlap: all three hide behind attention instead (fused attention: 0.75 of the GEMM rate)
    overlapped = layer_cost(moe_job({"moe_shared_ffn_hidden_size": 64}, moe_a2a_overlap=True))
    attention_s = 4 * 4 * 32 * 32 * 16 / 2 / PEAK / 0.75
    hidden = 2 * max(0.0, a2a_s - attention_s) + max(0.0, probs_s - attention_s)
    assert overlapped.family_s["ep_alltoall"] == pytest.approx(hidden)


def test_torchtitan_gathers_its_moe_layer_over_tensor_parallel_ranks_and_routes_every_token():
    """torchtitan's MoE layer under TP 2 with sequence parallelism (apply_moe_ep_tp, PrepareModuleInputOutput): 32
    tokens of h 64 in bf16, 16 a rank between layers. Its input all-gathered (32 × 64 × 2 = 4,096 bytes; backward a
    reduce-scatter) and its output reduce-scattered (backward an all-gather); the router on all 32 tokens
    (2 × 32 × 64 × 4 FLOPs); the shared expert (width 32) split over TP on all 32 tokens, 2 × 32 × 64 × 64 / 2, with
    no collective of its own. Expert TP 1: the reorderer splits the 64 routed copies, 32 a rank (4,096 bytes an
    all-to-all); expert TP 2: every rank routes all 64 (8,192 bytes) and no expert-tensor collective runs; either
    way 64 × 32 / 2 routed GEMM rows × width per rank: up 2 × 64 × 64 × 64 / 2 / 2 local experts."""
    plan = {"gpus": 4, "data_parallel": 2, "tensor_parallel": 2, "sequence_parallel": True}
    for etp, sent in ((1, 4096), (2, 8192)):
        titan = {"expert_tensor_parallel": etp, "moe_token_dispatcher": "torchtitan"}
        ops = ops_by_name(moe_job({"moe_shared_ffn_hidden_size": 32}, **plan, **titan))
        gather, scatter = ops["moe_in.all_gather"], ops["moe_out.reduce_scatter"]
        assert (gather.amount, gather.backward_comm, scatter.amount, scatter.backward_comm) == (
            4096,
            "reduce_scatter",
            4096,
            "all_gather",
        )
        assert ops["router"].amount == 2 * 32 * 64 * 4
        assert ops["shared_up"].amount == 2 * 32 * 64 * 64 / 2 and ops["shared_up"].f_bytes == 0
        assert ops["moe_dispatch"].amount == ops["moe_combine"].amount == sent
        assert ops["expert_up"].amount == 2 * 64 * 64 * 64 / 2 / 2
        names = list(ops)  # the gather right before the router, the reduce-scatter right after the unpermute
        assert names[names.index("router") - 1] == "moe_in.all_gather"
        assert names[names.index("moe_unpermute") + 1] == "moe_out.reduce_scatter"
        for absent in ("shared_in.all_gather", "shared_out.reduce_scatter", "moe_dispatch.gather"):
            assert absent not in ops and "moe_combine.scatter" not in ops
    # Megatron-Core's alltoall dispatcher on the same plan: the router on its 16 tokens, the shared expert's own
    # all-gather and reduce-scatter, expert TP 2 gathering the 32 copies a rank sent
    mcore = ops_by_name(moe_job({"moe_shared_ffn_hidden_size": 32}, **plan, expert_tensor_parallel=2))
    assert mcore["router"].amount == 2 * 16 * 64 * 4 and mcore["moe_dispatch"].amount == 4096
    assert {"shared_in.all_gather", "shared_out.reduce_scatter", "moe_dispatch.gather"} <= set(mcore)
    assert "moe_in.all_gather" not in mcore
    # memory: the gathered input, 2 × 64 bytes a token, kept whole (not 64 a token's share over TP 2)
    titan = moe_job(**plan, expert_tensor_parallel=1, moe_token_dispatcher="torchtitan")
    alltoall = moe_job(**plan, expert_tensor_parallel=1)
    kept = [activation_bytes_per_token_layer(j, moe=True) for j in (titan, alltoall)]
    assert kept[0] - kept[1] == 64


def test_the_fast_path_prices_torchtitans_gathered_moe_layer_as_the_graph_does():
    # Qwen3 30B-A3B on 16 H100 under TP 2: whole experts (EP 2, 8) and split ones (EP 1, 2, 4), PP 1-2: measured
    # worst 0.75%, mean 0.19%
    layouts = [(1, 2, 1), (2, 2, 1), (4, 2, 1), (2, 1, 1), (8, 1, 1), (1, 2, 2), (4, 2, 2), (8, 1, 2)]
    plans = [
        {"tensor_parallel": 2, "sequence_parallel": True, "expert_parallel": ep, "expert_tensor_parallel": etp}
        | {"pipeline_parallel": pp, "data_parallel": 8 // pp, "global_batch_size": 32, "micro_batch_size": 1}
        | {"moe_token_dispatcher": "torchtitan", "moe_grouped_gemm": True}
        for ep, etp, pp in layouts
    ]
    valid, rel = fast_vs_graph("qwen3-30b-a3b", {"preset": "dgx-h100", "num_nodes": 2}, plans)
    assert len(valid) == 8 and rel.max() < 0.01


def test_torchtitans_expert_layouts_and_default_are_its_parallel_dims():
    # job_config.py: expert_tensor_parallel_degree 1 by default; with expert parallelism 1 its experts then run
    # whole, without it TensorParallel over tp
    plan = {"gpus": 8, "data_parallel": 4, "tensor_parallel": 2, "sequence_parallel": True}
    assert moe_job(**plan, moe_token_dispatcher="torchtitan").plan.etp == 1
    assert moe_job(**plan, expert_parallel=1, moe_token_dispatcher="torchtitan").plan.etp == 2
    assert moe_job(**plan).plan.etp == 2  # Megatron-Core: tp
    refused = [
        (
            {"tensor_parallel": 4, "data_parallel": 2, "expert_parallel": 2, "expert_tensor_parallel": 1},
            "torchtitan's ParallelDims takes with expert_tensor_parallel 1 an expert_parallel that context_parallel "
            "× tensor_parallel (4) divides and that divides data_parallel × context_parallel × tensor_parallel (8) "
            "(torchtitan/distributed/parallel_dims.py); got expert_parallel 2, expert_tensor_parallel 1",
        ),
        (
            {"expert_parallel": 1, "expert_tensor_parallel": 1},
            "takes expert_tensor_parallel = tensor_parallel(2) with expert_parallel 1",
        ),
    ]
    for fields, message in refused:
        with pytest.raises(ConfigError) as err:
            moe_job(**{**plan, **fields}, moe_token_dispatcher="torchtitan")
        assert message in str(err.value)


def test_torchtitan_runs_its_shared_expert_beside_the_forward_combine():
    j = moe_job({"moe_shared_ffn_hidden_size": 32}, moe_token_dispatcher="torchtitan")
    a2a_s = 32 * 2 * 64 * 2 / 2 / LINK
    counts_s = 4 * 4 / 2 / LINK  # the 4 experts' float32 counts, all-to-all over 2 ranks
    up_s, down_s = 2 * 32 * 64 * 2 * 32 / PEAK, 2 * 32 * 32 * 64 / PEAK  # gate + up, down: width 32, 32 tokens
    act_s = 3 * 32 * 32 * 2 / HBM  # SwiGLU reads gate and up, writes one, bf16
    assert up_s + down_s < a2a_s < up_s + act_s + down_s  # only the whole shared expert hides it
    # forward: the dispatch exposed, the combine behind the shared expert; backward: both exposed
    assert layer_cost(j).family_s["ep_alltoall"] == pytest.approx(a2a_s + counts_s)
    assert layer_cost(j, backward=True).family_s["ep_alltoall"] == pytest.approx(2 * a2a_s)
    with pytest.raises(ConfigError, match="moe_shared_expert_overlap is Megatron-Core's"):
        moe_job({"moe_shared_ffn_hidden_size": 32}, moe_token_dispatcher="torchtitan", moe_shared_expert_overlap=True)
    with pytest.raises(ConfigError, match="moe_shared_expert_overlap is Megatron-Core's"):
        moe_job({"moe_shared_ffn_hidden_size": 32}, moe_a2a_overlap=True, moe_shared_expert_overlap=True)


def test_torchtitans_deepep_backend_sends_a_token_once_to_each_rank_that_holds_one_of_its_experts():
    """torchtitan's DeepEP backend (expert_parallel_comm_backend deepep, DeepEPMoE / DeepEPExpertParallel at
    9810191^) on the one-layer model: 32 tokens a rank of h 64 in bf16, 4 experts, top-2, EP 2, a shared expert of
    width 32. A rank holds 2 of the 4 experts: a token selects neither with chance C(2, 2) / C(4, 2) = 1/6, so
    each rank receives 32 × 2 × 5/6 = 160/3 rows, not the 64 copies of a per-expert all-to-all, whose off-GPU bytes
    shrink to 5/6 too. No counts' all-to-all (its layout is counted on the rank), no sort (one gather after the
    dispatch puts the rows in expert order), the unpermutation (a scatter-add into the received rows) before the
    combine, the host waiting for the router before the dispatch."""
    from itercast.workloads.transformer_ops import moe_host_wait

    j = moe_job({"moe_shared_ffn_hidden_size": 32}, moe_token_dispatcher="torchtitan_deepep")
    ops = ops_by_name(j)
    held, routed = 32 * 2 * 5 / 6, 32 * 2
    assert dispatch_share(ops["moe_dispatch"].dedup, 2, 1) == pytest.approx(5 / 6)
    assert ops["moe_dispatch"].amount == ops["moe_combine"].amount == routed * 64 * 2
    assert ops["moe_permute"].amount == 2 * routed * 64 * 2
    assert ops["moe_permute"].backward_amount == pytest.approx((routed + 2 * held) * 64 * 2)
    assert ops["moe_unpermute"].amount == pytest.approx((2 * routed + held) * 64 * 2)
    assert "moe_counts" not in ops and "moe_sort" not in ops and "moe_unsort" not in ops
    names = list(ops)
    assert names.index("moe_dispatch") < names.index("moe_permute") < names.index("expert_up")
    assert names.index("moe_unpermute") + 1 == names.index("moe_combine")
    assert moe_host_wait(j.model, j.plan) == ("router_topk", "router_topk")
    # the combine hides behind the whole shared expert forward, the dispatch does not; backward both exposed
    a2a_s = routed * 64 * 2 * 5 / 6 / 2 / LINK  # over 2 ranks half the (deduplicated) buffer leaves
    assert layer_cost(j).family_s["ep_alltoall"] == pytest.approx(a2a_s)
    assert layer_cost(j, backward=True).family_s["ep_alltoall"] == pytest.approx(2 * a2a_s)
    # per-op recompute keeps what the exchanges delivered: the dispatch's 160/3 rows and the combine's 32 (per token:
    # 5/3 + 1 rows of 128 bytes), against the standard backend's two all-to-alls of 2 copies each (4 rows)
    op = {"recompute": "selective", "selective_recompute": "op"}
    deepep = moe_job(moe_token_dispatcher="torchtitan_deepep", **op)
    standard = moe_job(moe_token_dispatcher="torchtitan", **op)
    kept = [activation_bytes_per_token_layer(x, moe=True) for x in (standard, deepep)]
    assert kept[0] - kept[1] == pytest.approx((4 - (5 / 3 + 1)) * 64 * 2)


@pytest.mark.parametrize(
    ("plan", "needle"),
    [
        ({"expert_parallel": 1}, "plan.moe_token_dispatcher(torchtitan_deepep) needs expert_parallel > 1"),
        (
            {"gpus": 4, "tensor_parallel": 2, "sequence_parallel": True, "data_parallel": 2}
            | {"expert_parallel": 2, "expert_tensor_parallel": 2},
            "takes whole experts (torchtitan: 'DeepEP with Expert Tensor Parallelism (ETP) is not supported yet'): "
            "expected expert_tensor_parallel 1; got 2",
        ),
        (
            {"gpus": 4, "tensor_parallel": 2, "sequence_parallel": True, "data_parallel": 2}
            | {"expert_parallel": 2, "expert_tensor_parallel": 1},
            "with tensor_parallel(2) > 1 is not priced",
        ),
        (  # torchtitan's ParallelDims takes 12 whole experts over 12 ranks; DeepEP has no kernel config for 12
            {"gpus": 12, "expert_parallel": 12},
            "DeepEP has kernel configurations for expert_parallel in 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 144, 160 "
            "(deep_ep/buffer.py Buffer.get_dispatch_config: 'Unsupported number of EP ranks'); got 12",
        ),
    ],
)
def test_torchtitans_deepep_backend_refuses_what_it_does_not_run(plan, needle):
    with pytest.raises(ConfigError) as err:
        moe_job({"num_experts": 12}, moe_token_dispatcher="torchtitan_deepep", **plan)
    assert needle in str(err.value)
    dense = {k: v for k, v in MOE.items() if k not in ("num_experts", "moe_top_k", "moe_ffn_hidden_size")}
    with pytest.raises(ConfigError, match=r"plan.moe_token_dispatcher\(torchtitan_deepep\) needs a mixture-of-"):
        Job.from_dicts(dense, {"moe_token_dispatcher": "torchtitan_deepep"}, SYSTEM)


def test_the_flex_backend_is_refused_where_megatron_core_or_deepep_does_not_run_it():
    with pytest.raises(ConfigError, match=r"\(hybridep\) chooses the kernels under moe_token_dispatcher flex; got"):
        moe_job(moe_flex_backend="hybridep")
    twelve = {"moe_token_dispatcher": "flex", "gpus": 12, "expert_parallel": 12}
    with pytest.raises(ConfigError, match=r"plan.moe_flex_backend\(deepep\): DeepEP has kernel configurations"):
        moe_job({"num_experts": 12}, **twelve)
    # HybridEP has no such table: 12 ranks are priced
    hybrid = moe_job({"num_experts": 12}, **twelve, moe_flex_backend="hybridep")
    assert hybrid.plan.expert_parallel == 12
    # and the note says whose buffers memory counts
    assert "HybridEP's communication buffers are not counted in memory" in (flex_dispatch_note(hybrid.plan) or "")
    deepep = moe_job(moe_token_dispatcher="flex").plan
    assert "DeepEP's buffers are counted in memory" in (flex_dispatch_note(deepep) or "")


def test_the_search_offers_flex_over_deepep_only_at_the_sizes_deepep_runs():
    # 12 experts on 12 GPUs: expert_parallel 2, 3, 4, 6, 12 divide both; DeepEP runs 2 and 4 of them
    job = moe_job({"num_experts": 12}, gpus=12)
    options = SpaceOptions(micro_batch_sizes=(1,), max_virtual_pipeline=1)
    for backend, sizes in (("deepep", {2, 4}), ("hybridep", {2, 3, 4, 6, 12})):
        base = job.plan.model_copy(update={"moe_token_dispatcher": "flex", "moe_flex_backend": backend})
        table, _ = enumerate_plans(job.model, job.system, base, 12, options)
        assert set(table.cols["ep"].tolist()) == sizes and set(table.cols["etp"].tolist()) == {1}


def test_the_search_offers_torchtitans_deepep_backend_only_whole_experts_over_expert_parallel_ranks():
    job = Job.from_presets("moe-tiny", "dgx-h100", plan={"global_batch_size": 16})
    base = job.plan.model_copy(update={"moe_token_dispatcher": "torchtitan_deepep"})
    options = SpaceOptions(micro_batch_sizes=(1,), max_virtual_pipeline=1, framework="torchtitan")
    table, _ = enumerate_plans(job.model, job.system, base, 8, options)
    assert len(table) > 0
    assert set(table.cols["tp"].tolist()) == {1} and set(table.cols["etp"].tolist()) == {1}
    assert set(table.cols["ep"].tolist()) == {2, 4, 8}
    # and only the expert-parallel sizes DeepEP has kernel configurations for: 12 and 256 divide 768 ranks
    eps = np.array([2, 12, 16, 256])
    assert torchtitan_expert_layout_ok(eps, 1, 1, 1, 768, deepep=True).tolist() == [True, False, True, False]
    assert torchtitan_expert_layout_ok(eps, 1, 1, 1, 768).tolist() == [True] * 4


def test_deepeps_buffers_by_hand_and_in_the_memory_of_a_gpu_whose_stage_has_moe_layers():
    """DeepEP 567632d's config.hpp hints at num_sms 20 (10 channels), per received token its hidden bytes, an
    8-byte SourceMeta, 128 int64 top-k indices, 128 fp32 weights and 128 fp32 scales (2,056 bytes); 128-byte
    aligned; the larger of the dispatch and combine configs; a 32 MiB workspace."""
    from itercast.config.deepep_buffer import deepep_buffer_bytes

    def align(n: int) -> int:
        return -(-n // 128) * 128

    # EP 16, hidden 2048 in bf16 (4,096 bytes): 8 NVLink peers over 2 nodes, both configs receive 288 tokens
    nvl = align(10 * 8 * (2 * 2 + 3) * 4 + 10 * 8 * 288 * (4096 + 2056))  # 141,744,384
    # RDMA: receive chunks of 128 tokens aligned up to the send chunk, 20 (dispatch: 140) or 12 (combine: 132);
    # 2 nodes, each slot twice, 16 more bytes a token
    rdma = align(10 * 2 * (8 * 2 + 2) * 2 * 4 + 10 * 2 * 140 * 2 * (4096 + 2056 + 16))  # 34,543,744
    assert deepep_buffer_bytes(2048, 2, 16) == nvl + rdma + 32 * 2**20 == 209_842_560
    # EP 8 within a node: no RDMA buffer; fp32 hidden states take 4 bytes an element
    assert deepep_buffer_bytes(2048, 2, 8) == align(10 * 8 * 5 * 4 + 10 * 8 * 256 * (4096 + 2056)) + 32 * 2**20
    assert deepep_buffer_bytes(2048, 4, 8) == align(10 * 8 * 5 * 4 + 10 * 8 * 256 * (8192 + 2056)) + 32 * 2**20
    with pytest.raises(ValueError, match="no configuration for 12 expert-parallel ranks"):
        deepep_buffer_bytes(2048, 2, 12)
    # the one-layer model (h 64, bf16) at EP 2: 2 peers, 256 tokens received; on top of a flat reserve too
    buffer = align(10 * 2 * 5 * 4 + 10 * 2 * 256 * (128 + 2056)) + 32 * 2**20  # 44,737,024
    for reserved in (0.0, None):  # test_golden's flat 0, then the CUDA context and NCCL's buffers
        std, deepep = (moe_job(moe_token_dispatcher=d) for d in ("torchtitan", "torchtitan_deepep"))
        gpu = std.system.gpu.model_copy(update={"reserved_bytes": reserved})
        system = std.system.model_copy(update={"gpu": gpu})
        std, deepep = (estimate_memory(replace(j, system=system)) for j in (std, deepep))
        assert deepep.reserved_bytes - std.reserved_bytes == buffer
        assert deepep.total_bytes - std.total_bytes == pytest.approx(buffer)  # the rest alike (no per-op recompute)
    # Megatron-Core's flex dispatcher over DeepEP sizes the same buffer (fused_a2a.py get_buffer); over HybridEP
    # none is counted
    deepep, hybrid = (
        estimate_memory(moe_job(moe_token_dispatcher="flex", moe_flex_backend=b)) for b in ("deepep", "hybridep")
    )
    assert (deepep.reserved_bytes, hybrid.reserved_bytes) == (buffer, 0)
    # a stage of dense layers only never dispatches, so never makes the buffer
    j = moe_job(moe_token_dispatcher="torchtitan_deepep")
    stage = StageMemory(j.model, j.system, PlanTable.of_jobs([j]))
    dense, moe = (stage.columns(True, True, 0, 1, n)["reserved"][0] for n in (0, 1))
    assert (dense, moe) == (0, buffer)


def test_the_cli_searches_torchtitans_deepep_backend_launches_it_and_says_what_its_price_leaves_out():
    import json

    args = ["search", "--model", "moe-tiny", "--system", "dgx-h100", "--num-nodes-range", "1", "--framework"]
    args += ["torchtitan", "--set", "plan.moe_token_dispatcher=torchtitan_deepep", "--set", "plan.global_batch_size=16"]
    result = CliRunner().invoke(app, [*args, "--top", "1", "--json", "--workers", "1"])
    assert result.exit_code == 0, result.output
    best = json.loads(result.stdout)["plans"][0]
    assert best["plan"]["moe_token_dispatcher"] == "torchtitan_deepep" and best["plan"]["tensor_parallel"] == 1
    assert 'expert_parallel_comm_backend = "deepep"' in best["launch"].splitlines()
    assert "plan.moe_token_dispatcher torchtitan_deepep: its all-to-alls are priced" in result.stderr
    assert "the host's wait for the notify step is priced from the router's end" in result.stderr


def test_the_fast_path_prices_torchtitans_deepep_backend_as_the_graph_does():
    # Qwen3 30B-A3B on 16 H100: EP 2-16 within and across nodes, PP 1-2: measured worst 0.034%, mean 0.017%
    plans = [
        {"expert_parallel": ep, "pipeline_parallel": pp, "data_parallel": 16 // pp, "global_batch_size": 32}
        | {"micro_batch_size": 1, "moe_token_dispatcher": "torchtitan_deepep", "moe_grouped_gemm": True}
        for ep, pp in ((2, 1), (8, 1), (16, 1), (4, 2), (8, 2))
    ]
    valid, rel = fast_vs_graph("qwen3-30b-a3b", {"preset": "dgx-h100", "num_nodes": 2}, plans)
    assert len(valid) == 5 and rel.max() < 0.01


def test_expert_tensor_parallel_gathers_and_scatters_rows():
    j = moe_job(gpus=4, tensor_parallel=2, data_parallel=2, sequence_parallel=True, expert_tensor_parallel=2)
    ops = ops_by_name(j)
    n = 32 / 2  # sequence parallel: each tensor rank routes half the tokens
    rows = n * 2 * 2  # k copies, gathered over 2 expert-tensor ranks
    assert ops["moe_dispatch"].amount == n * 2 * 64 * 2
    assert ops["moe_dispatch.gather"].amount == ops["moe_combine.scatter"].amount == rows * 64 * 2
    assert ops["expert_up"].amount == 2 * rows * 64 * 2 * (32 / 2) / 2  # width split by ETP, 2 local experts
    # the probabilities: an all-to-all of the n · k copies' over EP, then gathered over ETP like the tokens
    assert ops["moe_dispatch.probs"].amount == n * 2 * 4 and ops["moe_dispatch.probs"].group == "ep"
    gather = ops["moe_dispatch.probs_gather"]
    assert (gather.amount, gather.comm_kind, gather.backward_comm, gather.group) == (
        rows * 4,
        "all_gather",
        "reduce_scatter",
        "etp",
    )
    g = Groups.of(j)
    assert (g.ep.size, g.etp.size, g.expert_grad.size, g.grad.size) == (2, 2, 1, 2)


def test_expert_states_shard_over_expert_data_parallel():
    j = moe_job(gpus=4, zero_stage=1)  # dp 4, ep 2: experts' data-parallel group has 4 / 2 = 2 ranks
    experts = 2 * 3 * 64 * 32  # two local experts, SwiGLU
    attention = 64 * (4 + 8) * 16 + 64 * 64
    # embedding + output layer (untied), the layer's two RMSNorms and the final one, router
    rest = 2 * 128 * 64 + attention + 3 * 64 + 64 * 4
    mem = estimate_memory(j)
    assert mem.optimizer_bytes == pytest.approx(rest * 12 / 4 + experts * 12 / 2)
    assert mem.weights_bytes == pytest.approx((rest + experts) * 2)
    assert mem.gradients_bytes == pytest.approx((rest + experts) * 4)
    assert Groups.of(j).expert_grad.size == 2


def test_gradient_reduction_of_experts_runs_over_their_group():
    j = moe_job(gpus=4, overlap_grad_reduce=False)  # one reduction after the last backward
    builder = TransformerStepBuilder(j, AnalyticCostModel(j.system, "bf16", linear_calibration()))
    graph = builder.build()
    (task,) = [t for t in range(graph.num_tasks) if graph.names[graph.name[t]] == "grad_all_reduce"]
    # fp32 gradients all-reduced (bus bytes 2(n − 1)/n): the rest over 4 data-parallel ranks,
    # the experts over their 2 expert-data-parallel ranks
    experts = 2 * 3 * 64 * 32
    attention = 64 * (4 + 8) * 16 + 64 * 64
    rest = 2 * 128 * 64 + attention + 3 * 64 + 64 * 4  # the final RMSNorm's 64 with the layer's two norms
    assert graph.duration_s[task] == pytest.approx((rest * 4 * 2 * 3 / 4 + experts * 4 * 2 * 1 / 2) / LINK)


@pytest.mark.parametrize(
    ("model", "plan", "needle"),
    [
        ({}, {"expert_parallel": 3, "data_parallel": 3}, "num_experts(4) not divisible by plan.expert_parallel(3)"),
        ({"moe_top_k": 5}, {}, "moe_top_k(5) > model.num_experts(4)"),
        ({}, {"expert_parallel": 4}, "does not divide"),
        ({}, {"tensor_parallel": 2, "data_parallel": 1, "expert_parallel": 1}, "needs plan.sequence_parallel"),
        ({"num_experts": None, "moe_top_k": 2}, {"expert_parallel": 1}, "needs model.num_experts"),
        # Megatron-Core's flex dispatcher: 'DeepEP dispatcher requires TPxEP > 1', no padding to capacity, and
        # its expert-tensor × expert group is not priced
        ({}, {"expert_parallel": 1, "moe_token_dispatcher": "flex"}, "needs expert_parallel > 1"),
        (
            {"moe_capacity_factor": 1.0, "moe_pad_to_capacity": True},
            {"moe_token_dispatcher": "flex"},
            "does not run with model.moe_pad_to_capacity",
        ),
        (
            {},
            {"tensor_parallel": 2, "sequence_parallel": True, "data_parallel": 1, "expert_tensor_parallel": 2}
            | {"expert_parallel": 1, "moe_token_dispatcher": "flex"},
            "with expert_tensor_parallel(2) > 1 is not priced",
        ),
    ],
)
def test_bad_moe_input_is_one_clear_error(model, plan, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        moe_job({**model}, **plan)


def test_cli_refuses_expert_parallel_on_a_dense_model():
    res = CliRunner().invoke(
        app, ["predict", "--model", "gpt3-1.3b", "--system", "dgx-h100", "--set", "plan.expert_parallel=2"]
    )
    assert res.exit_code == 2 and "needs a mixture-of-experts model" in res.output


def grid() -> list[dict]:
    plans = []
    for tp, pp, ep, zero in np.ndindex(2, 2, 4, 3):
        tp, pp, ep, zero = 2**tp, 2**pp, 2**ep, (0, 1, 3)[zero]
        if (zero == 3 and pp > 1) or (16 // pp) % (ep * tp):  # expert × expert-tensor (= tp) ranks fold into tp × dp
            continue
        plans.append(
            {
                "tensor_parallel": tp,
                "pipeline_parallel": pp,
                "expert_parallel": ep,
                "zero_stage": zero,
                "sequence_parallel": tp > 1,
                "global_batch_size": 64,
            }
        )
    return plans


def test_fast_path_agrees_with_graph_on_moe_plans():
    valid, rel = fast_vs_graph("mixtral-8x7b", {"preset": "dgx-h100", "num_nodes": 2}, grid())
    assert len(valid) == 38
    # measured when written: mean 0.1%, worst 0.3% over 38 plans
    assert rel.mean() < 0.01 and rel.max() < 0.03


def test_search_space_covers_expert_parallelism_and_every_plan_is_valid():
    m = Job.from_presets("moe-tiny", "dgx-h100").model
    system = Job.from_presets("moe-tiny", "dgx-h100").system
    base = Job.from_presets("moe-tiny", "dgx-h100", plan={"global_batch_size": 16}).plan
    table, _ = enumerate_plans(m, system, base, 8, SpaceOptions(micro_batch_sizes=(1,), max_virtual_pipeline=1))
    eps = set(table.cols["ep"].tolist())
    assert eps == {1, 2, 4, 8}
    for row in range(0, len(table), max(1, len(table) // 50)):
        fields = table.plan_fields(row)
        Job.from_dicts({"preset": "moe-tiny"}, fields, {"preset": "dgx-h100"})  # raises if invalid


def test_router_imbalance_varies_only_the_experts_share():
    from itercast.stochastic.variability import StepSampler, VariabilityModel

    j = moe_job(gpus=4, global_batch_size=8)
    builder = TransformerStepBuilder(j, AnalyticCostModel(j.system, "bf16", linear_calibration()))
    graph = builder.build()
    share = builder.expert_share()
    assert 0 < share.max() <= 1  # a communication task of all-to-alls only is all experts
    only_imbalance = VariabilityModel(0, 0, 0, 0, moe_imbalance_cv=0.2)
    dur = StepSampler(j, graph, only_imbalance, share)(np.random.default_rng(0), 20_000)
    moved = share > 0
    assert np.all(dur[~moved] == graph.duration_s[~moved, None])  # launches, optimizer, reductions: untouched
    # a task's routed-expert share s scales by a mean-1 factor of CV 0.2: its CV is 0.2·s
    cv = (dur[moved] / graph.duration_s[moved, None]).std(axis=1)
    assert cv == pytest.approx(0.2 * share[moved], rel=0.03)
    padded = moe_job({"moe_capacity_factor": 1.0, "moe_pad_to_capacity": True}, gpus=4, global_batch_size=8)
    b2 = TransformerStepBuilder(padded)
    g2 = b2.build()
    fixed = StepSampler(padded, g2, only_imbalance, b2.expert_share())(np.random.default_rng(0), 100)
    assert np.all(fixed == g2.duration_s[:, None])  # padded to capacity: the load never varies


def test_deepseek_v3_multi_latent_attention_by_hand():
    j = Job.from_presets("deepseek-v3", "dgx-h100", plan={"tensor_parallel": 8, "sequence_parallel": True})
    m = j.model
    h, a, q_lora, kv_lora, rope, nope, v = 7168, 128, 1536, 512, 64, 128, 128
    split = q_lora * a * (nope + rope) + kv_lora * a * (nope + v) + a * v * h  # up projections, output
    whole = h * q_lora + q_lora + h * (kv_lora + rope) + kv_lora  # down projections and their norms
    assert m.attention_params() == (split, whole)
    assert m.num_params() == pytest.approx(671e9, rel=0.001)  # the report's 671B (MTP module apart)
    assert (m.num_moe_layers, m.is_moe_layer(2), m.is_moe_layer(3)) == (58, False, True)
    ops = {op.name: op for op in layer_forward(m, j.plan, moe=True)}
    T, t = 4096, 8
    assert ops["q_up"].amount == 2 * T * q_lora * a * (nope + rope) / t
    assert ops["kv_down"].amount == 2 * T * h * (kv_lora + rope)  # whole on every tensor-parallel rank
    scores = a / t * T * T
    assert ops["core_attention"].amount == (2 * scores * (nope + rope) + 2 * scores * v) / 2  # causal half
    assert ops["attn_proj"].amount == 2 * T * a * v * h / t


def test_flex_dispatch_sends_a_token_once_per_rank_by_hand():
    """Megatron-Core's flex dispatcher (DeepEP, HybridEP) sends a token once to each rank holding one of its
    experts: 2 ranks of 2 experts each, top-2 drawn evenly from 4, a rank is hit unless both experts lie on the
    other, 1 − 1/6 of the time: 5/3 copies a token where the all-to-all dispatcher sends 2 (one per expert)."""
    a2a_s = 32 * 2 * 64 * 2 / 2 / LINK  # the all-to-all dispatcher's, as in test_moe_layer_ops_by_hand
    flex = moe_job(moe_token_dispatcher="flex")
    assert layer_cost(flex).family_s["ep_alltoall"] == pytest.approx(2 * a2a_s * (5 / 3) / 2)
    assert layer_cost(flex, backward=True).family_s["ep_alltoall"] == pytest.approx(2 * a2a_s * (5 / 3) / 2)
    # one expert a rank (ep 4): a token's 2 experts are always on 2 ranks, nothing to share
    wide = {"moe_token_dispatcher": "flex", "expert_parallel": 4}
    assert layer_cost(moe_job(gpus=4, **wide)).family_s["ep_alltoall"] == pytest.approx(
        layer_cost(moe_job(gpus=4, expert_parallel=4, moe_probs_alltoall=False)).family_s["ep_alltoall"]
    )  # flex's kernels carry the probabilities with the tokens: nothing of their own
    assert "moe_dispatch.probs" not in ops_by_name(flex)


def test_flex_dispatch_share_across_nodes_by_hand():
    """8 of 128 experts (Qwen3 30B-A3B): over 2 nodes a token reaches the other node unless all 8 lie on its
    own, so 1 NIC copy (times P) where the all-to-all sends 8 · 1/2; over 8 GPUs of one node P·8 copies of 8."""
    misses_node = np.prod([(64 - i) / (128 - i) for i in range(8)])  # all 8 on one node's 64
    assert dispatch_share((8, 128), 16, 2) == pytest.approx(2 * (1 - misses_node) / 8)
    assert dispatch_share((8, 128), 16, 2) == pytest.approx(0.2492, abs=1e-4)
    misses_gpu = np.prod([(112 - i) / (128 - i) for i in range(8)])  # none on a given GPU's 16
    assert dispatch_share((8, 128), 8, 1) == pytest.approx(1 - misses_gpu)
    assert dispatch_share((), 8, 1) == 1.0 and dispatch_share((1, 8), 8, 1) == 1.0


def test_flex_dispatch_share_over_unevenly_filled_nodes_by_hand():
    """8 experts top-2 on 8 ranks of 3 GPUs a node: 3, 3 and 2 experts on the nodes. A node with e experts is hit
    1 − C(8 − e, 2)/C(8, 2) of the time: 18/28 (e = 3), 13/28 (e = 2), 49/28 together. From a node of 3 the flex
    dispatcher sends 49/28 − 18/28 = 31/28 copies off it, the per-expert one 2 · 5/8; from the node of 2,
    36/28 against 2 · 6/8; over the 8 senders (3 + 3 + 2): (6 · 31/28 + 2 · 36/28) / (6 · 10/8 + 2 · 12/8)."""
    expected = (6 * 31 / 28 + 2 * 36 / 28) / (6 * 10 / 8 + 2 * 12 / 8)
    assert dispatch_share((2, 8), 8, 3, 3) == pytest.approx(expected)
    assert expected == pytest.approx(0.8776, abs=1e-4)


def test_the_headline_names_the_flex_dispatcher():
    from itercast.workload import TransformerWorkload

    assert "over the flex dispatcher" in TransformerWorkload(moe_job(moe_token_dispatcher="flex")).headline()
    assert "flex" not in TransformerWorkload(moe_job()).headline()


def test_cli_refuses_the_flex_dispatcher_on_a_dense_model():
    args = ["predict", "--model", "gpt3-1.3b", "--system", "dgx-h100", "--set", "plan.moe_token_dispatcher=flex"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "plan.moe_token_dispatcher(flex) needs a mixture-of-experts model" in res.output


def test_predict_says_what_the_flex_dispatcher_price_leaves_out():
    args = ["predict", "--model", "qwen3-30b-a3b", "--system", "dgx-h100", "--set", "system.num_nodes=2"]
    args += ["--set", "plan.expert_parallel=16", "--set", "plan.moe_token_dispatcher=flex"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0 and "the NVLink forwarding on the receiving node are not priced" in res.output
    plain = CliRunner().invoke(app, args[:-2])
    assert plain.exit_code == 0 and "moe_token_dispatcher flex" not in plain.output


def test_the_routing_probabilities_travel_only_under_megatron_cores_alltoall_dispatcher_across_ranks():
    assert "moe_dispatch.probs" in ops_by_name(moe_job())
    assert "moe_dispatch.probs" not in ops_by_name(moe_job(gpus=1, expert_parallel=1))  # nothing leaves the rank
    assert "moe_dispatch.probs" not in ops_by_name(moe_job(moe_token_dispatcher="torchtitan"))
    assert "moe_dispatch.probs" not in ops_by_name(moe_job(moe_probs_alltoall=False))  # Megatron-Core < 0.13


def test_cli_refuses_the_shared_expert_overlap_on_a_dense_model():
    args = ["predict", "--model", "gpt3-1.3b", "--system", "dgx-h100", "--set", "plan.moe_shared_expert_overlap=true"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "plan.moe_shared_expert_overlap(True) needs a mixture-of-experts model" in res.output


def test_an_imbalance_routing_cannot_reach_is_refused_one_line():
    # Megatron-Core: the busiest of ep ranks gets at most min(k, E/ep) copies of a token, of a mean k/ep: at most
    # min(ep, E/k). 8 experts, top-2: ep 1 at most 1 (every copy on the one rank), ep 2 at most 2, ep 8 at most 4
    def refused(imbalance: float, ep: int) -> bool:
        try:
            Job.from_dicts(
                {"preset": "moe-tiny", "moe_token_imbalance": imbalance},
                {"global_batch_size": 16, "expert_parallel": ep, "data_parallel": 8},
                {"preset": "dgx-h100"},
            )
        except ConfigError as exc:
            assert f"cannot exceed {min(ep, 4):g} with 8 experts, top-2 routing and expert_parallel {ep}" in str(exc)
            return True
        return False

    assert [refused(x, 1) for x in (1.0, 1.01)] == [False, True]
    assert [refused(x, 2) for x in (2.0, 2.01)] == [False, True]
    assert [refused(x, 8) for x in (4.0, 4.01)] == [False, True]


def test_search_leaves_out_the_expert_parallel_sizes_that_cannot_hold_the_imbalance():
    # 8 experts, top-2 at an imbalance of 3: ep 1 and 2 hold at most 1 and 2, ep 4 and 8 at most min(ep, 4)
    m = Job.from_dicts(
        {"preset": "moe-tiny", "moe_token_imbalance": 3.0}, {"expert_parallel": 4}, {"preset": "dgx-h100"}
    )
    system = Job.from_presets("moe-tiny", "dgx-h100").system
    base = Job.from_presets("moe-tiny", "dgx-h100", plan={"global_batch_size": 16}).plan
    table, _ = enumerate_plans(m.model, system, base, 8, SpaceOptions(micro_batch_sizes=(1,), max_virtual_pipeline=1))
    assert set(table.cols["ep"].tolist()) == {4, 8}
    # and the search says what the rule left out
    note = imbalance_note(m.model, base) or ""
    assert "model.moe_token_imbalance 3: plans with fewer expert-parallel ranks than it are left out" in note
    assert imbalance_note(Job.from_presets("moe-tiny", "dgx-h100").model, base) is None
