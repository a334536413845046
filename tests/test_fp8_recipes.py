"""FP8 scaling recipes (plan.fp8_recipe) priced by hand on one GEMM, their launch settings and the
frameworks that refuse them.

MODEL (test_golden): gpt, hidden 64, 4 heads of 16, MLP 4 × 64 = 256, 32 tokens, one micro-batch.
Its QKV GEMM reads the 32 × 64 output of the layer norm and writes 32 × 192; the projection reads
the 32 × 64 attention output and writes 32 × 64. Bytes per element cast (torchao's roofline,
roofline_utils.py get_tensor_memory_traffic_ovhd_s): delayed 4 (read bf16 2, two FP8 writes 1 + 1);
tensorwise 2 more for the amax read, unless a layer norm computes it (TE FUSED_NORM_AMAX_FP8);
rowwise 5 (bf16 read, FP8 and bf16-transpose writes) + 3 (transpose read, FP8 write), 2 less after
a norm.
"""

from __future__ import annotations

import pytest
from test_golden import HBM, MODEL, SYSTEM, linear_calibration
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import Job
from itercast.costs.analytic import AnalyticCostModel
from itercast.search.launch_settings import megatron_core_args, torchtitan_toml
from itercast.workloads.transformer import Groups, pass_cost
from itercast.workloads.transformer_ops import backward_of, layer_forward, rowwise_note

TOKENS, H = 32, 64
#: test_golden's linear GPU with an fp8 rate (the op amounts here do not depend on it)
FP8_SYSTEM = {**SYSTEM, "gpu": {**SYSTEM["gpu"], "peak_flops": {**SYSTEM["gpu"]["peak_flops"], "fp8": 2e12}}}


def ops(recipe: str, **plan: object) -> dict[str, float]:
    """Forward and backward op amounts of MODEL's layer under fp8 with `recipe`, by name."""
    tp = int(plan.get("tensor_parallel", 1))  # type: ignore[call-overload]
    system = {**FP8_SYSTEM, "node": {**SYSTEM["node"], "gpus_per_node": tp}}
    j = Job.from_dicts(MODEL, {"data_parallel": 1, "dtype": "fp8", "fp8_recipe": recipe, **plan}, system)
    fwd = layer_forward(j.model, j.plan)
    return {op.name: op.amount for op in fwd + backward_of(fwd, j.plan)}


def test_delayed_scaling_casts_each_operand_in_one_pass():
    got = ops("delayed")
    assert got["qkv.fp8_cast"] == pytest.approx(4 * TOKENS * H)  # 8,192 bytes
    assert got["qkv.fp8_cast.bwd"] == pytest.approx(4 * TOKENS * 3 * H)  # 24,576: the 32 × 192 gradient
    assert got["attn_proj.fp8_cast"] == pytest.approx(4 * TOKENS * H)


def test_tensorwise_adds_an_amax_read_except_after_a_layer_norm():
    got = ops("tensorwise")
    assert got["qkv.fp8_cast"] == pytest.approx(4 * TOKENS * H)  # the norm computed the amax: 8,192
    assert got["qkv.fp8_cast.bwd"] == pytest.approx(6 * TOKENS * 3 * H)  # 36,864
    assert got["attn_proj.fp8_cast"] == pytest.approx(6 * TOKENS * H)  # 12,288


def test_rowwise_casts_a_row_and_a_column_scaled_copy():
    got = ops("rowwise")
    assert got["qkv.fp8_cast"] == pytest.approx((3 + 3) * TOKENS * H)  # 12,288
    assert got["qkv.fp8_cast.bwd"] == pytest.approx((5 + 3) * TOKENS * 3 * H)  # 49,152
    assert got["attn_proj.fp8_cast"] == pytest.approx((5 + 3) * TOKENS * H)  # 16,384


@pytest.mark.parametrize(
    ("recipe", "nbytes", "share"),
    [
        # torchao rowwise as torch.compile runs it reaches 0.30 of the elementwise bandwidth (fitted on torchao's
        # LayerNorm -> Linear -> Sigmoid kernel table, validation/fp8_linear_speedup.py): 16,384 bytes take
        # 16,384 / 0.30 / 1e11 s = 0.546 us; tensorwise's 12,288 bytes run at the curve, 0.123 us
        ("rowwise", (5 + 3) * TOKENS * H, 0.30),
        ("tensorwise", 6 * TOKENS * H, 1.0),
    ],
)
def test_rowwise_casts_run_at_a_share_of_the_elementwise_bandwidth(recipe: str, nbytes: int, share: float):
    one_gpu = {**FP8_SYSTEM, "node": {**SYSTEM["node"], "gpus_per_node": 1}}
    j = Job.from_dicts(MODEL, {"data_parallel": 1, "dtype": "fp8", "fp8_recipe": recipe}, one_gpu)
    fwd = layer_forward(j.model, j.plan)
    casts = [op for op in fwd + backward_of(fwd, j.plan) if op.label == "fp8_cast"]
    assert casts and {op.bandwidth_share for op in casts} == {share}
    proj = next(op for op in fwd if op.name == "attn_proj.fp8_cast")
    costs = AnalyticCostModel(j.system, "fp8", linear_calibration())
    assert pass_cost([proj], costs, Groups.of(j)).compute_s == pytest.approx(nbytes / share / HBM)


def test_predict_says_what_the_rowwise_price_rests_on():
    one_gpu = {**FP8_SYSTEM, "node": {**SYSTEM["node"], "gpus_per_node": 1}}
    plan = {"data_parallel": 1, "dtype": "fp8", "fp8_recipe": "rowwise"}
    compiled = rowwise_note(Job.from_dicts(MODEL, {**plan, "pointwise_kernels": "compiled"}, one_gpu).plan)
    assert compiled is not None and "0.3 of the elementwise bandwidth" in compiled and "Eager" not in compiled
    eager = rowwise_note(Job.from_dicts(MODEL, {**plan, "pointwise_kernels": "eager"}, one_gpu).plan)
    assert eager is not None and "Eager casts (no torch.compile) are priced the same: not measured." in eager
    tensorwise = Job.from_dicts(MODEL, {**plan, "fp8_recipe": "tensorwise"}, one_gpu).plan
    assert rowwise_note(tensorwise) is None


def test_tensorwise_all_reduces_the_amax_of_sequence_parallel_inputs():
    # tp 2 with sequence parallelism: QKV and MLP up (column-parallel) reduce one fp32 amax forward;
    # their backward pair stands for the projection's and MLP down's output gradients
    got = ops("tensorwise", tensor_parallel=2, sequence_parallel=True)
    reductions = {name: amount for name, amount in got.items() if "amax_all_reduce" in name}
    assert reductions == {
        "qkv.amax_all_reduce": 4,
        "mlp_up.amax_all_reduce": 4,
        "qkv.amax_all_reduce.bwd": 4,
        "mlp_up.amax_all_reduce.bwd": 4,
    }
    assert not [n for n in ops("delayed", tensor_parallel=2, sequence_parallel=True) if "amax" in n]


def test_launch_settings_name_the_recipe():
    one_gpu = {**FP8_SYSTEM, "node": {**SYSTEM["node"], "gpus_per_node": 1}}
    j = Job.from_dicts(MODEL, {"data_parallel": 1, "dtype": "fp8", "fp8_recipe": "tensorwise"}, one_gpu)
    plan = j.plan.model_dump()
    assert "--fp8-recipe tensorwise" in megatron_core_args(plan, j.model)
    assert 'recipe_name = "tensorwise"' in torchtitan_toml(plan, j.model)


@pytest.mark.parametrize(
    ("framework", "recipe", "message"),
    [
        ("megatron-core", "rowwise", "megatron-core runs delayed or tensorwise, the job sets rowwise"),
        ("torchtitan", "delayed", "torchtitan runs tensorwise or rowwise, the job sets delayed"),
    ],
)
def test_a_recipe_the_framework_cannot_run_is_a_one_line_error(framework, recipe, message):
    sets = ["--set", "plan.dtype=fp8", "--set", f"plan.fp8_recipe={recipe}"]
    result = CliRunner().invoke(app, ["search", "--example", "--framework", framework, *sets])
    assert result.exit_code == 2 and f"plan.fp8_recipe: {message}" in result.output
