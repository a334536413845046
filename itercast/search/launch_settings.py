"""A plan written as each framework's own launch settings: what a user pastes to run it.

- megatron-core: pretrain_gpt.py command-line arguments (Megatron-LM megatron/training/arguments.py names).
- nemo: NeMo 2 recipe overrides (nemo/collections/llm/recipes/*.py: trainer.strategy = MegatronStrategy,
  its `ddp` DistributedDataParallelConfig, data.* batch sizes, model.config recompute fields, trainer.plugins
  the MegatronMixedPrecision plugin: dtype, FP8 and the gradients' reduction dtype).
- torchtitan: a TOML fragment (torchtitan/config/job_config.py at 9810191^, the last TOML-configured version:
  sections [parallelism], [training], [activation_checkpoint], [compile], [model]).
- deepspeed: a DeepSpeed JSON config (deepspeed/runtime/zero/config.py, runtime/config.py) and the
  Megatron-DeepSpeed arguments that set tensor and pipeline sizes (DeepSpeed's pipe engine takes its stage
  count from PipelineModule(num_stages), not from the JSON).

Only the plan is written; model shape, data and optimizer arguments stay the user's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from itercast.config.model import ModelConfig
from itercast.config.plan import BF16_OPTIMIZER_ACCUMULATIONS, DEEPSPEED_MOE_DISPATCHERS
from itercast.search.frameworks import DEEPSPEED_BUCKET_PARAMS


def _recompute_megatron(p: dict[str, Any]) -> list[str]:
    """Megatron's recompute arguments: full with the plan's method and layers (uniform, 1: one layer
    input kept per layer, Korthikanti et al. 2022 "full"), or selective (core attention, its default, or the
    plan's recompute_modules)."""
    if p["recompute"] == "full":
        method, layers = p["recompute_method"], p["recompute_num_layers"]
        return ["--recompute-granularity full", f"--recompute-method {method}", f"--recompute-num-layers {layers}"]
    if p["recompute"] != "selective":
        return []
    modules = list(p["recompute_modules"])
    return ["--recompute-granularity selective"] + (
        [] if modules == ["core_attn"] else [f"--recompute-modules {' '.join(modules)}"]
    )


def _ub_fields(p: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per Transformer Engine layer, the userbuffers cfg fields the plan priced that differ from TE's defaults
    (initialize_ub ub_cfgs, module/base.py): num_sm with set_sm_margin, or the margin off for 0
    (plan.tp_comm_overlap_sms), and the ring-exchange reduce-scatter after proj and fc2 (plan.tp_comm_overlap_rs)."""
    fields = {
        k: {"num_sm": n, "set_sm_margin": True} if n else {"set_sm_margin": False}
        for k, n in p["tp_comm_overlap_sms"].items()
    }
    if p["tp_comm_overlap_rs"] == "ring_exchange":
        for layer in ("proj_fprop", "fc2_fprop"):
            fields[layer] = {"method": "ring_exchange", **fields.get(layer, {})}
    return fields


def _ub_cfg(fields: dict[str, dict[str, Any]]) -> list[str]:
    """_ub_fields as the YAML Megatron-LM's --tp-comm-overlap-cfg hands to TE's initialize_ub."""
    out = []
    for layer, values in sorted(fields.items()):
        out += [f"{layer}:", *(f"  {k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items())]
    return out


def megatron_core_args(plan: dict[str, Any], model: ModelConfig) -> str:
    """Megatron-LM pretrain_gpt.py arguments of the plan (flag names from arguments.py)."""
    p = plan
    out = [
        f"--tensor-model-parallel-size {p['tensor_parallel']}",
        f"--pipeline-model-parallel-size {p['pipeline_parallel']}",
        f"--context-parallel-size {p['context_parallel']}",
    ]
    if p["context_parallel"] > 1:
        out.append(f"--cp-comm-type {p['cp_comm']}")  # Transformer Engine's names: p2p, all_gather
    layout = _megatron_layout(p)
    if p["virtual_pipeline"] > 1:
        if not layout:  # --pipeline-model-parallel-layout sets the chunks itself (arguments.py: one of the two)
            per_chunk = model.num_layers // (p["pipeline_parallel"] * p["virtual_pipeline"])
            out.append(f"--num-layers-per-virtual-pipeline-stage {per_chunk}")
        if not p.get("overlap_p2p_comm", True):  # Megatron-LM's default with interleaving is on
            out.append("--no-overlap-p2p-communication")
    if model.is_moe:
        out += [
            f"--expert-model-parallel-size {p['expert_parallel']}",
            f"--expert-tensor-parallel-size {p['expert_tensor_parallel']}",
            # the dispatcher priced (its all-to-all and host wait); TransformerConfig's default is allgather
            # (megatron/core/transformer/transformer_config.py moe_token_dispatcher_type at d98e8a64)
            *_dispatcher_megatron(p, "--moe-token-dispatcher-type {}", "--moe-flex-dispatcher-backend {}"),
        ]
        if p["moe_grouped_gemm"]:
            out.append("--moe-grouped-gemm")
        out += [f"--{name.replace('_', '-')}" for name in _moe_overlaps(p)]
    if p["sequence_parallel"]:
        out.append("--sequence-parallel")
    out += [f"--micro-batch-size {p['micro_batch_size']}", f"--global-batch-size {p['global_batch_size']}"]
    out += _recompute_megatron(p)
    zero = p["zero_stage"]
    if zero == 1:
        out.append("--use-distributed-optimizer")
    elif zero >= 2:
        strategy = "optim_grads" if zero == 2 else "optim_grads_params"
        out += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {strategy}", "--ckpt-format fsdp_dtensor"]
    if p.get("zero_shard_ranks"):  # copies of the sharded state (PlanConfig.zero_shard_ranks)
        out.append(f"--num-distributed-optimizer-instances {_shard_copies(p)}")
    if p["overlap_grad_reduce"]:
        out.append("--overlap-grad-reduce")
    if p["overlap_param_gather"] and zero >= 1:
        out.append("--overlap-param-gather")
    cfg = _ub_cfg(_ub_fields(p)) if p["tp_comm_overlap"] else []
    if p["tp_comm_overlap"]:
        out.append("--tp-comm-overlap")
        if cfg:  # arguments.py --tp-comm-overlap-cfg: a YAML that training.py hands to TE's initialize_ub
            out.append("--tp-comm-overlap-cfg tp_comm_overlap.yaml")
    if p["grad_bucket_size_params"] is not None:  # else Megatron-Core's own default, which the plan priced
        out.append(f"--ddp-bucket-size {p['grad_bucket_size_params']}")
    if p["dtype"] == "fp8":
        out += ["--bf16", "--fp8-format hybrid", f"--fp8-recipe {p['fp8_recipe']}"]
    elif p["dtype"] in ("bf16", "fp16"):
        out.append(f"--{p['dtype']}")
    if p["grad_reduce_dtype"] == "fp32" and p["dtype"] != "fp32":
        # Megatron-FSDP takes its gradients' dtype from its own flag (default auto: the parameters', bf16)
        out.append("--megatron-fsdp-main-grads-dtype fp32" if zero >= 2 else "--accumulate-allreduce-grads-in-fp32")
    elif p["dtype"] in ("bf16", "fp8"):  # arguments.py turns fp32 reduction on under --bf16 unless told
        out.append("--grad-reduce-in-bf16")
    if p["main_params"] == "fp32_remainders":  # TE FusedAdam's remainders: OptimizerConfig's default
        out.append("--use-precision-aware-optimizer")
        if p["adam_state_dtype"] == "bf16":
            out.append("--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16")
    if not p["flash_attention"]:
        out.append("--attention-backend unfused")
    if p["cross_entropy"] == "megatron_fused":  # arguments.py refuses the te implementation (frameworks.py)
        out.append("--cross-entropy-loss-fusion")
    if p["make_vocab_size_divisible_by"] != 128:  # arguments.py's default, which the plan priced otherwise
        out.append(f"--make-vocab-size-divisible-by {p['make_vocab_size_divisible_by']}")
    out += _megatron_stage_layers(p, layout)
    args = " \\\n  ".join(out)
    head = []
    if zero >= 2:  # arguments.py asserts it for Megatron-FSDP
        head = ["# environment: CUDA_DEVICE_MAX_CONNECTIONS unset or > 1 (Megatron-FSDP requires it)"]
    elif (p["tensor_parallel"] > 1 or p["context_parallel"] > 1) and not p.get("moe_a2a_overlap"):
        # arguments.py asserts 1 with tensor or context parallelism on Hopper and before (not with MoE overlap)
        head = ["# environment: CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron-LM up to Hopper, tensor or context parallel)"]
    if cfg:
        head += ["# tp_comm_overlap.yaml", *cfg]
    return "\n".join([*head, "# Megatron-LM arguments", args])  # a heading though nothing precedes it


def _dispatcher_megatron(p: dict[str, Any], kind: str, backend: str) -> list[str]:
    """Megatron-Core's token dispatcher as priced (plan.moe_token_dispatcher): alltoall, or flex over the plan's
    backend (plan.moe_flex_backend: DeepEP, transformer_config.py moe_flex_dispatcher_backend's default, or
    HybridEP), in `kind`'s and `backend`'s spelling."""
    if p.get("moe_token_dispatcher") == "flex":
        return [kind.format("flex"), backend.format(p.get("moe_flex_backend", "deepep"))]
    return [kind.format("alltoall")]


def _moe_overlaps(p: dict[str, Any]) -> list[str]:
    """Megatron-Core's config fields (its arguments: the same with dashes) for what hides an MoE layer's
    all-to-alls as the plan priced it (transformer_ops._moe_block), both off by default (model_parallel_config.py
    overlap_moe_expert_parallel_comm, transformer_config.py moe_shared_expert_overlap: 'Without this, the shared
    experts execute before the router'): behind another micro-batch's attention (plan.moe_a2a_overlap), or
    behind the shared experts (plan.moe_shared_expert_overlap). TransformerConfig refuses the two together."""
    if p.get("moe_a2a_overlap"):
        return ["overlap_moe_expert_parallel_comm"]
    return ["moe_shared_expert_overlap"] if p.get("moe_shared_expert_overlap") else []


def uneven_stage_layers(p: dict[str, Any]) -> list[int] | None:
    """plan.stage_layers where it is not the even split every framework runs by default (virtual stages in
    pipeline order), else None."""
    layers = p.get("stage_layers")
    if not layers or p["pipeline_parallel"] == 1 or len(set(layers)) == 1:
        return None
    return list(layers)


def _megatron_layout(p: dict[str, Any]) -> str:
    """An uneven plan.stage_layers that --decoder-first/last-pipeline-num-layers cannot give (the stages between
    differ, or interleaved chunks), as Megatron-Core's --pipeline-model-parallel-layout (megatron/core/transformer/
    pipeline_parallel_layer_layout.py: `E` the embedding, `t*n` n transformer layers, `L` the loss and output
    layer, `|` between virtual stages, dealt to the pipeline ranks round-robin as interleaving runs them); "" where
    none is needed."""
    layers = uneven_stage_layers(p)
    if layers is None or (len(set(layers[1:-1])) <= 1 and p["virtual_pipeline"] == 1):
        return ""
    last = len(layers) - 1
    return "|".join(
        ("E" if i == 0 else "") + (f"t*{n}" if n else "") + ("L" if i == last else "") for i, n in enumerate(layers)
    )


def _megatron_stage_layers(p: dict[str, Any], layout: str) -> list[str]:
    """plan.stage_layers as Megatron-LM's uneven split: the first and last stages' own layer counts, the
    others even (--decoder-first/last-pipeline-num-layers), else its layout (`_megatron_layout`)."""
    layers = uneven_stage_layers(p)
    if layers is None:
        return []
    if layout:
        return [f'--pipeline-model-parallel-layout "{layout}"']
    return [f"--decoder-first-pipeline-num-layers {layers[0]}", f"--decoder-last-pipeline-num-layers {layers[-1]}"]


def _nemo_precision(p: dict[str, Any]) -> list[str]:
    """The recipe's precision plugin fields (NeMo 8cfedd7 nemo/collections/llm/recipes/precision/
    mixed_precision.py bf16_mixed, fp16_mixed; nemo/lightning/pytorch/plugins/mixed_precision.py DtypeConfig).
    MegatronStrategy copies the plugin's fields over the strategy's DDP config (megatron_strategy.py
    update_config_with_dtype_overrides), so the gradients' reduction dtype is set here: a
    `trainer.strategy.ddp.grad_reduce_in_fp32` would be overwritten by bf16_mixed's True. FP8 is set on the
    recipe's plugin field by field, as the plan priced it: every transformer layer in FP8 (the plugin's
    first_last_layers_bf16 default False, where bf16_with_fp8_current_scaling_mixed sets True) and 16-bit
    parameter gathers (fp8_param_gather default False, where NeMo's FP8 recipes set True)."""
    if p["dtype"] == "fp32":
        return [
            "# fp32: NeMo's recipes train under a bf16_mixed plugin and optim.config.bf16=True (recipes/optim/"
            "adam.py): set the plugin's precision=32, params_dtype and pipeline_dtype torch.float32, and "
            "optim.config.bf16=False"
        ]
    plugin = "fp16_mixed" if p["dtype"] == "fp16" else "bf16_mixed"
    out = [f"trainer.plugins={plugin}", f"trainer.plugins.grad_reduce_in_fp32={p['grad_reduce_dtype'] == 'fp32'}"]
    if p["dtype"] == "fp8":
        out += ["trainer.plugins.fp8=hybrid", f"trainer.plugins.fp8_recipe={p['fp8_recipe']}"]
        if p["fp8_recipe"] == "delayed":  # bf16_with_fp8_mixed's scaling history (no effect on the time)
            out += ["trainer.plugins.fp8_amax_history_len=1024", "trainer.plugins.fp8_amax_compute_algo=max"]
    return out


def _shard_copies(p: dict[str, Any]) -> int:
    """Copies of ZeRO's state under PlanConfig.zero_shard_ranks: data × context ranks over the shard size."""
    return int(p["data_parallel"] * p["context_parallel"] // p["zero_shard_ranks"])


def nemo_overrides(plan: dict[str, Any], model: ModelConfig, num_nodes: int | None = None) -> str:
    """NeMo 2 recipe overrides (nemo llm pretrain ... KEY=VALUE), as the recipes name the fields (NeMo 8cfedd7,
    Megatron-Core's configs they set; a helper's check of each line against nemo-run's CLI parser). What no
    KEY=VALUE can set is a comment: the tensor-parallel overlap lives only in MegatronCommOverlapCallback, which
    a recipe adds to trainer.callbacks in performance mode alone and whose userbuffers cfg is a Python object."""
    p = plan
    vp = p["virtual_pipeline"] if p["virtual_pipeline"] > 1 else None
    s = "trainer.strategy"
    out = []
    if num_nodes:  # NeMo takes its data parallelism from the trainer's GPUs (the recipes' defaults differ)
        gpus = p["tensor_parallel"] * p["pipeline_parallel"] * p["context_parallel"] * p["data_parallel"]
        out += [f"trainer.num_nodes={num_nodes}", f"trainer.devices={gpus // num_nodes}"]
    out += [
        f"{s}.tensor_model_parallel_size={p['tensor_parallel']}",
        f"{s}.pipeline_model_parallel_size={p['pipeline_parallel']}",
        f"{s}.virtual_pipeline_model_parallel_size={vp}",
        f"{s}.context_parallel_size={p['context_parallel']}",
        f"{s}.sequence_parallel={p['sequence_parallel']}",
    ]
    if p["context_parallel"] > 1:
        out.append(f"model.config.cp_comm_type={p['cp_comm']}")
    if (
        uneven := uneven_stage_layers(p)
    ) is not None:  # Megatron-Core TransformerConfig's fields, on the recipe's model
        if _megatron_layout(p):
            out.append(
                f"# stage_layers {uneven}: not of the first/last form that model.config.num_layers_in_first/"
                "last_pipeline_stage give; Megatron-Core's model.config.pipeline_model_parallel_layout would "
                "(not written: unchecked under NeMo's strategy)"
            )
        else:
            out += [
                f"model.config.num_layers_in_first_pipeline_stage={uneven[0]}",
                f"model.config.num_layers_in_last_pipeline_stage={uneven[-1]}",
            ]
    if model.is_moe:
        out += [
            f"{s}.expert_model_parallel_size={p['expert_parallel']}",
            f"{s}.expert_tensor_parallel_size={p['expert_tensor_parallel']}",
            f"model.config.moe_grouped_gemm={p['moe_grouped_gemm']}",
            *_dispatcher_megatron(
                p, "model.config.moe_token_dispatcher_type={}", "model.config.moe_flex_dispatcher_backend={}"
            ),
        ]
        out += [f"model.config.{name}=True" for name in _moe_overlaps(p)]
    out += [f"data.micro_batch_size={p['micro_batch_size']}", f"data.global_batch_size={p['global_batch_size']}"]
    if p["recompute"] != "none":
        out.append(f"model.config.recompute_granularity={p['recompute']}")
        if p["recompute"] == "full":
            method, layers = p["recompute_method"], p["recompute_num_layers"]
            out += [f"model.config.recompute_method={method}", f"model.config.recompute_num_layers={layers}"]
        elif list(p["recompute_modules"]) != ["core_attn"]:
            out.append(f"model.config.recompute_modules=[{','.join(p['recompute_modules'])}]")
    zero = p["zero_stage"]
    out.append(f"optim.config.use_distributed_optimizer={zero >= 1}")
    if zero >= 2:  # Megatron-FSDP raises on the recipes' average_in_collective=True (megatron_fsdp.py)
        strategy = "optim_grads" if zero == 2 else "optim_grads_params"
        out += [
            f"{s}.fsdp=megatron",
            f"{s}.ddp.data_parallel_sharding_strategy={strategy}",
            f"{s}.ddp.average_in_collective=False",
            # MegatronStrategy saves torch_dist by default and raises on it under Megatron-FSDP
            # (nemo/lightning/pytorch/strategies/megatron_strategy.py save_ckpt_format)
            f"{s}.save_ckpt_format=fsdp_dtensor",
            "# Megatron-FSDP: NeMo turns gradient_accumulation_fusion off (megatron_parallel.py), which this plan "
            "priced on",
        ]
    overlaps = {
        "overlap_grad_reduce": p["overlap_grad_reduce"],
        "overlap_param_gather": bool(p["overlap_param_gather"] and zero >= 1),
    }
    out += [f"{s}.ddp.{k}={v}" for k, v in overlaps.items()]
    if p.get("zero_shard_ranks"):
        out.append(f"{s}.ddp.num_distributed_optimizer_instances={_shard_copies(p)}")
    if p["grad_bucket_size_params"] is not None:  # else Megatron-Core's own default, which the plan priced
        out.append(f"{s}.ddp.bucket_size={p['grad_bucket_size_params']}")
    out += _nemo_precision(p)
    if p["main_params"] == "fp32_remainders":
        out.append("optim.config.use_precision_aware_optimizer=True")
        if p["adam_state_dtype"] == "bf16":
            out += ["optim.config.exp_avg_dtype=torch.bfloat16", "optim.config.exp_avg_sq_dtype=torch.bfloat16"]
    if p["tp_comm_overlap"]:
        cfg = "; ".join(
            f"{layer} " + ",".join(f"{k}={v}" for k, v in values.items())
            for layer, values in sorted(_ub_fields(p).items())
        )
        out += [
            "# tensor-parallel overlap: only MegatronCommOverlapCallback runs it (a recipe's performance_mode=True "
            "adds it to trainer.callbacks): set that callback's tp_comm_overlap=True"
            + (
                f" and its tp_comm_overlap_cfg, a TransformerLayerTPOverlapCfg built in Python, with {cfg}"
                if cfg
                else ""
            ),
            "# the callback also sets ddp overlap_grad_reduce and overlap_param_gather (True) and bucket_size "
            "(128 Mi): set its own fields to the values above; performance mode adds callbacks this plan did not "
            "price too (mixtral_8x7b's MegatronTokenDropCallback: capacity 1.0, padded; gpt3_175b's deferred "
            "embedding wgrad): remove them",
        ]
    if p["pipeline_parallel"] > 1:  # Megatron-Core's defaults are overlap False, batch True; set both
        overlapped = p["virtual_pipeline"] > 1 and p.get("overlap_p2p_comm", True)
        out.append(f"model.config.overlap_p2p_comm={overlapped}")
        out.append(f"model.config.batch_p2p_comm={not overlapped}")
    if not p["flash_attention"]:  # TransformerConfig.attention_backend: an AttnBackend, which nemo-run's CLI cannot set
        out.append("# unfused attention: set model.config.attention_backend = AttnBackend.unfused in the recipe")
    out.append(f"model.config.cross_entropy_loss_fusion={p['cross_entropy'] in ('megatron_fused', 'te')}")
    if p["cross_entropy"] == "te":
        out.append("model.config.cross_entropy_fusion_impl=te")
    if p["make_vocab_size_divisible_by"] != 128:  # GPTConfig's default, which the plan priced otherwise
        out.append(f"model.config.make_vocab_size_divisible_by={p['make_vocab_size_divisible_by']}")
    return "\n".join(out)


_TITAN_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}
#: PlanConfig.cp_comm as torchtitan's parallelism.context_parallel_rotate_method names it
_TITAN_ROTATE = {"torch_allgather": "allgather", "torch_alltoall": "alltoall"}


def _titan_compile(plan: dict[str, Any]) -> list[str]:
    """torchtitan's [compile] section (job_config.py Compile at 9810191^, since 08b8b244 in 2025-08; before it
    [training] compile): `enable` defaults to false, which runs the norms, rotary embeddings and SwiGLU op by op
    and the loss as eager F.cross_entropy. The components compiled are those the plan priced so: "model" when
    its pointwise kernels are compiled (plan.pointwise_kernels compiled, torchtitan's framework default in
    search, or fused; search does not offer eager, only a job that sets it is priced so), "loss" when
    plan.cross_entropy is torch_compiled (torchtitan's framework default in search). Its async tensor
    parallelism needs the compiled model (distributed/tensor_parallel.py maybe_enable_async_tp raises without
    it). eager_fused_norm's norm_type fused_rmsnorm is gone by 9810191^: not written."""
    components = [
        name
        for name, compiled in (
            ("model", plan["pointwise_kernels"] in ("fused", "compiled")),
            ("loss", plan["cross_entropy"] == "torch_compiled"),
        )
        if compiled
    ]
    if not components:
        return [
            "# the plan priced PyTorch eager's kernels (plan.pointwise_kernels, cross_entropy), torchtitan's default",
            "enable = false",
        ]
    listed = ", ".join(f'"{c}"' for c in components)
    return [
        f"# the plan priced torch.compile's kernels for: {' and '.join(components)} (torchtitan's default is eager)",
        "enable = true",
        f"components = [{listed}]",
    ]


def _titan_model_parts(layers: list[int]) -> str:
    """An uneven plan.stage_layers as torchtitan's module_fqns_per_model_part (job_config.py Parallelism at
    9810191^: each model chunk's module names, in pipeline order): its Llama and MoE models' tok_embeddings on the
    first chunk, layers.<i> in order, norm and output on the last."""
    parts: list[list[str]] = []
    first = 0
    for n in layers:
        parts.append([f"layers.{i}" for i in range(first, first + n)])
        first += n
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output"]
    return json.dumps(parts)


def torchtitan_toml(plan: dict[str, Any], model: ModelConfig) -> str:
    """torchtitan TOML: FSDP2 over every data-parallel rank (data_parallel_shard_degree; HSDP's replicate
    degree left 1), or DDP for zero 0; per-rank batch local_batch_size = global / dp; torch.compile as
    priced (`_titan_compile`)."""
    p = plan
    dp, zero = p["data_parallel"], p["zero_stage"]
    ddp = zero == 0 and dp > 1
    # HSDP (PlanConfig.zero_shard_ranks counts data × context ranks; torchtitan's FSDP mesh is dp_shard × cp)
    shard = p["zero_shard_ranks"] // p["context_parallel"] if p.get("zero_shard_ranks") else dp
    par = [
        f"data_parallel_replicate_degree = {dp if ddp else dp // shard}",
        f"data_parallel_shard_degree = {1 if ddp else shard}",
    ]
    if zero >= 2:
        par.append(f'fsdp_reshard_after_forward = "{"never" if zero == 2 else "always"}"')
    par += [
        f"tensor_parallel_degree = {p['tensor_parallel']}",
        f"enable_async_tensor_parallel = {str(p['tp_comm_overlap']).lower()}",
        f"pipeline_parallel_degree = {p['pipeline_parallel']}",
    ]
    if p["pipeline_parallel"] > 1:
        per_stage = model.num_layers // (p["pipeline_parallel"] * p["virtual_pipeline"])
        par.append(f'pipeline_parallel_schedule = "{_TITAN_SCHEDULES[p["schedule"]]}"')
        if (uneven := uneven_stage_layers(p)) is not None:
            par.append(f"module_fqns_per_model_part = {_titan_model_parts(uneven)}")
        else:
            par += [
                f"pipeline_parallel_layers_per_stage = {per_stage}",
                # its default counts the embedding and the output as a layer each of the first and last stages
                # (distributed/pipeline_parallel.py): the plan priced every stage the same layers
                "pipeline_parallel_first_stage_less_layers = 0",
                "pipeline_parallel_last_stage_less_layers = 0",
            ]
        par.append(f"pipeline_parallel_microbatch_size = {p['micro_batch_size']}")
    par.append(f"context_parallel_degree = {p['context_parallel']}")
    if p["context_parallel"] > 1:
        par.append(f'context_parallel_rotate_method = "{_TITAN_ROTATE[p["cp_comm"]]}"')
    if model.is_moe:
        # job_config.py Parallelism.expert_parallel_comm_backend: standard (its all-to-all) or deepep
        backend = "deepep" if p.get("moe_token_dispatcher") == "torchtitan_deepep" else "standard"
        par += [
            f"expert_parallel_degree = {p['expert_parallel']}",
            f"expert_tensor_parallel_degree = {p['expert_tensor_parallel']}",
            f'expert_parallel_comm_backend = "{backend}"',
        ]
    # with pipelining the local batch is split into micro-batches; without, it is one micro-batch and the
    # global batch accumulates gradients (job_config.py Training.local_batch_size / global_batch_size)
    local = p["global_batch_size"] // dp if p["pipeline_parallel"] > 1 else p["micro_batch_size"]
    training = [
        f"local_batch_size = {local}",
        f"global_batch_size = {p['global_batch_size']}",
        f"seq_len = {model.seq_length}",
        f'mixed_precision_param = "{"float32" if p["dtype"] == "fp32" else "bfloat16"}"',
    ]
    parts = ["# torchtitan before 9810191, its last TOML-configured version (config/job_config.py)"]
    parts += ["[parallelism]", *par, "", "[training]", *training, "", "[activation_checkpoint]"]
    # torchtitan's every-n-th-layer checkpointing is its mode "selective" with an integer option
    if p["recompute"] == "full" and p["recompute_every"] > 1:
        parts += ['mode = "selective"', f'selective_ac_option = "{p["recompute_every"]}"']
    else:
        parts.append(f'mode = "{p["recompute"]}"')
        if p["recompute"] == "selective":
            parts.append('selective_ac_option = "op"')
    parts += ["", "[compile]", *_titan_compile(p)]
    if p["dtype"] == "fp8":  # the converters' names at 9810191^ (components/quantization/float8.py)
        experts = model.is_moe and p["fp8_experts"]  # GroupedExperts: the grouped-GEMM converter, "experts" fqns
        names = ", ".join(f'"quantize.{n}.float8"' for n in ("linear", "grouped_mm")[: 2 if experts else 1])
        parts += ["", "[model]", f"converters = [{names}]", "", "[quantize.linear.float8]"]
        parts.append(f'recipe_name = "{p["fp8_recipe"]}"')
        # the plan priced the output layer's GEMM in bf16; Float8Linear's filter_fqns is empty by default
        # (job_config.py Float8Linear at 9810191^), which would convert it too
        parts.append('filter_fqns = ["output"]')
        if experts:
            parts += ["", "[quantize.grouped_mm.float8]", 'fqns = ["experts"]']
    return "\n".join(parts)


def _16_bit(dtype: str) -> str:
    """The 16-bit dtype a training in `dtype` (bf16, fp16 or fp8) keeps its gradients in: fp8 training's are bf16."""
    return "fp16" if dtype == "fp16" else "bf16"


def deepspeed_config(plan: dict[str, Any], model: ModelConfig) -> str:
    """DeepSpeed JSON config, then the Megatron-DeepSpeed arguments for the model-parallel sizes."""
    p = plan
    dp, zero = p["data_parallel"], p["zero_stage"]
    zero_cfg: dict[str, Any] = {"stage": zero}
    if zero >= 1:
        zero_cfg |= {
            "overlap_comm": bool(p["overlap_grad_reduce"]),
            "contiguous_gradients": True,
            "reduce_bucket_size": p["grad_bucket_size_params"] or DEEPSPEED_BUCKET_PARAMS,
        }
        if zero <= 2:  # how the plan priced each bucket's reduction (PlanConfig.zero_grad_reduce): DeepSpeed's
            # all-reduce of the bucket (true, its default), or its one reduce per destination rank (false)
            zero_cfg["use_multi_rank_bucket_allreduce"] = p.get("zero_grad_reduce", "all_reduce") != "reduce_per_rank"
    config: dict[str, Any] = {
        "train_batch_size": p["global_batch_size"],
        "train_micro_batch_size_per_gpu": p["micro_batch_size"],
        "gradient_accumulation_steps": p["global_batch_size"] // (p["micro_batch_size"] * dp),
        "zero_optimization": zero_cfg,
        # the reduction's dtype as priced (PlanConfig.grad_bytes): fp32, or the training's 16-bit dtype
        "communication_data_type": "fp32" if "fp32" in (p["grad_reduce_dtype"], p["dtype"]) else _16_bit(p["dtype"]),
    }
    if p["dtype"] in ("bf16", "fp8"):
        config["bf16"] = {"enabled": True}
    elif p["dtype"] == "fp16":
        config["fp16"] = {"enabled": True}
    # runtime/engine.py: bf16 with fp32 accumulation runs BF16_Optimizer (zeroed: v0.12.6-v0.14.1's)
    if p.get("grad_accumulation") in BF16_OPTIMIZER_ACCUMULATIONS:
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    if p["recompute"] == "full":
        config["activation_checkpointing"] = {"partition_activations": p["tensor_parallel"] > 1}
    if model.is_moe and p["pipeline_parallel"] > 1:  # transfers unpartitioned, as priced (transformer.pipe_partitioned)
        config["pipeline"] = {"pipe_partitioned": False, "grad_partitioned": False}
    args = [
        f"--tensor-model-parallel-size {p['tensor_parallel']}",
        f"--pipeline-model-parallel-size {p['pipeline_parallel']}",
    ]
    notes: list[str] = []  # what the arguments cannot set, said above them
    if p["pipeline_parallel"] == 1:
        args.append("--no-pipeline-parallel")
    # Megatron-DeepSpeed requires the micro-batch (arguments.py: assert args.micro_batch_size is not None) and reads its
    # batch sizes from these, not from the JSON (training.py _create_ds_config_dict writes them into it)
    args += [f"--micro-batch-size {p['micro_batch_size']}", f"--global-batch-size {p['global_batch_size']}"]
    if p["sequence_parallel"]:
        args.append("--sequence-parallel")
    if model.is_moe:  # Megatron-DeepSpeed's names (megatron/arguments.py); its MoE pads every expert to the capacity
        args += [f"--num-experts {model.experts}", f"--topk {model.moe_top_k}"]
        if model.moe_capacity_factor is None:  # capacity from the busiest expert, all-reduced (dropless)
            args.append("--disable-moe-token-dropping")
        else:
            args.append(f"--moe-train-capacity-factor {model.moe_capacity_factor}")
        args.append(f"--moe-expert-parallel-size {p['expert_parallel']}")
        etp, tp = p["expert_tensor_parallel"], p["tensor_parallel"]
        if etp > 1 and etp == tp:  # off by default: the experts unsplit (model/transformer.py)
            args.append("--enable-expert-tensor-parallelism")
        elif etp > 1:  # comments go above the command: inside it one would end the line continuation
            notes.append(f"# expert tensor parallel {etp}: Megatron-DeepSpeed splits experts over all tp {tp} or none")
        if model.moe_shared_ffn_hidden_size:  # the shared expert as PR-MoE's residual MLP (MoE use_residual)
            args.append("--mlp-type residual")
    if p["dtype"] in ("bf16", "fp8", "fp16"):  # its params_dtype and GPTModelPipe's casts (megatron/arguments.py)
        args.append(f"--{_16_bit(p['dtype'])}")
    if (uneven := uneven_stage_layers(p)) is not None:
        notes.append(
            f"# stage_layers {uneven}: Megatron-DeepSpeed's GPTModelPipe splits its layers evenly "
            "(PipelineModule partition_method 'type:transformer'): set the partition in code"
        )
    if p["flash_attention"]:  # else Megatron-DeepSpeed runs its unfused attention (model/transformer.py)
        args.append("--use-flash-attn-v2")
    if p["dtype"] == "fp8":
        args += ["--transformer-impl transformer_engine", "--fp8-hybrid"]
    if p["recompute"] == "full":  # the JSON's activation_checkpointing is read only with it (initialize.py)
        args.append("--deepspeed-activation-checkpointing")
    # its own --zero-stage (default 1) decides whether pretrain_gpt.py builds the model under zero.Init (stage 3)
    args += [*_recompute_megatron(p), f"--zero-stage {zero}", "--deepspeed", "--deepspeed_config ds_config.json"]
    text = json.dumps(config, indent=2)
    # megatron/arguments.py raises on sequence parallelism without it (on CUDA)
    env = "# environment: CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron-DeepSpeed, sequence parallel)\n"
    head = env if p["sequence_parallel"] else ""
    # the MOELayer priced (plan.moe_token_dispatcher): deepspeed/moe/sharded_moe.py before or from pull request 8195
    if model.is_moe and (dispatch := p.get("moe_token_dispatcher")) in DEEPSPEED_MOE_DISPATCHERS:
        version = "deepspeed<0.19.4" if dispatch == "einsum" else "deepspeed>=0.19.4"
        head += f"# MoE layers priced as DeepSpeed's {dispatch} dispatch: pip install '{version}'\n"
    said = "".join(f"{n}\n" for n in notes)
    return f"{head}# ds_config.json\n{text}\n{said}# Megatron-DeepSpeed arguments\n" + " \\\n  ".join(args)


LAUNCH: dict[str, Callable[[dict[str, Any], ModelConfig], str]] = {
    "megatron-core": megatron_core_args,
    "nemo": nemo_overrides,
    "torchtitan": torchtitan_toml,
    "deepspeed": deepspeed_config,
}


def launch_settings(framework_name: str, plan: dict[str, Any], model: ModelConfig, num_nodes: int | None = None) -> str:
    """The framework's launch settings for `plan` (canonical plan fields, data_parallel resolved) on `num_nodes`
    nodes (NeMo's trainer takes them; the other frameworks take the GPUs from their launcher)."""
    if framework_name == "nemo":
        return nemo_overrides(plan, model, num_nodes)
    return LAUNCH[framework_name](plan, model)
