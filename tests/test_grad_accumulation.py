"""Gradient accumulation outside the weight-gradient GEMMs (plan.grad_accumulation), by hand.

Each micro-batch's gradients join the step's in one memory-bound pass over the unit's parameters after its
backward: PyTorch's in-place add (autograd), DeepSpeed's BF16_Optimizer copy to fp32 and add (fp32_copy_add),
FSDP2's mixed-dtype add under pipelining (fp32_add); Megatron's fused accumulation (the default) adds none.
"""

from __future__ import annotations

import itertools

import pytest
from helpers import fast_vs_graph, plan_of

from itercast.config.job import Job
from itercast.costs.analytic import AnalyticCostModel
from itercast.errors import ConfigError
from itercast.memory import estimate_memory
from itercast.search.frameworks import framework
from itercast.workloads import transformer_ops as ops
from itercast.workloads.transformer import Groups, UnitCosts

#: a GPT layer (LayerNorm, biases, MLP of 4h) of hidden 1024 with 8 heads, on 2 tensor-parallel ranks
GPT = {"family": "gpt", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 512}
#: its parameters on one rank, by hand: QKV 3h·h + projection h·h + MLP 2·h·4h + column biases 3h + 4h = 12,590,080
#: split in 2 = 6,295,040; whole on each rank: two LayerNorms 4h = 4,096 and the row biases 2h = 2,048
LAYER_PARAMS = 6_295_040 + 4_096 + 2_048
#: its tensors: 2 norms × (weight, bias), QKV and projection, the MLP's two linears, 4 biases
LAYER_TENSORS = 4 + 2 + 2 + 4


def gpt_job(mode: str, dtype: str = "bf16", **plan: object) -> Job:
    fields = {"tensor_parallel": 2, "global_batch_size": 8, "dtype": dtype, "grad_accumulation": mode, **plan}
    return Job.from_dicts(GPT | {"vocab_size": 4096}, fields, {"preset": "dgx-a100", "num_nodes": 1})


@pytest.mark.parametrize(
    ("mode", "dtype", "bytes_per_param", "kernels_per_tensor"),
    [
        ("fused", "bf16", 0, 0),
        ("autograd", "fp16", 6, 1),  # param.grad += grad: read 2 + 2, write 2
        ("autograd", "fp32", 12, 1),  # the same in fp32
        ("fp32_copy_add", "bf16", 18, 2),  # grad.to(fp32): read 2, write 4; hp += it: read 4 + 4, write 4
        # DeepSpeed v0.12.6: .grad.zero_(): write 2; autograd's .grad += grad: read 2 + 2, write 2; then the 18 above
        ("fp32_copy_add_zeroed", "bf16", 26, 4),
        ("fp32_add", "bf16", 10, 1),  # acc += grad, the dtypes mixed: read 4 + 2, write 4
    ],
)
def test_bytes_and_kernels_per_parameter_by_hand(mode, dtype, bytes_per_param, kernels_per_tensor):
    assert ops.grad_accumulation_cost(gpt_job(mode, dtype).plan) == (bytes_per_param, kernels_per_tensor)


def test_a_layers_backward_ends_with_its_accumulation_by_hand():
    job = gpt_job("fp32_copy_add")
    last = ops.layer_backward(job.model, job.plan)[-1]
    assert last.name == "grad_accumulation" and last.family == "elementwise"
    assert last.amount == 18 * LAYER_PARAMS == 113_421_312
    assert last.count == 2 * LAYER_TENSORS == 24
    fused = gpt_job("fused")
    assert all(op.name != "grad_accumulation" for op in ops.layer_backward(fused.model, fused.plan))


def test_the_pass_pays_one_memory_bound_pass_over_its_parameters():
    """A layer's backward under autograd (fp16) is the fused one plus 6 bytes per parameter priced as one
    elementwise pass, 12 kernels more; the embedding's adds its vocab shard (4096 / 2 × 1024) and the 512 ×
    1024 position table, 2 kernels; the head's its final LayerNorm (weight and bias, 2 × 1024), 2 kernels (its
    output weight is the tied embedding's on this stage)."""
    fused, added = gpt_job("fused", "fp16"), gpt_job("autograd", "fp16")
    costs = AnalyticCostModel(added.system, "fp16")
    a, b = (UnitCosts.of(j, costs, Groups.of(j)) for j in (fused, added))
    layer_s = float(costs.memory_s("elementwise", 6 * LAYER_PARAMS))
    assert b.layer_bwd.compute_s - a.layer_bwd.compute_s == pytest.approx(layer_s, rel=1e-12)
    assert b.layer_bwd.kernels - a.layer_bwd.kernels == 12
    assert b.layer_bwd.family_s["grad_accumulation"] == pytest.approx(layer_s, rel=1e-12)
    embed_s = float(costs.memory_s("elementwise", 6 * (2048 * 1024 + 512 * 1024)))
    assert b.embed_bwd.compute_s - a.embed_bwd.compute_s == pytest.approx(embed_s, rel=1e-12)
    assert b.embed_bwd.kernels - a.embed_bwd.kernels == 2
    head_s = float(costs.memory_s("elementwise", 6 * 2 * 1024))
    assert b.head_bwd.compute_s - a.head_bwd.compute_s == pytest.approx(head_s, rel=1e-12)
    assert b.head_bwd.kernels - a.head_bwd.kernels == 2
    assert b.layer_fwd == a.layer_fwd  # the forward pays nothing


def test_an_moe_layer_accumulates_its_local_experts_too():
    """Mixtral-like: 8 experts of width 1024 on 2 expert-parallel ranks, a SwiGLU expert 3·h·f = 3,145,728
    parameters, 4 local ones; tensors: 2 RMSNorms, QKV and projection, the router and 2 per local expert."""
    model = {
        "family": "llama",
        "num_layers": 2,
        "hidden_size": 1024,
        "num_attention_heads": 8,
        "num_experts": 8,
        "moe_top_k": 2,
        "moe_ffn_hidden_size": 1024,
        "seq_length": 256,
        "vocab_size": 4096,
    }
    plan = {"expert_parallel": 2, "global_batch_size": 8, "grad_accumulation": "fp32_add"}
    job = Job.from_dicts(model, plan, {"preset": "dgx-h100", "num_nodes": 1})
    acc = ops.layer_backward(job.model, job.plan, moe=True)[-1]
    # attention 4h² = 4,194,304, two RMSNorms 2h, the router h·8 = 8,192, four experts 12,582,912
    assert acc.amount == 10 * (4_194_304 + 2_048 + 8_192 + 4 * 3_145_728)
    assert acc.count == 2 + 2 + 1 + 2 * 4


def test_fp32_accumulators_need_16_bit_gradients():
    with pytest.raises(ConfigError, match=r"grad_accumulation.*fp32_copy_add.*dtype fp32"):
        gpt_job("fp32_copy_add", "fp32")


def test_deepspeed_searches_accumulate_through_autograd():
    """DeepSpeed's default grad_accum_dtype is the model's: its FP16 and ZeRO-0/1 optimizers leave param.grad
    to autograd (runtime/engine.py get_data_types, _do_optimizer_sanity_check)."""
    assert framework("deepspeed").plan_fields["grad_accumulation"] == "autograd"
    assert "grad_accumulation" not in framework("megatron-core").plan_fields


def test_fast_path_agrees_with_graph_with_accumulation_passes():
    """DeepSpeed's pipeline (blocking, partitioned sends) under each accumulation, over pp, tp, ZeRO and the
    micro-batch count on 16 A100 (one table per mode: a table's rows share it): both paths read the same unit
    backward. Measured: worst 0.016% (autograd) and 0.021% (fp32_copy_add), as fused (0.012%)."""
    for mode, dtype in (("autograd", "fp16"), ("fp32_copy_add", "bf16")):
        plans = [
            plan_of(tp, pp, 1, "1f1b", zero, micro_batch_size=mbs, global_batch_size=64, pipeline_p2p="deepspeed")
            | {"grad_accumulation": mode, "dtype": dtype}
            for tp, pp, zero, mbs in itertools.product([1, 2], [2, 4], [0, 1], [1, 4])
        ]
        valid, rel = fast_vs_graph("gpt3-1.3b", {"preset": "dgx-a100", "num_nodes": 2}, plans)
        assert len(valid) == 16 and rel.max() < 0.002


def test_fsdp2_under_pipelining_holds_its_fp32_sums_whole():
    """A llama of hidden 1024, 8 heads, MLP 4096 on pp 2 × dp 4 under FSDP (ZeRO-3): stage 0 holds the 4,096 ×
    1,024 word table and 4 layers of 4h² + 3·h·4h + 2h = 16,779,264 parameters, 71,311,360 in all. Its
    gradients: fp32 sharded over 4 ranks (1 byte a parameter) by default; under fp32_add the micro-batches'
    fp32 sums stay whole until the last reduce-scatter (4 bytes a parameter)."""
    model = {"family": "llama", "num_layers": 8, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 256}
    grads = {}
    for mode in ("fused", "fp32_add"):
        plan = {"pipeline_parallel": 2, "zero_stage": 3, "global_batch_size": 16, "grad_accumulation": mode}
        job = Job.from_dicts(model | {"vocab_size": 4096}, plan, {"preset": "dgx-h100", "num_nodes": 1})
        grads[mode] = estimate_memory(job).gradients_bytes
    assert grads == {"fused": 71_311_360, "fp32_add": 4 * 71_311_360}


@pytest.mark.parametrize(
    ("pp", "zero", "dtype", "expected"),
    [
        (2, 3, "bf16", (10, 1)),  # FSDP under pipelining: the mixed fp32 += bf16 add
        (2, 2, "bf16", (10, 1)),
        (1, 3, "bf16", (0, 0)),  # no pipelining: FSDP2 reduce-scatters every micro-batch
        (2, 0, "bf16", (0, 0)),  # no FSDP
        (2, 3, "fp32", (12, 1)),  # fp32 gradients: autograd's fp32 add
    ],
)
def test_torchtitans_fsdp2_accumulates_only_under_pipelining(pp, zero, dtype, expected):
    plan = {"pipeline_parallel": pp, "zero_stage": zero, "tensor_parallel": 1, "dtype": dtype}
    job = Job.from_dicts(GPT | {"vocab_size": 4096}, plan | {"grad_accumulation": "fsdp2"}, {"preset": "dgx-a100"})
    assert ops.grad_accumulation_cost(job.plan) == expected
    assert framework("torchtitan").plan_fields["grad_accumulation"] == "fsdp2"


def test_fsdp2_holds_whole_fp32_sums_only_under_pipelining():
    """The llama of test_fsdp2_under_pipelining_holds_its_fp32_sums_whole under fsdp2: 4 bytes a parameter at
    pp 2, its 71,311,360 stage-0 parameters; at pp 1 on 8 data-parallel ranks the whole model on one stage,
    8 layers, the untied word table and output layer and the final RMSNorm (1,024), 142,623,744 parameters,
    with fp32 gradients sharded 8 ways (half a byte a parameter)."""
    model = {"family": "llama", "num_layers": 8, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 256}
    grads = {}
    for pp in (1, 2):
        plan = {"pipeline_parallel": pp, "zero_stage": 3, "global_batch_size": 16, "grad_accumulation": "fsdp2"}
        job = Job.from_dicts(model | {"vocab_size": 4096}, plan, {"preset": "dgx-h100", "num_nodes": 1})
        grads[pp] = estimate_memory(job).gradients_bytes
    assert grads[2] == 4 * 71_311_360
    assert grads[1] == (8 * 16_779_264 + 2 * 4_194_304 + 1_024) * 4 / 8


def test_fast_path_agrees_with_graph_under_torchtitans_accumulation():
    """fsdp2 over tp, pp (1, 2, 4), ZeRO (0, 2, 3), micro-batch and schedule on 16 H100 in one table: the
    unit costs are keyed by pp and ZeRO too (fast_estimate._unit_key). Measured: worst 1.31% (1.46% with the
    default fused accumulation), mean 0.28%."""
    plans = [
        plan_of(tp, pp, 1, sched, zero, micro_batch_size=mbs, global_batch_size=64, sequence_parallel=tp > 1)
        | {"grad_accumulation": "fsdp2"}
        for tp, pp, zero, mbs, sched in itertools.product(
            [1, 2], [1, 2, 4], [0, 2, 3], [1, 2], ["1f1b", "interleaved-1f1b"]
        )
        if pp > 1 or sched == "1f1b"
    ]
    valid, rel = fast_vs_graph("gpt3-1.3b", {"preset": "dgx-h100", "num_nodes": 2}, plans)
    assert len(valid) == 60 and rel.max() < 0.02 and rel.mean() < 0.005


def test_autograd_keeps_its_gradients_in_the_parameters_dtype():
    """The GPT job above on 8 A100 (tp 2 × dp 4, ZeRO 0): 4 layers of 6,301,184 parameters, the vocab shard
    2,048 × 1,024, the 512 × 1,024 position table and the final LayerNorm's 2 × 1,024, 27,828,224 in all, the
    head tied on this one stage.
    Megatron's fused accumulation keeps fp32 gradients (4 bytes), BF16_Optimizer its fp32 buffer (4) beside the
    bf16 .grad it only zeroes (2), autograd the parameters' own bf16 .grad (2). BF16_Optimizer's buffers are the
    same whatever its reduction sends (DeepSpeed casts them to bf16 for the all-reduce)."""
    modes = ("fused", "fp32_copy_add", "fp32_copy_add_zeroed", "autograd")
    grads = {mode: estimate_memory(gpt_job(mode)).gradients_bytes for mode in modes}
    assert grads == {
        "fused": 4 * 27_828_224,
        "fp32_copy_add": 6 * 27_828_224,
        "fp32_copy_add_zeroed": 6 * 27_828_224,
        "autograd": 2 * 27_828_224,
    }
    bf16_wire = estimate_memory(gpt_job("fp32_copy_add", grad_reduce_dtype="bf16")).gradients_bytes
    assert bf16_wire == 6 * 27_828_224


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_a_dense_layers_tensor_count_is_the_tensors_deepspeed_zero3_lists(family):
    """Two views of one layer's tensors agree: the accumulation's kernel count and the per-tensor sizes DeepSpeed
    v0.3's ZeRO-3 gathers (GPT: 2 LayerNorms × 2, QKV, projection, 2 MLP linears, 4 biases = 12; llama: 2
    RMSNorms, 4 linears = 6)."""
    from itercast.workloads.transformer import unit_tensors

    job = (
        gpt_job("autograd")
        if family == "gpt"
        else Job.from_dicts(
            {"family": "llama", "num_layers": 2, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 256},
            {"global_batch_size": 8},
            {"preset": "dgx-h100"},
        )
    )
    count = {"gpt": 12, "llama": 6}[family]
    assert ops.layer_param_tensors(job.model, job.plan) == len(unit_tensors(job, "layer")) == count


def test_a_deepspeed_pipeline_left_at_fused_says_its_accumulation_is_not_priced():
    from typer.testing import CliRunner

    from itercast.cli import app

    base = ["predict", "--model", "gpt3-1.3b", "--system", "dgx-a100", "--set", "model.num_layers=4"]
    pipeline = [*base, "--set", "plan.pipeline_parallel=2", "--set", "plan.pipeline_p2p=deepspeed"]
    said = CliRunner().invoke(app, pipeline).output
    assert "gradient accumulation is priced at nothing" in said
    for quiet in ([*pipeline, "--set", "plan.grad_accumulation=autograd"], base):
        assert "priced at nothing" not in CliRunner().invoke(app, quiet).output


@pytest.mark.parametrize(
    ("zero", "dtype", "grad_reduce_dtype", "expected"),
    [
        (1, "bf16", "fp32", (0, 0)),  # Megatron's DDP buffer: the weight-gradient GEMMs add into it (fused)
        (0, "bf16", "fp32", (0, 0)),
        (3, "bf16", "fp32", (6, 1)),  # Megatron-FSDP: main_grad.copy_(param.grad), read 2 bf16, write 4 fp32
        (2, "bf16", "bf16", (4, 1)),  # a bf16 bucket: read 2, write 2
        (3, "fp32", "fp32", (8, 1)),  # fp32 training: read 4, write 4
    ],
)
def test_nemo_copies_each_micro_batchs_gradient_into_megatron_fsdps_bucket(zero, dtype, grad_reduce_dtype, expected):
    """NeMo sets gradient_accumulation_fusion False under Megatron-FSDP (megatron_parallel.py), so autograd
    writes param.grad and Megatron-FSDP's post-backward hook copies it into the unsharded bucket
    (megatron_fsdp.py _grad_acc); without Megatron-FSDP NeMo's accumulation is Megatron's fused one."""
    plan = {"zero_stage": zero, "dtype": dtype, "grad_reduce_dtype": grad_reduce_dtype}
    job = gpt_job("megatron_fsdp", **plan)
    assert ops.grad_accumulation_cost(job.plan) == expected
    assert job.plan.accumulates_in_gemm == (zero <= 1)
    assert framework("nemo").plan_fields["grad_accumulation"] == "megatron_fsdp"


def test_fast_path_agrees_with_graph_where_nemo_copies_under_megatron_fsdp_only():
    """One table of NeMo's accumulation over ZeRO 1 and 3 (its rows share the field, their costs differ by
    the ZeRO stage): a ZeRO-3 layer's backward of gpt3-1.3b copies its 12h² + 13h = 50,358,272 parameters
    (h 2,048: QKV, projection and MLP weights, 9 h of biases, two LayerNorms' 4 h) at 6 bytes each, in 12
    kernels, about a tenth of the backward: a fast path that priced every row at one ZeRO stage would be
    far off the graph."""
    plans = [
        plan_of(tp, 1, 1, "1f1b", zero, micro_batch_size=mbs, global_batch_size=64)
        | {"grad_accumulation": "megatron_fsdp"}
        for tp, zero, mbs in itertools.product([1, 2], [1, 3], [1, 4])
    ]
    valid, rel = fast_vs_graph("gpt3-1.3b", {"preset": "dgx-a100", "num_nodes": 2}, plans)
    assert len(valid) == 8 and rel.max() < 0.002
    step = {(j.plan.tensor_parallel, j.plan.zero_stage, j.plan.micro_batch_size): j for j in valid}
    job = step[1, 3, 1]
    copied = [op for op in ops.layer_backward(job.model, job.plan) if op.name == "grad_accumulation"]
    assert [(op.amount, op.count) for op in copied] == [(6 * 50_358_272, 12)]
    assert not [
        op for op in ops.layer_backward(step[1, 1, 1].model, step[1, 1, 1].plan) if op.name == "grad_accumulation"
    ]
