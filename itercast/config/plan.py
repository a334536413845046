"""How training is parallelised: the canonical plan fields of DESIGN.md §2 (Megatron vocabulary)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

import numpy as np
from pydantic import BaseModel, Field, NonNegativeInt, model_validator

from itercast.config.deepep_buffer import DEEPEP_EP_SIZES
from itercast.config.strict import STRICT, Batch, Layers, Ranks

Schedule = Literal["gpipe", "1f1b", "interleaved-1f1b"]
Recompute = Literal["none", "selective", "full"]
#: Megatron-Core's selective recompute modules itercast prices (TransformerConfig.recompute_modules)
RecomputeModule = Literal["core_attn", "layernorm", "moe_act", "mlp", "mla_up_proj", "shared_experts", "moe"]
DType = Literal["fp32", "bf16", "fp16", "fp8"]
#: Transformer Engine's userbuffers layers whose overlap may reserve SMs (module/base.py initialize_ub)
TEOverlapLayer = Literal["proj_fprop", "fc2_fprop", "qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad"]
TE_OVERLAP_LAYERS: tuple[str, ...] = get_args(TEOverlapLayer)
#: initialize_ub get_default_config: num_sm 16 with set_sm_margin for the pipeline and bulk methods
TE_OVERLAP_DEFAULT_SMS = 16
#: initialize_ub get_default_config: the pipeline method splits its GEMM into 4 (num_splits; every pipeline cfg
#: of dgxc-benchmarking's and Megatron-Bridge's comm_overlap.py sets 4 too); ring exchange into tensor_parallel
TE_PIPELINE_SPLITS = 4

#: PlanConfig.moe_token_dispatcher values that are DeepSpeed's MOELayer: its dense einsum dispatch (before v0.19.4)
#: and its index gathers (from v0.19.4)
DEEPSPEED_MOE_DISPATCHERS = ("einsum", "gather")
#: PlanConfig.moe_token_dispatcher values that are torchtitan's MoE layer: its all-to-all ExpertParallel and its
#: DeepEPExpertParallel (parallelism.expert_parallel_comm_backend standard and deepep)
TORCHTITAN_DISPATCHERS = ("torchtitan", "torchtitan_deepep")
#: PlanConfig.moe_token_dispatcher values that send a token once to each GPU (and each remote node) holding one of
#: its experts, over DeepEP's kernels: Megatron-Core's flex dispatcher and torchtitan's DeepEP backend
#: (transformer_ops.dispatch_share)
DEDUP_DISPATCHERS = ("flex", "torchtitan_deepep")
#: Bytes of one element of each training dtype. fp8 training keeps bf16 activations and
#: communication (NVIDIA Transformer Engine casts only GEMM inputs), so it moves 2 bytes.
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2}
#: PlanConfig.pointwise_kernels values that run torchtitan's model code op by op, without torch.compile
EAGER_POINTWISE = ("eager", "eager_fused_norm")


#: PyTorch DDP's gradient bucket, bucket_cap_mb = 25 (torch/nn/parallel/distributed.py): one all-reduce
#: per 25 MiB of gradients
TORCH_DDP_BUCKET_BYTES = 25 * 2**20


#: the grad_accumulation modes of DeepSpeed's BF16_Optimizer: fp32 sums beside the 16-bit .grad autograd writes
BF16_OPTIMIZER_ACCUMULATIONS = ("fp32_copy_add", "fp32_copy_add_zeroed")


def whole_fp32_sums(grad_accumulation: str, pp: Any, zero: Any) -> Any:
    """Whether FSDP2 sums the micro-batches' gradients in whole fp32 tensors before one reduce-scatter (bool, or
    an array over `pp` and `zero`): under grad_accumulation fp32_add, and fsdp2 with pipelining (pp > 1) and FSDP
    (zero 2-3). The one rule for the accumulation's price (transformer_ops.grad_accumulation_cost) and its
    memory (memory.state_bytes_per_param)."""
    pipelined_fsdp = (np.asarray(pp) > 1) & (np.asarray(zero) >= 2)
    return (grad_accumulation == "fp32_add") | ((grad_accumulation == "fsdp2") & pipelined_fsdp)


def pipelined_fsdp2(grad_accumulation: str, pp: Any, zero: Any) -> Any:
    """Whether FSDP2 runs under torch.distributed.pipelining (bool, or an array over `pp` and `zero`): whole fp32 sums
    (whole_fp32_sums) with FSDP (zero 2-3) and pipelining (pp > 1). Such a plan reduce-scatters nothing during the
    passes, each stage's gradients after its last backward (workloads/transformer.py, search/fast_estimate.py)."""
    return whole_fp32_sums(grad_accumulation, pp, zero) & (np.asarray(zero) >= 2) & (np.asarray(pp) > 1)


def torchtitan_expert_layout_ok(ep: Any, etp: Any, tp: Any, cp: Any, dp: Any, deepep: Any = False) -> Any:
    """Whether torchtitan runs these expert layouts (ints, or arrays over plans; torchtitan/distributed/
    parallel_dims.py ParallelDims._validate, models/llama4/infra/parallelize.py apply_moe_ep_tp): without expert
    parallelism the experts split over the tensor-parallel ranks (TensorParallel: etp = tp); with it whole experts
    (etp 1: the expert group borrows every context- and tensor-parallel rank and some data-parallel ones, so
    cp × tp divides ep and ep divides dp × cp × tp) or experts split over tp (etp = tp: it borrows every
    context-parallel rank and some data-parallel ones, so cp divides ep and ep divides dp × cp).
    `deepep` (its DeepEP backend, plan.moe_token_dispatcher torchtitan_deepep) takes whole experts with expert
    parallelism only (parallelize.py at 9810191^: 'DeepEP requires expert parallelism (ep_degree > 1)', ETP 'not
    supported yet'), as priced no tensor parallelism (job.py _torchtitan_expert_problems says why), and an expert-
    parallel size DeepEP has kernel configurations for (config/deepep_buffer.py DEEPEP_EP_SIZES)."""
    split = (etp == tp) & (ep % cp == 0) & ((dp * cp) % ep == 0)
    whole = (etp == 1) & (ep % (cp * tp) == 0) & ((dp * cp * tp) % ep == 0)
    ok = np.where(ep == 1, etp == tp, split | whole)
    return ok & (~np.bool_(deepep) | ((ep > 1) & (etp == 1) & (tp == 1) & np.isin(ep, DEEPEP_EP_SIZES)))


def local_vocab_rows(vocab_size: int, tp: Any, divisible_by: int) -> Any:
    """Vocabulary rows per tensor-parallel rank (int, or an array over `tp`): the vocabulary padded up to a
    multiple of divisible_by × tp, as Megatron-LM's _vocab_size_with_padding does, then split in tp
    (VocabParallelEmbedding, the column-parallel output layer). GPT-2's 50,257 at tp 8: 51,200 / 8 = 6,400."""
    unit = divisible_by * np.asarray(tp, dtype=np.int64)
    return -(-vocab_size // unit) * divisible_by


class PlanConfig(BaseModel):
    """Parallel sizes, batching, schedule, memory savers and overlap switches.

    Rank order is Megatron's default (innermost first): tensor, context, data, pipeline.
    """

    model_config = STRICT

    data_parallel: Ranks | None = Field(
        None, description="Replicas; default: whatever is left of the GPUs after tp·pp·cp."
    )
    tensor_parallel: Ranks = 1
    pipeline_parallel: Ranks = 1
    context_parallel: Ranks = 1
    expert_parallel: Ranks = Field(1, description="Ranks the routed experts of an MoE layer are spread over.")
    expert_tensor_parallel: Ranks | None = Field(
        None,
        description="Tensor parallelism inside each expert; default tensor_parallel (Megatron-Core), 1 under "
        "DeepSpeed's MoE layer (moe_token_dispatcher einsum or gather: whole experts, its default) and under "
        "torchtitan's with expert parallelism (PlanConfig.default_etp).",
    )
    virtual_pipeline: Ranks = Field(1, description="Model chunks per pipeline rank (interleaving).")
    stage_layers: Annotated[tuple[NonNegativeInt, ...] | None, Field(strict=False)] = Field(
        None,
        description="Transformer layers of each virtual stage in pipeline order (pipeline_parallel × "
        "virtual_pipeline entries summing to num_layers; the embedding sits on the first, the head on the "
        "last); default: equal stages. `itercast slice` prints one.",
    )
    sequence_parallel: bool = Field(False, description="Megatron sequence parallelism with tp > 1.")
    micro_batch_size: Batch = 1
    global_batch_size: Batch | None = Field(
        None, description="Sequences per step; default micro_batch_size × data_parallel (1 micro-batch)."
    )
    schedule: Schedule = "1f1b"
    recompute: Recompute = "none"
    selective_recompute: Literal["modules", "op"] = Field(
        "modules",
        description="What recompute=selective runs again: Megatron-Core's recompute_modules "
        "(--recompute-granularity selective) or every op but the saved matmuls and attention kernels "
        "(torchtitan activation_checkpoint.selective_ac_option=op).",
    )
    recompute_modules: list[RecomputeModule] = Field(
        default_factory=lambda: list[RecomputeModule](["core_attn"]),
        description="selective_recompute=modules: what Megatron-Core runs again (--recompute-modules; "
        "transformer_config.py, default core_attn): core_attn the attention kernels; layernorm an MoE layer's "
        "pre-MLP norm (the others are fused into Transformer Engine's linears) without keeping its output; "
        "moe_act the routed experts' activation without keeping its output (needs moe_grouped_gemm); mlp a "
        "dense layer's MLP whole, keeping its input; mla_up_proj multi-latent attention's up projections and "
        "rotary embedding without keeping their outputs (query, key, value); shared_experts an MoE layer's shared "
        "experts whole, keeping their input (not with moe_shared_expert_overlap); moe an MoE layer whole, its "
        "all-to-alls and host wait included, keeping its input (not with moe_a2a_overlap; with moe_act or "
        "shared_experts, checkpoints nested in it, not priced).",
    )
    recompute_method: Literal["uniform", "block"] = Field(
        "uniform",
        description="recompute=full (Megatron-Core --recompute-method): uniform checkpoints the input of every "
        "group of recompute_num_layers layers and recomputes them all; block recomputes only the first "
        "recompute_num_layers layers of each model chunk and keeps the others' activations.",
    )
    recompute_num_layers: Layers = Field(1, description="recompute=full: Megatron-Core --recompute-num-layers.")
    recompute_every: Layers = Field(
        1,
        description="recompute=full: only every n-th layer is checkpointed (torchtitan selective_ac_option=n: "
        "layers n, 2n, ... counted from 1); 1: every layer.",
    )
    zero_stage: NonNegativeInt = Field(0, le=3, description="0: DDP; 1–2: distributed optimizer; 3: FSDP.")
    zero_grad_reduce: Literal["reduce_scatter", "all_reduce", "reduce_per_rank"] = Field(
        "reduce_scatter",
        description="zero_stage=1/2: how each gradient bucket is reduced to the ranks that own its shards (ZeRO-0 "
        "all-reduces, ZeRO-3 and FSDP reduce-scatter, whatever this says). reduce_scatter: one reduce-scatter "
        "(Megatron-Core's distributed optimizer). all_reduce: DeepSpeed v0.12.4 on, the whole bucket all-reduced and "
        "each rank's slices copied out (zero/stage_1_and_2.py average_tensor -> allreduce_and_scatter, "
        "use_multi_rank_bucket_allreduce default true; at v0.12.6 allreduce_bucket also sets rank = None on the "
        "other path): twice a reduce-scatter's bytes. reduce_per_rank: DeepSpeed before v0.12.4 (average_tensor at "
        "v0.6.0 and 3401d2516: one dist.reduce of its slices to each destination rank, in turn): priced as data-"
        "parallel-size reduce-scatters of 1/size of the bucket each, a reduce-scatter's bytes and size times its "
        "latency (workloads/transformer.py dp_collective_s).",
    )
    zero_param_gather: Literal["all_gather", "broadcast_per_rank"] = Field(
        "all_gather",
        description="zero_stage=1/2: how the updated parameter shards reach every rank after the optimizer step "
        "(ZeRO-3 and FSDP all-gather, whatever this says). all_gather: one all-gather (Megatron-Core's distributed "
        "optimizer, DeepSpeed's all_gather_dp_groups). broadcast_per_rank: one dist.broadcast of each rank's shard "
        "from it, in turn (InternLM's HybridZeroOptimizer.broadcast_params of July 2023, c18bec9, after "
        "ColossalAI's low-level ZeRO): priced as data-parallel-size all-gathers of 1/size of the parameters each, "
        "an all-gather's bytes and size times its latency (workloads/transformer.py dp_collective_s).",
    )
    zero_shard_ranks: Ranks | None = Field(
        None,
        description="zero_stage >= 1: the data × context-parallel ranks ZeRO's state is sharded over. Unset: all of "
        "them. Else the innermost groups of this many ranks each hold one copy, replicated across the groups: "
        "Megatron-Core's partial distributed optimizer (--num-distributed-optimizer-instances = ranks / this; each "
        "bucket reduce-scattered within the group, then its shard all-reduced across the groups, "
        "param_and_grad_buffer.py start_grad_sync), FSDP's hybrid sharding (torchtitan data_parallel_shard_degree; "
        "ZeRO-3 gathers within the group), InternLM's zero1 (gradients all-reduced over all ranks as "
        "zero_grad_reduce all_reduce says, shards gathered within the group). An MoE model's routed experts split "
        "their expert-data-parallel ranks by the same copies (Megatron-Core parallel_state.py: intra- and "
        "inter-partial expert data parallel groups).",
    )
    zero3_fetch: Literal["layer", "deepspeed"] = Field(
        "layer",
        description="zero_stage=3: which parameters are gathered at once (memory.zero3_live_columns). layer: "
        "FSDP's, one wrapped transformer block and the next one prefetched. deepspeed: DeepSpeed ZeRO-3's "
        "per-submodule fetch (v0.3.13 stage3.py PartitionedParameterCoordinator: a Linear's weights, the next "
        "module's prefetched only while fewer than stage3_max_live_parameters are gathered), its full fp16 "
        "gradients waiting in the reduce bucket and its fp16 gradient partition. Memory only: step times price the "
        "gathers as FSDP's (one per layer, prefetched) unless zero3_collectives says otherwise.",
    )
    zero3_collectives: Literal["coalesced", "per_tensor_list"] = Field(
        "coalesced",
        description="zero_stage=3: how the parameter gathers and gradient reductions are issued. coalesced: one "
        "collective per gathered unit into a flat buffer (FSDP; DeepSpeed on a torch with _all_gather_base, "
        "v0.5.10 partition_parameters.py use_all_gather_base). per_tensor_list: DeepSpeed v0.3.x ZeRO-3 "
        "(zero3_fetch deepspeed; partition_parameters.py _allgather_param and _reduce_scatter_gradient at "
        "v0.3.13): each parameter tensor gathered, and its gradient reduce-scattered, on its own through a list "
        "of world-size views, which PyTorch's ProcessGroupNCCL copies apart, one copy kernel per rank, between "
        "torch.cuda.synchronize() calls: one collective per tensor, each paying its latency "
        "(workloads/transformer.py _deepspeed_fetch, unit_tensors).",
    )
    dtype: DType = Field(
        "bf16",
        description="Training precision (mixed: 16-bit compute, fp32 master weights). Left out: bf16, or fp16 where a "
        "GPU of the system has no bf16 (V100: Megatron-LM's --fp16, DeepSpeed's fp16 with loss scaling).",
    )
    fp8_recipe: Literal["delayed", "tensorwise", "rowwise"] = Field(
        "delayed",
        description="dtype=fp8: how each GEMM operand's scale is found (HBM bytes per element of each cast: "
        "workloads/transformer_ops.fp8_cast_bytes). delayed, Transformer Engine's DelayedScaling (amax from "
        "the history of earlier steps: one cast-transpose pass; Megatron-Core --fp8-recipe delayed, its "
        "default); tensorwise, one scale per tensor from the tensor itself (TE Float8CurrentScaling: Megatron "
        "--fp8-recipe tensorwise, Megatron-Bridge FP8-CS; torchao/torchtitan float8 tensorwise, its default): "
        "an amax pass before the cast, and with sequence parallelism an amax all-reduce over the "
        "tensor-parallel group; rowwise, torchao/torchtitan float8 rowwise (one scale per row of each "
        "operand: a row-scaled and a column-scaled copy, two passes), which also recasts every weight on "
        "every micro-batch; when the weights are cast: fp8_weight_cast.",
    )
    fp8_weight_cast: Literal["per_step", "per_microbatch"] = Field(
        "per_step",
        description="dtype=fp8: when the GEMM weights are cast to FP8 (workloads/transformer_ops.py _weight_casts, "
        "weight_cast_step_bytes). per_step, Transformer Engine as Megatron-Core, NeMo and Megatron-DeepSpeed run "
        "it: each weight and its transpose cast on the step's first micro-batch and kept for the others "
        "(TE module/linear.py, grouped_linear.py: is_first_microbatch; Megatron-Core schedules.py forward_step). "
        "per_microbatch, torchao's Float8Linear as torchtitan runs it: every weight cast again in the forward and "
        "the backward of every micro-batch (torchao float8_linear.py matmul_with_hp_or_float8_args). Left out: "
        "per_microbatch with fp8_recipe rowwise (torchao's alone), else per_step. delayed runs per_step only "
        "(torchao has no delayed scaling), rowwise per_microbatch only.",
    )
    fp8_experts: bool = Field(
        True,
        description="dtype=fp8: the routed experts' GEMMs run in FP8. Transformer Engine's grouped and "
        "sequential experts do (TEGroupedLinear, TELinear); torchtitan's float8 converter swaps only its Linear "
        "modules (components/quantization/float8.py Float8LinearConverter), so its GroupedExperts stay bf16 "
        "unless its MoE converter is named (Float8GroupedExpertsConverter; earlier float8.moe_fqns_prototype).",
    )
    moe_grouped_gemm: bool = Field(
        False,
        description="How Megatron-Core runs a rank's routed experts (workloads/transformer_ops.py _moe_block). "
        "true, --moe-grouped-gemm: TEGroupedMLP, one grouped GEMM per projection over every local expert, one "
        "activation kernel, under Transformer Engine FP8 its rows padded to a multiple of 16 and back "
        "(Fp8Padding / Fp8Unpadding). false, Megatron-Core's default (TransformerConfig.moe_grouped_gemm False; "
        "arguments.py store_true): SequentialMLP, a loop over the local experts, each a TE MLP with its own "
        "activation and FP8 casts, its rows padded only when not a multiple of 16, the outputs concatenated "
        "(moe/experts.py SequentialMLP.forward).",
    )
    flash_attention: bool = Field(
        True,
        description="Fused attention: no s×s scores kept in memory. Left out: true where every GPU of the "
        "system supports it (GPUSpec.supports_flash_attention), else false.",
    )
    attention_kernel: Literal["cudnn", "fa2", "fa3", "triton"] = Field(
        "cudnn",
        description="The fused attention kernel the framework runs, priced from its fitted benchmarks where the "
        "GPU has them (Hopper: costs/curves.json attention): cudnn, Transformer Engine's FusedAttention, which "
        "Megatron-Core and NeMo run on Hopper; fa2, FlashAttention-2, which torch SDPA's flash backend runs "
        "(torchtitan on H100, PyTorch before cuDNN 9.15: pytorch/pytorch#138522, #142132) and llm-foundry's "
        "attn_impl flash; fa3, FlashAttention-3; triton, Tri Dao's Triton FlashAttention (llm-foundry's attn_impl "
        "triton, its default until 2024), FlashAttention-2's time × 1.4 forward, × 2 backward (the FlashAttention-2 "
        "paper §4.1). On a GPU without fits every kernel takes the FLOPs-only guess.",
    )
    cp_comm: Literal["p2p", "all_gather", "torch_allgather", "torch_alltoall"] = Field(
        "p2p",
        description="How context_parallel > 1 exchanges keys and values (workloads/transformer_ops.py "
        "_cp_attention, _cp_exchange, _cp_backward). p2p: Transformer Engine's AttnFuncWithCPAndKVP2P "
        "(Megatron-Core --cp-comm-type p2p, its default): a ring of c - 1 sends beside c kernel calls, "
        "outputs merged in bf16; backward the keys, values and their gradients travel the ring together. "
        "all_gather: Transformer Engine's AttnFuncWithCPAndKVAllGather (the Llama 3 paper's §3.3.2): keys "
        "and values all-gathered before two causal calls, exposed, and their gradients reduce-scattered. "
        "torch_allgather and torch_alltoall: PyTorch's context_parallel "
        "(torch/distributed/tensor/experimental/_attention.py) under set_rotate_method('allgather'), "
        "torchtitan's default, or 'alltoall': c SDPA calls merged in fp32 by eager elementwise ops; one "
        "all-gather beside the first call, or a ring of c - 1 sends; backward the fp32 key/value gradients "
        "passed around the ring, the last send exposed. Their keys and values are the query heads' "
        "(torchtitan repeats the key-value groups before SDPA).",
    )
    cross_entropy: Literal["megatron", "megatron_fused", "te", "torch", "torch_compiled", "flash_attn"] = Field(
        "megatron",
        description="The loss kernels over the vocab-parallel logits (bytes per logit: "
        "workloads/transformer_ops.cross_entropy_bytes): megatron, Megatron-Core's vocab_parallel_cross_entropy "
        "(TransformerConfig.cross_entropy_loss_fusion False, its default); megatron_fused, the same fused by "
        "jit (--cross-entropy-loss-fusion, NeMo 2's GPTConfig default); te, Transformer Engine's Triton kernel "
        "(--cross-entropy-fusion-impl te); torch, F.cross_entropy on the logits cast to fp32 (torchtitan, "
        "eager); torch_compiled, the same under torch.compile (torchtitan's [compile] components 'loss'); "
        "flash_attn, flash-attn's fused CrossEntropyLoss (llm-foundry MPT's loss_fn fused_crossentropy, its default). "
        "With tensor parallelism each runs its own collectives over the vocabulary shards "
        "(workloads/transformer_ops.LOSS_COLLECTIVES).",
    )
    make_vocab_size_divisible_by: int = Field(
        128,
        ge=1,
        le=65536,
        description="The vocabulary is padded to a multiple of this × tensor_parallel and split evenly over the "
        "tensor-parallel ranks, as Megatron-LM, Megatron-Core and NeMo do (megatron/training/tokenizer/"
        "tokenizer.py _vocab_size_with_padding, --make-vocab-size-divisible-by, default 128): their embedding, "
        "output layer, logits and loss run on the padded rows. 1: the tokenizer's size as it is (torchtitan, "
        "Hugging Face models). Model FLOPs and MFU count the unpadded vocabulary.",
    )
    tp_layout: Literal["megatron", "dtensor"] = Field(
        "megatron",
        description="How tensor parallelism runs its collectives: megatron, [s, b, h] activations gathered and "
        "scattered on dim 0, a column-parallel GEMM's input re-gathered in its backward beside the input-gradient "
        "GEMM and the input gradient's reduce-scatter beside the weight-gradient GEMM (Megatron-Core "
        "LinearWithGradAccumulationAndAsyncCommunication); dtensor, torchtitan's DTensor TP: [b, s, h] sharded on "
        "the sequence, dim 1, each collective copying its tensor once more (a micro-batch of one sequence excepted), "
        "its backward collectives run where their results are used, not beside a GEMM, and the input re-gathered "
        "only where selective recompute runs its all-gather again; under async TP (tp_comm_overlap) the collectives "
        "fused with their GEMMs as megatron's, but the input gradients' reduce-scatters, which follow a sum of the "
        "separate projections' gradients, unfused and copied.",
    )
    projections: Literal["fused", "separate"] = Field(
        "fused",
        description="How a layer's query, key and value projections and a gated MLP's gate and up projections "
        "run: fused, one GEMM each (Megatron-Core linear_qkv and linear_fc1, Megatron-DeepSpeed, llm-foundry's "
        "Wqkv); separate, one linear each (torchtitan models/llama3/model.py at 820504e: wq, wk, wv and w1, w3; "
        "Hugging Face's Llama), each GEMM priced on its own FLOPs forward and backward, and the input gradients of "
        "the input they share summed: eagerly (plan.pointwise_kernels eager, eager_fused_norm) autograd adds "
        "each arriving gradient to the sum so far (k − 1 kernels of 3 tensors for k projections), compiled "
        "(pointwise_kernels compiled or fused) one kernel reads the k gradients and writes their sum. The FP8 "
        "casts of their shared input are priced once (torchao casts it in each Float8Linear: not priced apart).",
    )
    attention_unpad: bool = Field(
        False,
        description="llm-foundry's attn_impl flash (layers/attention.py flash_attn_fn at 5e85bd62): q, k and v "
        "gathered to their unpadded rows before flash_attn_varlen_func and the output scattered back into a zeroed "
        "padded tensor (flash_attn.bert_padding unpad_input, pad_input), whatever the padding. Its host syncs "
        "(nonzero, .item()) are not priced.",
    )
    metric_cross_entropies: NonNegativeInt = Field(
        0,
        le=8,
        description="Cross-entropies a training loop computes again over each micro-batch's logits for its "
        "training metrics, eagerly in fp32 without gradient: Composer's LanguageCrossEntropy and "
        "LanguagePerplexity, 2 (trainer.py _eval_train_metrics after every micro-batch's backward; metrics/nlp.py "
        "CrossEntropyLoss). 0: none (Megatron, torchtitan).",
    )
    pointwise_kernels: Literal["fused", "compiled", "eager", "eager_fused_norm"] = Field(
        "fused",
        description="How a llama layer's RMSNorms, rotary embeddings and SwiGLU activation run (bytes and "
        "kernels: workloads/transformer_ops.py eager_rmsnorm_cost, eager_rotary_cost, eager_swiglu_cost). "
        "fused: one kernel each (Transformer Engine, Apex, Megatron-Core). compiled: torchtitan's model code "
        "under torch.compile (each TransformerBlock compiled): Inductor fuses the norms and SwiGLU into one "
        "kernel each, but falls back to eager for the complex product of the rotary embedding (Inductor "
        "lowering.py: complex tensors are not generated, make_fallback(aten.view_as_complex); its casts Inductor "
        "kernels of the same bytes), so the rotary embedding and repeat_kv's copies run as under eager. eager: "
        "torchtitan's model code run op by op, without torch.compile (train_configs compile = false; "
        "torchtitan 9dec370a models/norms.py RMSNorm, models/llama/model.py apply_rotary_emb, repeat_kv, "
        "FeedForward): each op a kernel over the whole tensor, the norm and rotary in fp32 after .float(), "
        "autograd's backward kernel by kernel, and the grouped keys and values copied to every query head. "
        "eager_fused_norm: the same with torchtitan's norm_type fused_rmsnorm (models/norms.py FusedRMSNorm, "
        "a Triton kernel each way: its norms priced as fused).",
    )
    grad_bucket_size_params: Batch | None = Field(
        None,
        description="DP gradient bucket, in parameters. Left out: Megatron-Core's default, max(40M, 1M × the "
        "data parallel ranks, context parallel ones not counted) (DistributedDataParallel: 'make buckets larger to "
        "ensure that chunks used in NCCL ring-reduce implementations are large enough').",
    )
    grad_reduce_dtype: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="Gradient buffers and their reduction (Megatron-LM: fp32 with bf16 training). DeepSpeed sends "
        "its communication_data_type, which is the training's 16-bit dtype unless its config names one (engine.py "
        "communication_data_type at v0.12.6 and v0.15.1, and 2022's bf16 branch for ZeRO-0): BF16_Optimizer casts "
        "its fp32 sums to bf16 for the all-reduce (allreduce_bucket) and ZeRO-1/2 reduce the 16-bit bucket, so "
        "bf16 there (2 bytes, fp16's too); its fp32 sums are priced by plan.grad_accumulation fp32_copy_add. "
        "BF16_Optimizer's cast to bf16 and back, 6 + 6 bytes per parameter once a step, is not priced.",
    )
    grad_accumulation: Literal[
        "fused", "autograd", "fp32_copy_add", "fp32_copy_add_zeroed", "fp32_add", "fsdp2", "megatron_fsdp"
    ] = Field(
        "fused",
        description="How each micro-batch's weight gradients join the step's (workloads/transformer_ops.py "
        "grad_accumulation_ops: a memory-bound pass over the unit's parameters after its backward, on every "
        "micro-batch). fused: inside the weight-gradient GEMM, into an fp32 buffer, no pass of its own "
        "(Megatron-LM/-Core --gradient-accumulation-fusion, NeMo). autograd: PyTorch's AccumulateGrad adds "
        "each micro-batch's gradient into param.grad in the gradient's dtype, 3 × its bytes per parameter, a "
        "kernel per tensor (plain F.linear without main_grad, e.g. BigScience's Megatron-DeepSpeed of 2022 "
        "mpu/layers.py; DeepSpeed's default grad_accum_dtype, the model's, under its FP16 and ZeRO-0/1 "
        "optimizers). fp32_copy_add: each micro-batch's 16-bit gradient copied to fp32, then added into an "
        "fp32 buffer, 2 + 4 then 4 + 4 + 4 bytes, two kernels per tensor (DeepSpeed's BF16_Optimizer "
        "update_hp_grads after every micro-batch's backward: bf16 with ZeRO-0 under its pipeline engine, or "
        "grad_accum_dtype fp32 with ZeRO-1). fp32_copy_add_zeroed: fp32_copy_add as DeepSpeed v0.12.6 to "
        "v0.14.1 run BF16_Optimizer: before every backward it zeroes each 16-bit .grad in place "
        "(bf16_optimizer.py clear_lp_grads, param.grad.zero_(), from d5a7c1e0b until c66bc4269 set them to None "
        "again), so autograd adds each micro-batch's gradient into it in place: also 2, then 2 + 2 + 2 bytes, "
        "two more kernels per tensor. fp32_add: an fp32 accumulator += the 16-bit gradient in one "
        "kernel, 4 + 2 + 4 bytes (FSDP2 under torch.distributed.pipelining with reduce_dtype fp32: "
        "set_requires_gradient_sync(False) until the last micro-batch, _fsdp_param.py "
        "accumulate_unsharded_grad_if_needed; its fp32 sums held whole until the last reduce-scatter). fsdp2: "
        "as torchtitan runs FSDP2, fp32_add under pipelining with FSDP (zero_stage 2-3; in fp32 training "
        "autograd's fp32 add, the gradients already in the reduction's dtype), nothing otherwise "
        "(without pipelining FSDP2 reduce-scatters every micro-batch and adds only its shard; DDP's adds of "
        "fp32 gradients left out). megatron_fsdp: as NeMo runs Megatron-Core, fused with zero_stage 0-1; "
        "under Megatron-FSDP (zero_stage 2-3), where NeMo turns gradient_accumulation_fusion off "
        "(nemo/lightning/megatron_parallel.py), autograd writes each micro-batch's gradient and Megatron-FSDP's "
        "post-backward hook copies it into the unsharded main-gradient bucket (megatron_fsdp.py _grad_acc: "
        "main_grad.copy_(param.grad); the reduce-scatter then adds it to the shard): its bytes plus the "
        "buffer's (plan.grad_bytes), a kernel per tensor. Priced on every micro-batch: autograd's first "
        "writes rather than adds, fp32_add's first is a 6-byte cast (one micro-batch's pass over-counted).",
    )
    grad_nan_check: bool = Field(
        True,
        description="Under grad_accumulation fused with zero_stage 0-1 (Megatron's contiguous gradient buffer, "
        "zeroed every step: workloads/transformer.py grad_buffer_zero_bytes): an L2 norm over each "
        "gradient bucket, reading it once on the compute stream, before the bucket's reduction "
        "(DistributedDataParallelConfig.check_for_nan_in_grad; param_and_grad_buffer.py start_grad_sync at "
        "core_r0.8.0, check_grads at d98e8a64). On in Megatron-LM's training script (--check-for-nan-in-loss-and-"
        "grad, unless dynamic loss scaling) and in NeMo 2's and Megatron-Bridge's recipes; the config's own "
        "default, and NeMo 1's optim.check_for_nan_in_grad, leave it off.",
    )
    grad_average_in_collective: bool = Field(
        False,
        description="Under grad_accumulation fused with zero_stage 0-1: DistributedDataParallelConfig."
        "average_in_collective. False "
        "(its default, and Megatron-LM's without --ddp-average-in-collective) scales each gradient bucket by "
        "1 / its data-parallel ranks before the reduction, a read and a write of it on the compute stream "
        "(grad_data *= gradient_scaling_factor, when that factor is not 1); True (NeMo 2's and Megatron-Bridge's "
        "recipes, NeMo 1's default) averages inside the collective: no pass, but for the routed experts, scaled "
        "by their expert data-parallel ranks / the data-parallel ranks where those differ.",
    )
    main_params: Literal["fp32", "fp32_remainders", "bf16", "none", "fp32_weights"] = Field(
        "fp32",
        description="16-bit training: the optimizer's own copy of each weight (PlanConfig.master_param_bytes). fp32: "
        "4 bytes (Megatron-Core's optimizers by default, DeepSpeed, torch AMP). fp32_remainders: the 16 low-order "
        "bits that rebuild the fp32 value from the bf16 weight, 2 bytes (Transformer Engine FusedAdam "
        "store_param_remainders under Megatron-Core --use-precision-aware-optimizer, OptimizerConfig default True; "
        "Apex DistributedFusedAdam store_param_remainders, which NeMo 1's distributed_fused_adam sets with fp32 "
        "optimizer state and bf16 weights: megatron_base_model.py setup_optimization). bf16: a 16-bit copy, 2 "
        "bytes (NeMo 1's distributed_fused_adam with optim.dtype bf16 and fp8_params: store_params True). none: the "
        "optimizer updates the 16-bit weights themselves (NeMo 1's distributed_fused_adam with optim.dtype bf16 "
        "without fp8_params: store_params False). fp32_weights: the weights are kept in fp32 and are the "
        "optimizer's own, cast to 16 bits for compute: 4 bytes of weight, no copy (torchtitan: training.dtype "
        "float32 with mixed_precision_param bfloat16, through FSDP2's MixedPrecisionPolicy, whose all-gathers "
        "move the 16-bit casts, or torch.autocast under DDP; torchtitan/config/configs.py at b5bcd76c).",
    )
    adam_state_dtype: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="Adam's first and second moments (Megatron-Core --exp-avg-dtype and --exp-avg-sq-dtype with "
        "--use-precision-aware-optimizer; NeMo 1's distributed_fused_adam optim.dtype).",
    )
    overlap_grad_reduce: bool = Field(True, description="Reduce gradients during the last backward.")
    overlap_param_gather: bool = Field(True, description="ZeRO 1–2: gather updated parameters during the next forward.")
    tp_comm_overlap: bool = Field(
        False,
        description="With sequence parallelism, run each tensor-parallel all-gather and reduce-scatter "
        "chunk by chunk beside the GEMM it feeds or follows (Megatron-Core --tp-comm-overlap, "
        "Transformer Engine userbuffers): it costs only what it takes beyond that GEMM, and the GEMMs of "
        "Transformer Engine's pipeline and bulk overlaps run on the SMs its communication leaves them "
        "(tp_comm_overlap_sms).",
    )
    tp_comm_overlap_sms: dict[TEOverlapLayer, NonNegativeInt] = Field(
        default_factory=dict,
        description="With tp_comm_overlap: SMs each Transformer Engine userbuffers overlap takes from the GEMM it "
        "runs beside (its num_sm where set_sm_margin is true: the GEMM runs on sm_count − num_sm SMs, "
        "common/comm_gemm_overlap/comm_gemm_overlap.cpp `_math_sms`, TransformerEngine d0067d0), by TE's layer "
        "names: proj_fprop and fc2_fprop (pipeline reduce-scatter after the row-parallel GEMMs), qkv_dgrad, "
        "fc1_dgrad (bulk all-gather beside the column-parallel dgrad) and qkv_wgrad, fc1_wgrad (bulk "
        "reduce-scatter beside their wgrad). A layer left out takes TE's default, 16 (module/base.py "
        "initialize_ub get_default_config: num_sm 16 with set_sm_margin for pipeline and bulk); 0: no margin "
        "(a ub_tp_comm_overlap_cfg with set_sm_margin 0, or PyTorch's async TP). The ring-exchange overlaps "
        "(qkv/fc1 fprop, proj/fc2 dgrad) take none.",
    )
    tp_comm_overlap_rs: Literal["pipeline", "ring_exchange"] = Field(
        "pipeline",
        description="With tp_comm_overlap: how the reduce-scatter after the row-parallel GEMMs (proj_fprop, "
        "fc2_fprop) runs beside them (Transformer Engine's userbuffers method, common/comm_gemm_overlap/"
        "comm_gemm_overlap.cpp, TransformerEngine d0067d0). pipeline (TE's default): the GEMM in "
        f"{TE_PIPELINE_SPLITS} chunks, each chunk's reduce-scatter beside the next chunk's GEMM, the last one "
        "after it (CommOverlapBase::split_overlap_rs). ring_exchange (Megatron-Bridge's FP8 H100 cfgs; PyTorch's "
        "async TP, torch/distributed/_symmetric_memory _pipelined_produce_and_all2all): the GEMM in "
        "tensor_parallel chunks, each sent to the rank that reduces it beside the next, then one kernel sums "
        "the chunks received (CommOverlapP2PBase::split_overlap_rs). The all-gathers before qkv and fc1 and "
        "beside the proj and fc2 data-gradient GEMMs run as a ring exchange of tensor_parallel chunks in both.",
    )
    tp_allreduce_overlap: bool = Field(
        True,
        description="Without sequence parallelism, each column-parallel linear's input-gradient all-reduce over the "
        "tensor-parallel ranks runs beside its weight-gradient GEMM: Megatron-LM's "
        "async_tensor_model_parallel_allreduce (mpu/layers.py LinearWithGradAccumulationAndAsyncAllreduce, from "
        "cf7efd4f 2021-08-30, on by default from 3f652469 2021-09-02; Megatron-Core's "
        "LinearWithGradAccumulationAndAsyncCommunication). false: after that GEMM, beside nothing, as Megatron-LM "
        "ran it before (mpu/mappings.py _CopyToModelParallelRegion.backward all-reduces the gradient F.linear's "
        "backward returns: Megatron-LM 2020 and the SC'21 runs) and as every Megatron-DeepSpeed runs it "
        "(bigscience-workshop's fork never took the async path; microsoft's took it in 2023 and turns it off "
        "under DeepSpeed: arguments.py validate_args 'if args.deepspeed: "
        "args.async_tensor_model_parallel_allreduce = False', f90b8877). No effect with sequence parallelism, "
        "whose reduce-scatter runs beside the weight-gradient GEMM in every version that has it, nor with "
        "tp_layout dtensor, whose collectives run where their results are used.",
    )
    moe_a2a_overlap: bool = Field(
        False,
        description="Hide the expert all-to-alls behind another micro-batch's attention (DeepEP / "
        "Megatron-Core --overlap-moe-expert-parallel-comm).",
    )
    moe_shared_expert_overlap: bool = Field(
        False,
        description="Megatron-Core's --moe-shared-expert-overlap (transformer_config.py moe_shared_expert_overlap, "
        "default False: 'Without this, the shared experts execute before the router'): the shared experts' fc1 runs "
        "on a stream of its own beside the token dispatch's all-to-all and their fc2 beside the combine's, in both "
        "passes (moe/shared_experts.py). Megatron-Core's dispatchers only, and not with moe_a2a_overlap, which "
        "TransformerConfig refuses beside it. torchtitan's dispatcher runs its own order, priced whatever this "
        "says: the forward combine beside the whole shared expert (workloads/transformer_ops.py _moe_a2a_hides).",
    )
    moe_token_dispatcher: Literal["alltoall", "flex", "torchtitan", "torchtitan_deepep", "einsum", "gather"] = Field(
        "alltoall",
        description="Whose code sends an MoE layer's tokens to their experts, which sets where the host waits for "
        "the device in every MoE layer's forward (workloads/transformer_ops.py moe_host_wait) and how many copies "
        "of a token cross the links. alltoall: Megatron-Core's MoEAlltoAllTokenDispatcher (--moe-token-dispatcher-type "
        "alltoall, NeMo and Megatron-Bridge's MoE recipes), a copy per selected expert; flex: its "
        "MoEFlexTokenDispatcher over DeepEP or HybridEP (--moe-token-dispatcher-type flex), a copy per GPU within a "
        "node and per remote node across nodes (transformer_ops.dispatch_share); torchtitan: torchtitan's "
        "ExpertParallel (distributed/expert_parallel.py), which waits only with expert_parallel > 1; "
        "torchtitan_deepep: the same MoE layer over DeepEP (parallelism.expert_parallel_comm_backend deepep, "
        "DeepEPExpertParallel at 9810191^), a copy per GPU and per remote node as flex, expert_parallel > 1 and "
        "whole experts only, tensor_parallel 1 as priced; einsum: "
        "DeepSpeed's MOELayer (deepspeed/moe/sharded_moe.py before v0.19.4, Megatron-DeepSpeed's MoE), GShard's "
        "dense dispatch and combine, two matmuls over a tokens × experts × capacity one-hot tensor, every expert "
        "padded to its capacity (model.moe_capacity_factor with moe_pad_to_capacity; dropless, without a capacity "
        "factor, to the busiest expert's count, all-reduced and read by the host), the whole sequence on every "
        "tensor-parallel rank (no sequence parallelism) (transformer_ops._deepspeed_moe_block); "
        "gather: DeepSpeed's MOELayer from v0.19.4 (pull request 8195), the same layer with its dispatch an index "
        "gather of the routed rows into the padded capacity and its combine a gather of each token's k rows, "
        "weighted in fp32.",
    )
    moe_flex_backend: Literal["deepep", "hybridep"] = Field(
        "deepep",
        description="moe_token_dispatcher flex: the kernels under Megatron-Core's flex dispatcher "
        "(--moe-flex-dispatcher-backend, transformer_config.py, default deepep): deepep, whose buffers memory "
        "counts (config/deepep_buffer.py; expert_parallel a size DeepEP has kernel configurations for), or hybridep, "
        "whose buffers it does not; their exchanges are priced alike.",
    )
    moe_probs_alltoall: bool = Field(
        True,
        description="Megatron-Core's alltoall dispatcher sends each routed copy's routing probability (fp32) to its "
        "expert in an all-to-all of its own after the tokens' (and, with expert_tensor_parallel > 1, all-gathers "
        "them), the experts' activation weighting by it, and the probabilities' gradients back the same way "
        "(token_dispatcher.py token_dispatch, dispatch_postprocess; since Megatron-Core 0.13, 2659630721 'Memory "
        "efficient token permutation'). False: Megatron-Core before 0.13, whose combine weighted the copies on "
        "the sending rank and sent no probabilities. Priced with moe_token_dispatcher alltoall and "
        "expert_parallel > 1 only.",
    )
    p2p_scatter_gather: bool = Field(
        False,
        description="Megatron-LM's scatter-gather of pipeline sends (p2p_communication.py _communicate, from 27fc4689 "
        "2021-01-20, on by default from 72e4230b 2021-02-16 until the pipeline moved into Megatron-Core, 39b83c79 "
        "2023-01-31): without sequence parallelism each GPU sends 1/tensor_parallel of the stage's output "
        "(mpu.split_tensor_into_1d_equal_chunks) and the receiver, once the exchange is done, all-gathers it over "
        "its tensor-parallel group on the compute stream (mpu.gather_split_1d_tensor). With pipeline_p2p megatron "
        "only; no effect at tensor or pipeline parallel 1 or with sequence parallelism, whose sends are 1/tp "
        "already. Not priced: before 37181ef4 (2022-02-17) that gather was torch.distributed.all_gather into a "
        "list, whose NCCL process group copies each part out of a flat buffer (about twice the stage output's "
        "bytes of memory traffic a gather); from then _all_gather_base, no copies.",
    )
    cuda_launch_blocking: bool = Field(
        False,
        description="CUDA_LAUNCH_BLOCKING=1 in the job's environment (BigScience's BLOOM slurm scripts export it): "
        "every kernel launch returns only once the kernel has ended (CUDA C++ Programming Guide, Asynchronous "
        "Concurrent Execution; PyTorch docs/source/notes/cuda.rst, Asynchronous execution), so each GPU's host, "
        "compute, DP and pipeline work run one at a time in program order, every launch's overhead added "
        "(a segment of n kernels: n·h + its compute), the DP reductions overlapping nothing (workloads/"
        "transformer.py TransformerStepBuilder._task). Graph only: the search's fast path refuses it.",
    )
    pipeline_p2p: Literal["overlapped", "deepspeed", "megatron"] = Field(
        "overlapped",
        description="How pipeline stages exchange activations and their gradients "
        "(workloads/transformer.py p2p_message_bytes, _exchange). overlapped: each send on a stream of its own "
        "beside the next micro-batch's compute, the receiver waiting for it (torchtitan). "
        "megatron: Megatron-Core's schedules as Megatron-LM, NeMo and Megatron-Bridge launch them (NVIDIA/"
        "Megatron-LM d98e8a64, same at core_r0.8.0): under 1f1b (forward_backward_pipelining_without_"
        "interleaving) every exchange blocks the compute stream (p2p_communication.py _communicate: "
        "wait_on_reqs), the host then waits for the whole device (torch.cuda.synchronize under batch_p2p_comm "
        "and batch_p2p_sync, both on under 1F1B: transformer.py _host_sync) and a send is batched with the "
        "receive that follows it from the same neighbour (send_forward_recv_backward, "
        "send_backward_recv_forward: one batch_isend_irecv, both directions at once, as long as the longer "
        "message); warm-up sends and cool-down receives go alone. Interleaved: as overlap_p2p_comm says. "
        "deepspeed: DeepSpeed's PipelineEngine (deepspeed/runtime/pipe at 3401d2516, Feb. 2022): every send and "
        "receive is a blocking dist.send/recv on the compute stream (p2p.py), both sides of each pair meet in "
        "the order of schedule.py TrainSchedule (a stage's output leaves at its next step); with tp > 1 each "
        "GPU sends 1/tp of the stage output plus a partition header, which the receiver all-gathers over the "
        "tensor-parallel group (engine.py is_pipe_partitioned, PartitionedTensor): one all-gather before a "
        "forward, two before a backward (its own output and the gradient). Runs 1f1b with ZeRO 0-1 only.",
    )
    overlap_p2p_comm: bool = Field(
        True,
        description="pipeline_p2p megatron under interleaved-1f1b: true, each exchange beside the next chunk's "
        "compute, waited for only where its input is used (overlap_p2p_comm, which Megatron-LM sets for VP > 1 "
        "since 4eeff55d1f, 2023-10-12, NeMo's MegatronCommOverlapCallback and Megatron-Bridge's CommOverlapConfig "
        "too); false, Megatron-Core's own default and Megatron-LM's before it (from the 2021 interleaved schedule, "
        "schedules.py forward_backward_pipelining_with_interleaving at de7dc40f, to f9283c5a8a's option of "
        "2023-05-31, off by default): each exchange point (before the first forward, after each warm-up "
        "forward, after each steady forward-backward pair, after each cool-down backward) is one "
        "_communicate: the stage's outputs since the last point and its inputs until the next, with both "
        "neighbours, in one batch_isend_irecv that the compute stream waits for whole, then "
        "torch.cuda.synchronize() (workloads/transformer.py _interleaved_exchange). No effect under 1f1b, whose "
        "exchanges always block (Megatron-LM's arguments.py forces it off without interleaving). The search's "
        "fast path prices false in closed form (search/fast_estimate.py _blocking_interleaved).",
    )

    @model_validator(mode="after")
    def _check_zero3_collectives(self) -> PlanConfig:
        if self.zero3_collectives == "per_tensor_list" and (self.zero_stage != 3 or self.zero3_fetch != "deepspeed"):
            raise ValueError(
                "plan.zero3_collectives(per_tensor_list) is DeepSpeed v0.3's ZeRO-3: expected zero_stage 3 and "
                f"zero3_fetch deepspeed; got zero_stage {self.zero_stage}, zero3_fetch {self.zero3_fetch}"
            )
        return self

    @model_validator(mode="after")
    def _check_async_tp_compiled(self) -> PlanConfig:
        if self.tp_comm_overlap and self.eager_pointwise:  # eager pointwise kernels are torchtitan's model code
            raise ValueError(
                "plan.tp_comm_overlap: torchtitan's async tensor parallelism needs torch.compile (parallelize.py: "
                f"'Async TP requires torch.compile'), and plan.pointwise_kernels {self.pointwise_kernels!r} runs "
                "without it; got true"
            )
        return self

    @model_validator(mode="after")
    def _check_megatron_exchange(self) -> PlanConfig:
        if self.p2p_scatter_gather and self.pipeline_p2p != "megatron":
            raise ValueError(
                "plan.p2p_scatter_gather is Megatron-LM's pipeline exchange (p2p_communication.py, 2021-2023) and "
                f"needs pipeline_p2p megatron; got pipeline_p2p {self.pipeline_p2p!r}"
            )
        if not self.overlap_p2p_comm and self.pipeline_p2p != "megatron":
            raise ValueError(
                "plan.overlap_p2p_comm is Megatron's switch for its interleaved schedule's exchanges and needs "
                f"pipeline_p2p megatron; got false with pipeline_p2p {self.pipeline_p2p!r}"
            )
        if not self.overlap_p2p_comm and self.schedule == "interleaved-1f1b" and self.pipeline_parallel < 3:
            # arguments.py at de7dc40f (2021) and d98e8a64 (validate_args: 'to avoid having multiple p2p sends and
            # recvs between same 2 ranks per communication batch')
            raise ValueError(
                "plan.overlap_p2p_comm false under interleaved-1f1b: Megatron-LM runs it on more than 2 pipeline "
                f"stages only (a point's batch would exchange twice with the same rank); got pipeline_parallel "
                f"{self.pipeline_parallel}"
            )
        return self

    @model_validator(mode="after")
    def _check_flex_backend(self) -> PlanConfig:
        if self.moe_flex_backend != "deepep" and self.moe_token_dispatcher != "flex":
            raise ValueError(
                f"plan.moe_flex_backend({self.moe_flex_backend}) chooses the kernels under moe_token_dispatcher flex; "
                f"got moe_token_dispatcher {self.moe_token_dispatcher}"
            )
        return self

    @property
    def deepep_buffers(self) -> bool:
        """Whether each MoE GPU holds DeepEP's buffers: torchtitan's DeepEP backend, or Megatron-Core's flex
        dispatcher over DeepEP (its fused_a2a.get_buffer sizes them as torchtitan's deepep.py does)."""
        deepep_flex = self.moe_token_dispatcher == "flex" and self.moe_flex_backend == "deepep"
        return self.moe_token_dispatcher == "torchtitan_deepep" or deepep_flex

    @model_validator(mode="after")
    def _check_shared_expert_overlap(self) -> PlanConfig:
        own_order = self.torchtitan_moe or self.deepspeed_moe
        if self.moe_shared_expert_overlap and (self.moe_a2a_overlap or own_order):
            dispatcher = f"moe_token_dispatcher {self.moe_token_dispatcher}"
            got = "moe_a2a_overlap true" if self.moe_a2a_overlap else dispatcher
            raise ValueError(
                "plan.moe_shared_expert_overlap is Megatron-Core's, which refuses it beside its expert all-to-all "
                "overlap (transformer_config.py): expected moe_a2a_overlap false and the alltoall or flex "
                f"dispatcher; got {got}"
            )
        return self

    @model_validator(mode="after")
    def _check_pipeline_p2p(self) -> PlanConfig:
        ds_pipeline = self.pipeline_p2p == "deepspeed" and self.pipeline_parallel > 1
        if ds_pipeline and (self.schedule != "1f1b" or self.virtual_pipeline > 1 or self.zero_stage > 1):
            raise ValueError(
                "plan.pipeline_p2p(deepspeed) runs DeepSpeed's TrainSchedule, without ZeRO-2/3 (pipe/engine.py: "
                "'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'): expected schedule 1f1b, "
                f"virtual_pipeline 1, zero_stage 0-1; got {self.schedule}, {self.virtual_pipeline}, {self.zero_stage}"
            )
        if ds_pipeline and self.overlap_grad_reduce:
            raise ValueError(
                "plan.pipeline_p2p(deepspeed): DeepSpeed's pipeline engine reduces the gradients after the last "
                "micro-batch's backward, in TrainSchedule's last step (pipe/schedule.py ReduceGrads, pipe/engine.py "
                "_exec_reduce_grads), not during it: expected overlap_grad_reduce false; got true"
            )
        if self.pipeline_p2p == "megatron" and self.pipeline_parallel > 1 and self.schedule == "gpipe":
            raise ValueError(
                "plan.pipeline_p2p(megatron) runs Megatron-Core's schedules (pipeline_parallel/schedules.py "
                "get_forward_backward_func): expected schedule 1f1b or interleaved-1f1b; got gpipe"
            )
        return self

    @property
    def blocking_p2p(self) -> bool:
        """The pipeline exchanges block both stages' compute streams (pipeline_p2p deepspeed; megatron
        under 1f1b, or interleaved without overlap_p2p_comm); else each send runs beside the compute
        (transformer.py _send, _exchange)."""
        megatron_blocks = self.schedule == "1f1b" or not self.overlap_p2p_comm
        return self.pipeline_p2p == "deepspeed" or (self.pipeline_p2p == "megatron" and megatron_blocks)

    @model_validator(mode="before")
    @classmethod
    def _default_deepspeed_grad_overlap(cls, data: Any) -> Any:
        """overlap_grad_reduce left out under DeepSpeed's pipeline engine: False, what it runs (below)."""
        if isinstance(data, dict) and data.get("pipeline_p2p") == "deepspeed" and "overlap_grad_reduce" not in data:
            return {**data, "overlap_grad_reduce": False}
        return data

    @model_validator(mode="before")
    @classmethod
    def _default_weight_cast(cls, data: Any) -> Any:
        """fp8_weight_cast left out: per_microbatch under rowwise (torchao's recipe), else per_step."""
        if isinstance(data, dict) and "fp8_weight_cast" not in data and data.get("fp8_recipe") == "rowwise":
            return {**data, "fp8_weight_cast": "per_microbatch"}
        return data

    @model_validator(mode="after")
    def _check_weight_cast(self) -> PlanConfig:
        runs = {"delayed": "per_step", "rowwise": "per_microbatch"}.get(self.fp8_recipe, self.fp8_weight_cast)
        if self.fp8_weight_cast != runs:
            raise ValueError(
                f"plan.fp8_weight_cast: fp8_recipe {self.fp8_recipe} casts weights {runs} (delayed: Transformer "
                f"Engine's per-step cache; rowwise: torchao's, every micro-batch); got {self.fp8_weight_cast}"
            )
        return self

    @model_validator(mode="after")
    def _check_optimizer_state(self) -> PlanConfig:
        if self.dtype == "fp32" and self.main_params not in ("fp32", "fp32_weights"):
            raise ValueError(
                "plan.main_params: fp32 training updates its fp32 weights, with no copy beside them (expected fp32 "
                f"or fp32_weights); got {self.main_params}"
            )
        if self.grad_accumulation in (*BF16_OPTIMIZER_ACCUMULATIONS, "fp32_add") and self.dtype == "fp32":
            raise ValueError(
                f"plan.grad_accumulation: {self.grad_accumulation} adds 16-bit gradients into an fp32 buffer, so it "
                "needs 16-bit training (dtype bf16, fp16 or fp8); got dtype fp32 (its gradients are fp32: autograd "
                "or fused)"
            )
        if self.main_params == "fp32_remainders" and self.dtype == "fp16":
            raise ValueError(
                "plan.main_params: fp32_remainders rebuilds fp32 from bf16 weights (their 16 high-order bits), "
                "so it needs dtype bf16 or fp8 (bf16 weights); got dtype fp16"
            )
        return self

    @model_validator(mode="after")
    def _check_attention_unpad(self) -> PlanConfig:
        if self.attention_unpad and (not self.flash_attention or self.context_parallel > 1):
            raise ValueError(  # transformer_ops._unpadded wraps the one fused kernel of a context-parallel-free layer
                "plan.attention_unpad is llm-foundry's flash path (fused attention, no context parallelism); got "
                f"flash_attention={self.flash_attention}, context_parallel={self.context_parallel}"
            )
        return self

    @model_validator(mode="after")
    def _check_recompute(self) -> PlanConfig:
        grouped = self.recompute_method != "uniform" or self.recompute_num_layers != 1 or self.recompute_every != 1
        if grouped and self.recompute != "full":
            raise ValueError(
                f"plan.recompute_method({self.recompute_method}), recompute_num_layers({self.recompute_num_layers}) "
                f"and recompute_every({self.recompute_every}) choose the layers of full recompute: they need "
                f"recompute=full; got recompute={self.recompute} (Megatron-LM arguments.py: 'recompute method is not "
                "yet supported for selective recomputing granularity'; without recompute they do nothing)"
            )
        if self.recompute_every > 1 and (self.recompute_method != "uniform" or self.recompute_num_layers > 1):
            raise ValueError(
                f"plan.recompute_every({self.recompute_every}) is torchtitan's per-layer checkpointing: it needs "
                f"recompute_method=uniform and recompute_num_layers=1; got {self.recompute_method}, "
                f"{self.recompute_num_layers}"
            )
        if self.recompute_modules != ["core_attn"] and not (
            self.recompute == "selective" and self.selective_recompute == "modules"
        ):
            raise ValueError(
                f"plan.recompute_modules{list(self.recompute_modules)} is Megatron-Core's selective recompute: it "
                f"needs recompute=selective and selective_recompute=modules; got recompute={self.recompute}, "
                f"selective_recompute={self.selective_recompute}"
            )
        if not self.recompute_modules or len(set(self.recompute_modules)) < len(self.recompute_modules):
            raise ValueError(
                f"plan.recompute_modules: expected one or more distinct modules; got {list(self.recompute_modules)}"
            )
        if "moe_act" in self.recompute_modules and not self.moe_grouped_gemm:
            raise ValueError(  # transformer_config.py __post_init__
                "plan.recompute_modules: moe_act needs moe_grouped_gemm=true ('moe_act in recompute_modules is only "
                "supported with moe_grouped_gemm', Megatron-Core); got moe_grouped_gemm=false"
            )
        if "shared_experts" in self.recompute_modules and self.moe_shared_expert_overlap:
            raise ValueError(  # transformer_config.py __post_init__
                "plan.recompute_modules: shared_experts does not run with moe_shared_expert_overlap ('shared_experts "
                "recompute cannot work with --moe-shared-expert-overlap', Megatron-Core)"
            )
        if "moe" in self.recompute_modules and self.moe_a2a_overlap:
            raise ValueError(  # transformer_config.py __post_init__
                "plan.recompute_modules: moe does not run with moe_a2a_overlap ('disable moe in recompute_modules "
                "when enabling overlap_moe_expert_parallel_comm', Megatron-Core)"
            )
        nested = {"moe_act", "shared_experts"} & set(self.recompute_modules)
        if "moe" in self.recompute_modules and nested:
            raise ValueError(
                f"plan.recompute_modules: moe with {', '.join(sorted(nested))} is not priced (a checkpoint inside the "
                "checkpointed MoE layer runs again, and discards again, within its recomputation): expected moe "
                "without moe_act and shared_experts"
            )
        drops_output = {"moe_act", "layernorm"} & set(self.recompute_modules)
        if drops_output and self.dtype == "fp8" and self.fp8_recipe == "delayed":
            raise ValueError(  # transformer_config.py __post_init__
                f"plan.recompute_modules: {', '.join(sorted(drops_output))} under fp8 needs a current-scaling "
                "fp8_recipe ('Delayed scaling does not support moe_act and layernorm recompute for fp8', "
                "Megatron-Core); got fp8_recipe=delayed"
            )
        return self

    @property
    def torchtitan_moe(self) -> bool:
        """MoE layers of torchtitan's MoE module, over either of its expert-parallel backends (moe_token_dispatcher
        torchtitan or torchtitan_deepep: transformer_ops._moe_block; job.py _torchtitan_expert_problems)."""
        return self.moe_token_dispatcher in TORCHTITAN_DISPATCHERS

    @property
    def dedup_dispatch(self) -> bool:
        """Whether the token dispatch sends a token once to each GPU holding one of its experts (DEDUP_DISPATCHERS:
        DeepEP's kernels) rather than a copy per selected expert."""
        return self.moe_token_dispatcher in DEDUP_DISPATCHERS

    @property
    def deepspeed_moe(self) -> bool:
        """MoE layers of DeepSpeed's MOELayer (moe_token_dispatcher einsum or gather: transformer_ops
        _deepspeed_moe_block; job.py _deepspeed_moe_problems)."""
        return self.moe_token_dispatcher in DEEPSPEED_MOE_DISPATCHERS

    @property
    def whole_residual_mlp(self) -> bool:
        """DeepSpeed's PR-MoE residual MLP whole on every tensor-parallel rank: the expert module itself
        (deepspeed/moe/layer.py `self.mlp = expert`), sliced only with --enable-expert-tensor-parallelism
        (Megatron-DeepSpeed megatron/core/tensor_parallel/layers.py is_expert_without_slicing): expert tensor
        parallel 1 under DeepSpeed's MoE layer."""
        return self.deepspeed_moe and self.etp == 1

    @property
    def accumulates_in_gemm(self) -> bool:
        """The weight-gradient GEMMs add into Megatron's gradient buffer (gradient_accumulation_fusion):
        grad_accumulation fused, or megatron_fsdp without Megatron-FSDP (zero_stage 0-1)."""
        return self.grad_accumulation == "fused" or (self.grad_accumulation == "megatron_fsdp" and self.zero_stage <= 1)

    @property
    def fsdp2_accumulates(self) -> bool:
        """FSDP2 sums the micro-batches' gradients in whole fp32 tensors before one reduce-scatter
        (whole_fp32_sums of this plan)."""
        return bool(whole_fp32_sums(self.grad_accumulation, self.pipeline_parallel, self.zero_stage))

    @property
    def dp(self) -> int:
        """data_parallel, resolved: a plan inside a Job always has it (the GPU count sets the default)."""
        if self.data_parallel is None:
            raise ValueError("plan.data_parallel is resolved when the plan joins a Job (Job.from_dicts)")
        return self.data_parallel

    @property
    def stage_ranks(self) -> int:
        """A pipeline stage's GPUs, tensor × context × data parallel: in Megatron's rank order (tensor, context,
        data, pipeline) a stage's rank and its next stage's lie this many ranks apart."""
        return self.tensor_parallel * self.context_parallel * self.dp

    @property
    def bucket_params(self) -> int:
        """Parameters per gradient bucket: grad_bucket_size_params, else Megatron-Core's default
        max(40,000,000, 1,000,000 × data_parallel): megatron/core/distributed/distributed_data_parallel.py with
        bucket_size None sizes it on dp_group, the data-parallel group without context parallelism
        (process_groups_config.py setup_process_groups_for_ddp: get_data_parallel_group(with_context_parallel=False);
        core_r0.8.0: get_data_parallel_world_size(), the same)."""
        if self.grad_bucket_size_params is not None:
            return self.grad_bucket_size_params
        return max(40_000_000, 1_000_000 * self.dp)

    def default_etp(self, moe: bool, tensor_parallel: int, expert_parallel: int) -> int:
        """expert_tensor_parallel when unset, with `tensor_parallel` and `expert_parallel` ranks: 1 for a dense
        model; under DeepSpeed's MoE layer 1, whole experts (Megatron-DeepSpeed's default:
        --enable-expert-tensor-parallelism off, megatron/core/tensor_parallel/layers.py `if moe and (not
        enable_expert_tensor_parallelism): world_size = 1`); under torchtitan's dispatcher 1 with expert parallelism
        (job_config.py expert_tensor_parallel_degree = 1), else tensor_parallel (its experts then TensorParallel:
        apply_moe_ep_tp); else tensor_parallel (Megatron-LM megatron/training/arguments.py:
        `args.expert_tensor_parallel_size = args.tensor_model_parallel_size` when unset)."""
        if not moe or self.deepspeed_moe:
            return 1
        if self.torchtitan_moe and expert_parallel > 1:
            return 1
        return tensor_parallel

    @property
    def etp(self) -> int:
        """expert_tensor_parallel, resolved like `dp`."""
        if self.expert_tensor_parallel is None:
            raise ValueError("plan.expert_tensor_parallel is resolved when the plan joins a Job (Job.from_dicts)")
        return self.expert_tensor_parallel

    @property
    def gbs(self) -> int:
        """global_batch_size, resolved like `dp`."""
        if self.global_batch_size is None:
            raise ValueError("plan.global_batch_size is resolved when the plan joins a Job (Job.from_dicts)")
        return self.global_batch_size

    def virtual_stage_layers(self, num_layers: int) -> tuple[int, ...]:
        """Transformer layers of each virtual stage (chunk c of stage s is virtual stage c·pp + s)."""
        if self.stage_layers is not None:
            return self.stage_layers
        stages = self.pipeline_parallel * self.virtual_pipeline
        return (num_layers // stages,) * stages

    def stage_layer_counts(self, num_layers: int) -> tuple[int, ...]:
        """Transformer layers held by each pipeline stage (its chunks together)."""
        per_virtual, pp = self.virtual_stage_layers(num_layers), self.pipeline_parallel
        return tuple(sum(per_virtual[c * pp + s] for c in range(self.virtual_pipeline)) for s in range(pp))

    @property
    def eager_pointwise(self) -> bool:
        """torchtitan's model code run op by op, without torch.compile (pointwise_kernels eager or
        eager_fused_norm): every elementwise op a kernel of its own, autograd's backward op by op."""
        return self.pointwise_kernels in EAGER_POINTWISE

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def local_vocab(self, vocab_size: int) -> int:
        """Vocabulary rows one tensor-parallel rank holds (make_vocab_size_divisible_by's padding)."""
        return int(local_vocab_rows(vocab_size, self.tensor_parallel, self.make_vocab_size_divisible_by))

    def overlap_sms(self, layer: str) -> int:
        """SMs the userbuffers overlap of TE layer `layer` takes from its GEMM (tp_comm_overlap_sms, TE's
        default where left out); 0 without tp_comm_overlap."""
        if not self.tp_comm_overlap:
            return 0
        return self.tp_comm_overlap_sms.get(layer, TE_OVERLAP_DEFAULT_SMS)  # type: ignore[call-overload]

    @property
    def master_param_bytes(self) -> int:
        """Bytes per parameter of the optimizer's copy of the weights (main_params); 0 in fp32 training,
        whose weights are the copy."""
        if self.dtype == "fp32":
            return 0
        return {"fp32": 4, "fp32_remainders": 2, "bf16": 2, "none": 0, "fp32_weights": 0}[self.main_params]

    @property
    def stored_weight_bytes(self) -> int:
        """Bytes per parameter of a weight as kept between steps: 4 in fp32 training or under
        main_params fp32_weights, else 2 (16-bit weights, fp8 training's included)."""
        return 4 if self.dtype == "fp32" or self.main_params == "fp32_weights" else 2

    @property
    def optimizer_state_bytes(self) -> int:
        """Bytes per parameter of optimizer state: the copy of the weights and Adam's two moments."""
        return self.master_param_bytes + 2 * DTYPE_BYTES[self.adam_state_dtype]

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element in buffers and collectives (fp32 training: always 4)."""
        return 4 if self.dtype == "fp32" or self.grad_reduce_dtype == "fp32" else 2
