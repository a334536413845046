"""The ops of one transformer layer (and of the embedding and the head) on one GPU, per micro-batch.

Shapes follow Megatron-LM (Shoeybi et al. 2019; Narayanan et al. SC'21; Korthikanti et al. 2022):
with t = tensor_parallel, c = context_parallel, b = micro_batch_size, s = seq_length / c tokens
per rank, h = hidden, f = ffn, a heads, g key/value groups, d = model.head_dim (h / a unless set),
e = bytes per activation.
GEMM FLOPs are 2·m·n·k. Backward: every GEMM becomes two of the same FLOPs (data and weight
gradients); fused attention's backward does 2.5× its forward FLOPs (5 matmuls instead of 2,
FlashAttention-2); memory-bound ops move twice their forward bytes.

Tensor parallelism is Megatron's f and g operators around each parallel region (Shoeybi et al.
§3; Korthikanti et al. §4.2.2 with sequence parallelism). The f before a column-parallel GEMM
(QKV, MLP up, logits) is an identity forward and an all-reduce of the input gradient backward,
or with sequence parallelism an all-gather forward and, backward, a re-gather of the saved
sharded input plus a reduce-scatter of the input gradient. The g after a row-parallel GEMM is an
all-reduce forward and an identity backward, or a reduce-scatter forward and an all-gather
backward. So with sequence parallelism one layer runs 2 all-gathers + 2 reduce-scatters forward
and 4 all-gathers + 2 reduce-scatters backward (Korthikanti §4.2.2). Megatron-LM's
LinearWithGradAccumulationAndAsyncCommunication issues the f's backward collectives
asynchronously: the re-gather hides behind the data-gradient GEMM, the input-gradient reduction
behind the weight-gradient GEMM (`Op.overlaps`); its all-reduce (no sequence parallelism) only
where that path is taken (plan.tp_allreduce_overlap: not before Megatron-LM 2021-09, nor under
Megatron-DeepSpeed), else after the weight-gradient GEMM. With plan.tp_comm_overlap (Megatron-Core
--tp-comm-overlap: Transformer Engine's userbuffers split the GEMM and exchange chunks as it
runs) the forward all-gather hides behind the column-parallel GEMM it feeds and the forward
reduce-scatter behind the row-parallel GEMM before it, whose data-gradient GEMM then hides the
backward all-gather. These split the GEMM into chunks, each chunk's communication beside the next
chunk's GEMM (`Op.chunked`, transformer.pass_cost): ring exchange in t chunks (the all-gathers, and
the reduce-scatter with plan.tp_comm_overlap_rs ring_exchange), pipeline in TE_PIPELINE_SPLITS (the
reduce-scatter by default). The data-gradient GEMMs' re-gather and the weight-gradient GEMMs'
reduce-scatter run beside the whole GEMM (TE's bulk method) and cost only their excess.

FP8 training (Transformer Engine's fp8_autocast) runs the GEMMs of its modules in FP8: the layers'
projections and MLPs, shared and routed experts. Megatron-Core's output layer (its own
ColumnParallelLinear), the MoE router (a plain linear) and unfused attention's batched GEMMs are
not Transformer Engine modules (no `Op.kn`) and stay in bf16 (`Op.te`), as fused attention does
(costs/analytic.py). Each FP8 GEMM's input, and backward its output gradient, is cast to FP8 with
its transpose (Transformer Engine's cast-transpose kernels, memory-bound: `fp8_casts`); current
scaling recipes add an amax pass and reduction (plan.fp8_recipe, `fp8_cast_bytes`, `fp8_cast_kernels`);
the weights are cast once per step (Transformer Engine: `weight_cast_step_bytes`, priced by the
step graph) or on every micro-batch (torchao: `_weight_casts`), plan.fp8_weight_cast; experts pad
their rows to the FP8 GEMM's alignment (`_expert_copies`).

Mixture of experts (Megatron-Core's MoE layer with the all-to-all token dispatcher; Shoeybi et
al.'s successors, Megatron-Core MoE docs): the n tokens of a rank (sequence parallel: b·s/(c·t))
go through the router (hidden × experts GEMM, fp32 softmax and top-k), are permuted and sent to
their experts' ranks by an all-to-all over the expert-parallel group (n·k rows of h), gathered
over the expert-tensor-parallel group, run through the rank's num_experts / EP experts (one GEMM
per expert: per-expert shapes set the efficiency; grouped or one expert after the other,
plan.moe_grouped_gemm), reduce-scattered, sent back and un-permuted.
The busiest rank sets the pace: with a capacity factor and padding every expert processes exactly
its capacity (cf × an even share); dropless, the router's imbalance (model.moe_token_imbalance)
scales the rows; with a capacity but no padding, the imbalance up to the capacity. Shared experts
are a tensor-parallel MLP that runs beside the dispatch and combine (Megatron-Core
--moe-shared-expert-overlap); plan.moe_a2a_overlap hides the all-to-alls behind attention instead.
DeepSpeed's MoE layer (plan.moe_token_dispatcher einsum) dispatches and combines by matmuls over a one-hot
tokens × experts × capacity tensor, or from v0.19.4 by index gathers, instead (`_deepspeed_moe_block`).
torchtitan's under tensor parallelism gathers the layer's tokens over the tensor-parallel ranks first and
reduce-scatters its output after (`_titan_moe_tp`).

Norms, rotary embeddings and the gated activation are one fused kernel each (Transformer Engine, Apex,
Megatron-Core), or with plan.pointwise_kernels eager the op-by-op chains of torchtitan's
model code without torch.compile (`eager_rmsnorm_cost`, `eager_rotary_cost`, `eager_swiglu_cost`,
`_repeat_kv`; a llama model's RMSNorms, the dense and shared-expert SwiGLU, not the routed experts'), or with
compiled those of its rotary embedding and repeat_kv alone (`_complex_rotary`).
Recomputation re-runs the same chains.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from itercast.config.model import ModelConfig, expert_hit_chance
from itercast.config.plan import PlanConfig
from itercast.config.system import SystemConfig, renamed_gpu_note
from itercast.costs.analytic import unmeasured_network_note
from itercast.costs.attention import AttentionShape

COMPUTE_FAMILIES = ("gemm", "attention", "elementwise", "norm", "activation")
COMM_FAMILIES = ("tp_comm", "ep_comm")
CORE_ATTENTION = "core_attention"  # name prefix of the attention kernels' ops
#: name prefixes of what Megatron's selective recompute re-runs: the attention kernels and the
#: context-parallel ring that feeds them (layer_backward)
CORE_ATTENTION_RUN = (CORE_ATTENTION, "cp_kv_")


@dataclass(frozen=True)
class Op:
    """One kernel (or one collective). `amount` is FLOPs for gemm/attention, bytes otherwise.

    `count`: a GEMM or a ring step runs `count` times, `amount` each; a memory-bound op launches
    `count` kernels that move `amount` bytes together (transformer.pass_cost prices them as one pass
    over those bytes; every kernel is launched by the host)."""

    name: str
    family: str  # gemm | attention | elementwise | norm | activation | tp_comm | ep_comm | cp_comm
    amount: float  # of one repetition
    # all_reduce | all_gather | reduce_scatter | alltoall; cp_comm: p2p (ring) | send (exposed); "": a view forward
    # whose backward runs backward_comm (DeepSpeed's drop_tokens)
    comm_kind: str = ""
    count: int = 1  # repetitions (ring steps, one GEMM per local expert) or a memory-bound op's kernels
    # a communication op: the name of the kernel it runs beside (exposed: the excess), or of several joined by
    # "+" (it runs beside all of them: their summed time)
    overlaps: str = ""
    overlaps_backward: bool = True  # its backward collective runs beside those kernels' backward (False: forward only)
    backward_comm: str = ""  # a forward collective: the collective its backward runs ("" = identity)
    f_bytes: float = 0.0  # a column-parallel GEMM: bytes of the f operator's collective before it
    group: str = "tp"  # a collective's process group: tp | ep (expert parallel) | etp (expert tensor parallel)
    label: str = ""  # the family it is reported under, when not `family` (routed experts: "experts")
    kn: tuple[float, ...] = ()  # a Transformer Engine GEMM's inner and output widths (its FP8 casts)
    backward_amount: float = -1.0  # a memory-bound op whose backward moves other than twice its bytes (0: none)
    backward_count: int = 0  # a memory-bound op whose backward launches other than `count` kernels
    attention: AttentionShape | None = None  # a fused attention kernel's shape (its efficiency)
    sm_margin: int = 0  # a TP collective under tp_comm_overlap: SMs it takes from the GEMM it overlaps
    # a TP collective under tp_comm_overlap that splits the GEMM it overlaps: ring_exchange | pipeline
    chunked: str = ""
    # an expert all-to-all that sends a token once per rank or node its experts are on (experts per token,
    # experts): dispatch_share of `amount` crosses the links
    dedup: tuple[int, int] | tuple[()] = ()
    # a GEMM run as separate matmuls, these shares of `amount` each (plan.projections separate: wq, wk, wv;
    # w1, w3), each priced on its own FLOPs; () one GEMM
    parts: tuple[float, ...] = ()
    # a memory-bound op that reaches this share of its curve's bandwidth (torchao's row-wise FP8 casts:
    # ROWWISE_CAST_BANDWIDTH_SHARE; transformer.pass_cost prices amount / bandwidth_share bytes), or a chunked
    # reduce-scatter whose final sum does (PyTorch's async TP: ASYNC_TP_SUM_BANDWIDTH_SHARE, transformer._beside_s)
    bandwidth_share: float = 1.0
    # a memory-bound op whose backward reaches another share of its curve's bandwidth (0: bandwidth_share)
    backward_share: float = 0.0
    # a GEMM whose second operand takes a gradient too (False: DeepSpeed's dispatch einsum, whose one-hot mask
    # needs none: its backward is the input's gradient alone)
    weight_grad: bool = True

    @property
    def te(self) -> bool:
        """A GEMM of a Transformer Engine module (it has `kn`): FP8 under fp8 training."""
        return bool(self.kn)


@dataclass(frozen=True)
class Shapes:
    """Per-rank sizes of one micro-batch."""

    tokens: float  # b · s / c
    sp_tokens: float  # tokens / t with sequence parallelism (norms, dropout, residual), else tokens
    seq_local: float
    seq_full: float
    t: int
    e: int

    @classmethod
    def of(cls, model: ModelConfig, plan: PlanConfig) -> Shapes:
        s_loc = model.seq_length / plan.context_parallel
        tokens = plan.micro_batch_size * s_loc
        sp = tokens / plan.tensor_parallel if plan.sequence_parallel else tokens
        return cls(tokens, sp, s_loc, model.seq_length, plan.tensor_parallel, plan.dtype_bytes)


def _f(name: str, nbytes: float, plan: PlanConfig) -> list[Op]:
    """Megatron's f before a column-parallel GEMM: forward, an all-gather with sequence parallelism
    (its backward runs with the GEMM's backward, `backward_of`), else nothing; under DTensor's layout
    (`_dim1_copies`) the gathered tensor copied once more, and its backward's reduce-scatter input."""
    if plan.tensor_parallel == 1 or not plan.sequence_parallel:
        return []
    moved = _float8_gathered(nbytes, plan)
    gather = Op(f"{name}.all_gather", "tp_comm", moved, "all_gather")
    if not _dim1_copies(plan):
        return [gather]
    # the forward's cat copies what the all-gather moved; its backward, the 16-bit gradient's chunks
    return [gather, Op(f"{name}.cat", "elementwise", 2 * moved, backward_amount=2 * nbytes)]


def _float8_gathered(nbytes: float, plan: PlanConfig) -> float:
    """Bytes a sequence-parallel all-gather before a column-parallel GEMM moves: under DTensor's layout with
    float8 tensorwise, torchao's Float8ColwiseParallel and PrepareFloat8ModuleInput cast the local shard to
    float8 first and gather that (torchao/float8/float8_tensor_parallel.py: 'all-gather in float8'), 1 byte an
    element of the `nbytes` 16-bit tensor; else `nbytes`. The input gradients' collectives stay 16-bit."""
    if plan.tp_layout == "dtensor" and plan.dtype == "fp8" and plan.fp8_recipe == "tensorwise":
        return nbytes / plan.dtype_bytes
    return nbytes


def _g(name: str, nbytes: float, plan: PlanConfig) -> list[Op]:
    """Megatron's g after a row-parallel GEMM: all-reduce forward (identity backward), or with
    sequence parallelism reduce-scatter forward, all-gather backward; under DTensor's layout
    (`_dim1_copies`) the reduce-scatter's input copied once more first, and its backward's gathered output."""
    if plan.tensor_parallel == 1:
        return []
    if plan.sequence_parallel:
        scatter = Op(f"{name}.reduce_scatter", "tp_comm", nbytes, "reduce_scatter", backward_comm="all_gather")
        if not _dim1_copies(plan):
            return [scatter]
        return [Op(f"{name}.chunk_cat", "elementwise", 2 * nbytes, backward_amount=2 * nbytes), scatter]
    return [Op(f"{name}.all_reduce", "tp_comm", nbytes, "all_reduce")]


def _dim1_copies(plan: PlanConfig) -> bool:
    """plan.tp_layout dtensor with vanilla TP: torchtitan shards the [b, s, h] activations on the sequence, dim 1
    (parallelize_llama.py SequenceParallel Shard(1)), and PyTorch's functional collectives gather and scatter
    along dim 0, so one off it costs a chunk and a cat of the whole tensor (_functional_collectives.py
    all_gather_tensor / reduce_scatter_tensor; torchtitan#437: 'an extra aten.cat after each collective'), read
    and written once: 2 × its bytes. A micro-batch of one sequence is a view instead. Async TP (tp_comm_overlap)
    fuses them with its GEMMs (torch/_inductor/fx_passes/micro_pipeline_tp.py): not priced apart, but for the
    input gradients' reduce-scatters, which follow a sum, not a matmul (`backward_of`)."""
    return plan.tp_layout == "dtensor" and not plan.tp_comm_overlap and plan.micro_batch_size > 1


#: Share of the elementwise curve's bandwidth an unfused attention's row-wise softmax reaches (scores read and
#: probabilities written forward; probabilities and their gradient read, the scores' gradient written backward):
#: MEASURED, this project's H100 profile (data/measured/h100_profile.db, aten::_softmax and
#: aten::_softmax_backward_data in fp32, caches flushed), the median over its 6 configurations of rows of 512 to
#: 4,096 elements and 64 MiB or more of (bytes / time / HBM) over the elementwise curve there: forward 0.71-0.89
#: of HBM (median 0.72), backward 0.40-0.46 (median 0.445); `python -c "import sys; sys.path.insert(0, 'tools');
#: from fit_efficiency_curves import h100_softmax_shares; print(h100_softmax_shares())"`. Taken for Megatron's
#: fused scale-mask-softmax kernels in 16-bit and on every GPU, as every memory curve's fraction is (not
#: measured). Until session 44 the softmax was priced on the norm curve (vidur's RMSNorm, 0.40 of HBM), its
#: backward as twice the forward's bytes.
SOFTMAX_BANDWIDTH_SHARE = {"fwd": 0.805, "bwd": 0.493}


def _core_attention(model: ModelConfig, plan: PlanConfig, sh: Shapes, windowed: bool = False) -> list[Op]:
    """Attention scores and values: one fused kernel that computes only the query-key pairs the mask
    lets through (FlashAttention: the causal half; a sliding window, `windowed`, the pairs of
    ModelConfig.causal_keys_per_query, its block-skipping of window_size = (W − 1, 0)), or unfused,
    two batched GEMMs over the full s×s scores (masked, not skipped) with softmax (and dropout,
    where the family has it) between them, each reading and writing the b·(a/t)·s² scores
    (Korthikanti §4.1), the softmax at SOFTMAX_BANDWIDTH_SHARE of the elementwise bandwidth. Under
    context parallelism each rank holds 1/c of the pairs (load-balanced chunks, `_cp_attention`)."""
    a, t, e = model.num_attention_heads, sh.t, sh.e
    heads = plan.micro_batch_size * a / t
    scores = heads * sh.seq_local * sh.seq_full
    qk, av = 2.0 * scores * model.qk_head_dim, 2.0 * scores * model.value_head_dim  # QKᵀ, AV
    if plan.flash_attention:
        kept = model.causal_keys_per_query(windowed) / sh.seq_full if model.causal else 1.0
        d = (model.qk_head_dim + model.value_head_dim) / 2  # 4·d FLOPs per query-key score
        shape = AttentionShape(heads, d, model.causal, kernel=plan.attention_kernel)
        if plan.context_parallel > 1:
            return _cp_attention(model, plan, sh, (qk + av) * kept, shape)
        return _unpadded(model, plan, sh, Op(CORE_ATTENTION, "attention", (qk + av) * kept, attention=shape))
    ops = [
        Op(f"{CORE_ATTENTION}.scores", "gemm", qk),
        Op(
            f"{CORE_ATTENTION}.softmax",
            "elementwise",
            2 * scores * e,
            label="softmax",
            backward_amount=3 * scores * e,
            bandwidth_share=SOFTMAX_BANDWIDTH_SHARE["fwd"],
            backward_share=SOFTMAX_BANDWIDTH_SHARE["bwd"],
        ),
    ]
    if model.has_dropout:  # attention dropout: read, write, 1-byte mask
        ops.append(Op(f"{CORE_ATTENTION}.dropout", "elementwise", scores * (2 * e + 1)))
    return [*ops, Op(f"{CORE_ATTENTION}.values", "gemm", av)]


def _unpadded(model: ModelConfig, plan: PlanConfig, sh: Shapes, attention: Op) -> list[Op]:
    """The fused attention kernel, between llm-foundry's unpadding and padding copies where the plan runs them
    (plan.attention_unpad; flash_attn/bert_padding.py at 2.4.2): unpad_input gathers q, k and v by their
    rows' indices (index_first_axis: read and write each, 2e per element; backward a zeroed tensor and a
    scatter, 3e), after a sum, a nonzero, a max with .item() and a cumsum of the mask (6 kernels a tensor,
    backward 2); pad_input scatters the output into zeros (zeros, index_put: 3e, 2 kernels; backward a gather,
    2e, 1)."""
    if not plan.attention_unpad:
        return [attention]
    a, g, d, dv = model.num_attention_heads, model.kv_heads, model.qk_head_dim, model.value_head_dim
    qkv = sh.tokens * (a * d + g * d + g * dv) / sh.t * sh.e
    out = sh.tokens * a * dv / sh.t * sh.e
    return [
        Op(f"{CORE_ATTENTION}.unpad", "elementwise", 2 * qkv, count=18, backward_amount=3 * qkv, backward_count=6),
        attention,
        Op(f"{CORE_ATTENTION}.pad", "elementwise", 3 * out, count=2, backward_amount=2 * out, backward_count=1),
    ]


def _cp_attention(model: ModelConfig, plan: PlanConfig, sh: Shapes, flops: float, shape: AttentionShape) -> list[Op]:
    """Fused attention under context parallelism c, as each implementation calls its kernels (plan.cp_comm).
    The sequence is cut in 2c chunks of L = s/(2c) tokens, rank r holding chunks r and 2c − 1 − r (the
    causal load balance of both: Transformer Engine's get_seq_chunk_ids_for_reordering_before_attn,
    PyTorch's round-robin / _HeadTailLoadBalancer), so every rank computes the same 2cL² query-key pairs.
    - A ring (p2p, torch_allgather, torch_alltoall): step 0 runs one causal call on the local 2L × 2L
      block, each of the c − 1 later steps one call without a mask on 2L × L or L × 2L (the lower
      triangle's first key half, the upper's second query half): Transformer Engine context_parallel.py
      AttnFuncWithCPAndKVP2P.forward (sections "diagonal", "lower-triangle", "upper-triangle"; d0067d0d),
      PyTorch _templated_ring_attention (_is_causal_behavior: IS_CAUSAL at i = 0, NOT_IS_CAUSAL after,
      with load balance). So c calls of flops/c each, only the first one causal.
    - all_gather (AttnFuncWithCPAndKVAllGather.forward): two calls, one per local query chunk j against
      the gathered keys up to it, (j + 1)L of them (get_kv_seq_info_after_all_gather), causal
      bottom-right (the last L × L block masked); priced as two calls of equal FLOPs.
    The partial outputs are merged by the memory-bound passes of `_cp_merge`."""
    c = plan.context_parallel
    if plan.cp_comm == "all_gather":
        attention = [Op(CORE_ATTENTION, "attention", flops, attention=replace(shape, calls=2))]
    else:
        ring = replace(shape, causal=False, calls=c - 1)
        attention = [
            Op(CORE_ATTENTION, "attention", flops / c, attention=shape),
            Op(f"{CORE_ATTENTION}.ring", "attention", flops * (c - 1) / c, attention=ring),
        ]
    return attention + _cp_merge(model, plan, sh)


#: (forward bytes, forward kernels, backward bytes, backward kernels) of a CP implementation's merges
MergeCost = tuple[float, int, float, int]


def _cp_merge(model: ModelConfig, plan: PlanConfig, sh: Shapes) -> list[Op]:
    """The memory-bound kernels around the attention calls of one layer under context parallelism (copies
    into send buffers, the merge of the partial outputs by their logsumexp, the sum of the partial
    gradients), counted kernel by kernel from each implementation's source in `_te_p2p_merge`,
    `_te_all_gather_merge` and `_torch_merge`, over the rank's output O, query Q and key+value KV
    elements (`_kv_width`); the logsumexp tensors (1/d of the output's elements) are left out."""
    heads = plan.micro_batch_size * model.num_attention_heads / sh.t
    o = heads * sh.seq_local * model.value_head_dim
    q = heads * sh.seq_local * model.qk_head_dim
    kv = sh.tokens * _kv_width(model, plan) / sh.t
    merges = {"p2p": _te_p2p_merge, "all_gather": _te_all_gather_merge}
    fwd, kernels, bwd, bwd_kernels = merges.get(plan.cp_comm, _torch_merge)(plan.context_parallel, sh.e, o, q, kv)
    merge = Op(f"{CORE_ATTENTION}.merge", "elementwise", fwd, count=kernels, label="cp_merge")
    return [replace(merge, backward_amount=bwd, backward_count=bwd_kernels)]


def _te_p2p_merge(c: int, e: int, o: float, q: float, kv: float) -> MergeCost:
    """Transformer Engine's AttnFuncWithCPAndKVP2P (context_parallel.py at d0067d0d, bf16, sbhd) on the
    last rank, whose every forward step is whole. Forward: K and V concatenated into the first send
    buffer (torch.cat: 2e KV); flash_attn_fwd_out_correction_init (reads the first step's output, writes
    out: 2e O) then c − 1 flash_attn_fwd_out_correction (reads out and the step's output, writes out: 3e
    O), one jit-fused kernel each, beside c kernels on the logsumexp (torch.clone, then
    flash_attn_fwd_softmax_lse_correction). Backward (steps reversed: the diagonal last): K, V copied
    into the send buffer (p2p_comm_buffers[0][0].copy_: 2e KV); dq copied at step 0, added in place after
    (2e, then 3e Q); dk and dv: the lower triangle's first half copied at step 0 (e KV), added at steps
    1 … c − 2 (1.5e KV), the diagonal's whole added at the last step (3e KV)."""
    fwd = 2 * e * kv + (2 * e + 3 * e * (c - 1)) * o
    bwd = 2 * e * kv + (2 * e + 3 * e * (c - 1)) * q + (e + 1.5 * e * (c - 2) + 3 * e) * kv
    return fwd, 1 + c + c, bwd, 1 + c + 2 * c


def _te_all_gather_merge(c: int, e: int, o: float, q: float, kv: float) -> MergeCost:
    """Transformer Engine's AttnFuncWithCPAndKVAllGather (context_parallel.py at d0067d0d, bf16, sbhd:
    its movedim/select/contiguous calls are views), any rank. Forward: the gathered K and V put in
    sequence order (two torch.index_select: 2e · c KV), each call's output copied into the rank's
    (out_f16[i].copy_, two: 2e O). Backward: dk, dv of the gathered length zero-filled (two: e · c KV),
    the gathered K, V put in order again (two: 2e · c KV), dq copied per call (two: 2e Q), each call's
    dk, dv added over the (j + 1)L keys it saw, (2c + 1)L of the rank's 2L in all (four add_: 3e (c + ½)
    KV), and put back in rank order before the reduce-scatter (two index_select: 2e · c KV)."""
    fwd = 2 * e * c * kv + 2 * e * o
    bwd = (e * c + 2 * e * c + 3 * e * (c + 0.5) + 2 * e * c) * kv + 2 * e * q
    return fwd, 2 + 2, bwd, 2 + 2 + 2 + 4 + 2


def _torch_merge(c: int, e: int, o: float, q: float, kv: float) -> MergeCost:
    """PyTorch's context_parallel (torch/distributed/tensor/experimental/_attention.py at 0123248a,
    _context_parallel/_attention.py at 09b101c5: the same code), eager, _SDPAMerger with convert_to_f32
    True, on the last rank, whose every later step is whole. Forward (_templated_ring_attention): K, V
    made contiguous (torchtitan's transpose(1, 2) leaves them strided: two, 2e KV); each step's output
    cast to fp32 (c: (e + 4) O); per later step out − block_out (12 O), × sigmoid(…) (8 O), out − that
    (12 O) and five kernels on the logsumexp; K, V concatenated for each of the c − 1 sends (torch.cat:
    2e KV); the output cast back (4 + e O). Backward (_templated_ring_attention_backward): fp32
    grad_query/key/value zero-filled (three: 4 (Q + KV)); K, V made contiguous (two: 2e KV) and
    concatenated for c − 1 sends (2e KV each); grad_key/value += the step's at step 0 (two: 8 + e KV),
    _partial_update's add on the first half and torch.cat after (four per later step: (8 + e)/2 + 8
    KV); the fp32 gradients concatenated for their send at every step (c: 8 KV); grad_query += the
    step's (c: 8 + e Q); the final casts (two: 4 + e over Q and KV)."""
    fwd = 2 * e * kv + (e + 4) * c * o + 32 * (c - 1) * o + 2 * e * (c - 1) * kv + (4 + e) * o
    bwd_q = (4 + (8 + e) * c + (4 + e)) * q
    bwd_kv = (4 + 2 * e + 2 * e * (c - 1) + (8 + e) + ((8 + e) / 2 + 8) * (c - 1) + 8 * c + (4 + e)) * kv
    fwd_kernels = 2 + c + 8 * (c - 1) + (c - 1) + 1
    bwd_kernels = 3 + 2 + (c - 1) + 2 + 4 * (c - 1) + c + c + 2
    return fwd, fwd_kernels, bwd_q + bwd_kv, bwd_kernels


def _kv_width(model: ModelConfig, plan: PlanConfig) -> float:
    """Elements of one token's keys and values, over all heads, as context parallelism exchanges them:
    every query head's with multi-latent attention (its per-head up-projected keys and values) and under
    PyTorch's context_parallel (torch_*), whose callers in torchtitan repeat the key-value groups to the
    query heads before SDPA (models/llama3/model.py repeat_kv, until ff0829c1 passed enable_gqa); else
    the key-value groups'."""
    if model.mla or plan.cp_comm.startswith("torch"):
        return model.num_attention_heads * (model.qk_head_dim + model.value_head_dim)
    return 2 * model.kv_heads * model.head_dim


def _cp_exchange(model: ModelConfig, plan: PlanConfig, sh: Shapes) -> list[Op]:
    """Keys and values passed between the context-parallel ranks (all of them, also in a sliding-window
    layer that needs fewer: an upper bound there). p2p, torch_alltoall: c − 1 ring sends, each beside a
    step's kernel (TE: flash_attn_p2p_communicate issued before the step's call, waited before the next;
    PyTorch: _AllToAllRotater's permute_tensor likewise). torch_allgather: _AllGatherRotater, one
    all-gather of every rank's K,V issued before the first SDPA and waited before the second, so it hides
    only behind the diagonal call. all_gather: TE's gather_along_first_dim of K, then of V, before any
    call, exposed (two all-gathers of c × half the rank's K,V bytes)."""
    c = plan.context_parallel
    if c == 1:
        return []
    nbytes = sh.tokens * _kv_width(model, plan) / sh.t * sh.e
    if plan.cp_comm in ("p2p", "torch_alltoall"):
        return [Op("cp_kv_exchange", "cp_comm", nbytes, "p2p", c - 1)]
    if plan.cp_comm == "torch_allgather":
        return [Op("cp_kv_all_gather", "cp_comm", c * nbytes, "all_gather", overlaps=CORE_ATTENTION)]
    return [Op("cp_kv_all_gather", "cp_comm", c * nbytes / 2, "all_gather", count=2)]


def _cp_backward(op: Op, plan: PlanConfig) -> list[Op]:
    """The backward of a forward CP exchange. p2p (TE AttnFuncWithCPAndKVP2P.backward): c sends beside
    the c steps, the K,V at the first, K,V and the gradients accumulated so far after, the gradients
    alone at the last: 2(c − 1) × the K,V bytes in all. all_gather (TE): K and V gathered again and
    their gradients reduce-scattered (reduce_scatter_along_first_dim of dk, then dv), all exposed.
    torch_* (_templated_ring_attention_backward): the K,V again (the ring, or the all-gather beside the
    diagonal call's backward) and, whatever the rotate method, the fp32 key/value gradients sent to the
    next rank after every step (dkv_rotater, ALL_TO_ALL): each of the first c − 1 waited after the next
    step's call, the last waited at once (exposed, comm_kind send)."""
    c = plan.context_parallel
    if plan.cp_comm == "p2p":
        return [Op(f"{op.name}.bwd", "cp_comm", 2 * (c - 1) / c * op.amount, "p2p", c)]
    if plan.cp_comm == "all_gather":
        scatter = Op(f"{op.name}.dkv_reduce_scatter", "cp_comm", op.amount, "reduce_scatter", count=2)
        return [replace(op, name=f"{op.name}.bwd"), scatter]
    dkv_bytes = (op.amount / c if op.comm_kind == "all_gather" else op.amount) * 4 / plan.dtype_bytes
    hides = op.overlaps and f"{op.overlaps}.bwd"
    return [
        replace(op, name=f"{op.name}.bwd", overlaps=hides),
        Op("cp_dkv_exchange", "cp_comm", dkv_bytes, "p2p", c - 1),
        Op("cp_dkv_exchange.last", "cp_comm", dkv_bytes, "send"),
    ]


def _projections(model: ModelConfig, plan: PlanConfig, sh: Shapes) -> list[Op]:
    """Query, key and value projections (and rotary embeddings). Standard: one column-parallel
    QKV GEMM (GQA), with model.qk_norm an RMSNorm over every query and key head after it (Qwen3,
    OLMo 2: memory-bound, its input kept for the backward, memory.py), rotary embeddings on q and k
    (plan.pointwise_kernels eager or compiled: `eager_rotary_cost`, then `_repeat_kv`). Multi-latent attention
    (DeepSeek-V2 §2.1): down projections to the latents (whole on every tensor-parallel rank) and
    their RMSNorms, then column-parallel up projections (its rotary always priced fused)."""
    h, d, t, e = model.hidden_size, model.head_dim, sh.t, sh.e
    a, g, T = model.num_attention_heads, model.kv_heads, sh.tokens
    if not model.mla:
        qkv = 2 * T * h * (a + 2 * g) * d / t
        parts = _separate(plan, (a, g, g))
        ops = [Op("qkv", "gemm", qkv, f_bytes=T * h * e, kn=(h, (a + 2 * g) * d / t), parts=parts)]
        if model.qk_norm:  # RMSNorm over each query and key head: read and write q and k
            ops.append(Op("qk_norm", "norm", 2 * T * (a + g) * d / t * e))
        if model.learned_positions:
            return ops
        rotary = Op("rope", "elementwise", 2 * T * (a + g) * d / t * e)
        if not _complex_rotary(model, plan):
            if model.rope_mscale != 1:  # Megatron-Core rotates unfused (rope_utils.py apply_rotary_pos_emb)
                rotary = _eager(rotary, T * (a + g) * d / t, megatron_unfused_rotary_cost(e), tensors=2)
            return [*ops, rotary]
        return [*ops, _eager(rotary, T * (a + g) * d / t, eager_rotary_cost(e), tensors=2), *_repeat_kv(model, sh)]
    kv_lora, q_lora, rope = model.kv_lora_rank or 0, model.q_lora_rank, model.qk_rope_head_dim
    dqk, dv = model.qk_head_dim, model.value_head_dim
    if q_lora:
        ops = [
            Op("q_down", "gemm", 2 * T * h * q_lora, f_bytes=T * h * e, kn=(h, q_lora)),
            Op("q_norm", "norm", 2 * T * q_lora * e),
            Op("q_up", "gemm", 2 * T * q_lora * a * dqk / t, kn=(q_lora, a * dqk / t)),
        ]
    else:
        ops = [Op("q_proj", "gemm", 2 * T * h * a * dqk / t, f_bytes=T * h * e, kn=(h, a * dqk / t))]
    return [
        *ops,
        Op("kv_down", "gemm", 2 * T * h * (kv_lora + rope), kn=(h, kv_lora + rope)),
        Op("kv_norm", "norm", 2 * T * kv_lora * e),
        Op("kv_up", "gemm", 2 * T * kv_lora * a * (dqk - rope + dv) / t, kn=(kv_lora, a * (dqk - rope + dv) / t)),
        Op("rope", "elementwise", 2 * T * (a / t + 1) * rope * e),
    ]


def _separate(plan: PlanConfig, widths: tuple[int, ...]) -> tuple[float, ...]:
    """Op.parts of a fused GEMM whose outputs are `widths` wide (q, k, v heads; gate, up) under
    plan.projections separate: each projection's share of its FLOPs; () under fused."""
    if plan.projections == "fused":
        return ()
    return tuple(w / sum(widths) for w in widths)


def _dgrad_sum(op: Op, plan: PlanConfig) -> list[Op]:
    """The sum of the input gradients of a GEMM's separate projections (Op.parts, k of them), each
    `op.f_bytes` (the input they share, gathered under tensor parallelism; plan.projections): eagerly the
    autograd engine adds each arriving gradient to the sum so far (torch/csrc/autograd/input_buffer.cpp
    InputBuffer::add), k − 1 kernels that read two tensors and write one; compiled, Inductor's one
    pointwise kernel reads the k and writes the sum."""
    k = len(op.parts)
    if k < 2:
        return []
    name = f"{op.name}.dgrad_sum"
    if not plan.eager_pointwise:
        return [Op(name, "elementwise", (k + 1) * op.f_bytes)]
    return [Op(name, "elementwise", 3 * (k - 1) * op.f_bytes, count=k - 1)]


def te_overlap_layer(gemm: str) -> str:
    """Transformer Engine's userbuffers name of a layer GEMM (qkv, proj, fc1, fc2), "" for others:
    the column-parallel projections before attention (qkv; MLA's q_proj or q_down), the attention
    output projection (proj), an MLP's up (fc1) and down (fc2) GEMMs."""
    base = gemm.split(".")[0]
    if base in ("qkv", "q_proj", "q_down"):
        return "qkv"
    if base == "attn_proj":
        return "proj"
    return "fc1" if base.endswith("_up") else "fc2" if base.endswith("_down") else ""


def _sm_margin(plan: PlanConfig, gemm: str, use: str) -> int:
    """SMs the overlap of `gemm`'s `use` (fprop, dgrad, wgrad) takes from it (PlanConfig.overlap_sms)."""
    layer = te_overlap_layer(gemm)
    return plan.overlap_sms(f"{layer}_{use}") if layer else 0


#: Share of the elementwise curve's bandwidth the final sum of PyTorch's async-TP reduce-scatter reaches: its
#: fused_matmul_reduce_scatter exchanges the GEMM's partials, then sums them with torch.sum(dim=0)
#: (torch/distributed/_symmetric_memory/__init__.py _fused_matmul_reduce_scatter_impl, torch 2.13), which "reaches
#: 23-43% of HBM peak" on its shapes, "instruction-bound: for a reduction of extent 2-8" (pytorch/pytorch#191803,
#: 2026-07, its author's kernel measurements, replacing it with a Triton kernel at 82-88%): their geometric mean,
#: 0.31 of peak, over the curve's 0.90 asymptote (costs/analytic.py memory_s). Transformer Engine's userbuffers
#: reduce-scatter (tp_layout megatron) sums its chunks in a kernel of its own, priced at the curve.
ASYNC_TP_SUM_BANDWIDTH_SHARE = 0.35


def _tp_overlapped(ops: list[Op], plan: PlanConfig) -> list[Op]:
    """With plan.tp_comm_overlap: a tensor-parallel all-gather overlaps the GEMM right after it
    (Transformer Engine's ring exchange), a reduce-scatter the GEMM right before it (plan.tp_comm_overlap_rs,
    which takes PlanConfig.overlap_sms SMs from that GEMM; module docstring); PyTorch's async TP (tp_layout
    dtensor) sums a reduce-scatter's chunks at ASYNC_TP_SUM_BANDWIDTH_SHARE of the elementwise bandwidth."""
    if not plan.tp_comm_overlap:
        return ops
    out = list(ops)
    for i, op in enumerate(ops):
        if op.family != "tp_comm" or op.group != "tp":
            continue
        j = i + 1 if op.comm_kind == "all_gather" else i - 1 if op.comm_kind == "reduce_scatter" else -1
        if 0 <= j < len(ops) and ops[j].family == "gemm":
            rs = op.comm_kind == "reduce_scatter"
            margin = _sm_margin(plan, ops[j].name, "fprop") if rs else 0
            chunked = plan.tp_comm_overlap_rs if rs else "ring_exchange"
            share = ASYNC_TP_SUM_BANDWIDTH_SHARE if rs and plan.tp_layout == "dtensor" else 1.0
            out[i] = replace(op, overlaps=ops[j].name, sm_margin=margin, chunked=chunked, bandwidth_share=share)
    return out


def fp8_cast_bytes(recipe: str, after_norm: bool) -> int:
    """HBM bytes per element of casting one bf16 GEMM operand to FP8 with the copy its other GEMM
    reads (torchao/testing/training/roofline_utils.py get_tensor_memory_traffic_ovhd_s, the
    maintainers' per-kernel byte counts; Transformer Engine's kernels agree):
    - delayed (TE DelayedScaling, scale from earlier steps' amax): one cast-transpose, a 2-byte read
      and two 1-byte FP8 writes: 4.
    - tensorwise (TE Float8CurrentScaling, torchao tensorwise): an amax pass first (a 2-byte read:
      TE docs fp8_current_scaling.rst 'Quantization ... requires reading the tensor twice'), then
      the same cast: 6; 4 when `after_norm`, where the layer norm computes the amax as it writes
      (TE normalization.cpp FUSED_NORM_AMAX_FP8; the roofline's fuse_with_prev).
    - rowwise (torchao rowwise): one kernel reads bf16 and writes the row-scaled FP8 copy and a bf16
      transpose (2 + 1 + 2), a second casts that transpose column-scaled (2 + 1): 8; 6 `after_norm`
      (the first read fused with the norm)."""
    fused_read = 2 if after_norm else 0
    return {"delayed": 4, "tensorwise": 6 - fused_read, "rowwise": 8 - fused_read}[recipe]


#: Share of the elementwise curve's bandwidth torchao's row-wise FP8 casts and rescales reach as torch.compile
#: generates them (each tensor cast along both dims, the column-scaled copy through a transpose): FITTED, by least
#: squares in log speedup, on torchao's own H100 kernel-time table of a compiled LayerNorm -> Linear -> Sigmoid,
#: bf16 against float8 rowwise, forward and backward, at its 108 shapes with M >= 8,192 (pytorch/ao@fdddb2cf,
#: data/published/kernels/torchao_float8_rowwise_linear_h100.csv; validation/fp8_linear_speedup.py prints the fit
#: and the held-out M <= 4,096 shapes). At the roofline's bytes (share 1) itercast priced float8 rowwise 1.32x
#: too fast there; the same table's tensorwise examples agree within 3% at a large shape, so the excess is in
#: what rowwise alone runs. torchao's maintainers report torch.compile's casts along both dims slow (pytorch/ao
#: #1788, #1869: a hand-written Triton cast ~2x faster). Measured compiled only; eager casts assumed no faster.
ROWWISE_CAST_BANDWIDTH_SHARE = 0.30

#: tensors one Transformer Engine multi-tensor cast-transpose launch takes (transformer_engine/common/
#: transpose/multi_cast_transpose.cu kMaxTensorsPerKernel, 'Args must be <4 KB')
MULTI_CAST_TENSORS = 64


def fp8_cast_kernels(recipe: str, after_norm: bool, tensors: int, grouped: bool = True, te: bool = True) -> int:
    """Kernels that cast `tensors` operands of one (grouped) GEMM to FP8 (`fp8_cast_bytes` moves their bytes);
    `te`: Transformer Engine's casts (plan.fp8_weight_cast per_step), else torchao's:
    - delayed: one cast-transpose per operand; a `grouped` GEMM's per-expert operands go through one
      multi-tensor kernel per MULTI_CAST_TENSORS (TE pytorch/csrc/extensions/cast.cpp multi_tensor_quantize_impl:
      nvte_multi_cast_transpose when every quantizer is delayed-scaling; TE 2.x: TE 1.x's GroupedLinear
      under sequence parallelism cast each expert apart and transposed it again in the backward).
    - tensorwise under TE: Float8CurrentScalingQuantizer::quantize_impl (pytorch/csrc/quantizer.cpp) zeroes
      the amax (cudaMemsetAsync in TE 2.2–2.7, zero_amax_kernel from 2.8: common/recipe/current_scaling.cu
      launch_amax_kernel), then runs nvte_compute_amax, nvte_compute_scale_from_amax and nvte_quantize_v2: 4
      per operand; 3 `after_norm` (create_unquantized_tensor_with_amax zeroes the amax the norm then
      computes: amax.zero_(), scale, cast); per expert, since current scaling takes the loop of quantize
      calls in multi_tensor_quantize_impl. Under torchao (Float8Linear's hp_tensor_to_float8_dynamic:
      amax, scale, cast): 3, 2 `after_norm`.
    - rowwise (torchao): the roofline's two kernels per operand (roofline_utils.py
      get_tensor_memory_traffic_ovhd_s: a row-scaled cast with a bf16 transpose, then a column-scaled cast).
    """
    if recipe == "delayed":
        return -(-tensors // MULTI_CAST_TENSORS) if grouped else tensors
    if recipe == "rowwise":
        return 2 * tensors
    return tensors * ((3 if te else 2) if after_norm else (4 if te else 3))


#: torchao's casts of one weight element on every micro-batch, (bytes, kernels) forward and backward, per
#: plan.fp8_recipe (torchao/testing/training/roofline_utils.py get_tensor_memory_traffic_ovhd_s, tensor_role
#: 'weight'). tensorwise: an amax pass (read 2), the amax's second stage (no traffic modelled) and the
#: forward cast (read 2, write 1), then the backward's column-major cast (read 2, write 1): 5 + 3 = 8
#: bytes, 3 + 1 kernels. rowwise: a row-scaled cast (read 2, write 1), then a bf16 transpose (read 2,
#: write 2) and its column-scaled cast (read 2, write 1): 3 + 7 = 10 bytes, 1 + 2 kernels.
TORCHAO_WEIGHT_CAST: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "tensorwise": ((2 + 3, 3), (3, 1)),
    "rowwise": ((3, 1), (4 + 3, 2)),
}


def _weight_casts(op: Op, plan: PlanConfig) -> list[Op]:
    """plan.fp8_weight_cast per_microbatch: the GEMM's weights cast to FP8 in the forward and again
    in the backward of every micro-batch (torchao's Float8Linear as torchtitan runs it:
    torchao/float8/float8_linear.py matmul_with_hp_or_float8_args; torchtitan Float8LinearConverter's
    enable_fsdp_float8_all_gather, which would cast the FSDP shard before the gather instead, is off by
    default and not expressed), TORCHAO_WEIGHT_CAST per element, every expert's weights of a grouped
    GEMM. per_step (Transformer Engine's cache) is a cost of the step, not of a micro-batch:
    `weight_cast_step_bytes`."""
    if plan.fp8_weight_cast != "per_microbatch":
        return []
    k, n = op.kn
    weights = op.count * k * n  # elements of the GEMM's weights, every expert's together
    (fwd, fwd_kernels), (bwd, bwd_kernels) = TORCHAO_WEIGHT_CAST[plan.fp8_recipe]
    return [
        Op(
            f"{op.name}.fp8_weight_cast",
            "elementwise",
            fwd * weights,
            count=fwd_kernels * op.count,
            label="fp8_cast",
            backward_amount=bwd * weights,
            backward_count=bwd_kernels * op.count,
        )
    ]


#: fp32 amax entries Transformer Engine's DelayedScaling registers in its global buffers per GEMM of a module,
#: forward (input, weight, output) and backward (output gradient, input gradient): TE 1.x module/base.py
#: set_meta_tensor (3 · num_gemms, 2 · num_gemms), fp8.py add_fp8_tensors_to_global_buffer
AMAX_ENTRIES_PER_GEMM = (3, 2)
#: the "GEMMs" of DotProductAttention, a TE module of its own under fused attention (TE 1.8 on: 9 forward
#: and 6 backward entries, every one zero without fp8_dpa)
ATTENTION_AMAX_GEMMS = 3
#: bytes the scale update reads and writes per operand whose amax is not zero (the GEMM inputs forward, the
#: output gradients backward): its fp32 amax history of fp8_amax_history_len 1024, NeMo's recipes' setting
#: (the dgxc-benchmarking YAMLs), rolled (TE common/recipe/delayed_scaling.cu kernel_bulk)
AMAX_HISTORY_BYTES = 2 * 4 * 1024


def delayed_amax_bytes(model: ModelConfig, plan: PlanConfig, moe: bool = False) -> tuple[int, int, int]:
    """What one layer (an MoE layer when `moe`) adds to Transformer Engine 1.x DelayedScaling's per-pass amax
    reduction (TransformerStepBuilder._amax_reduction): fp32 bytes of its entries in the global forward and
    backward buffers (AMAX_ENTRIES_PER_GEMM per GEMM of its TE modules, every routed expert's, and fused
    attention's ATTENTION_AMAX_GEMMS), and the history bytes the scale update rolls for it per pass (one
    operand per GEMM)."""
    gemms = sum(op.count for op in layer_forward(model, plan, moe) if op.family == "gemm" and op.te)
    modules = gemms + (ATTENTION_AMAX_GEMMS if plan.flash_attention else 0)
    fwd, bwd = AMAX_ENTRIES_PER_GEMM
    return 4 * fwd * modules, 4 * bwd * modules, AMAX_HISTORY_BYTES * gemms


def weight_cast_step_bytes(model: ModelConfig, plan: PlanConfig, moe: bool = False) -> float:
    """HBM bytes of one layer's (an MoE layer's when `moe`) once-per-step FP8 weight casts on one GPU
    (plan.fp8_weight_cast per_step; 0 otherwise): Transformer Engine casts each weight of its GEMMs with
    its transpose on the step's first micro-batch and keeps both for the others (TE module/linear.py
    and grouped_linear.py update the FP8 weight workspace only when is_first_microbatch; Megatron-Core's
    TELinear / TEGroupedLinear pass it, set on each step's first micro-batch by pipeline_parallel/
    schedules.py forward_step): `fp8_cast_bytes` per weight element (delayed 4, tensorwise 6), one
    kernel per weight (not launched apart: the step graph prices the bytes, transformer.py)."""
    if plan.dtype != "fp8" or plan.fp8_weight_cast != "per_step":
        return 0.0
    ops = layer_forward(model, plan, moe)
    weights = sum(op.count * op.kn[0] * op.kn[1] for op in ops if op.family == "gemm" and op.te)
    return fp8_cast_bytes(plan.fp8_recipe, after_norm=False) * weights


def _rowwise_rescales(op: Op, plan: PlanConfig, rows: float) -> list[Op]:
    """torchao rowwise's backward GEMMs run without fast accumulation, which torchao runs as the per-tensor
    cuBLAS kernel with unit scales and then scales the bf16 output by the outer product of the two
    operands' inverse row scales (torchao/float8/float8_ops.py addmm_float8_unwrapped at pytorch/ao@36027d82:
    `output *= a_inverse_scale * b_inverse_scale`, "hoping Inductor will be able to fuse it"; the forward
    GEMM takes fast accumulation and scales inside the kernel). Compiled (torchtitan's torch.compile per
    block): the grad_input's product is inlined into the op that consumes it, while the grad_weight, an
    output of the compiled backward that FSDP takes, is read and written once more (2 + 2 bytes per weight
    element, one kernel). Eager (plan.pointwise_kernels eager or eager_fused_norm, no compile): both
    outputs, each the m × n fp32 outer product written (4) and the output read with it and written
    (2 + 4 + 2): 12 bytes per element, two kernels. Dense Float8Linear GEMMs only (routed experts run
    torchao's grouped kernels, which are not this path)."""
    if plan.fp8_recipe != "rowwise" or op.count != 1 or op.label == "experts":
        return []
    k, n = op.kn
    if not plan.eager_pointwise:
        nbytes, kernels = 4 * k * n, 1
    else:
        nbytes, kernels = 12 * (k * n + rows * k), 4
    return [
        Op(
            f"{op.name}.fp8_rescale",
            "elementwise",
            0.0,
            count=0,
            label="fp8_cast",
            backward_amount=nbytes,
            backward_count=kernels,
        )
    ]


def fp8_casts(ops: list[Op], plan: PlanConfig) -> list[Op]:
    """Under fp8 training, before each Transformer Engine GEMM the cast of its m × k input to FP8
    with the copy its weight gradient reads and, backward, the same of its m × n output gradient
    (`fp8_cast_bytes` per element, `fp8_cast_kernels`, by plan.fp8_recipe; an input is `after_norm`
    when the op before it, collectives aside, is a layer norm), and the weight casts of every
    micro-batch (`_weight_casts`). Routed experts (`count` GEMMs) cast each expert's rows and
    weights, in one multi-tensor launch when grouped (plan.moe_grouped_gemm). Delayed scaling is
    counted at 4 bytes also where TE fuses the cast into the layer norm
    (which saves the 2-byte read there). rowwise: its casts, weight casts and rescales at
    ROWWISE_CAST_BANDWIDTH_SHARE of the elementwise bandwidth (Op.bandwidth_share).

    tensorwise with sequence parallelism: the amax of a column-parallel GEMM's input (forward) and of
    a row-parallel GEMM's output gradient (backward) is all-reduced over the tensor-parallel group
    before the cast (TE module/linear.py set_quantizer_amax_reduction_group; quantizer.cpp
    Float8CurrentScalingQuantizer::quantize_impl allreduce): one 4-byte fp32 all-reduce, priced
    forward before each column-parallel TE GEMM and as its backward (a Megatron layer pairs each
    column-parallel GEMM with a row-parallel one: QKV with the projection, MLP up with down)."""
    if plan.dtype != "fp8":
        return ops
    recipe = plan.fp8_recipe
    reduce_amax = recipe == "tensorwise" and plan.sequence_parallel and plan.tensor_parallel > 1
    grouped = plan.moe_grouped_gemm
    te = plan.fp8_weight_cast == "per_step"  # Transformer Engine's cache; torchao casts every micro-batch
    out: list[Op] = []
    before = ""  # family of the last non-collective op
    for op in ops:
        if op.family == "gemm" and op.te:
            k, n = op.kn
            rows = op.count * op.amount / (2 * k * n)  # m, over every repetition
            norm = before == "norm"
            if reduce_amax and op.f_bytes and op.group == "tp":
                out.append(Op(f"{op.name}.amax_all_reduce", "tp_comm", 4, "all_reduce", backward_comm="all_reduce"))
            cast = Op(
                f"{op.name}.fp8_cast",
                "elementwise",
                fp8_cast_bytes(recipe, norm) * rows * k,
                count=fp8_cast_kernels(recipe, norm, op.count, grouped, te),
                label="fp8_cast",
                backward_amount=fp8_cast_bytes(recipe, False) * rows * n,
                backward_count=fp8_cast_kernels(recipe, False, op.count, grouped, te),
            )
            casts = [*_rowwise_rescales(op, plan, rows), cast, *_weight_casts(op, plan)]
            if recipe == "rowwise":
                casts = [replace(c, bandwidth_share=ROWWISE_CAST_BANDWIDTH_SHARE) for c in casts]
            out += casts
        out.append(op)
        if op.family not in COMM_FAMILIES:
            before = op.family
    return out


def layer_forward(model: ModelConfig, plan: PlanConfig, moe: bool = False, windowed: bool = False) -> list[Op]:
    """Forward ops of one layer (an MoE layer when `moe`, a sliding-window layer when `windowed`),
    in execution order."""
    sh = Shapes.of(model, plan)
    h, f, t, e = model.hidden_size, model.ffn, sh.t, sh.e
    a = model.num_attention_heads
    T, Tsp = sh.tokens, sh.sp_tokens
    ops = [_rmsnorm(Op("input_norm", "norm", 2 * Tsp * h * e), Tsp * h, model, plan), *_f("attn_in", T * h * e, plan)]
    ops += _projections(model, plan, sh)
    ops += _core_attention(model, plan, sh, windowed)
    ops += _cp_exchange(model, plan, sh)
    ops.append(Op("attn_proj", "gemm", 2 * T * a * model.value_head_dim * h / t, kn=(a * model.value_head_dim / t, h)))
    ops += _g("attn_out", T * h * e, plan)
    post_attn_norm = _rmsnorm(Op("post_attn_norm", "norm", 2 * Tsp * h * e), Tsp * h, model, plan)
    # (bias,) dropout and residual add: read two, write one, and with dropout its 1-byte mask
    residual = Tsp * h * (3 * e + (1 if model.has_dropout else 0))
    ops += [Op("residual_1", "elementwise", residual), post_attn_norm]
    ops += _moe_block(model, plan, sh) if moe else _mlp("mlp", f, model, plan, sh)
    ops.append(Op("residual_2", "elementwise", residual))
    return fp8_casts(_tp_overlapped(ops, plan), plan)


def _mlp(
    name: str,
    width: int,
    model: ModelConfig,
    plan: PlanConfig,
    sh: Shapes,
    whole: bool = False,
    collectives: bool = True,
) -> list[Op]:
    """A tensor-parallel MLP of `width` (the layer's MLP, or an MoE layer's shared experts): f,
    column-parallel up (gate + up when gated), activation, row-parallel down, g; `whole`: the MLP unsplit on every
    tensor-parallel rank, without f and g (DeepSpeed's PR-MoE residual MLP beside whole experts); `collectives`
    False: split, without f and g, its caller gathering the input and reducing the output (torchtitan's MoE
    layer, `_titan_moe_tp`)."""
    if width == 0:
        return []
    T, h, t, e = sh.tokens, model.hidden_size, 1 if whole else sh.t, sh.e
    up = 2 if model.gated_mlp else 1
    act = Op(f"{name}_act", "activation", (3 if model.gated_mlp else 2) * T * width / t * e)
    if _eager_llama(model, plan):  # SwiGLU
        act = _eager(act, T * width / t, eager_swiglu_cost(e))
    parts = _separate(plan, (1, 1)) if model.gated_mlp else ()
    comm = T * h * e if collectives and not whole else 0.0  # the f and g collectives' bytes
    return [
        *(_f(f"{name}_in", comm, plan) if comm else []),
        Op(f"{name}_up", "gemm", 2 * T * h * up * width / t, f_bytes=comm, kn=(h, up * width / t), parts=parts),
        act,
        Op(f"{name}_down", "gemm", 2 * T * width * h / t, kn=(width / t, h)),
        *(_g(f"{name}_out", comm, plan) if comm else []),
    ]


#: (forward bytes, forward kernels, backward bytes, backward kernels) per element of an eager op chain
EagerCost = tuple[float, int, float, int]


def _casts(e: int) -> tuple[int, int]:
    """HBM bytes per element and kernels of an eager up-cast to fp32 (`.float()`: read e, write 4) or
    of the down-cast back (`.type_as`: read 4, write e); none in fp32 training, where both return
    the tensor itself."""
    return (0, 0) if e == 4 else (e + 4, 1)


def eager_rmsnorm_cost(e: int) -> EagerCost:
    """torchtitan's RMSNorm run eagerly (models/norms.py at 9dec370a and 1ea476e9, norm_type rmsnorm:
    `(x.float() * rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight`), per
    element of its input, e bytes each; c = `_casts` (bf16: 6 bytes, 1 kernel).
    Forward: .float() (c), pow(2) (read 4, write 4: 8), mean (read 4: 4; one value per token written),
    + eps and rsqrt (per token: no bytes, 2 kernels), × rsqrt (read 4, write 4: 8), .type_as (c),
    × weight (read e, write e: 2e): 2c + 20 + 2e bytes, 6 kernels + the casts' (bf16: 36, 8).
    Backward, autograd's formulas (tools/autograd/derivatives.yaml, FunctionsManual.cpp): × weight's
    MulBackward0, grad · weight (2e) and grad · normed (3e) summed over the tokens for the weight's
    gradient (e), 3 kernels; the down-cast's (c); × rsqrt's MulBackward0, grad · rsqrt (8) and grad · x
    (12) summed over the hidden size (4), 3 kernels; rsqrt's -0.5 · grad · result.pow(3) per token
    (3 kernels, no bytes); mean_backward's expand / h (write 4), 1; pow_backward's
    grad · (2 · x.pow(1)), x.pow(1) a copy (Pow.cpp pow_Tensor_Scalar_out: 8), × 2 (8), × grad (12),
    3 kernels; the engine adds x's two gradients (read 8, write 4: 12), 1; the up-cast's (c):
    6e + 2c + 68 bytes, 14 kernels + the casts' (bf16: 92, 16). Fused: 2e forward, 4e backward."""
    cast, cast_kernels = _casts(e)
    fwd = cast + 8 + 4 + 8 + cast + 2 * e
    bwd = 6 * e + cast + 24 + 4 + 28 + 12 + cast
    return fwd, 6 + 2 * cast_kernels, bwd, 3 + 3 + 3 + 1 + 3 + 1 + 2 * cast_kernels


def eager_rotary_cost(e: int) -> EagerCost:
    """torchtitan's apply_rotary_emb run eagerly on one of q, k (models/llama/model.py at 9dec370a and
    1ea476e9: `view_as_complex(x.float().reshape(..., -1, 2)) * freqs_cis`, view_as_real, flatten,
    .type_as(x)), per element, c = `_casts`: .float() (c), the complex product (read 4, write 4: 8; the
    reshapes are views, the [s, d/2] freqs_cis table is left out), .type_as (c): 2c + 8 bytes, 1 kernel
    + the casts' (bf16: 20, 3). Backward: the casts' (c each) and MulBackward0's grad · freqs_cis.conj()
    (8), whose lazily conjugated table the dispatcher's Conjugate fallback copies first (mul is not in
    ConjugateFallback.cpp's fallthrough list: 1 kernel, its bytes left out): 2c + 8, 2 kernels + the
    casts' (bf16: 20, 4). Fused: 2e forward, 4e backward."""
    cast, cast_kernels = _casts(e)
    return 2 * cast + 8, 1 + 2 * cast_kernels, 2 * cast + 8, 2 + 2 * cast_kernels


def megatron_unfused_rotary_cost(e: int) -> EagerCost:
    """Megatron-Core's unfused rotary embedding on one of q, k (rope_utils.py `_apply_rotary_pos_emb_bshd` at
    b0cc2706), which it runs instead of Transformer Engine's fused kernel when YaRN's mscale is not 1
    (`apply_rotary_pos_emb`: 'mscale ... is not supported by TE's fused RoPE'), per element: t · cos (read e, write
    e), _rotate_half's neg of one half (e/2 + e/2) and cat (2e), · sin (2e), + (3e), and the final cat with the
    empty pass-through part (2e): 12e, 6 kernels (the [s, d] cos and sin tables left out). Backward (a CPU
    profile of the same code: two mul, a neg, a cat, two add_): the products' gradients (2e each), neg (e), the
    halves' cat (2e), the two accumulations into t's gradient (3e each): 13e, 6 kernels. Fused: 2e forward, 4e
    backward."""
    return 12 * e, 6, 13 * e, 6


def eager_swiglu_cost(e: int) -> EagerCost:
    """torchtitan's FeedForward `w2(F.silu(w1(x)) * w3(x))` between its GEMMs, eagerly, per element of the
    ffn width: silu (read e, write e: 2e) and × (read 2e, write e: 3e): 5e, 2 kernels. Backward: the
    product's MulBackward0, one product per input (3e each), and derivatives.yaml's silu_backward, one
    kernel (read grad and x, write: 3e; a backward pass runs without grad mode): 9e, 3 kernels. Fused:
    3e forward, 6e backward."""
    return 5 * e, 2, 9 * e, 3


def _eager(op: Op, elements: float, cost: EagerCost, tensors: int = 1) -> Op:
    """`op` run as an eager chain of `cost` over `elements` elements, its kernels launched once per
    tensor (rotary: q and k). Priced on the elementwise memory curve, reported under its own family:
    the chain is PyTorch's vectorized elementwise and reduce kernels, not the fused norm and
    activation kernels the norm and activation curves were fitted on (vidur's vLLM RMSNorm and
    silu-and-mul: 40% and 52% of HBM bandwidth at their peak); tools/eager_kernels.py checks the
    elementwise curve on eager H100 kernels. An FP8 cast after an eager norm is not fused with it
    (`fp8_casts`: the op before it is no longer a norm)."""
    fwd, kernels, bwd, bwd_kernels = cost
    return replace(
        op,
        family="elementwise",
        label=op.label or op.family,
        amount=fwd * elements,
        count=kernels * tensors,
        backward_amount=bwd * elements,
        backward_count=bwd_kernels * tensors,
    )


def _eager_llama(model: ModelConfig, plan: PlanConfig) -> bool:
    """plan.pointwise_kernels eager (or eager_fused_norm) on a llama model: torchtitan's llama code, op
    by op. Other families keep their fused pricing: their nn.LayerNorm and GELU are one kernel each
    eagerly too (native_layer_norm, gelu)."""
    return plan.eager_pointwise and model.family == "llama"


def _complex_rotary(model: ModelConfig, plan: PlanConfig) -> bool:
    """torchtitan's llama rotary embedding, a complex product, and its repeat_kv copies: run as `eager_rotary_cost`
    and `_repeat_kv` price them eagerly, and compiled too (plan.pointwise_kernels compiled: Inductor generates no
    complex code and falls back to eager's aten.mul; the reshape of the expanded keys and values is a copy SDPA,
    an extern kernel, reads)."""
    return plan.pointwise_kernels != "fused" and model.family == "llama"


def _rmsnorm(op: Op, elements: float, model: ModelConfig, plan: PlanConfig) -> Op:
    """A layer norm over `elements` elements: `op` (one fused kernel; also torchtitan's Triton
    fused_rmsnorm, plan.pointwise_kernels eager_fused_norm), or a llama model's RMSNorm run eagerly
    (`_eager_llama`) as `eager_rmsnorm_cost`."""
    if not _eager_llama(model, plan) or plan.pointwise_kernels == "eager_fused_norm":
        return op
    return _eager(op, elements, eager_rmsnorm_cost(plan.dtype_bytes))


def _repeat_kv(model: ModelConfig, sh: Shapes) -> list[Op]:
    """torchtitan's repeat_kv of the keys and of the values to every query head before SDPA, eagerly
    (models/llama/model.py at 9dec370a and 1ea476e9: unsqueeze, expand, reshape; the reshape of the
    stride-0 expanded view is a copy): read the g key-value heads, write the a query heads, per tensor
    (2 kernels). Backward, ExpandBackward's sum over the repeats reads a heads and writes g: the same
    bytes, 2 kernels. None without grouped-query attention (repeat_kv returns its input). The
    transposes around SDPA copy nothing: its flash backend transposes them back to the [b, s, h, d]
    layout it takes (aten attention.cu _scaled_dot_product_flash_attention_cuda), so the output's
    .contiguous() is one already."""
    a, g = model.num_attention_heads, model.kv_heads
    if g == a:
        return []
    nbytes = 2 * sh.tokens * (a + g) * model.head_dim / sh.t * sh.e
    return [Op("repeat_kv", "elementwise", nbytes, count=2, backward_amount=nbytes, backward_count=2)]


def _moe_block(model: ModelConfig, plan: PlanConfig, sh: Shapes) -> list[Op]:
    """The MoE layer's MLP on one rank, as the module docstring states (DeepSpeed's: `_deepspeed_moe_block`)."""
    if plan.deepspeed_moe:
        return _deepspeed_moe_block(model, plan, sh)
    h, e, E, k = model.hidden_size, sh.e, model.experts, model.moe_top_k
    ep, etp, fe = plan.expert_parallel, plan.etp, model.expert_ffn
    titan = plan.torchtitan_moe
    deepep = plan.moe_token_dispatcher == "torchtitan_deepep"  # tensor_parallel 1 (job.py)
    gathered = titan and plan.tensor_parallel > 1  # `_titan_moe_tp`
    n = sh.tokens if gathered else sh.sp_tokens
    routed = _routed_rows(model, sh) * (etp if gathered else 1)
    local = E // ep
    rows = routed if gathered else routed * etp  # rows through each local expert shard, all experts together
    up = 2 if model.gated_mlp else 1
    shared = _mlp("shared", model.moe_shared_ffn_hidden_size, model, plan, sh, collectives=not gathered)
    dispatch_hides, combine_hides = _moe_a2a_hides(plan, shared)
    counts = _moe_counts(model, plan)
    dedup = (k, E) if plan.dedup_dispatch else ()
    # the rows the gather below reads from and the unpermutation writes: the rank's n tokens, or under torchtitan's
    # DeepEP backend the rows its dispatch delivered (deepep.py _permute_tokens expands them after the dispatch,
    # _unpermute_tokens sums them back before the combine)
    held = n * model.deepep_rows_per_token(ep) if deepep else n
    moe_in, moe_out = _titan_moe_tp(n * h * e) if gathered else ([], [])
    # a gather of the held rows into the routed ones (index_select / x[idx]): its backward zero-fills the held rows
    # and index-adds the routed rows' gradients into them (index_select_backward, torchtitan's index_put accumulate)
    permute = Op("moe_permute", "elementwise", 2 * routed * h * e, backward_amount=(routed + 2 * held) * h * e)
    ops = [
        *moe_in,
        Op("router", "gemm", 2 * n * h * E),
        Op("router_topk", "elementwise", 3 * n * E * 4),  # fp32 logits: softmax read + write, top-k read
        *([] if titan else counts),
        *([] if deepep else [permute]),
        *(counts if titan else []),
        *shared,
        Op(
            "moe_dispatch",
            "ep_comm",
            routed * h * e,
            "alltoall",
            overlaps=dispatch_hides,
            backward_comm="alltoall",
            group="ep",
            dedup=dedup,
        ),
        *_moe_probs(plan, routed, rows, dispatch_hides),
        *([permute] if deepep else []),
    ]
    if etp > 1 and not gathered:
        ops.append(
            Op(
                "moe_dispatch.gather",
                "ep_comm",
                rows * h * e,
                "all_gather",
                backward_comm="reduce_scatter",
                group="etp",
            )
        )
    te = plan.fp8_experts  # Transformer Engine (FP8-capable) expert GEMMs
    pad, unpad = _expert_copies(model, plan, rows, local)
    sort, unsort = _expert_sort(model, plan, rows, local)
    clamp, bias = _megatron_expert_extras(model, plan, rows, local) if not titan else ([], [])
    ops += [
        *sort,
        *pad,
        Op(
            "expert_up",
            "gemm",
            2 * rows * h * up * fe / etp / local,
            count=local,
            label="experts",
            kn=(h, up * fe / etp) if te else (),
        ),
        *clamp,
        Op(
            "expert_act",
            "activation",
            (3 if model.gated_mlp else 2) * rows * fe / etp * e,
            count=1 if plan.moe_grouped_gemm else local,
            label="experts",
        ),
        Op(
            "expert_down",
            "gemm",
            2 * rows * fe / etp * h / local,
            count=local,
            label="experts",
            kn=(fe / etp, h) if te else (),
        ),
        *bias,
        *unpad,
        *unsort,
    ]
    if etp > 1 and not gathered:
        ops.append(
            Op(
                "moe_combine.scatter",
                "ep_comm",
                rows * h * e,
                "reduce_scatter",
                backward_comm="all_gather",
                group="etp",
            )
        )
    combine = Op(
        "moe_combine",
        "ep_comm",
        routed * h * e,
        "alltoall",
        overlaps=combine_hides,
        overlaps_backward=not titan,
        backward_comm="alltoall",
        group="ep",
        dedup=dedup,
    )
    # read the copies and their weights, write the held rows: after the combine, or before it under DeepEP, whose
    # combine sums each token's rows from the ranks that held it
    unpermute = Op("moe_unpermute", "elementwise", (2 * routed + held) * h * e)
    return [*ops, *((unpermute, combine) if deepep else (combine, unpermute)), *moe_out]


def _titan_moe_tp(nbytes: float) -> tuple[list[Op], list[Op]]:
    """torchtitan's MoE layer under tensor parallelism (models/llama4/infra/parallelize.py apply_moe_ep_tp, the
    same for its other MoE models; torch.distributed.tensor.parallel PrepareModuleInputOutput): the layer's input,
    `nbytes` once gathered, all-gathered over the tensor-parallel ranks before it (Shard(1) to Replicate; its
    gradient, Partial, reduce-scattered back) and its output, Partial, reduce-scattered after it (Shard(1); its
    gradient all-gathered), both blocking. Within it the router runs on every token on each rank (NoParallel) and
    the shared experts, column- then row-parallel, take the gathered input and leave their output Partial with no
    collective of their own; with expert_tensor_parallel 1 its ReordererSequenceParallel splits the routed tokens
    over the tensor-parallel ranks (Megatron-Core's sequence-parallel share), with expert_tensor_parallel = tp
    (ExpertTensorParallel) every rank routes and sends all of them over its expert group, with no expert-tensor
    collective (`_moe_block`). As the newer torchtitan runs it (the gradients Partial: local_output_grad_placements,
    ColwiseParallelWithGradPlacement); before, the shared experts' input gradient was all-reduced and the layer's
    taken as Replicate."""
    gather = Op("moe_in.all_gather", "tp_comm", nbytes, "all_gather", backward_comm="reduce_scatter")
    return [gather], [Op("moe_out.reduce_scatter", "tp_comm", nbytes, "reduce_scatter", backward_comm="all_gather")]


def einsum_gating_cost(k: int, e: int) -> tuple[int, int, int, int]:
    """(forward bytes, forward kernels, backward bytes, backward kernels) per element of the tokens × experts ×
    capacity tensors DeepSpeed's gating builds for its einsums (deepspeed/moe/sharded_moe.py at 38327e0), `e`
    the activations' bytes:
    - top-1 (top1gating): combine_weights = einsum("se,sc->sec") written in fp32 (4), dispatch_mask =
      its .bool() (read 4, write 1), and MOELayer's casts of the mask (read 1, write e) and of the weights
      (read 4, write e) to the activations' dtype: 14 + 2e, 4 kernels.
    - top-2 (top2gating): two such products (8) and their sum (read 8, write 4): 30 + 2e, 6 kernels.
    - top-k, k > 2 (topkgating): F.one_hot of the slots over the capacity, int64 (8), its .float() (read 8,
      write 4), einsum("se,sec->sec") (read 4, write 4), the bool and the casts: 38 + 2e, 6 kernels.
    Backward, from the combine einsum's gradient of the weights: its cast to fp32 (read e, write 4), then per
    product its gates' gradient, a sum over the slots (top-1/2: read 4 each, k kernels), or for top-k the
    product with the saved one-hot (read 8, write 4) and its sum (read 4): e + 4 + 4k or e + 20."""
    if k > 2:
        return 38 + 2 * e, 6, e + 20, 3
    return 4 * k + 12 * (k - 1) + 10 + 2 * e, 2 * k + 2, e + 4 + 4 * k, 1 + k


def _token_drop(name: str, full: float, tp: int) -> list[Op]:
    """DeepSpeed's drop_tokens before an all-to-all with tensor parallelism (deepspeed/moe/mappings.py at 38327e0):
    a narrow of the capacity to this rank's 1/tp share of `full` bytes, which the all-to-all makes contiguous
    (read and write the share); its backward, _gather_tokens: an all-gather of `full` over the tensor-parallel
    ranks, then torch.cat along the capacity (read and write `full`)."""
    if tp == 1:
        return []
    return [
        Op(f"{name}.drop", "elementwise", 2 * full / tp, backward_amount=2 * full),
        Op(f"{name}.drop_gather", "ep_comm", full, "", backward_comm="all_gather", group="tp"),
    ]


def _token_gather(name: str, full: float, tp: int) -> list[Op]:
    """DeepSpeed's gather_tokens after an all-to-all with tensor parallelism: an all-gather of `full` bytes over the
    tensor-parallel ranks and torch.cat along the capacity (read and write `full`); its backward, a narrow that
    the next all-to-all makes contiguous (read and write the 1/tp share)."""
    if tp == 1:
        return []
    return [
        Op(f"{name}.gather", "ep_comm", full, "all_gather", group="tp"),
        Op(f"{name}.gather_cat", "elementwise", 2 * full, backward_amount=2 * full / tp),
    ]


def _deepspeed_dispatch(model: ModelConfig, plan: PlanConfig, n: float, slots: float) -> tuple[list[Op], list[Op]]:
    """(dispatch, combine) of DeepSpeed's MOELayer for `n` tokens into `slots` padded slots (S and EC of
    `_deepspeed_moe_block`), reported under the family moe_einsum or moe_gather, e the activations' bytes.
    einsum (before v0.19.4): the S×EC gating tensors (`einsum_gating_cost`); dispatch, einsum("sec,sm->ecm"), a GEMM
    of 2·S·EC·h FLOPs whose mask takes no gradient (backward, the input's alone); combine, einsum("sec,ecm->sm"), as
    many FLOPs, backward both operands' gradients.
    gather (from v0.19.4, sharded_moe.py _sparse_encode, _sparse_decode): the gate hands back each route's expert,
    slot and weight; dispatch, the input with a zero row appended (torch.cat: read S rows, write them) and
    index_select of the EC slots' rows (read and write EC rows), 6 kernels with the slot map's; backward,
    index_select's zero-filled S rows and index_add of the EC (EC + 2S rows, 2 kernels). Combine, the expert
    output with a zero row appended (2·EC rows), index_select of each token's k rows (2·k·S), their product with
    the fp32 weights (read e, write 4 a k·S element), its sum over the k (read 4, write 4 an S element) and the
    cast back (read 4, write e): 2·EC·e + k·S·(3e + 8) + S·(8 + e) bytes a unit of h, 6 kernels; backward the
    cast's (e + 4 an S element), the product's for the rows (read 4, write 4, cast: read 4, write e) and for the
    weights (read 4 and e, write 4, summed: read 4) and index_select's into EC rows (k·S + 2·EC rows of e):
    S·(e + 4) + k·S·(24 + 3e) + 2·EC·e a unit of h, 7 kernels. The slot map's int64 work (about 8 bytes a slot
    against 2h of a row) is left out."""
    h, e, k = model.hidden_size, plan.dtype_bytes, model.moe_top_k
    family = f"moe_{plan.moe_token_dispatcher}"
    if plan.moe_token_dispatcher == "einsum":
        gating, kernels, gating_bwd, kernels_bwd = einsum_gating_cost(k, e)
        dispatch = [
            Op(
                "moe_gating",
                "elementwise",
                gating * n * slots,
                count=kernels,
                label=family,
                backward_amount=gating_bwd * n * slots,
                backward_count=kernels_bwd,
            ),
            Op("moe_dispatch_einsum", "gemm", 2 * n * slots * h, label=family, weight_grad=False),
        ]
        return dispatch, [Op("moe_combine_einsum", "gemm", 2 * n * slots * h, label=family)]
    encode = Op(
        "moe_dispatch_gather",
        "elementwise",
        2 * (n + slots) * h * e,
        count=6,
        label=family,
        backward_amount=(slots + 2 * n) * h * e,
        backward_count=2,
    )
    routes = k * n
    decode = Op(
        "moe_combine_gather",
        "elementwise",
        (2 * slots * e + routes * (3 * e + 8) + n * (8 + e)) * h,
        count=6,
        label=family,
        backward_amount=(n * (e + 4) + routes * (24 + 3 * e) + 2 * slots * e) * h,
        backward_count=7,
    )
    return [encode], [decode]


def _deepspeed_capacity(model: ModelConfig, plan: PlanConfig) -> list[Op]:
    """DeepSpeed's dropless gating (drop_tokens False: model.moe_capacity_factor unset; sharded_moe.py top1/2/k
    gating at 38327e0 and from v0.19.4): the capacity is the busiest expert's count, torch.max over the rank's
    counts, all-reduced (max) as one int64 over the expert-parallel group (from v0.19.4 only when it has more than
    one rank; priced so), which the host then reads (`moe_host_wait`). None with a capacity factor."""
    if model.moe_capacity_factor is not None or plan.expert_parallel == 1:
        return []
    return [Op("moe_capacity", "ep_comm", 8, "all_reduce", group="ep")]


def _deepspeed_moe_block(model: ModelConfig, plan: PlanConfig, sh: Shapes) -> list[Op]:
    """DeepSpeed's MoE layer on one rank (plan.moe_token_dispatcher einsum or gather: deepspeed/moe/sharded_moe.py
    TopKGate and MOELayer at 38327e0 and from v0.19.4, GShard's Algorithm 2, with drop_tokens as Megatron-DeepSpeed
    runs it; where it is priced: config/job.py _deepspeed_moe_problems). S, the micro-batch's tokens, whole on
    every tensor-parallel rank; EC slots, every expert's capacity C (ModelConfig.deepspeed_capacity: with a
    capacity factor, k·cf·S/E rounded up, at least Megatron-DeepSpeed's --moe-min-capacity, 4) padded, so every
    expert runs C rows whatever the balance; dropless (no capacity factor), C is the busiest expert's count,
    k·S/E times model.moe_token_imbalance (taken as the busiest expert's share: `_deepspeed_capacity`), in whole
    tokens, rounded up to a multiple of tp beside whole experts.
    - router: an fp32 gate (input.float(), priced with its S×E work; the fp32 GEMM at the training dtype's
      curve, E / (3·k·expert_ffn) of the experts' FLOPs) and its ~30 small S×E kernels (softmax, argmax or top-k,
      cumsum, the auxiliary loss) priced as one pass over the fp32 logits, as the other dispatchers' routers.
    - dispatch into the slots and combine out of them (`_deepspeed_dispatch`).
    - with tensor parallelism: drop_tokens before the dispatch's all-to-all and gather_tokens after the
      combine's (`_token_drop`, `_token_gather`); each all-to-all sends EC·h/tp. Whole experts (expert tensor
      parallel 1, its default) run this rank's EC/tp slots; experts split over the tensor-parallel ranks
      (expert tensor parallel = tp) run all EC, gathered after the dispatch and dropped before the combine.
    - experts (deepspeed/moe/experts.py): each local expert runs its chunk of the slots, a strided view with
      expert parallelism that its first matmul copies (backward: chunk's cat of the input gradients), their
      outputs concatenated (`_expert_copies`, sequential); Megatron-DeepSpeed's ParallelMLP(moe=True), over the
      expert width / etp, with etp > 1 its f and g all-reduces priced as one each way over all local experts'
      rows (local of them run, each 1/local of the bytes); whole experts have none (layers.py
      is_expert_without_slicing).
    - a shared expert is PR-MoE's residual MLP, run after the experts' layer returns, and mixed in
      (`_residual_moe`).
    With a capacity factor no host wait (the capacity comes from shapes on the host); no probabilities sent."""
    h, e, E = model.hidden_size, sh.e, model.experts
    tp, etp, ep, fe = plan.tensor_parallel, plan.etp, plan.expert_parallel, model.expert_ffn
    local, up = E // ep, 2 if model.gated_mlp else 1
    n = sh.tokens
    slots = E * float(model.deepspeed_capacity(n, tp if etp == 1 else 1))  # EC, all experts' capacity
    full = slots * h * e
    rows = slots * etp / tp  # the slots this rank's experts run: all EC split over tp, EC/tp whole
    run, split = rows * h * e, full if etp > 1 else 0.0  # split: the f collective's bytes (none whole)
    dispatch, combine = _deepspeed_dispatch(model, plan, n, slots)
    ops = [
        Op("router", "gemm", 2 * n * h * E),
        Op("router_topk", "elementwise", 3 * n * E * 4 + (e + 4) * n * h),  # + the input's cast to fp32
        *_deepspeed_capacity(model, plan),
        *dispatch,
        *_token_drop("moe_dispatch", full, tp),
        Op("moe_dispatch", "ep_comm", full / tp, "alltoall", backward_comm="alltoall", group="ep"),
        *_token_gather("moe_dispatch", full, etp),
    ]
    if local > 1:  # the chunks: copied by their matmuls with expert parallelism (strided), cat backward
        chunked = 2 * run if ep > 1 else 0.0
        ops.append(Op("moe_sort", "elementwise", chunked, count=int(ep > 1), backward_amount=2 * run, backward_count=1))
    pad, cat = _expert_copies(model, plan, rows, local)
    act_bytes = (3 if model.gated_mlp else 2) * rows * fe / etp * e
    ops += [
        *pad,
        Op("expert_up", "gemm", 2 * rows * h * up * fe / etp / local, count=local, label="experts", f_bytes=split),
        Op("expert_act", "activation", act_bytes, count=local, label="experts"),
        Op("expert_down", "gemm", 2 * rows * fe / etp * h / local, count=local, label="experts"),
        *(_g("expert_out", full, plan) if etp > 1 else []),
        *cat,
        *_token_drop("moe_experts", full, etp),
        Op("moe_combine", "ep_comm", full / tp, "alltoall", backward_comm="alltoall", group="ep"),
        *_token_gather("moe_combine", full, tp),
        *combine,
        *_residual_moe(model, plan, sh),
    ]
    return ops


def _residual_moe(model: ModelConfig, plan: PlanConfig, sh: Shapes) -> list[Op]:
    """PR-MoE's residual MLP, DeepSpeed's shared expert (deepspeed/moe/layer.py MoE.forward with use_residual at
    38327e0), after the experts' layer returns: the MLP (a routed expert's copy, `_mlp`), then its mixing
    coefficient over the n tokens (e the activations' bytes): `self.coefficient`, a Linear(h, 2) (2·n·h·2 FLOPs),
    its softmax over the 2 (read and write 2e a token), and `output * coef[..., 0:1] + output_mlp * coef[..., 1:]`:
    two products (read n·h·e, write n·h·e each) and their sum (read 2, write 1): 7·n·h·e + 4·n·e in 4 kernels.
    Backward: each product's gradient for its tensor (read and write n·h·e) and for its coefficient (the product
    with the saved tensor written, then summed over h: read 2, write 1, read 1), 12·n·h·e + 4·n·e (with the
    softmax's) in 7 kernels; the sum's passes through."""
    width = model.moe_shared_ffn_hidden_size
    if width == 0:
        return []
    n, h, e = sh.tokens, model.hidden_size, sh.e
    return [
        *_mlp("shared", width, model, plan, sh, whole=plan.whole_residual_mlp),
        Op("residual_coef", "gemm", 2 * n * h * 2),
        Op(
            "residual_mix",
            "elementwise",
            7 * n * h * e + 4 * n * e,
            count=4,
            backward_amount=12 * n * h * e + 4 * n * e,
            backward_count=7,
        ),
    ]


def _moe_a2a_hides(plan: PlanConfig, shared: list[Op]) -> tuple[str, str]:
    """The kernels (Op.overlaps) the token dispatch's and the combine's all-to-alls run beside: another
    micro-batch's attention with plan.moe_a2a_overlap; with plan.moe_shared_expert_overlap (Megatron-Core
    moe/shared_experts.py, its own stream) the shared experts' fc1 beside the dispatch and their fc2 beside the
    combine; under torchtitan's dispatcher the forward combine beside the whole shared expert, which its
    MoE.forward runs between the routed experts and the combine's first use (models/moe/moe.py: 'we execute the
    shared expert before scoring the output of the routed expert to "implicitly" overlap the shared expert
    compute with token combine communication'; the backward runs the shared expert's gradients first, then
    the combine's all-to-all: none there); its DeepEP backend alike (models/moe/moe_deepep.py DeepEPMoE: the combine
    returns before it ends, the shared experts run, then sync_combine; backward, each of DeepEP's exchanges waits
    for its end on the compute stream, deepep.py `after_event.current_stream_wait()`). Otherwise nothing: the
    shared experts run in turn with the all-to-alls ('Without this, the shared experts execute before the
    router')."""
    if plan.moe_a2a_overlap:
        hides = CORE_ATTENTION if plan.flash_attention else f"{CORE_ATTENTION}.values"
        return hides, hides
    if shared and plan.moe_shared_expert_overlap:
        return "shared_up", "shared_down"
    if shared and plan.torchtitan_moe:
        return "", "+".join(op.name for op in shared if op.family in COMPUTE_FAMILIES)
    return "", ""


def _moe_probs(plan: PlanConfig, routed: float, rows: float, dispatch_hides: str) -> list[Op]:
    """The routing probabilities' own exchange under Megatron-Core's alltoall dispatcher (plan.moe_probs_alltoall,
    Megatron-Core >= 0.13, token_dispatcher.py at d98e8a64): token_dispatch sends the `routed` copies' fp32
    probabilities (4 bytes each) in an all-to-all after the tokens' and the shared experts' fc1 ("Forward launch
    order: tokens A2A -> shared experts fc1 -> probs A2A"), so only plan.moe_a2a_overlap's attention hides it;
    dispatch_postprocess all-gathers them over the expert-tensor group (`rows`, 4 bytes each) with
    expert_tensor_parallel > 1. Their gradients return by the same collectives' backward."""
    if not plan.moe_probs_alltoall or plan.moe_token_dispatcher != "alltoall" or plan.expert_parallel == 1:
        return []
    hides = dispatch_hides if plan.moe_a2a_overlap else ""
    probs = [
        Op(
            "moe_dispatch.probs",
            "ep_comm",
            4 * routed,
            "alltoall",
            overlaps=hides,
            backward_comm="alltoall",
            group="ep",
        )
    ]
    if plan.etp > 1:
        probs.append(
            Op(
                "moe_dispatch.probs_gather",
                "ep_comm",
                4 * rows,
                "all_gather",
                backward_comm="reduce_scatter",
                group="etp",
            )
        )
    return probs


def _routed_rows(model: ModelConfig, sh: Shapes) -> float:
    """Routed token copies this rank sends and the busiest rank receives: top_k of each sequence-parallel token,
    times the router's load (ModelConfig.moe_load)."""
    return sh.sp_tokens * model.moe_top_k * model.moe_load()


def _megatron_expert_extras(model: ModelConfig, plan: PlanConfig, rows: float, local: int) -> tuple[list[Op], list[Op]]:
    """Eager work Megatron-Core's grouped experts (TEGroupedMLP, moe/experts.py at b0cc2706) run beside the
    GEMMs and the fused activation, over this rank's `rows` routed rows of `local` experts (e the activations'
    bytes):
    - model.glu_clamp (GPT-OSS): fused_bias_geglu.py weighted_bias_quick_geglu_impl clamps the gate and the
      linear half and concatenates them before its fused kernel: two clamps (2e each per element of the
      fc1 output's 2·f) and a cat (2e): 8e per element of the width f, 3 kernels; backward, autograd's clamp
      masks, le + where for the gate (3e + 2), ge + le + logical_and + where for the linear half (4e + 6), and
      chunk's cat of the two gradients (4e): 11e + 8, 7 kernels. Run again under recompute_modules moe_act.
    - model.biases: linear_fc2 returns its bias (skip_bias_add) and `_apply_bias` adds it per local expert,
      `t + b * p` with the copy's routing probability (16-bit, the router's dtype), then a cat: forward the
      outer product written (2e), the add (3e), the cat (2e) per element of the output (rows × h); backward
      the two products' gradients and their sums (3e each side) and the cat of the split gradients (2e): 6e
      forward in 2·local + 1 kernels, 8e backward in 4·local + 1. fc1's bias is added inside its GEMM."""
    e, width = plan.dtype_bytes, model.expert_ffn / plan.etp
    clamp = []
    if model.glu_clamp is not None and model.gated_mlp:
        n = rows * width
        clamp = [
            Op(
                "expert_act_clamp",
                "elementwise",
                8 * e * n,
                count=3,
                label="experts",
                backward_amount=(11 * e + 8) * n,
                backward_count=7,
            )
        ]
    bias = []
    if model.biases:
        n = rows * model.hidden_size
        bias = [
            Op(
                "expert_down_bias",
                "elementwise",
                6 * e * n,
                count=2 * local + 1,
                label="experts",
                backward_amount=8 * e * n,
                backward_count=4 * local + 1,
            )
        ]
    return clamp, bias


def dispatch_share(dedup: tuple[int, int] | tuple[()], ranks: int, nodes: int, per_node: int = 0) -> float:
    """The share of a per-expert all-to-all's bytes that a deduplicating dispatch moves over the link that
    bounds it: Megatron-Core's flex dispatcher (moe/fused_a2a.py FusedDispatch: DeepEP's get_dispatch_layout gives
    is_token_in_rank and num_tokens_per_rdma_rank, and buffer.dispatch sends a token once to each GPU of its node
    that holds one of its experts and once over RDMA to each other node that does, forwarding it there over
    NVLink). `dedup`: (k experts per token, E experts), the k drawn evenly without replacement (balanced
    routing), E/G experts on each of G groups: G = `nodes` across nodes (the NIC-bound part: the per-expert
    all-to-all sends k (nodes − 1)/nodes copies off a node, the flex one (nodes − 1)·P), else G = `ranks`
    (k copies against ranks·P); P = 1 − C(E − E/G, k) / C(E, k), the chance a group holds one of the k.
    The share is G·P/k: 8 of 128 experts over 2 nodes 0.249, over 8 GPUs of one node 0.667. Nodes holding unequal
    numbers of the group's `per_node` ranks (the last one fewer): each node's own P from its experts, a sender's
    copies off its node against the per-expert dispatcher's k·(experts off its node)/E, over the senders."""
    if not dedup:
        return 1.0
    k, experts = dedup
    if k <= 1 or ranks <= 1:
        return 1.0
    per_rank = experts // ranks
    if nodes > 1:
        full = per_node or -(-ranks // nodes)
        held = [full * per_rank] * (nodes - 1) + [(ranks - full * (nodes - 1)) * per_rank]  # experts on each node
    else:
        held = [per_rank] * ranks
    hit = [expert_hit_chance(experts, k, e) for e in held]
    senders = [e / per_rank for e in held]  # ranks on each group
    dedup_copies = sum(w * (sum(hit) - own) for w, own in zip(senders, hit, strict=True))
    plain_copies = sum(w * k * (experts - e) / experts for w, e in zip(senders, held, strict=True))
    return dedup_copies / plain_copies


def _moe_counts(model: ModelConfig, plan: PlanConfig) -> list[Op]:
    """The exchange of the tokens-per-expert counts that sizes the token all-to-all, blocking the compute stream
    (what the host's wait waits for, moe_host_wait): Megatron-Core's MoEAlltoAllTokenDispatcher.preprocess
    all-gathers each rank's E int64 counts over the expert-tensor × expert group (gather_from_sequence_parallel_
    region; not when padding to capacity, nor with expert_parallel and expert_tensor_parallel 1), priced over the
    EP group (the expert-TP group with EP 1) with the gathered bytes; torchtitan's ExpertParallel._token_dispatch
    all-to-alls its E float32 counts (torch.histc) over the EP group with EP > 1, after the tokens' reordering.
    DeepEP's (flex, torchtitan_deepep) get_dispatch_layout counts on the rank and its notify step travels inside
    the dispatch: none. The counts carry no gradient: no backward collective."""
    E, ep, etp = model.experts, plan.expert_parallel, plan.etp
    if plan.moe_token_dispatcher == "torchtitan":
        return [Op("moe_counts", "ep_comm", 4 * E, "alltoall", group="ep")] if ep > 1 else []
    if model.moe_pad_to_capacity or ep * etp == 1 or plan.dedup_dispatch:
        return []
    return [Op("moe_counts", "ep_comm", 8 * E * ep * etp, "all_gather", group="ep" if ep > 1 else "etp")]


def moe_host_wait(model: ModelConfig, plan: PlanConfig) -> tuple[str, str] | None:
    """Where the host waits for the device in an MoE layer's forward (`_moe_block`'s ops), to learn how many
    tokens go where before it can launch the rest: (the last op waited for, the last op launched before the
    wait), or None where it never waits. Backward reuses the host's split lists (no wait); a recomputed
    forward waits again (transformer.py moe_wait_split).

    alltoall, Megatron-Core's MoEAlltoAllTokenDispatcher (NVIDIA/Megatron-LM d98e8a64
    megatron/core/transformer/moe/token_dispatcher.py): `preprocess` counts the tokens per expert (and
    all-gathers the counts, _moe_counts), their device-to-host copies run on a side stream after the compute
    stream's work ("before_permutation_1", `_maybe_dtoh_and_synchronize` records d2h_event there) and the host
    calls d2h_event.synchronize() at `cuda_sync_point`, the earliest `preprocess` asks for: with padding to
    capacity (drop_and_pad, model.moe_pad_to_capacity) none; with a capacity factor without padding before
    permutation 1 (the routed rows' count sizes its output); dropless
    with expert_parallel or expert_tensor_parallel > 1 before the token all-to-all ("before_ep_alltoall":
    permutation 1 is launched before it); else before the expert GEMMs ("before_permutation_2" or
    "before_finish": permutation 1, the shared experts' launches and the no-op all-to-all before it). It waits
    for the router and the counts only.

    torchtitan, ExpertParallel._token_dispatch (pytorch/torchtitan 7e4ab859 distributed/expert_parallel.py): with
    expert_parallel > 1 the counts' all-to-all, then output_splits.to(cpu, non_blocking=False), a copy on the
    compute stream that the host waits for: everything issued before it (router, the tokens' reordering, the
    counts; the shared experts run after the routed ones, models/moe/moe.py MoE.forward). With expert_parallel 1
    the grouped GEMM takes the counts on the device: no wait. Not priced: torchtitan's for-loop experts
    (moe_grouped_gemm false), whose num_tokens_per_expert.tolist() waits again before the experts
    (models/moe/moe.py _run_experts_for_loop).

    torchtitan_deepep, its DeepEP backend (distributed/deepep/deepep.py at 9810191^): buffer.dispatch without a
    handle nor num_worst_tokens spins the host until the notify step has told it how many rows arrive, before it
    allocates them and launches the dispatch (DeepEP's normal-mode dispatch); the notify runs after the router's
    kernels, which the host waits for (the notify's own latency is not priced).

    einsum and gather, DeepSpeed's MOELayer: with drop_tokens the capacity comes from the tokens' count and the
    capacity factor on the host (sharded_moe.py _capacity over CPU tensors), one_hot takes it as num_classes: no
    wait; dropless, the host reads the all-reduced busiest count (38327e0: one_hot's num_classes; from v0.19.4
    MOELayer's `C = int(C)`) right after the gate's exchange, which it waits for."""
    if plan.moe_token_dispatcher == "torchtitan":
        return ("moe_counts", "moe_counts") if plan.expert_parallel > 1 else None
    if plan.moe_token_dispatcher == "torchtitan_deepep":
        return "router_topk", "router_topk"
    if plan.deepspeed_moe:
        waited = "moe_capacity" if _deepspeed_capacity(model, plan) else "router_topk"
        return None if model.moe_capacity_factor is not None else (waited, waited)
    if model.moe_pad_to_capacity:
        return None
    waited = "moe_counts" if _moe_counts(model, plan) else "router_topk"
    if model.moe_capacity_factor is not None:
        return waited, waited
    if plan.expert_parallel > 1 or plan.etp > 1:
        return waited, "moe_permute"
    return waited, "moe_dispatch"


#: rows of an FP8 GEMM operand come in multiples of this (Transformer Engine's FP8 alignment:
#: Megatron-Core get_align_size_for_quantization, 16 for FP8 recipes)
FP8_ROW_ALIGN = 16


def _expert_sort(model: ModelConfig, plan: PlanConfig, rows: float, local: int) -> tuple[list[Op], list[Op]]:
    """The second permutation: the `rows` rows of h a rank received, in source-rank order, copied into
    local-expert order before the expert GEMMs and copied back after them (a read and a write each way):
    - Megatron-Core's MoEAlltoAllTokenDispatcher with more than one local expert (token_dispatcher.py
      dispatch_postprocess "Permutation 2: Sort tokens by local expert", sort_chunks_by_idxs, or with
      drop-and-pad a transpose(0, 1).contiguous(); combine_preprocess "Unpermutation 2" the reverse):
      the backward of each is the same copy of the gradients (torch.cat's backward of a split, or
      TE's fused moe_sort_chunks_by_index).
    - torchtitan's AllToAllTokenDispatcher with expert parallelism (models/common/token_dispatcher.py
      _permute after the all-to-all: routed_input_RD[permuted_indices] from rank-major to
      expert-major; _unpermute before the combine's all-to-all: out[permuted_indices] = output): the
      backward as the first permutation's (moe_permute), twice the forward's bytes.
    Each is one kernel forward and one backward; the routing probabilities sorted beside the rows
    (fp32, 1/h of them) are left out. torchtitan's DeepEP backend has none: its one gather after the dispatch
    (moe_permute) puts the rows in expert order."""
    nbytes = rows * model.hidden_size * plan.dtype_bytes
    titan = plan.moe_token_dispatcher == "torchtitan"
    if plan.moe_token_dispatcher == "torchtitan_deepep":
        return [], []
    if (titan and plan.expert_parallel == 1) or (not titan and local == 1):
        return [], []
    backward = 4 * nbytes if titan else 2 * nbytes
    sort = Op("moe_sort", "elementwise", 2 * nbytes, backward_amount=backward)
    return [sort], [replace(sort, name="moe_unsort")]


def _expert_copies(model: ModelConfig, plan: PlanConfig, rows: float, local: int) -> tuple[list[Op], list[Op]]:
    """The copies Megatron-Core makes of the `rows` rows of h (all `local` experts together) around
    the expert GEMMs (megatron/core/transformer/moe/experts.py), before and after them:
    - grouped (TEGroupedMLP, plan.moe_grouped_gemm) under Transformer Engine FP8 (delayed or tensorwise
      experts): every expert's rows copied into a buffer padded to a multiple of FP8_ROW_ALIGN
      (Fp8Padding, core_r0.10.0 onwards) and the output rows copied back (Fp8Unpadding): each one
      kernel forward, one backward, that reads and writes the rows (TE module/fp8_padding.py,
      fp8_unpadding.py: fused_multi_row_padding / unpadding). Unless the router pads the routing map
      (--moe-router-padding-for-fp8, off by default; not a plan field).
    - sequential (SequentialMLP): the rows are split into views per expert; under FP8 an expert whose
      rows are not a multiple of FP8_ROW_ALIGN is padded (_pad_tensor_for_quantization: zeros and
      torch.cat for the rows and for their routing probabilities, 4 kernels; its backward, the
      output's slice back to the rows, SliceBackward's zero fill and copy: 3 reads and writes, 2
      kernels). Every expert pads unless each gets a fixed number of rows that is a multiple of the
      alignment (model.moe_pad_to_capacity): routed counts vary from micro-batch to micro-batch,
      15 in 16 of them not multiples (an upper bound). With more than one local expert the outputs
      are concatenated (torch.cat: read and write the rows, one kernel) and, backward, the input
      gradients of the split (split_with_sizes_backward: torch.cat, the same).
    The pad rows, fewer than FP8_ROW_ALIGN per expert, are left out of the bytes."""
    nbytes = rows * model.hidden_size * plan.dtype_bytes
    fp8 = plan.dtype == "fp8" and plan.fp8_recipe != "rowwise" and plan.fp8_experts
    if plan.moe_grouped_gemm:
        if not fp8:
            return [], []
        return [Op("moe_fp8_pad", "elementwise", 2 * nbytes, label="experts", backward_amount=2 * nbytes)], [
            Op("moe_fp8_unpad", "elementwise", 2 * nbytes, label="experts", backward_amount=2 * nbytes)
        ]
    aligned = model.moe_pad_to_capacity and (rows / local) % FP8_ROW_ALIGN == 0
    pad: list[Op] = []
    if fp8 and not aligned:
        pad = [
            Op(
                "moe_fp8_pad",
                "elementwise",
                2 * nbytes,
                count=4 * local,
                label="experts",
                backward_amount=3 * nbytes,
                backward_count=2 * local,
            )
        ]
    cat = [Op("moe_expert_cat", "elementwise", 2 * nbytes, label="experts", backward_amount=2 * nbytes)]
    return pad, cat if local > 1 else []


def backward_of(forward: list[Op], plan: PlanConfig) -> list[Op]:
    """Backward ops for a forward list (reverse order); the f and g operators' backward
    collectives as the module docstring states."""
    out: list[Op] = []
    gemms = {op.name for op in forward if op.family == "gemm"}
    for op in reversed(forward):
        if op.family == "gemm":
            dgrad, wgrad = f"{op.name}.dgrad", f"{op.name}.wgrad"
            out.append(replace(op, name=dgrad, f_bytes=0.0))
            out += [replace(op, name=wgrad, f_bytes=0.0)] if op.weight_grad else []
            out += _dgrad_sum(op, plan)
            if op.f_bytes and plan.tensor_parallel > 1:
                # Transformer Engine's bulk overlaps under tp_comm_overlap take SMs from dgrad and wgrad;
                # DTensor's (vanilla TP) run where their results are first used, beside nothing
                dtensor = plan.tp_layout == "dtensor"
                vanilla = dtensor and not plan.tp_comm_overlap
                if plan.sequence_parallel and (not vanilla or plan.recompute == "selective"):
                    margin = _sm_margin(plan, op.name, "dgrad")
                    beside = "" if vanilla else dgrad
                    moved = _float8_gathered(op.f_bytes, plan)
                    out.append(
                        Op(f"{op.name}.regather", "tp_comm", moved, "all_gather", overlaps=beside, sm_margin=margin)
                    )
                    if _dim1_copies(plan):
                        out.append(Op(f"{op.name}.regather_cat", "elementwise", 2 * moved))
                kind = "reduce_scatter" if plan.sequence_parallel else "all_reduce"
                margin = _sm_margin(plan, op.name, "wgrad")
                # async TP's micro-pipeline fuses a reduce-scatter only into the matmul that feeds it: DTensor's
                # input gradient is a sum of its separate projections' (wq, wk, wv; w1, w3), so it runs unfused;
                # Megatron's all-reduce runs beside the wgrad only where it is asynchronous (plan.tp_allreduce_overlap)
                synchronous = kind == "all_reduce" and not plan.tp_allreduce_overlap
                beside = "" if dtensor or synchronous else wgrad
                if dtensor and plan.tp_comm_overlap and plan.sequence_parallel and plan.micro_batch_size > 1:
                    out.append(Op(f"{op.name}.dgrad_chunk_cat", "elementwise", 2 * op.f_bytes))
                out.append(
                    Op(f"{op.name}.dgrad_{kind}", "tp_comm", op.f_bytes, kind, overlaps=beside, sm_margin=margin)
                )
        elif op.family == "attention":
            shape = op.attention and replace(op.attention, backward=True)
            out.append(replace(Op(f"{op.name}.bwd", "attention", 2.5 * op.amount), attention=shape))
        elif op.family in COMM_FAMILIES:
            if op.backward_comm:  # beside the backward of the kernel it hid behind forward
                beside = op.overlaps if op.overlaps_backward else ""
                hides = beside and beside + (".dgrad" if beside in gemms else ".bwd")
                # a reduce-scatter's backward all-gather beside the dgrad: TE's ring exchange, no margin
                chunked = "ring_exchange" if op.chunked else ""
                out.append(
                    replace(
                        op,
                        name=f"{op.name}.bwd",
                        comm_kind=op.backward_comm,
                        overlaps=hides,
                        sm_margin=0,
                        chunked=chunked,
                    )
                )
        elif op.family == "cp_comm":
            out += _cp_backward(op, plan)
        elif op.backward_amount != 0:  # 0: an op run without gradient (a training metric) has no backward
            amount = op.backward_amount if op.backward_amount >= 0 else 2 * op.amount
            share = op.backward_share or op.bandwidth_share
            out.append(
                replace(
                    op, name=f"{op.name}.bwd", amount=amount, count=op.backward_count or op.count, bandwidth_share=share
                )
            )
    return out


def _recomputed(op: Op) -> Op:
    """`op` run again in the backward: named recompute.<name>, beside the recomputed kernels it overlaps."""
    hides = "+".join(f"recompute.{name}" for name in op.overlaps.split("+")) if op.overlaps else ""
    return replace(op, name=f"recompute.{op.name}", overlaps=hides)


def layer_backward(
    model: ModelConfig, plan: PlanConfig, moe: bool = False, windowed: bool = False, recompute: str = ""
) -> list[Op]:
    """Backward ops of one layer, with the recomputation asked for first: `recompute` (a layer's
    own under recompute_method block or recompute_every, memory.full_recompute_share), else the plan's,
    and the micro-batch's gradient accumulation last (grad_accumulation_ops over the layer's parameters on
    this GPU, its routed experts' included).

    full: the whole layer forward runs again. selective (Megatron-Core's modules): `_module_ops`.
    selective op (torchtitan): `_op_recompute` (its policy saves the SDPA outputs: fused attention does
    not run again).
    """
    fwd = layer_forward(model, plan, moe, windowed)
    kind = recompute or plan.recompute
    again: list[Op] = []
    if kind == "full":
        again = [_recomputed(o) for o in fwd]
    elif kind == "selective" and plan.selective_recompute == "op":
        again = _op_recompute(model, fwd)
    elif kind == "selective":
        prefixes = _module_ops(plan.recompute_modules, moe, model.mla)
        again = [_recomputed(o) for o in fwd if o.name.startswith(prefixes)]
        again += _restored_outputs(model, plan, moe)
    params = model.layer_params_per_rank(plan.tensor_parallel, moe, whole_mlp=moe and plan.whole_residual_mlp)
    if moe:
        params += model.expert_params_per_rank(plan.expert_parallel, plan.etp)
    accumulate = grad_accumulation_ops(plan, params, layer_param_tensors(model, plan, moe))
    return again + backward_of(fwd, plan) + accumulate


def grad_accumulation_cost(plan: PlanConfig) -> tuple[int, int]:
    """(HBM bytes per parameter, kernels per parameter tensor) of one micro-batch's gradient accumulation
    outside the weight-gradient GEMMs (plan.grad_accumulation), e the gradient's bytes (plan.dtype_bytes):
    fused 0; autograd, param.grad += grad in place, read 2e, write e; fp32_copy_add, grad.to(fp32) (read e,
    write 4) then hp_grad.add_ (read 4 + 4, write 4), DeepSpeed bf16_optimizer.py _update_hp_grad;
    fp32_copy_add_zeroed, those after param.grad.zero_() (write e) and autograd's add into it (read 2e, write e),
    DeepSpeed v0.12.6-v0.14.1 clear_lp_grads; fp32_add,
    acc += grad with the dtypes mixed in one kernel (read 4 + e, write 4), FSDP2 _fsdp_param.py
    accumulate_unsharded_grad_if_needed; fsdp2, fp32_add where FSDP runs under pipelining (plan.fsdp2_accumulates),
    else 0; megatron_fsdp, fused without Megatron-FSDP (plan.accumulates_in_gemm), else the copy of autograd's
    gradient into the main-gradient bucket (read e, write plan.grad_bytes)."""
    e = plan.dtype_bytes
    if plan.grad_accumulation == "megatron_fsdp":
        return (0, 0) if plan.accumulates_in_gemm else (e + plan.grad_bytes, 1)
    if plan.grad_accumulation == "fsdp2":  # fp32 training: its gradients are fp32 already, autograd adds them
        return ((3 * 4 if plan.dtype == "fp32" else 4 + e + 4), 1) if plan.fsdp2_accumulates else (0, 0)
    return {
        "fused": (0, 0),
        "autograd": (3 * e, 1),
        "fp32_copy_add": (e + 4 + 4 + 4 + 4, 2),
        "fp32_copy_add_zeroed": (e + 3 * e + e + 4 + 4 + 4 + 4, 4),
        "fp32_add": (4 + e + 4, 1),
    }[plan.grad_accumulation]


def layer_param_tensors(model: ModelConfig, plan: PlanConfig, moe: bool = False) -> int:
    """Parameter tensors of one layer on one GPU, as Megatron-Core builds it (a kernel each in a per-tensor
    loop): two norms (RMSNorm a weight, LayerNorm weight and bias) and with QK-norm two more; attention's
    fused QKV and output projection (multi-latent attention: the key-value down projection, its norm, its up
    projection, the query's down, norm and up projections or its one projection, the output projection); the
    MLP's fused first and its second linear, or in an MoE layer the router, two per local expert and two per
    shared MLP; with biases one per linear. A dense layer's count is that of the tensors
    workloads/transformer.py unit_tensors sizes (which lists no experts or latent projections)."""
    norms = (2 if model.family == "llama" else 4) + (2 if model.qk_norm else 0)
    attention = 2 if not model.mla else 4 + (3 if model.q_lora_rank else 1)
    mlp = 2
    if moe:
        shared = 2 if model.moe_shared_ffn_hidden_size else 0
        mlp = 1 + 2 * model.experts // plan.expert_parallel + shared
    biases = 4 if model.biases else 0
    return norms + attention + mlp + biases


def grad_accumulation_ops(plan: PlanConfig, params: float, tensors: int) -> list[Op]:
    """The gradient accumulation of one micro-batch over a unit's `params` parameters held in `tensors`
    tensors (grad_accumulation_cost), one memory-bound op run after the unit's backward; [] when fused."""
    per_param, per_tensor = grad_accumulation_cost(plan)
    if not per_param or not params:
        return []
    count = per_tensor * max(tensors, 1)
    return [Op("grad_accumulation", "elementwise", per_param * params, count=count, label="grad_accumulation")]


def _module_ops(modules: Sequence[str], moe: bool, mla: bool) -> tuple[str, ...]:
    """Name prefixes of the forward ops Megatron-Core's selective recompute runs again before a layer's
    backward (plan.recompute_modules; transformer_layer.py and moe/experts.py at d98e8a64). core_attn: the
    attention kernels — also fused (flash) attention, whose call Megatron-Core wraps in
    tensor_parallel.checkpoint like the unfused one (transformer/attention.py `_checkpointed_attention_forward`,
    taken whenever recompute_granularity is selective), so its forward runs twice, and under context
    parallelism its K/V ring with it (Transformer Engine's ring runs inside the attention call). layernorm: an
    MoE layer's pre-MLP norm (the input norm, and a dense layer's pre-MLP norm, are fused into Transformer
    Engine's LayerNormLinear: IdentityOp, not recomputed). moe_act: the routed experts' activation. mlp: a dense
    layer's MLP whole with the norm its first linear fuses, its tensor-parallel collectives and casts included.
    mla_up_proj (multi-latent attention, multi_latent_attention.py qkv_up_proj_and_rope_apply under
    CheckpointWithoutOutput): the query's up projection (or its one projection without a query latent), the key-value
    up projection and the rotary embedding. shared_experts (moe_layer.py shared_experts_compute under
    tensor_parallel.checkpoint): an MoE layer's shared experts whole, their tensor-parallel collectives included.
    moe (moe_layer.py MoELayer.forward's custom_forward under tensor_parallel.checkpoint): the MoE layer whole, from
    the router to the combine and the unpermutation, its all-to-alls, counts and shared experts included."""
    prefixes: list[str] = []
    for module in modules:
        if module == "core_attn":
            prefixes += CORE_ATTENTION_RUN
        elif module == "layernorm" and moe:
            prefixes.append("post_attn_norm")
        elif module == "moe_act" and moe:
            prefixes.append("expert_act")
        elif module == "mla_up_proj" and mla:
            prefixes += ("q_up", "q_proj", "kv_up", "rope")
        elif module == "shared_experts" and moe:
            prefixes.append("shared_")
        elif module == "moe" and moe:
            prefixes += ("router", "moe_", "shared_", "expert_")
        elif module == "mlp" and not moe:  # Transformer Engine's fc1 holds the pre-MLP norm
            prefixes += ("post_attn_norm", "mlp_")
    return tuple(prefixes)


def _restored_outputs(model: ModelConfig, plan: PlanConfig, moe: bool) -> list[Op]:
    """The copies Megatron-Core's output-discarding checkpoint makes of what layernorm and moe_act recompute:
    CheckpointWithoutOutput._recompute copies the recomputed output into the storage the forward discarded
    (tensor_parallel/random.py at b0cc2706, `output.untyped_storage().copy_(...)`): its bytes read and written
    once more — the pre-MLP norm's output (sequence-parallel tokens × h) and the routed experts' activation
    output (routed rows × expert width / etp) in an MoE layer; under mla_up_proj the query, key and value of
    multi-latent attention (tokens × heads / tp × (2 · qk_head_dim + v_head_dim)) in every layer."""
    sh = Shapes.of(model, plan)
    out = []
    if "mla_up_proj" in plan.recompute_modules and model.mla:
        qkv = sh.tokens * model.num_attention_heads / sh.t * (2 * model.qk_head_dim + model.value_head_dim)
        out.append(Op("recompute.mla_up_proj.restore", "elementwise", 2 * qkv * sh.e))
    if not moe:
        return out
    if "layernorm" in plan.recompute_modules:
        out.append(Op("recompute.post_attn_norm.restore", "elementwise", 2 * sh.sp_tokens * model.hidden_size * sh.e))
    if "moe_act" in plan.recompute_modules:
        rows = _routed_rows(model, sh) * plan.etp
        width = model.expert_ffn / plan.etp
        out.append(Op("recompute.expert_act.restore", "elementwise", 2 * rows * width * sh.e, label="experts"))
    return out


def _op_recompute(model: ModelConfig, fwd: list[Op]) -> list[Op]:
    """torchtitan's per-op selective checkpointing (activation_checkpoint mode=selective,
    selective_ac_option=op; torchtitan/distributed/activation_checkpoint.py, `_op_sac_save_list` and
    `_custom_policy`): the outputs of aten.mm and of the SDPA kernels are saved, except every second
    mm of the layer (its mm count even), and everything else runs again in the backward. A llama
    layer's mms in forward order are wq, wk, wv, wo, w1, w3, w2 (torchtitan models/llama3: FeedForward
    computes w2(silu(w1(x)) · w3(x))), a plain MLP's up, down: wk, wo and w3 (plain: down) run again
    — here the keys' share g/(a + 2g) of the fused QKV GEMM, the output projection and the MLP's up half (plain:
    its down projection). Unfused attention's batched GEMMs (aten.bmm, not saved), the other GEMMs
    (multi-latent attention's, an MoE layer's: grouped GEMMs are not saved; its router, an mm, is
    counted with them, an approximation) and every memory-bound op run again; collectives do not
    (the reduce-scatter is saved, and a re-gather is priced with the GEMM that reads it)."""
    a, g = model.num_attention_heads, model.kv_heads
    share = {"qkv": g / (a + 2 * g), "attn_proj": 1.0, "mlp_up": 0.5 if model.gated_mlp else 0.0}
    share["mlp_down"] = 0.0 if model.gated_mlp else 1.0
    out = []
    for op in fwd:
        if op.family == "gemm":
            k = share.get(op.name, 1.0)
            if k:  # one projection's matmul (wk; w3) where the GEMM runs as separate ones (Op.parts)
                out.append(replace(op, name=f"recompute.{op.name}", amount=op.amount * k, f_bytes=0.0, parts=()))
        elif op.family in ("elementwise", "norm", "activation") and op.label != "cp_merge":  # SDPA's output
            out.append(replace(op, name=f"recompute.{op.name}"))
    return out


def embedding_forward(model: ModelConfig, plan: PlanConfig) -> list[Op]:
    """Vocab-parallel embedding lookup (+ learned positions); its output leaves through a g operator."""
    sh = Shapes.of(model, plan)
    h, e = model.hidden_size, sh.e
    ops = [Op("embedding_lookup", "elementwise", 2 * sh.tokens * h * e)]
    if model.learned_positions:
        ops.append(Op("position_add", "elementwise", 3 * sh.tokens * h * e))
    return ops + _g("embedding.tp", sh.tokens * h * e, plan)


#: Share of the elementwise curve's bandwidth a loss over the logits reaches (its bytes per logit:
#: cross_entropy_bytes), forward and backward alike: MEASURED, the lent H200's PyTorch fp32 cross-entropy
#: (data/measured/h200_campaign/cross_entropy.csv, F.cross_entropy(logits.float()) and its gradient at 32,000-256,000
#: vocab, 4,096 and 8,192 tokens), the median over its 12 rows of the time the elementwise curve gives their bytes
#: over the time measured: 0.84-0.87 (`python -c "import sys; sys.path.insert(0, 'tools'); from
#: fit_efficiency_curves import h200_cross_entropy_share; print(h200_cross_entropy_share())"`). Its kernels are
#: row reductions over the vocabulary (max, sum) and passes beside them; this project's H100 profile has a full
#: torch.sum at 0.85 of the same curve (data/measured/h100_profile.db, 64 MiB and more), where its elementwise
#: kernels reach 0.96-0.98. Taken for every loss implementation (Megatron's, Transformer Engine's and the fused
#: ones' passes are the same reductions and passes) and every GPU, as every memory curve's fraction is (not
#: measured). Until session 45 the loss was priced at the curve's full bandwidth.
CROSS_ENTROPY_BANDWIDTH_SHARE = 0.853


def cross_entropy_bytes(plan: PlanConfig) -> tuple[int, int]:
    """HBM bytes per local logit that the loss moves forward and backward, counted kernel by kernel
    from each implementation's source; e = the logits' bytes (plan.dtype_bytes), cast = the
    up-cast to fp32 and its gradient's down-cast (read e, write 4 / read 4, write e; none when the
    logits are fp32 already).
    - megatron (megatron/core/tensor_parallel/cross_entropy.py): forward .float() (cast), max (read
      4), in-place subtract of the max, exp (read 4, write 4 each), sum (read 4), in-place divide
      (read 4, write 4): cast + 32; backward grad.mul_(grad_output) (read 4, write 4) and the
      autograd engine's cast of the fp32 gradient to the logits' dtype: 8 + cast.
    - megatron_fused (megatron/core/fusions/fused_cross_entropy.py, jit_fuser): the cast fused with
      the max (read e, write 4; fp32: read 4), subtract and exp in one in-place pass (8), sum (4),
      divide (8): that + 20; backward the in-place scaling (8) and its explicit cast: 8 + cast.
    - te (transformer_engine/pytorch/triton/cross_entropy.py): an online-softmax pass that reads
      the logits once (e), the backward kernel reads them and writes the gradient in place (2·e).
    - torch (F.cross_entropy(logits.float()), torchtitan components/loss.py): cast, log_softmax
      (PyTorch's cunn_SoftMaxForward on a row too long for shared memory: max, sum and write passes,
      3 reads + 1 write of 4 bytes); backward nll_loss's zero-filled gradient (write 4),
      log_softmax's backward (the gradient summed, then read with the output and written: 16) and
      the cast back: cast + 16 / 20 + cast.
    - torch_compiled (the same under torch.compile, PyTorch 2.13's Inductor): the cast, max and sum fused
      into one online-softmax reduction that reads the logits once (fx_passes/post_grad.py
      prepare_softmax_online, CUDA with Triton, config.online_softmax on by default), and a backward that
      reads them once and writes the gradient in their dtype (the code Inductor generates for
      F.cross_entropy(x.float(), y) with x bf16 on this project's CPU build: backward one pass, load
      bf16 logits, store bf16 gradient; forward no tensor of the logits' size written): e / 2·e.
    - flash_attn (flash_attn/losses/cross_entropy.py CrossEntropyLoss, inplace_backward False, as
      llm-foundry's MPT builds it for loss_fn fused_crossentropy): one forward kernel reads the logits and
      writes each row's loss and log-sum-exp, the backward kernel reads the logits and writes a new
      gradient in their dtype: e / 2·e."""
    e = plan.dtype_bytes
    cast = 0 if e == 4 else e + 4
    if plan.cross_entropy == "megatron":
        return cast + 32, 8 + cast
    if plan.cross_entropy == "megatron_fused":
        return (e + 4 if e != 4 else 4) + 20, 8 + cast
    if plan.cross_entropy in ("te", "torch_compiled", "flash_attn"):
        return e, 2 * e
    return cast + 16, 20 + cast


def metric_cross_entropy_bytes(plan: PlanConfig) -> int:
    """HBM bytes per local logit of one training metric's cross-entropy (plan.metric_cross_entropies): Composer's
    LanguageCrossEntropy.update (composer/metrics/nlp.py at v0.17.2, torch.nn.CrossEntropyLoss(reduction='sum')
    under the bf16 autocast of trainer.py _eval_train_metrics, which runs cross_entropy in fp32): the up-cast
    (read e, write 4; none on fp32 logits) and log_softmax on a row too long for shared memory (max, sum and
    write passes: 3 reads + 1 write of 4 bytes); nll_loss reads one logit a row. 4 kernels with the metric's
    sum and state update. No backward (torch.no_grad)."""
    e = plan.dtype_bytes
    return (0 if e == 4 else e + 4) + 16


def unaligned_logits_note(model: ModelConfig, plan: PlanConfig) -> str | None:
    """What the price of the logits GEMMs leaves out when one rank's vocabulary rows are not a multiple of 16
    bytes (cuBLAS's tensor-core kernels need 16-byte-aligned leading dimensions; without make_vocab_size_
    divisible_by's padding, GPT-2's 50,257 rows are not): measured on an H200 at 4,096 tokens × 4,096 hidden
    (data/measured/h200_campaign/cross_entropy.csv), the forward 17.07 ms at 50,257 rows (99 TFLOP/s) against
    1.37 ms at 32,000 (786), the backward's two GEMMs 23.4 ms (144) against 3.28 ms (655). None when aligned."""
    rows = plan.local_vocab(model.vocab_size)
    if rows * plan.dtype_bytes % 16 == 0:
        return None
    return (
        f"the logits GEMMs run over {rows:,} vocabulary rows per rank, not a multiple of {16 // plan.dtype_bytes}: "
        "cuBLAS runs such GEMMs 4-8x slower (an H200 measured 99 TFLOP/s forward at GPT-2's 50,257 against 786 at "
        "32,000), which this forecast does not price; pad the vocabulary (plan.make_vocab_size_divisible_by, "
        "Megatron's 128; nanoGPT pads 50,257 to 50,304)"
    )


def head_forward(model: ModelConfig, plan: PlanConfig) -> list[Op]:
    """Final norm, vocab-parallel logits GEMM (column-parallel, behind an f) and the loss over the
    V / t local logits (plan.cross_entropy's kernels, cross_entropy_bytes)."""
    sh = Shapes.of(model, plan)
    h, e, v_loc = model.hidden_size, sh.e, plan.local_vocab(model.vocab_size)
    fwd_b, bwd_b = cross_entropy_bytes(plan)
    final_norm = _rmsnorm(Op("final_norm", "norm", 2 * sh.sp_tokens * h * e), sh.sp_tokens * h, model, plan)
    ops = [final_norm, *_f("head_in", sh.tokens * h * e, plan)]
    ops += [
        Op("logits", "gemm", 2 * sh.tokens * h * v_loc, f_bytes=sh.tokens * h * e),
        Op(
            "cross_entropy",
            "elementwise",
            sh.tokens * v_loc * fwd_b,
            backward_amount=sh.tokens * v_loc * bwd_b,
            bandwidth_share=CROSS_ENTROPY_BANDWIDTH_SHARE,
        ),
    ]
    if plan.metric_cross_entropies:  # priced beside the loss; Composer runs them after the micro-batch's backward
        n = plan.metric_cross_entropies
        nbytes = n * sh.tokens * v_loc * metric_cross_entropy_bytes(plan)
        metric = Op("metric_cross_entropy", "elementwise", nbytes, count=4 * n, backward_amount=0.0)
        ops.append(replace(metric, bandwidth_share=CROSS_ENTROPY_BANDWIDTH_SHARE))
    if plan.tensor_parallel > 1:  # each token's statistics across the vocab shards (LOSS_COLLECTIVES)
        for i, (kind, floats) in enumerate(LOSS_COLLECTIVES[plan.cross_entropy]):
            nbytes = floats * sh.tokens * 4 * (plan.tensor_parallel if kind == "all_gather" else 1)
            ops.append(Op(f"cross_entropy.tp{i}" if i else "cross_entropy.tp", "tp_comm", nbytes, kind))
    return _tp_overlapped(ops, plan)


#: the collectives a vocab-parallel loss runs over the tensor-parallel group, forward, per plan.cross_entropy:
#: (kind, fp32 values a token each rank brings), each blocking:
#: - megatron: the max, the target's logit and the sum of exponentials, one all-reduce each (Megatron-Core
#:   tensor_parallel/cross_entropy.py VocabParallelCrossEntropy.forward);
#: - megatron_fused: the max, then the other two batched in one (fusions/fused_cross_entropy.py);
#: - te: one all-gather of each row's (max, sum, target logit) (TE pytorch/triton/cross_entropy.py
#:   all_gather_into_tensor of m_d_X_y);
#: - torch, torch_compiled: DTensor's loss_parallel, the max and the sum in log_softmax, the target's in
#:   nll_loss (torch/distributed/tensor/parallel/loss.py), as torchtitan runs its TP loss;
#: - flash_attn: the log-sum-exp all-gathered, the losses all-reduced (flash_attn ops/triton/cross_entropy.py).
LOSS_COLLECTIVES: dict[str, tuple[tuple[str, int], ...]] = {
    "megatron": (("all_reduce", 1), ("all_reduce", 1), ("all_reduce", 1)),
    "megatron_fused": (("all_reduce", 1), ("all_reduce", 2)),
    "te": (("all_gather", 3),),
    "torch": (("all_reduce", 1), ("all_reduce", 1), ("all_reduce", 1)),
    "torch_compiled": (("all_reduce", 1), ("all_reduce", 1), ("all_reduce", 1)),
    "flash_attn": (("all_gather", 1), ("all_reduce", 1)),
}


def deepspeed_moe_note(plan: PlanConfig) -> str | None:
    """What the price of DeepSpeed's MoE layer (`_deepspeed_moe_block`) leaves out, said where it is priced; None
    otherwise."""
    if not plan.deepspeed_moe:
        return None
    return (
        f"plan.moe_token_dispatcher {plan.moe_token_dispatcher} (DeepSpeed's MOELayer, "
        f"{'before' if plan.moe_token_dispatcher == 'einsum' else 'from'} v0.19.4): the gate's int64 slot map is "
        "not priced; its fp32 gate GEMM is priced at the training dtype's rate; the capacity's minimum is "
        "Megatron-DeepSpeed's default --moe-min-capacity (4); a dropless layer's busiest expert is "
        "model.moe_token_imbalance times an even share (in whole tokens, beside whole experts rounded up to a "
        "multiple of the tensor-parallel size as its gating does)"
    )


def flex_dispatch_note(plan: PlanConfig) -> str | None:
    """What the price of DeepEP's dispatch (flex or torchtitan_deepep: dispatch_share) leaves out, said where it is
    priced; None otherwise."""
    if not plan.dedup_dispatch:
        return None
    titan = (
        "; torchtitan's: the host's wait for the notify step is priced from the router's end (its latency is not)"
        if plan.moe_token_dispatcher == "torchtitan_deepep"
        else ""
    )
    buffers = (
        "; DeepEP's buffers are counted in memory (config/deepep_buffer.py), NVSHMEM's own heap beyond them is not"
        if plan.deepep_buffers
        else "; HybridEP's communication buffers are not counted in memory (plan.moe_flex_backend hybridep)"
    )
    return (
        f"plan.moe_token_dispatcher {plan.moe_token_dispatcher}: its all-to-alls are priced on the all-to-all curves "
        "over the bytes DeepEP / HybridEP send (a copy per GPU of a node and per remote node, experts drawn evenly); "
        "their own kernels, the SMs they take from compute and the NVLink forwarding on the receiving node are not "
        "priced (against Megatron-Core's HybridEP latencies on H100, EP 8-64, priced 21% slow on average, 37-45% "
        f"slow within one node; validation/moe_dispatch.py){titan}{buffers}"
    )


def moe_routing_note(model: ModelConfig, plan: PlanConfig) -> str | None:
    """That an MoE model's experts spread over ranks are priced with their tokens drawn evenly
    (model.moe_token_imbalance 1, the default), and what natural routing cost in the one published pair that
    differs in it, said where the experts are spread, the imbalance is not set and the experts are not padded to
    their capacity (moe_pad_to_capacity, which ModelConfig allows only with a capacity factor: rows that do not
    follow the routing); None otherwise."""
    if model.experts < 2 or plan.expert_parallel < 2 or model.moe_token_imbalance != 1.0 or model.moe_pad_to_capacity:
        return None
    return (
        "model.moe_token_imbalance 1: every expert-parallel rank priced with an even share of the routed tokens, as "
        "Megatron-Core runs them under moe_router_force_load_balancing (NVIDIA's MoE benchmarks force it); under "
        "natural routing the busiest rank sets the pace of each layer's all-to-alls and expert GEMMs: set "
        "model.moe_token_imbalance to its tokens over the mean. For scale: Megatron-Bridge's Qwen3 30B-A3B on 16 "
        "H100 (EP 16, HybridEP) ran 30.29 s a step with natural routing on real data and 24.71 s forced even on "
        "mock data, two commits apart (data/published/checking/megatron_bridge_skills_cards_h100.csv)"
    )


def dropped_tokens_note(model: ModelConfig) -> str | None:
    """That an MoE model's capacity factor drops routed tokens, and that its model FLOPs still count them, said
    where the busiest rank's capacity is below its load: without padding, cf below model.moe_token_imbalance (it
    keeps cf / imbalance of its rows, moe_load); padded, cf below 1 (at even routing every expert keeps cf of an
    even share); None otherwise. Megatron's throughput counts every routed token (training.py
    num_floating_point_operations: moe_router_topk, no capacity), and so do model_flops_per_step and MFU here: with
    most tokens dropped they exceed what the GPUs run, MFU above 100% at a capacity factor of 0.1. Padded to a
    capacity above 1, the reverse is said: the experts run cf × the routed rows, the FLOPs count the routed ones."""
    cf = model.moe_capacity_factor
    if model.experts < 2 or cf is None:
        return None
    load = 1.0 if model.moe_pad_to_capacity else model.moe_token_imbalance
    if model.moe_pad_to_capacity and cf > 1:
        return (
            f"model.moe_pad_to_capacity: every expert runs its capacity, {cf:g} × an even share of the routed tokens, "
            f"and the step prices those rows; the model FLOPs (TFLOP/s per GPU, MFU) and hardware_flops_per_step "
            "count the routed tokens alone, as Megatron's throughput does, not the padding the GPUs also run"
        )
    if cf >= load:
        return None
    return (
        f"model.moe_capacity_factor {cf:g} below the busiest expert-parallel rank's load ({load:g} of an even "
        f"share): it keeps {cf / load:.0%} of its routed tokens and drops the rest, and the step prices the rows "
        "kept; the model FLOPs (TFLOP/s per GPU, MFU) and hardware_flops_per_step count every routed token, as "
        "Megatron's throughput does, so they exceed what the GPUs run"
    )


def moe_a2a_overlap_note(plan: PlanConfig) -> str | None:
    """What the price of Megatron-Core's expert all-to-all overlap (plan.moe_a2a_overlap) leaves out, and how it
    compared with the runs of it measured, said where it is priced; None otherwise."""
    if not plan.moe_a2a_overlap:
        return None
    return (
        "plan.moe_a2a_overlap: priced as the expert all-to-alls hidden behind another micro-batch's attention; not "
        "priced: the combined 1F1B schedule's own work (Megatron-Core pipeline_parallel/combined_1f1b.py: each "
        "layer run as sub-module nodes on a compute and a communication stream with events between them, each "
        "node's backward its own autograd call; delay_wgrad_compute's deferred weight gradients). Measured / priced "
        "on the checking table's configurations of it (validation/checking_step_times.py, a configuration measured "
        "in several releases at their median): Qwen3 30B-A3B (hidden 2,048; 16 H100) pipelined (PP 2, virtual "
        "stages of 1-2 layers, EP 8, FP8) 2.42-2.57x, without pipelining (PP 1, EP 16, BF16) 1.07x over "
        "Megatron-Core's alltoall dispatcher and 1.15x over HybridEP, near the same runs without the overlap "
        "(1.13x, 1.11x: measured gains 1.32x and 1.18x, priced 1.25x and 1.22x); Qwen3 235B-A22B (hidden 4,096; "
        "256 H100, TP 2, PP 8, EP 32) 0.92-1.02x, DeepSeek-V3 (hidden 7,168; 1,024 H100, EP 64) 1.09x: what is "
        "left out weighs most where short layers are pipelined in virtual stages"
    )


def rowwise_note(plan: PlanConfig) -> str | None:
    """What the price of torchao's float8 rowwise casts rests on, said where it is priced; None otherwise."""
    if plan.dtype != "fp8" or plan.fp8_recipe != "rowwise":
        return None
    eager = " Eager casts (no torch.compile) are priced the same: not measured." if plan.eager_pointwise else ""
    return (
        f"plan.fp8_recipe rowwise: torchao's casts at {ROWWISE_CAST_BANDWIDTH_SHARE} of the elementwise bandwidth, "
        "fitted on torchao's H100 table of a compiled LayerNorm -> Linear -> Sigmoid, where linears of N <= 2,048 "
        "outputs remain priced ~1.4x too fast against bf16 (validation/fp8_linear_speedup.py)." + eager
    )


def gpt_oss_note(model: ModelConfig, plan: PlanConfig) -> str | None:
    """What the price of GPT-OSS's Megatron-Core layers leaves out (a session-26 audit of Megatron-Core b0cc2706),
    said where a model with its clamped activation (model.glu_clamp) is priced; None otherwise."""
    if model.glu_clamp is None:
        return None
    titan = (
        f"; under moe_token_dispatcher {plan.moe_token_dispatcher} the clamp and the experts' biases are not priced "
        "at all (only Megatron-Core's grouped experts are)"
        if plan.torchtitan_moe
        else ""
    )
    return (
        "model.glu_clamp (GPT-OSS): not priced are Megatron-Core's host sync in every clamped activation call "
        "(fused_bias_geglu.py torch.tensor(linear_offset, device=...), forward and recompute), an attention output "
        f"bias added outside a fused bias-dropout-add, and the attention sinks (priced as plain fused attention){titan}"
    )


def grad_accumulation_note(plan: PlanConfig) -> str | None:
    """What a DeepSpeed pipeline (plan.pipeline_p2p deepspeed, pp > 1) left at grad_accumulation fused leaves out:
    fused is Megatron's accumulation inside the weight-gradient GEMM, which DeepSpeed's engines do not run (their
    optimizers add each micro-batch's gradients in a pass of their own: grad_accumulation_cost). None otherwise."""
    if plan.pipeline_p2p != "deepspeed" or plan.pipeline_parallel == 1 or not plan.accumulates_in_gemm:
        return None
    return (
        "plan.grad_accumulation is fused (Megatron's, inside the weight-gradient GEMMs), so this DeepSpeed pipeline's "
        "per-micro-batch gradient accumulation is priced at nothing; DeepSpeed adds each micro-batch's gradients in "
        "a pass of its own: set plan.grad_accumulation=autograd (its default grad_accum_dtype) or fp32_copy_add "
        "(its BF16_Optimizer: bf16 with ZeRO-0; fp32_copy_add_zeroed as DeepSpeed v0.12.6 to v0.14.1 run it)"
    )


def zero_grad_reduce_note(plan: PlanConfig) -> str | None:
    """What a DeepSpeed job (plan.pipeline_p2p deepspeed) with ZeRO-1/2 left at zero_grad_reduce reduce_scatter
    prices: Megatron-Core's reduce-scatter, where DeepSpeed all-reduces each bucket (v0.12.4 on) or sends one reduce
    per rank (before): grad_collective. None otherwise."""
    if plan.pipeline_p2p != "deepspeed" or plan.zero_stage not in (1, 2) or plan.zero_grad_reduce != "reduce_scatter":
        return None
    return (
        "plan.zero_grad_reduce is reduce_scatter (Megatron-Core's), so this DeepSpeed job's ZeRO gradient buckets are "
        "priced as one reduce-scatter; DeepSpeed all-reduces each bucket from v0.12.4 (twice the bytes) and sent one "
        "reduce per rank before it: set plan.zero_grad_reduce=all_reduce or reduce_per_rank"
    )


def tp_allreduce_note(plan: PlanConfig) -> str | None:
    """What a DeepSpeed job (plan.pipeline_p2p deepspeed: Megatron-DeepSpeed) with tensor parallelism and no sequence
    parallelism left at tp_allreduce_overlap true prices: Megatron-LM's asynchronous input-gradient all-reduce,
    which Megatron-DeepSpeed turns off under DeepSpeed (backward_of). None otherwise."""
    off = plan.pipeline_p2p != "deepspeed" or plan.tensor_parallel == 1 or plan.sequence_parallel
    if off or not plan.tp_allreduce_overlap or plan.tp_layout == "dtensor":
        return None
    return (
        "plan.tp_allreduce_overlap is true (Megatron-LM's asynchronous all-reduce), so this DeepSpeed job's "
        "tensor-parallel input-gradient all-reduces are priced beside the weight-gradient GEMMs; Megatron-DeepSpeed "
        "turns that off under DeepSpeed (arguments.py validate_args: 'if args.deepspeed: "
        "args.async_tensor_model_parallel_allreduce = False') and its forks before 2023 never had it: set "
        "plan.tp_allreduce_overlap=false"
    )


def small_bucket_note(model: ModelConfig, plan: PlanConfig) -> str | None:
    """What a gradient bucket smaller than one layer's parameters on a GPU leaves unpriced: the step graph's unit is
    a layer (workloads/transformer.bucket_spans), so such buckets are priced one a layer, where Megatron's DDP closes
    a bucket once it holds grad_bucket_size_params, one tensor at least (param_and_grad_buffer.py): up to a
    reduction a weight, each with its latency and launch. None where the bucket holds a layer or more."""
    bucket = plan.grad_bucket_size_params
    layer = int(model.layer_params_per_rank(plan.tensor_parallel))
    if bucket is None or bucket >= layer:
        return None
    return (
        f"plan.grad_bucket_size_params {bucket:,}: below one layer's {layer:,} parameters a GPU, its buckets are "
        "priced one a layer (the step graph's unit); Megatron closes one at that size, one tensor at least, so a "
        "layer's gradients would reduce in several buckets, each with its own latency, which is not priced"
    )


def unused_fields_note(model: ModelConfig, plan: PlanConfig) -> str | None:
    """The plan's switches that act on parts this model lacks, so change nothing in the forecast, as they change
    nothing in Megatron-Core (which accepts them: transformer_config.py checks the shared-expert overlap only where
    moe_shared_expert_intermediate_size is set; the grouped GEMM builds only MoE layers' experts). None otherwise."""
    unused = []
    if plan.moe_grouped_gemm and not model.is_moe:
        unused.append("plan.moe_grouped_gemm (no routed experts)")
    if plan.moe_shared_expert_overlap and model.is_moe and not model.moe_shared_ffn_hidden_size:
        unused.append("plan.moe_shared_expert_overlap (no shared experts)")
    if not unused:
        return None
    return f"{' and '.join(unused)}: {model.name} has nothing it acts on; the forecast is the same without it"


def fused_core_attn_recompute_note(model: ModelConfig, plan: PlanConfig) -> str | None:
    """That Megatron-Core's selective recompute of core_attn saves next to nothing under fused attention: the kernel
    keeps no scores (FlashAttention's O(s) memory: its log-sum-exp row per query), its inputs stay for the recompute
    and its output for the projection after it, so the activations are the same, while the attention forward runs
    again (transformer/attention.py _checkpointed_attention_forward), said with that share of the model FLOPs."""
    if plan.recompute != "selective" or plan.selective_recompute != "modules" or not plan.flash_attention:
        return None
    if "core_attn" not in plan.recompute_modules:
        return None
    share = model.layers_attention_score_flops_per_token() / model.flops_per_token()
    return (
        "plan.recompute_modules core_attn under fused attention: the kernel keeps no attention scores to drop (its "
        "inputs stay for the recompute, its output for the projection), so the activations are the same as without "
        f"it, while the attention forward, {share:.0%} of the model FLOPs, runs again in the backward"
    )


def priced_notes(model: ModelConfig, plan: PlanConfig, system: SystemConfig) -> list[str]:
    """Every note above that holds for this model and plan, and the system's network's (costs/analytic.
    unmeasured_network_note), in one order for `predict` and `search`: what the forecast leaves out or rests
    on, said beside its figures."""
    notes = (
        unaligned_logits_note(model, plan),
        grad_accumulation_note(plan),
        zero_grad_reduce_note(plan),
        tp_allreduce_note(plan),
        small_bucket_note(model, plan),
        flex_dispatch_note(plan),
        deepspeed_moe_note(plan),
        moe_a2a_overlap_note(plan),
        moe_routing_note(model, plan),
        dropped_tokens_note(model),
        unused_fields_note(model, plan),
        fused_core_attn_recompute_note(model, plan),
        gpt_oss_note(model, plan),
        rowwise_note(plan),
        unmeasured_network_note(system),
        renamed_gpu_note(system),
    )
    return [note for note in notes if note]
