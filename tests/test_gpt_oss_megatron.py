"""What Megatron-Core runs beside the GEMMs for GPT-OSS's model features (model.glu_clamp, model.rope_mscale,
expert biases): its eager clamp before the fused activation (fused_bias_geglu.py), the per-expert fc2 bias add
(moe/experts.py `_apply_bias`) and the unfused rotary embedding it falls back to under YaRN's mscale
(rope_utils.py), at Megatron-Core b0cc2706. Every expected value is worked out by hand in the comments."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from itercast.cli.app import app
from itercast.config.job import Job
from itercast.errors import ConfigError
from itercast.memory import activation_bytes_per_token_layer
from itercast.workloads.transformer_ops import gpt_oss_note, layer_forward

# llama: h 64, 4 heads of 16 in 4 groups, 32 tokens; 4 experts of SwiGLU width 32, top-2, grouped GEMM, bf16
MODEL = {"family": "llama", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 128}
MODEL |= {"seq_length": 32, "vocab_size": 128, "num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 32}
GPT_OSS = {"glu_clamp": 7.0, "rope_mscale": 1.3466, "add_bias": True}


def job(model: dict, **plan: object) -> Job:
    system = {"preset": "dgx-h100", "num_nodes": 1, "node": {"gpus_per_node": 1}}
    return Job.from_dicts(MODEL | model, {"tensor_parallel": 1, "moe_grouped_gemm": True} | plan, system)


def ops(j: Job) -> dict:
    return {o.name: o for o in layer_forward(j.model, j.plan, moe=True)}


def test_yarn_mscale_rotates_q_and_k_unfused():
    # q and k: 32 tokens × (4 + 4) heads × 16 = 4,096 elements; fused 2 B read + 2 B written each: 16,384 B.
    # unfused: 12 × 2 B = 24 B forward (6 kernels a tensor), 13 × 2 B = 26 B backward
    assert ops(job({}))["rope"].amount == 16384
    rope = ops(job({"rope_mscale": 1.3466}))["rope"]
    assert (rope.amount, rope.count, rope.backward_amount, rope.backward_count) == (98304, 12, 106496, 12)


def test_clamp_and_fc2_bias_run_eagerly_around_the_grouped_gemms():
    got = ops(job(GPT_OSS))
    # 32 tokens × top-2 = 64 routed rows of width 32: 2,048 elements; clamps and cat 8 × 2 B = 16 B each forward
    # (3 kernels), backward (11 × 2 + 8) = 30 B (7 kernels)
    clamp = got["expert_act_clamp"]
    assert (clamp.amount, clamp.count, clamp.backward_amount, clamp.backward_count) == (32768, 3, 61440, 7)
    # the fc2 bias over 64 rows × 64 = 4,096 elements: 6 × 2 B forward in 2 × 4 experts + 1 kernels, 8 × 2 B
    # backward in 4 × 4 + 1
    bias = got["expert_down_bias"]
    assert (bias.amount, bias.count, bias.backward_amount, bias.backward_count) == (49152, 9, 65536, 17)
    names = list(got)
    assert names.index("expert_up") < names.index("expert_act_clamp") < names.index("expert_act")
    assert names.index("expert_down") < names.index("expert_down_bias")
    assert "expert_act_clamp" not in ops(job({"add_bias": True})) and "expert_down_bias" not in ops(job({}))


def test_the_clamp_keeps_the_clamped_cat_beside_the_fc1_output_unless_moe_act_recomputes_it():
    # 1,688 B a token for this MoE layer (test_memory_moe_by_hand); the clamped cat, 2 B × 2 × 32 per routed copy,
    # two copies: +256. moe_act then drops each copy's activation output (2 × 32) and the cat: 2 × (64 + 128)
    plain = activation_bytes_per_token_layer(job({"glu_clamp": 7.0}), moe=True)
    assert plain == 1688 + 256
    modules = {"recompute": "selective", "recompute_modules": ["moe_act"]}
    assert activation_bytes_per_token_layer(job({"glu_clamp": 7.0}, **modules), moe=True) == plain - 384


def test_predict_says_what_gpt_osss_price_leaves_out():
    args = ["predict", "--model", "gpt-oss-20b", "--system", "dgx-h100", "--set", "system.num_nodes=2"]
    args += [
        "--set",
        "plan.expert_parallel=8",
        "--set",
        "plan.global_batch_size=64",
        "--set",
        "plan.moe_grouped_gemm=true",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0 and "the attention sinks (priced as plain fused attention)" in res.output
    plain = CliRunner().invoke(app, [*args, "--set", "model.glu_clamp=null"])
    assert plain.exit_code == 0 and "model.glu_clamp (GPT-OSS)" not in plain.output


def test_what_the_gpt_oss_features_cannot_be_priced_on_is_refused_or_said():
    # the clamp is priced on gated routed experts only: a dense model is refused
    dense = {k: v for k, v in MODEL.items() if not k.startswith(("num_experts", "moe_"))}
    with pytest.raises(ConfigError, match=r"model\.glu_clamp is priced on gated routed experts"):
        Job.from_dicts(dense | {"glu_clamp": 7.0}, {}, {"preset": "dgx-h100", "num_nodes": 1})
    # under torchtitan's dispatcher the clamp and the experts' biases are not priced: predict says so
    j = job(GPT_OSS, expert_parallel=1)
    titan = j.plan.model_copy(update={"moe_token_dispatcher": "torchtitan"})
    assert "not priced at all" in (gpt_oss_note(j.model, titan) or "")
    assert "not priced at all" not in (gpt_oss_note(j.model, j.plan) or "")
