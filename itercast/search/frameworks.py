"""The plan space each training framework really runs, as data and vectorised rules over plan columns.

Each rule is cited to the framework's source (read at the commits named below). The search applies a
framework's rules on top of Job validation's (plan_space.py), so it proposes only plans that framework
accepts. Fields that do not act on a plan (an overlap switch without data parallelism, say) are folded by
plan_space.py; `runnable_plan` then writes them as the framework would run them, before they are shown.

Sources (the files the rules cite):
- Megatron-LM d98e8a6: megatron/training/arguments.py (validate_args), megatron/core/pipeline_parallel/
  schedules.py, megatron/core/distributed/fsdp/mcore_fsdp_adapter.py; its pipeline exchanges (PlanConfig.pipeline_p2p
  megatron) also p2p_communication.py and model_parallel_config.py, the same at core_r0.8.0.
- NeMo 8cfedd7: nemo/collections/llm/recipes/gpt3_175b.py (MegatronStrategy on Megatron-Core, DDP config with
  both overlaps on); NeMo-Framework-Launcher conf/training/gpt3/175b.yaml runs VP 12 (pp 8 × vp 12 = 96 layers).
- torchtitan 9810191^: torchtitan/config/job_config.py, torchtitan/models/llama3/infra/parallelize.py.
- DeepSpeed 38327e0: deepspeed/runtime/pipe/engine.py, deepspeed/runtime/pipe/schedule.py,
  deepspeed/runtime/zero/config.py, deepspeed/runtime/zero/stage_1_and_2.py; its pipeline transfers
  (PlanConfig.pipeline_p2p) also at 3401d2516 (Feb. 2022, BLOOM's): the same blocking sends and partitioning, the
  two transfers of a step issued in the other order until b528f50e3 (2023): the graph's step times of uniform
  stages are the same either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from itercast.config.model import ModelConfig
from itercast.config.plan import (
    DEEPSPEED_MOE_DISPATCHERS,
    TE_OVERLAP_LAYERS,
    TORCH_DDP_BUCKET_BYTES,
    TORCHTITAN_DISPATCHERS,
)
from itercast.errors import ConfigError
from itercast.parallel.plan_table import RECOMPUTE
from itercast.parallel.schedules import SCHEDULES

Columns = dict[str, np.ndarray]
Rule = tuple[str, Callable[[Columns], np.ndarray]]


def no_data_parallel(c: Columns, moe: bool) -> np.ndarray:
    """Rows with nothing to reduce or shard: one data-parallel replica (dp × cp = 1) and, for an MoE
    model, no expert data parallelism (ep × etp covers tp × cp × dp)."""
    return (c["dp"] * c["cp"] == 1) & (~np.bool_(moe) | (c["tp"] * c["cp"] * c["dp"] == c["ep"] * c["etp"]))


@dataclass(frozen=True)
class Framework:
    """What one framework runs. `zero_stages`: itercast zero_stage values it offers (its names in
    `zero_names`); `zero_stages_with_pp`: those it combines with pipelining (why: `zero_with_pp_source`);
    `schedules`: pipeline schedules (SCHEDULES names); `context_parallel`: ring/all-gather context
    parallelism; `plan_fields`: plan fields its launches run that the search prices unless the job sets them (its
    fused attention kernel, gradient bucket, kind of selective checkpointing); `cross_entropies`: the
    PlanConfig.cross_entropy implementations its models can run; `fp8_recipes`: the
    PlanConfig.fp8_recipe scalings its FP8 training runs; `fp8_weight_casts`: when it casts the weights
    to FP8 (PlanConfig.fp8_weight_cast); `cp_comms`: its context parallelism's exchanges
    (PlanConfig.cp_comm). Routed experts: Megatron-Core runs SequentialMLP unless told
    (transformer_config.py moe_grouped_gemm False; arguments.py --moe-grouped-gemm store_true), the
    PlanConfig.moe_grouped_gemm default."""

    name: str
    zero_stages: tuple[int, ...]
    zero_stages_with_pp: tuple[int, ...]
    zero_names: dict[int, str]
    schedules: tuple[str, ...]
    zero_with_pp_source: str
    context_parallel: bool
    tp_comm_overlap: bool
    plan_fields: dict[str, Any]  # plan fields a launch of it runs unless the job sets them
    rules: tuple[tuple[str, Callable[[Columns, bool], np.ndarray]], ...] = field(default=())
    cross_entropies: tuple[str, ...] = ("megatron", "megatron_fused", "te")
    # PlanConfig.zero_shard_ranks: the ZeRO stages it shards within groups of data-parallel ranks, one copy a group.
    # Megatron-Core: --num-distributed-optimizer-instances, the distributed optimizer's partial sharding
    # (param_and_grad_buffer.py) and Megatron-FSDP's hybrid sharding (mcore_fsdp_adapter.py enable_hsdp)
    zero_shard_stages: tuple[int, ...] = (1, 2, 3)
    # where bf16 at zero_stage 0 under pipelining runs a sharded optimizer the search does not price as ZeRO-0: why,
    # and what to give instead ("": it runs as priced)
    bf16_zero0_with_pp: str = ""
    # and for MoE models: Megatron-Core splits the expert data parallel group by the same instances
    # (parallel_state.py intra/inter-partial expert data parallel groups)
    zero_shard_moe: bool = True
    # Megatron-Core arguments.py --fp8-recipe: delayed (default) and tensorwise (TE Float8CurrentScaling);
    # its mxfp8 and blockwise need Blackwell or are not priced here
    fp8_recipes: tuple[str, ...] = ("delayed", "tensorwise")
    # FP8 only in Transformer Engine's own TransformerLayer (its LayerNorm, GeLU MLP, as many key-value heads as
    # query heads, no experts) and not under pipelining: Megatron-DeepSpeed builds that layer for
    # --transformer-impl transformer_engine (model/transformer.py ParallelTransformer build_layer: 'Transformer_engine
    # does not support GQA'), and its pipelined GPTModelPipe stacks the local ParallelTransformerLayerPipe, whose
    # layers run no FP8 autocast
    fp8_te_layer_only: bool = False
    # multi-latent attention (DeepSeek-V2/V3's kv_lora_rank): Megatron-Core's MLASelfAttention, torchtitan's
    # deepseek_v3 model; Megatron-DeepSpeed's model/transformer.py has none (no kv_lora_rank anywhere in it)
    multi_latent_attention: bool = True
    # Transformer Engine's weight cache: each weight cast on the step's first micro-batch (is_first_microbatch)
    fp8_weight_casts: tuple[str, ...] = ("per_step",)
    # Transformer Engine's context parallelism (Megatron-Core --cp-comm-type; a2a and a2a+p2p not priced)
    cp_comms: tuple[str, ...] = ("p2p", "all_gather")
    # (PlanConfig.main_params, adam_state_dtype) its optimizers keep in 16-bit training; Megatron-Core
    # (optimizer_config.py, arguments.py): fp32 main params and moments, or --use-precision-aware-optimizer,
    # whose Transformer Engine FusedAdam keeps 16-bit remainders of the fp32 main params
    # (OptimizerConfig.store_param_remainders, True, no flag) with --exp-avg-dtype/--exp-avg-sq-dtype fp32 or bf16
    # PlanConfig.tp_comm_overlap_rs: Transformer Engine's userbuffers run either (initialize_ub method)
    tp_comm_overlap_rs: tuple[str, ...] = ("pipeline", "ring_exchange")
    optimizer_states: tuple[tuple[str, str], ...] = (
        ("fp32", "fp32"),
        ("fp32_remainders", "fp32"),
        ("fp32_remainders", "bf16"),
    )
    # PlanConfig.selective_recompute: what its selective recompute runs again (Megatron-Core --recompute-granularity
    # selective: recompute_modules default ["core_attn"], transformer_config.py)
    selective_recomputes: tuple[str, ...] = ("modules",)
    # full recompute in groups (PlanConfig.recompute_method, recompute_num_layers: --recompute-method uniform|block,
    # --recompute-num-layers); every n-th layer only (PlanConfig.recompute_every > 1)
    recompute_groups: bool = True
    recompute_every: bool = False
    # PlanConfig.recompute_modules beyond core attention (Megatron-Core --recompute-modules)
    recompute_modules: bool = True
    # PlanConfig.moe_token_dispatcher: whose dispatcher its MoE layers run (--moe-token-dispatcher-type alltoall, or
    # flex over DeepEP/HybridEP: transformer_config.py moe_flex_dispatcher_backend); the first is the search's
    moe_token_dispatchers: tuple[str, ...] = ("alltoall", "flex")
    # PlanConfig.moe_a2a_overlap: Megatron-Core's overlap_moe_expert_parallel_comm (model_parallel_config.py)
    moe_a2a_overlap: bool = True
    # PlanConfig.moe_shared_expert_overlap: Megatron-Core's --moe-shared-expert-overlap, which the search launches
    # and prices for a model with shared experts under the alltoall dispatcher without moe_a2a_overlap
    # (`framework_fields`; Megatron-Bridge's apply_flex_dispatcher_backend turns it off under flex)
    moe_shared_expert_overlap: bool = True
    # a shared expert only as DeepSpeed's residual MoE (PR-MoE; deepspeed/moe/layer.py MoE use_residual: the shared
    # MLP is the expert module itself, `self.mlp = expert`, so a routed expert's width, sliced over the
    # tensor-parallel ranks only with expert tensor parallelism: Megatron-DeepSpeed's ParallelMLP(moe=True)
    # slices nothing without --enable-expert-tensor-parallelism)
    residual_moe: bool = False
    # PlanConfig.dtype values its launches train in (Megatron-Core --bf16 / --fp16 / fp32 / --fp8-format)
    dtypes: tuple[str, ...] = ("bf16", "fp16", "fp32", "fp8")


#: DeepSpeed's reduce_bucket_size and allreduce_bucket_size default, in elements (zero/config.py,
#: runtime/constants.py: 500,000,000)
DEEPSPEED_BUCKET_PARAMS = 500_000_000
#: torch DDP's bucket in fp32 gradients, what torchtitan's 1-D data parallelism (replicate) runs
TORCH_DDP_BUCKET_PARAMS = TORCH_DDP_BUCKET_BYTES // 4


_MEGATRON_FSDP_WITHOUT_PP = (
    "Megatron-FSDP runs only without pipelining: schedules.py drives use_megatron_fsdp in "
    "forward_backward_no_pipelining only; arguments.py: '--use-torch-fsdp2 is not supported with pipeline "
    "parallelism'; mcore_fsdp_adapter.py: MFSDP v2 refuses pp > 1"
)


def _megatron_rules(prefix: str) -> tuple[tuple[str, Callable[[Columns, bool], np.ndarray]], ...]:
    return (
        (
            f"{prefix}: --overlap-param-gather needs the distributed optimizer and --overlap-grad-reduce "
            "(arguments.py validate_args)",
            lambda c, moe: ~np.isin(c["zero"], (1, 2)) | (c["overlap_param"] == 0) | (c["overlap_grad"] == 1),
        ),
    )


def _torchtitan_zero(c: Columns, moe: bool) -> np.ndarray:
    """FSDP2 (2: reshard_after_forward never, 3: always) wherever there is data parallelism; DDP (0)
    only as 1-D parallelism (parallelize.py: 'DDP has not supported > 1D parallelism'); no ZeRO-1."""
    one_d = (c["tp"] == 1) & (c["pp"] == 1) & (c["cp"] == 1) & (c["ep"] == 1)
    return np.where(c["zero"] == 0, one_d | no_data_parallel(c, moe), c["zero"] >= 2)


def _deepspeed_overlap(c: Columns, moe: bool) -> np.ndarray:
    """Gradient reduction overlaps backward only through ZeRO's overlap_comm hooks without pipelining:
    the pipe engine reduces after the whole schedule (schedule.py TrainSchedule: ReduceGrads last), and
    ZeRO-0 all-reduces after backward; ZeRO-1/2 gather parameters inside the optimizer step."""
    grad_ok = (c["overlap_grad"] == 0) | ((c["pp"] == 1) & (c["zero"] >= 1)) | no_data_parallel(c, moe)
    return grad_ok & (~np.isin(c["zero"], (1, 2)) | (c["overlap_param"] == 0))


MEGATRON_CORE = Framework(
    name="megatron-core",
    zero_stages=(0, 1, 2, 3),
    zero_stages_with_pp=(0, 1),
    zero_names={0: "DDP", 1: "distributed optimizer", 2: "Megatron-FSDP optim_grads", 3: "Megatron-FSDP"},
    schedules=("1f1b", "interleaved-1f1b"),  # schedules.py: no GPipe
    zero_with_pp_source=_MEGATRON_FSDP_WITHOUT_PP,
    context_parallel=True,
    tp_comm_overlap=True,
    # Transformer Engine's DotProductAttention prefers FusedAttention (cuDNN) on compute capability >= 9.0;
    # gradient buckets: Megatron-Core's DP-scaled default (PlanConfig.bucket_params); pipeline exchanges:
    # arguments.py forces overlap_p2p_comm off without interleaving (batch_p2p_comm = not overlap_p2p_comm,
    # blocking) and leaves it on with (--no-overlap-p2p-communication is store_false)
    # arguments.py --cp-comm-type default ["p2p"]; extensions/transformer_engine.py TEDotProductAttention
    # passes "p2p" when the config's cp_comm_type is None (Megatron-Bridge's Llama providers leave it so)
    plan_fields={"attention_kernel": "cudnn", "pipeline_p2p": "megatron", "cp_comm": "p2p"},
    rules=_megatron_rules("megatron-core"),
    # arguments.py (d98e8a64) refuses --cross-entropy-fusion-impl te: "disabled due to stability issues"
    cross_entropies=("megatron", "megatron_fused"),
)

FRAMEWORKS: dict[str, Framework] = {
    "megatron-core": MEGATRON_CORE,
    # NeMo trains on Megatron-Core (MegatronStrategy): the same plan space, its recipes' defaults
    "nemo": replace(
        MEGATRON_CORE,
        name="nemo",
        # NeMo 2's MoE configs set moe_grouped_gemm = True: gpt/model/deepseek.py, gpt_oss.py, qwen3.py, llama.py
        # (Llama 4); mixtral.py leaves Megatron-Core's False.
        # nemo/collections/llm/gpt/model/base.py GPTConfig: cross_entropy_loss_fusion = True (native impl);
        # MegatronCommOverlapCallback: overlap_p2p_comm with VP > 1, else batch_p2p_comm (blocking)
        plan_fields={
            "attention_kernel": "cudnn",
            "cross_entropy": "megatron_fused",
            "moe_grouped_gemm": True,
            "pipeline_p2p": "megatron",
            "cp_comm": "p2p",
            # its recipes' DistributedDataParallelConfig(check_for_nan_in_grad=True, ..., average_in_collective=True)
            # (gpt3_175b.py): no 1/dp scaling pass over the gradient buffer (workloads/transformer.py)
            "grad_average_in_collective": True,
            # fused, but off under Megatron-FSDP (megatron_parallel.py): each gradient copied into its bucket
            "grad_accumulation": "megatron_fsdp",
        },
        rules=_megatron_rules("nemo (MegatronStrategy on Megatron-Core)"),
        # GPTConfig's cross_entropy_fusion_impl reaches Megatron-Core without arguments.py's refusal of te
        cross_entropies=("megatron", "megatron_fused", "te"),
    ),
    "torchtitan": Framework(
        name="torchtitan",
        zero_stages=(0, 2, 3),
        zero_stages_with_pp=(2, 3),
        zero_names={0: "DDP", 2: 'FSDP2 reshard "never"', 3: 'FSDP2 reshard "always"'},
        schedules=("gpipe", "1f1b", "interleaved-1f1b"),  # job_config.py pipeline_parallel_schedule
        zero_with_pp_source="parallelize.py apply_fsdp shards pipeline stages too; DDP only as 1-D parallelism",
        context_parallel=True,
        tp_comm_overlap=True,  # enable_async_tensor_parallel
        # torch SDPA: FLASH_ATTENTION (FlashAttention-2) first below capability 10.0 (torchtitan#1196); cuDNN
        # attention is opt-in until cuDNN 9.15 (pytorch/pytorch#138522). Its selective checkpointing is per
        # op (activation_checkpoint.selective_ac_option "op"; no per-module mode)
        plan_fields={
            "attention_kernel": "fa2",
            # models/llama3 build nn.Embedding and the output Linear with the tokenizer's vocab_size: no padding
            "make_vocab_size_divisible_by": 1,
            "grad_bucket_size_params": TORCH_DDP_BUCKET_PARAMS,
            "selective_recompute": "op",
            # DTensor tensor parallelism: activations sharded on the sequence, dim 1 (parallelize.py SequenceParallel)
            "tp_layout": "dtensor",
            # models/llama3/model.py: wq, wk, wv and w1, w3 are nn.Linear modules of their own
            "projections": "separate",
            # its model under torch.compile (the [compile] section search writes, launch_settings._titan_compile)
            "pointwise_kernels": "compiled",
            # components/loss.py: F.cross_entropy(pred.flatten(0, 1).float(), ...), compiled with the model by the
            # [compile] section search writes (launch_settings._titan_compile)
            "cross_entropy": "torch_compiled",
            # context_parallel_rotate_method "allgather": its default from config_manager.py at 9dec370a (2024-12)
            # through job_config.py and config/configs.py until 8e555444 removed it (2026-06); utils.py
            # create_context_parallel_ctx calls PyTorch's set_rotate_method with it
            "cp_comm": "torch_allgather",
            # job_config.py Float8.recipe_name None: torchao's Float8LinearConfig() (config.py), tensorwise;
            # torchao's Float8Linear casts the weights again in every forward and backward
            "fp8_recipe": "tensorwise",
            "fp8_weight_cast": "per_microbatch",
            # its float8 converter swaps Linear modules only: routed experts need quantize.grouped_mm.float8
            "fp8_experts": False,
            # models/common/moe.py GroupedExperts: torch._grouped_mm over every local expert
            "moe_grouped_gemm": True,
            # distributed/expert_parallel.py ExpertParallel._token_dispatch: its counts' all-to-all and host wait
            # (parallelism.expert_parallel_comm_backend's default, standard; deepep, torchtitan_deepep, when fixed)
            "moe_token_dispatcher": "torchtitan",
            # its async TP (enable_async_tensor_parallel: PyTorch's symmetric-memory micro-pipelined collectives
            # under torch.compile) sets no SM margin: TE userbuffers' tp_comm_overlap_sms do not apply
            "tp_comm_overlap_sms": dict.fromkeys(TE_OVERLAP_LAYERS, 0),
            # and splits each GEMM before a reduce-scatter in tp chunks, each sent to the rank that sums it
            # (torch/distributed/_symmetric_memory _pipelined_produce_and_all2all, torch 2.13)
            "tp_comm_overlap_rs": "ring_exchange",
            # config/configs.py Training.dtype float32, mixed_precision_param bfloat16: fp32 weights the
            # optimizer updates, bf16 casts for compute (FSDP2 MixedPrecisionPolicy, or autocast under DDP)
            "main_params": "fp32_weights",
            # mixed_precision_reduce float32: under torch.distributed.pipelining FSDP2 sums each micro-batch's
            # bf16 gradients into whole fp32 tensors before one reduce-scatter (pipelining/stage.py
            # set_requires_gradient_sync(False), _fsdp_param.py accumulate_unsharded_grad_if_needed)
            "grad_accumulation": "fsdp2",
        },
        cross_entropies=("torch_compiled", "torch"),
        # HSDP: FSDP2 over data_parallel_shard_degree, replicated over data_parallel_replicate_degree (parallelize.py
        # apply_fsdp on the dp_replicate × dp_shard mesh)
        zero_shard_stages=(2, 3),
        zero_shard_moe=False,  # its experts' FSDP meshes under expert parallelism (dp_shard_in_ep) are not priced
        selective_recomputes=("op",),
        # activation_checkpoint.py: mode "full" checkpoints every block (_apply_full_ac); selective_ac_option an
        # integer n checkpoints every n-th block (_apply_layer_sac)
        recompute_groups=False,
        recompute_every=True,
        recompute_modules=False,
        moe_token_dispatchers=TORCHTITAN_DISPATCHERS,
        moe_a2a_overlap=False,
        # its MoE.forward runs the shared expert beside the combine's all-to-all, forward only (models/moe/moe.py),
        # priced as the torchtitan dispatcher's (transformer_ops._moe_a2a_hides): no switch
        moe_shared_expert_overlap=False,
        # fp32 parameters (training.dtype float32) cast to bf16 by FSDP2 or autocast, torch.optim.AdamW's fp32
        # moments over them (components/optimizer.py)
        optimizer_states=(("fp32_weights", "fp32"),),
        fp8_recipes=("tensorwise", "rowwise"),  # torchao float8 has no delayed scaling
        fp8_weight_casts=("per_microbatch",),
        # job_config.py Training.mixed_precision_param: Literal["bfloat16", "float32"] (no fp16 loss scaling), with
        # torchao's float8 GEMMs over bf16
        dtypes=("bf16", "fp32", "fp8"),
        cp_comms=("torch_allgather", "torch_alltoall"),  # context_parallel_rotate_method
        tp_comm_overlap_rs=("ring_exchange",),
        rules=(
            (
                "torchtitan: FSDP2 (zero 2-3) over dp_shard, DDP (zero 0) only as 1-D parallelism, no ZeRO-1 "
                "(parallelize.py apply_fsdp / 'DDP has not supported > 1D parallelism')",
                _torchtitan_zero,
            ),
            (
                "torchtitan: tensor parallelism always runs sequence parallel (parallelize.py apply_tp)",
                lambda c, moe: (c["sp"] == 1) == (c["tp"] > 1),
            ),
            (
                "torchtitan: communication always overlapped (FSDP2 prefetch, DDP buckets; no switch)",
                lambda c, moe: no_data_parallel(c, moe) | ((c["overlap_grad"] == 1) & (c["overlap_param"] == 1)),
            ),
        ),
    ),
    "deepspeed": Framework(
        name="deepspeed",
        zero_stages=(0, 1, 2, 3),
        zero_stages_with_pp=(0, 1),
        zero_names={0: "ZeRO-0", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"},
        schedules=("1f1b",),  # pipe/schedule.py TrainSchedule (1F1B), no interleaving
        zero_with_pp_source="pipe/engine.py: 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'",
        context_parallel=False,  # DeepSpeed-Ulysses splits heads: not the ring context parallelism priced here
        tp_comm_overlap=False,
        # Megatron-DeepSpeed's --use-flash-attn-v2 (the flash_attn package's FlashAttention-2); its PipelineEngine's
        # blocking, partitioned transfers (runtime/config.py pipeline pipe_partitioned / grad_partitioned: true)
        plan_fields={
            "attention_kernel": "fa2",
            "grad_bucket_size_params": DEEPSPEED_BUCKET_PARAMS,
            # ZeRO-1/2 all-reduce each gradient bucket and keep their slices (zero/stage_1_and_2.py average_tensor ->
            # allreduce_and_scatter, use_multi_rank_bucket_allreduce default true since v0.12.4)
            "zero_grad_reduce": "all_reduce",
            # its engine's communication_data_type, the training's 16-bit dtype unless the config names one
            # (engine.py communication_data_type; BF16_Optimizer's fp32 sums cast to it, allreduce_bucket)
            "grad_reduce_dtype": "bf16",
            "pipeline_p2p": "deepspeed",
            # ZeRO-3's per-submodule fetch (PartitionedParameterCoordinator), its fp16 gradients (d94f89d)
            "zero3_fetch": "deepspeed",
            # data_types.grad_accum_dtype left out is the model's (engine.py get_data_types): the FP16 and ZeRO-0/1
            # optimizers leave param.grad to autograd, which adds each micro-batch's in place (bf16 with ZeRO-0
            # under the pipeline engine runs BF16_Optimizer instead: bf16_zero0_with_pp). Not told apart: ZeRO-2/3
            # copy each micro-batch's gradients into their reduction buckets (priced as this add)
            "grad_accumulation": "autograd",
            # deepspeed.moe's MOELayer weights its experts' outputs by the gates on the sending rank after the
            # combine's all-to-all (moe/sharded_moe.py combine_weights, einsum "sec,ecm->sm"): no probabilities sent
            "moe_probs_alltoall": False,
            # Megatron-DeepSpeed's validate_args: 'if args.deepspeed: args.async_tensor_model_parallel_allreduce =
            # False' (microsoft/Megatron-DeepSpeed f90b8877, at f4157bea): the input gradient's all-reduce after wgrad
            "tp_allreduce_overlap": False,
        },
        cross_entropies=("megatron",),  # Megatron-DeepSpeed's vocab_parallel_cross_entropy, unfused
        zero_shard_stages=(),  # its MiCS and hpZ (ZeRO++) are not priced
        bf16_zero0_with_pp=(
            "runtime/engine.py _do_optimizer_sanity_check: bf16 with ZeRO disabled under the pipeline engine runs "
            "BF16_Optimizer, which partitions the fp32 weights and Adam state over the data-parallel ranks and "
            "accumulates gradients in fp32 (runtime/bf16_optimizer.py), not the unsharded ZeRO-0 the search prices: "
            "give zero_stage 1 (predict prices BF16_Optimizer as zero_stage 1 with plan.grad_accumulation "
            "fp32_copy_add)"
        ),
        moe_a2a_overlap=False,
        # deepspeed/moe/layer.py MoE.forward runs the residual MLP after the experts' layer returns: no overlap
        moe_shared_expert_overlap=False,
        residual_moe=True,
        recompute_modules=False,  # Megatron-DeepSpeed's selective recompute: core attention (--recompute-activations)
        # deepspeed.moe's MOELayer over every expert's padded capacity (sharded_moe.py): GShard's einsum dispatch as
        # at the commit these rules were read at, or the index gathers of v0.19.4 on
        moe_token_dispatchers=DEEPSPEED_MOE_DISPATCHERS,
        # ZeRO's fp32 partitions of the weights and fp32 Adam moments (zero/stage_1_and_2.py, stage3.py)
        optimizer_states=(("fp32", "fp32"),),
        fp8_recipes=("delayed",),  # Megatron-DeepSpeed's --fp8-hybrid: Transformer Engine's DelayedScaling
        fp8_te_layer_only=True,
        multi_latent_attention=False,
        rules=(
            (
                "deepspeed: gradient reduction overlaps backward only with ZeRO overlap_comm and no pipelining; "
                "ZeRO-1/2 gather parameters in the optimizer step (pipe/schedule.py, zero/stage_1_and_2.py)",
                _deepspeed_overlap,
            ),
            (
                "deepspeed: MoE runs with ZeRO 0-2 (runtime/engine.py: 'Native DeepSpeed MoE is not supported with "
                "ZeRO Stage 3'; Megatron-DeepSpeed's MoE is deepspeed.moe.layer.MoE)",
                lambda c, moe: ~np.bool_(moe) | (c["zero"] <= 2),
            ),
        ),
    ),
}


def framework(name: str) -> Framework:
    """The framework called `name`; a one-line error naming the known ones otherwise."""
    found = FRAMEWORKS.get(name)
    if found is None:
        raise ConfigError(f"--framework: expected one of {', '.join(FRAMEWORKS)}; got {name!r}")
    return found


def framework_fields(fw: Framework, model: ModelConfig, plan: dict[str, Any]) -> dict[str, Any]:
    """The plan fields `fw` runs a job of `model` with, where the job's `plan` leaves them out: its plan_fields (a
    sliding-window model's context parallelism over all_gather where the framework's is Transformer Engine's p2p ring,
    which runs no window), an MoE model's token dispatcher (its first moe_token_dispatchers), and Megatron-Core's
    shared-expert overlap
    (PlanConfig.moe_shared_expert_overlap) for a model with shared experts under the alltoall dispatcher without
    moe_a2a_overlap, which its launch settings turn on."""
    fields = dict(fw.plan_fields)
    if model.is_moe:
        fields.setdefault("moe_token_dispatcher", fw.moe_token_dispatchers[0])
    else:  # its recipes' grouped experts: nothing to group in a dense model (transformer_ops.unused_fields_note)
        fields.pop("moe_grouped_gemm", None)
    if model.sliding_window is not None and fields.get("cp_comm") == "p2p" and "all_gather" in fw.cp_comms:
        fields["cp_comm"] = "all_gather"  # Transformer Engine's ring runs no sliding window (config/job.py)
    given = fields | plan
    if (
        fw.moe_shared_expert_overlap
        and model.moe_shared_ffn_hidden_size
        and not given.get("moe_a2a_overlap")
        and given.get("moe_token_dispatcher", "alltoall") == "alltoall"
    ):
        fields["moe_shared_expert_overlap"] = True
    return fields


def framework_rules(
    fw: Framework, moe: bool, a2a_overlap: bool = False, fp8: bool = False, bf16: bool = False
) -> list[Rule]:
    """The framework's rules over plan columns, named by the source they come from; `fp8`: the plans train in
    FP8, which a framework with fp8_te_layer_only runs without pipelining only; `a2a_overlap`: the plans'
    PlanConfig.moe_a2a_overlap, which Megatron-Core's TransformerConfig allows only with expert parallelism,
    interleaving under pipelining and no full recompute (transformer_config.py __post_init__: 'If enabling EP
    A2A overlap, virtual_pipeline_model_parallel_size must be specified when pipeline_model_parallel_size > 1',
    'disable full recomputation when enabling overlap_moe_expert_parallel_comm'). A plan setting
    PlanConfig.zero_shard_ranks (column shard > 0) runs with the framework's zero_shard_stages only. (DeepSpeed's MoE
    layers, the einsum or gather dispatcher, split experts, and a shared expert, PR-MoE's copy of one, over all
    tensor-parallel ranks: plan_space.py's rules, from job.py's.) `bf16`: the plans train in bf16, which a framework
    with bf16_zero0_with_pp does not run at zero_stage 0 under pipelining as priced."""
    allowed_pp = np.asarray(fw.zero_stages_with_pp)
    schedules = np.asarray([SCHEDULES.index(s) for s in fw.schedules])
    rules: list[Rule] = [
        (
            f"{fw.name}: zero_stage one of {list(fw.zero_stages)} ({', '.join(fw.zero_names.values())})",
            lambda c: np.isin(c["zero"], fw.zero_stages),
        ),
        (
            f"{fw.name}: with pipelining zero_stage one of {list(fw.zero_stages_with_pp)} ({fw.zero_with_pp_source})",
            lambda c: (c["pp"] == 1) | np.isin(c["zero"], allowed_pp),
        ),
        (
            f"{fw.name}: pipeline schedule one of {', '.join(fw.schedules)}",
            lambda c: (c["pp"] == 1) | np.isin(c["schedule"], schedules),
        ),
        (f"{fw.name}: no context parallelism", lambda c: np.bool_(fw.context_parallel) | (c["cp"] == 1)),
        (
            f"{fw.name}: plan.zero_shard_ranks with zero_stage one of {list(fw.zero_shard_stages)}",
            lambda c: (c["shard"] == 0) | np.isin(c["zero"], fw.zero_shard_stages),
        ),
        (
            f"{fw.name}: plan.moe_a2a_overlap needs expert_parallel > 1, virtual pipelining with pipelining and no "
            "full recompute (Megatron-Core transformer_config.py overlap_moe_expert_parallel_comm)",
            lambda c: (
                np.bool_(not a2a_overlap)
                | ((c["ep"] > 1) & ((c["pp"] == 1) | (c["vp"] > 1)) & (c["recompute"] != RECOMPUTE.index("full")))
            ),
        ),
    ]
    if bf16 and fw.bf16_zero0_with_pp:
        rules.append((f"{fw.name}: {fw.bf16_zero0_with_pp}", lambda c: (c["pp"] == 1) | (c["zero"] != 0)))
    if fp8 and fw.fp8_te_layer_only:
        rules.append(
            (
                f"{fw.name}: FP8 without pipelining (Megatron-DeepSpeed's GPTModelPipe layers run no FP8 autocast)",
                lambda c: c["pp"] == 1,
            )
        )
    return rules + [(name, lambda c, ok=ok: ok(c, moe)) for name, ok in fw.rules]


def check_fixed(
    fw: Framework,
    fixed: dict[str, Any],
    tp_comm_overlap: bool,
    pointwise_kernels: str = "fused",
    dtype: str | None = None,
) -> None:
    """A field the user fixed (--set plan.X) that the framework never runs as priced: one line naming its rule;
    `dtype` the plans' (None: not known yet).
    Eager and compiled pointwise kernels (PlanConfig.pointwise_kernels) are torchtitan's model code without
    and with torch.compile, so torchtitan's alone (eager beside its async tensor parallelism: PlanConfig refuses
    it, 'Async TP requires torch.compile')."""
    zero = fixed.get("zero_stage")
    if zero is not None and int(zero) not in fw.zero_stages:
        raise ConfigError(
            f"plan.zero_stage: {fw.name} runs zero_stage {list(fw.zero_stages)} "
            f"({', '.join(fw.zero_names.values())}); got {zero}"
        )
    pp = int(fixed.get("pipeline_parallel", 1))
    if zero is not None and pp > 1 and int(zero) not in fw.zero_stages_with_pp:
        raise ConfigError(
            f"plan.zero_stage: {fw.name} runs zero_stage {list(fw.zero_stages_with_pp)} with pipelining "
            f"({fw.zero_with_pp_source}); got {zero} with pipeline_parallel {pp}"
        )
    if zero is not None and int(zero) == 0 and pp > 1 and dtype == "bf16" and fw.bf16_zero0_with_pp:
        raise ConfigError(f"plan.zero_stage: {fw.name}: {fw.bf16_zero0_with_pp}; got 0 with pipeline_parallel {pp}")
    schedule = fixed.get("schedule")
    if schedule is not None and schedule not in fw.schedules and int(fixed.get("pipeline_parallel", 2)) > 1:
        raise ConfigError(f"plan.schedule: {fw.name} runs {', '.join(fw.schedules)}; got {schedule!r}")
    vp = int(fixed.get("virtual_pipeline", 1))
    if vp > 1 and "interleaved-1f1b" not in fw.schedules:
        raise ConfigError(
            f"plan.virtual_pipeline: {fw.name} runs {', '.join(fw.schedules)}, one model chunk a stage (expected 1); "
            f"got {vp}"
        )
    if int(fixed.get("context_parallel", 1)) > 1 and not fw.context_parallel:
        got = fixed["context_parallel"]
        raise ConfigError(f"plan.context_parallel: {fw.name} has no context parallelism (expected 1); got {got}")
    if tp_comm_overlap and not fw.tp_comm_overlap:
        raise ConfigError(f"plan.tp_comm_overlap: {fw.name} has no tensor-parallel communication overlap; got true")
    if pointwise_kernels != "fused" and fw.name != "torchtitan":
        raise ConfigError(
            f"plan.pointwise_kernels: {fw.name} runs fused norms and activations (expected fused; eager and "
            f"compiled are torchtitan's model code without and with torch.compile); got {pointwise_kernels!r}"
        )


#: the plan fields that say which layers a recompute runs again (check_recompute)
RECOMPUTE_FIELDS = (
    "recompute_method",
    "recompute_num_layers",
    "recompute_every",
    "recompute_modules",
    "moe_a2a_overlap",
)


def check_recompute(fw: Framework, plan: dict[str, Any]) -> None:
    """The job's recompute layout and MoE overlap (RECOMPUTE_FIELDS, with PlanConfig's defaults, and a fixed
    plan.recompute) as the framework can run them: one line naming its rule otherwise."""
    grouped = plan["recompute_method"] != "uniform" or int(plan["recompute_num_layers"]) != 1
    if grouped and not fw.recompute_groups:
        raise ConfigError(
            f"plan.recompute_method/recompute_num_layers: {fw.name}'s full recompute checkpoints every layer "
            "(torchtitan activation_checkpoint.py: mode full, _apply_full_ac; every n-th layer: plan.recompute_every);"
            f" the job sets {plan['recompute_method']} of {plan['recompute_num_layers']}"
        )
    if int(plan["recompute_every"]) > 1 and not fw.recompute_every:
        raise ConfigError(
            f"plan.recompute_every: {fw.name} recomputes groups of layers (--recompute-method uniform|block, "
            f"--recompute-num-layers), not every n-th layer (torchtitan's selective_ac_option n); the job sets "
            f"{plan['recompute_every']}"
        )
    if list(plan["recompute_modules"]) != ["core_attn"] and not fw.recompute_modules:
        raise ConfigError(
            f"plan.recompute_modules: {fw.name}'s selective recompute is not Megatron-Core's per module "
            "(--recompute-modules; Megatron-DeepSpeed's --recompute-activations reruns core attention, torchtitan's "
            "selective_ac_option op every op but matmuls and attention); the job sets "
            f"{list(plan['recompute_modules'])}"
        )
    if plan["moe_a2a_overlap"] and not fw.moe_a2a_overlap:
        raise ConfigError(
            f"plan.moe_a2a_overlap: {fw.name} has no expert all-to-all overlap (Megatron-Core's "
            "overlap_moe_expert_parallel_comm); the job sets true"
        )
    if plan["moe_a2a_overlap"] and plan.get("recompute") == "full":
        raise ConfigError(
            f"plan.moe_a2a_overlap: {fw.name} refuses it with full recompute (transformer_config.py: 'disable full "
            "recomputation when enabling overlap_moe_expert_parallel_comm'); the job sets recompute full"
        )


def runnable_plan(fw: Framework, plan: dict[str, Any]) -> dict[str, Any]:
    """The plan's switches as the framework runs them where itercast folded them (they do not act:
    overlap switches without data parallelism or outside ZeRO 1-2, the tensor-parallel overlap without tensor
    parallelism, which Megatron-LM refuses at tensor_parallel 1: arguments.py turns sequence parallelism off
    there and asserts it for --tp-comm-overlap)."""
    out = dict(plan)
    if plan["tensor_parallel"] == 1:
        out["tp_comm_overlap"] = False
    if plan["zero_stage"] not in (1, 2) and fw.name in ("megatron-core", "nemo", "deepspeed"):
        out["overlap_param_gather"] = plan["zero_stage"] == 3 and fw.name != "deepspeed" and plan["overlap_grad_reduce"]
    if fw.name == "deepspeed" and (plan["pipeline_parallel"] > 1 or plan["zero_stage"] == 0):
        out["overlap_grad_reduce"] = False
    if fw.name == "torchtitan":
        out["overlap_grad_reduce"] = out["overlap_param_gather"] = True
    return out
