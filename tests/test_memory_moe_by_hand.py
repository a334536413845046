"""Activation bytes per token of MoE and fp8 layers, computed by hand from what Megatron-Core and
Transformer Engine keep for backward: TEGroupedMLP.forward (megatron/core/transformer/moe/experts.py)
keeps the fc1 input, the fc1 output(s) with each copy's fp32 routing probability (applied in the
fused activation) and the activation output; the token dispatcher's unpermute takes no probabilities
and keeps no token copy; the router keeps its 16-bit input and fp32 scores. Under fp8 a GEMM keeps its
input as 1-byte column-wise data (transformer_engine/pytorch/module/linear.py, grouped_linear.py).
"""

from __future__ import annotations

from itercast.config.job import Job
from itercast.memory import activation_bytes_per_token_layer

# llama: h 64, 4 heads of 16, SwiGLU of 128; MoE: 4 experts of SwiGLU width 32, top-2, no shared expert
MODEL = {"family": "llama", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 128}
MODEL |= {"seq_length": 32, "vocab_size": 128}
MOE = {"num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 32}


def job(model: dict, gpus: int = 1, **plan: object) -> Job:
    system = {"preset": "dgx-h100", "num_nodes": 1, "node": {"gpus_per_node": gpus}}
    return Job.from_dicts(MODEL | model, {"tensor_parallel": 1} | plan, system)


def test_moe_layer_keeps_fc1_input_fc1_output_activation_output_and_fp32_probability_per_copy():
    # bf16, 4 heads in 4 groups: two norm inputs 2·2·64 = 256, QKV input 2·64 = 128, the router's
    # input 2·64 = 128; q, k, v 2·(4 + 2·4)·16 = 384, projection input 2·4·16 = 128; per routed
    # copy: fc1 input 2·64 = 128, gate and up outputs 2·2·32 = 128, activation output 2·32 = 64,
    # probability 4: 324, two copies 648; router scores 4 B × 4 experts = 16
    per_token = 256 + 128 + 128 + 384 + 128 + 2 * (128 + 128 + 64 + 4) + 16
    assert activation_bytes_per_token_layer(job(MOE), moe=True) == per_token == 1688


def test_expert_tensor_parallel_gathers_the_expert_input_and_sequence_parallel_shards_tokens():
    # tp 2 with SP, etp 2, ep 2, dp 2 on 4 GPUs: the norm/QKV/router inputs (512 B) and the top-2
    # copies shard over the 2 tensor ranks (a GPU holds 1 copy per token of the micro-batch); the
    # heads too (512 / 2); a copy keeps its fc1 input from both expert-tensor ranks 2·2·64 = 256 and
    # its fc1 output and activation output whole (each rank has half the width for twice the
    # tokens) 2·3·32 = 192, and its probability 4; router scores 16 / 2
    plan = {"tensor_parallel": 2, "sequence_parallel": True, "data_parallel": 2}
    plan |= {"expert_parallel": 2, "expert_tensor_parallel": 2}
    per_token = 512 / 2 + 512 / 2 + 1 * (256 + 192 + 4) + 16 / 2
    assert activation_bytes_per_token_layer(job(MOE, gpus=4, **plan), moe=True) == per_token == 972


def test_fp8_gemms_keep_one_byte_inputs_and_the_projection_its_own_copy():
    # dense llama layer, 2 query groups. bf16: norm inputs 256, QKV and MLP inputs 2·2·64 = 256;
    # q, k, v 2·(4 + 2·2)·16 = 256, projection input 2·4·16 = 128; SwiGLU outputs 2·2·128 = 512 and
    # activation output 2·128 = 256: 1664
    bf16 = job({"num_query_groups": 2}, dtype="bf16")
    assert activation_bytes_per_token_layer(bf16) == 256 + 256 + 256 + 128 + 512 + 256 == 1664
    # fp8: QKV and MLP inputs 1·64 each; the attention output 2 B kept by the attention kernel and
    # 1 B by the projection: 3·4·16 = 192; the activation output 1·128
    fp8 = job({"num_query_groups": 2}, dtype="fp8")
    assert activation_bytes_per_token_layer(fp8) == 256 + 128 + 256 + 192 + 512 + 128 == 1472


def test_fp8_moe_layer_router_input_stays_16_bit_expert_gemm_inputs_one_byte():
    # norm inputs 256, QKV input 1·64, router input 2·64 = 128; q, k, v 384, projection input
    # 3·4·16 = 192; per copy fc1 input 1·64, gate and up outputs 2·2·32 = 128, activation output
    # 1·32, probability 4: 228, two copies 456; router scores 16
    per_token = 256 + 64 + 128 + 384 + 192 + 2 * (64 + 128 + 32 + 4) + 16
    assert activation_bytes_per_token_layer(job(MOE, dtype="fp8"), moe=True) == per_token == 1496
