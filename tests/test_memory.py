"""Memory per GPU against the published formulas (Korthikanti et al. 2022; ZeRO, SC'20)."""

from __future__ import annotations

import pytest
from helpers import gpt3_on_1024_a100

from itercast.config.job import Job
from itercast.memory import activation_bytes_per_token_layer, estimate_memory, stage_params

GPT3 = {"flash_attention": False}


def test_activations_match_korthikanti_equation_1():
    job = Job.from_presets("gpt3-175b", "dgx-a100", 1, GPT3)
    h, a, s = 12288, 96, 2048
    assert activation_bytes_per_token_layer(job) == 34 * h + 5 * a * s  # sbh(34 + 5as/h) per token


def test_activations_with_tensor_and_sequence_parallel_match_equation_2():
    job = Job.from_presets("gpt3-175b", "dgx-a100", 1, {**GPT3, "tensor_parallel": 8, "sequence_parallel": True})
    assert activation_bytes_per_token_layer(job) == (34 * 12288 + 5 * 96 * 2048) / 8


def test_selective_recompute_drops_the_attention_scores():
    job = Job.from_presets("gpt3-175b", "dgx-a100", 1, {**GPT3, "recompute": "selective"})
    assert activation_bytes_per_token_layer(job) == 34 * 12288


def test_full_recompute_keeps_only_the_layer_input():
    job = Job.from_presets("gpt3-175b", "dgx-a100", 1, {"recompute": "full"})
    assert activation_bytes_per_token_layer(job) == 2 * 12288


def test_zero_stages_shard_optimizer_then_gradients_then_weights():
    plan = {"tensor_parallel": 8, "global_batch_size": 64}
    m = {
        z: estimate_memory(Job.from_presets("gpt3-13b", "dgx-a100", 8, {**plan, "zero_stage": z})) for z in (0, 1, 2, 3)
    }
    _, params = stage_params(Job.from_presets("gpt3-13b", "dgx-a100", 8, plan), 0)
    dp = 8
    assert m[0].weights_bytes == 2 * params and m[0].gradients_bytes == 4 * params
    assert m[0].optimizer_bytes == 12 * params
    assert m[1].optimizer_bytes == pytest.approx(12 * params / dp) and m[1].gradients_bytes == 4 * params
    assert m[2].gradients_bytes == pytest.approx(4 * params / dp)
    assert m[3].weights_bytes < m[2].weights_bytes


def test_one_f_one_b_first_stage_holds_the_most_activations():
    job = gpt3_on_1024_a100()
    est = estimate_memory(job)
    per_layer = activation_bytes_per_token_layer(job) * 2048
    assert est.stage == 0
    assert est.activations_bytes == pytest.approx(12 * per_layer * 8)  # 12 layers × 8 in flight


def test_oom_flag_for_175b_on_one_node():
    assert estimate_memory(Job.from_presets("gpt3-175b", "dgx-a100", 1, {"tensor_parallel": 8})).oom


def _mixtral(plan: dict) -> Job:
    return Job.from_dicts({"preset": "mixtral-8x7b"}, {"expert_parallel": 2, **plan}, {"preset": "dgx-h100"})


def test_fp8_keeps_one_byte_gemm_inputs_only_where_transformer_engine_runs_the_gemm():
    # Mixtral 8x7B at tp 1: h 4096, expert ffn 14336, top-2, so 2 routed copies per token
    kept = {
        name: activation_bytes_per_token_layer(_mixtral(plan), moe=True)
        for name, plan in {
            "te": {"dtype": "fp8"},
            "bf16_experts": {"dtype": "fp8", "fp8_experts": False},
            "torchao": {"dtype": "fp8", "fp8_recipe": "tensorwise", "fp8_weight_cast": "per_microbatch"},
            "bf16": {"dtype": "bf16"},
        }.items()
    }
    # experts outside FP8 keep their fc1 input (h) and fc2 input (ffn) in 2 bytes, not 1: 2 x (4096 + 14336)
    assert kept["bf16_experts"] - kept["te"] == 2 * (4096 + 14336)
    # torchao's Float8Linear saves its high-precision input (float8_linear.py save_for_backward(input_hp, ...)):
    # every GEMM input as bf16 keeps it, and no extra 1-byte copies
    assert kept["torchao"] == kept["bf16"]


def test_torchtitans_per_op_recompute_keeps_only_the_expert_exchanges_outputs():
    # _get_default_save_ops saves all_to_all_single's outputs, not _grouped_mm's: with expert parallelism
    # each of the 2 routed copies keeps its dispatched and its combined token, 2 x 2 bytes x 4096
    op = {"recompute": "selective", "selective_recompute": "op"}
    with_ep = activation_bytes_per_token_layer(_mixtral(op), moe=True)
    without = activation_bytes_per_token_layer(_mixtral({**op, "expert_parallel": 1}), moe=True)
    assert with_ep - without == 2 * 2 * 2 * 4096
    # and far less than without recompute, which keeps the experts' inputs and outputs whole
    assert with_ep < activation_bytes_per_token_layer(_mixtral({}), moe=True) / 3
