"""Separate query, key and value projections and gate and up projections (plan.projections separate:
torchtitan's wq, wk, wv and w1, w3): a GEMM each, and their shared input's gradients summed, eagerly one add
at a time, compiled in one kernel. Expected values worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import Job
from itercast.workloads.transformer import Groups, pass_cost
from itercast.workloads.transformer_ops import Op, layer_backward, layer_forward

# llama: h 64, 4 query heads of 16 and 2 key-value heads, SwiGLU of 128; micro-batch 2 × 32 = 64 tokens
MODEL = {"family": "llama", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 2}
MODEL |= {"ffn_hidden_size": 128, "seq_length": 32, "vocab_size": 128}


def job(tp: int = 1, **plan: object) -> Job:
    system = {"preset": "dgx-h100", "num_nodes": 1, "node": {"gpus_per_node": 2}}
    base = {"tensor_parallel": tp, "sequence_parallel": tp > 1, "micro_batch_size": 2, "projections": "separate"}
    return Job.from_dicts(MODEL, base | plan, system)


def test_each_projection_is_a_gemm_of_its_own_share():
    # q: 4 heads × 16 = 64 wide, k and v 2 × 16 = 32 each, of 128: 1/2, 1/4, 1/4; gate and up 128 each: 1/2, 1/2
    j = job()
    ops = {o.name: o for o in layer_forward(j.model, j.plan)}
    assert ops["qkv"].parts == (0.5, 0.25, 0.25) and ops["mlp_up"].parts == (0.5, 0.5)
    assert ops["attn_proj"].parts == () and ops["mlp_down"].parts == ()
    fused = job(projections="fused")
    assert all(o.parts == () for o in layer_forward(fused.model, fused.plan))
    # a plain MLP has one up projection
    plain = Job.from_dicts(
        {**MODEL, "family": "gpt", "num_query_groups": None}, {"projections": "separate"}, {"preset": "dgx-h100"}
    )
    assert {o.name: o.parts for o in layer_forward(plain.model, plain.plan)}["mlp_up"] == ()


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize(
    ("kernels", "qkv_sum", "mlp_sum"),
    [
        # eager: the autograd engine adds each arriving gradient to the sum so far, reading 2 and writing 1:
        # the shared input's gradient is 64 tokens × 64 × 2 B = 8,192 B (gathered under TP); q, k, v: 2 adds,
        # 6 × 8,192 = 49,152 B; gate and up: 1 add, 3 × 8,192 = 24,576 B
        ("eager", (49152, 2), (24576, 1)),
        # compiled: one kernel reads the k gradients and writes the sum: 4 × 8,192 and 3 × 8,192
        ("fused", (32768, 1), (24576, 1)),
    ],
)
def test_the_input_gradients_are_summed(tp, kernels, qkv_sum, mlp_sum):
    j = job(tp, pointwise_kernels=kernels)
    back = {o.name: o for o in layer_backward(j.model, j.plan)}
    assert (back["qkv.dgrad_sum"].amount, back["qkv.dgrad_sum"].count) == qkv_sum
    assert (back["mlp_up.dgrad_sum"].amount, back["mlp_up.dgrad_sum"].count) == mlp_sum
    assert back["qkv.dgrad"].parts == back["qkv.wgrad"].parts == (0.5, 0.25, 0.25)
    names = list(back)
    if tp > 1:  # summed before the reduce-scatter of the sum
        assert names.index("qkv.dgrad_sum") < names.index("qkv.dgrad_reduce_scatter")
    fused = job(tp, pointwise_kernels=kernels, projections="fused")
    assert not [n for n in (o.name for o in layer_backward(fused.model, fused.plan)) if n.endswith("dgrad_sum")]


class AffineGemms:
    """A cost model whose GEMM takes 1 µs + FLOPs / 1e15 s."""

    system = job().system

    def gemm_s(self, flops: np.ndarray | float, te: bool = True) -> np.ndarray:
        f = np.asarray(flops, dtype=np.float64)
        return np.where(f > 0, 1e-6 + f / 1e15, 0.0)


def test_a_gemm_of_separate_projections_pays_one_gemm_per_projection():
    # 1e12 FLOPs as three GEMMs of 5e11, 2.5e11, 2.5e11: 3 × 1 µs + 1 ms = 1.003 ms and 3 kernels, against
    # 1.001 ms and 1 kernel fused; twice over with count 2
    groups = Groups.of(job())
    separate = pass_cost([Op("qkv", "gemm", 1e12, count=2, parts=(0.5, 0.25, 0.25))], AffineGemms(), groups)  # type: ignore[arg-type]
    fused = pass_cost([Op("qkv", "gemm", 1e12, count=2)], AffineGemms(), groups)  # type: ignore[arg-type]
    assert separate.compute_s == pytest.approx(2 * 1.003e-3, rel=1e-12) and separate.kernels == 6
    assert fused.compute_s == pytest.approx(2 * 1.001e-3, rel=1e-12) and fused.kernels == 2


def test_per_op_recompute_reruns_the_key_projection_alone():
    # torchtitan's per-op policy reruns every second mm of the layer: wk, 1/4 of the QKV FLOPs, as one GEMM
    j = job(recompute="selective", selective_recompute="op")
    fwd = {o.name: o for o in layer_forward(j.model, j.plan)}
    back = {o.name: o for o in layer_backward(j.model, j.plan)}
    assert back["recompute.qkv"].amount == pytest.approx(fwd["qkv"].amount / 4, rel=1e-12)
    assert back["recompute.qkv"].parts == () and back["recompute.mlp_up"].parts == ()
    assert back["recompute.mlp_up"].amount == pytest.approx(fwd["mlp_up"].amount / 2, rel=1e-12)


@pytest.mark.parametrize(
    ("framework", "projections", "runs"),
    [("megatron-core", "separate", "fused"), ("torchtitan", "fused", "separate")],
)
def test_projections_the_framework_does_not_run_are_a_one_line_error(framework, projections, runs):
    sets = ["--set", f"plan.projections={projections}"]
    result = CliRunner().invoke(app, ["search", "--example", "--framework", framework, *sets])
    assert result.exit_code == 2
    assert f"plan.projections: {framework} runs {runs}, the job sets {projections}" in result.output
