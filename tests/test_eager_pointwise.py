"""plan.pointwise_kernels: torchtitan's llama norms, rotary and SwiGLU run op by op (eager), or under torch.compile
(compiled: the complex rotary and repeat_kv as eagerly, the rest fused), counted by hand.

LAYER: llama, hidden h = 64, ffn f = 128, 4 query heads and 2 key-value groups of d = 16, sequence 1024,
micro-batch 1, bf16 (e = 2), one GPU: T = 1024 tokens. Elements: a norm's T·h = 65,536; rotary's q and k
T·(4 + 2)·16 = 98,304; the SwiGLU's T·f = 131,072. An up- or down-cast between bf16 and fp32 moves
2 + 4 = 6 bytes per element.
- RMSNorm forward: .float() 6, pow 8, mean 4, × rsqrt 8, .type_as 6, × weight 4 = 36 bytes, 8 kernels
  (+ eps and rsqrt are per token); backward: × weight's two products 4 + 6 and the weight's sum 2,
  the down-cast's 6, × rsqrt's two products 8 + 12 and the sum 4, mean's 4, pow's copy 8, × 2 8,
  × grad 12, the engine's sum of x's two gradients 12, the up-cast's 6 = 92 bytes; kernels
  3 + 1 + 3 + 3 (rsqrt, per token) + 1 + 3 + 1 + 1 = 16.
- rotary, per element of q and k: cast 6, complex product 8, cast back 6 = 20 bytes forward and backward;
  3 kernels per tensor forward, 4 backward (the conjugated table copied first): 6 and 8.
- repeat_kv of the keys and of the values: read 2 heads, write 4, per token 16 · 2 bytes each:
  1024 · (2 + 4) · 16 · 2 = 196,608 bytes per tensor, 393,216 for both, 2 kernels, the same backward.
- SwiGLU: silu 2 + 2, × 4 + 2: 10 bytes, 2 kernels; backward two products 6 + 6 and silu_backward 6:
  18 bytes, 3 kernels.
Fused (today's pricing): a norm 2e = 4 bytes per element, rotary 4, SwiGLU 3e = 6, one kernel each.
"""

from __future__ import annotations

import pytest

from itercast.config.job import Job
from itercast.errors import ConfigError
from itercast.memory import activation_bytes_per_token_layer, estimate_memory
from itercast.workloads.transformer_ops import Op, backward_of, head_forward, layer_backward, layer_forward

LLAMA = {"family": "llama", "num_layers": 1, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4}
LLAMA |= {"num_query_groups": 2, "seq_length": 1024, "vocab_size": 128}
SYSTEM = {
    "gpu": {
        "name": "g",
        "peak_flops": {"fp32": 1e15, "bf16": 1e15},
        "hbm_bytes": 1e12,
        "hbm_bandwidth_bytes_per_s": 1e12,
        "l2_bytes": 1,
        "kernel_launch_overhead_s": 0.0,
        "reserved_bytes": 0.0,
    },
    "node": {"gpus_per_node": 1, "intra_node_bandwidth_bytes_per_s": 1e11, "intra_node_latency_s": 0.0},
    "network": {"nics_per_node": 1, "nic_bandwidth_bytes_per_s": 1e11, "latency_s": 0.0},
}
NORM = 1024 * 64  # 65,536 elements of a norm's input
ROTARY = 1024 * (4 + 2) * 16  # 98,304 elements of q and k
FFN = 1024 * 128  # 131,072 elements of the SwiGLU's output


def job(model: dict | None = None, **plan: object) -> Job:
    return Job.from_dicts({**LLAMA, **(model or {})}, {"data_parallel": 1, **plan}, SYSTEM)


def op(ops: list[Op], name: str) -> Op:
    return next(o for o in ops if o.name == name)


def fwd_bwd(j: Job, name: str) -> tuple[float, int, float, int]:
    """Forward bytes and kernels, backward bytes and kernels of the layer's op `name`."""
    f = op(layer_forward(j.model, j.plan), name)
    (b,) = backward_of([f], j.plan)
    return f.amount, f.count, b.amount, b.count


def test_eager_rmsnorm_moves_36_bytes_forward_92_backward_in_8_and_16_kernels():
    j = job(pointwise_kernels="eager")
    assert fwd_bwd(j, "input_norm") == (36 * NORM, 8, 92 * NORM, 16)
    assert fwd_bwd(j, "post_attn_norm") == (36 * NORM, 8, 92 * NORM, 16)
    final = op(head_forward(j.model, j.plan), "final_norm")
    assert (final.amount, final.count) == (36 * NORM, 8)


def test_eager_chains_run_on_the_elementwise_curve_reported_as_their_own_family():
    # PyTorch's elementwise and reduce kernels, not the fused kernels of the norm / activation curves
    ops = layer_forward(job(pointwise_kernels="eager").model, job(pointwise_kernels="eager").plan)
    assert (op(ops, "input_norm").family, op(ops, "input_norm").label) == ("elementwise", "norm")
    assert (op(ops, "mlp_act").family, op(ops, "mlp_act").label) == ("elementwise", "activation")


def test_eager_rotary_casts_q_and_k_to_fp32_and_back():
    assert fwd_bwd(job(pointwise_kernels="eager"), "rope") == (20 * ROTARY, 6, 20 * ROTARY, 8)


def test_eager_repeat_kv_copies_the_two_groups_to_four_heads_and_sums_them_back():
    assert fwd_bwd(job(pointwise_kernels="eager"), "repeat_kv") == (393_216, 2, 393_216, 2)
    # with as many key-value groups as heads repeat_kv returns its input: no copy
    mha = job({"num_query_groups": 4}, pointwise_kernels="eager")
    assert "repeat_kv" not in [o.name for o in layer_forward(mha.model, mha.plan)]


def test_eager_swiglu_is_silu_then_a_product():
    assert fwd_bwd(job(pointwise_kernels="eager"), "mlp_act") == (10 * FFN, 2, 18 * FFN, 3)


def test_eager_fused_norm_keeps_torchtitans_triton_rmsnorm_and_runs_the_rest_eagerly():
    # norm_type fused_rmsnorm without compile: the norm as fused (4 bytes per element, 1 kernel), rotary
    # and SwiGLU as eager above
    j = job(pointwise_kernels="eager_fused_norm")
    assert fwd_bwd(j, "input_norm") == (4 * NORM, 1, 8 * NORM, 1)
    assert fwd_bwd(j, "rope") == (20 * ROTARY, 6, 20 * ROTARY, 8)
    assert fwd_bwd(j, "mlp_act") == (10 * FFN, 2, 18 * FFN, 3)


def test_fp32_training_has_no_casts():
    # RMSNorm: pow 8, mean 4, × rsqrt 8, × weight 8 = 28 bytes in 6 kernels; rotary: the product, 8, 1 per tensor
    j = job(pointwise_kernels="eager", dtype="fp32")
    assert fwd_bwd(j, "input_norm")[:2] == (28 * NORM, 6)
    assert fwd_bwd(j, "rope")[:2] == (8 * ROTARY, 2)


def test_fused_is_todays_pricing_one_kernel_each():
    for j in (job(), job(pointwise_kernels="fused")):
        # norm 2 · 2 = 4 bytes per element, rotary 4, SwiGLU 3 · 2 = 6; backward twice the forward
        assert fwd_bwd(j, "input_norm") == (4 * NORM, 1, 8 * NORM, 1)
        assert fwd_bwd(j, "rope") == (4 * ROTARY, 1, 8 * ROTARY, 1)
        assert fwd_bwd(j, "mlp_act") == (6 * FFN, 1, 12 * FFN, 1)
        assert "repeat_kv" not in [o.name for o in layer_forward(j.model, j.plan)]
    assert layer_forward(job().model, job().plan) == layer_forward(job().model, job(pointwise_kernels="fused").plan)


def test_a_gpt_model_keeps_its_one_kernel_layer_norm_and_gelu_eagerly():
    gpt = {"family": "gpt", "ffn_hidden_size": None, "num_query_groups": None}
    eager, fused = job(gpt, pointwise_kernels="eager"), job(gpt)
    assert layer_forward(eager.model, eager.plan) == layer_forward(fused.model, fused.plan)


def test_torchtitans_op_recompute_reruns_the_eager_chains():
    j = job(pointwise_kernels="eager", recompute="selective", selective_recompute="op")
    again = layer_backward(j.model, j.plan)
    assert (op(again, "recompute.input_norm").amount, op(again, "recompute.input_norm").count) == (36 * NORM, 8)
    assert op(again, "recompute.repeat_kv").amount == 393_216


def test_compiled_fuses_the_norms_and_swiglu_but_runs_the_complex_rotary_and_repeat_kv_as_eagerly():
    # torch.compile: Inductor's norm and SwiGLU kernels (4 and 6 bytes per element, one kernel), its fallback
    # to eager's complex product between its casts (20 bytes, 6 and 8 kernels), repeat_kv's copies (393,216)
    j = job(pointwise_kernels="compiled")
    assert fwd_bwd(j, "input_norm") == (4 * NORM, 1, 8 * NORM, 1)
    assert fwd_bwd(j, "mlp_act") == (6 * FFN, 1, 12 * FFN, 1)
    assert fwd_bwd(j, "rope") == (20 * ROTARY, 6, 20 * ROTARY, 8)
    assert fwd_bwd(j, "repeat_kv") == (393_216, 2, 393_216, 2)
    # the projections' input gradients summed by one Inductor kernel (plan.projections separate): q, k, v's
    # 3 gradients read and the sum written, 4 · 1024 tokens · 64 · 2 bytes
    separate = job(pointwise_kernels="compiled", projections="separate")
    total = op(layer_backward(separate.model, separate.plan), "qkv.dgrad_sum")
    assert (total.amount, total.count) == (4 * 1024 * 64 * 2, 1)


def test_compiled_keeps_only_the_repeated_keys_and_values_beyond_the_fused_count():
    # the repeated keys and values, SDPA's inputs, 2 · 2 · (4 - 2) · 16 = 128 bytes per token more
    assert activation_bytes_per_token_layer(job(pointwise_kernels="compiled")) == 1664 + 128


def test_an_unknown_value_names_the_field_and_its_choices():
    choices = r"'fused', 'compiled', 'eager' or 'eager_fused_norm'"
    with pytest.raises(ConfigError, match=r"pointwise_kernels(.|\n)*" + choices):
        job(pointwise_kernels="inductor")


# What autograd keeps for backward, per token of the LAYER above (memory.eager_saved_bytes; tp = 1, no SP).
# Fused (today's count): two norm inputs 2 · 2 · 64, the QKV and MLP inputs 2 · 64 each: 512; q, k, v
# 2 · (4 + 2 · 2) · 16 = 256, the projection input 2 · 4 · 16 = 128, w1 and w3 outputs and the SwiGLU output
# 3 · 2 · 128 = 768: 1,152; 1,664 bytes in all.
# Eager, beyond it: each RMSNorm's fp32 x.float() (pow and × rsqrt save it) 4 · 64 = 256 and its per-token
# rsqrt 4, instead of its 16-bit input, with × weight's 16-bit normed x (2 · 64) in that input's place:
# 2 norms · (256 + 4) = 520; repeat_kv's keys and values, SDPA's saved inputs at 4 heads instead of 2:
# 2 · 2 · (4 - 2) · 16 = 128; the silu output the product saves, 2 · 128 = 256: 904 bytes, 2,568 in all.
EAGER_EXTRA = 2 * (4 * 64 + 4) + 2 * 2 * (4 - 2) * 16 + 2 * 128  # 904 bytes per token and layer
TOKENS = 1024


def test_eager_autograd_keeps_the_fp32_norm_inputs_the_repeated_kv_and_the_silu_output():
    assert activation_bytes_per_token_layer(job()) == 1664
    assert activation_bytes_per_token_layer(job(pointwise_kernels="eager")) == 1664 + EAGER_EXTRA  # 2,568
    # torchtitan's Triton fused_rmsnorm keeps its input like the fused norm: the KV copies and silu only
    assert activation_bytes_per_token_layer(job(pointwise_kernels="eager_fused_norm")) == 1664 + 128 + 256


def test_the_eager_extra_is_kept_by_every_layer_only_without_recompute():
    # two layers, one micro-batch in flight. No recompute: both layers keep the extra, 2 · 904 · 1024 =
    # 1,851,392 bytes more. Full recompute (the layer input only, 2 · 64 per token either way) and
    # torchtitan's op-level policy (mm and SDPA outputs: the same tensors either way) keep none of it: the
    # one layer recomputed during its backward holds it, 904 · 1024 = 925,696 bytes more.
    def more(**plan: object) -> float:
        fused, eager = job({"num_layers": 2}, **plan), job({"num_layers": 2}, pointwise_kernels="eager", **plan)
        return estimate_memory(eager).activations_bytes - estimate_memory(fused).activations_bytes

    assert more() == 2 * EAGER_EXTRA * TOKENS == 1_851_392
    assert more(recompute="full") == EAGER_EXTRA * TOKENS == 925_696
    assert more(recompute="selective", selective_recompute="op") == EAGER_EXTRA * TOKENS
    for plan in ({"recompute": "full"}, {"recompute": "selective", "selective_recompute": "op"}):
        kept = activation_bytes_per_token_layer(job(**plan))
        assert activation_bytes_per_token_layer(job(pointwise_kernels="eager", **plan)) == kept


def test_the_eager_extra_is_sharded_like_its_tensors_under_tensor_parallelism():
    # tp 2 with sequence parallelism: the norms' share over 2 (520 / 2 = 260), the KV copies' and silu
    # output's over 2 ((128 + 256) / 2 = 192): 452 bytes per token more
    plan = {"data_parallel": 1, "tensor_parallel": 2, "sequence_parallel": True}
    system = {**SYSTEM, "node": {**SYSTEM["node"], "gpus_per_node": 2}}
    fused = Job.from_dicts(LLAMA, plan, system)
    eager = Job.from_dicts(LLAMA, {**plan, "pointwise_kernels": "eager"}, system)
    assert activation_bytes_per_token_layer(eager) - activation_bytes_per_token_layer(fused) == 260 + 192


def test_a_gpt_model_keeps_the_same_activations_eagerly():
    # its nn.LayerNorm and GELU save the same tensors eagerly as fused: nothing more
    gpt = {"family": "gpt", "ffn_hidden_size": None, "num_query_groups": None}
    assert activation_bytes_per_token_layer(job(gpt, pointwise_kernels="eager")) == activation_bytes_per_token_layer(
        job(gpt)
    )
