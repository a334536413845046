"""Predicted vs measured step time on every row of ../shared/data/step_times that itercast can express.

    python validation/step_times.py            # reads $ITERCAST_DATA or ../shared/data

Nothing here is fitted to these rows: the cost models come from microbenchmark tables only
(tools/fit_efficiency_curves.py), so this is an independent check. Plans follow the published
recipes' defaults where the row does not say (stated per source below); a row that needs a
feature itercast lacks is listed as skipped with the reason.
"""

from __future__ import annotations

import math
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.config.job import Job
from itercast.config.plan import TE_OVERLAP_LAYERS
from itercast.data_paths import read_csv_rows, shared_data_dir
from itercast.errors import ConfigError
from itercast.predict import predict

#: NeMo / Megatron-Core recipe defaults for LLM pre-training on H100 (not stated per row):
#: sequence parallelism whenever tp > 1, distributed optimizer (ZeRO-1) with overlapped gradient
#: reduction and parameter gathering, fused attention, no recomputation. FP8 rows ran Transformer
#: Engine's delayed scaling: NeMo 1 YAMLs (dgxc-benchmarking <= v25.02, NeMo-Framework-Launcher 24.07)
#: set fp8_hybrid with fp8_amax_history_len 1024 / fp8_amax_compute_algo max; NeMo 2's
#: bf16_with_fp8_mixed (dgxc v25.04.02) sets fp8_recipe "delayed"; Megatron-LM core r0.8.0 predates
#: --fp8-recipe (delayed only). Pipeline exchanges as Megatron-Core runs them (plan.pipeline_p2p megatron):
#: every interleaved row's config sets overlap_p2p_comm true, batch_p2p_comm false (dgxc v24.11.1-v25.02
#: llama3.1_70b/405b.yaml, gpt3_175b_hydra.yaml, grok1_314b.yaml, nemotron/configure.sh for 340b VP 12;
#: NeMo-Framework-Launcher 24.07 gpt3/175b.yaml, llama2_13b/70b.yaml, llama3_70b.yaml, nemotron_22b.yaml);
#: the Megatron-Core weak-scaling rows (PP 2-16 without interleaving) run Megatron-LM, whose arguments.py
#: (core_r0.8.0) forces overlap_p2p_comm off without interleaving: blocking, batched exchanges.
RECIPE = {
    "pipeline_p2p": "megatron",
    "fp8_recipe": "delayed",
    "zero_stage": 1,
    "overlap_grad_reduce": True,
    "overlap_param_gather": True,
    "flash_attention": True,
    "recompute": "none",
}

#: Megatron's gradient-buffer switches (plan.grad_nan_check, plan.grad_average_in_collective) under NeMo 1, which
#: every NeMo source here ran (dgxc-benchmarking's YAMLs, Grok-1's, NeMo-Framework-Launcher 24.07): its
#: megatron_gpt_model.py builds Megatron-Core's DistributedDataParallelConfig with
#: check_for_nan_in_grad=optim.get('check_for_nan_in_grad', False) and average_in_collective=optim.get(
#: 'average_in_collective', True), and none of these YAMLs names either; under distributed_fused_adam (Apex's
#: optimizer, no Megatron DDP) neither pass runs either. Megatron-LM's training script (megatron-core rows)
#: keeps the fields' defaults: its --check-for-nan-in-loss-and-grad on, --ddp-average-in-collective off.
NEMO1_GRAD_BUFFER = {"grad_nan_check": False, "grad_average_in_collective": True}

DGXC_MODELS = {
    "Llama 3.1 8b": "llama3-8b",
    "Llama 3.1 70b": "llama3-70b",
    "Llama 3.1 405b": "llama3-405b",
    "Nemotron4 15b": "nemotron4-15b",
    "Nemotron4 340b": "nemotron4-340b",
    "NeMo Megatron": "gpt3-175b",
}
NEMO_MODELS = {
    "GPT3-175B": "gpt3-175b",
    "LLAMA2-7B": "llama2-7b",
    "LLAMA2-13B": "llama2-13b",
    "LLAMA2-70B": "llama2-70b",
    "LLAMA3-8B": "llama3-8b",
    "LLAMA3-70B": "llama3-70b",
}


#: plan.cross_entropy, the loss kernels each source's framework ran: per model preset, "*" for the
#: source's other models. Read from the configs each source ran, not from any step time.
CROSS_ENTROPY: dict[str, dict[str, str]] = {
    # NVIDIA/dgxc-benchmarking v24.11, v25.01, v25.02 (NeMo 1 YAML; nemo:24.09, 24.12):
    # llama3.1/llama3.1_{8,70,405}b.yaml and nemotron/nemotron4-{15,340}b-synth.yaml set
    # `cross_entropy_loss_fusion: true`, which NeMo 1 hands to Megatron-Core's TransformerConfig
    # (NVIDIA/NeMo v2.0.0 megatron_base_model.py build_transformer_config: every TransformerConfig field
    # the YAML names); v25.04.02 llama3.1/pretrain_llama31.py runs NeMo 2.2's llama3_8b / llama3_70b /
    # llama31_405b pretrain recipes (nemo:25.02.01): GPTConfig.cross_entropy_loss_fusion = True
    # (nemo/collections/llm/gpt/model/base.py). nemo_megatron/gpt3_175b_hydra.yaml (NeMo 1, every
    # release) does not name it: Megatron-Core's default, False.
    "dgxc-benchmarking": {
        "llama3-8b": "megatron_fused",
        "llama3-70b": "megatron_fused",
        "llama3-405b": "megatron_fused",
        "nemotron4-15b": "megatron_fused",
        "nemotron4-340b": "megatron_fused",
        "*": "megatron",
    },
    # dgxc-benchmarking grok1/grok1_314b.yaml (NeMo 1, every release in the data) does not name it.
    "dgxc grok1 (MoE)": {"*": "megatron"},
    # The nemo:24.07 container's NVIDIA/NeMo-Framework-Launcher 24.07 launcher_scripts/conf/training:
    # llama/llama3_8b.yaml and llama3_70b.yaml set `cross_entropy_loss_fusion: true`; llama/llama2_*.yaml and
    # gpt3/175b.yaml do not name it (Megatron-Core core_r0.8.0 ModelParallelConfig default False).
    "nemo-24.07": {"llama3-8b": "megatron_fused", "llama3-70b": "megatron_fused", "*": "megatron"},
    # Megatron-LM README (core r0.8.0) weak scaling: the flags it states omit --cross-entropy-loss-fusion (off).
    "megatron-core": {"*": "megatron"},
    # Llama 3 405B ran Meta's own training stack, whose loss kernels are not published: the default kept.
    "llama3-405b": {"*": "megatron"},
}


def cross_entropy(source: str, preset: str) -> str:
    """plan.cross_entropy of a row of `source` whose model is `preset` (CROSS_ENTROPY)."""
    impls = CROSS_ENTROPY[source]
    return impls.get(preset, impls["*"])


@dataclass
class Row:
    source: str
    label: str
    gpus: int
    measured_s: float
    model: dict
    plan: dict
    predicted_s: float | None = None
    skipped: str = ""
    memory_gib: float = 0.0  # predicted memory on the most loaded GPU, with its reserve
    capacity_gib: float = 0.0

    def __post_init__(self) -> None:
        self.plan.setdefault("cross_entropy", cross_entropy(self.source, self.model.get("preset", "")))


def _plan(tp: int, pp: int, cp: int, vp: int, mbs: int, gbs: int, dtype: str) -> dict:
    return {
        **RECIPE,
        "tensor_parallel": tp,
        "pipeline_parallel": pp,
        "context_parallel": cp,
        "virtual_pipeline": vp,
        "micro_batch_size": mbs,
        "global_batch_size": gbs,
        "sequence_parallel": tp > 1,
        "dtype": dtype,
        "schedule": "interleaved-1f1b" if vp > 1 else "1f1b",
    }


#: plan.tp_comm_overlap_sms as Transformer Engine 1.x (nemo:24.07-24.12, Megatron-LM core_r0.8.0) runs a
#: userbuffers overlap without a cfg: module/base.py initialize_ub get_default_config "set_sm_margin": False
#: (v1.11-v1.13; a margin by default only from TE 2.1, 544dd14b4): no SMs taken from any GEMM
TE1_DEFAULT_SMS = dict.fromkeys(TE_OVERLAP_LAYERS, 0)


def _pipeline_sms(proj: int, fc2: int) -> dict[str, int]:
    """A ub_tp_comm_overlap_cfg whose pipeline reduce-scatters (proj_fprop, fc2_fprop) set set_sm_margin
    with these num_sm, and whose bulk overlaps do not."""
    return TE1_DEFAULT_SMS | {"proj_fprop": proj, "fc2_fprop": fc2}


#: dgxc-benchmarking's ub_tp_comm_overlap_cfg per model (llama3.1_70b.yaml, llama3.1_405b.yaml,
#: gpt3_175b_hydra.yaml, the same at v24.11.1, v25.01.1, v25.02); nemotron and grok1 name none (TE 1.x defaults)
DGXC_OVERLAP_SMS = {
    "llama3-70b": _pipeline_sms(24, 16),
    "llama3-405b": _pipeline_sms(24, 8),
    "gpt3-175b": _pipeline_sms(24, 20),
}


def dgxc_settings(preset: str, version: str, dtype: str) -> dict:
    """Plan fields of the optimizer, recompute and tensor-parallel overlap a dgxc-benchmarking NeMo 1 YAML ran,
    read from its
    optim: section at v24.11.1 (35a9aecc), v25.01.1 (e6afea3a) and v25.02 (8f5cbb37) as NeMo v2.0-v2.1
    (nemo:24.09, 24.12) builds it. llama3.1_{8,70,405}b.yaml, nemotron4-{15,340}b-synth.yaml and
    gpt3_175b_hydra.yaml: name distributed_fused_adam (Apex DistributedFusedAdam) with grad_sync_dtype bf16;
    megatron_base_model.py setup_optimization then keeps, with fp32 optimizer state (optim.dtype left out)
    on bf16 weights, 16-bit remainders of the fp32 params (store_param_remainders), and a full copy
    (store_params) when the model has fp8_params: configure.sh sets +model.fp8_params=$FP8_ENABLED for
    llama3.1 and nemotron, gpt3_175b_hydra.yaml sets fp8_params true for every run.
    nemotron4-340b-synth.yaml also sets optim.dtype bf16 (Adam moments in bf16; the copy, kept only with
    fp8_params, in bf16; none otherwise) and activations_checkpoint_granularity selective. v25.02's
    nemotron4-15b-synth.yaml names mcore_distributed_optim without grad_sync_dtype: Megatron-Core's
    distributed optimizer, fp32 main params, fp32 gradients (megatron_gpt_model.py grad_reduce_in_fp32).
    Tensor-parallel communication overlap (ub_tp_comm_overlap, Transformer Engine userbuffers:
    plan.tp_comm_overlap): llama3.1_70b/405b.yaml and gpt3_175b_hydra.yaml set it true, llama3.1_8b.yaml
    false, nemotron/configure.sh sets model.ub_tp_comm_overlap=True for 15B and 340B (the same three versions)."""
    overlap = {
        "tp_comm_overlap": preset != "llama3-8b",
        "tp_comm_overlap_sms": DGXC_OVERLAP_SMS.get(preset, TE1_DEFAULT_SMS),
    }
    if preset == "nemotron4-15b" and version == "v25.02":
        return {"grad_reduce_dtype": "fp32", "main_params": "fp32"} | overlap
    fp8_params = dtype == "fp8" or preset == "gpt3-175b"
    if preset == "nemotron4-340b":
        main = "bf16" if fp8_params else "none"
        state = {"grad_reduce_dtype": "bf16", "main_params": main, "adam_state_dtype": "bf16"}
        return state | {"recompute": "selective"} | overlap
    return {"grad_reduce_dtype": "bf16", "main_params": "fp32" if fp8_params else "fp32_remainders"} | overlap


#: dgxc-benchmarking releases whose launch scripts export NVTE_FUSED_ATTN=0 for a model, so that Transformer Engine
#: runs FlashAttention-2 (its flash-attn back end, plan.attention_kernel fa2) instead of cuDNN's fused attention
#: (the default it picks on Hopper): grok1/configure.sh at every release in the data (35a9aecc v24.11.1, e6afea3a
#: v25.01.1, 8f5cbb37 v25.02, 0efdb235 25.04.02); nemotron/configure.sh's 340b branch (NVTE_FUSED_ATTN=0; its 15b
#: branch sets 1) at 35a9aecc, e6afea3a and 8f5cbb37; nemo_megatron/launch.sh at 35a9aecc and configure.sh at
#: e6afea3a (1 at 8f5cbb37 and 0efdb235). The llama3.1 scripts set NVTE_FUSED_ATTN=1, and v25.05.05 (c5c765f2) sets
#: neither. Release by the commit the row's source names.
DGXC_FA2 = {
    "nemotron4-340b": ("35a9aecc", "e6afea3a", "8f5cbb37"),
    "gpt3-175b": ("35a9aecc", "e6afea3a"),
}


def dgxc_attention_kernel(preset: str, source: str) -> str:
    """plan.attention_kernel of a dgxc-benchmarking row: fa2 where its release's scripts disable cuDNN's fused
    attention for its model (DGXC_FA2), else cudnn."""
    commit = re.search(r"@\s*([0-9a-f]{8})", source)
    return "fa2" if commit and commit.group(1) in DGXC_FA2.get(preset, ()) else "cudnn"


def dgxc_rows(data: Path) -> list[Row]:
    """NVIDIA dgxc-benchmarking: rows whose model_config states TP/PP/CP/VP/MBS/GA."""
    rows, seen = [], set()
    for r in read_csv_rows(data / "step_times" / "dgxc_benchmarking_step_times.csv"):
        cfg, name = r["model_config"], next((k for k in DGXC_MODELS if r["model_config"].startswith(k)), None)
        knobs = dict(re.findall(r"(TP|PP|CP|VP|MBS|GA)=(\d+)", cfg))
        if name is None or r["gpu_type"] != "H100" or "TP" not in knobs or "Finetuning" in cfg:
            continue
        key = (cfg.replace(" 24.09", "").replace(" 24.11", ""), r["gpus"], r["step_time_s"])
        if key in seen:
            continue
        seen.add(key)
        gpus = int(r["gpus"])
        tp, pp, cp = int(knobs["TP"]), int(knobs["PP"]), int(knobs.get("CP", 1))
        vp, mbs, ga = int(knobs.get("VP", 1)), int(knobs.get("MBS", 1)), int(knobs["GA"]) if "GA" in knobs else None
        dp = gpus // (tp * pp * cp)
        gbs = int(r["global_batch_size"]) if r["global_batch_size"] else (mbs * dp * ga if ga else None)
        if gbs is None:
            continue
        seq = {"gpt3-175b": 2048}.get(DGXC_MODELS[name])
        dtype = "fp8" if "FP8" in cfg else "bf16"
        version = re.search(r"\(\d{4}-\d\d-\d\d (v[\d.]+)\)", r["source"])
        model = {"preset": DGXC_MODELS[name], **({"seq_length": seq} if seq else {})}
        row = Row(
            "dgxc-benchmarking",
            f"{cfg} ×{gpus}",
            gpus,
            float(r["step_time_s"].replace(" ", "")),
            model,
            _plan(tp, pp, cp, vp, mbs, max(gbs, 1), dtype)
            | dgxc_settings(DGXC_MODELS[name], version.group(1) if version else "", dtype)
            | {"attention_kernel": dgxc_attention_kernel(DGXC_MODELS[name], r["source"])}
            | NEMO1_GRAD_BUFFER,
        )
        if dp * tp * pp * cp != gpus:
            row.skipped = (
                f"the named config needs a multiple of tp·pp·cp = {tp * pp * cp} GPUs; "
                f"the source ran {gpus} with a config it does not state"
            )
        rows.append(row)
    return rows


GROK_CONFIGS = Path(__file__).resolve().parents[1] / "data" / "published" / "dgxc_grok1_configs.csv"


def grok_rows(data: Path) -> list[Row]:
    """dgxc-benchmarking Grok-1 314B proxies (mixture of experts): the step times of
    grok1/README_314b.md in the shared data, the configurations of its table (committed in
    data/published/dgxc_grok1_configs.csv with their source; grok1_314b.yaml's switches: gradients
    reduced in bf16, otherwise RECIPE)."""
    configs = {int(r["gpus"]): r for r in read_csv_rows(GROK_CONFIGS)}
    rows = []
    for r in read_csv_rows(data / "step_times" / "dgxc_benchmarking_step_times.csv"):
        if not r["model_config"].startswith("Grok 1 314b") or not r["source"].endswith("README_314b.md"):
            continue
        gpus = int(r["gpus"] or re.search(r"(\d+)x? H100", r["column_header"]).group(1))  # type: ignore[union-attr]
        c = {k: int(v) for k, v in configs[gpus].items()}
        vp = c["virtual_pipeline"]
        plan = _plan(
            c["tensor_parallel"],
            c["pipeline_parallel"],
            c["context_parallel"],
            vp,
            c["micro_batch_size"],
            c["global_batch_size"],
            "fp8" if "FP8" in r["dtype"] else "bf16",
        )
        # grok1_314b.yaml @35a9aecc sets moe_grouped_gemm: False (SequentialMLP, data/published/dgxc_grok1_configs.csv);
        # grok1/configure.sh (35a9aecc, e6afea3a, 8f5cbb37) overrides model.ub_tp_comm_overlap=true
        plan |= {"expert_parallel": c["expert_parallel"], "grad_reduce_dtype": "bf16", "moe_grouped_gemm": False}
        # the releases of README_314b.md (v24.11.1, v25.01.1, 25.04.02) run NeMo containers of Megatron-Core 0.9-0.12,
        # before 0.13 sent the routing probabilities in an all-to-all of their own (plan.moe_probs_alltoall)
        plan["moe_probs_alltoall"] = False
        plan |= NEMO1_GRAD_BUFFER
        # grok1/configure.sh at every release in the data exports NVTE_FUSED_ATTN=0: FlashAttention-2 (DGXC_FA2's note)
        plan["attention_kernel"] = "fa2"
        plan["tp_comm_overlap"] = c["tensor_parallel"] > 1
        plan["tp_comm_overlap_sms"] = TE1_DEFAULT_SMS  # no ub_tp_comm_overlap_cfg
        model = {"preset": "grok1-314b", "num_layers": c["num_layers"], "seq_length": c["seq_length"]}
        rows.append(Row("dgxc grok1 (MoE)", f"{r['model_config']} ×{gpus}", gpus, float(r["step_time_s"]), model, plan))
    return rows


def nemo_rows(data: Path) -> list[Row]:
    """NeMo 24.07 performance summary (FP8, DGX H100); step time derived there from tokens/s."""
    rows = []
    for r in read_csv_rows(data / "step_times" / "nemo_24.07_dgx_h100_pretrain_perf.csv"):
        preset = NEMO_MODELS.get(r["model"])
        label = f"{r['model']} ×{r['GPUs']}"
        plan = _plan(int(r["TP"]), int(r["PP"]), int(r["CP"]), int(r["VP"]), int(r["MBS"]), int(r["GBS"]), "fp8")
        # NeMo-Framework-Launcher 24.07 conf/training gpt3/175b.yaml, llama/*.yaml: optim distributed_fused_adam
        # without dtype, grad_sync_dtype or fp8_params: fp32 state and gradient reduction (Apex's default,
        # the optimizer dtype), 16-bit remainders of the fp32 params (NeMo r2.0.0 setup_optimization)
        plan["main_params"] = "fp32_remainders"
        # its ub_tp_comm_overlap: true in llama2_70b.yaml and llama3_70b.yaml, false in gpt3/175b.yaml and the
        # 7B/8B/13B llama YAMLs
        plan["tp_comm_overlap"] = preset in ("llama2-70b", "llama3-70b") and int(r["TP"]) > 1
        # their tp_overlap@model.ub_tp_comm_overlap_cfg: ub_cfg_h100_h8192_tp4_mbs1_seqlen{4096,8192}.yaml
        plan["tp_comm_overlap_sms"] = _pipeline_sms(24, 16)
        # NeMo-Framework-Launcher's conf/config.yaml env_vars set NVTE_FUSED_ATTN: 0 ("Disable cudnn FA until we've
        # tested it more", 562dcb45 2024-02-13 to 04b8d098 2024-08-29, over these 24.07 figures of 2024-08), so
        # Transformer Engine ran FlashAttention-2; examples/training/gpt/h100/175b_fp8_16node.sh sets it to 1 for
        # GPT-3 175B (95c77b59, 2024-07-17)
        plan["attention_kernel"] = "cudnn" if preset == "gpt3-175b" else "fa2"
        plan |= NEMO1_GRAD_BUFFER
        row = Row(
            "nemo-24.07",
            label,
            int(r["GPUs"]),
            float(r["step_time_s_derived"]),
            {"preset": preset or "", "seq_length": int(r["seq_len"])},
            plan,
        )
        if preset is None:
            row.skipped = "architecture not published in the source (NeMo's own config)"
        rows.append(row)
    return rows


def megatron_rows(data: Path) -> list[Row]:
    """Megatron-Core weak scaling (GPT, vocab 131072, seq 4096); measured step time derived from
    the reported TFLOP/s per GPU with Megatron's FLOP formula (identical to ours for GPT).
    The source does not give the micro-batch size: 1 is assumed. It states --tp-comm-overlap
    (plan.tp_comm_overlap where tp > 1). Gradients are accumulated and reduced in fp32 (plan.grad_reduce_dtype's
    default): the runs are Megatron-LM's training script, whose arguments.py at the table's commit
    (f2e5db402c, 2024-07-15, as at core_r0.8.0) sets accumulate_allreduce_grads_in_fp32 under --bf16 ("bfloat16
    requires gradient accumulation and all-reduce to be done in fp32"), which training.py hands to
    DistributedDataParallelConfig(grad_reduce_in_fp32=...); there was no flag to turn it off (--grad-reduce-in-bf16
    came in 2025). Until session 38 these rows reduced in bf16, read as Megatron-Core's DistributedDataParallelConfig
    default, set after seeing this table's errors (issue #14)."""
    rows = []
    for r in read_csv_rows(data / "step_times" / "megatron_core_h100_weak_scaling.csv"):
        h, layers, heads = int(r["hidden_size"]), int(r["layers"]), int(r["attention_heads"])
        model = {
            "family": "gpt",
            "num_layers": layers,
            "hidden_size": h,
            "num_attention_heads": heads,
            "seq_length": 4096,
            "vocab_size": 131072,
            "tie_embeddings": False,
        }
        gbs, gpus = int(r["global_batch_size"]), int(r["GPUs"])
        plan = _plan(int(r["TP"]), int(r["PP"]), 1, 1, 1, gbs, "bf16")
        plan |= {
            "tp_comm_overlap": int(r["TP"]) > 1,
            "tp_comm_overlap_sms": TE1_DEFAULT_SMS,
        }
        flops = (
            Job.from_dicts(model, {"tensor_parallel": 1}, {"preset": "dgx-h100"}).model.flops_per_token() * gbs * 4096
        )
        rows.append(
            Row(
                "megatron-core",
                f"GPT {r['model_size']} ×{gpus}",
                gpus,
                flops / (float(r["TFLOPs_per_GPU"]) * 1e12 * gpus),
                model,
                plan,
            )
        )
    return rows


def llama3_rows(data: Path) -> list[Row]:
    """Llama 3 405B pre-training (Llama Team 2024, Table 4; H100, bf16): step time derived from the
    reported TFLOP/s per GPU with our FLOP count. The paper states tp, cp, pp, dp, the sequences per
    data-parallel rank, FSDP and interleaved 1F1B, and (§3.3.2) that the first and last stage each hold
    one layer fewer, "the first model chunk on the first stage has only the embedding, and the last model
    chunk on the last stage has only output projection and loss calculation": with 126 layers over 16
    stages of V chunks of L layers, (16 V − 2) L = 126 holds for an interleaved V only at V = 8, L = 1,
    so 8 chunks per stage, one layer each, the first and the last empty. (Until session 16 the rows
    assumed V = 2 and [3, 4 × 30, 3] layers, which contradicts that sentence: −7.3% / +4.9% / −8.0%
    then, a change of configuration only, decided on the paper's text.) Not stated, assumed:
    micro-batch 1, the cluster as DGX H100 (Llama 3: 400 Gb/s RoCE per GPU, as our preset's InfiniBand).
    FSDP (§3.3.2): "Our use of FSDP for Llama 3 shards the optimizer states and gradients, but for model
    shards we do not reshard after forward computation"; §3.3.4: FP32 gradient accumulation over the
    micro-batches and FP32 reduce-scatters across the data-parallel workers. Sharded fp32 sums of the
    micro-batches are ZeRO-2's: each micro-batch's gradients reduce-scattered in fp32 after its backward
    (plan.grad_reduce_dtype fp32, the default). The weights are held whole and gathered once a step
    (assumed, the least traffic the text allows). Until session 42 the rows ran ZeRO-1 (torchtitan's
    pipeline + FSDP: whole fp32 sums reduce-scattered once), which holds 12.8 GB of whole fp32 gradients
    beside the 8K rows' 68-75 GB of activations (no activation checkpointing, §3.3.2) and judged all three
    runs out of memory (89.8, 83.1, 83.3 GiB); a change of configuration, decided on the paper's text and
    on the runs having run."""
    rows = []
    for r in read_csv_rows(data / "step_times" / "llama3_405b_table4_mfu.csv"):
        tp, cp, pp, dp, seq = (int(r[k]) for k in ("TP", "CP", "PP", "DP", "seq_len"))
        gpus, sequences = int(r["GPUs"]), int(r["batch_size_per_DP"]) * dp
        plan = _plan(tp, pp, cp, 8, 1, sequences, "bf16") | {"zero_stage": 2}
        plan["pipeline_p2p"] = "overlapped"  # Meta's own trainer: its exchanges are not published
        # §3.3.2: K and V all-gathered, exposed, before the local query chunks' attention (Transformer
        # Engine's AttnFuncWithCPAndKVAllGather cites it); the 8K-token rows have cp 1
        plan["cp_comm"] = "all_gather"
        plan["stage_layers"] = [0] + [1] * (8 * pp - 2) + [0]
        model = {"preset": "llama3-405b", "seq_length": seq}
        flops = Job.from_dicts(model, {"tensor_parallel": 1}, {"preset": "dgx-h100"}).model.flops_per_token()
        measured = flops * sequences * seq / (float(r["TFLOPs_per_GPU"]) * 1e12 * gpus)
        rows.append(Row("llama3-405b", f"Llama 3 405B ×{gpus} seq {seq}", gpus, measured, model, plan))
    return rows


def run(rows: list[Row]) -> None:
    for row in rows:
        if row.skipped:
            continue
        try:
            job = Job.from_dicts(row.model, row.plan, {"preset": "dgx-h100", "num_nodes": row.gpus // 8})
            p = predict(job)
            row.predicted_s = p.step_time_s
            row.memory_gib, row.capacity_gib = p.memory.total_bytes / 2**30, p.memory.capacity_bytes / 2**30
        except ConfigError as exc:
            row.skipped = str(exc).splitlines()[0]


def report(rows: list[Row]) -> None:
    print(f"{'source':18} {'row':70} {'measured_s':>10} {'predicted_s':>11} {'error':>8}")
    for row in rows:
        if row.predicted_s is None:
            print(f"{row.source:18} {row.label[:70]:70} {'skipped':>10}  {row.skipped}")
            continue
        err = row.predicted_s / row.measured_s - 1
        print(f"{row.source:18} {row.label[:70]:70} {row.measured_s:10.3f} {row.predicted_s:11.3f} {err:+8.1%}")
    configs = distinct_configs(rows)
    print(
        f"\nper distinct configuration ({len(configs)} of {sum(r.predicted_s is not None for r in rows)} rows; "
        "a configuration measured several times counts once, at the median of its measurements):"
    )
    groups: dict[str, list[float]] = {}
    for (source, dtype, _config), err in configs.items():
        dense = () if "expert_parallel" in _config else ("ALL dense",)
        for key in (source, f"ALL {dtype}", *dense, "ALL"):
            groups.setdefault(key, []).append(err)
    for key, errs in sorted(groups.items(), key=lambda kv: (kv[0].startswith("ALL"), kv[0])):
        geo = math.exp(sum(math.log(max(abs(e), 1e-9)) for e in errs) / len(errs))
        mean = sum(abs(e) for e in errs) / len(errs)
        worst = max(errs, key=abs)
        print(f"{key:18} configs {len(errs):3d}  geomean |error| {geo:6.1%}  mean {mean:6.1%}  worst {worst:+7.1%}")
    ran = [r for r in rows if r.predicted_s is not None]
    ooms = [r for r in ran if r.memory_gib > r.capacity_gib]
    print(f"\nrows itercast judges out of memory although they ran ({len(ooms)}):")
    for row in ooms:
        print(f"  {row.source:18} {row.label[:70]:70}  {row.memory_gib:.1f} GiB > {row.capacity_gib:.1f} GiB")
    tight = sorted(ran, key=lambda r: r.capacity_gib - r.memory_gib)[:3]
    room = (f"{r.label[:40]} {r.memory_gib:.1f} of {r.capacity_gib:.0f} GiB" for r in tight)
    print("least room left: " + "; ".join(room))


def distinct_configs(rows: list[Row]) -> dict[tuple[str, str, str], float]:
    """Signed error per distinct (source, model, GPUs, plan): the median measurement of its rows."""
    measured: dict[tuple[str, str, str], list[float]] = {}
    predicted: dict[tuple[str, str, str], float] = {}
    for row in rows:
        if row.predicted_s is None:
            continue
        key = (row.source, row.plan["dtype"], f"{row.model} {sorted(row.plan.items())} x{row.gpus}")
        measured.setdefault(key, []).append(row.measured_s)
        predicted[key] = row.predicted_s
    return {k: predicted[k] / statistics.median(v) - 1 for k, v in measured.items()}


def all_rows(data: Path) -> list[Row]:
    """Every row of the fitting table, in its printed order."""
    return dgxc_rows(data) + grok_rows(data) + nemo_rows(data) + megatron_rows(data) + llama3_rows(data)


def main() -> None:
    data = shared_data_dir()
    if data is None:
        print("no shared data (set ITERCAST_DATA or place ../shared/data beside the repo): nothing to validate")
        return
    rows = all_rows(data)
    run(rows)
    report(rows)


if __name__ == "__main__":
    main()
