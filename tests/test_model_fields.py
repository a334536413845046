"""Fields published runs need: explicit head size, QK-norm, sliding-window attention, recompute
variants (Megatron-Core uniform/block, torchtitan per-layer and per-op), FSDP over dp × cp, and
unfused attention by default on GPUs without FlashAttention. Every expected value is worked out here."""

from __future__ import annotations

import pytest

from itercast.config.job import Job
from itercast.costs.analytic import AnalyticCostModel
from itercast.errors import ConfigError
from itercast.memory import activation_bytes_per_token_layer, estimate_memory, stage_params
from itercast.workloads import transformer_ops as ops
from itercast.workloads.transformer import Groups, layer_passes, pass_cost

# llama-style: h 64, 4 heads of 32 (≠ 64 / 4 = 16), 2 key/value groups, SwiGLU of 128, 8 tokens
TINY = {
    "family": "llama",
    "num_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_query_groups": 2,
    "head_dim": 32,
    "ffn_hidden_size": 128,
    "seq_length": 8,
    "vocab_size": 100,
}


def job(model: dict | None = None, system: str = "dgx-h100", gpus: int = 1, **plan: object) -> Job:
    sys = {"preset": system, "num_nodes": 1, "node": {"gpus_per_node": gpus}}
    return Job.from_dicts(TINY | (model or {}), {"tensor_parallel": 1} | plan, sys)


def by_name(op_list: list[ops.Op]) -> dict[str, float]:
    return {o.name: o.amount for o in op_list}


# -- head_dim ----------------------------------------------------------------------------------
def test_head_dim_sets_projection_shapes_flops_and_parameters():
    j = job()
    m = j.model
    # QKV: h × (a + 2g)·d = 64 × 8·32; output: a·d × h = 128 × 64
    assert m.attention_params() == (64 * 8 * 32 + 128 * 64, 0) == (24576, 0)
    fwd = by_name(ops.layer_forward(m, j.plan))
    assert fwd["qkv"] == 2 * 8 * 64 * 256 == 262144
    assert fwd["attn_proj"] == 2 * 8 * 128 * 64 == 131072
    # causal flash attention: 4 heads × 8·8/2 pairs × 2 FLOPs × (32 + 32)
    assert fwd["core_attention"] == 4 * 32 * 2 * 64 == 16384
    # MFU convention (all S keys): 2 · 8 · 4 · (32 + 32) per token
    assert m.attention_score_flops_per_token() == 4096


def test_head_dim_defaults_to_hidden_over_heads_and_is_required_when_they_do_not_divide():
    default = {k: v for k, v in TINY.items() if k != "head_dim"}
    assert Job.from_dicts(default, {}, {"preset": "dgx-h100"}).model.head_dim == 64 // 4
    with pytest.raises(ConfigError, match=r"hidden_size\(60\) not divisible by .*heads\(8\); set model.head_dim"):
        Job.from_dicts({"num_layers": 2, "hidden_size": 60, "num_attention_heads": 8}, {}, {"preset": "dgx-h100"})


def test_head_dim_sets_activation_memory():
    # bf16, tp 1, no SP: norms' and QKV/MLP inputs 4·2·64 = 512; q, k, v 2·8·32 = 512; attention
    # output 2·4·32 = 256; SwiGLU outputs 2·(2·128 + 128) = 768: 2048 bytes per token
    assert activation_bytes_per_token_layer(job()) == 512 + 512 + 256 + 768 == 2048


# -- QK-norm -----------------------------------------------------------------------------------
def test_qk_norm_is_a_memory_bound_op_its_input_kept_and_two_head_dim_weights():
    with_norm, without = job({"qk_norm": True}), job()
    fwd = by_name(ops.layer_forward(with_norm.model, with_norm.plan))
    assert fwd["qk_norm"] == 2 * 8 * 6 * 32 * 2 == 6144  # read + write q and k: 8 tokens × 6 heads × 32 × 2 B
    assert "qk_norm" not in by_name(ops.layer_forward(without.model, without.plan))
    # q and k before the norm: 2 B × 6 heads × 32
    assert activation_bytes_per_token_layer(with_norm) - activation_bytes_per_token_layer(without) == 384
    assert with_norm.model.layer_replicated_params() - without.model.layer_replicated_params() == 64


# -- sliding-window attention ------------------------------------------------------------------
def test_window_pairs_follow_flash_attention_local_window():
    m = job({"sliding_window": 3}).model
    # query i sees min(i + 1, 3) keys: 1 + 2 + 3·6 = 21 = S·W − W²/2 + W/2; the count drops W/2
    pairs = sum(min(i + 1, 3) for i in range(8))
    assert pairs == 21 and m.causal_keys_per_query(True) * 8 == 21 - 1.5 == 19.5
    assert m.causal_keys_per_query(False) * 8 == 32  # S²/2, FlashAttention's causal count
    assert job({"sliding_window": 100}).model.causal_keys_per_query(True) == 4  # a window past S is causal
    # MFU convention: twice the causal count, 2 · 2·2.4375 · 4 · 64
    assert m.attention_score_flops_per_token(True) == 2496


def test_global_layers_every_n_as_gemma_and_gpt_oss():
    gemma3 = job({"num_layers": 12, "sliding_window": 4, "global_attention_every": 6}).model
    assert [gemma3.is_windowed_layer(i) for i in range(6)] == [True] * 5 + [False]
    assert gemma3.num_windowed_layers == 10
    alternating = job({"sliding_window": 4, "global_attention_every": 2}).model
    assert [alternating.is_windowed_layer(i) for i in range(4)] == [True, False, True, False]
    all_local = job({"sliding_window": 4}).model
    assert all_local.num_windowed_layers == 4
    # model FLOPs per token: 2 windowed + 2 global layers of attention 2·2·(4 − 16/16)·4·64 = 3072, 4096
    full = job().model
    assert alternating.layers_forward_flops_per_token() - full.layers_forward_flops_per_token() == 2 * (3072 - 4096)


def test_windowed_layers_priced_in_proportion():
    # on A100 attention is priced by its FLOPs alone (no fitted kernel shape: costs/attention.py)
    j = job({"sliding_window": 3, "global_attention_every": 2}, system="dgx-a100")
    m, p = j.model, j.plan
    local = by_name(ops.layer_forward(m, p, windowed=True))["core_attention"]
    assert local == 4 * 19.5 * 2 * 64 == 9984  # 4 heads × 19.5 pairs × 2 FLOPs × (32 + 32)
    costs, groups = AnalyticCostModel(j.system, p.dtype), Groups.of(j)
    fwd, bwd = layer_passes(j, costs, groups)
    half = (float(costs.attention_s(9984.0)) + float(costs.attention_s(16384.0))) / 2
    assert fwd.family_s["attention"] == pytest.approx(half)
    assert bwd.family_s["attention"] == pytest.approx(
        (float(costs.attention_s(2.5 * 9984)) + float(costs.attention_s(2.5 * 16384))) / 2
    )


def test_window_needs_a_causal_family_and_global_layers_a_window():
    with pytest.raises(ConfigError, match=r"model\.global_attention_every needs model\.sliding_window"):
        job({"global_attention_every": 2})
    with pytest.raises(ConfigError, match=r"model\.sliding_window needs a causal family; got bert"):
        job({"family": "bert", "sliding_window": 4})


def test_a_window_under_context_parallelism_runs_over_all_gather_not_transformer_engines_ring():
    # TE's context_parallel.py: a sliding window needs cp_comm_type a2a or all_gather (user probe 10)
    windowed = {"sliding_window": 4, "seq_length": 16}
    with pytest.raises(ConfigError, match=r"plan\.cp_comm: Transformer Engine runs sliding-window attention .*got p2p"):
        job(windowed, gpus=2, context_parallel=2)
    assert job(windowed, gpus=2, context_parallel=2, cp_comm="all_gather").plan.cp_comm == "all_gather"
    assert job({"seq_length": 16}, gpus=2, context_parallel=2).plan.cp_comm == "p2p"  # no window: the ring
    assert job(windowed, gpus=2, data_parallel=2).plan.cp_comm == "p2p"  # no context parallelism


def test_selective_recompute_of_fused_attention_says_it_saves_nothing():
    # seq 1,024: scores 2·1024·4·(32 + 32) = 524,288 a layer and token, 2,097,152 over 4 layers; the rest of a
    # layer's forward 32,768 + 16,384 + 49,152 = 98,304, ×4 = 393,216; logits 2·64·100 = 12,800: the scores are
    # 2,097,152 / 2,503,168 = 28% of the model FLOPs (3× the forward on both sides)
    said = "core_attn under fused attention: the kernel keeps no attention scores to drop"
    fused = job({"seq_length": 1024}, recompute="selective", flash_attention=True)
    note = ops.fused_core_attn_recompute_note(fused.model, fused.plan) or ""
    assert said in note and "the attention forward, 28% of the model FLOPs, runs again" in note
    unfused = job({"seq_length": 1024}, recompute="selective", flash_attention=False)
    assert ops.fused_core_attn_recompute_note(unfused.model, unfused.plan) is None
    assert (
        estimate_memory(fused).activations_bytes
        == estimate_memory(job({"seq_length": 1024}, flash_attention=True)).activations_bytes
    )


# -- recompute variants ------------------------------------------------------------------------
def test_torchtitan_op_recompute_reruns_every_second_mm_and_memory_bound_ops():
    j = job(recompute="selective", selective_recompute="op")
    again = {o.name: o.amount for o in ops.layer_backward(j.model, j.plan) if o.name.startswith("recompute.")}
    # mm order wq wk wv wo w1 w3 w2: wk (2 of 8 QKV heads' columns), wo, w3 (half the fused gate+up)
    assert again["recompute.qkv"] == 262144 * 2 / 8 == 65536
    assert again["recompute.attn_proj"] == 131072
    assert again["recompute.mlp_up"] == 2 * 8 * 64 * 256 / 2 == 131072
    assert "recompute.mlp_down" not in again and "recompute.core_attention" not in again
    assert {"recompute.input_norm", "recompute.mlp_act", "recompute.rope"} <= set(again)
    # kept per token: layer input and w2 output 2·2·64 = 256; q 256, v 2·2·32 = 128, SDPA output 256
    # and its fp32 log-sum-exp 4·4 = 16, w1 output 2·128 = 256
    assert activation_bytes_per_token_layer(j) == 256 + 256 + 128 + 256 + 16 + 256 == 1168


def test_megatron_block_recomputes_the_first_layers_of_each_chunk():
    # 4 layers, 1 recomputed: a quarter keep only their input (2·64 B), the rest everything (2048 B)
    one_stage = job(recompute="full", recompute_method="block", recompute_num_layers=1)
    assert activation_bytes_per_token_layer(one_stage) == 0.25 * 128 + 0.75 * 2048 == 1568
    two_stages = job(gpus=2, pipeline_parallel=2, recompute="full", recompute_method="block", recompute_num_layers=1)
    assert activation_bytes_per_token_layer(two_stages) == 0.5 * 128 + 0.5 * 2048 == 1088
    j, costs = one_stage, AnalyticCostModel(one_stage.system, "bf16")
    groups = Groups.of(j)
    full = pass_cost(ops.layer_backward(j.model, j.plan, recompute="full"), costs, groups)
    none = pass_cost(ops.layer_backward(j.model, j.plan, recompute="none"), costs, groups)
    _, mean = layer_passes(j, costs, groups)
    assert mean.compute_s == pytest.approx(0.25 * full.compute_s + 0.75 * none.compute_s)


def test_megatron_uniform_checkpoints_one_input_per_group():
    j = job(recompute="full", recompute_num_layers=2)
    assert activation_bytes_per_token_layer(j) == 128 / 2  # one 2·64-byte input per 2 layers
    one = job(recompute="full")
    # the recomputed group lives whole during its backward: 2 layers × 2048 B × 8 tokens more than 1
    assert estimate_memory(j).activations_bytes - estimate_memory(one).activations_bytes == pytest.approx(
        4 * 8 * (64 - 128) + 2048 * 8
    )


def test_megatron_uniform_groups_end_at_the_chunk():
    """4 layers on one stage: a group of 8 is the chunk's 4 (transformer_block.py _checkpointed_forward ends
    each group at the chunk's last layer): one 128-byte input per 4 layers kept, the 4 layers' 2048 B a token
    live while recomputed (a group of 1000 had priced 1000 layers' there)."""
    eight, four = job(recompute="full", recompute_num_layers=8), job(recompute="full", recompute_num_layers=4)
    assert activation_bytes_per_token_layer(eight) == activation_bytes_per_token_layer(four) == 128 / 4
    assert estimate_memory(eight).activations_bytes == estimate_memory(four).activations_bytes
    # against groups of 1: inputs 4 × 8 × (32 − 128) B fewer, 3 more layers' 2048 B × 8 tokens live
    one = job(recompute="full")
    assert estimate_memory(eight).activations_bytes - estimate_memory(one).activations_bytes == pytest.approx(
        4 * 8 * (32 - 128) + 3 * 2048 * 8
    )


def test_torchtitan_every_nth_layer_is_checkpointed():
    j = job(recompute="full", recompute_every=2)  # layers 2 and 4 of 4
    assert activation_bytes_per_token_layer(j) == 0.5 * 128 + 0.5 * 2048 == 1088
    with pytest.raises(ConfigError, match=r"recompute_every\(2\) .* needs recompute_method=uniform"):
        job(recompute="full", recompute_every=2, recompute_method="block")


@pytest.mark.parametrize(
    ("recompute", "fields"),
    [
        ("selective", {"recompute_method": "block"}),  # Megatron-LM refuses it
        ("none", {"recompute_num_layers": 2}),  # and ignores it: said, not dropped
        ("selective", {"recompute_every": 2}),
    ],
)
def test_the_layers_of_full_recompute_need_full_recompute(recompute, fields):
    with pytest.raises(ConfigError, match=rf"need recompute=full; got recompute={recompute} \(Megatron-LM"):
        job(recompute=recompute, **fields)


# -- FSDP over data × context parallel -----------------------------------------------------------
def test_zero3_shards_and_gathers_over_data_times_context_parallel():
    j = job({"seq_length": 16}, gpus=8, context_parallel=2, zero_stage=3)
    assert j.plan.dp == 4 and Groups.of(j).grad.size == 4 * 2
    _, rest = stage_params(j, 0)
    mem = estimate_memory(j)
    assert mem.optimizer_bytes == pytest.approx(rest * 12 / 8)  # fp32 master + Adam m, v over 8 ranks
    assert mem.gradients_bytes == pytest.approx(rest * 4 / 8)


# -- FlashAttention by GPU -----------------------------------------------------------------------
def test_v100_defaults_to_unfused_attention_and_rejects_flash():
    assert job(system="v100-p3.16xlarge", dtype="fp16").plan.flash_attention is False
    assert job(system="dgx-a100").plan.flash_attention is True
    with pytest.raises(
        ConfigError,
        match=r"plan\.flash_attention: true, but V100-SXM2-16GB runs no FlashAttention \(compute capability < 8\.0",
    ):
        job(system="v100-p3.16xlarge", dtype="fp16", flash_attention=True)


def test_a_gpu_without_bf16_trains_in_fp16_unless_told_otherwise():
    # V100's datasheet lists fp16 and fp32 tensor throughput, no bf16: a job that leaves the precision out runs fp16
    assert job(system="v100-p3.16xlarge").plan.dtype == "fp16"
    assert job(system="dgx-a100").plan.dtype == "bf16"
    assert job(system="v100-p3.16xlarge", dtype="fp32").plan.dtype == "fp32"
    with pytest.raises(ConfigError, match=r"plan\.dtype\(bf16\) not supported by V100-SXM2-16GB \(has fp32, fp16\)"):
        job(system="v100-p3.16xlarge", dtype="bf16")


def test_presets_carry_their_published_parameter_counts():
    def billions(name: str) -> float:
        return round(Job.from_presets(name, "dgx-h100").model.num_params() / 1e9, 1)

    # Qwen3 technical report Table 1/2 and OpenAI's gpt-oss model card: 32.8B, 30.5B, 116.8B, 20.9B
    assert [billions(n) for n in ("qwen3-32b", "qwen3-30b-a3b", "gpt-oss-120b", "gpt-oss-20b")] == [
        32.8,
        30.5,
        116.8,
        20.9,
    ]


def test_search_keeps_selective_plans_only_where_they_recompute_something():
    from itercast.config.plan import PlanConfig
    from itercast.parallel.plan_table import RECOMPUTE
    from itercast.search.plan_space import SpaceOptions, enumerate_plans

    j = job(gpus=8)

    def selective_rows(**plan: str) -> int:
        base = PlanConfig(global_batch_size=16, **plan)  # type: ignore[arg-type]
        table, _ = enumerate_plans(j.model, j.system, base, 8, SpaceOptions())
        return int((table.cols["recompute"] == RECOMPUTE.index("selective")).sum())

    assert selective_rows() == 0  # Megatron's selective recompute of fused attention: the plan without
    assert selective_rows(selective_recompute="op") > 0  # torchtitan's per-op policy reruns GEMMs and norms
