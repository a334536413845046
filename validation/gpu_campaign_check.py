"""itercast's kernel, step and memory models against one GPU campaign (tools/gpu_campaign.py).

    python validation/gpu_campaign_check.py                                   # data/measured/h200_campaign
    python validation/gpu_campaign_check.py --data data/measured/h200_campaign_repeat

Per group of rows: n, the geomean of predicted / measured time (below 1: itercast too fast), its
smallest and largest ratio. Kernels are priced as itercast prices them in a step, on the system preset
of the GPU the campaign ran on (GPU_PRESETS), one GPU per node:
- gemm.csv: AnalyticCostModel.gemm_s(2·m·n·k) in the row's dtype (bf16, fp8), by model and tensor
  parallelism, and the square sweep;
- attention.csv: AnalyticCostModel.attention_s at the row's shape, the kernel named by its SDPA back
  end (cudnn → cudnn, flash → fa2: PyTorch's flash back end is FlashAttention-2), forward alone or
  forward plus a backward of 2.5× its FLOPs (costs/attention.py); causal FLOPs count S/2 keys a query
  (ModelConfig.causal_keys_per_query);
- grouped_gemm.csv: MoE experts' GEMMs as itercast prices them (one GEMM per local expert of its
  equal share of the FLOPs on the gemm curve, transformer_ops' expert_up / expert_down) against each
  way of running them (bmm, torch._grouped_mm over equal and skewed groups, a loop);
- moe_routing.csv: the kernels around the experts (tools/campaign/kernels.py run_moe_routing) against the
  elementwise bytes the MoE layer's ops of transformer_ops price them by (routing_bytes); the routed copies' sort, which
  itercast does not price, printed as measured;
- cross_entropy.csv: the logits GEMM (gemm_s) and the torch loss (memory_s over the bytes per logit of
  transformer_ops.cross_entropy_bytes with plan.cross_entropy torch, forward then backward, at
  CROSS_ENTROPY_BANDWIDTH_SHARE of the elementwise bandwidth: fitted on these rows since session 45, so the
  loss's figure is in sample, 0.854 before);
- training_steps.csv: `predict` of the same Llama-style job on one GPU, as PyTorch ran it (fp32
  weights under bf16 autocast, PyTorch's own kernels one by one, F.cross_entropy on fp32 logits:
  plan main_params fp32_weights, pointwise_kernels eager, cross_entropy torch; SDPA chose cuDNN);
- traces/*.kineto.json.gz: the optimizer step (PyTorch's fused AdamW, its multi_tensor_apply kernels,
  the median over the traced steps) against memory_s("optimizer") of transformer.optimizer_step_bytes
  (fp32 weights, gradients and moments: 28 bytes a parameter): in sample, the optimizer curve's ceiling
  is fitted on these steps (tools/fit_efficiency_curves.py h200_adam_efficiency);
- memory.csv: estimate_memory of those jobs against the allocator's peak (max_allocated), the whole
  device's use after the step (device_used) and the activations held after the forward.
- embedding_bag.csv: the forward lookup (F.embedding_bag) as workloads/dlrm/embedding.embedding_seconds
  prices it without a calibration (on Hopper, the lookup model fitted to the H100 profile's lookups:
  builtin_lookup_model; elsewhere the rows read and pooled vectors written as memory traffic);
- dlrm_steps.csv: `predict` of the single-GPU DLRM steps (dlrm-dcnv2-criteo, rows capped, dot
  interaction, every table on the GPU, the measurement's own exchange: point_to_point) on the preset.
- launch_blocking.csv: per configuration run with CUDA_LAUNCH_BLOCKING=0 and =1 (tools/campaign/launch_blocking.py),
  the µs a blocking launch adds per kernel, and for the training steps `predict`'s blocking / async ratio of the
  same job (plan.cuda_launch_blocking: each kernel's host launch time added to its own).
Then the sustained GEMM run: TFLOP/s and SM clock over its windows.

Which side of the fitting/checking line: every row here was read on 2026-11-30 (session 17) before
any model change was decided from it, kernel rows as fitting data (the only kind a model change may
be decided from), whole steps and memory as a reading of the model as it stood at 6d0ff33.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from itercast import Job  # noqa: E402
from itercast.cli.shard_cmds import load_dlrm  # noqa: E402
from itercast.costs.analytic import AnalyticCostModel  # noqa: E402
from itercast.costs.attention import AttentionShape  # noqa: E402
from itercast.data_paths import read_csv_rows  # noqa: E402
from itercast.memory import estimate_memory  # noqa: E402
from itercast.predict import predict, predict_dlrm  # noqa: E402
from itercast.workloads.dlrm.config import DLRMJob, EmbeddingTable, Shard  # noqa: E402
from itercast.workloads.dlrm.embedding import (  # noqa: E402
    builtin_update_model,
    embedding_seconds,
    index_stats,
    shard_work,
    update_seconds,
)
from itercast.workloads.transformer import optimizer_step_bytes  # noqa: E402
from itercast.workloads.transformer_ops import (  # noqa: E402
    CROSS_ENTROPY_BANDWIDTH_SHARE,
    cross_entropy_bytes,
    layer_forward,
)

#: the system preset of each GPU a campaign may have run on (torch's device name → preset)
GPU_PRESETS = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "dgx-h100", "NVIDIA A100-SXM4-80GB": "dgx-a100"}
#: SDPA back end → PlanConfig.attention_kernel (PyTorch's flash back end is FlashAttention-2)
ATTENTION_KERNEL = {"cudnn": "cudnn", "flash": "fa2"}
#: how the campaign's steps ran, in itercast's plan fields (tools/campaign/training.py Trainer)
EAGER_AUTOCAST = {"main_params": "fp32_weights", "pointwise_kernels": "eager", "cross_entropy": "torch"}
BACKWARD_FLOPS = 2.5  # a fused attention backward's FLOPs over its forward's (FlashAttention-2 §3.2)


def campaign_preset(folder: Path) -> str:
    """The system preset of the GPU named by the folder's first run record."""
    runs = sorted(folder.glob("run_*.json"))
    if not runs:
        raise SystemExit(f"{folder}: expected run_*.json (a tools/gpu_campaign.py output folder), found none")
    gpu = json.loads(runs[0].read_text())["machine"].get("gpu", "")
    if gpu not in GPU_PRESETS:
        raise SystemExit(f"{runs[0]}: machine.gpu: expected one of {', '.join(GPU_PRESETS)}, got {gpu!r}")
    return GPU_PRESETS[gpu]


def one_gpu_job(preset: str, row: dict[str, str], plan: dict[str, Any] | None = None) -> Job:
    """The campaign's Llama-style model of `row` (training_steps.csv or memory.csv), one micro-batch
    of its batch, on one GPU of `preset`."""
    model = {"family": "llama", "num_layers": int(row["layers"]), "hidden_size": int(row["hidden"])}
    model |= {"num_attention_heads": int(row["heads"]), "num_query_groups": int(row["kv_heads"])}
    model |= {"ffn_hidden_size": int(row["ffn"]), "vocab_size": int(row["vocab"]), "seq_length": int(row["seq"])}
    batch = int(row["batch"])
    plan = {"micro_batch_size": batch, "global_batch_size": batch, **EAGER_AUTOCAST, **(plan or {})}
    return Job.from_dicts(model, plan, {"preset": preset, "node": {"gpus_per_node": 1}})


def gemm_flops(row: dict[str, str]) -> float:
    """2·m·n·k of a gemm.csv row."""
    return 2.0 * int(row["m"]) * int(row["n"]) * int(row["k"])


def attention_forward_flops(row: dict[str, str]) -> float:
    """QKᵀ and AV FLOPs of an attention.csv row's forward: 4·d per query-key score, batch · heads ·
    seq queries each meeting seq keys, or seq/2 under a causal mask."""
    seq = int(row["seq"])
    keys = seq / 2 if row["causal"] == "True" else seq
    return 4.0 * int(row["batch"]) * int(row["heads"]) * seq * keys * int(row["head_dim"])


def ratio_summary(ratios: list[float]) -> str:
    """n, geomean, min and max of predicted / measured, and per configuration the mean |error| and the
    worst error (signed: negative too fast)."""
    geo = math.exp(statistics.fmean(math.log(r) for r in ratios))
    mean_abs = statistics.fmean(abs(r - 1) for r in ratios)
    worst = max(ratios, key=lambda r: abs(r - 1)) - 1
    return (
        f"n {len(ratios):4d}  geomean {geo:.3f}  min {min(ratios):.2f}  max {max(ratios):.2f}  "
        f"mean |error| {mean_abs:6.1%}  worst {worst:+.1%}"
    )


def gemm_ratios(rows: list[dict[str, str]], preset: str) -> dict[str, list[float]]:
    """Predicted / measured per (dtype, model[/tp]) group of gemm.csv's ok rows."""
    system = one_gpu_job(preset, _TINY).system
    costs = {dt: AnalyticCostModel(system, dt) for dt in ("bf16", "fp8")}
    out: dict[str, list[float]] = {}
    for r in rows:
        if r["status"] != "ok":
            continue
        pred = float(costs[r["dtype"]].gemm_s(gemm_flops(r)))
        group = r["model"] if r["model"] == "square" else f"{r['model']}/tp{r['tp']}"
        out.setdefault(f"{r['dtype']} {group}", []).append(pred / (float(r["median_ms"]) * 1e-3))
    return out


def attention_ratios(rows: list[dict[str, str]], preset: str) -> dict[str, list[float]]:
    """Predicted / measured per (back end, pass, causal, head size) of attention.csv's ok rows."""
    costs = AnalyticCostModel(one_gpu_job(preset, _TINY).system, "bf16")
    out: dict[str, list[float]] = {}
    for r in rows:
        if r["status"] != "ok" or r["backend"] not in ATTENTION_KERNEL:
            continue
        problems, d, causal = int(r["batch"]) * int(r["heads"]), int(r["head_dim"]), r["causal"] == "True"
        shape = AttentionShape(problems, d, causal, kernel=ATTENTION_KERNEL[r["backend"]])
        f = attention_forward_flops(r)
        pred = float(costs.attention_s(f, shape))
        if r["pass"] == "fwd_bwd":
            pred += float(costs.attention_s(BACKWARD_FLOPS * f, replace(shape, backward=True)))
        key = f"{r['backend']} {r['pass']} {'causal' if r['causal'] == 'True' else 'full'} d{r['head_dim']}"
        out.setdefault(key, []).append(pred / (float(r["median_ms"]) * 1e-3))
    return out


def grouped_gemm_ratios(rows: list[dict[str, str]], preset: str) -> dict[str, list[float]]:
    """Predicted / measured per method of grouped_gemm.csv's ok rows: experts × gemm_s(FLOPs / experts)."""
    costs = AnalyticCostModel(one_gpu_job(preset, _TINY).system, "bf16")
    out: dict[str, list[float]] = {}
    for r in rows:
        if r["status"] != "ok":
            continue
        experts, flops = int(r["experts"]), 2.0 * int(r["tokens"]) * int(r["k"]) * int(r["n"])
        pred = experts * float(costs.gemm_s(flops / experts))
        out.setdefault(r["method"], []).append(pred / (float(r["median_ms"]) * 1e-3))
    return out


def routing_bytes(row: dict[str, str], preset: str) -> float | None:
    """HBM bytes itercast prices for a moe_routing.csv op: the ops of transformer_ops.layer_forward's MoE layer of
    the row's size (n tokens of h bf16 values, E experts, k a token; one GPU, no expert parallelism) that run it:
    router_topk (the fp32 scores' softmax and top-k), moe_permute forward (the routed rows' gather) and backward
    (`backward_amount`), moe_unpermute (their weighted scatter-add). None for the routed copies' sort, which
    itercast does not price."""
    names = {"softmax_topk": "router_topk", "permute_fwd": "moe_permute", "permute_bwd": "moe_permute"}
    names |= {"unpermute_fwd": "moe_unpermute"}
    if row["op"] not in names:
        return None
    h, experts = int(row["hidden"]), int(row["experts"])
    model = {"family": "llama", "num_layers": 1, "hidden_size": h, "num_attention_heads": max(1, h // 128)}
    model |= {"num_experts": experts, "moe_top_k": int(row["top_k"]), "seq_length": int(row["tokens"])}
    job = Job.from_dicts(model, {"dtype": "bf16"}, {"preset": preset, "node": {"gpus_per_node": 1}})
    (op,) = [o for o in layer_forward(job.model, job.plan, moe=True) if o.name == names[row["op"]]]
    return op.backward_amount if row["op"] == "permute_bwd" else op.amount


def routing_ratios(rows: list[dict[str, str]], preset: str) -> dict[str, list[float]]:
    """Predicted / measured of moe_routing.csv's priced kernels: memory_s("elementwise", routing_bytes)."""
    costs = AnalyticCostModel(one_gpu_job(preset, _TINY).system, "bf16")
    out: dict[str, list[float]] = {}
    for r in rows:
        if r["status"] == "ok" and (nbytes := routing_bytes(r, preset)) is not None:
            pred = float(costs.memory_s("elementwise", nbytes))
            out.setdefault(r["op"], []).append(pred / (float(r["median_ms"]) * 1e-3))
    return out


def cross_entropy_ratios(rows: list[dict[str, str]], preset: str) -> dict[str, list[float]]:
    """Predicted / measured of the logits GEMM forward and the fp32 loss forward and backward."""
    job = one_gpu_job(preset, _TINY)
    costs = AnalyticCostModel(job.system, "bf16")
    fwd_b, bwd_b = cross_entropy_bytes(job.plan)  # EAGER_AUTOCAST: plan.cross_entropy torch
    out: dict[str, list[float]] = {}
    for r in rows:
        if r["status"] != "ok" or r["op"] not in ("logits_fwd", "ce_fp32_fwd_bwd"):
            continue
        logits = int(r["tokens"]) * int(r["vocab"])
        if r["op"] == "logits_fwd":
            pred = float(costs.gemm_s(2.0 * logits * int(r["hidden"])))
        else:
            nbytes = [logits * b / CROSS_ENTROPY_BANDWIDTH_SHARE for b in (fwd_b, bwd_b)]  # fitted on these rows
            pred = float(sum(costs.memory_s("elementwise", b) for b in nbytes))
        out.setdefault(r["op"], []).append(pred / (float(r["median_ms"]) * 1e-3))
    return out


def launch_blocking_rows(rows: list[dict[str, str]], preset: str) -> list[tuple[str, str, str, str, str]]:
    """launch_blocking.csv's configurations measured in both modes: (config, async ms, blocking ms, µs a blocking
    launch adds per kernel: (blocking − async) / the async run's kernel count, itercast's blocking / async ratio
    of the step configurations: `predict` of the same job with plan.cuda_launch_blocking, whose host time per
    launch is the preset's kernel_launch_overhead_s) as printed; '' where a figure does not apply."""
    by = {(r["config"], r["cuda_launch_blocking"]): r for r in rows if r["status"] == "ok"}
    out = []
    for config in dict.fromkeys(c for c, _ in by):
        if (config, "0") not in by or (config, "1") not in by:
            continue
        plain, blocking = by[config, "0"], by[config, "1"]
        a_ms, b_ms = float(plain["median_ms"]), float(blocking["median_ms"])
        added = f"{(b_ms - a_ms) * 1e3 / int(plain['ops']):.2f}" if plain["ops"] else ""
        predicted = ""
        if plain.get("layers"):
            jobs = [one_gpu_job(preset, plain, {"cuda_launch_blocking": b}) for b in (False, True)]
            predicted = f"{predict(jobs[1]).step_time_s / predict(jobs[0]).step_time_s:.3f}"
        out.append((config, f"{a_ms:.3f}", f"{b_ms:.3f}", added, predicted))
    return out


def step_rows(rows: list[dict[str, str]], preset: str) -> list[tuple[str, float, float, dict[str, float]]]:
    """(config, predicted ms, measured median ms, predicted ms per family) of training_steps.csv."""
    out = []
    for r in rows:
        if r["status"] != "ok":
            continue
        p = predict(one_gpu_job(preset, r))
        families = {k: round(v * 1e3, 2) for k, v in p.family_time_s.items()}
        out.append((r["config"], p.step_time_s * 1e3, float(r["median_ms"]), families))
    return out


#: kernels of one optimizer step are closer together than this; consecutive steps' are farther apart
STEP_GAP_US = 5000.0


def _trace_kernels(trace: Path) -> list[dict]:
    with gzip.open(trace, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    return sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])


def _optimizer_groups(kernels: list[dict]) -> list[tuple[float, float, float]]:
    """(first start µs, last end µs, busy seconds) of each traced step's fused AdamW kernels (names with
    multi_tensor_apply), the kernels split into steps where more than STEP_GAP_US separates two of them."""
    groups: list[tuple[float, float, float]] = []
    end = -math.inf
    for k in kernels:
        if "multi_tensor_apply" not in k.get("name", ""):
            continue
        if k["ts"] - end > STEP_GAP_US:
            groups.append((k["ts"], k["ts"], 0.0))
        first, _, busy = groups[-1]
        end = k["ts"] + k["dur"]
        groups[-1] = (first, end, busy + k["dur"] * 1e-6)
    return groups


def optimizer_kernel_s(trace: Path) -> list[float]:
    """Seconds of each traced step's fused AdamW kernels (_optimizer_groups)."""
    return [busy for _, _, busy in _optimizer_groups(_trace_kernels(trace))]


def kernel_family(name: str) -> str:
    """A kernel's family by its name: optimizer (multi_tensor_apply), gemm (cuBLAS nvjet, CUTLASS, xmma
    GEMMs), attention (cuDNN SDPA, flash, fmha), else memory (the memory-bound rest: elementwise, norms,
    casts, copies, the loss)."""
    if "multi_tensor_apply" in name:
        return "optimizer"
    if any(s in name for s in ("nvjet", "gemm", "cutlass", "xmma")):
        return "gemm"
    if any(s in name for s in ("sdpa", "flash", "fmha", "cudnn")):
        return "attention"
    return "memory"


def step_family_ms(trace: Path) -> dict[str, float]:
    """Milliseconds of kernels per kernel_family in the traced steps, the median over the whole steps
    (each from the end of one optimizer step to the end of the next)."""
    kernels = _trace_kernels(trace)
    ends = [end for _, end, _ in _optimizer_groups(kernels)]
    steps = []
    for a, b in itertools.pairwise(ends):
        ms: dict[str, float] = dict.fromkeys(("gemm", "attention", "optimizer", "memory"), 0.0)
        for k in kernels:
            if a <= k["ts"] < b:
                ms[kernel_family(k["name"])] += k["dur"] * 1e-3
        steps.append(ms)
    return {f: statistics.median(s[f] for s in steps) for f in ("gemm", "attention", "optimizer", "memory")}


def optimizer_rows(folder: Path, rows: list[dict[str, str]], preset: str) -> list[tuple[str, float, float]]:
    """(config, predicted ms, measured median ms) of the optimizer step of each traced configuration."""
    out = []
    for r in rows:
        if r["status"] != "ok" or not (folder / r["trace"]).exists():
            continue
        job = one_gpu_job(preset, r)
        nbytes = optimizer_step_bytes(job, int(r["params"]))
        pred = float(AnalyticCostModel(job.system, "bf16").memory_s("optimizer", nbytes))
        # the first group can be a partial step's (the profiler's warm-up ends mid-step): the median
        out.append((r["config"], pred * 1e3, statistics.median(optimizer_kernel_s(folder / r["trace"])) * 1e3))
    return out


def step_family_rows(
    folder: Path, rows: list[dict[str, str]], preset: str
) -> list[tuple[str, dict[str, float], dict[str, float]]]:
    """(config, measured ms, predicted ms) per kernel_family of each traced configuration: measured from
    its trace (step_family_ms), predicted from `predict`'s step (gemm and attention as its families,
    the optimizer step on the optimizer curve, memory the rest of the step)."""
    out = []
    for r in rows:
        if r["status"] != "ok" or not (folder / r["trace"]).exists():
            continue
        job = one_gpu_job(preset, r)
        p = predict(job)
        opt_s = float(
            AnalyticCostModel(job.system, "bf16").memory_s("optimizer", optimizer_step_bytes(job, int(r["params"])))
        )
        gemm_s, att_s = p.family_time_s.get("gemm", 0.0), p.family_time_s.get("attention", 0.0)
        pred = {
            "gemm": gemm_s,
            "attention": att_s,
            "optimizer": opt_s,
            "memory": p.step_time_s - gemm_s - att_s - opt_s,
        }
        out.append((r["config"], step_family_ms(folder / r["trace"]), {k: v * 1e3 for k, v in pred.items()}))
    return out


def embedding_ratios(rows: list[dict[str, str]], preset: str) -> dict[str, list[float]]:
    """Predicted / measured of embedding_bag.csv's forward rows (out of sample: the lookup model was fitted on
    the H100's) and its eager update rows (in sample: builtin_update_model was fitted on these), by index
    distribution and pooling."""
    costs = AnalyticCostModel(one_gpu_job(preset, _TINY).system, "fp32")
    update = builtin_update_model(costs.system.gpu.name)
    out: dict[str, list[float]] = {}
    for r in rows:
        if r["status"] != "ok" or r["op"] not in ("fwd", "update") or (r["op"] == "update" and update is None):
            continue
        zipf = 1.05 if r["distribution"] == "zipf" else 0.0  # the campaign's Zipf exponent (op_model.ZIPF_ALPHA)
        table = EmbeddingTable(
            name="t",
            num_rows=int(r["rows"]),
            embedding_dim=int(r["dim"]),
            pooling_factor=float(r["pooling"]),
            zipf_alpha=zipf,
        )
        work = shard_work(table, Shard("table_wise", (0,)), 0, 1, int(r["bags"]))
        assert work is not None
        if r["op"] == "fwd":
            pred = embedding_seconds(costs, table, work)[0]
        else:
            assert update is not None
            pred = update_seconds(update, work, index_stats(table, work))
        key = f"{r['op']} {r['distribution']} pooling {r['pooling']}"
        out.setdefault(key, []).append(pred / (float(r["median_ms"]) * 1e-3))
    return out


def dlrm_step_rows(rows: list[dict[str, str]], preset: str) -> list[tuple[str, float, float, dict[str, float]]]:
    """(batch and skew, predicted ms, measured ms, predicted ms per family) of dlrm_steps.csv."""
    base = load_dlrm("dlrm-dcnv2-criteo")
    out = []
    for r in rows:
        if r["status"] != "ok":
            continue
        cap, alpha = int(r["row_cap"]), float(r["zipf_alpha"])
        tables = [t.model_copy(update={"num_rows": min(t.num_rows, cap), "zipf_alpha": alpha}) for t in base.tables]
        model = base.model_dump(exclude={"name"}) | {"interaction": "dot", "exchange": "point_to_point"}
        model["tables"] = [t.model_dump() for t in tables]
        plan = {
            "batch_per_rank": int(r["batch"]),
            "sharding": {t.name: {"strategy": "table_wise", "ranks": [0]} for t in tables},
        }
        p = predict_dlrm(DLRMJob.from_dicts(model, plan, {"preset": preset, "node": {"gpus_per_node": 1}}))
        families = {k: round(v * 1e3, 2) for k, v in p.family_time_s.items()}
        out.append((f"batch {r['batch']} zipf {alpha:g}", p.step_time_s * 1e3, float(r["median_ms"]), families))
    return out


def memory_plan(row: dict[str, str]) -> dict[str, Any]:
    """A memory.csv row's step configuration in plan fields (recompute, dtype, attention back end)."""
    plan: dict[str, Any] = {}
    if row["recompute"] == "True":
        plan["recompute"] = "full"
    if row["dtype"] == "fp32":  # fp32 training: the weights are the optimizer's (no autocast)
        plan |= {"dtype": "fp32", "main_params": "fp32"}
    # SDPA's flash and cuDNN kernels take 16-bit inputs only and its memory-efficient one refuses grouped
    # keys (the campaign's own warnings: "both fused kernels require query, key and value to have the
    # same num_heads"), so fp32 with GQA runs the math back end, as math_attention does by choice
    if row["attention"] == "math" or (row["dtype"] == "fp32" and row["kv_heads"] != row["heads"]):
        plan["flash_attention"] = False
    return plan


def memory_rows(rows: list[dict[str, str]], preset: str) -> list[tuple[str, float, float, float, float, float]]:
    """(config, predicted total, measured device use, measured allocator peak, predicted and measured
    activations) in GiB, per memory.csv row."""
    out = []
    for r in rows:
        if r["status"] != "ok":
            continue
        m = estimate_memory(one_gpu_job(preset, r, memory_plan(r)))
        gib = 2.0**30
        out.append(
            (
                r["config"],
                m.total_bytes / gib,
                int(r["device_used_bytes"]) / gib,
                int(r["max_allocated_bytes"]) / gib,
                m.activations_bytes / gib,
                int(r["activation_bytes"]) / gib,
            )
        )
    return out


#: any row with a model: what the system and plan need when only the GPU's cost model is wanted
_TINY = dict(layers="1", hidden="64", heads="4", kv_heads="4", ffn="128", vocab="256", seq="32", batch="1")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT / "data" / "measured" / "h200_campaign")
    args = ap.parse_args(argv)
    folder: Path = args.data
    preset = campaign_preset(folder)
    print(f"{folder} (system preset {preset}); predicted / measured time")

    def table(title: str, groups: dict[str, list[float]]) -> None:
        print(f"\n{title}")
        for key in sorted(groups):
            print(f"  {key:32s} {ratio_summary(groups[key])}")
        every = [x for v in groups.values() for x in v]
        print(f"  {'all':32s} {ratio_summary(every)}")

    if (folder / "gemm.csv").exists():
        groups = gemm_ratios(read_csv_rows(folder / "gemm.csv"), preset)
        for dt in ("bf16", "fp8"):
            table(f"GEMMs, {dt}", {k.split(" ", 1)[1]: v for k, v in groups.items() if k.startswith(dt)})
    ratio_tables = (
        ("attention.csv", "fused attention (SDPA back end, pass, mask, head size)", attention_ratios),
        ("grouped_gemm.csv", "MoE experts' GEMMs (by how they ran)", grouped_gemm_ratios),
        ("moe_routing.csv", "MoE routing: top-k and the routed rows' permutation (elementwise bytes)", routing_ratios),
        ("cross_entropy.csv", "output layer (logits GEMM; fp32 loss forward and backward)", cross_entropy_ratios),
        (
            "embedding_bag.csv",
            "embedding lookups, forward, and the eager row-wise update (in sample), priced without a calibration",
            embedding_ratios,
        ),
    )
    for name, title, ratios in ratio_tables:
        if (folder / name).exists():
            table(title, ratios(read_csv_rows(folder / name), preset))

    if (folder / "moe_routing.csv").exists():
        sorts = [r for r in read_csv_rows(folder / "moe_routing.csv") if r["op"] == "sort" and r["status"] == "ok"]
        cells = ", ".join(f"{r['case']} {float(r['median_ms']):.3f}" for r in sorts)
        print(f"  not priced: the routed copies' sort, measured ms: {cells or 'none'}")

    def steps(title: str, rows: list[tuple[str, float, float, dict[str, float]]]) -> None:
        print(f"\n{title} (predicted ms, measured median ms, ratio; predicted families ms)")
        for label, pred, meas, families in rows:
            print(f"  {label:22s} {pred:8.2f} {meas:8.2f}  {pred / meas:.3f}  {families}")

    if (folder / "training_steps.csv").exists():
        steps("whole training steps on one GPU", step_rows(read_csv_rows(folder / "training_steps.csv"), preset))
        print("\noptimizer step, fused AdamW (predicted ms, measured median ms, ratio)")
        for config, pred, meas in optimizer_rows(folder, read_csv_rows(folder / "training_steps.csv"), preset):
            print(f"  {config:14s} {pred:8.3f} {meas:8.3f}  {pred / meas:.3f}")
        print("\nthe traced steps by kernel family (measured ms of the median step / predicted ms)")
        for config, meas_ms, pred_ms in step_family_rows(folder, read_csv_rows(folder / "training_steps.csv"), preset):
            cells = "  ".join(f"{f} {meas_ms[f]:6.2f} / {pred_ms[f]:6.2f}" for f in meas_ms)
            print(f"  {config:14s} {cells}")
    if (folder / "launch_blocking.csv").exists():
        launch_s = one_gpu_job(preset, _TINY).system.gpu.kernel_launch_overhead_s
        print(
            "\nCUDA_LAUNCH_BLOCKING=1 against =0 (measured ms async, blocking, ratio; µs added per kernel; itercast's "
            f"ratio, its blocking launch {launch_s * 1e6:.1f} µs of host each)"
        )
        for config, a_ms, b_ms, added, predicted in launch_blocking_rows(
            read_csv_rows(folder / "launch_blocking.csv"), preset
        ):
            ratio = float(b_ms) / float(a_ms)
            print(f"  {config:14s} {a_ms:>9s} {b_ms:>9s}  {ratio:.3f}  {added:>8s}  {predicted}")
    if (folder / "dlrm_steps.csv").exists():
        steps("single-GPU DLRM steps", dlrm_step_rows(read_csv_rows(folder / "dlrm_steps.csv"), preset))
    if (folder / "memory.csv").exists():
        print("\nmemory, GiB (predicted total, measured device use, allocator peak; activations predicted, measured)")
        for config, total, used, peak, act_p, act_m in memory_rows(read_csv_rows(folder / "memory.csv"), preset):
            ratio = total / used
            print(f"  {config:24s} {total:6.2f} {used:6.2f} {peak:6.2f}  {ratio:.3f}   {act_p:6.2f} {act_m:6.2f}")
    if (folder / "gemm_sustained.csv").exists():
        windows = read_csv_rows(folder / "gemm_sustained.csv")
        for dtype in ("bf16", "fp8"):  # files from before the fp8 run have no dtype column: bf16 alone
            win = [w for w in windows if w.get("dtype", "bf16") == dtype]
            if not win:
                continue
            tf = [float(w["tflops"]) for w in win]
            mhz = [float(w["sm_mhz_mean"]) for w in win if w["sm_mhz_mean"]]
            watts = [float(w["power_w_mean"]) for w in win if w["power_w_mean"]]
            clocks = (
                f", SM clock median {statistics.median(mhz):.0f} MHz, power median {statistics.median(watts):.0f} W"
                if mhz and watts
                else " (no clock samples)"
            )
            print(
                f"\nsustained {dtype} GEMM: {len(win)} windows, median {statistics.median(tf):.0f} TFLOP/s "
                f"(min {min(tf):.0f}, max {max(tf):.0f}){clocks}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
