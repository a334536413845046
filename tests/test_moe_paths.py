"""Grouped against sequential routed experts (plan.moe_grouped_gemm), bytes and kernels counted by hand.

MOE (test_moe): llama, hidden 64, 32 tokens per micro-batch, 4 experts of width 32, top-2, expert
parallel 2: each rank holds 2 experts and its experts get 32 × 2 = 64 rows of 64 bf16, 8,192 bytes
(32 rows each under even routing).
- grouped (TEGroupedMLP): one activation kernel; under Transformer Engine FP8 the rows are copied into a
  buffer padded per expert to a multiple of 16 and copied back out (read 2 + write 2 bytes each,
  16,384 bytes, one kernel forward and one backward); delayed casts every expert's rows in one
  multi-tensor kernel.
- sequential (SequentialMLP, Megatron-Core's default): an activation kernel and a cast per expert; the
  expert outputs concatenated (torch.cat, 16,384 bytes) and, backward, the input gradients of the
  split (the same); under FP8 an expert pads its rows unless their count is fixed and a multiple of
  16: zeros and torch.cat of its rows and of their routing weights, 4 kernels, 2 × 8,192 bytes
  forward; backward the output slice's zero fill and copy, 3 × 8,192 bytes in 2 kernels.
"""

from __future__ import annotations

from test_fp8_recipes import FP8_SYSTEM
from test_golden import linear_calibration
from test_moe import MOE

from itercast.config.job import Job
from itercast.config.model import ModelConfig
from itercast.costs.analytic import AnalyticCostModel
from itercast.search.launch_settings import launch_settings
from itercast.workloads.transformer import Groups, pass_cost
from itercast.workloads.transformer_ops import Op, backward_of, layer_forward

ROWS_BYTES = 64 * 64 * 2  # 64 rows of 64 bf16 on each rank: 8,192 bytes
EXPERTS = 2  # local experts


def moe_job(model: dict | None = None, **plan: object) -> Job:
    plan = {"expert_parallel": 2, "data_parallel": 2, "fp8_recipe": "delayed", **plan}
    system = {**FP8_SYSTEM, "node": {**FP8_SYSTEM["node"], "gpus_per_node": 2}, "num_nodes": 1}
    return Job.from_dicts({**MOE, **(model or {})}, plan, system)


def ops(j: Job) -> tuple[list[Op], list[Op]]:
    fwd = layer_forward(j.model, j.plan, moe=True)
    return fwd, backward_of(fwd, j.plan)


def by_name(j: Job) -> dict[str, tuple[float, int]]:
    fwd, bwd = ops(j)
    return {op.name: (op.amount, op.count) for op in fwd + bwd}


def kernels(j: Job) -> tuple[int, int]:
    costs, groups = AnalyticCostModel(j.system, j.plan.dtype, linear_calibration()), Groups.of(j)
    return tuple(pass_cost(part, costs, groups).kernels for part in ops(j))  # type: ignore[return-value]


def test_sequential_experts_pad_run_and_concatenate_each_expert_apart():
    got = by_name(moe_job(dtype="fp8", moe_grouped_gemm=False))
    assert got["moe_fp8_pad"] == (2 * ROWS_BYTES, 4 * EXPERTS)  # 16,384 bytes, 8 kernels
    assert got["moe_fp8_pad.bwd"] == (3 * ROWS_BYTES, 2 * EXPERTS)  # 24,576 bytes, 4 kernels
    assert got["moe_expert_cat"] == got["moe_expert_cat.bwd"] == (2 * ROWS_BYTES, 1)
    assert got["expert_act"][1] == EXPERTS
    assert got["expert_up.fp8_cast"][1] == got["expert_down.fp8_cast.bwd"][1] == EXPERTS  # one cast per expert
    assert "moe_fp8_unpad" not in got  # the output is sliced back: a view


def test_grouped_experts_pad_and_unpad_once_with_one_activation():
    got = by_name(moe_job(dtype="fp8", moe_grouped_gemm=True))
    assert got["moe_fp8_pad"] == got["moe_fp8_unpad.bwd"] == (2 * ROWS_BYTES, 1)
    assert got["expert_act"][1] == 1 and got["expert_up.fp8_cast"][1] == 1
    assert "moe_expert_cat" not in got


def test_kernels_of_the_two_paths_differ_by_what_each_launches():
    seq = kernels(moe_job(dtype="fp8", moe_grouped_gemm=False))
    grouped = kernels(moe_job(dtype="fp8", moe_grouped_gemm=True))
    # forward: pads 8 instead of pad + unpad 2, the cat 1, activations 2 instead of 1, casts of
    # expert_up and expert_down 2 each instead of 1: 8 - 2 + 1 + 1 + 2 = 10
    assert seq[0] - grouped[0] == 8 - 2 + 1 + (2 - 1) + 2 * (2 - 1)
    # backward: the slice's 4 instead of 2 copies, the split's cat 1, activations +1, casts +2: 6
    assert seq[1] - grouped[1] == 4 - 2 + 1 + (2 - 1) + 2 * (2 - 1)


def test_in_bf16_only_the_sequential_concatenation_copies():
    seq = by_name(moe_job(moe_grouped_gemm=False))
    assert seq["moe_expert_cat"] == (2 * ROWS_BYTES, 1) and "moe_fp8_pad" not in seq
    assert not [n for n in by_name(moe_job(moe_grouped_gemm=True)) if n.startswith(("moe_fp8", "moe_expert_cat"))]


def test_sequential_experts_pad_only_rows_not_a_multiple_of_16():
    # padded to capacity: capacity factor 1.0 gives each expert 64 / 2 = 32 rows, a multiple of 16, no
    # copy; 1.25 gives 80 / 2 = 40 rows, which pad
    aligned = {"moe_capacity_factor": 1.0, "moe_pad_to_capacity": True}
    assert "moe_fp8_pad" not in by_name(moe_job(aligned, dtype="fp8"))
    padded = by_name(moe_job({**aligned, "moe_capacity_factor": 1.25}, dtype="fp8"))
    assert padded["moe_fp8_pad"] == (2 * 80 * 64 * 2, 4 * EXPERTS)  # 20,480 bytes


def test_experts_outside_the_float8_converter_run_in_bf16():
    got = by_name(moe_job(dtype="fp8", fp8_recipe="tensorwise", fp8_experts=False, moe_grouped_gemm=True))
    assert not [n for n in got if n.startswith(("expert_up.fp8", "expert_down.fp8", "moe_fp8"))]
    assert "qkv.fp8_cast" in got  # the layer's own linears stay FP8
    fwd, _ = ops(moe_job(dtype="fp8", fp8_experts=False))
    assert not next(op for op in fwd if op.name == "expert_up").te


def test_launch_settings_name_the_expert_path():
    plan = moe_job(moe_grouped_gemm=True).plan.model_dump()
    model = ModelConfig.model_validate(MOE)
    assert "--moe-grouped-gemm" in launch_settings("megatron-core", plan, model)
    assert "--moe-grouped-gemm" not in launch_settings("megatron-core", {**plan, "moe_grouped_gemm": False}, model)
    assert "model.config.moe_grouped_gemm=True" in launch_settings("nemo", plan, model)
    fp8 = {**plan, "dtype": "fp8", "fp8_recipe": "tensorwise", "fp8_weight_cast": "per_microbatch"}
    assert 'fqns = ["experts"]' in launch_settings("torchtitan", fp8, model)
    assert 'fqns = ["experts"]' not in launch_settings("torchtitan", {**fp8, "fp8_experts": False}, model)
