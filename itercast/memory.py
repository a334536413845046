"""Memory per GPU: weights, gradients, optimizer states, activations; the worst pipeline stage.

Sources: ZeRO (Rajbhandari et al. SC'20) for the states by stage; Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models", eq. 1–2) for activations:
per token and layer 34·h + 5·a·s bytes in 16-bit training, divided by t where tensor/sequence
parallelism shards them. We sum the same terms component by component so that GQA, SwiGLU and
fused attention (no s×s scores kept) change them where they should.
Conventions (Megatron-LM defaults): 16-bit weights; gradients in plan.grad_reduce_dtype (fp32 by
default: bf16 runs accumulate and reduce gradients in fp32); fp32 master weights + Adam m, v
(12 bytes/param) unless training in fp32 or plan.main_params / adam_state_dtype say otherwise.

One formula serves one job and a whole search: the functions take a PlanTable (numpy columns,
search/plan_table.py) and `estimate_memory(job)` is the one-row case. The most loaded GPU is on the
first stage (the embedding and the most activations in flight) or the last (the output layer and
the logits); no middle stage of a dense model holds more than the first, so those two are
evaluated. In a mixture-of-experts model whose leading layers are dense, a middle stage can hold
more experts than the first: it is evaluated with the second stage's micro-batches in flight (the
most of any middle stage) and the MoE layers of the last middle stage (the most, dense layers
leading), a bound from above.

Mixture of experts: routed experts' states are sharded by ZeRO over the expert-data-parallel group
(tensor × context × data / (expert × expert-tensor parallel), Megatron-Core's expert folding), the
other parameters over data × context as before. Activations of an MoE layer are dropless: top_k copies
of each token (times the busiest rank's imbalance), each keeping what Megatron-Core's grouped MLP keeps
(`_activation_bytes`). fp8 training keeps Transformer Engine's 1-byte GEMM inputs; an fp8 weight
counts 2 bytes, as a bf16 one: Megatron-Bridge's fp8 recipes keep an fp8 primary weight and its
transpose (training/mixed_precision.py bf16_with_fp8_current_scaling_mixed: fp8_param_gather).
A llama model run without torch.compile (plan.pointwise_kernels eager) keeps more: the tensors PyTorch's
autograd saves op by op in torchtitan's RMSNorm, repeat_kv and SwiGLU (`eager_saved_bytes`).

Beyond its tensors a training process holds, per GPU (`reserve_bytes`, the "reserved" part; a number in
gpu.reserved_bytes replaces it with that flat reserve), memory outside PyTorch's caching allocator:
- CUDA context: 0.75 GiB. Measured 723 MiB after the first CUDA call of a PyTorch process
  (discuss.pytorch.org/t/73021), "~700+ MB" depending on CUDA version and device (discuss.pytorch.org/t/81330).
- NCCL buffers: NCCL_BUFFSIZE (4 MiB default, NCCL environment-variable docs) per connection, 2
  connections (send and receive peers of a ring) per channel, up to 32 channels (NCCL's MAXCHANNELS,
  src/include/device.h): 256 MiB per communicator, for each process group of more than one rank the plan
  uses (`communicators`: tensor, context, data × context, pipeline, expert and, on a stage with MoE layers, the
  experts' data-parallel, tensor-parallel and Megatron-Core's tensor × expert groups; a DLRM's one world group).
- DeepEP's buffers under torchtitan's DeepEP backend or Megatron-Core's flex dispatcher over DeepEP
  (PlanConfig.deepep_buffers), on a GPU whose stage has MoE layers: 62–288 MiB at hidden 2048 in bf16 for EP 2–64
  (config/deepep_buffer.py, from DeepEP's sources); a plan's, so it stays on top of a flat gpu.reserved_bytes.
  HybridEP's (moe_flex_backend hybridep) are not counted.
The caching allocator's fragmentation is not in it: how much memory its cached but unusable blocks
hold depends on the allocation pattern and the allocator's settings (expandable segments remove most
of it), and it frees its cached blocks and retries before it reports out of memory. `itercast search`
keeps a margin for it on top of this total before it recommends a plan (plan_search.FRAGMENTATION_OF_ACTIVATIONS).
Said plainly: the margin was part of this reserve for one reading of the checking table (reading 17),
which then judged 5 of its runs out of memory although they ran (by 0.3–2.4 GiB); it was taken out of the
verdict after that reading, on the allocator's semantics, so that table's out-of-memory count is no
longer held out for this choice.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from itercast.config.deepep_buffer import DEEPEP_EP_SIZES, deepep_buffer_bytes
from itercast.config.job import Job
from itercast.config.model import ModelConfig
from itercast.config.plan import BF16_OPTIMIZER_ACCUMULATIONS, PlanConfig, pipelined_fsdp2, whole_fp32_sums
from itercast.config.system import GPUSpec, SystemConfig
from itercast.parallel.plan_table import RECOMPUTE, PlanTable
from itercast.parallel.schedules import in_flight_microbatches

_FULL, _SELECTIVE = RECOMPUTE.index("full"), RECOMPUTE.index("selective")

CUDA_CONTEXT_BYTES = 0.75 * 2**30
NCCL_COMMUNICATOR_BYTES = 4 * 2**20 * 2 * 32


def communicators(
    cols: dict[str, np.ndarray], embedding: Any = False, moe: Any = False, megatron_moe: bool = False
) -> np.ndarray:
    """Process groups of more than one rank each GPU of a plan joins (NCCL allocates per communicator): tensor,
    context, data × context, pipeline and expert parallel groups; with the distributed optimizer sharded within
    groups (plan.zero_shard_ranks under the data × context ranks) the groups' own and the one across them
    (Megatron-Core's intra and inter distributed-optimizer instance groups, parallel_state.py); `embedding`:
    the GPU is on the first or last stage of a pipeline whose embedding is tied, and joins Megatron's embedding
    group (parallel_state.py _EMBEDDING_GROUP) for the tied copies' all-reduce. `moe`: the GPU's stage has MoE
    layers, whose experts' gradients are reduced over their own data-parallel group (tp·cp·dp / (ep·etp) ranks,
    parallel_state.py _EXPERT_DATA_PARALLEL_GROUP) and whose expert-tensor collectives run over their own group
    (_EXPERT_TENSOR_PARALLEL_GROUP, a group of its own even where it holds the attention's tensor ranks);
    `megatron_moe`: Megatron-Core's token dispatchers, which also gather the routed counts or tokens over the
    tensor × expert group (token_dispatcher.py tp_ep_group; _EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP, created apart
    from the expert group even where they hold the same ranks)."""
    c = cols
    partial = (c["shard"] > 0) & (c["shard"] < c["dp"] * c["cp"])
    groups = (c["tp"] > 1, c["cp"] > 1, c["dp"] * c["cp"] > 1, c["pp"] > 1, c["ep"] > 1, partial)
    expert_dp = c["tp"] * c["cp"] * c["dp"] // (c["ep"] * c["etp"])
    moe = np.asarray(moe, dtype=bool)
    expert = (moe & (expert_dp > 1), moe & (c["etp"] > 1), moe & megatron_moe & (c["ep"] * c["etp"] > 1))
    return np.sum(groups, axis=0) + np.sum(expert, axis=0) + np.asarray(embedding, dtype=np.int64)


def reserve_bytes(gpu: GPUSpec, communicator_count: Any) -> np.ndarray:
    """Bytes per GPU beyond the tensors (module docstring): gpu.reserved_bytes when it is set, else the
    CUDA context and NCCL's buffers of `communicator_count` communicators."""
    count = np.asarray(communicator_count, dtype=np.float64)
    if gpu.reserved_bytes is not None:
        return np.full(count.shape, float(gpu.reserved_bytes))
    return CUDA_CONTEXT_BYTES + NCCL_COMMUNICATOR_BYTES * count


def describe_reserve(gpu: GPUSpec) -> str:
    """One line: how the memory beyond the tensors is set."""
    if gpu.reserved_bytes is not None:
        return f"reserved {gpu.reserved_bytes / 2**30:.2f} GiB per GPU (system.gpu.reserved_bytes)"
    return (
        f"reserved per GPU: CUDA context {CUDA_CONTEXT_BYTES / 2**30:.2f} GiB + NCCL "
        f"{NCCL_COMMUNICATOR_BYTES / 2**20:.0f} MiB per communicator"
    )


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on the most loaded GPU (pipeline stage `stage`)."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    reserved_bytes: float
    stage: int
    capacity_bytes: float

    @property
    def total_bytes(self) -> float:
        return (
            self.weights_bytes
            + self.gradients_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.reserved_bytes
        )

    @property
    def oom(self) -> bool:
        return self.total_bytes > self.capacity_bytes

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "total_bytes": self.total_bytes, "oom": self.oom}


def embedding_unit_params(job: Job) -> float:
    """Parameters of the embedding on one GPU: its vocab shard and the replicated position table."""
    m = job.model
    return job.plan.local_vocab(m.vocab_size) * m.hidden_size + m.position_params()


def virtual_stage_layer_counts(m: ModelConfig, p: PlanConfig) -> tuple[np.ndarray, np.ndarray]:
    """Transformer layers of each virtual stage (chunk c of stage s is virtual stage c·pp + s) and how many
    of them are MoE layers."""
    layers = np.asarray(p.virtual_stage_layers(m.num_layers))
    starts = np.concatenate(([0], np.cumsum(layers)))
    return layers, m.moe_layers_before(starts[1:]) - m.moe_layers_before(starts[:-1])


def stage_moe_layers(m: ModelConfig, p: PlanConfig, stage: int) -> int:
    """MoE layers held by pipeline stage `stage` (its chunks together)."""
    moe_n = virtual_stage_layer_counts(m, p)[1]
    return int(sum(moe_n[c * p.pipeline_parallel + stage] for c in range(p.virtual_pipeline)))


def stage_params(job: Job, stage: int) -> tuple[float, float]:
    """Parameters held by one GPU of pipeline stage `stage` (tensor-parallel shard, before ZeRO): the
    routed experts' and the rest."""
    p = job.plan
    last = stage == p.pipeline_parallel - 1
    layers = p.stage_layer_counts(job.model.num_layers)[stage]
    table, moe = PlanTable.of_jobs([job]), stage_moe_layers(job.model, p, stage)
    dense = stage_param_columns(job.model, table, stage == 0, last, layers, moe)
    return float(stage_expert_param_columns(job.model, table, moe)[0]), float(dense[0])


def stage_param_columns(
    m: ModelConfig,
    t: PlanTable,
    first: bool | np.ndarray,
    last: bool | np.ndarray,
    layers: float | np.ndarray,
    moe_layers: float | np.ndarray = 0,
) -> np.ndarray:
    """Per row: its `layers` layers (`moe_layers` of them MoE layers; norms, routers and row-parallel
    biases whole on every tensor-parallel rank; routed experts apart, stage_expert_param_columns),
    the embedding on the first stage, the final norm and the output layer on the last (a tied one too
    when it is a copy)."""
    tp, pp = t.cols["tp"], t.cols["pp"]
    layer = m.layer_params_per_rank(tp)
    moe_layer = m.layer_params_per_rank(tp, moe=True, whole_mlp=t.whole_residual_mlp)
    vocab = t.local_vocab(m.vocab_size) * m.hidden_size
    params = (layers - moe_layers) * layer + moe_layers * moe_layer
    params = params + np.where(first, vocab + m.position_params(), 0.0)
    head = np.where(last & ((not m.tied) | (pp > 1)), vocab, 0.0)
    return params + np.where(last, m.final_norm_params(), 0.0) + head


def stage_expert_param_columns(m: ModelConfig, t: PlanTable, moe_layers: float | np.ndarray) -> np.ndarray:
    """Per row: routed-expert parameters of `moe_layers` MoE layers on one GPU."""
    return np.asarray(moe_layers * m.expert_params_per_rank(t.cols["ep"], t.cols["etp"]), dtype=np.float64)


def activation_bytes_per_token_layer(job: Job, moe: bool = False) -> float:
    """Bytes one layer (an MoE layer when `moe`) keeps per token of a micro-batch on one GPU for its
    backward pass."""
    return float(_activation_bytes(job.model, PlanTable.of_jobs([job]), moe=moe)[0])


def _activation_bytes(
    m: ModelConfig, t: PlanTable, recompute: np.ndarray | None = None, moe: bool = False
) -> np.ndarray:
    """Korthikanti et al. eq. 1-2 term by term, per token and layer, per row (`recompute` overrides
    the table's). An MoE layer (`moe`) keeps its shared experts' MLP terms, the router's fp32 scores
    (E per token) and, per routed copy (top_k × ModelConfig.moe_load per token, on 1/t of the tokens
    with sequence parallelism), what Megatron-Core's TEGroupedMLP.forward (transformer/moe/experts.py)
    leaves for backward: the fc1 input gathered over expert-tensor ranks, the fc1 output(s) its fused
    activation keeps with the copy's fp32 routing probability (probabilities are applied in the
    activation, so token_dispatcher's unpermute gets no probs and keeps no token copy), and the
    activation output fc2 keeps. fp8 (Transformer Engine): a GEMM keeps its input as 1-byte
    column-wise data (module/linear.py and grouped_linear.py forward: "Discard row-wise data since
    it is not needed in backward pass"); tensors another op keeps stay 16-bit (the router's input,
    RouterGatingLinearFunction; the attention output the fused attention kernel keeps, beside which
    the projection keeps its own 1-byte copy). torchao's Float8Linear (plan.fp8_weight_cast per_microbatch,
    torchtitan's float8) keeps its high-precision input instead (float8_linear.py
    matmul_with_hp_or_float8_args: `ctx.save_for_backward(input_hp, weight_hp_t)`, recast in the backward;
    eager semantics: what torch.compile's partitioner saves is not modelled); routed experts outside FP8
    (plan.fp8_experts false: torchtitan's GroupedExperts, `_grouped_mm(x.bfloat16(), …)`) keep 16-bit
    inputs. Recompute: `_recompute_kept`."""
    h, d, e = m.hidden_size, m.head_dim, t.base.dtype_bytes
    fp8 = 1 if t.base.dtype == "fp8" and t.base.fp8_weight_cast == "per_step" else 0
    gemm_in = 1 if fp8 else e  # bytes of a GEMM input kept for the weight gradient
    expert_in = gemm_in if t.base.fp8_experts else e
    f = m.moe_shared_ffn_hidden_size if moe else m.ffn
    a, g = m.num_attention_heads, m.kv_heads
    tp = t.cols["tp"]
    rc = t.cols["recompute"] if recompute is None else recompute
    rep = np.where(t.cols["sp"] > 0, tp, 1)  # norms, dropout, residual: sharded only with SP
    dropout = h if m.has_dropout else 0  # 1-byte masks, two per layer
    # the MLP input: a dense MLP's fc1 keeps it; in an MoE layer the router keeps it 16-bit and the
    # shared experts' fc1 its own copy under fp8
    deepspeed = moe and t.base.deepspeed_moe
    # (DeepSpeed's: its router's fp32 copy, and a PR-MoE residual MLP's fc1 and mixing coefficient the 16-bit one)
    mlp_in = (4 + (e if f else 0)) * h if deepspeed else (e + (fp8 if f else 0)) * h if moe else gemm_in * h
    # torchtitan's MoE layer keeps its input all-gathered over the tensor-parallel ranks, whole on each (its router
    # and shared experts' input: transformer_ops._titan_moe_tp); elsewhere it is split with sequence parallelism
    gathered_in = mlp_in if moe and t.base.torchtitan_moe else 0
    # two norm inputs, QKV and MLP inputs, masks
    replicated = 2 * e * h + gemm_in * h + mlp_in - gathered_in + 2 * dropout
    # q, k, v; with QK-norm the norms' inputs (q and k before it); the projection input (the
    # attention output, heads × head_dim)
    sharded = e * (a + 2 * g) * d + (e * (a + g) * d if m.qk_norm else 0) + (e + fp8) * a * d
    latents, latent_width = 0, 0  # multi-latent attention: whole on every tensor-parallel rank
    if m.mla:
        latent_width = (m.q_lora_rank or 0) + (m.kv_lora_rank or 0)
        dqk, dv = m.qk_head_dim, m.value_head_dim
        sharded = e * a * (2 * dqk + dv) + (e + fp8) * a * dv
        # the latents' norm inputs and up-projection inputs, and the shared rotary key
        latents = (e + gemm_in) * latent_width + e * m.qk_rope_head_dim
    up = 2 if m.gated_mlp else 1
    mlp_kept = (e * up + gemm_in) * f  # MLP up output(s) and activation output, split over tp unless whole
    mlp_ranks = np.where(t.whole_residual_mlp, 1, tp) if moe else tp
    eager_replicated, eager_sharded = eager_saved_bytes(m, t.base, f)
    replicated, sharded = replicated + eager_replicated, sharded + eager_sharded
    # unfused attention keeps, per key, the softmax output and, with attention dropout, its
    # 1-byte mask and output (eq. 1's 5·a·s in 16-bit training with dropout)
    scores = 0 if t.base.flash_attention else a * m.seq_length * (e + (1 + e if m.has_dropout else 0))
    experts: float | np.ndarray = 0.0
    # GPT-OSS's clamp (model.glu_clamp; fused_bias_geglu.py): the fused activation keeps the clamped halves' cat
    # and the clamps their fc1 output: e · 2 per unit of the expert width more than the fc1 output alone
    clamped = 2 * e if m.glu_clamp is not None and m.gated_mlp else 0
    if moe:
        copies = m.moe_top_k * m.moe_load() / rep
        per_copy = expert_in * t.cols["etp"] * h + (e * up + expert_in + clamped) * m.expert_ffn + 4
        experts = copies * per_copy + 4 * m.experts / rep
    if deepspeed:
        experts = deepspeed_expert_bytes(m, t, expert_in, clamped)
    attention_again = replicated / rep + gathered_in + latents + sharded / tp + mlp_kept / mlp_ranks + experts
    # what Megatron-Core's selective recompute of each of plan.recompute_modules stops keeping (transformer_layer.py,
    # moe/experts.py at d98e8a64): core_attn the unfused attention's scores; layernorm, in an MoE layer, the
    # pre-MLP norm's output, discarded once its consumers ran (CheckpointWithoutOutput: the router's 16-bit input,
    # and under fp8 the shared experts' copy, set_for_recompute_pre_mlp_layernorm having them keep that output; the
    # other norms are fused into Transformer Engine's linears, IdentityOp); moe_act each routed copy's activation
    # output and clamped cat; mlp, in a dense layer checkpointed whole (tensor_parallel.checkpoint), the fc1 input,
    # fc1 output(s) and activation output (its input, the pre-MLP norm's, stays); mla_up_proj multi-latent
    # attention's query, key and value (CheckpointWithoutOutput keeps its inputs, the normed latents, 16-bit where
    # under fp8 the up projections kept 1-byte copies); shared_experts, in an MoE
    # layer checkpointed whole, the shared experts' fc1 output(s) and activation output and under fp8 their fc1's
    # 1-byte input (the 16-bit one the router keeps; with layernorm that copy is dropped already)
    shared_fp8_in = fp8 * h / rep if f and "layernorm" not in t.base.recompute_modules else 0
    dropped = {
        "core_attn": scores / tp,
        "layernorm": mlp_in / rep if moe else 0.0,
        "moe_act": copies * (expert_in + clamped) * m.expert_ffn if moe else 0.0,
        "mlp": 0.0 if moe else mlp_in / rep + mlp_kept / tp,
        "mla_up_proj": e * a * (2 * dqk + dv) / tp - (e - gemm_in) * latent_width if m.mla else 0.0,
        "shared_experts": mlp_kept / mlp_ranks + shared_fp8_in if moe else 0.0,
    }
    # moe, an MoE layer checkpointed whole: everything it keeps but its 16-bit input (the router's), the routed
    # copies' and the router's scores (`experts`) and the shared experts' (moe_act and shared_experts: refused beside)
    dropped["moe"] = experts + dropped["shared_experts"] if moe else 0.0
    modules = attention_again + scores / tp - sum(dropped[k] for k in t.base.recompute_modules)
    # torchtitan's per-op policy saves all_to_all_single's outputs (distributed/activation_checkpoint.py
    # _get_default_save_ops: comm ops) but not _grouped_mm's: a routed copy keeps the tokens its dispatch
    # and its combine exchanges delivered (with expert parallelism), the experts run again
    op_experts = m.moe_top_k * m.moe_load() / rep * np.where(t.cols["ep"] > 1, 2 * e * h, 0) if moe else 0.0
    if moe and t.base.moe_token_dispatcher == "torchtitan_deepep":
        # its DeepEP backend adds deepep.dispatch and deepep.combine to that list (parallelize.py at 9810191^):
        # the rows the dispatch delivered, a token once per rank holding one of its experts, and the combine's one
        # row a token (tensor_parallel 1: job.py)
        eps, of_row = np.unique(t.cols["ep"], return_inverse=True)  # a few sizes over many plans
        delivered = np.array([m.deepep_rows_per_token(int(ep)) for ep in eps])[of_row]
        op_experts = (delivered + 1) * e * h
    return _recompute_kept(m, t, rc, attention_again + scores / tp, modules, op_experts, f, rep)


def deepspeed_expert_bytes(m: ModelConfig, t: PlanTable, expert_in: int, clamped: int) -> np.ndarray:
    """Bytes per token of the micro-batch an MoE layer of DeepSpeed's MOELayer keeps for backward beyond its
    shared MLP and its router's fp32 input (plan.moe_token_dispatcher einsum or gather; deepspeed/moe/
    sharded_moe.py at 38327e0 and from v0.19.4, transformer_ops._deepspeed_moe_block), per row: with S tokens a
    micro-batch on the rank and EC slots (ModelConfig.deepspeed_capacity: about S·k·cf), a rank's experts run
    EC·etp/tp of them (whole experts a 1/tp share, split ones all, gathered over the tensor-parallel ranks), each
    keeping its fc1 input, fc1 output(s) and activation output over the expert width / etp (Megatron-DeepSpeed's
    ParallelMLP); the router's fp32 scores (E a token); with a shared expert, PR-MoE's mix keeps the experts'
    and the residual MLP's outputs for its coefficient's gradient (2eh; deepspeed/moe/layer.py). Then:
    - einsum: the combine keeps the experts' gathered output (h a slot) and its weights, the dispatch its mask, both
      cast to the activations' dtype: 2e per element of the S × EC gating tensors, so per token 2e·EC,
      which grows with the micro-batch; top-k (k > 2) gating's product keeps its fp32 one-hot slots too (4 an
      element). The top-1/2 gating's saved S × E and S × C factors (4(E + C) a token) are left out.
    - gather: the combine's weighting keeps each route's gathered row and its fp32 weight (k·(eh + 4) a token);
      index_select keeps only its indices."""
    e, h, k = t.base.dtype_bytes, m.hidden_size, m.moe_top_k
    tokens = t.cols["mbs"] * m.seq_length / t.cols["cp"]  # S
    etp = t.cols["etp"]
    # dropless: rounded to the tensor-parallel size beside whole experts
    slots = m.experts * m.deepspeed_capacity(tokens, np.where(etp == 1, t.cols["tp"], 1)) / tokens  # EC / S
    per_slot = expert_in * h + (e * (2 if m.gated_mlp else 1) + expert_in + clamped) * m.expert_ffn / etp
    mix = 2 * e * h if m.moe_shared_ffn_hidden_size else 0
    kept = slots * etp / t.cols["tp"] * per_slot + 4 * m.experts + mix
    if t.base.moe_token_dispatcher == "gather":
        return kept + k * (e * h + 4)
    return kept + slots * e * h + (2 * e + (4 if k > 2 else 0)) * tokens * slots


def eager_saved_bytes(m: ModelConfig, p: PlanConfig, mlp_width: int) -> tuple[int, int]:
    """Bytes per token a llama layer's autograd keeps beyond the fused kernels' under
    plan.pointwise_kernels eager, eager_fused_norm or compiled: (replicated, sharded over tensor parallelism), 0
    under fused and for other families (the layers transformer_ops._eager_llama prices eagerly; memory sits
    under workloads, tests/test_layering.py, so the test is written here). torchtitan 9dec370a / 1ea476e9,
    PyTorch's derivatives.yaml:
    - RMSNorm (models/norms.py `self._norm(x.float()).type_as(x) * self.weight`): pow(2) saves `self`
      and `x * rsqrt(...)` saves both factors: the fp32 x (4h) and the per-token rsqrt `result` (4);
      `* weight` saves the 16-bit normed x (eh) for the weight's gradient; mean saves sizes, the casts
      (_to_copy) nothing. The fused norm keeps its input x (eh, counted in `_activation_bytes`), which
      no eager op saves: 4h + 4 more per norm, two a layer (torchtitan's Triton fused_rmsnorm,
      eager_fused_norm, keeps x like the fused: 0).
    - rotary (model.py apply_rotary_emb): the complex product saves `other` only, the freqs_cis
      buffer (needing no gradient, it needs no saved `self`); views and casts save nothing: 0.
    - repeat_kv (model.py): the expanded keys and values it copies are SDPA's saved inputs, a heads
      instead of g: 2e(a - g)d (none without GQA; MLA runs no repeat_kv).
    - SwiGLU (model.py FeedForward `w2(F.silu(w1(x)) * w3(x))`): silu saves its input (w1's output,
      counted) and the product saves both factors: w3's output (counted) and the silu output, e per
      element of the ffn width more.
    Compiled (plan.pointwise_kernels compiled): the norms and SwiGLU are Inductor kernels whose saved tensors
    AOTAutograd's partitioner chooses (the fused kernels' inputs, counted; their cheap outputs recomputed in
    the backward), the rotary embedding saves nothing as eagerly, and repeat_kv's copies are SDPA's inputs:
    (0, 2e(a - g)d).
    Recompute: torchtitan's op-level policy saves mm and SDPA outputs only (`_recompute_kept`), so
    these are recomputed, and live only while their layer's backward runs (StageMemory.recomputing);
    full recompute keeps the layer input. The final norm's saved tensors (one per stage) are not
    counted, as under fused."""
    if p.pointwise_kernels == "fused" or m.family != "llama":
        return 0, 0
    e, h, a, g = p.dtype_bytes, m.hidden_size, m.num_attention_heads, m.kv_heads
    repeated_kv = 0 if m.mla else 2 * e * (a - g) * m.head_dim
    if not p.eager_pointwise:  # compiled: only the repeated keys and values, SDPA's inputs, are kept apart
        return 0, repeated_kv
    norms = 0 if p.pointwise_kernels == "eager_fused_norm" else 2 * (4 * h + 4)
    return norms, repeated_kv + e * mlp_width


def _recompute_kept(
    m: ModelConfig,
    t: PlanTable,
    rc: np.ndarray,
    kept: Any,
    modules: Any,
    experts: Any,
    mlp_width: int,
    rep: np.ndarray,
) -> np.ndarray:
    """Bytes per token a layer keeps under each row's recompute, from what it keeps without
    (`kept`), under Megatron-Core's selective recompute of its modules (`modules`) and what its routed experts keep
    under the per-op policy (`experts`). full: the layer input of the
    recomputed share r of the layers (full_recompute_share), one per recompute_num_layers layers
    under Megatron-Core's uniform method (it checkpoints each group's input), the rest as without.
    selective op (torchtitan, transformer_ops._op_recompute): the layer input, the saved mm outputs
    (q, v, the MLP's first up projection, a gated MLP's down projection) and the SDPA output with its
    fp32 log-sum-exp per head; an MoE layer's routed experts only what `experts` says they keep (their
    exchanges' outputs), as predict prices them recomputed whole."""
    p, e, h = t.base, t.base.dtype_bytes, m.hidden_size
    a, g, tp = m.num_attention_heads, m.kv_heads, t.cols["tp"]
    group = recompute_group(m, p, t.cols["pp"], t.cols["vp"])
    r = full_recompute_share(m, p, t.cols["pp"], t.cols["vp"])
    full = r * e * h / rep / group + (1 - r) * kept
    selective = modules
    if p.selective_recompute == "op":
        saved = e * a * m.qk_head_dim + e * g * m.value_head_dim + e * a * m.value_head_dim + 4 * a + e * mlp_width
        selective = e * h / rep * (2 if m.gated_mlp else 1) + saved / tp + experts
    return np.where(rc == _FULL, full, np.where(rc == _SELECTIVE, selective, kept))


def recompute_group(m: ModelConfig, p: PlanConfig, pp: Any, vp: Any) -> Any:
    """Layers recomputed together under recompute=full (per row of `pp`, `vp`): Megatron-Core's uniform method
    checkpoints recompute_num_layers layers at a time, but no more than a model chunk holds
    (transformer_block.py `_checkpointed_forward`: `while layer_idx < self.num_layers_per_pipeline_rank`,
    each group ending at the chunk's last layer), the largest chunk of plan.stage_layers when set; 1 otherwise
    (block method, torchtitan's per-layer checkpoints)."""
    if p.recompute_method != "uniform":
        return 1
    chunk = max(p.stage_layers) if p.stage_layers is not None else m.num_layers / (np.asarray(pp) * vp)
    return np.minimum(p.recompute_num_layers, np.maximum(chunk, 1))


def full_recompute_share(m: ModelConfig, p: PlanConfig, pp: Any, vp: Any) -> Any:
    """Share of the layers whose whole forward runs again under recompute=full (per row of `pp`,
    `vp`). Megatron-Core's uniform method: all. Its block method (transformer_block.py
    `_checkpointed_forward`: `if l < recompute_num_layers` over the layers of each model chunk):
    min(N, layers of the chunk) per chunk. torchtitan's per-layer checkpointing
    (selective_ac_option=n: a layer is wrapped when its count from 1 on this rank is divisible by n):
    ⌊layers of the stage / n⌋ per stage. Layer costs and memory use this share for every layer (a
    mean: exact for a stage's total when its chunks hold equal layers)."""
    layers = m.num_layers
    if p.recompute_method == "block":
        if p.stage_layers is not None:
            return sum(min(p.recompute_num_layers, n) for n in p.stage_layers) / layers
        chunk = layers / (np.asarray(pp) * vp)
        return np.minimum(p.recompute_num_layers, chunk) / chunk
    if p.recompute_every > 1:
        if p.stage_layers is not None:
            stages = p.stage_layer_counts(layers)
            return sum(n // p.recompute_every for n in stages) / layers
        stage = layers / np.asarray(pp)
        return np.floor(stage / p.recompute_every) / stage
    return np.ones_like(np.asarray(pp), dtype=np.float64)


def cross_entropy_peak_bytes(plan: PlanConfig) -> int:
    """Bytes per local logit the loss holds at its peak, its backward on the last stage, where the
    micro-batch's activations are all live too (e = the 16-bit dtype's bytes):
    - megatron, megatron_fused: the fp32 softmax kept for the backward (4), turned into the gradient in
      place (tensor_parallel/cross_entropy.py VocabParallelCrossEntropy.backward: grad_input = softmax,
      mul_), then cast by autograd to the logits' dtype for the output layer's backward (e): 4 + e.
    - torch (F.cross_entropy on logits.float(), eager): the fp32 log-softmax kept (4), nll_loss's dense
      fp32 gradient (4) and log_softmax's fp32 input gradient (4) live together in LogSoftmaxBackward: 12.
    - te: the logits themselves, overwritten by their gradient in the forward (e).
    - torch_compiled: the logits, read again by Inductor's backward with each row's max and sum, and
      their gradient written in the logits' dtype: 2e; flash_attn the same (the logits saved, a new
      gradient written: flash_attn/losses/cross_entropy.py with inplace_backward False).
    workloads/transformer_ops.cross_entropy_bytes counts what each moves."""
    e = plan.dtype_bytes
    return {"te": e, "torch_compiled": 2 * e, "flash_attn": 2 * e, "torch": 12}.get(plan.cross_entropy, 4 + e)


def zero3_kept(grad_accumulation: str, pp: np.ndarray | int, zero: np.ndarray | int) -> np.ndarray:
    """Whether a ZeRO-3 plan keeps each chunk's weights gathered from a backward to its next pass: FSDP2 under
    torch.distributed.pipelining (config/plan.py pipelined_fsdp2), which runs every backward but the last with
    set_reshard_after_backward(False) (pipelining/stage.py backward_maybe_with_nosync, torch 2.13). The one
    rule for its memory (state_bytes_per_param) and its gathers (workloads/transformer.py, fast_estimate.py)."""
    return (np.asarray(zero) == 3) & pipelined_fsdp2(grad_accumulation, pp, zero)


def state_bytes_per_param(
    base: PlanConfig, zero: np.ndarray | int, shard: np.ndarray | int, pp: np.ndarray | int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bytes per local parameter of weights, gradients and optimizer state on one GPU: weights as kept
    (PlanConfig.stored_weight_bytes: 16-bit, fp32 in fp32 training), gradients in plan.grad_bytes (under
    grad_accumulation autograd the parameters' own .grad, in the 16-bit dtype autograd writes: DeepSpeed's FP16
    and ZeRO-0/1 optimizers; under fp32_copy_add(_zeroed) both that .grad and the fp32 sums it is added into,
    4 + 2 bytes: DeepSpeed's BF16_Optimizer keeps fp32_groups_gradients_flat, one fp32 gradient per parameter,
    unsharded, and only zeroes each .grad before the next backward (bf16_optimizer.py clear_lp_grads at v0.12.6;
    None at BLOOM's 5ea1c60f8, rewritten by that backward), whatever dtype the reduction sends (plan.grad_reduce_dtype);
    where gradients are sharded (ZeRO 2-3) both are divided), the optimizer's copy of the weights and Adam m, v
    (PlanConfig.optimizer_state_bytes: 4 + 8 by default; fp32 training: 4, 4, 8), each divided by the `shard`
    ranks from the ZeRO stage that shards it (3: weights, 2: gradients, 1: optimizer). fp32 weights of 16-bit
    training (main_params fp32_weights, torchtitan's FSDP2) are sharded from ZeRO 2 on: FSDP2 shards every
    parameter, and at ZeRO 2 (reshard_after_forward False) also keeps the 16-bit weights it gathered from the
    forward until the backward: 16-bit bytes whole beside the fp32 shard. FSDP2 under pipelining
    (plan.grad_accumulation fp32_add, and fsdp2 where `pp` > 1 with ZeRO 2-3: config/plan.py whole_fp32_sums)
    keeps each parameter's fp32 sum of the micro-batches' gradients whole until the last micro-batch's
    reduce-scatter (_fsdp_param.py unsharded_accumulated_grad): 4 bytes, unsharded; under ZeRO-3 there it also
    keeps the weights it gathered for a backward until the next pass (zero3_kept): their bytes whole too."""
    w_b, g_b = base.stored_weight_bytes, 4 if base.dtype == "fp32" else base.grad_bytes
    if base.grad_accumulation == "autograd":  # param.grad, in the dtype autograd writes it
        g_b = base.dtype_bytes
    elif base.grad_accumulation in BF16_OPTIMIZER_ACCUMULATIONS:  # fp32 sums beside autograd's .grad
        g_b = 4 + base.dtype_bytes
    o_b = base.optimizer_state_bytes
    z = np.asarray(zero)
    fsdp2 = base.main_params == "fp32_weights" and base.dtype != "fp32"
    gathered = (fsdp2 & (z == 2)) | zero3_kept(base.grad_accumulation, pp, z)  # 16-bit weights held whole
    weights = w_b / np.where(z >= (2 if fsdp2 else 3), shard, 1) + np.where(gathered, base.dtype_bytes, 0)
    # DeepSpeed ZeRO-3 keeps 16-bit gradient partitions whatever the reduction (v0.3.13 stage3.py
    # partition_previous_reduced_grads: grads_in_partition dtype torch.half)
    grad_b = np.where((z >= 3) & (base.zero3_fetch == "deepspeed"), min(g_b, base.dtype_bytes), g_b)
    grads = np.where(whole_fp32_sums(base.grad_accumulation, pp, z), 4.0, grad_b / np.where(z >= 2, shard, 1))
    return weights, grads, o_b / np.where(z >= 1, shard, 1)


#: DeepSpeed ZeRO-3 defaults (deepspeed/runtime/zero/constants.py at v0.3.13, 12a53b4, March 2021):
#: stage3_max_live_parameters, stage3_prefetch_bucket_size, reduce_bucket_size (elements).
DS_MAX_LIVE_PARAMS, DS_PREFETCH_BUCKET, DS_REDUCE_BUCKET = 1e9, 5e7, 5e8


def zero3_live_columns(m: ModelConfig, t: PlanTable) -> tuple[np.ndarray, np.ndarray]:
    """Per row: parameters gathered whole at the peak and bytes of full gradients waiting for their
    reduction, beside the ZeRO-3 shards (0 below ZeRO-3, and where zero3_kept: its weights whole already).
    plan.zero3_fetch layer (FSDP): two whole layers, the running one and the next one prefetched; no whole
    gradient outlives its reduce-scatter.
    deepspeed (v0.3.13 stage3.py): a submodule's own parameters are fetched (fetch_sub_module), then,
    only while fewer than DS_MAX_LIVE_PARAMS are gathered, the next ones of the trace until
    DS_PREFETCH_BUCKET elements (prefetch_next_sub_modules, get_params_to_prefetch); released after the
    module. A layer's submodules are its Linears (QKV, projection, MLP up, down; tensor-parallel shards),
    forward in that order and backward reversed; an MoE or MLA layer counts as one module (its
    submodules' order not modelled: an upper bound). Backward, a module's full 16-bit gradient waits in
    the reduce bucket until the next gradient arrives, and is partitioned only then
    (reduce_independent_p_g_buckets_and_remove_grads, partition_previous_reduced_grads): the newest
    gradient beside the previous module's (below DS_REDUCE_BUCKET, up to a bucket of them). Not counted:
    DeepSpeed's gathered embedding and output layer (vocab × hidden, beside no layer module: under 5h²
    at GPT-3 530B's shapes) and the flattened bucket copy on its reduction stream (an underestimate)."""
    tp = t.cols["tp"]
    zero3 = (t.cols["zero"] >= 3) & ~zero3_kept(t.base.grad_accumulation, t.cols["pp"], t.cols["zero"])  # kept: whole
    layer = m.layer_params_per_rank(tp, m.is_moe, whole_mlp=m.is_moe & t.whole_residual_mlp)
    layer = layer + (m.expert_params_per_rank(t.cols["ep"], t.cols["etp"]) if m.is_moe else 0)
    if t.base.zero3_fetch == "layer":
        return np.where(zero3, 2 * layer, 0.0), np.zeros_like(layer)
    h, d, f = m.hidden_size, m.head_dim, m.ffn
    up = 2 if m.gated_mlp else 1
    modules = (
        [layer]
        if m.is_moe or m.mla
        else [
            h * (m.num_attention_heads + 2 * m.kv_heads) * d / tp,
            m.num_attention_heads * d * h / tp,
            up * f * h / tp,
            f * h / tp,
        ]
    )
    live = np.zeros_like(layer)
    for order in (modules, modules[::-1]):  # forward, backward; the next layer's modules follow
        ahead = order + order
        for i, own in enumerate(order):
            fetched = np.zeros_like(layer)
            for nxt in ahead[i + 1 : i + 1 + len(order)]:
                fetched = fetched + np.where(fetched < DS_PREFETCH_BUCKET, nxt, 0)
            live = np.maximum(live, own + np.where(own < DS_MAX_LIVE_PARAMS, fetched, 0))
    back = modules[::-1]
    waiting = [np.maximum(prev, np.minimum(DS_REDUCE_BUCKET, layer)) for prev in [back[-1], *back[:-1]]]
    grads = np.maximum.reduce([own + wait for own, wait in zip(back, waiting, strict=True)]) * t.base.dtype_bytes
    return np.where(zero3, live, 0.0), np.where(zero3, grads, 0.0)


class StageMemory:
    """Bytes on one GPU of a pipeline stage, as a function of which stage it is and which layers it
    holds, for every row of a plan table: the one memory model of `predict`, the fast path, search
    and stage slicing. `columns` broadcasts: `layers` may be an array over candidate stages."""

    def __init__(self, m: ModelConfig, system: SystemConfig, t: PlanTable) -> None:
        c, base = t.cols, t.base
        self.m, self.t, self.gpu = m, t, system.gpu
        # Megatron's distributed optimizer shards over DP×CP, or within plan.zero_shard_ranks (one copy a group)
        shard = np.where(c["shard"] > 0, c["shard"], c["dp"] * c["cp"])
        expert_shard = c["tp"] * shard // (c["ep"] * c["etp"])  # routed experts: over expert data parallel
        self.tokens = c["mbs"] * m.seq_length / c["cp"]
        self.per_layer = _activation_bytes(m, t) * self.tokens
        self.per_moe_layer = _activation_bytes(m, t, moe=True) * self.tokens if m.is_moe else 0.0
        self.state = state_bytes_per_param(base, c["zero"], shard, c["pp"])
        self.expert_state = state_bytes_per_param(base, c["zero"], expert_shard, c["pp"])
        whole_w_b = base.dtype_bytes  # ZeRO-3's gathered layers: whole, in the compute dtype
        # full recompute: one layer's whole activations live while it is recomputed (any stage)
        no_rc = np.zeros_like(c["zero"])
        whole = _activation_bytes(m, t, no_rc)
        if m.is_moe:
            whole = np.maximum(whole, _activation_bytes(m, t, no_rc, moe=True))
        # uniform method: a group of recompute_num_layers layers (at most a chunk's) is recomputed at once
        group = recompute_group(m, base, c["pp"], c["vp"])
        # selective: what one layer recomputes lives during its backward
        sel = np.full_like(no_rc, _SELECTIVE)
        selective_again = _activation_bytes(m, t, no_rc) - _activation_bytes(m, t, sel)
        if m.is_moe:
            moe_again = _activation_bytes(m, t, no_rc, moe=True) - _activation_bytes(m, t, sel, moe=True)
            selective_again = np.maximum(selective_again, moe_again)
        again = np.where(c["recompute"] == _FULL, group * whole, 0)
        again = np.where(c["recompute"] == _SELECTIVE, selective_again, again)
        self.recomputing = again * self.tokens
        live_params, self.live_grads = zero3_live_columns(m, t)
        self.gathered = live_params * whole_w_b
        self.deepep = np.zeros(len(c["ep"]))  # DeepEP's Buffer, on a GPU whose stage has MoE layers
        if m.is_moe and base.deepep_buffers:
            eps, of_row = np.unique(c["ep"], return_inverse=True)
            # a size DeepEP does not run is refused (job.py) and not searched (plan_space.py): none held
            sizes = [
                deepep_buffer_bytes(m.hidden_size, base.dtype_bytes, int(ep)) if ep in DEEPEP_EP_SIZES else 0
                for ep in eps
            ]
            self.deepep = np.array(sizes, dtype=np.float64)[of_row]

    def columns(self, first: Any, last: Any, index: Any, layers: Any, moe_layers: Any) -> dict[str, np.ndarray]:
        """Weights, gradients, optimizer state, activations and total bytes of stage `index` holding
        `layers` transformer layers (`moe_layers` of them MoE), the embedding if `first`, the output
        layer and the fp32 logits of one micro-batch if `last`; the reserve beyond them (reserve_bytes, and DeepEP's
        buffers where its stage has MoE layers)."""
        m, t, c = self.m, self.t, self.t.cols
        params = stage_param_columns(m, t, first, last, layers, moe_layers)
        experts = stage_expert_param_columns(m, t, moe_layers)
        (w_b, g_b, o_b), (ew_b, eg_b, eo_b) = self.state, self.expert_state
        held = in_flight_microbatches(c["schedule"], index, c["pp"], t.microbatches, c["vp"])
        acts = ((layers - moe_layers) * self.per_layer + moe_layers * self.per_moe_layer) * held + self.recomputing
        logits = self.tokens * t.local_vocab(m.vocab_size) * cross_entropy_peak_bytes(self.t.base)
        acts = acts + np.where(last, logits, 0)  # what the loss holds of one micro-batch's logits at its peak
        out = {
            "weights": params * w_b + experts * ew_b + self.gathered,
            "gradients": params * g_b + experts * eg_b + self.live_grads,
            "optimizer": params * o_b + experts * eo_b,
            "activations": acts,
        }
        # the activations' shape: `layers` may be an array over candidate stages (job_slicing)
        deepep = np.where(moe_layers > 0, self.deepep, 0)
        tied = m.tied & (c["pp"] > 1) & (np.asarray(first) | np.asarray(last))  # the embedding group's members
        megatron_moe = self.t.base.moe_token_dispatcher in ("alltoall", "flex")
        groups = communicators(c, tied, np.asarray(moe_layers) > 0, megatron_moe)
        out["reserved"] = reserve_bytes(self.gpu, groups) + deepep + np.zeros_like(acts)
        out["total"] = sum(out.values())
        return out


def memory_columns(m: ModelConfig, system: SystemConfig, t: PlanTable) -> dict[str, np.ndarray]:
    """Bytes per GPU of every row's most loaded stage: weights, gradients, optimizer, activations,
    reserved (reserve_bytes), total, and which stage."""
    stage = StageMemory(m, system, t)
    best: dict[str, np.ndarray] = {}
    for first, last, index, layers, moe_layers in _stages(m, t):
        row = stage.columns(first, last, index, layers, moe_layers) | {"stage": index}
        if not best:
            best = row
        else:
            worse = row["total"] > best["total"]
            best = {k: np.where(worse, v, best[k]) for k, v in row.items()}
    return best


def _stages(m: ModelConfig, t: PlanTable) -> list[tuple[Any, Any, np.ndarray, Any, Any]]:
    """The stages to evaluate, as (first?, last?, stage index, layers on it, MoE layers of them) per
    row: with equal stages the first and the last (and for an MoE model with leading dense layers
    the middle bound of the module docstring), with plan.stage_layers every stage (the table's rows
    then share pipeline_parallel and virtual_pipeline)."""
    pp, vp = t.cols["pp"], t.cols["vp"]
    if t.base.stage_layers is None:
        equal = m.num_layers / pp
        chunk = m.num_layers // (pp * vp)

        def moe_on(stage: np.ndarray) -> np.ndarray:  # MoE layers of `stage`'s chunks
            total = np.zeros_like(pp)
            for c in range(int(vp.max())):
                start = (c * pp + stage) * chunk
                total += np.where(c < vp, m.moe_layers_before(start + chunk) - m.moe_layers_before(start), 0)
            return total

        out = [
            (True, pp == 1, np.zeros_like(pp), equal, moe_on(np.zeros_like(pp))),
            (pp == 1, True, pp - 1, equal, moe_on(pp - 1)),
        ]
        if m.is_moe and m.moe_first_dense_layers:
            middle = np.maximum(pp - 2, 0)
            out.append((middle == 0, pp == 1, np.minimum(pp - 1, 1), equal, moe_on(middle)))
        return out
    counts = t.base.stage_layer_counts(m.num_layers)
    last = len(counts) - 1
    return [
        (s == 0, s == last, np.full_like(pp, s), float(n), np.full_like(pp, stage_moe_layers(m, t.base, s)))
        for s, n in enumerate(counts)
    ]


def estimate_memory(job: Job) -> MemoryEstimate:
    """Memory on the most loaded GPU of one job. On a mixed cluster (system.device_groups) every
    stage is checked against its own GPU: the one with the least room left is reported."""
    table = PlanTable.of_jobs([job])
    if not job.system.device_groups:
        col = memory_columns(job.model, job.system, table)
        return _estimate(col, 0, int(col["stage"][0]), job.system.gpu)
    p, found = job.plan, []
    last = p.pipeline_parallel - 1
    for s, (gpu, layers) in enumerate(zip(job.stage_gpus(), p.stage_layer_counts(job.model.num_layers), strict=True)):
        system = job.system.model_copy(update={"gpu": gpu})
        col = StageMemory(job.model, system, table).columns(
            s == 0, s == last, s, layers, stage_moe_layers(job.model, p, s)
        )
        found.append(_estimate(col, 0, s, gpu))
    return min(found, key=lambda e: e.capacity_bytes - e.total_bytes)


def _estimate(col: dict[str, np.ndarray], row: int, stage: int, gpu: GPUSpec) -> MemoryEstimate:
    return MemoryEstimate(
        float(col["weights"][row]),
        float(col["gradients"][row]),
        float(col["optimizer"][row]),
        float(col["activations"][row]),
        float(col["reserved"][row]),
        stage,
        gpu.hbm_bytes,
    )
