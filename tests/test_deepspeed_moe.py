"""DeepSpeed's MoE layer, plan.moe_token_dispatcher einsum (deepspeed/moe/sharded_moe.py at 38327e0: TopKGate,
MOELayer; mappings.py drop_tokens / gather_tokens; Megatron-DeepSpeed's --moe-train-capacity-factor) and gather
(the same from v0.19.4: _sparse_encode, _sparse_decode), computed by hand (issue 28: each framework's plan space
priced as it runs).

The job: moe-tiny (hidden 256, 8 experts of width 512, gated, top-2) without its shared expert, capacity factor 1.25
padded, micro-batch 2 of 512 tokens, bf16, on one DGX H100: S = 1,024 tokens a micro-batch on every rank and
EC = S·k·cf = 1,024 × 2 × 1.25 = 2,560 slots (every expert's capacity, 320 each); their rows are
2,560 × 256 × 2 = 1,310,720 bytes.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from itercast.cli.app import app
from itercast.config.job import Job, parse_section
from itercast.errors import ConfigError
from itercast.memory import activation_bytes_per_token_layer, deepspeed_expert_bytes, stage_params
from itercast.parallel.plan_table import PlanTable
from itercast.predict import predict
from itercast.search.fast_estimate import FastEstimator
from itercast.search.plan_space import SpaceOptions, enumerate_plans
from itercast.workload import TransformerWorkload
from itercast.workloads.transformer import TransformerStepBuilder, pass_cost, unit_params
from itercast.workloads.transformer_ops import (
    einsum_gating_cost,
    layer_backward,
    layer_forward,
    moe_host_wait,
    priced_notes,
)

MODEL = {"preset": "moe-tiny", "moe_capacity_factor": 1.25, "moe_pad_to_capacity": True}
MODEL["moe_shared_ffn_hidden_size"] = 0  # moe-tiny's shared expert left out
ROWS = 1_310_720  # EC slots × h × 2 bytes


def job(model: dict[str, Any] | None = None, **plan: Any) -> Job:
    fields = {"global_batch_size": 16, "micro_batch_size": 2, "moe_token_dispatcher": "einsum", **plan}
    return Job.from_dicts(model or MODEL, fields, {"preset": "dgx-h100", "num_nodes": 1})


def moe_ops(j: Job) -> list[tuple[str, str, float, str, int]]:
    """(name, family, amount, comm kind, count) of the MoE layer's forward from its router on."""
    fwd = layer_forward(j.model, j.plan, moe=True)
    start = [op.name for op in fwd].index("router")
    return [(op.name, op.family, op.amount, op.comm_kind, op.count) for op in fwd[start:-1]]  # residual_2 after


def test_gating_tensors_bytes_per_element_from_the_source():
    # bf16 (e = 2). top-1: the fp32 product written (4), its bool (read 4, write 1), the mask's cast (read 1, write
    # 2) and the weights' (read 4, write 2): 18 bytes, 4 kernels; backward the weights' gradient cast to fp32 (read 2,
    # write 4) and the gate's gradient summed over the slots (read 4): 10 bytes, 2 kernels
    assert einsum_gating_cost(1, 2) == (18, 4, 10, 2)
    # top-2: two products (8) and their sum (read 8, write 4) before the bool and casts (5 + 3 + 6): 34, 6 kernels;
    # backward 6 + 4 + 4 = 14, 3 kernels
    assert einsum_gating_cost(2, 2) == (34, 6, 14, 3)
    # top-4: one_hot in int64 (8), .float() (read 8, write 4), the product (read 4, write 4), bool and casts (14):
    # 42, 6 kernels; backward 6, the product with the one-hot (read 8, write 4) and its sum (read 4): 22, 3 kernels
    assert einsum_gating_cost(4, 2) == (42, 6, 22, 3)


def test_dispatch_and_combine_are_matmuls_over_the_padded_capacity():
    # EP 2: 4 local experts, each of 640 slots (EC / 4)
    assert moe_ops(job(expert_parallel=2)) == [
        ("router", "gemm", 2 * 1024 * 256 * 8, "", 1),  # 4,194,304
        # fp32 logits read and written thrice (3 × 1,024 × 8 × 4 = 98,304) + the input's cast to fp32 (6 × 1,024 × 256)
        ("router_topk", "elementwise", 98_304 + 1_572_864, "", 1),
        ("moe_gating", "elementwise", 34 * 1024 * 2560, "", 6),  # S × EC elements, top-2
        ("moe_dispatch_einsum", "gemm", 2 * 1024 * 2560 * 256, "", 1),  # 1,342,177,280
        ("moe_dispatch", "ep_comm", ROWS, "alltoall", 1),
        ("moe_sort", "elementwise", 2 * ROWS, "", 1),  # each expert's strided chunk copied by its matmul
        ("expert_up", "gemm", 2 * 640 * 256 * 1024, "", 4),  # gate and up, 2 × 512 wide
        ("expert_act", "activation", 3 * 2560 * 512 * 2, "", 4),
        ("expert_down", "gemm", 2 * 640 * 512 * 256, "", 4),
        ("moe_expert_cat", "elementwise", 2 * ROWS, "", 1),
        ("moe_combine", "ep_comm", ROWS, "alltoall", 1),
        ("moe_combine_einsum", "gemm", 2 * 1024 * 2560 * 256, "", 1),
    ]
    # the dispatch's mask takes no gradient: its backward is one matmul; the combine's two
    names = [op.name for op in layer_backward(job().model, job().plan, moe=True) if "einsum" in op.name]
    assert names == ["moe_combine_einsum.dgrad", "moe_combine_einsum.wgrad", "moe_dispatch_einsum.dgrad"]
    # without expert parallelism each expert's chunk is contiguous: no forward copy, the chunks' cat backward
    sort = next(op for op in layer_forward(job().model, job().plan, moe=True) if op.name == "moe_sort")
    assert (sort.amount, sort.count, sort.backward_amount, sort.backward_count) == (0, 0, 2 * ROWS, 1)


def test_the_capacity_rounds_up_to_at_least_megatron_deepspeeds_minimum():
    """sharded_moe.py _capacity: ceil(S / E × k·cf) in float32, at least --moe-min-capacity (4). Capacity factor 1.1,
    top-2: 1,024 / 8 × 2.2 = 281.6 → 282 slots an expert, EC = 2,256; 8 tokens: 8 / 8 × 2.2 = 2.2 → 3 → 4, EC = 32."""
    cf = {**MODEL, "moe_capacity_factor": 1.1}
    for model, tokens, slots in ((cf, 1024, 2256), ({**cf, "seq_length": 4}, 8, 32)):
        ops = {name: amount for name, _, amount, _, _ in moe_ops(job(model))}
        assert ops["moe_dispatch_einsum"] == 2 * tokens * slots * 256
        assert ops["expert_up"] == 2 * slots * 256 * 1024 / 8
    # memory per token at TP 1: 2,256 / 1,024 slots a token, each keeping its fc1 input (512), fc1 outputs and
    # activation output (3,072) and the combine's gathered output (512); the einsums' operands 4 bytes × 2,256;
    # the router's 8 fp32 scores
    j = job(cf)
    kept = deepspeed_expert_bytes(j.model, PlanTable.of_jobs([j]), expert_in=2, clamped=0)
    assert kept[0] == pytest.approx(2256 / 1024 * (512 + 3072 + 512) + 4 * 2256 + 32)


def test_a_capacity_the_tensor_parallel_ranks_do_not_divide_is_refused():
    # drop_tokens asserts the tensor-parallel size divides every expert's capacity: 282 slots split over 2, not 4
    cf = {**MODEL, "moe_capacity_factor": 1.1}
    assert job(cf, tensor_parallel=2, expert_parallel=2, sequence_parallel=False).plan.etp == 1
    with pytest.raises(ConfigError) as err:
        job(cf, tensor_parallel=4, expert_parallel=2, sequence_parallel=False)
    assert (
        "expected a capacity divisible by tensor_parallel(4); got 282 slots (micro_batch_size 2 × seq_length 512 "
        "tokens / 8 experts × top-2 × capacity factor 1.1, rounded up)"
    ) in str(err.value)
    # the search leaves those plans out: micro-batch 1 (ceil(64 × 2.2) = 141 slots) runs at TP 1 only, 2 (282) at
    # TP 1-2, 4 (ceil(256 × 2.2) = 564) at TP 1, 2 and 4
    system = parse_section("system", {"preset": "dgx-h100", "num_nodes": 1})
    base = parse_section("plan", {"global_batch_size": 32, "moe_token_dispatcher": "einsum"})
    options = SpaceOptions(micro_batch_sizes=(1, 2, 4), max_context_parallel=1, framework="deepspeed")
    table, _ = enumerate_plans(parse_section("model", cf), system, base, 8, options)  # type: ignore[arg-type]
    seen = {(int(m), int(t)) for m, t in zip(table.cols["mbs"], table.cols["tp"], strict=True)}
    assert seen == {(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4)}


def test_tensor_parallel_ranks_drop_and_gather_the_capacity():
    # TP 2 = expert TP, EP 2, no sequence parallelism: every TP rank routes the whole micro-batch (the same 2,560
    # slots), sends half of each expert's slots (655,360 bytes) and gathers the other half after each all-to-all;
    # the experts split over TP: half the GEMM FLOPs, their output all-reduced (one all-reduce for all 4 experts)
    j = job(tensor_parallel=2, expert_tensor_parallel=2, expert_parallel=2, sequence_parallel=False)
    ops = {name: (family, amount, kind, count) for name, family, amount, kind, count in moe_ops(j)}
    assert ops["moe_dispatch_einsum"] == ("gemm", 2 * 1024 * 2560 * 256, "", 1)
    assert ops["moe_dispatch.drop"] == ("elementwise", ROWS, "", 1)  # the all-to-all's copy of the half kept
    assert ops["moe_dispatch.drop_gather"] == ("ep_comm", ROWS, "", 1)  # a view forward
    assert ops["moe_dispatch"] == ops["moe_combine"] == ("ep_comm", ROWS / 2, "alltoall", 1)
    assert ops["moe_dispatch.gather"] == ops["moe_combine.gather"] == ("ep_comm", ROWS, "all_gather", 1)
    assert ops["moe_dispatch.gather_cat"] == ("elementwise", 2 * ROWS, "", 1)
    assert ops["expert_up"] == ("gemm", 2 * 640 * 256 * 512, "", 4)
    assert ops["expert_out.all_reduce"] == ("tp_comm", ROWS, "all_reduce", 1)
    # backward: a drop is a gather (all-gather and cat), a gather a drop; each all-to-all back; the experts' input
    # gradient all-reduced beside their weight gradient
    bwd = [
        (op.name, op.comm_kind, op.amount, op.group)
        for op in layer_backward(j.model, j.plan, moe=True)
        if op.family == "ep_comm" or op.name.startswith("expert_up.dgrad_")
    ]
    assert bwd == [
        ("moe_combine.bwd", "alltoall", ROWS / 2, "ep"),
        ("moe_experts.drop_gather.bwd", "all_gather", ROWS, "tp"),
        ("expert_up.dgrad_all_reduce", "all_reduce", ROWS, "tp"),
        ("moe_dispatch.bwd", "alltoall", ROWS / 2, "ep"),
        ("moe_dispatch.drop_gather.bwd", "all_gather", ROWS, "tp"),
    ]
    cats = {op.name: op.amount for op in layer_backward(j.model, j.plan, moe=True) if "drop.bwd" in op.name}
    assert cats == {"moe_experts.drop.bwd": 2 * ROWS, "moe_dispatch.drop.bwd": 2 * ROWS}


def test_whole_experts_beside_tensor_parallelism_run_their_ranks_share_of_the_capacity():
    # DeepSpeed's default with TP 2 (expert_tensor_parallel unset: 1, --enable-expert-tensor-parallelism off), EP 2:
    # each TP rank keeps half of every expert's slots (1,280 of 2,560) and sends them (655,360 bytes) to the expert
    # group; its 4 local experts, whole, run 320 rows each: gate and up 2 × 320 × 256 × 1,024 FLOPs, down
    # 2 × 320 × 512 × 256; the strided chunks' copy reads and writes the 1,280 rows (2 × 655,360 bytes); no
    # all-reduce around the experts; the combine's half gathered back over TP after its all-to-all
    j = job(tensor_parallel=2, expert_parallel=2, sequence_parallel=False)
    assert j.plan.etp == 1
    ops = {name: (family, amount, kind, count) for name, family, amount, kind, count in moe_ops(j)}
    assert ops["moe_dispatch.drop"] == ("elementwise", ROWS, "", 1)
    assert ops["moe_dispatch"] == ops["moe_combine"] == ("ep_comm", ROWS / 2, "alltoall", 1)
    assert ops["moe_sort"] == ("elementwise", ROWS, "", 1)
    assert ops["expert_up"] == ("gemm", 2 * 320 * 256 * 1024, "", 4)
    assert ops["expert_act"] == ("activation", 3 * 1280 * 512 * 2, "", 4)
    assert ops["expert_down"] == ("gemm", 2 * 320 * 512 * 256, "", 4)
    assert ops["moe_combine.gather"] == ("ep_comm", ROWS, "all_gather", 1)
    for absent in ("moe_dispatch.gather", "expert_out.all_reduce", "moe_experts.drop"):
        assert absent not in ops
    bwd = [(op.name, op.comm_kind, op.amount) for op in layer_backward(j.model, j.plan, moe=True) if op.comm_kind]
    assert [b for b in bwd if "moe" in b[0] or "expert" in b[0]] == [
        ("moe_combine.bwd", "alltoall", ROWS / 2),
        ("moe_dispatch.bwd", "alltoall", ROWS / 2),
        ("moe_dispatch.drop_gather.bwd", "all_gather", ROWS),
    ]
    # split experts need no expert parallelism: DeepSpeed gathers over the expert-tensor ranks
    # (_get_expert_model_parallel_world_size) whatever the expert group
    split = job(tensor_parallel=2, expert_tensor_parallel=2, sequence_parallel=False)
    names = [name for name, *_ in moe_ops(split)]
    assert {"moe_dispatch.drop", "moe_dispatch.gather", "expert_out.all_reduce", "moe_experts.drop"} <= set(names)


def test_a_drop_moves_nothing_forward_and_gathers_backward():
    j = job(tensor_parallel=2, expert_tensor_parallel=2, expert_parallel=2, sequence_parallel=False)
    b = TransformerStepBuilder(j)
    fwd = [op for op in layer_forward(j.model, j.plan, moe=True) if op.name == "moe_dispatch.drop_gather"]
    bwd = [op for op in layer_backward(j.model, j.plan, moe=True) if op.name == "moe_dispatch.drop_gather.bwd"]
    assert pass_cost(fwd, b.costs, b.groups).comm_s == 0.0
    gathered = b.costs.collective_s("all_gather", ROWS, b.groups.tp)
    assert gathered > 0 and pass_cost(bwd, b.costs, b.groups).comm_s == gathered


def test_no_host_wait_and_no_counts_exchanged():
    j = job(expert_parallel=2)
    assert moe_host_wait(j.model, j.plan) is None
    assert not [op for op in layer_forward(j.model, j.plan, moe=True) if "counts" in op.name or "probs" in op.name]


def test_activation_memory_keeps_the_masks_and_the_gathered_outputs():
    """Per token of an MoE layer, against Megatron-Core's alltoall dispatcher on the same padded job (hidden 256,
    expert width 512, k·cf = 2.5 slots a token, bf16, TP 1): the einsum layer keeps its router's fp32 input (4h)
    where the alltoall one keeps the 16-bit (2h): +512; per slot its experts keep as Megatron-Core's do but no fp32
    routing probability (−4 × 2.5 = −10); the combine keeps the experts' output, 2h a slot (+512 × 2.5 = +1,280),
    and both einsums their S × EC operand in bf16, 2 × 2 bytes × S·k·cf = 4 × 1,024 × 2.5 = +10,240 a token."""
    einsum = activation_bytes_per_token_layer(job(), moe=True)
    alltoall = activation_bytes_per_token_layer(job(moe_token_dispatcher="alltoall"), moe=True)
    assert einsum - alltoall == pytest.approx(512 - 10 + 1280 + 10240)
    # the gating tensors grow with the micro-batch: twice the tokens, twice the 10,240 a token
    longer = activation_bytes_per_token_layer(job(micro_batch_size=4, global_batch_size=32), moe=True)
    assert longer - einsum == pytest.approx(10240)


def test_a_shared_expert_is_pr_moes_residual_mlp_mixed_in_by_a_coefficient():
    """moe-tiny's expert width, 512, as the residual MLP (deepspeed/moe/layer.py use_residual), TP 1: after the
    combine, the MLP (gate and up 2 × 1,024 × 256 × 1,024 FLOPs, SwiGLU 3 × 1,024 × 512 × 2 bytes, down
    2 × 1,024 × 512 × 256), the coefficient's Linear(256, 2), 2 × 1,024 × 256 × 2 FLOPs, and the mix: two products
    and their sum over 1,024 × 256 bf16 elements, 7 × 524,288 bytes, and the softmax's 2 reads and 2 writes of
    2 bytes a token, 4 × 1,024 × 2 (4 kernels); backward 12 × 524,288 + 4 × 1,024 × 2 in 7 kernels."""
    j = job({**MODEL, "moe_shared_ffn_hidden_size": 512})
    fwd = layer_forward(j.model, j.plan, moe=True)
    after = fwd[[op.name for op in fwd].index("moe_combine_einsum") + 1 : -1]
    got = [(op.name, op.amount, op.count, op.backward_amount, op.backward_count) for op in after]
    assert got == [
        ("shared_up", 2 * 1024 * 256 * 1024, 1, -1, 0),
        ("shared_act", 3 * 1024 * 512 * 2, 1, -1, 0),
        ("shared_down", 2 * 1024 * 512 * 256, 1, -1, 0),
        ("residual_coef", 2 * 1024 * 256 * 2, 1, -1, 0),
        ("residual_mix", 7 * 524_288 + 4 * 1024 * 2, 4, 12 * 524_288 + 4 * 1024 * 2, 7),
    ]
    # memory per token: the MLP's fc1 outputs and activation output ((2 × 2 + 2) × 512 = 3,072), its (and the
    # coefficient's) 16-bit input (2 × 256 = 512), and the experts' and the MLP's outputs kept by the mix (1,024)
    pr_moe = activation_bytes_per_token_layer(j, moe=True)
    assert pr_moe - activation_bytes_per_token_layer(job(), moe=True) == pytest.approx(3072 + 512 + 1024)


def test_beside_whole_experts_pr_moes_residual_mlp_runs_whole_on_every_tensor_parallel_rank():
    """The residual MLP is the expert module (deepspeed/moe/layer.py `self.mlp = expert`), which Megatron-DeepSpeed
    slices only with --enable-expert-tensor-parallelism. TP 2 beside whole experts (EP 2): every TP rank runs the
    whole MLP on the whole micro-batch, the same ops as at TP 1 (gate and up 2 × 1,024 × 256 × 1,024 FLOPs, SwiGLU
    3 × 1,024 × 512 × 2 bytes, down 2 × 1,024 × 512 × 256) without f or g; it holds its 3 × 256 × 512 = 393,216
    weights whole, 196,608 more than a split half; and per token keeps its fc1 outputs and activation output
    whole ((2 × 2 + 2) × 512 = 3,072), its input (512) and the mix's two outputs (1,024), as at TP 1."""
    pr_moe = {**MODEL, "moe_shared_ffn_hidden_size": 512}
    plan = {"tensor_parallel": 2, "expert_parallel": 2, "sequence_parallel": False}
    whole, split = job(pr_moe, **plan), job(pr_moe, **plan, expert_tensor_parallel=2)
    assert whole.plan.whole_residual_mlp and not split.plan.whole_residual_mlp
    fwd = layer_forward(whole.model, whole.plan, moe=True)
    shared = [(op.name, op.amount) for op in fwd if op.name.startswith("shared")]
    assert shared == [
        ("shared_up", 2 * 1024 * 256 * 1024),
        ("shared_act", 3 * 1024 * 512 * 2),
        ("shared_down", 2 * 1024 * 512 * 256),
    ]
    halves = [(op.name, op.amount) for op in layer_forward(split.model, split.plan, moe=True) if "shared" in op.name]
    assert halves[:2] == [("shared_up", 2 * 1024 * 256 * 512), ("shared_act", 3 * 1024 * 256 * 2)]
    assert ("shared_out.all_reduce", 524_288) in halves
    m = whole.model
    assert m.layer_params_per_rank(2, moe=True, whole_mlp=True) - m.layer_params_per_rank(2, moe=True) == 196_608
    # the one stage holds moe-tiny's 3 MoE layers (the first is dense): 3 × 196,608 more, in memory and gradients
    assert stage_params(whole, 0)[1] - stage_params(split, 0)[1] == 3 * 196_608
    assert unit_params(whole)["moe"][1] - unit_params(split)["moe"][1] == 196_608
    # autograd's accumulation (param.grad += grad: read 2 and write 1 bf16 value a parameter) runs over the 4 local
    # experts' 4 × 393,216 weights, halves of them split, and the MLP: 6 × (786,432 + 196,608) bytes more whole
    accumulated = [
        sum(op.amount for op in layer_backward(j.model, j.plan, moe=True) if op.name == "grad_accumulation")
        for j in (job(pr_moe, **plan, grad_accumulation="autograd", expert_tensor_parallel=etp) for etp in (1, 2))
    ]
    assert accumulated[0] - accumulated[1] == 6 * (786_432 + 196_608)
    kept = activation_bytes_per_token_layer(whole, moe=True)
    alone = job(tensor_parallel=2, expert_parallel=2, sequence_parallel=False)
    assert kept - activation_bytes_per_token_layer(alone, moe=True) == pytest.approx(3072 + 512 + 1024)


def test_experts_split_over_tensor_parallel_ranks_keep_their_share_of_the_width():
    # per token, 2.5 slots each keeping its fc1 input (2 × 256), fc1 outputs and activation output over the width
    # (2 × 2 + 2 = 6 bytes × 512 / tp) and the experts' gathered output (2 × 256); the two einsums' S × EC operands
    # (4 bytes × 1,024 × 2.5 = 10,240), whatever tp; the router's 8 fp32 scores (32)
    for tp, width in ((1, 6 * 512), (2, 6 * 512 / 2)):
        plan = {"tensor_parallel": tp, "expert_tensor_parallel": tp, "expert_parallel": 2, "sequence_parallel": False}
        j = job(**plan)
        kept = deepspeed_expert_bytes(j.model, PlanTable.of_jobs([j]), expert_in=2, clamped=0)
        assert kept[0] == pytest.approx(2.5 * (512 + width + 512) + 10240 + 32)
    # whole experts beside TP 2: half the slots, 1.25 a token, each over the whole width; the gathered output and
    # the einsums' operands as before
    j = job(tensor_parallel=2, expert_tensor_parallel=1, expert_parallel=2, sequence_parallel=False)
    kept = deepspeed_expert_bytes(j.model, PlanTable.of_jobs([j]), expert_in=2, clamped=0)
    assert kept[0] == pytest.approx(1.25 * (512 + 6 * 512) + 2.5 * 512 + 10240 + 32)


@pytest.mark.parametrize(
    ("model", "plan", "message"),
    [
        (
            {**MODEL, "moe_pad_to_capacity": False},
            {},
            "plan.moe_token_dispatcher(einsum) pads every expert to its capacity (DeepSpeed's drop_tokens, "
            "Megatron-DeepSpeed --moe-train-capacity-factor): expected model.moe_pad_to_capacity true with "
            "model.moe_capacity_factor 1.25, or no capacity factor (its dropless gating); got false",
        ),
        (
            MODEL,
            {"tensor_parallel": 2, "expert_tensor_parallel": 2, "expert_parallel": 2, "sequence_parallel": True},
            "expected sequence_parallel false; got true",
        ),
        (
            MODEL,
            {"tensor_parallel": 4, "expert_tensor_parallel": 2, "expert_parallel": 2, "sequence_parallel": False},
            "plan.moe_token_dispatcher(einsum): Megatron-DeepSpeed runs whole experts or splits them over all "
            "tensor-parallel ranks (--enable-expert-tensor-parallelism; megatron/core/tensor_parallel/layers.py): "
            "expected expert_tensor_parallel 1 or tensor_parallel(4); got 2",
        ),
        (MODEL, {"moe_grouped_gemm": True}, "plan.moe_grouped_gemm: DeepSpeed's MOELayer (moe_token_dispatcher"),
        (MODEL, {"dtype": "fp8"}, "expected dtype bf16, fp16 or fp32; got fp8"),
        (MODEL, {"context_parallel": 2}, "expected context_parallel 1; got 2"),
        (MODEL, {"zero_stage": 3}, "'Native DeepSpeed MoE is not supported with ZeRO Stage 3'): expected zero_stage 0"),
        (
            {**MODEL, "moe_shared_ffn_hidden_size": 256},
            {},
            "model.moe_shared_ffn_hidden_size: DeepSpeed runs a shared expert only as PR-MoE's residual MLP, a copy "
            "of a routed expert (deepspeed/moe/layer.py MoE use_residual: expected 0 or 512); moe-tiny sets 256",
        ),
        (
            {"preset": "llama3-8b", "num_layers": 2},
            {},
            "plan.moe_token_dispatcher(einsum) needs a mixture-of-experts model (model.num_experts)",
        ),
    ],
)
def test_what_deepspeed_does_not_run_or_itercast_does_not_price_is_refused(model, plan, message):
    with pytest.raises(ConfigError) as err:
        job(model, **plan)
    assert message in str(err.value)


def test_shared_expert_overlap_is_refused_under_deepspeeds_layer():
    with pytest.raises(ConfigError) as err:
        job({**MODEL, "moe_shared_ffn_hidden_size": 512}, moe_shared_expert_overlap=True)
    assert "expected moe_a2a_overlap false and the alltoall or flex dispatcher; got moe_token_dispatcher einsum" in str(
        err.value
    )


def test_search_deepspeed_prices_its_einsum_layer_and_launches_its_capacity():
    args = ["search", "--model", "moe-tiny", "--system", "dgx-h100", "--num-nodes-range", "1", "--framework"]
    args += ["deepspeed", "--set", "plan.global_batch_size=64", "--top", "3", "--workers", "1", "--json"]
    args += ["--set", "model.moe_shared_ffn_hidden_size=0"]  # moe-tiny's 256-wide shared expert: no PR-MoE copy
    unpadded = CliRunner().invoke(app, [*args, "--set", "model.moe_capacity_factor=1.25"])
    assert unpadded.exit_code == 2 and len(unpadded.output.strip().splitlines()) == 1
    assert "model.moe_pad_to_capacity: deepspeed pads every expert to its capacity" in unpadded.output
    padded = ["--set", "model.moe_capacity_factor=1.25", "--set", "model.moe_pad_to_capacity=true"]
    for extra, flag in ((padded, "--moe-train-capacity-factor 1.25"), ([], "--disable-moe-token-dropping")):
        result = CliRunner().invoke(app, [*args, *extra])
        assert result.exit_code == 0, result.output
        plans = json.loads(result.stdout)["plans"]
        assert plans and all(p["plan"]["moe_token_dispatcher"] == "einsum" for p in plans)
        assert all(not p["plan"]["sequence_parallel"] for p in plans)
        for launched in ("--num-experts 8", "--topk 2", flag):
            assert f"  {launched} \\" in plans[0]["launch"]


def test_dropless_gating_pads_to_the_busiest_expert_all_reduced_and_read_by_the_host():
    """No capacity factor (--disable-moe-token-dropping): every expert padded to the busiest one's count, here
    moe_token_imbalance 1.5 times an even share: EC = 1,024 × 2 × 1.5 = 3,072 slots; its count all-reduced (max) as
    one int64 over the expert-parallel ranks after the gate, which the host then waits for (with EP 1, nothing to
    exchange: it waits for the gate)."""
    dropless = {"preset": "moe-tiny", "moe_shared_ffn_hidden_size": 0, "moe_token_imbalance": 1.5}
    j = job(dropless, expert_parallel=2)
    ops = moe_ops(j)
    assert ops[2] == ("moe_capacity", "ep_comm", 8, "all_reduce", 1)
    assert ("moe_dispatch_einsum", "gemm", 2 * 1024 * 3072 * 256, "", 1) in ops
    assert moe_host_wait(j.model, j.plan) == ("moe_capacity", "moe_capacity")
    single = job(dropless)
    assert "moe_capacity" not in [op[0] for op in moe_ops(single)]
    assert moe_host_wait(single.model, single.plan) == ("router_topk", "router_topk")
    # one wait in each of moe-tiny's 3 MoE layers' forward, one micro-batch (16 / (2 × 8)); none padded to a capacity
    for model, waits in ((dropless, 3), (MODEL, 0)):
        g = TransformerStepBuilder(job(model, expert_parallel=2)).build()
        assert sum(g.names[g.name[t]] == "moe_host_wait" for t in range(g.num_tasks)) == waits


def test_dropless_capacity_is_whole_tokens_rounded_to_the_tensor_parallel_size_beside_whole_experts():
    """sharded_moe.py's dropless gating at 38327e0: the busiest expert's count (here 1,024 tokens × 2 / 8 experts ×
    1.3 = 332.8, so 333 tokens), rounded up to a multiple of tp = 4 beside whole experts (the expert-tensor size 1:
    `torch.ceil(new_capacity / tp).mul(tp)`), 336 slots an expert, EC = 2,688; split experts (expert-tensor size 4)
    keep 333, EC = 2,664. Whole experts run EC / tp = 672 rows a rank, split ones all 2,664."""
    dropless = {"preset": "moe-tiny", "moe_shared_ffn_hidden_size": 0, "moe_token_imbalance": 1.3}
    plan = {"tensor_parallel": 4, "expert_parallel": 2, "sequence_parallel": False}
    for etp, slots, rows in ((1, 2688, 672), (4, 2664, 2664)):
        j = job(dropless, **plan, expert_tensor_parallel=etp)
        ops = {op[0]: op for op in moe_ops(j)}
        assert ops["moe_dispatch_einsum"][2] == 2 * 1024 * slots * 256
        assert ops["expert_down"][2] == pytest.approx(2 * rows * j.model.expert_ffn / etp * 256 / 4)
    assert j.model.deepspeed_capacity(1024) == 333 and j.model.deepspeed_capacity(1024, 4) == 336
    # memory per token, whole experts: 2,688 / 1,024 slots a token, a quarter of them run here, each keeping its fc1
    # input (512) and fc1 outputs and activation output (3,072); all keep the gathered output (512); the einsums'
    # operands (4 × 2,688) and the router's 8 fp32 scores (32)
    j = job(dropless, **plan, expert_tensor_parallel=1)
    kept = deepspeed_expert_bytes(j.model, PlanTable.of_jobs([j]), expert_in=2, clamped=0)
    assert kept[0] == pytest.approx(2688 / 1024 / 4 * (512 + 3072) + 2688 / 1024 * 512 + 4 * 2688 + 32)


def test_the_headline_names_deepspeeds_layer():
    headline = TransformerWorkload(job(expert_parallel=2)).headline()
    assert "experts ep 2 × etp 1 in DeepSpeed's einsum MoE layer," in headline


def test_the_dense_dispatch_reports_under_its_own_family():
    # the gating tensors and both einsums, forward and backward, under moe_einsum; none under Megatron-Core's layer
    ops = [op for op in layer_forward(job().model, job().plan, moe=True) if op.label == "moe_einsum"]
    assert [op.name for op in ops] == ["moe_gating", "moe_dispatch_einsum", "moe_combine_einsum"]
    assert predict(job(expert_parallel=2)).family_time_s["moe_einsum"] > 0
    assert "moe_einsum" not in predict(job(expert_parallel=2, moe_token_dispatcher="alltoall")).family_time_s


def test_from_v0_19_4_the_dispatch_and_combine_are_index_gathers():
    """EP 2 as above. Dispatch: the input with a zero row (read and write 1,024 rows) and index_select of the 2,560
    slots' rows (read and write), 2 × (1,024 + 2,560) × 256 × 2 bytes in 6 kernels; backward, zero-filled 1,024 rows
    and index_add of the 2,560: (2,560 + 2 × 1,024) × 512 in 2. Combine, a unit of h: the expert output with a zero
    row (2 × 2,560 × 2), each token's 2 rows gathered (2 × 2,048 × 2), weighted in fp32 (read 2, write 4 × 2,048),
    summed over the 2 (read 4 × 2,048, write 4 × 1,024) and cast back (read 4, write 2 × 1,024):
    10,240 + 8,192 + 12,288 + 8,192 + 4,096 + 6,144 = 49,152 × 256 in 6 kernels; backward the cast's (6 × 1,024),
    the rows' gradient (read 4, write 4, cast: read 4, write 2 × 2,048 = 28,672), the weights' (read 4 and 2,
    write 4, sum: read 4 × 2,048 = 28,672) and index_add into the slots ((2,048 + 2 × 2,560) × 2 = 14,336):
    77,824 × 256 in 7."""
    j = job(expert_parallel=2, moe_token_dispatcher="gather")
    ops = {op.name: op for op in layer_forward(j.model, j.plan, moe=True)}
    assert "moe_gating" not in ops and "moe_dispatch_einsum" not in ops
    got = {
        name: (ops[name].amount, ops[name].count, ops[name].backward_amount, ops[name].backward_count, ops[name].label)
        for name in ("moe_dispatch_gather", "moe_combine_gather")
    }
    assert got == {
        "moe_dispatch_gather": (2 * (1024 + 2560) * 256 * 2, 6, (2560 + 2 * 1024) * 512, 2, "moe_gather"),
        "moe_combine_gather": (49_152 * 256, 6, 77_824 * 256, 7, "moe_gather"),
    }
    # the experts and the all-to-alls as the einsum layer's
    einsum = {op.name: op.amount for op in layer_forward(job(expert_parallel=2).model, job(expert_parallel=2).plan)}
    assert all(
        ops[name].amount == einsum[name] for name in ("moe_dispatch", "expert_up", "moe_combine") if name in einsum
    )
    # memory per token: the combine keeps each route's row and fp32 weight, 2 × (2 × 256 + 4) = 1,032, where the
    # einsum layer keeps the experts' output (2.5 × 512 = 1,280) and its S × EC operands (10,240)
    gathered = activation_bytes_per_token_layer(j, moe=True)
    assert activation_bytes_per_token_layer(job(expert_parallel=2), moe=True) - gathered == pytest.approx(
        1280 + 10240 - 1032
    )


def test_deepspeed_launches_name_the_release_whose_dispatch_was_priced():
    args = ["search", "--model", "moe-tiny", "--system", "dgx-h100", "--num-nodes-range", "1", "--framework"]
    args += ["deepspeed", "--set", "plan.global_batch_size=64", "--top", "1", "--workers", "1", "--json"]
    args += ["--set", "model.moe_shared_ffn_hidden_size=0", "--set", "model.moe_capacity_factor=1.0"]
    args += ["--set", "model.moe_pad_to_capacity=true"]
    for dispatcher, release in (("einsum", "deepspeed<0.19.4"), ("gather", "deepspeed>=0.19.4")):
        result = CliRunner().invoke(app, [*args, "--set", f"plan.moe_token_dispatcher={dispatcher}"])
        assert result.exit_code == 0, result.output
        plan = json.loads(result.stdout)["plans"][0]
        assert plan["plan"]["moe_token_dispatcher"] == dispatcher
        line = f"# MoE layers priced as DeepSpeed's {dispatcher} dispatch: pip install '{release}'"
        assert plan["launch"].splitlines()[0] == line


def _fast_vs_graph(model: dict[str, Any], dispatcher: str) -> float:
    """Worst |fast path / graph − 1| on one H100 node over EP 1-4, TP 1-2, PP 1-2, full recompute or none; with TP 2
    whole experts at EP 1 and 4, split ones at EP 2."""
    fe = FastEstimator(model, {"preset": "dgx-h100", "num_nodes": 1})
    plans = [
        {"tensor_parallel": tp, "expert_tensor_parallel": tp if ep == 2 else 1, "expert_parallel": ep}
        | {"pipeline_parallel": pp, "data_parallel": 8 // pp // tp, "recompute": rc, "global_batch_size": 32 // pp}
        | {"moe_token_dispatcher": dispatcher, "sequence_parallel": False}
        for ep, rc, pp, tp in itertools.product((1, 2, 4), ("none", "full"), (1, 2), (1, 2))
    ]
    jobs, errors = fe.jobs(plans)
    assert not any(errors) and len(jobs) == 24
    valid = [j for j in jobs if j is not None]
    exact = np.array([predict(j).step_time_s for j in valid])
    return float(np.abs(fe.step_time_s(valid) / exact - 1).max())


@pytest.mark.parametrize("dispatcher", ["einsum", "gather"])
def test_the_fast_path_prices_deepspeeds_layer_as_the_graph_does(dispatcher: str):
    # GPU-bound layers (hidden 1,024, 4,096 tokens, a PR-MoE residual MLP), padded or dropless: within 1% of the
    # graph (measured worst 0.54% einsum, 0.67% gather, either way)
    mid = {"preset": "moe-tiny", "hidden_size": 1024, "ffn_hidden_size": 2048, "moe_shared_ffn_hidden_size": 2048}
    mid |= {"num_attention_heads": 8, "seq_length": 4096}
    assert _fast_vs_graph(mid, dispatcher) < 0.01
    assert _fast_vs_graph(mid | {"moe_capacity_factor": 1.0, "moe_pad_to_capacity": True}, dispatcher) < 0.01
    # moe-tiny's host-bound layers, dropless, with the host's wait in every MoE forward: measured worst 5.0% (einsum)
    # and 5.1% (gather), as Megatron-Core's waits (tests/test_moe_host_sync.py)
    assert _fast_vs_graph({"preset": "moe-tiny", "moe_shared_ffn_hidden_size": 512}, dispatcher) < 0.06


def test_predict_says_what_deepspeeds_layer_leaves_unpriced():
    said = "plan.moe_token_dispatcher einsum (DeepSpeed's MOELayer, before v0.19.4): the gate's int64 slot map"
    assert said in "\n".join(priced_notes(job().model, job().plan, job().system))
    gather = job(moe_token_dispatcher="gather")
    assert "(DeepSpeed's MOELayer, from v0.19.4)" in "\n".join(priced_notes(gather.model, gather.plan, gather.system))
    megatron = job(moe_token_dispatcher="alltoall")
    assert "MOELayer" not in "\n".join(priced_notes(megatron.model, megatron.plan, megatron.system))
