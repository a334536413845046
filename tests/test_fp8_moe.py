"""FP8 costs of an MoE layer and of torchao's weight casts, bytes and kernels counted by hand.

MOE (test_moe): llama, hidden 64, 32 tokens per micro-batch, 4 experts of width 32 (SwiGLU: the up
GEMM writes 2 × 32 = 64), top-2, expert parallel 2: each rank holds 2 experts and receives
32 tokens × 2 = 64 rows (even routing). MODEL (test_golden): gpt, hidden 64, QKV weight 64 × 192.
Bytes per element of a bf16 operand: e = 2; an FP8 copy 1.
- delayed (Transformer Engine): a cast-transpose reads 2 and writes 1 + 1 = 4; both experts' rows go
  through one multi-tensor kernel (TE multi_tensor_quantize_impl).
- tensorwise (TE current scaling): an amax read first, 2 + 4 = 6; the amax zeroed, then amax, scale and
  cast kernels, 4 per operand, per expert; 3 after a layer norm, which computed the amax (zeroed first).
  torchao's tensorwise (weights cast every micro-batch): amax, scale and cast, 3; 2 after a norm.
- grouped experts under TE: each expert's rows copied into a buffer padded to a multiple of 16 and
  the output copied back (Fp8Padding / Fp8Unpadding): read 2 + write 2 per element, one kernel
  forward, one backward, each.
- rowwise (torchao): weights recast on every micro-batch: forward read 2 + write 1 = 3 (one
  kernel), backward a bf16 transpose 2 + 2 and a cast 2 + 1 = 7 (two kernels).
"""

from __future__ import annotations

import pytest
from test_fp8_recipes import FP8_SYSTEM
from test_golden import HBM, MODEL, linear_calibration
from test_moe import MOE

from itercast.config.job import Job
from itercast.costs.analytic import AnalyticCostModel
from itercast.workloads.transformer import Groups, pass_cost
from itercast.workloads.transformer_ops import Op, backward_of, layer_forward

ROWS, H, FE2, FE = 64, 64, 64, 32  # rows per rank, hidden, expert up width (gate + up), expert down width


def moe_fp8(recipe: str, dtype: str = "fp8", **plan_fields) -> Job:
    node = {**FP8_SYSTEM["node"], "gpus_per_node": 2}
    plan = {"expert_parallel": 2, "data_parallel": 2, "dtype": dtype, "fp8_recipe": recipe, "moe_grouped_gemm": True}
    return Job.from_dicts(MOE, plan | plan_fields, {**FP8_SYSTEM, "node": node, "num_nodes": 1})


def moe_ops(recipe: str, dtype: str = "fp8", **plan_fields) -> tuple[list[Op], list[Op]]:
    j = moe_fp8(recipe, dtype, **plan_fields)
    fwd = layer_forward(j.model, j.plan, moe=True)
    return fwd, backward_of(fwd, j.plan)


def by_name(recipe: str, **plan_fields) -> dict[str, Op]:
    fwd, bwd = moe_ops(recipe, **plan_fields)
    return {op.name: op for op in fwd + bwd}


def kernels(ops: list[Op], recipe: str, dtype: str = "fp8") -> int:
    j = moe_fp8(recipe, dtype)
    return pass_cost(ops, AnalyticCostModel(j.system, dtype, linear_calibration()), Groups.of(j)).kernels


def test_delayed_pads_the_expert_rows_and_casts_every_expert_in_one_kernel():
    got = by_name("delayed")
    pad = 2 * ROWS * H * 2  # read and write 64 rows of 64 bf16: 16,384 bytes
    for name in ("moe_fp8_pad", "moe_fp8_pad.bwd", "moe_fp8_unpad", "moe_fp8_unpad.bwd"):
        assert (got[name].amount, got[name].count) == (pad, 1)
    assert (got["expert_up.fp8_cast"].amount, got["expert_up.fp8_cast"].count) == (4 * ROWS * H, 1)  # 16,384
    assert got["expert_up.fp8_cast.bwd"].amount == 4 * ROWS * FE2  # the 64 × 64 output gradient: 16,384
    assert (got["expert_down.fp8_cast"].amount, got["expert_down.fp8_cast.bwd"].amount) == (
        4 * ROWS * FE,  # 8,192
        4 * ROWS * H,  # 16,384
    )
    assert not [n for n in got if "weight_cast" in n]  # TE keeps the step's FP8 weights


def test_padding_wraps_the_expert_gemms():
    fwd, _ = moe_ops("delayed")
    names = [op.name for op in fwd]
    i = names.index("expert_up")
    assert names[i - 2 : i] == ["moe_fp8_pad", "expert_up.fp8_cast"]
    assert names[names.index("expert_down") + 1] == "moe_fp8_unpad"
    assert "moe_fp8_pad" not in [op.name for op in moe_ops("delayed", dtype="bf16")[0]]


def test_tensorwise_casts_each_expert_with_four_kernels_under_te_three_under_torchao():
    got = by_name("tensorwise")
    up = got["expert_up.fp8_cast"]
    assert (up.amount, up.count) == (6 * ROWS * H, 4 * 2)  # 24,576 bytes; zero, amax, scale, cast × 2 experts
    assert (got["expert_up.fp8_cast.bwd"].amount, got["expert_up.fp8_cast.bwd"].count) == (6 * ROWS * FE2, 8)
    assert got["qkv.fp8_cast"].count == 3  # after the input norm: the amax zeroed (the norm writes it), scale, cast
    assert got["qkv.fp8_cast.bwd"].count == 4
    titan = by_name("tensorwise", fp8_weight_cast="per_microbatch")  # torchao's Float8Linear
    assert (titan["expert_up.fp8_cast"].count, titan["expert_up.fp8_cast.bwd"].count) == (3 * 2, 3 * 2)
    assert (titan["qkv.fp8_cast"].count, titan["qkv.fp8_cast.bwd"].count) == (2, 3)


def test_host_launches_the_fp8_kernels_of_an_moe_layer():
    bf16_fwd, bf16_bwd = moe_ops("delayed", dtype="bf16")
    fwd, bwd = moe_ops("delayed")
    base_fwd, base_bwd = kernels(bf16_fwd, "delayed", "bf16"), kernels(bf16_bwd, "delayed", "bf16")
    # delayed: casts of qkv, attn_proj, expert_up, expert_down (1 each), pad and unpad
    assert kernels(fwd, "delayed") - base_fwd == 4 + 2
    assert kernels(bwd, "delayed") - base_bwd == 4 + 2
    fwd, bwd = moe_ops("tensorwise")
    # tensorwise: qkv 3 (after the norm), attn_proj 4, expert_up 4 × 2, expert_down 4 × 2, pad, unpad
    assert kernels(fwd, "tensorwise") - base_fwd == 3 + 4 + 8 + 8 + 2
    assert kernels(bwd, "tensorwise") - base_bwd == 4 + 4 + 8 + 8 + 2


def test_padding_costs_its_bytes_at_hbm_speed():
    # the linear calibration: a memory-bound kernel takes bytes / HBM
    fwd, _ = moe_ops("delayed")
    pad = next(op for op in fwd if op.name == "moe_fp8_pad")
    j = moe_fp8("delayed")
    cost = pass_cost([pad], AnalyticCostModel(j.system, "fp8", linear_calibration()), Groups.of(j))
    assert cost.compute_s == pytest.approx(16_384 / HBM)


def test_torchao_rowwise_recasts_the_weights_on_every_micro_batch():
    node = {**FP8_SYSTEM["node"], "gpus_per_node": 1}
    plan = {"data_parallel": 1, "dtype": "fp8", "fp8_recipe": "rowwise"}
    j = Job.from_dicts(MODEL, plan, {**FP8_SYSTEM, "node": node})
    fwd = layer_forward(j.model, j.plan)
    got = {op.name: op for op in fwd + backward_of(fwd, j.plan)}
    weight = 64 * 192  # QKV: 12,288 elements
    assert (got["qkv.fp8_weight_cast"].amount, got["qkv.fp8_weight_cast"].count) == (3 * weight, 1)  # 36,864
    assert (got["qkv.fp8_weight_cast.bwd"].amount, got["qkv.fp8_weight_cast.bwd"].count) == (7 * weight, 2)
    assert fwd[fwd.index(got["qkv.fp8_weight_cast"]) + 1].name == "qkv"


def test_rowwise_moe_casts_every_expert_weight_and_pads_nothing():
    got = by_name("rowwise")
    weights = 2 * H * FE2  # two experts' 64 × 64 up weights: 8,192 elements
    assert (got["expert_up.fp8_weight_cast"].amount, got["expert_up.fp8_weight_cast"].count) == (3 * weights, 2)
    assert (got["expert_up.fp8_weight_cast.bwd"].amount, got["expert_up.fp8_weight_cast.bwd"].count) == (
        7 * weights,  # 57,344
        4,
    )
    assert got["expert_up.fp8_cast"].count == 2 * 2  # two kernels per expert's rows
    assert "moe_fp8_pad" not in got  # torchao runs no TE padding
