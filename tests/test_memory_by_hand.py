"""Memory per GPU computed by hand: ZeRO's shards over data × context parallel ranks (Rajbhandari
et al. SC'20: 2 bytes of bf16 weight, 4 of fp32 gradient, 12 of fp32 master + Adam m, v per
parameter, each divided by the ranks of the stage that shards it), routed experts over their
expert-data-parallel group, and activations term by term (Korthikanti et al. 2022, eq. 1-2: 34·h
bytes per token and layer with fused attention) under GQA, SwiGLU and recomputation.
"""

from __future__ import annotations

import pytest
from test_golden import MODEL, SYSTEM
from test_step_by_hand import PARAMS, job

from itercast.config.job import Job
from itercast.memory import activation_bytes_per_token_layer, estimate_memory

H, V, T = 64, 128, 32  # MODEL's hidden size, vocabulary, tokens of one micro-batch
LAYER = 12 * H * H + 13 * H  # one gpt layer's weights and biases
KORTHIKANTI = 34 * H  # bytes per token of one gpt layer in 16-bit training, fused attention (no s×s scores)
# the last stage's logits of one micro-batch at the loss's peak: Megatron's fp32 softmax, turned into the
# gradient in place, beside the bf16 copy autograd casts it to for the output layer: 4 + 2 bytes
LOGITS = T * V * (4 + 2)


def test_zero_shards_states_over_data_times_context_parallel_ranks():
    # dp 2 × cp 2 = 4 ranks hold one copy: ZeRO-1 shards the optimizer, ZeRO-2 the gradients
    # too, ZeRO-3 the weights too (plus two whole layers gathered, FSDP's prefetch)
    mem = {z: estimate_memory(job(data_parallel=2, context_parallel=2, zero_stage=z)) for z in (0, 1, 2, 3)}
    expected = {
        0: (2 * PARAMS, 4 * PARAMS, 12 * PARAMS),
        1: (2 * PARAMS, 4 * PARAMS, 12 * PARAMS / 4),
        2: (2 * PARAMS, 4 * PARAMS / 4, 12 * PARAMS / 4),
        3: (2 * PARAMS / 4 + 2 * LAYER * 2, 4 * PARAMS / 4, 12 * PARAMS / 4),
    }
    for z, (weights, gradients, optimizer) in expected.items():
        got = (mem[z].weights_bytes, mem[z].gradients_bytes, mem[z].optimizer_bytes)
        assert got == pytest.approx((weights, gradients, optimizer)), f"zero_stage {z}"


def test_bf16_gradient_buffers_hold_two_bytes_per_parameter():
    assert estimate_memory(job(grad_reduce_dtype="bf16")).gradients_bytes == 2 * PARAMS


def test_routed_expert_states_shard_over_expert_data_parallel_ranks():
    # llama, one MoE layer (h 64, 4 heads, 4 experts of SwiGLU width 32, no shared expert), tp 2,
    # dp 2, ep 2, etp 2: the 4 ranks of a stage hold 4 / (ep · etp) = 1 copy of each expert shard
    # (2 experts × 3·64·32 / etp = 6,144 parameters), and 2 copies of the rest (dp × cp):
    # attention 4·64·64 / tp = 8,192, two RMSNorms 128, router 64·4 = 256, embedding and head each the
    # vocabulary of 128 padded to a multiple of 128 · tp = 256 (Megatron's make_vocab_size_divisible_by),
    # 128 rows × 64 a rank: 8,192 each; the final RMSNorm 64; 25,024 in all. ZeRO-1: 12 bytes of each, over
    # its own group.
    moe = {"family": "llama", "num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 32}
    plan = {"tensor_parallel": 2, "data_parallel": 2, "expert_parallel": 2, "expert_tensor_parallel": 2}
    plan |= {"sequence_parallel": True, "zero_stage": 1}  # Megatron-Core's MoE with tp > 1 needs SP
    system = {**SYSTEM, "node": {**SYSTEM["node"], "gpus_per_node": 4}, "num_nodes": 1}
    j = Job.from_dicts({**MODEL, **moe}, plan, system)
    assert estimate_memory(j).optimizer_bytes == pytest.approx(12 * (25_024 / 2 + 6_144 / 1))


def test_full_recompute_keeps_each_layer_input_and_one_whole_layer():
    # kept per token: the layer's 2-byte input; while the layer is recomputed its whole 34·h
    full = estimate_memory(job(recompute="full")).activations_bytes
    assert full == pytest.approx((2 * H + KORTHIKANTI) * T + LOGITS)
    assert estimate_memory(job()).activations_bytes == pytest.approx(KORTHIKANTI * T + LOGITS)
    # tp 2 with sequence parallelism: both terms split over the 2 ranks, and the unpadded logits too
    plan = {"recompute": "full", "tensor_parallel": 2, "sequence_parallel": True}
    sp = estimate_memory(job(**plan, make_vocab_size_divisible_by=1)).activations_bytes
    assert sp == pytest.approx((2 * H / 2 + KORTHIKANTI / 2) * T + LOGITS / 2)
    # padded to 256 rows (128 · tp), 128 a rank: the logits of the whole unpadded vocabulary
    padded = estimate_memory(job(**plan)).activations_bytes
    assert padded == pytest.approx((2 * H / 2 + KORTHIKANTI / 2) * T + LOGITS)


def test_context_parallel_ranks_keep_their_share_of_the_tokens():
    assert estimate_memory(job(context_parallel=2)).activations_bytes == pytest.approx((KORTHIKANTI * T + LOGITS) / 2)


def test_activations_count_query_groups_and_the_gated_mlp():
    # llama (no dropout), 4 heads in 2 groups, SwiGLU of 128: norm, QKV, MLP and projection inputs
    # 4·2h; q, k, v 2·(4 + 2·2)·16; projection input 2h; gate and up outputs 2·2·128 and the
    # activation output 2·128
    llama = job({"family": "llama", "num_query_groups": 2, "ffn_hidden_size": 128})
    per_token = 4 * 2 * H + 2 * (4 + 2 * 2) * 16 + 2 * H + 2 * 2 * 128 + 2 * 128
    assert activation_bytes_per_token_layer(llama) == per_token == 1664
    # unfused attention keeps the softmax output: heads × keys × 2 bytes per token (no dropout)
    unfused = job({"family": "llama", "num_query_groups": 2, "ffn_hidden_size": 128}, flash_attention=False)
    assert activation_bytes_per_token_layer(unfused) == per_token + 4 * 32 * 2
