"""The optimizer's bytes and dropout's masks, computed by hand (plan.main_params, plan.adam_state_dtype,
model.dropout).

Bytes per parameter of optimizer state: a copy of the weight (fp32 4; fp32 remainders 2, the low 16 bits
that rebuild fp32 from the bf16 weight; a bf16 copy 2; none 0) and Adam's two moments (fp32 4 each, bf16
2 each). Megatron-Core's default is 4 + 4 + 4 = 12.
"""

from __future__ import annotations

import pytest
from helpers import searched_top_plan

from itercast.config.job import Job
from itercast.errors import ConfigError
from itercast.memory import activation_bytes_per_token_layer, estimate_memory
from itercast.search.launch_settings import megatron_core_args, nemo_overrides
from itercast.workloads.transformer import optimizer_step_bytes
from itercast.workloads.transformer_ops import layer_forward

GPT = {"family": "gpt", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32}
GPT |= {"vocab_size": 128}


def _job(model: dict | None = None, **plan: object) -> Job:
    base = {"data_parallel": 4, "tensor_parallel": 2, "zero_stage": 1, "flash_attention": True} | plan
    return Job.from_dicts(GPT | (model or {}), base, {"preset": "dgx-h100", "num_nodes": 1})


@pytest.mark.parametrize(
    ("main", "adam", "per_param"),
    [
        ("fp32", "fp32", 4 + 4 + 4),
        ("fp32_remainders", "fp32", 2 + 4 + 4),
        ("fp32_remainders", "bf16", 2 + 2 + 2),
        ("bf16", "bf16", 2 + 2 + 2),
        ("none", "bf16", 0 + 2 + 2),
    ],
)
def test_optimizer_state_per_parameter_sharded_over_data_parallel_ranks(main: str, adam: str, per_param: int):
    # bf16 weights: 2 bytes a parameter on every rank; ZeRO-1 shards the optimizer state over dp 4
    est = estimate_memory(_job(main_params=main, adam_state_dtype=adam))
    params = est.weights_bytes / 2
    assert est.optimizer_bytes == pytest.approx(params * per_param / 4)


def test_fp32_training_keeps_no_copy_beside_its_weights():
    # fp32 weights (4 bytes) are the optimizer's own; Adam m, v 4 + 4, over dp 4: 2 bytes a parameter
    est = estimate_memory(_job(dtype="fp32"))
    assert est.optimizer_bytes == pytest.approx(est.weights_bytes / 4 * 8 / 4)


@pytest.mark.parametrize(
    ("plan", "needle"),
    [
        ({"dtype": "fp32", "main_params": "none"}, "fp32 training"),
        ({"dtype": "fp16", "main_params": "fp32_remainders"}, "bf16"),
    ],
)
def test_optimizer_copies_that_cannot_exist_are_refused(plan: dict, needle: str):
    with pytest.raises(ConfigError, match=needle):
        _job(**plan)


@pytest.mark.parametrize(
    ("plan", "per_param"),
    [
        # read copy 4, gradient 4, m, v 8; write copy 4, m, v 8, bf16 weight 2
        ({}, 4 + 4 + 8 + 4 + 8 + 2),
        # read remainders 2 with the bf16 weight 2, bf16 gradient 2, bf16 m, v 4; write 2, 4 and the weight 2
        ({"main_params": "fp32_remainders", "adam_state_dtype": "bf16", "grad_reduce_dtype": "bf16"}, 10 + 8),
        # no copy: read the weight 2, gradient 2, m, v 4; write m, v 4 and the weight 2
        ({"main_params": "none", "adam_state_dtype": "bf16", "grad_reduce_dtype": "bf16"}, 8 + 6),
        # fp32 training: read weight 4, gradient 4, m, v 8; write weight 4, m, v 8
        ({"dtype": "fp32"}, 28),
    ],
)
def test_adam_step_moves_the_bytes_of_its_state(plan: dict, per_param: int):
    assert optimizer_step_bytes(_job(**plan), 1000) == 1000 * per_param


def test_dropout_keeps_two_one_byte_masks_per_token_and_layer():
    # h 64, tp 2 without sequence parallelism: the masks after attention and after the MLP, one byte
    # per element each, whole on both ranks
    on = activation_bytes_per_token_layer(_job({"dropout": True}))
    off = activation_bytes_per_token_layer(_job({"dropout": False}))
    assert on - off == 2 * 64
    # unfused attention also keeps, per query, a/t·s bytes of mask and a/t·s·2 of dropped-out bf16 scores
    on = activation_bytes_per_token_layer(_job({"dropout": True}, flash_attention=False))
    off = activation_bytes_per_token_layer(_job({"dropout": False}, flash_attention=False))
    assert on - off == 2 * 64 + 4 / 2 * 32 * (1 + 2)


def test_dropout_writes_its_mask_in_the_residual_adds_and_is_the_gpt_default():
    # 32 tokens × 64: read two bf16 tensors, write one, and a 1-byte mask with dropout
    for model, mask in (({}, 1), ({"dropout": False}, 0), ({"family": "llama"}, 0)):
        j = _job(model)
        ops = {o.name: o.amount for o in layer_forward(j.model, j.plan)}
        assert ops["residual_1"] == ops["residual_2"] == 32 * 64 * (3 * 2 + mask)


def test_nemotron4_presets_train_without_dropout():
    # Parmar et al. 2024 §2: "dropout rate of zero"
    for preset in ("nemotron4-15b", "nemotron4-340b"):
        j = Job.from_dicts({"preset": preset}, {"tensor_parallel": 8}, {"preset": "dgx-h100", "num_nodes": 1})
        assert not j.model.has_dropout


def test_launch_settings_name_the_precision_aware_optimizer():
    plan = _job(main_params="fp32_remainders", adam_state_dtype="bf16").plan.model_dump()
    args = megatron_core_args(plan, _job().model)
    assert "--use-precision-aware-optimizer" in args and "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16" in args
    overrides = nemo_overrides(plan, _job().model).splitlines()
    assert "optim.config.use_precision_aware_optimizer=True" in overrides
    assert "optim.config.exp_avg_sq_dtype=torch.bfloat16" in overrides
    default = megatron_core_args(_job().plan.model_dump(), _job().model)
    assert "precision-aware" not in default


def test_fsdp2_keeps_fp32_weights_sharded_and_the_optimizer_only_its_moments():
    # torchtitan: fp32 weights (4 bytes) are the optimizer's, Adam m, v 8; dp 4. P from bf16 weights (2P).
    p = estimate_memory(_job()).weights_bytes / 2
    # ZeRO 3 (FSDP2 reshard after forward): fp32 weight shards 4P/4 where Megatron-style states keep
    # 2P/4; the same two bf16 layers gathered either way; optimizer 8P/4 instead of 12P/4
    fsdp = estimate_memory(_job(zero_stage=3, main_params="fp32_weights"))
    mixed = estimate_memory(_job(zero_stage=3))
    assert fsdp.weights_bytes - mixed.weights_bytes == pytest.approx(2 * p / 4)
    assert fsdp.optimizer_bytes == pytest.approx(8 * p / 4)
    assert fsdp.gradients_bytes == mixed.gradients_bytes
    # ZeRO 2 (reshard_after_forward False): the fp32 shard 4P/4 and the bf16 weights kept whole, 2P
    assert estimate_memory(_job(zero_stage=2, main_params="fp32_weights")).weights_bytes == pytest.approx(3 * p)
    # DDP (ZeRO 0): every fp32 weight, 4P, and the moments, 8P
    ddp = estimate_memory(_job(zero_stage=0, main_params="fp32_weights"))
    assert (ddp.weights_bytes, ddp.optimizer_bytes) == (pytest.approx(4 * p), pytest.approx(8 * p))


def test_fsdp2_adam_step_writes_no_16_bit_copy():
    # read weight 4, fp32 gradient 4, m, v 8; write weight 4, m, v 8 (FSDP2 casts when it gathers)
    assert optimizer_step_bytes(_job(main_params="fp32_weights"), 1000) == 1000 * 28


@pytest.mark.parametrize(("framework", "main"), [("torchtitan", "fp32_weights"), ("megatron-core", "fp32")])
def test_each_framework_searches_with_the_weights_it_keeps(framework: str, main: str):
    # torchtitan trains fp32 parameters cast to bf16 (config/configs.py); Megatron-Core its fp32 main params
    assert searched_top_plan(framework)["main_params"] == main
