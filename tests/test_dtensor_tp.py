"""torchtitan's DTensor tensor parallelism (plan.tp_layout dtensor): each sequence-parallel collective on dim 1
copies its tensor once more (PyTorch's functional collectives gather and scatter on dim 0: a chunk and a cat),
its backward collectives run beside nothing, and the input is re-gathered only where selective recompute runs
the all-gather again. Expected values worked out by hand."""

from __future__ import annotations

import pytest

from itercast.config.job import Job
from itercast.workloads.transformer_ops import backward_of, layer_backward, layer_forward

# llama: h 64, 4 heads of 16, SwiGLU of 128; micro-batch 2 × 32 tokens = 64 tokens, tp 2 with sequence parallelism
MODEL = {"family": "llama", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 128}
MODEL |= {"seq_length": 32, "vocab_size": 128}


def job(**plan: object) -> Job:
    system = {"preset": "dgx-h100", "num_nodes": 1, "node": {"gpus_per_node": 2}}
    base = {"tensor_parallel": 2, "sequence_parallel": True, "micro_batch_size": 2, "tp_layout": "dtensor"}
    return Job.from_dicts(MODEL, base | plan, system)


def test_every_sequence_parallel_collective_copies_the_whole_tensor_once_more():
    # the gathered activation: 64 tokens × 64 × 2 B = 8,192 B; its chunk and cat read and write it: 16,384 B,
    # forward and (for the collective its backward runs) backward
    j = job()
    ops = {o.name: o for o in layer_forward(j.model, j.plan)}
    copies = {n: (o.amount, o.backward_amount) for n, o in ops.items() if n.endswith((".cat", ".chunk_cat"))}
    assert copies == {
        "attn_in.cat": (16384, 16384),
        "attn_out.chunk_cat": (16384, 16384),
        "mlp_in.cat": (16384, 16384),
        "mlp_out.chunk_cat": (16384, 16384),
    }
    names = list(ops)
    assert names.index("attn_in.all_gather") + 1 == names.index("attn_in.cat")
    assert names.index("attn_out.chunk_cat") + 1 == names.index("attn_out.reduce_scatter")
    # one sequence a micro-batch: the collectives' dim-1 tensors are views, no copy
    one = job(micro_batch_size=1)
    assert not [o for o in layer_forward(one.model, one.plan) if o.name.endswith("cat")]


@pytest.mark.parametrize(("recompute", "regathers"), [("none", 0), ("full", 0), ("selective", 2)])
def test_backward_collectives_run_beside_nothing_and_regather_only_under_selective_recompute(recompute, regathers):
    plan = {"recompute": recompute} | ({"selective_recompute": "op"} if recompute == "selective" else {})
    j = job(**plan)
    back = layer_backward(j.model, j.plan)
    tp = [o for o in back if o.family == "tp_comm"]
    assert tp and all(o.overlaps == "" for o in tp)
    assert len([o for o in back if o.name.endswith(".regather")]) == regathers
    assert len([o for o in back if o.name.endswith(".regather_cat")]) == regathers
    # Megatron's layout: every column-parallel GEMM re-gathers its input beside its input-gradient GEMM, and
    # reduce-scatters the input gradient beside its weight-gradient GEMM
    mega = job(tp_layout="megatron", **plan)
    fwd = layer_forward(mega.model, mega.plan)
    beside = {o.name: o.overlaps for o in backward_of(fwd, mega.plan) if o.name.endswith(("regather", "_scatter"))}
    assert beside["qkv.regather"] == "qkv.dgrad" and beside["qkv.dgrad_reduce_scatter"] == "qkv.wgrad"


def test_float8_tensorwise_gathers_one_byte_elements_and_reduces_gradients_in_16_bits():
    # torchao's Float8ColwiseParallel casts the shard to float8 before gathering it: 64 tokens × 64 × 1 B = 4,096 B,
    # its cat 2 × 4,096; the backward's reduce-scatter of the input gradient stays bf16: its chunk and cat 16,384 B
    j = job(dtype="fp8", fp8_recipe="tensorwise", recompute="selective", selective_recompute="op")
    fwd = layer_forward(j.model, j.plan)
    ops = {o.name: o for o in fwd}
    assert ops["attn_in.all_gather"].amount == 4096
    assert (ops["attn_in.cat"].amount, ops["attn_in.cat"].backward_amount) == (8192, 16384)
    back = {o.name: o.amount for o in backward_of(fwd, j.plan)}
    assert back["qkv.regather"] == 4096 and back["qkv.regather_cat"] == 8192
    assert back["qkv.dgrad_reduce_scatter"] == 8192


def test_async_tp_leaves_the_summed_input_gradients_reduce_scatter_unfused_and_copied():
    # PyTorch's micro-pipeline TP fuses a reduce-scatter only into the matmul that feeds it; the input gradient of
    # wq, wk, wv is their sum: its reduce-scatter runs beside nothing after a chunk and cat of 8,192 B read and
    # written (16,384 B); the re-gather before the weight-gradient matmul stays fused with it
    j = job(tp_comm_overlap=True, recompute="selective", selective_recompute="op")
    back = {o.name: o for o in backward_of(layer_forward(j.model, j.plan), j.plan)}
    assert back["qkv.dgrad_reduce_scatter"].overlaps == "" and back["qkv.dgrad_chunk_cat"].amount == 16384
    assert back["qkv.regather"].overlaps == "qkv.dgrad"
    assert not [n for n in back if n.endswith(("regather_cat", ".cat.bwd"))]
