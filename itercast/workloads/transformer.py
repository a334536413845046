"""Build the ExecGraph of one training step of a transformer under a plan (DESIGN.md §3).

One representative GPU per pipeline stage (graph rank = stage): its tensor-, context- and
data-parallel peers behave alike and are not simulated (symmetry, DESIGN.md §3); collectives over
those groups are timed for the whole group by the cost model. Per stage the resources are
`host` (kernel launches), `compute` (kernels and the blocking TP/CP collectives on the compute
stream), `dp_comm` (gradient and parameter collectives), `p2p_next` and `p2p_prev` (pipeline sends).

Granularity: the consecutive kernels of one pass of one model chunk run back to back on the
compute stream, so they are one task (exact for timing); a pass is split further only where other
work hooks into it: gradient buckets in the last backward of each chunk (overlapped DP reduction),
and single layers under ZeRO-3 (per-layer parameter gathers). A segment with MoE layers whose host waits
for the router's counts (transformer_ops.moe_host_wait) runs in parts between those waits (wait_parts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from itercast.config.job import Job
from itercast.config.plan import DTYPE_BYTES, TE_PIPELINE_SPLITS, pipelined_fsdp2
from itercast.costs.analytic import AnalyticCostModel
from itercast.errors import ConfigError
from itercast.graph.execgraph import Category, ExecGraph, GraphBuilder
from itercast.hardware.topology import GroupPlacement, pair_groups, place_group, same_node
from itercast.memory import (
    embedding_unit_params,
    full_recompute_share,
    stage_params,
    virtual_stage_layer_counts,
    zero3_kept,
)
from itercast.parallel.schedules import Pass, interleaved_warmup, schedule
from itercast.workloads import transformer_ops as ops_mod
from itercast.workloads.transformer_ops import COMM_FAMILIES, Op

#: PassCost families of blocking communication (a segment's "comm" task), the rest are compute
COMM_FAMILY_PREFIXES = ("tp_", "cp_", "ep_", "etp_")
GRAD_NORM_BYTES = 4  # one fp32 scalar: the global gradient norm for clipping (Megatron clip_grad)


def grad_collective(job: Job) -> str:
    """DDP all-reduces gradients; ZeRO-3 (FSDP) reduce-scatters them; ZeRO-1/2 as plan.zero_grad_reduce says
    (Megatron-Core's distributed optimizer a reduce-scatter, DeepSpeed an all-reduce or one reduce per rank)."""
    p = job.plan
    if p.zero_stage == 0:
        return "all_reduce"
    return "reduce_scatter" if p.zero_stage == 3 else p.zero_grad_reduce


def param_collective(job: Job) -> str:
    """How ZeRO-1/2 bring the updated parameter shards to every rank, as plan.zero_param_gather says (an
    all-gather, or InternLM's one broadcast per rank); ZeRO-3 (FSDP) all-gathers."""
    p = job.plan
    return p.zero_param_gather if p.zero_stage in (1, 2) else "all_gather"


def weight_bytes(job: Job) -> int:
    """Bytes per parameter as stored for compute (16-bit, or fp32 when training in fp32)."""
    return 4 if job.plan.dtype == "fp32" else 2


def host_launch_split(kernels: int, launch_s: float) -> tuple[float, float]:
    """Host seconds to issue the first of a segment's `kernels` and the rest, at `launch_s` each
    (GPUSpec.kernel_launch_overhead_s): what its first kernel waits for, and what its last waits
    for beyond that (TransformerStepBuilder._run_segment)."""
    first = min(kernels, 1)
    return first * launch_s, (kernels - first) * launch_s


def grad_buffer_zero_bytes(job: Job) -> int:
    """HBM bytes per local parameter Megatron's DDP writes at each step's start: its contiguous gradient buffer
    zeroed whole (train_step's zero_grad_buffer, grad_data.zero_(), core_r0.8.0 to d98e8a64; the buffer holds
    every parameter of the GPU's model chunks, the distributed optimizer sharding only its states), in the
    buffer's dtype (plan.grad_bytes). Only under grad_accumulation fused with zero_stage 0-1 (Megatron's DDP and
    distributed optimizer); 0 otherwise: ZeRO-2/3 with fused accumulation stand for FSDP-like sharding, whose
    buffers are not Megatron's, and PyTorch's zero_grad sets gradients to None (nothing to write)."""
    p = job.plan
    return p.grad_bytes if p.accumulates_in_gemm and p.zero_stage <= 1 else 0


def grad_bucket_pass_bytes(job: Job, groups: Groups) -> Params:
    """HBM bytes per parameter (routed experts', the rest's) Megatron's DDP moves on the compute stream over a
    gradient bucket before reducing it (start_grad_sync): plan.grad_nan_check's norm reads it (grad_bytes), and
    a scaling by gradient_scaling_factor reads and writes it (2 · grad_bytes) where that factor is not 1
    (distributed_data_parallel.py, core_r0.8.0 to d98e8a64): without plan.grad_average_in_collective 1 / the
    data-parallel ranks (groups.grad, context ranks included) for every parameter; with it 1 for the rest and
    expert data-parallel ranks / data-parallel ranks for the routed experts. 0 outside Megatron's buffer
    (grad_buffer_zero_bytes). The host's wait for the norm's NaN test (a sync per bucket, a launch latency or
    two each) is not priced."""
    if not grad_buffer_zero_bytes(job):
        return 0.0, 0.0
    p, dp, edp = job.plan, groups.grad.size, groups.expert_grad.size
    dense_scaled = dp > 1 and not p.grad_average_in_collective
    expert_scaled = dense_scaled or (p.grad_average_in_collective and edp != dp)
    norm = p.grad_bytes * int(p.grad_nan_check)
    return float(norm + 2 * p.grad_bytes * expert_scaled), float(norm + 2 * p.grad_bytes * dense_scaled)


def optimizer_step_bytes(job: Job, params: float) -> float:
    """HBM traffic of a fused Adam step over `params` local parameters (apex/TE FusedAdam): read
    the optimizer's copy of the weight (plan.master_param_bytes), the gradient (plan.grad_bytes) and
    m, v (plan.adam_state_dtype); write the copy and m, v; with mixed precision also write the 16-bit
    weight the next forward uses, which it also reads when the copy is not a whole one (16-bit
    remainders rebuild fp32 with it; none: it is the copy). Training in fp32: 4 + 4 + 8 + 12 = 28
    bytes/param; bf16 with fp32 gradients: 4 + 4 + 8 + 12 + 2 = 30."""
    p = job.plan
    moments = 2 * DTYPE_BYTES[p.adam_state_dtype]
    if p.dtype == "fp32" or p.main_params == "fp32_weights":  # the fp32 weight is the copy: no 16-bit write
        return params * (4 + p.grad_bytes + moments + 4 + moments)
    copy, w = p.master_param_bytes, weight_bytes(job)
    rebuilt = w if p.main_params in ("fp32_remainders", "none") else 0
    return params * (copy + rebuilt + p.grad_bytes + moments + copy + moments + w)


def stage_output_bytes(job: Job) -> float:
    """What one GPU holds of a pipeline stage's output (the [s, b, h] activation, or its gradient) per
    micro-batch: 1/tp of it under sequence parallelism, else all of it."""
    m, p = job.model, job.plan
    nbytes = p.micro_batch_size * m.seq_length / p.context_parallel * m.hidden_size * p.dtype_bytes
    return nbytes / p.tensor_parallel if p.sequence_parallel else nbytes


def pipe_partitioned(job: Job) -> bool:
    """DeepSpeed's pipe engine (plan.pipeline_p2p deepspeed) partitions each transfer over the tensor-parallel
    ranks: whenever tp > 1 (engine.py is_pipe_partitioned = is_model_parallel and the config's pipe_partitioned,
    true by default: runtime/config.py get_pipeline_config), except for a mixture-of-experts model, which
    Megatron-DeepSpeed runs with pipe_partitioned and grad_partitioned off (model/gpt_model.py: partitioning is not
    supported with MoE; its MoE pretraining scripts set both false), as its launch settings say."""
    p = job.plan
    return p.pipeline_p2p == "deepspeed" and p.tensor_parallel > 1 and not job.model.is_moe


def scatter_gathered(job: Job) -> bool:
    """Megatron-LM's scatter-gather of pipeline sends acts (plan.p2p_scatter_gather): under its pipeline exchanges
    (pipeline_p2p megatron) with pipelining and tp > 1 and without sequence parallelism."""
    p = job.plan
    return p.p2p_scatter_gather and p.pipeline_parallel > 1 and p.tensor_parallel > 1 and not p.sequence_parallel


def p2p_message_bytes(job: Job) -> float:
    """Activations (or their gradients) one GPU of a pipeline stage sends per micro-batch: what it holds
    (stage_output_bytes; 1/tp of the stage output under sequence parallelism); DeepSpeed's pipe engine
    sends 1/tp of that where it partitions (pipe_partitioned), Megatron-LM of 2021-2023 where it scatters
    (scatter_gathered), and the receiver all-gathers it (PartitionedTensor.data, .full; gather_split_1d_tensor)."""
    nbytes = stage_output_bytes(job)
    return nbytes / job.plan.tensor_parallel if pipe_partitioned(job) or scatter_gathered(job) else nbytes


def p2p_send_s(costs: AnalyticCostModel, job: Job, cross_node: bool) -> float:
    """Seconds of one pipeline send of one micro-batch: the message, and under DeepSpeed's partitioning its
    header, a send of its own (partition_header_bytes)."""
    messages = (partition_header_bytes(job), p2p_message_bytes(job))
    return sum(costs.p2p_s(n, cross_node, job.plan.stage_ranks) for n in messages)


def partition_header_bytes(job: Job) -> float:
    """DeepSpeed's pipe engine where it partitions (pipe_partitioned): the int64 header sent ahead of each
    partitioned tensor (PartitionedTensor.to_meta: ndims, the 3 dims of [s, b, h], parts, rank, the tp + 1
    offsets); 0 otherwise. A send of its own (engine.py _exec_send_activations / _exec_send_grads send every
    tensor of the tuple)."""
    if not pipe_partitioned(job):
        return 0.0
    return 8.0 * (1 + 3 + 2 + job.plan.tensor_parallel + 1)


def pipe_copy_bytes(job: Job) -> dict[str, list[float]]:
    """DeepSpeed's pipe engine (plan.pipeline_p2p deepspeed): HBM bytes (read + write) of each device copy it
    runs around one micro-batch's pipeline transfer, by site; {} otherwise. S = stage_output_bytes, and where it
    partitions (pipe_partitioned) P = S / tp and H = partition_header_bytes (DeepSpeed 3401d2516,
    runtime/pipe/engine.py):
    - "receive", twice per received activation: _exec_recv_activations clones what it received
      (pipe_recv_buf.clone(); with tp > 1 the header and the part), _exec_forward_pass clones its inputs
      again: 2S, or 2H + 2P;
    - "partition" (partitioned), per send: the sender's PartitionedTensor keeps its part
      (runtime/utils.py _partition_tensor: .narrow().clone()): 2P;
    - "gather" (partitioned), per PartitionedTensor.full() (one per all-gather): torch.zeros of S (S written),
      the local part copied in (2P), PyTorch's list all_gather copying its flat output to each of the tp
      parts (ProcessGroupNCCL::allgather, torch 1.11, BLOOM's: tp × 2P), the whole .clone()d (2S).
    Gradients are received in place (_exec_recv_grads: no clone)."""
    p = job.plan
    if p.pipeline_p2p != "deepspeed" or p.pipeline_parallel == 1:
        return {}
    full, tp = stage_output_bytes(job), p.tensor_parallel
    if not pipe_partitioned(job):
        return {"receive": [2 * full]}
    part, header = full / tp, partition_header_bytes(job)
    return {
        "receive": [2 * header, 2 * part],
        "partition": [2 * part],
        "gather": [full, 2 * part, *[2 * part] * tp, 2 * full],
    }


def pipe_copy_s(costs: AnalyticCostModel, job: Job, site: str) -> float:
    """Seconds of one `site`'s copies (pipe_copy_bytes), each a memory-bound kernel of its own; 0 if none."""
    return float(np.sum(costs.memory_s("elementwise", np.asarray(pipe_copy_bytes(job).get(site, []), dtype=float))))


def unit_params(job: Job) -> dict[str, tuple[float, float]]:
    """Parameters of one GPU's share of each unit kind, as (routed experts', the rest): the
    experts' are reduced and sharded over the expert-data-parallel group. The head's: the final
    norm and the output layer, whose weights are the embedding's when tied on a single stage."""
    m, p = job.model, job.plan
    vocab = p.local_vocab(m.vocab_size) * m.hidden_size
    head = m.final_norm_params() + (vocab if output_weight_held(job) else 0.0)
    experts = m.expert_params_per_rank(p.expert_parallel, p.etp) if m.is_moe else 0.0
    return {
        "embed": (0.0, embedding_unit_params(job)),
        "layer": (0.0, m.layer_params_per_rank(p.tensor_parallel)),
        "moe": (experts, m.layer_params_per_rank(p.tensor_parallel, moe=True, whole_mlp=p.whole_residual_mlp)),
        "head": (0.0, head),
    }


def output_weight_held(job: Job) -> bool:
    """Whether the head's stage holds an output weight of its own: untied, or a tied copy on the last of
    several stages (on one stage the tied head is the embedding's table)."""
    return not job.model.tied or job.plan.pipeline_parallel > 1


def head_param_tensors(job: Job) -> int:
    """The head's parameter tensors: the final norm's (RMSNorm a weight, LayerNorm weight and bias) and the
    output weight where its stage holds one."""
    return (1 if job.model.family == "llama" else 2) + int(output_weight_held(job))


def unit_tensors(job: Job, kind: str) -> tuple[float, ...]:
    """Parameters of each tensor of one unit on one tensor-parallel rank, what DeepSpeed v0.3's ZeRO-3
    (plan.zero3_collectives per_tensor_list) gathers and reduces one tensor at a time: a layer's two
    norms (LayerNorm weight and bias, RMSNorm weight) and query/key norms, its four linears (QKV, output
    projection, the MLP's fused first and its second; tensor parallelism splits them) and their biases
    (the column-parallel ones split); the embedding's word table (split) and learned positions; the
    head's final norm and, untied, its output weight (split). They sum to the unit's parameters
    (ModelConfig.layer_params_per_rank). DeepSpeed v0.3.13 had no experts: an MoE layer is refused, and so
    is multi-latent attention, whose projections these tensors do not list."""
    m, tp = job.model, job.plan.tensor_parallel
    if kind == "moe":
        raise ConfigError(
            "plan.zero3_collectives per_tensor_list is DeepSpeed v0.3's ZeRO-3, which ran no experts: expected a "
            f"dense model; got {m.num_experts} experts"
        )
    if m.mla:
        raise ConfigError(
            "plan.zero3_collectives per_tensor_list prices the tensors of standard attention (QKV and output "
            "projection): expected a model without multi-latent attention; got kv_lora_rank "
            f"{m.kv_lora_rank}"
        )
    h, f, qkv = m.hidden_size, m.ffn, (m.num_attention_heads + 2 * m.kv_heads) * m.head_dim
    norm = (h,) if m.family == "llama" else (h, h)
    if kind == "embed":
        return (job.plan.local_vocab(m.vocab_size) * h,) + ((m.seq_length * h,) if m.learned_positions else ())
    if kind == "head":
        return norm + (() if m.tied else (job.plan.local_vocab(m.vocab_size) * h,))
    weights = (h * qkv, m.num_attention_heads * m.head_dim * h, (2 if m.gated_mlp else 1) * h * f, f * h)
    biases = (qkv / tp, h, f / tp, h) if m.biases else ()
    qk = (m.head_dim, m.head_dim) if m.qk_norm else ()
    return norm + norm + qk + tuple(w / tp for w in weights) + biases


def unit_kinds(job: Job, stage: int, chunk: int) -> list[str]:
    """The units of one model chunk on one pipeline stage, in forward order."""
    p, m = job.plan, job.model
    vs = chunk * p.pipeline_parallel + stage
    per_virtual = p.virtual_stage_layers(m.num_layers)
    start = sum(per_virtual[:vs])
    kinds = ["moe" if m.is_moe_layer(i) else "layer" for i in range(start, start + per_virtual[vs])]
    if vs == 0:
        kinds.insert(0, "embed")
    if vs == p.pipeline_parallel * p.virtual_pipeline - 1:
        kinds.append("head")
    return kinds


def weight_cast_bytes(job: Job) -> list[float]:
    """Bytes of the once-per-step FP8 weight casts (plan.fp8_weight_cast per_step:
    transformer_ops.weight_cast_step_bytes per layer) of each virtual stage, in virtual-stage order
    (chunk c of stage s is c·pp + s). Transformer Engine casts a module's weights in its forward on
    the step's first micro-batch: the graph runs them before each chunk's first forward, the fast
    path adds them to the step (each lies on the first micro-batch's way down the pipeline)."""
    m, p = job.model, job.plan
    dense = ops_mod.weight_cast_step_bytes(m, p)
    moe = ops_mod.weight_cast_step_bytes(m, p, moe=True) if m.is_moe else 0.0
    layers, moe_n = virtual_stage_layer_counts(m, p)
    return [float((n - k) * dense + k * moe) for n, k in zip(layers, moe_n, strict=True)]


def amax_reduction_bytes(job: Job) -> list[tuple[float, float, list[float]]]:
    """Per pipeline stage, under Transformer Engine 1.x's DelayedScaling (dtype fp8, plan.fp8_recipe delayed;
    else []): the bytes of its forward and backward global amax buffers, which hold every layer of every
    chunk on the stage (one buffer per rank: its key is the direction, the recipe and the group, not the
    chunk), and each chunk's scale-update bytes (transformer_ops.delayed_amax_bytes per layer)."""
    m, p = job.model, job.plan
    if p.dtype != "fp8" or p.fp8_recipe != "delayed":
        return []
    dense = ops_mod.delayed_amax_bytes(m, p)
    moe = ops_mod.delayed_amax_bytes(m, p, moe=True) if m.is_moe else (0, 0, 0)
    layers, moe_n = virtual_stage_layer_counts(m, p)
    per_virtual = np.outer(layers - moe_n, dense) + np.outer(moe_n, moe)  # virtual stage × (fwd, bwd, update)
    chunks = per_virtual.reshape(p.virtual_pipeline, p.pipeline_parallel, 3)  # [chunk, stage]
    buffers = chunks[..., :2].sum(axis=0)  # every chunk of a stage shares its buffers
    return [
        (float(buffers[s, 0]), float(buffers[s, 1]), [float(x) for x in chunks[:, s, 2]])
        for s in range(p.pipeline_parallel)
    ]


def bucket_spans(params: list[float], bucket_params: float) -> list[tuple[int, int]]:
    """[start, end) of consecutive units merged into gradient buckets: a bucket closes once it holds
    `bucket_params` parameters (Megatron DDP's bucket size); the units left over form the last."""
    spans, start, held = [], 0, 0.0
    for i, w in enumerate(params):
        held += w
        if held >= bucket_params:
            spans.append((start, i + 1))
            start, held = i + 1, 0.0
    if start < len(params):
        spans.append((start, len(params)))
    return spans


@dataclass(frozen=True)
class PassCost:
    """One pass of one unit (a layer, the embedding or the head) on one GPU."""

    compute_s: float
    comm_s: float  # blocking on the compute stream: TP collectives + exposed CP ring traffic
    kernels: int
    family_s: dict[str, float] = field(default_factory=dict)

    def __add__(self, other: PassCost) -> PassCost:
        fam = dict(self.family_s)
        for k, v in other.family_s.items():
            fam[k] = fam.get(k, 0.0) + v
        return PassCost(self.compute_s + other.compute_s, self.comm_s + other.comm_s, self.kernels + other.kernels, fam)

    def __sub__(self, other: PassCost) -> PassCost:
        """What a pass costs beyond `other`, a prefix of its ops (moe_wait_split)."""
        fam = dict(self.family_s)
        for k, v in other.family_s.items():
            fam[k] = fam.get(k, 0.0) - v
        fam = {k: v for k, v in fam.items() if v != 0.0}  # a family of the prefix alone: exactly its sum
        return PassCost(self.compute_s - other.compute_s, self.comm_s - other.comm_s, self.kernels - other.kernels, fam)

    def scaled(self, k: float) -> PassCost:
        return PassCost(
            self.compute_s * k, self.comm_s * k, round(self.kernels * k), {f: v * k for f, v in self.family_s.items()}
        )


def mean_pass(parts: list[tuple[float, PassCost]]) -> PassCost:
    """The mean of passes weighted by the share of layers that run each (shares summing to 1):
    seconds and families weighted, kernels the nearest whole number of the weighted mean."""
    fam: dict[str, float] = {}
    for w, c in parts:
        for k, v in c.family_s.items():
            fam[k] = fam.get(k, 0.0) + w * v
    return PassCost(
        sum(w * c.compute_s for w, c in parts),
        sum(w * c.comm_s for w, c in parts),
        round(sum(w * c.kernels for w, c in parts)),
        fam,
    )


def layer_passes(job: Job, costs: AnalyticCostModel, groups: Groups, moe: bool = False) -> tuple[PassCost, PassCost]:
    """Forward and backward of the mean layer (an MoE layer when `moe`): where layers differ —
    sliding-window against global attention (model.global_attention_every), recomputed against
    not (recompute_method block, recompute_every: memory.full_recompute_share) — each kind weighted
    by its share of the model's layers. Exact for a stage's total when its chunks hold whole
    periods of the pattern (Gemma's and GPT-OSS's layer counts are multiples of their period) and,
    for block recompute, equal layers; otherwise an approximation of one stage's share."""
    m, p = job.model, job.plan
    attention = _attention_kinds(job)
    again = float(full_recompute_share(m, p, p.pipeline_parallel, p.virtual_pipeline))
    redo = [(again, "full"), (1 - again, "none")] if p.recompute == "full" else [(1.0, p.recompute)]
    fwd = mean_pass([(w, pass_cost(ops_mod.layer_forward(m, p, moe, x), costs, groups)) for w, x in attention])
    bwd = mean_pass(
        [
            (w * v, pass_cost(ops_mod.layer_backward(m, p, moe, x, kind), costs, groups))
            for w, x in attention
            for v, kind in redo
            if v > 0
        ]
    )
    return fwd, bwd


def _attention_kinds(job: Job) -> list[tuple[float, bool]]:
    """(share of the model's layers, sliding-window) of its global and sliding-window layers (layer_passes)."""
    local = job.model.num_windowed_layers / job.model.num_layers
    return [(w, windowed) for w, windowed in ((1 - local, False), (local, True)) if w > 0]


#: an MoE layer's pass cut where its host waits (transformer_ops.moe_host_wait): the ops the wait waits for, those
#: the host launched before it beyond them, and the rest of the pass (together the pass)
WaitSplit = tuple[PassCost, PassCost, PassCost]


def moe_wait_split(job: Job, costs: AnalyticCostModel, groups: Groups, forward: bool) -> WaitSplit | None:
    """The mean MoE layer's forward (or backward) cut at its host's wait (transformer_ops.moe_host_wait), or None
    where it has none: the backward waits only when it recomputes the forward (Megatron-Core's full recompute
    and its moe recompute module run the dispatcher again; token_dispatcher.py keeps the split lists of the
    forward for the backward otherwise). Each part priced as the pass's prefixes (pass_cost of the ops up to the
    cut, so a collective hidden behind an earlier kernel stays so), weighted as layer_passes weights the attention
    kinds. Priced where every layer is recomputed (memory.full_recompute_share 1); a partial recomputation
    (recompute_method block, recompute_every) leaves its recomputed layers' waits out, in the graph as in the fast
    path."""
    m, p = job.model, job.plan
    cut = ops_mod.moe_host_wait(m, p)
    if cut is None:
        return None
    again = full_recompute_share(m, p, p.pipeline_parallel, p.virtual_pipeline)
    whole_moe = p.recompute == "selective" and p.selective_recompute == "modules" and "moe" in p.recompute_modules
    if not forward and not whole_moe and (p.recompute != "full" or again < 1):
        return None
    prefix = "" if forward else "recompute."
    splits: list[tuple[float, WaitSplit]] = []
    for w, windowed in _attention_kinds(job):
        # the backward: the plan's full recompute or its moe module
        pass_ops = ops_mod.layer_forward if forward else ops_mod.layer_backward
        ops = pass_ops(m, p, True, windowed)
        names = [op.name for op in ops]
        waited, launched = (names.index(prefix + name) + 1 for name in cut)
        before, up_to, whole = (pass_cost(ops[:i], costs, groups) for i in (waited, launched, len(ops)))
        splits.append((w, (before, up_to - before, whole - up_to)))
    before, between, after = (mean_pass([(w, split[i]) for w, split in splits]) for i in range(3))
    return before, between, after


ZERO_COST = PassCost(0.0, 0.0, 0)
#: (stage, chunk, forward, split, segment index): one segment of one chunk pass
SegmentKey = tuple[int, int, bool, str, int]
#: (stage, chunk, forward, split, segment index, part index): one run of a segment between its host's waits
PartKey = tuple[int, int, bool, str, int, int]
#: how a task is priced: ("launch" | "compute" | "comm", PartKey), ("dp", stage, kind, Params,
#: bytes per parameter), ("collective", stage, kind, bytes, Groups field), ("memory", stage, kind,
#: bytes), ("p2p", stage, to stage): the stage's device prices it (a mixed cluster's groups differ)
Recipe = tuple[Any, ...]
Message = tuple[bool, int, int]  # a pipeline message: (forward, sending stage, micro-batch)
#: parameters of a unit or segment on one GPU: (routed experts', the rest)
Params = tuple[float, float]
Segment = tuple[PassCost, Params]  # a unit, or consecutive units run as one (TransformerStepBuilder._segments_of)
#: a run of a segment between its host's waits: its cost, and 0 for the first, else which run before it the host
#: waits for before launching it (1 the one before, 2 the one before that: wait_parts)
Part = tuple[PassCost, int]


def wait_parts(pieces: list[PassCost], waits: list[WaitSplit | None]) -> list[Part]:
    """A segment's units (`pieces`, each with its MoE wait split or None) cut where the host waits: the run up
    to and with what a wait waits for, the run it launched before the wait beyond that (if any: Megatron-Core's
    permutation 1), then the run after the wait up to the next one. Without waits one part, the segment."""
    parts: list[Part] = []
    run, back = ZERO_COST, 0
    for cost, wait in zip(pieces, waits, strict=True):
        if wait is None:
            run = run + cost
            continue
        before, between, after = wait
        parts.append((run + before, back))
        if between.kernels:
            parts.append((between, 0))
        run, back = after, 2 if between.kernels else 1
    parts.append((run, back))
    return parts


#: a group of one rank: nothing to communicate
LONE = GroupPlacement(1, 1, 1)


@dataclass(frozen=True)
class Groups:
    tp: GroupPlacement
    cp: GroupPlacement
    grad: GroupPlacement  # data × context parallel: gradients and ZeRO shards
    embedding: GroupPlacement  # first and last stage (tied embeddings)
    model: GroupPlacement  # tensor × pipeline: global gradient norm
    stage_cross_node: bool
    ep: GroupPlacement  # expert parallel: the token all-to-alls
    etp: GroupPlacement  # expert tensor parallel
    expert_grad: GroupPlacement  # expert data parallel: routed experts' gradients and ZeRO shards
    # a stage's tensor × context × data ranks: Transformer Engine's amax reductions (Megatron-Core
    # get_amax_reduction_group(with_context_parallel=True))
    amax: GroupPlacement
    # plan.zero_shard_ranks: the innermost data × context ranks that shard ZeRO's state (None: all of grad), and the
    # groups' copies across which their shards are all-reduced (Megatron-Core's inter-instance group); the routed
    # experts' alike within and across their expert-data-parallel ranks (parallel_state.py: the intra- and
    # inter-partial expert data parallel groups, expert data parallel size / instances and instances)
    shard: GroupPlacement | None = None
    replica: GroupPlacement = LONE
    expert_shard: GroupPlacement | None = None
    expert_replica: GroupPlacement = LONE

    @property
    def zero(self) -> GroupPlacement:
        """The ranks ZeRO shards the dense parameters' state over."""
        return self.grad if self.shard is None else self.shard

    @property
    def expert_zero(self) -> GroupPlacement:
        """The ranks ZeRO shards the routed experts' state over."""
        return self.expert_grad if self.expert_shard is None else self.expert_shard

    @classmethod
    def of(cls, job: Job) -> Groups:
        p, gpn = job.plan, job.system.node.gpus_per_node
        t, c, d, pp = p.tensor_parallel, p.context_parallel, p.dp, p.pipeline_parallel
        stage_stride = p.stage_ranks
        pipe = place_group(pp, stage_stride, gpn)
        # Megatron-Core's expert rank order within a stage: expert-tensor innermost, then expert,
        # then expert-data parallel (together the stage's tensor × context × data ranks)
        ep, etp = p.expert_parallel, p.etp
        # plan.zero_shard_ranks s: the innermost s of the data × context ranks, the d·c/s copies at stride t·s; the
        # experts' e data-parallel ranks (stride ep·etp) split alike into the innermost e·s/(d·c) and their copies
        s = p.zero_shard_ranks
        e = stage_stride // (ep * etp) if job.model.is_moe else 1
        e_shard = None if s is None or e == 1 else e * s // (d * c)
        return cls(
            tp=place_group(t, 1, gpn),
            cp=place_group(c, t, gpn),
            grad=place_group(d * c, t, gpn),
            embedding=pair_groups((pp - 1) * stage_stride, stage_stride, gpn),
            model=GroupPlacement(t * pp, pipe.nodes, max(1, t * pp // pipe.nodes)),
            stage_cross_node=not same_node(0, stage_stride, gpn),
            ep=place_group(ep, etp, gpn),
            etp=place_group(etp, 1, gpn),
            expert_grad=place_group(e, ep * etp, gpn),
            amax=place_group(stage_stride, 1, gpn),
            shard=None if s is None else place_group(s, t, gpn),
            replica=LONE if s is None else place_group(d * c // s, t * s, gpn),
            expert_shard=None if e_shard is None else place_group(e_shard, ep * etp, gpn),
            expert_replica=LONE if e_shard is None else place_group(e // e_shard, ep * etp * e_shard, gpn),
        )


#: the data-parallel collectives issued once per rank, and the collective whose bytes and latency each one is priced as
PER_RANK = {"reduce_per_rank": "reduce_scatter", "broadcast_per_rank": "all_gather"}


def dp_collective_s(
    collective_s: Callable[[str, float, GroupPlacement], float],
    groups: Groups,
    kind: str,
    params: Params,
    bytes_per_param: int,
) -> float:
    """A data-parallel collective (gradient reduction, ZeRO parameter gather) of `params`, priced by
    `collective_s` (a cost model's, or a memo of it): the rest over data × context parallel ranks,
    then routed experts over expert-data-parallel ranks (Megatron-Core keeps them in buffers of
    their own). With plan.zero_shard_ranks each part's gathers run within its shard group, its
    reductions to shards reduce within it and all-reduce each shard across the groups (all-reduces
    stay over every rank)."""
    experts, rest = params

    def over(group: GroupPlacement, nbytes: float) -> float:
        per_rank = PER_RANK.get(kind)
        if per_rank is None:
            return collective_s(kind, nbytes, group)
        # one collective per rank, in turn: DeepSpeed's reduce to each destination (PlanConfig.zero_grad_reduce),
        # InternLM's broadcast from each source (zero_param_gather); each moves a reduce-scatter's (all-gather's)
        # bytes of its 1/size and pays a ring's latency
        return group.size * collective_s(per_rank, nbytes / group.size, group) if group.size > 1 else 0.0

    def part(ranks: GroupPlacement, shard: GroupPlacement | None, replica: GroupPlacement, nbytes: float) -> float:
        if shard is None or kind == "all_reduce":
            return over(ranks, nbytes)
        if kind in ("all_gather", "broadcast_per_rank"):
            return over(shard, nbytes)
        # a reduction to shards: within the shard group, then each shard across the groups' copies
        return over(shard, nbytes) + collective_s("all_reduce", nbytes / shard.size, replica)

    dense = part(groups.grad, groups.shard, groups.replica, rest * bytes_per_param)
    return dense + part(groups.expert_grad, groups.expert_shard, groups.expert_replica, experts * bytes_per_param)


def local_optimizer_params(job: Job, groups: Groups, params: Params) -> float:
    """Parameters whose optimizer step one GPU runs: with ZeRO ≥ 1 its shard of each group."""
    experts, rest = params
    if job.plan.zero_stage == 0:
        return experts + rest
    return experts / groups.expert_zero.size + rest / groups.zero.size


def _sm_share(costs: AnalyticCostModel, margin: int) -> float:
    """How much longer a GEMM runs on all but `margin` of its GPU's SMs: sm_count / (sm_count − margin)."""
    if not margin:
        return 1.0
    sms = costs.system.gpu.sm_count
    if sms is None or sms <= margin:
        raise ConfigError(
            f"plan.tp_comm_overlap_sms: {costs.system.gpu.name} needs gpu.sm_count above the {margin} SMs its "
            f"overlap takes (expected an integer > {margin}); got {sms}"
        )
    return sms / (sms - margin)


def _chunks(op: Op, groups: Groups) -> int:
    """GEMM chunks of a tensor-parallel overlap that splits its GEMM (Op.chunked): the group's size for a
    ring exchange, TE_PIPELINE_SPLITS for the pipeline method (PlanConfig.tp_comm_overlap_rs)."""
    return TE_PIPELINE_SPLITS if op.chunked == "pipeline" else getattr(groups, op.group).size


def _stretch_s(s: float, comm_s: float, kernel_s: float) -> float:
    """How much longer a kernel of `kernel_s` seconds alone runs beside `comm_s` seconds of communication:
    sim/contention.py's fluid model, s/(1 + s)·o for o seconds of overlap, o = min(comm_s, kernel_s·(1 + s))."""
    return s / (1 + s) * min(comm_s, kernel_s * (1 + s))


def _beside_s(
    op: Op, comm_s: float, kernel_s: float, n: int, costs: AnalyticCostModel, groups: Groups
) -> tuple[float, float]:
    """(exposed, stretch) seconds of collective `op`, `comm_s` seconds alone, run beside the kernel it overlaps,
    `kernel_s` seconds alone: what the collective takes beyond that kernel, and how much longer the kernel runs
    beside it. The stretch is `_stretch_s` (s = GPUSpec.overlap_compute_slowdown) for a collective that runs
    SM kernels beside a GEMM launched on every SM: NCCL's, and Transformer Engine's userbuffers without
    set_sm_margin. None where the SMs it takes are priced instead (`sm_margin`) or where
    copy engines move it (a ring exchange: TE's use_ce default, PyTorch's symmetric-memory copies).

    A chunked overlap (PlanConfig.tp_comm_overlap_rs; Transformer Engine common/comm_gemm_overlap/
    comm_gemm_overlap.cpp, d0067d0) runs its GEMM as `n` chunks (`_chunks`) of kernel_s / n: chunk i's
    transfer runs beside chunk i + 1's GEMM, so each of n − 1 steps takes the longer of the two. Ring exchange sends one
    chunk of amount / n to a neighbour per step; the first GEMM runs on the rank's own chunk
    (split_overlap_ag), and a reduce-scatter's last GEMM is its own chunk too, after which one kernel sums the
    n chunks received (split_overlap_rs: reads amount, writes amount / n), at the op's bandwidth_share of the
    elementwise curve (PyTorch's torch.sum: transformer_ops.ASYNC_TP_SUM_BANDWIDTH_SHARE). Pipeline reduce-scatters each
    chunk of amount / n over the group, the last one after the last GEMM."""
    s = 0.0 if op.sm_margin or op.chunked == "ring_exchange" else costs.system.gpu.overlap_compute_slowdown
    if not op.chunked:
        stretch_s = _stretch_s(s, comm_s, kernel_s)
        return max(0.0, comm_s - kernel_s - stretch_s), stretch_s
    group = getattr(groups, op.group)
    if op.chunked == "pipeline":
        step_s = tail_s = costs.collective_s(op.comm_kind, op.amount / n, group)
    else:
        step_s = costs.p2p_s(op.amount / n, not group.intra_node, group.stride)
        rs = op.comm_kind == "reduce_scatter"
        tail_s = float(costs.memory_s("elementwise", op.amount * (n + 1) / n / op.bandwidth_share)) if rs else 0.0
    chunk_s = kernel_s / n
    stretch_s = _stretch_s(s, step_s, chunk_s)  # each GEMM chunk beside one step
    return (n - 1) * max(0.0, step_s - chunk_s - stretch_s) + tail_s, (n - 1) * stretch_s


def pass_cost(ops: list[Op], costs: AnalyticCostModel, groups: Groups) -> PassCost:
    """Seconds of a list of ops run in order on one GPU. A collective that `overlaps` a kernel (or several:
    their summed time) runs beside it (its own stream) and costs only what it takes beyond that kernel; one that takes
    `sm_margin` SMs from it (Transformer Engine's userbuffers) leaves that GEMM sm_count − sm_margin
    SMs: its time × sm_count / (sm_count − sm_margin); one that splits it (`chunked`) runs it as n
    GEMMs of 1/n of its FLOPs each, and one of separate projections (Op.parts) as a GEMM per projection;
    `_beside_s` prices each (the kernel slowed beside it, reported as
    overlap_contention, and the collective's excess). The context-parallel ring's steps run beside the
    pass's attention kernels, NCCL's send and receive kernels slowing them the same way."""
    fam: dict[str, float] = {}
    kernel_s: dict[str, float] = {}
    compute = comm = attention = cp_ring = contention = 0.0
    kernels = 0
    margins = {op.overlaps: op.sm_margin for op in ops if op.sm_margin and op.overlaps}
    chunks = {op.overlaps: _chunks(op, groups) for op in ops if op.chunked}
    for op in ops:  # kernels first: a collective may hide behind a kernel that runs after it
        if op.family == "gemm":
            n = chunks.get(op.name, 1)
            share = _sm_share(costs, margins.get(op.name, 0))
            parts = np.asarray(op.parts or (1.0,))  # separate projections: a GEMM each
            sec = op.count * n * float(costs.gemm_s(op.amount * parts / n, op.te).sum()) * share
        elif op.family == "attention":
            sec = float(costs.attention_s(op.amount, op.attention))
            attention += sec
        elif op.family in ("elementwise", "norm", "activation"):
            sec = float(costs.memory_s(op.family, op.amount / op.bandwidth_share))
        else:
            continue
        kernel_s[op.name] = sec
        compute += sec
        label = op.label or op.family
        fam[label] = fam.get(label, 0.0) + sec
        kernels += op.count * chunks.get(op.name, 1) * max(len(op.parts), 1)
    for op in ops:
        if op.family == "cp_comm" and op.comm_kind == "p2p":  # ring steps overlap the attention kernels
            cp_ring += op.count * costs.p2p_s(op.amount, not groups.cp.intra_node, groups.cp.stride)
            continue
        if op.family in COMM_FAMILIES and not op.comm_kind:  # a view forward; its backward collective is priced
            continue
        if op.family in COMM_FAMILIES:
            placed: GroupPlacement = getattr(groups, op.group)
            amount = op.amount * ops_mod.dispatch_share(op.dedup, placed.size, placed.nodes, placed.per_node)
            group, one = op.group, costs.collective_s(op.comm_kind, amount, placed)
        elif op.family == "cp_comm" and op.comm_kind == "send":  # a CP send waited at once: exposed
            group, one = "cp", costs.p2p_s(op.amount, not groups.cp.intra_node, groups.cp.stride)
        elif op.family == "cp_comm":  # collectives over the CP group
            group, one = "cp", costs.collective_s(op.comm_kind, op.amount, groups.cp)
        else:
            continue
        sec = op.count * one
        if op.overlaps:  # beside the kernel (as it runs alone): exposed beyond it, the kernel slowed
            hidden_s = sum(kernel_s[name] for name in op.overlaps.split("+"))
            sec, stretch_s = _beside_s(op, sec, hidden_s, chunks.get(op.overlaps, 1), costs, groups)
            contention += stretch_s
        comm += sec
        label = f"{group}_{op.comm_kind}"
        fam[label] = fam.get(label, 0.0) + sec
        kernels += op.count
    # the ring hides behind attention (an approximation), slowing it
    ring_stretch_s = _stretch_s(costs.system.gpu.overlap_compute_slowdown, cp_ring, attention)
    contention += ring_stretch_s
    exposed_cp = max(0.0, cp_ring - attention - ring_stretch_s)
    if exposed_cp:
        fam["cp_p2p_exposed"] = exposed_cp
    if contention:
        fam["overlap_contention"] = contention
    return PassCost(compute + contention, comm + exposed_cp, kernels, fam)


@dataclass(frozen=True)
class UnitCosts:
    layer_fwd: PassCost
    layer_bwd: PassCost
    embed_fwd: PassCost
    embed_bwd: PassCost
    head_fwd: PassCost
    head_bwd: PassCost
    moe_fwd: PassCost = ZERO_COST  # an MoE layer (a dense model has none)
    moe_bwd: PassCost = ZERO_COST
    moe_fwd_wait: WaitSplit | None = None  # moe_fwd cut at its host's wait (moe_wait_split)
    moe_bwd_wait: WaitSplit | None = None

    @classmethod
    def of(cls, job: Job, costs: AnalyticCostModel, groups: Groups) -> UnitCosts:
        m, p = job.model, job.plan
        emb, head = ops_mod.embedding_forward(m, p), ops_mod.head_forward(m, p)
        layer = layer_passes(job, costs, groups)
        moe = layer_passes(job, costs, groups, moe=True) if m.is_moe else (ZERO_COST, ZERO_COST)
        # the word table (and learned positions), the output weight where it is a tensor of its own; their
        # gradient accumulation after their backward (a layer's is in its ops: transformer_ops.layer_backward)
        params = unit_params(job)
        embed_acc = ops_mod.grad_accumulation_ops(p, params["embed"][1], 2 if m.learned_positions else 1)
        head_acc = ops_mod.grad_accumulation_ops(p, params["head"][1], head_param_tensors(job))
        return cls(
            layer_fwd=layer[0],
            layer_bwd=layer[1],
            embed_fwd=pass_cost(emb, costs, groups),
            embed_bwd=pass_cost(ops_mod.backward_of(emb, p) + embed_acc, costs, groups),
            head_fwd=pass_cost(head, costs, groups),
            head_bwd=pass_cost(ops_mod.backward_of(head, p) + head_acc, costs, groups),
            moe_fwd=moe[0],
            moe_bwd=moe[1],
            moe_fwd_wait=moe_wait_split(job, costs, groups, True) if m.is_moe else None,
            moe_bwd_wait=moe_wait_split(job, costs, groups, False) if m.is_moe else None,
        )

    def forward(self, kind: str) -> PassCost:
        """The forward pass of a unit kind (embed | layer | moe | head)."""
        return {"embed": self.embed_fwd, "layer": self.layer_fwd, "moe": self.moe_fwd, "head": self.head_fwd}[kind]

    def backward(self, kind: str) -> PassCost:
        return {"embed": self.embed_bwd, "layer": self.layer_bwd, "moe": self.moe_bwd, "head": self.head_bwd}[kind]


class TransformerStepBuilder:
    """Builds the graph; keeps the unit costs and groups for reporting."""

    def __init__(self, job: Job, costs: AnalyticCostModel | None = None) -> None:
        self.job = job
        self.costs = costs or AnalyticCostModel(job.system, job.plan.dtype)
        self.groups = Groups.of(job)
        p = job.plan
        gpus = job.stage_gpus()
        kinds = [gpu for i, gpu in enumerate(gpus) if gpu not in gpus[:i]]  # one cost model per GPU kind
        costs_of = [self.costs.on_gpu(gpu) for gpu in kinds] if job.system.device_groups else [self.costs]
        units_of = [UnitCosts.of(job, c, self.groups) for c in costs_of]
        self.stage_costs = [costs_of[kinds.index(gpu)] for gpu in gpus]
        self.stage_units = [units_of[kinds.index(gpu)] for gpu in gpus]
        self.stage_gpus = gpus
        pp = p.pipeline_parallel
        self.p2p_s = {  # (from stage, to stage): the sends between neighbours (wrapping when interleaved)
            (s, d): p2p_send_s(self.stage_costs[s], job, self.groups.stage_cross_node or gpus[s] != gpus[d])
            for s in range(pp)
            for d in ((s + 1) % pp, (s - 1) % pp)
        }
        self._amax = amax_reduction_bytes(job)  # per stage: TE 1.x DelayedScaling's reductions (_amax_reduction)
        self.g = GraphBuilder()
        self._sends: dict[tuple[bool, int, int], int] = {}  # (forward, virtual stage, micro) -> send task
        self._pairs: dict[tuple[Message, ...], int] = {}  # blocking: the messages of an exchange -> its collective
        self._waits: list[tuple[tuple[bool, int, int], int]] = []  # (producer key, consumer task)
        #: per chunk pass and split: its segments, and each segment's parts (_parts_of)
        self._segment_cache: dict[tuple[int, int, bool, str], tuple[list[Segment], list[list[Part]]]] = {}
        self.family_time_s: list[dict[str, float]] = [{} for _ in range(p.pipeline_parallel)]
        self.recipes: list[Recipe] = []  # per task, how it is priced (task id = index)
        self._priced: dict[Recipe, float] = {}
        self._tails: list[dict[int, int]] = [{} for _ in range(pp)]  # per stage: resource -> its last task
        self._synced: dict[int, int] = {}  # stage -> its last host synchronisation (_host_sync)
        self._reduced: dict[int, list[Params]] = {s: [] for s in range(job.plan.pipeline_parallel)}  # _grad_task
        self.graph: ExecGraph | None = None

    # -- units of one pass --------------------------------------------------------------------
    def _pieces(self, stage: int, chunk: int, forward: bool) -> list[tuple[PassCost, Params]]:
        """(cost, parameters) of the units of one chunk pass, in execution order."""
        u = self.stage_units[stage]
        kinds = unit_kinds(self.job, stage, chunk)
        params = unit_params(self.job)
        units = [(u.forward(k) if forward else u.backward(k), params[k]) for k in kinds]
        return units if forward else units[::-1]

    def _segments_of(self, stage: int, chunk: int, forward: bool, split: str) -> list[tuple[PassCost, Params]]:
        """Segments of one chunk pass (the same for every micro-batch, hence cached). DP buckets of
        DDP and the distributed optimizer (ZeRO 0–1) as Megatron-Core makes them: only the first
        stage's first chunk is split; every later chunk and every other stage reduces (and gathers)
        its gradients in one bucket ('bucket_size = None' on pipeline ranks > 0, 'since data-parallel
        communication on these stages is not on the critical path'; training.py get_model:
        disable_bucketing for model chunks after the first, overlapped with compute anyway)."""
        return self._chunk_pass(stage, chunk, forward, split)[0]

    def _parts_of(self, key: SegmentKey) -> list[Part]:
        """The segment's runs between its host's waits (wait_parts)."""
        stage, chunk, forward, split, j = key
        return self._chunk_pass(stage, chunk, forward, split)[1][j]

    def _part_cost(self, key: PartKey) -> PassCost:
        return self._parts_of(key[:5])[key[5]][0]

    def _chunk_pass(self, stage: int, chunk: int, forward: bool, split: str) -> tuple[list[Segment], list[list[Part]]]:
        """Segments of one chunk pass (_segments_of) and their parts (_parts_of), cached."""
        if split == "bucket" and self.job.plan.zero_stage <= 1 and (stage > 0 or chunk > 0):
            split = "none"
        key = (stage, chunk, forward, split)
        found = self._segment_cache.get(key)
        if found is None:
            pieces = self._pieces(stage, chunk, forward)
            u = self.stage_units[stage]
            wait = u.moe_fwd_wait if forward else u.moe_bwd_wait
            waits = [wait if kind == "moe" else None for kind in unit_kinds(self.job, stage, chunk)]
            spans = self._spans(pieces, split)
            segments = [self._merged(pieces[start:end]) for start, end in spans]
            waits = waits if forward else waits[::-1]
            parts = [wait_parts([c for c, _ in pieces[start:end]], waits[start:end]) for start, end in spans]
            found = self._segment_cache[key] = segments, parts
        return found

    def _spans(self, pieces: list[Segment], split: str) -> list[tuple[int, int]]:
        """Runs of consecutive units: 'none' → one segment; 'layer' → one per unit; 'bucket' → DP buckets."""
        if split == "layer":
            return [(i, i + 1) for i in range(len(pieces))]
        if split == "bucket":
            return bucket_spans([sum(w) for _, w in pieces], self.job.plan.bucket_params)
        return [(0, len(pieces))]

    @staticmethod
    def _merged(pieces: list[Segment]) -> Segment:
        """One segment of consecutive units: their costs and parameters summed."""
        cost = ZERO_COST
        for c, _ in pieces:
            cost = cost + c
        return cost, (sum(w[0] for _, w in pieces), sum(w[1] for _, w in pieces))

    def _grad_task(self, stage: int, recipe: Recipe, name: str, split: str, after: int, kind: str) -> int:
        """A bucket's gradient reduction after task `after`: on the DP stream when overlapped, else (ZeRO-2's
        reductions without overlap, split 'none') blocking the compute stream. Its bucket's params join the
        stage's gradient-buffer passes (_buffer_passes)."""
        if recipe[0] == "dp":
            self._reduced[stage].append(recipe[3])
        stream = self.g.resource(stage, "dp_comm" if split != "none" else "compute")
        return self._task(recipe, name, stream, Category.COMMUNICATION, f"dp_{kind}", [after])

    def _buffer_passes(self, stage: int, after: list[int]) -> list[int]:
        """Megatron's gradient buffer on the compute stream once `after` have ended: the buffer zeroed
        (grad_buffer_zero_bytes), then each reduced bucket's norm and scaling (grad_bucket_pass_bytes; one rank:
        the whole buffer's norm). An approximation, written so that the fast path adds them as it adds the
        optimizer step: Megatron zeroes at the step's start (the same delay on stage 0, which every stage waits
        for) and runs a bucket's passes before its reduction (the same where the backward outlasts its
        reductions, each pass delaying its own bucket's; where the reductions outlast it, all but the first pass
        would hide behind them: over-counted by those). Returns [the last pass] or `after` where there is none."""
        job = self.job
        params = stage_params(job, stage)
        (expert_b, dense_b), comp = grad_bucket_pass_bytes(job, self.groups), self.g.resource(stage, "compute")
        buckets = self._reduced[stage] or [params]
        sizes = [grad_buffer_zero_bytes(job) * sum(params), *(e * expert_b + d * dense_b for e, d in buckets)]
        for i, nbytes in enumerate(b for b in sizes if b):
            recipe: Recipe = ("memory", stage, "elementwise", nbytes)
            after = [self._task(recipe, f"grad_buffer_pass.{i}", comp, Category.COMPUTE, "grad_buffer", after)]
            self._add_time(stage, "grad_buffer", self._priced[recipe])
        return after

    def _add_time(self, stage: int, family: str, seconds: float) -> None:
        """Add `seconds` to `family`'s time on `stage` (family_time_s)."""
        times = self.family_time_s[stage]
        times[family] = times.get(family, 0.0) + seconds

    def _run_segment(self, stage: int, name: str, key: SegmentKey, deps: list[int]) -> tuple[int, int]:
        """Launch on the host, then compute (+ blocking TP/CP comm) on the stream; (first, last) task,
        the first being what waits for the pass's input (_receive). A segment with MoE layers whose host waits
        (moe_wait_split) runs so part by part (_parts_of), the host waiting before a part (_host_wait).

        The host issues the segment's n kernels one by one, h seconds each, while the stream runs
        the ones already issued: the first kernel waits for its own launch only, the last for all n
        (host_launch_split). With n kernels of equal length c that is exact: the segment ends at
        max(h + n·c, n·h + c), GPU-bound or host-bound; kernels of unequal length are taken at their
        mean (an approximation). Under plan.cuda_launch_blocking every task waits for all the stage's
        earlier ones (_task): the segment takes n·h + its compute and communication, and its input is
        waited for by its first launch (the host's receive returns once the data is there)."""
        p = self.job.plan
        host, comp = self.g.resource(stage, "host"), self.g.resource(stage, "compute")
        kernels = Category.COMPUTE, "transformer"
        ends: list[int] = []  # each part's last task
        for i, (_, back) in enumerate(self._parts_of(key)):
            part, label = (*key, i), name if i == 0 else f"{name}.p{i}"
            if back:
                self._host_wait(stage, ends[-back])
            launch = Category.HOST, "host_launch"
            first_launch = self._task(("launch", part, "first"), f"launch.{label}", host, *launch)
            rest_launch = self._task(("launch", part, "rest"), f"launch.{label}.rest", host, *launch)
            waits = [first_launch, *(deps if i == 0 else ())]  # the pass's input and gathers: its first part
            body = self._task(("compute", part, "body"), label, comp, *kernels, waits)
            last = self._task(("compute", part, "last"), f"{label}.last", comp, *kernels, [rest_launch])
            if p.tensor_parallel > 1 or p.context_parallel > 1 or self.job.model.is_moe:
                last = self._task(("comm", part), f"{label}.tp_comm", comp, Category.COMMUNICATION, "tp_collective")
            if i == 0:
                first = first_launch if p.cuda_launch_blocking else body
            ends.append(last)
        return first, ends[-1]

    def _host_sync(self, stage: int) -> None:
        """torch.cuda.synchronize() on the stage's host: it returns once every task issued so far on the
        stage's device has ended (compute, DP and p2p streams: the last task of each), and whatever the
        host issues after it, the next launch and every later task of the stage (_task), waits for that
        (DESIGN.md §3 rule 4: a synchronisation is a host task, of no duration)."""
        self._host_waits_for(stage, "cuda_synchronize", list(self._tails[stage].values()))

    def _host_wait(self, stage: int, waited: int) -> None:
        """An MoE layer's host waits until `waited`, the compute stream's task that ends what the wait waits for
        (transformer_ops.moe_host_wait), has ended: Megatron-Core's d2h_event.synchronize() waits for the event's
        stream, the side stream where it was recorded after the compute stream's work; torchtitan's blocking
        copy to the host waits for the compute stream. Neither waits for the DP or p2p streams (unlike
        _host_sync's torch.cuda.synchronize). What the host issues after it waits for it (_task)."""
        self._host_waits_for(stage, "moe_host_wait", [waited])

    def _host_waits_for(self, stage: int, name: str, deps: list[int]) -> None:
        """A host task of no duration that waits for `deps`; every later task of the stage waits for it (_task)."""
        host = self.g.resource(stage, "host")
        self._synced[stage] = self._task(("sync", stage), name, host, Category.HOST, "host_sync", deps)

    # -- costing: a pass over recipes, so a built graph can be re-costed -------------------------
    def _task(
        self,
        recipe: Recipe,
        name: str,
        resource: int,
        category: Category,
        family: str,
        deps: list[int] | tuple[int, ...] = (),
        collective: int = -1,
    ) -> int:
        """A task whose duration comes from `recipe` (kept, so `recost` can price it again). Under
        plan.cuda_launch_blocking it also waits for the last task of each of its stage's resources: every
        launch returns only once its kernel has ended (CUDA C++ Programming Guide, Asynchronous Concurrent
        Execution: CUDA_LAUNCH_BLOCKING=1 disables the asynchronicity of kernel launches; PyTorch
        docs/source/notes/cuda.rst, Asynchronous execution: it forces synchronous computation), so a stage's
        host, compute, DP and p2p work run one at a time in the order issued (the graph's build order).
        Tasks with no launch of their own (collectives, sends, the optimizer) take no launch time here either."""
        self.recipes.append(recipe)
        seconds = self._priced.get(recipe)
        if seconds is None:  # recipes repeat across micro-batches: price each once
            seconds = self._priced[recipe] = self._seconds(recipe)
        stage = self.g.rank_of(resource)
        tails = self._tails[stage]
        if self.job.plan.cuda_launch_blocking:
            deps = [*deps, *tails.values()]
        if stage in self._synced:  # issued after the stage's last synchronisation returned
            deps = [*deps, self._synced[stage]]
        task = self.g.task(name, resource, seconds, category, family, deps, collective=collective)
        tails[resource] = task
        return task

    def _seconds(self, recipe: Recipe) -> float:
        """Seconds of one recipe under this builder's cost model."""
        kind, *args = recipe
        if kind in ("launch", "compute", "comm"):
            stage, cost = args[0][0], self._part_cost(args[0])
            if kind == "launch":
                first_s, rest_s = host_launch_split(cost.kernels, self.stage_gpus[stage].kernel_launch_overhead_s)
                return first_s if args[1] == "first" else rest_s
            if kind == "compute":
                body_share = (cost.kernels - 1) / cost.kernels if cost.kernels > 1 else 0.0
                return cost.compute_s * (body_share if args[1] == "body" else 1.0 - body_share)
            return cost.comm_s
        if kind == "sync":  # the host's wait is the edges', the call itself is not priced
            return 0.0
        if kind == "list_copies":  # _deepspeed_fetch: one copy launched per data-parallel rank and tensor
            return args[1] * self.groups.grad.size * self.stage_gpus[args[0]].kernel_launch_overhead_s
        costs = self.stage_costs[args[0]]
        if kind in ("dp_tensors", "list_turns"):  # DeepSpeed v0.3's ZeRO-3: one collective per tensor, in turn
            op, tensors, nbytes = args[1:]
            each_s = [costs.collective_s(op, n * nbytes, self.groups.grad) for n in tensors]
            if kind == "dp_tensors":
                return sum(each_s)
            # _deepspeed_fetch: Σ max(copies, collective) tensor by tensor, less the max of the two sums
            copies_s = self.groups.grad.size * self.stage_gpus[args[0]].kernel_launch_overhead_s
            return sum(max(c, copies_s) for c in each_s) - max(sum(each_s), len(tensors) * copies_s)
        if kind == "pipe_copy":
            return pipe_copy_s(costs, self.job, args[1])
        if kind == "collective":
            op, nbytes, group = args[1:]
            return costs.collective_s(op, nbytes, getattr(self.groups, group))
        if kind == "dp":
            return dp_collective_s(costs.collective_s, self.groups, *args[1:])
        if kind == "memory":
            return float(costs.memory_s(args[1], args[2]))
        if kind == "p2p_exchange":  # a send and a receive batched together: the longer of the two
            return max(self.p2p_s[args[0], args[1]], self.p2p_s[args[1], args[0]])
        return self.p2p_s[args[0], args[1]]  # "p2p": a send between device groups crosses nodes

    def expert_share(self) -> np.ndarray:
        """Per task of the built graph: the share of its duration spent in routed experts (their
        kernels, or on a communication task the expert all-to-alls and gathers): what the router's
        load imbalance scales. Zero everywhere for a dense model."""
        share = np.zeros(len(self.recipes))
        if not self.job.model.is_moe:
            return share
        for task, (kind, *args) in enumerate(self.recipes):
            if kind not in ("compute", "comm"):
                continue
            cost = self._part_cost(args[0])
            total = cost.compute_s if kind == "compute" else cost.comm_s
            if kind == "compute":
                part = cost.family_s.get("experts", 0.0)
            else:
                part = sum(v for f, v in cost.family_s.items() if f.startswith(("ep_", "etp_")))
            share[task] = min(part / total, 1.0) if total > 0 else 0.0  # a part's sums differ by rounding (__sub__)
        return share

    def family_shares(self) -> dict[str, np.ndarray]:
        """Per family, per task of the built graph, the share of the task's duration it takes: a
        compute segment split by its ops' compute families (gemm, attention, experts, ...), its
        blocking communication by its collectives (tp_reduce_scatter, ep_alltoall, ...; the
        PassCost.family_s of the segment), any other task wholly its own family (dp_reduce_scatter,
        pp_p2p, ...). What variability attributes the spread to."""
        if self.graph is None:
            raise ValueError("family_shares needs a built graph: call build() first")
        g, n = self.graph, len(self.recipes)
        out: dict[str, np.ndarray] = {}
        for task, (kind, *args) in enumerate(self.recipes):
            if kind == "launch":
                continue
            if kind in ("compute", "comm"):
                fams = self._part_cost(args[0]).family_s
                mine = {f: v for f, v in fams.items() if f.startswith(COMM_FAMILY_PREFIXES) == (kind == "comm")}
            else:
                mine = {g.families[g.family[task]]: 1.0}
            total = sum(mine.values())
            for family, seconds in mine.items():
                if total > 0:
                    out.setdefault(family, np.zeros(n))[task] = seconds / total
        return out

    def recost(self, costs: AnalyticCostModel) -> ExecGraph:
        """The built graph with every duration priced again by `costs` (another calibration, a
        re-score): same tasks and edges, no rebuild."""
        if self.graph is None:
            raise ValueError("recost needs a built graph: call build() first")
        other = TransformerStepBuilder(self.job, costs)
        priced = {r: other._seconds(r) for r in set(self.recipes)}
        return self.graph.with_durations(np.array([priced[r] for r in self.recipes]))

    # -- the step ------------------------------------------------------------------------------
    def build(self) -> ExecGraph:
        p = self.job.plan
        tied_sync = self.g.new_collective() if self.job.model.tied and p.pipeline_parallel > 1 else -1
        grad_norm = self.g.new_collective() if p.pipeline_parallel > 1 else -1
        for stage in range(p.pipeline_parallel):
            self._build_stage(stage, tied_sync, grad_norm)
        for key, consumer in self._waits:
            self.g.edge(self._sends[key], consumer)
        self.graph = self.g.build()
        return self.graph

    def _build_stage(self, stage: int, tied_sync: int, grad_norm: int) -> None:
        job = self.job
        p = job.plan
        pp, v = p.pipeline_parallel, p.virtual_pipeline
        passes = schedule(p.schedule, stage, pp, job.num_microbatches, v)
        last_bwd = {ps.chunk: i for i, ps in enumerate(passes) if not ps.forward}
        sync_dp = self.groups.grad.size > 1 or self.groups.expert_grad.size > 1
        dp_res = self.g.resource(stage, "dp_comm")
        grad_kind, gather_kind = grad_collective(job), param_collective(job)
        grad_bytes = p.grad_bytes
        w_bytes = weight_bytes(job)
        first_fwd_gathers: dict[int, list[int]] = {}
        if p.zero_stage in (1, 2) and sync_dp and p.overlap_param_gather:
            for chunk in range(v):  # last step's updated parameters, gathered during this forward
                first_fwd_gathers[chunk] = [
                    self._task(
                        ("dp", stage, gather_kind, w, w_bytes),
                        f"param_{gather_kind}.c{chunk}",
                        dp_res,
                        Category.COMMUNICATION,
                        f"dp_{gather_kind}",
                    )
                    for _, w in self._segments_of(stage, chunk, True, "bucket")
                ]
        grad_tasks: list[int] = []
        # Megatron-LM's align_grad_reduce (its default; training.py sets config.grad_sync_func to each chunk's
        # start_grad_sync): interleaved, a chunk's buckets all leave together, not one by one (the hooks'
        # own launches disabled), after the backward `stage` passes after the chunk's last one, "at the same
        # time across the pipeline-parallel group" (schedules.py backward_step_helper_postprocess:
        # virtual_microbatch_id - pipeline_parallel_rank); those past the last backward at the step's end
        # ("Launch any remaining grad reductions")
        aligned = v > 1 and p.zero_stage <= 1
        backward_ordinal = {i: k for k, i in enumerate(i for i, ps in enumerate(passes) if not ps.forward)}
        pending: dict[int, list[tuple[Recipe, str, str]]] = {}  # aligned: buckets by the backward they follow
        seen_first_fwd: set[int] = set()
        previous: list[int] = []  # the last compute task of each segment run so far
        # FSDP2 under torch.distributed.pipelining (config/plan.py pipelined_fsdp2): every backward runs with
        # set_requires_gradient_sync(False) into whole fp32 sums; the chunk's REDUCE_GRAD action, after its last
        # backward, reduce-scatters all its parameter groups, and the compute stream waits for them
        # (pipelining/stage.py perform_reduce_grad, fully_shard _root_post_backward_final_callback, torch 2.13)
        accumulating = bool(pipelined_fsdp2(p.grad_accumulation, pp, p.zero_stage))
        every = p.zero_stage >= 2 and not accumulating  # sharded gradients leave after every micro-batch
        # and runs every backward with set_reshard_after_backward(False): under ZeRO-3 (reshard after forward) a
        # chunk's parameters stay gathered from a backward to its next pass, which gathers nothing (memory.zero3_kept)
        kept: set[int] = set()
        keeps = bool(zero3_kept(p.grad_accumulation, pp, p.zero_stage))
        for i, ps in enumerate(passes):
            # Gradients leave after the last backward of each chunk; with sharded gradients
            # (ZeRO-2/3, FSDP) after every micro-batch's backward, as memory.py assumes.
            reduce_now = not ps.forward and sync_dp and (every or i == last_bwd[ps.chunk])
            gathers: list[int] = []  # one per bucket: each bucket's forward waits for its own
            first_forward = ps.forward and ps.chunk not in seen_first_fwd
            if first_forward:
                seen_first_fwd.add(ps.chunk)
                gathers = first_fwd_gathers.get(ps.chunk, [])
            if p.zero_stage == 3:
                split = "layer"
            elif gathers or (reduce_now and p.overlap_grad_reduce and not accumulating):
                split = "bucket"
            else:
                split = "none"
            segs = self._segments_of(stage, ps.chunk, ps.forward, split)
            kind = "F" if ps.forward else "B"
            fsdp: dict[int, int] = {}  # ZeRO-3: segment -> its parameter all-gather
            previous.extend(self._exchange(stage, passes, i))
            previous.extend(self._gather_received(stage, ps))
            if first_forward:
                previous.extend(self._weight_cast(stage, ps))
            per_tensor = p.zero_stage == 3 and sync_dp and p.zero3_collectives == "per_tensor_list"
            kinds = unit_kinds(job, stage, ps.chunk)[:: 1 if ps.forward else -1] if per_tensor else []
            leaving: list[tuple[Recipe, str, str]] = []  # aligned: the chunk's buckets, released at its end
            for j, (cost, params) in enumerate(segs):
                seg_deps = [gathers[j]] if gathers else []
                if per_tensor:
                    name = f"zero3_all_gather.{kind}{ps.microbatch}.c{ps.chunk}.{j}"
                    seg_deps.append(self._deepspeed_fetch(stage, name, params, kinds[j], ps.forward))
                elif p.zero_stage == 3 and sync_dp and ps.chunk not in kept:
                    # FSDP's prefetch (BACKWARD_PRE): the next unit's gather is issued before this
                    # unit runs, once the unit before it is done (two units gathered at most)
                    for k in (j, j + 1):
                        if k < len(segs) and k not in fsdp:
                            name = f"fsdp_all_gather.{kind}{ps.microbatch}.c{ps.chunk}.{k}"
                            fsdp[k] = self._gather(stage, name, segs[k][1], previous[-1:])
                    seg_deps.append(fsdp[j])
                key = (stage, ps.chunk, ps.forward, split, j)
                first, last = self._run_segment(stage, f"{kind}{ps.microbatch}.c{ps.chunk}.{j}", key, seg_deps)
                for fam, sec in cost.family_s.items():
                    self._add_time(stage, fam, sec)
                if j == 0:
                    self._receive(stage, ps, first)
                previous.append(last)
                if reduce_now and not accumulating and (split != "none" or p.zero_stage >= 2):
                    # overlapped: on the DP stream; not overlapped (ZeRO-2 only): blocking the compute stream
                    grad_recipe: Recipe = (
                        ("dp_tensors", stage, grad_kind, unit_tensors(job, kinds[j]), grad_bytes)
                        if per_tensor
                        else ("dp", stage, grad_kind, params, grad_bytes)
                    )
                    bucket = (grad_recipe, f"grad_{grad_kind}.m{ps.microbatch}.c{ps.chunk}.{j}", split)
                    if aligned:
                        leaving.append(bucket)
                    else:  # released as its bucket's backward ends (created now: a stream runs in creation order)
                        grad_tasks.append(self._grad_task(stage, *bucket, last, grad_kind))
            if self._amax:
                previous.append(self._amax_reduction(stage, ps, previous[-1]))
            if reduce_now and accumulating:  # the chunk's parameter groups at once, blocking the compute stream
                recipe: Recipe = ("dp", stage, grad_kind, self._merged(segs)[1], grad_bytes)
                name = f"grad_{grad_kind}.c{ps.chunk}"
                grad_tasks.append(self._grad_task(stage, recipe, name, "none", previous[-1], grad_kind))
            if leaving:
                pending.setdefault(backward_ordinal[i] + stage, []).extend(leaving)
            released = pending.pop(backward_ordinal[i], []) if not ps.forward else []
            grad_tasks += [self._grad_task(stage, *bucket, previous[-1], grad_kind) for bucket in released]
            self._send(stage, ps, previous[-1])
            if keeps and ps.forward:  # resharded after a forward
                kept.discard(ps.chunk)
            elif keeps:  # kept gathered after a backward
                kept.add(ps.chunk)
        previous.extend(self._exchange(stage, passes, len(passes)))
        end_of_passes = previous[-1]
        for ordinal in sorted(pending):  # the step's remaining grad reductions
            grad_tasks += [self._grad_task(stage, *bucket, end_of_passes, grad_kind) for bucket in pending[ordinal]]
        if sync_dp and not grad_tasks:  # no overlap: reduce all gradients after the last backward
            grad_tasks.append(
                self._task(
                    ("dp", stage, grad_kind, stage_params(job, stage), grad_bytes),
                    f"grad_{grad_kind}",
                    dp_res,
                    Category.COMMUNICATION,
                    f"dp_{grad_kind}",
                    [end_of_passes],
                )
            )
            self._reduced[stage].append(stage_params(job, stage))
        sync = [end_of_passes, *grad_tasks]
        if tied_sync >= 0 and stage in (0, p.pipeline_parallel - 1):
            vocab = p.local_vocab(job.model.vocab_size) * job.model.hidden_size
            sync.append(
                self._task(
                    ("collective", stage, "all_reduce", vocab * grad_bytes, "embedding"),
                    "tied_embedding_all_reduce",
                    dp_res,
                    Category.COMMUNICATION,
                    "embedding_all_reduce",
                    sync,
                    collective=tied_sync,
                )
            )
        comp = self.g.resource(stage, "compute")
        if grad_norm >= 0:
            sync = [
                self._task(
                    ("collective", stage, "all_reduce", GRAD_NORM_BYTES, "model"),
                    "grad_norm_all_reduce",
                    comp,
                    Category.COMMUNICATION,
                    "grad_norm_all_reduce",
                    sync,
                    collective=grad_norm,
                )
            ]
        sync = self._buffer_passes(stage, sync)
        optimizer_bytes = optimizer_step_bytes(job, local_optimizer_params(job, self.groups, stage_params(job, stage)))
        opt = self._task(
            ("memory", stage, "optimizer", optimizer_bytes),
            "optimizer_step",
            comp,
            Category.COMPUTE,
            "optimizer",
            sync,
        )
        if p.zero_stage in (1, 2) and sync_dp and not p.overlap_param_gather:
            self._task(
                ("dp", stage, gather_kind, stage_params(job, stage), w_bytes),
                f"param_{gather_kind}",
                dp_res,
                Category.COMMUNICATION,
                f"dp_{gather_kind}",
                [opt],
            )

    def _amax_reduction(self, stage: int, ps: Pass, after: int) -> int:
        """Transformer Engine 1.x DelayedScaling's amax reduction at the end of a chunk pass, blocking the compute
        stream (amax_reduction_bytes): forward at fp8_autocast's exit, which Megatron-Core enters once around a
        TransformerBlock's layers (after its last layer, before the pipeline send); backward at the end of the
        backward of the autocast's first FP8 module, the first layer's QKV (TE 1.11 fp8.py
        reduce_and_update_fp8_tensors, layernorm_linear.py _LayerNormLinear.backward). Each: the buffer's amax
        rows concatenated (torch.cat: read and write), all-reduced (MAX) over the stage's tensor × context ×
        data ranks with async_op=False (the stream waits for it), and the scales updated from the rolled
        histories of the chunk's operands (tex.fused_amax_and_scale_update_after_reduction, one kernel).
        Not modelled: TE ≤ 1.11 skips the backward one under full recompute (fixed in 1.12), FP8 parameters'
        second buffer and per-step reduction. Returns the last task."""
        fwd, bwd, updates = self._amax[stage]
        buffer = fwd if ps.forward else bwd
        comp = self.g.resource(stage, "compute")
        name = f"{'F' if ps.forward else 'B'}{ps.microbatch}.c{ps.chunk}"
        recipes: list[tuple[Recipe, str, Category]] = [
            (("memory", stage, "elementwise", 2 * buffer), "fp8_amax_cat", Category.COMPUTE),
            (("collective", stage, "all_reduce", buffer, "amax"), "fp8_amax_all_reduce", Category.COMMUNICATION),
            (("memory", stage, "elementwise", updates[ps.chunk]), "fp8_scale_update", Category.COMPUTE),
        ]
        for recipe, label, category in recipes:
            after = self._task(recipe, f"{label}.{name}", comp, category, "fp8_amax", [after])
            self._add_time(stage, "fp8_amax", self._priced[recipe])
        return after

    def _weight_cast(self, stage: int, ps: Pass) -> list[int]:
        """Transformer Engine's once-per-step FP8 weight casts of the chunk (weight_cast_bytes), on the
        compute stream once the chunk's first forward has its input: [] when there are none."""
        nbytes = weight_cast_bytes(self.job)[self._virtual(stage, ps.chunk)]
        if not nbytes:
            return []
        recipe: Recipe = ("memory", stage, "elementwise", nbytes)
        comp = self.g.resource(stage, "compute")
        task = self._task(recipe, f"fp8_weight_cast.c{ps.chunk}", comp, Category.COMPUTE, "fp8_weight_cast")
        self._receive(stage, ps, task)
        return [task]

    def _deepspeed_fetch(self, stage: int, name: str, params: Params, kind: str, forward: bool) -> int:
        """DeepSpeed ZeRO-3's fetch of one unit's parameters (v0.3.13: plan.zero3_collectives per_tensor_list),
        blocking: the host synchronises (partition_parameters.py _allgather_param: torch.cuda.synchronize() before each
        parameter's gather), issues one all-gather per parameter tensor into a list of world-size views, and
        synchronises again once they are done (stage3.py _synchronize_communication); the unit's compute is issued
        after. Each tensor's all-gather is a collective of its own, issued after the previous one ended (the synchronize
        waits for it): priced one by one on unit_tensors' sizes, each with its ring's latency (the "dp_tensors" recipe).
        PyTorch's ProcessGroupNCCL copies a list collective's every view apart, one copy kernel per data-parallel rank
        and tensor, the host launching each at the GPU's kernel_launch_overhead_s. Its `collective` runs `pre`, then
        enqueues the NCCL kernel, then `post`: an all-gather's copies out of its flat buffer are `post`, launched while
        the GPU gathers (a host task beside the gathers, both after the synchronisation); a reduce-scatter's copies
        into one are `pre`, launched before it. A backward also reduce-scatters each tensor's gradient so
        (_reduce_scatter_gradient; the graph's gradient task, one collective per tensor too): its copies are priced
        here, before the gathers. Tensor by tensor the host's copies and the gather overlap: the unit's tensors take
        Σ max(copies, gather), the gathers and the copies side by side (the max of their sums) and then the host's
        waits between tensors where one binds and the next the other (`list_turns`, the difference). The prefetch
        of the next unit is not priced apart (its gathers are issued after the same synchronisations), nor the
        Python loops that make the views. Returns the gather the unit's compute waits for."""
        self._host_sync(stage)
        tensors = unit_tensors(self.job, kind)
        host = self.g.resource(stage, "host")
        copies: Recipe = ("list_copies", stage, len(tensors))
        deps: list[int] = []
        if not forward:  # the gradients' reduce-scatter lists: copied in before each collective
            deps = [self._task(copies, f"scatter_copies.{name}", host, Category.HOST, "list_copies")]
        recipe: Recipe = ("dp_tensors", stage, "all_gather", tensors, weight_bytes(self.job))
        gather = self._task(
            recipe, name, self.g.resource(stage, "dp_comm"), Category.COMMUNICATION, "dp_all_gather", deps
        )
        self._task(copies, f"list_copies.{name}", host, Category.HOST, "list_copies", deps)
        turns: Recipe = ("list_turns", stage, "all_gather", tensors, weight_bytes(self.job))
        self._task(turns, f"list_turns.{name}", host, Category.HOST, "list_copies", [gather])
        self._host_sync(stage)
        return gather

    def _gather(self, stage: int, name: str, params: Params, deps: list[int]) -> int:
        """A ZeRO-3 parameter all-gather of `params` on the stage's DP stream."""
        recipe: Recipe = ("dp", stage, "all_gather", params, weight_bytes(self.job))
        return self._task(
            recipe, name, self.g.resource(stage, "dp_comm"), Category.COMMUNICATION, "dp_all_gather", deps
        )

    # -- pipeline p2p --------------------------------------------------------------------------
    def _virtual(self, stage: int, chunk: int) -> int:
        return chunk * self.job.plan.pipeline_parallel + stage

    def _receive(self, stage: int, ps: Pass, consumer: int) -> None:
        """This pass's first compute task waits for the matching send (the edge is added in build)."""
        if self.job.plan.blocking_p2p:
            return  # _exchange
        vs = self._virtual(stage, ps.chunk)
        total = self.job.plan.pipeline_parallel * self.job.plan.virtual_pipeline
        src = vs - 1 if ps.forward else vs + 1
        if 0 <= src < total:
            self._waits.append(((ps.forward, src, ps.microbatch), consumer))

    def _gather_received(self, stage: int, ps: Pass) -> list[int]:
        """Overlapped exchanges (not blocking_p2p: Megatron's interleaved schedule) where Megatron-LM scatters its
        sends (scatter_gathered): the all-gather of the pass's input on the compute stream before it, once the
        matching send has arrived (the edge is added in build, as _receive's); [] otherwise."""
        if self.job.plan.blocking_p2p or not scatter_gathered(self.job):
            return []
        vs = self._virtual(stage, ps.chunk)
        src = vs - 1 if ps.forward else vs + 1
        if not 0 <= src < self.job.plan.pipeline_parallel * self.job.plan.virtual_pipeline:
            return []
        gather = self._scatter_gather(stage, (ps.forward, src, ps.microbatch))
        self._waits.append(((ps.forward, src, ps.microbatch), gather))
        return [gather]

    def _send(self, stage: int, ps: Pass, after: int) -> None:
        """An overlapped send: on the stage's p2p stream once `after` has ended."""
        if self.job.plan.blocking_p2p:
            return  # _exchange
        vs = self._virtual(stage, ps.chunk)
        total = self.job.plan.pipeline_parallel * self.job.plan.virtual_pipeline
        dst = vs + 1 if ps.forward else vs - 1
        if not 0 <= dst < total:
            return
        res = self.g.resource(stage, "p2p_next" if ps.forward else "p2p_prev")
        send = self._task(
            ("p2p", stage, dst % self.job.plan.pipeline_parallel),
            f"send_{'act' if ps.forward else 'grad'}.m{ps.microbatch}.c{ps.chunk}",
            res,
            Category.COMMUNICATION,
            "pp_p2p",
            [after],
        )
        self._sends[(ps.forward, vs, ps.microbatch)] = send

    def _exchange(self, stage: int, passes: list[Pass], i: int) -> list[int]:
        """Blocking exchanges (PlanConfig.blocking_p2p): the tasks run on the compute stream before pass i
        (i = len(passes): after the last), in order; [] otherwise. DeepSpeed's pipe engine below,
        Megatron-Core's in _megatron_exchange.

        TrainSchedule (deepspeed/runtime/pipe/schedule.py at 3401d2516) runs forward m of stage s at
        step 2m + s and backward m at step 2m + 2p − s − 1 (_step_to_micro_batch); a pass's output
        leaves at the stage's next step, its input arrives at its own step: within one step a forward
        receives and then sends, a backward sends and then receives. Each is a blocking dist.send /
        dist.recv (p2p.py: async_op False): the compute stream waits for the transfer, whose two ends
        meet (a two-member collective). Where it partitions (pipe_partitioned) the pass then all-gathers what
        came partitioned over its tensor-parallel group (engine.py _exec_forward_pass: the input;
        _exec_backward_pass: its own output, cleared after sending, and the gradient). Pass orders agree with
        Megatron's 1F1B."""
        p = self.job.plan
        if not p.blocking_p2p or p.pipeline_parallel == 1:
            return []
        if p.pipeline_p2p == "megatron" and p.schedule == "1f1b":
            return self._megatron_exchange(stage, passes, i)
        if p.pipeline_p2p == "megatron":
            return self._interleaved_exchange(stage, passes, i)
        pp = p.pipeline_parallel

        def step(ps: Pass) -> int:
            return 2 * ps.microbatch + (stage if ps.forward else 2 * pp - stage - 1)

        prev, cur = passes[i - 1] if i > 0 else None, passes[i] if i < len(passes) else None
        ops: list[tuple[bool, bool, int]] = []  # (sending, forward direction, micro-batch)
        if prev is not None and 0 <= stage + (1 if prev.forward else -1) < pp:
            ops.append((True, prev.forward, prev.microbatch))
        if cur is not None and 0 <= stage + (-1 if cur.forward else 1) < pp:
            receive = (False, cur.forward, cur.microbatch)
            forward_after = prev is not None and cur.forward and step(cur) == step(prev) + 1
            ops = [receive, *ops] if forward_after else [*ops, receive]
        comp = self.g.resource(stage, "compute")
        tp = pipe_partitioned(self.job)
        tasks = []  # in stream order: an activation is partitioned at the end of its forward, a gradient as sent
        if tp and prev is not None and prev.forward and (True, True, prev.microbatch) in ops:
            tasks.append(self._pipe_copy(stage, "partition", f"F{prev.microbatch}"))
        for sending, fwd, m in ops:
            if tp and sending and not fwd:
                tasks.append(self._pipe_copy(stage, "partition", f"B{m}"))
            tasks.append(
                self._transfer(stage, comp, ((fwd, stage if sending else stage - 1 if fwd else stage + 1, m),))
            )
            if not sending and fwd:
                tasks.append(self._pipe_copy(stage, "receive", f"F{m}"))
        if cur is not None and cur.forward and stage > 0:
            tasks.append(self._pipe_copy(stage, "receive", f"F{cur.microbatch}"))  # _exec_forward_pass's clone
        if cur is not None and tp:
            gathers = (1 if stage > 0 else 0) if cur.forward else (2 if stage < pp - 1 else 0)
            name = f"{'F' if cur.forward else 'B'}{cur.microbatch}"
            for _ in range(gathers):
                tasks.append(self._pipe_all_gather(stage, name))
                tasks.append(self._pipe_copy(stage, "gather", name))
        return tasks

    def _pipe_copy(self, stage: int, site: str, name: str) -> int:
        """DeepSpeed's device copies of one `site` (pipe_copy_bytes) on the compute stream (_exchange)."""
        comp = self.g.resource(stage, "compute")
        return self._task(("pipe_copy", stage, site), f"pipe_copy.{site}.{name}", comp, Category.COMPUTE, "pipe_copy")

    def _megatron_exchange(self, stage: int, passes: list[Pass], i: int) -> list[int]:
        """Megatron-Core's 1F1B (schedules.py forward_backward_pipelining_without_interleaving at
        NVIDIA/Megatron-LM d98e8a64): after a pass the stage sends its output to the neighbour it goes
        to; when the next pass's input comes from that same neighbour the send and that receive are one
        batched exchange (send_forward_recv_backward after a steady-state forward,
        send_backward_recv_forward after a backward), else the send goes alone (warm-up send_forward,
        cool-down send_backward) and the receive follows on its own (recv_forward, recv_backward).
        Each blocks the compute stream until done (p2p_communication.py _communicate: req.wait()), and the host
        then waits for the whole device (_host_sync): _communicate calls torch.cuda.synchronize() after every
        exchange when config.batch_p2p_comm and config.batch_p2p_sync, which is 1F1B's case (model_parallel_config.py:
        batch_p2p_sync True by default, set by no launcher; batch_p2p_comm = not overlap_p2p_comm in
        training/argument_utils.py core_transformer_config_from_args, overlap_p2p_comm forced off without
        interleaving by arguments.py validate_args; Megatron-Bridge 5776a6d9 comm_overlap.py
        CommOverlapConfig._get_model_comm_overlap_cfgs: batch_p2p_comm True for pp > 1 without VP). Its next
        launch is exposed: the pass after an exchange takes max(h + its compute, n·h + its last kernel).
        Megatron-LM's scatter-gather (scatter_gathered) then all-gathers what came, after the synchronize
        (_scatter_gather)."""
        pp = self.job.plan.pipeline_parallel
        prev, cur = passes[i - 1] if i > 0 else None, passes[i] if i < len(passes) else None
        send = recv = None
        if prev is not None and 0 <= stage + (1 if prev.forward else -1) < pp:
            send = (prev.forward, stage, prev.microbatch)
        if cur is not None and 0 <= stage + (-1 if cur.forward else 1) < pp:
            recv = (cur.forward, stage - 1 if cur.forward else stage + 1, cur.microbatch)
        # the same neighbour: a forward's output goes where the gradient comes from, except after the
        # last warm-up forward of a stage without a steady state (M ≤ p − s − 1: cool-down recv_backward)
        steady = prev is not None and (not prev.forward or self.job.num_microbatches > pp - stage - 1)
        if send and recv and send[0] != recv[0] and steady:
            exchanges: list[tuple[Message, ...]] = [(send, recv)]
        else:
            exchanges = [(m,) for m in (send, recv) if m]
        comp = self.g.resource(stage, "compute")
        transfers = []
        for messages in exchanges:  # one _communicate, one synchronize, per exchange
            transfers.append(self._transfer(stage, comp, messages))
            self._host_sync(stage)
            if recv in messages and scatter_gathered(self.job):
                transfers.append(self._scatter_gather(stage, recv))
        return transfers

    def _interleaved_exchange(self, stage: int, passes: list[Pass], i: int) -> list[int]:
        """Megatron's interleaved schedule without overlap_p2p_comm (PlanConfig.overlap_p2p_comm false;
        schedules.py forward_backward_pipelining_with_interleaving at de7dc40f, the same calls in Megatron-Core
        d98e8a64 under batch_p2p_comm): an exchange point before the first forward (recv_forward, none on the
        first stage), after each warm-up forward (send_forward_recv_forward; the last one
        send_forward_backward_recv_forward_backward), after each steady forward-backward pair
        (send_forward_backward_recv_forward_backward) and after each cool-down backward
        (send_backward_recv_backward). Each point is one _communicate: the outputs of the stage's passes since
        the last point go out and the inputs of its passes until the next come in (from and to virtual stages
        ∓ 1, the last GPU's next being the first's), one batch_isend_irecv with both neighbours that the compute
        stream waits for whole (req.wait()), then torch.cuda.synchronize(), with or without messages (its
        batch_p2p_sync), then with scatter-gather each received tensor all-gathered (_scatter_gather). A message
        runs on a stream of its own at either end, a two-member collective (NCCL: a send completes once its
        receive is posted, and the other way round), every message of a point at once, after the compute issued
        before it (ProcessGroupNCCL's stream waits for it); the compute stream then waits for them all (a task
        of no duration). Messages are (forward, sending virtual stage, micro-batch) here."""
        p = self.job.plan
        pp, total = p.pipeline_parallel, p.pipeline_parallel * p.virtual_pipeline
        warmup = interleaved_warmup(stage, pp, self.job.num_microbatches, p.virtual_pipeline)
        steady_end = 2 * p.virtual_pipeline * self.job.num_microbatches - warmup  # past the last steady pair

        def paired(k: int) -> bool:  # pass k is the backward of a steady pair
            return warmup <= k < steady_end and (k - warmup) % 2 == 1

        if i < len(passes) and paired(i):
            return []  # a steady pair's forward and backward run back to back
        sent = [k for k in (i - 2, i - 1) if k >= 0 and (k == i - 1 or paired(i - 1))]
        received = [k for k in (i, i + 1) if k < len(passes) and (k == i or paired(i + 1))]
        messages: list[tuple[Message, bool]] = []  # (message, this stage sends it)
        for k in sent:
            ps = passes[k]
            vs = self._virtual(stage, ps.chunk)
            if 0 <= (vs + 1 if ps.forward else vs - 1) < total:
                messages.append(((ps.forward, vs, ps.microbatch), True))
        for k in received:
            ps = passes[k]
            vs = self._virtual(stage, ps.chunk)
            src = vs - 1 if ps.forward else vs + 1
            if 0 <= src < total:
                messages.append(((ps.forward, src, ps.microbatch), False))
        if i == 0 and not messages:
            return []  # recv_forward on the first stage calls no _communicate
        comp = self.g.resource(stage, "compute")
        issued = [self._tails[stage][comp]] if comp in self._tails[stage] else []
        ends = []
        for message, sending in messages:
            forward, src, micro = message
            dst = src + 1 if forward else src - 1
            to_next = forward == sending  # a forward leaves for the next GPU, a gradient arrives from it
            stream = self.g.resource(stage, ("p2p_next" if to_next else "p2p_prev") + ("" if sending else "_recv"))
            if (message,) not in self._pairs:
                self._pairs[(message,)] = self.g.new_collective()
            recipe: Recipe = ("p2p", src % pp, dst % pp)
            name = f"{'send' if sending else 'recv'}_{'act' if forward else 'grad'}.m{micro}.v{src}"
            task = self._task(recipe, name, stream, Category.COMMUNICATION, "pp_p2p", issued, self._pairs[(message,)])
            ends.append(task)
        waited = self._task(("sync", stage), f"p2p_wait.{i}", comp, Category.COMMUNICATION, "pp_p2p", ends)
        self._host_sync(stage)
        arrived = [m for m, sending in messages if not sending] if scatter_gathered(self.job) else []
        return [waited, *(self._scatter_gather(stage, m) for m in arrived)]

    def _scatter_gather(self, stage: int, message: Message) -> int:
        """Megatron-LM's all-gather of a message that came scattered (scatter_gathered; p2p_communication.py
        _communicate at 50a4b5fa: mpu.gather_split_1d_tensor of each received tensor, after the exchange's
        torch.cuda.synchronize)."""
        forward, src, micro = message
        return self._pipe_all_gather(stage, f"{'act' if forward else 'grad'}.m{micro}.from{src}")

    def _pipe_all_gather(self, stage: int, name: str) -> int:
        """The whole stage output all-gathered over the receiving stage's tensor-parallel group on its compute
        stream: a pipeline message that came in 1/tp parts (DeepSpeed's partitioned transfers, Megatron-LM's
        scatter-gather)."""
        recipe: Recipe = ("collective", stage, "all_gather", stage_output_bytes(self.job), "tp")
        comp = self.g.resource(stage, "compute")
        return self._task(recipe, f"pipe_all_gather.{name}", comp, Category.COMMUNICATION, "tp_all_gather")

    def _transfer(self, stage: int, comp: int, messages: tuple[Message, ...]) -> int:
        """This stage's end of one blocking exchange on its compute stream (_exchange): one message
        (forward, sending stage, micro-batch), or a send and a receive with one neighbour run as one
        batch (NCCL group), both directions at once. Both ends are one two-member collective, as long
        as its longer message."""
        key = tuple(sorted(messages))
        if key not in self._pairs:
            self._pairs[key] = self.g.new_collective()
        ends = [(src, src + 1 if forward else src - 1) for forward, src, _ in key]
        recipe: Recipe = ("p2p", *ends[0]) if len(ends) == 1 else ("p2p_exchange", *ends[0])
        name = "+".join(
            f"{'send' if src == stage else 'recv'}_{'act' if forward else 'grad'}.m{micro}"
            for forward, src, micro in messages
        )
        return self._task(recipe, f"{name}.c0", comp, Category.COMMUNICATION, "pp_p2p", collective=self._pairs[key])
