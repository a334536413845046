"""Attention kernels: fit and held-out errors of costs/attention.py on the transcribed benchmark tables;
FP8 row-wise GEMMs: the kernel data behind pricing them on the fp8 curve.

    python validation/kernel_tables.py        # reads data/published/kernels/*.csv (in the repo)

For each H100 kernel of the FlashAttention-3 paper's BF16 figures (cuDNN, FlashAttention-3,
FlashAttention-2: the three PlanConfig.attention_kernel names on Hopper) and each direction: the
mean |predicted / measured − 1| of kernel time in-sample, and fitted on 512/2K/8K tokens then
checked on 1K/4K/16K (a head-dim hold-out cannot be run: d / (d + d_half) needs both measured head
dims to be identified). Then each kernel's paper fit against another source's measurements of the
same kernel class (pytorch/benchmark commit tables: FlashAttention-3 and PyTorch SDPA's
FlashAttention-2 backend on H100), and the guess itercast used before (the bf16 GEMM curve ×
ATTENTION_VS_GEMM) on the paper's cuDNN bars. Then cuDNN 9.19 on an H200, held out (NVIDIA cudnn-frontend's
published sdpa_benchmark_training results: Llama, DeepSeek-V3 and GPT-OSS heads), priced as a step prices it.

Then FP8 GEMMs with row-wise scales (torchao float8 rowwise), data/published/kernels/
fp8_rowwise_gemm_h100.csv: per source, row-wise kernel / per-tensor cuBLAS time (the kernel TE and
torchao tensorwise run, and the fp8 curve's data) at the shapes both were measured, and the signed
error of the fitted fp8 and bf16 GEMM curves on every row. The rule, fixed before any step figure:
price rowwise GEMMs apart only if, on the row-wise kernels torchao runs today (FBGEMM's CUTLASS
kernel after its column-major change, PyTorch's retuned copy, cuBLAS), every ratio is >= 1 and their
geomean >= 1.05; then on the forward GEMM only, the one that runs the row-wise kernel (the file's
NOTES). Otherwise no model.

Then power-capped GPUs, data/published/kernels/power_limit_gemm.csv: per GPU family and power limit, the
bf16 rows' time ratios (the curve as fitted / measured), the rule of the file's NOTES (fixed before any
ratio was computed: every ratio < 1, max / min <= 1.15, geomean >= limit / nominal) and the fraction it
gives beside GPUSpec's POWER_LIMITS; then every row's signed error at nominal power and at the limit
(gpu.power_limit_w), the fp8 rows a held-out check of the one-clock assumption.

Then one node's all-reduce on A100 and V100, which have no NVLink SHARP (needs ../shared/data or
$ITERCAST_DATA): the H100 node's curve at their links against each GPU's own (own_all_reduce); and A100 sends
in one node, held out, on the H100 send curve (a100_sends).

Then the GEMM curve's form (needs ../shared/data or $ITERCAST_DATA; skipped without): per source of
measured GEMMs (OpenXLA's autotuned H100 table, vidur's PyTorch cuBLAS H100 projections, and held out
vidur's A100 projections and the cuBLASLt A100 fp16 and H100 fp8 tables) the mean |error|, max |error| and
mean log error of the fitted curve in FLOPs (costs/curves.json) beside a shape-aware alternative fitted on
the same rows with the same weights: cuBLAS-like tiles (128×256, 256×128, 128×128, 64×128, 128×64, 64×64,
the best of them) in waves over the GPU's SMs at one efficiency, an HBM roofline and a latency. On
2026-11-29 it fit every source better on the mean, held-out A100 included, but not on the worst row (XLA:
97% against the FLOPs curve's 30%), and was not adopted: it prices training-sized GEMMs faster than the
FLOPs curve (fp8 most) where the fitting step table is already too fast (measured with it patched into
pass_cost, fp8's latency pinned to bf16's as the fitted curves do, fp8 efficiency 0.681: 6.3% → 9.2%
geomean, fp8 4.4% → 9.7%, bf16 8.8% unchanged). The kernel tables do not explain the steps' slowness; a
whole-step measurement on a GPU has to.

Last, MoE expert GEMMs (data/published/kernels/moe_grouped_gemm_h100.csv, in the repo): Qwen3-30B-A3B's expert up_proj
as one grouped GEMM on an H100, 128 experts of 512 rows, forward and backward, five implementations, against the price
a step gives those experts (one GEMM per expert on the FLOPs curve, each with its latency). A check, not a fit: on
2026-12-03 it priced them 1.35-1.85x slower than measured (0.98x for cuBLAS's batched kernel), the per-expert GEMM's
fixed latency (5.3 us x 384 GEMMs, 2.0 ms) about the gap; one shape from one source, so no model was changed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.config.job import Job, parse_section
from itercast.config.system import POWER_LIMITS
from itercast.costs.analytic import AnalyticCostModel
from itercast.costs.attention import AttentionShape
from itercast.costs.fitting import attention_points, attention_times_s, fit_latency_curve, mean_abs_err
from itercast.data_paths import read_csv_rows, shared_data_dir

KERNELS = Path(__file__).resolve().parents[1] / "data" / "published" / "kernels"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from fit_efficiency_curves import (  # noqa: E402
    A100_BF16_PEAK,
    H100_BF16_PEAK,
    H100_FP8_PEAK,
    HBM,
    GemmRows,
    cublaslt_gemms,
    fit_attention_kernel,
    fp8_cublas_h100,
    fp8_kernel_seconds,
    vidur_gemms,
    xla_gemms,
)

EVEN = {"512", "2048", "8192"}
#: row-wise kernels of fp8_rowwise_gemm_h100.csv that torchao's rowwise recipe can run today (the rule)
CURRENT_ROWWISE = {"fbgemm_cutlass", "cublas", "vllm_cutlass"}


def main() -> None:
    paper = read_csv_rows(KERNELS / "attention_fa3_paper_h100.csv")
    other = read_csv_rows(KERNELS / "attention_pytorch_benchmark_h100.csv")
    costs = AnalyticCostModel(Job.from_presets("llama3-8b", "dgx-h100").system, "bf16")
    alpha_s = costs.gemm_alpha_s
    print(f"{'kernel':8} {'dir':4} {'points':>6} {'in-sample':>10} {'alt. seqlens':>13} {'alt. max':>9}")
    fits = {}
    for kernel in ("cudnn", "fa3", "fa2"):
        fits[kernel] = fit = fit_attention_kernel(paper, kernel, H100_BF16_PEAK, alpha_s)
        half = fit_attention_kernel([r for r in paper if r["seqlen"] in EVEN], kernel, H100_BF16_PEAK, alpha_s)
        for direction in ("fwd", "bwd"):
            rows = [r for r in paper if r["kernel"] == kernel and r["direction"] == direction]
            held = attention_points([r for r in rows if r["seqlen"] not in EVEN])
            held_err = np.abs(attention_times_s(half[direction], held, H100_BF16_PEAK) / held.seconds - 1)
            print(
                f"{kernel:8} {direction:4} {len(rows):>6} {fit[direction]['fit_mean_abs_err']:>10.1%} "
                f"{held_err.mean():>13.1%} {held_err.max():>9.1%}"
            )
    print("\nheld-out source (pytorch/benchmark commit tables), the paper's fit of the kernel class:")
    for kernel, fitted_as in (("fa3", "fa3"), ("sdpa", "fa2")):
        rows = [r for r in other if r["kernel"] == kernel]
        points = attention_points(rows)
        signed = attention_times_s(fits[fitted_as]["fwd"], points, H100_BF16_PEAK) / points.seconds - 1
        err = np.abs(signed)
        print(
            f"  {kernel:5} fwd {len(rows):>2} rows  by the {fitted_as} fit: mean |error| {err.mean():.1%}, "
            f"max {err.max():.1%}, mean signed {signed.mean():+.1%}"
        )
    cudnn = [r for r in paper if r["kernel"] == "cudnn"]
    points = attention_points(cudnn)
    guess = np.array([float(costs.attention_s(f)) for f in points.flops])
    print(f"\nthe previous guess (GEMM curve × 0.75) on the {len(cudnn)} cuDNN bars: mean |error| ", end="")
    print(f"{mean_abs_err(guess, points.seconds):.1%}; by direction:")
    for direction in ("fwd", "bwd"):
        sel = np.array([r["direction"] == direction for r in cudnn])
        print(f"  {direction}: {mean_abs_err(guess[sel], points.seconds[sel]):.1%} (signed mean ", end="")
        print(f"{np.mean(guess[sel] / points.seconds[sel] - 1):+.1%})")
    cudnn_frontend_h200()
    fp8_rowwise()
    fp8_refit()
    power_limits()
    gemm_shapes()
    own_gemm_curves()
    own_all_reduce()
    a100_sends()
    mesh_collectives()
    moe_grouped_gemms()


def cudnn_frontend_h200() -> None:
    """cuDNN 9.19's fused attention on an H200 (NVIDIA's cudnn-frontend sdpa_benchmark_training results,
    data/published/kernels/attention_cudnn_frontend_h200.csv: Llama 3.1 8B/70B heads, head 128, causal or not;
    DeepSeek-V3's MLA, head 192/128, causal, deterministic backward; GPT-OSS's GQA, head 64, a 1,024-token window),
    held out: priced as a step prices Megatron-Core's attention (the cuDNN fit, the query-key pairs the mask lets
    through by ModelConfig.causal_keys_per_query, H100 and H200 on one fit), each row's priced / measured time."""
    rows = read_csv_rows(KERNELS / "attention_cudnn_frontend_h200.csv")
    costs = AnalyticCostModel(Job.from_presets("llama3-8b", "h200").system, "bf16")
    print("\ncuDNN 9.19 on an H200 (cudnn-frontend's published results), held out: priced / measured kernel time")
    ratios: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        s, window = int(r["seqlen"]), int(r["sliding_window"] or 0)
        causal = r["attn_mask"] != "no_mask"
        if window:  # GPT-OSS's shape at this sequence and window: W - W²/2S keys a query
            model = parse_section("model", {"preset": "gpt-oss-20b", "seq_length": s, "sliding_window": window})
            keys = model.causal_keys_per_query(windowed=True)  # type: ignore[attr-defined]
        else:
            keys = s / 2 if causal else s
        heads, d = int(r["batch"]) * int(r["q_heads"]), (int(r["head_dim_qk"]) + int(r["head_dim_vo"])) / 2
        flops = 4 * d * heads * s * keys  # 4·d per query-key score (transformer_ops._core_attention)
        for direction, amount, measured_ms in (("fwd", flops, r["fwd_ms"]), ("bwd", 2.5 * flops, r["bwd_ms"])):
            shape = AttentionShape(heads, d, causal, backward=direction == "bwd")
            ratio = float(costs.attention_s(amount, shape)) * 1e3 / float(measured_ms)
            ratios.setdefault((f"{r['model']} {r['attn_mask']}", direction), []).append(ratio)
    for (group, direction), found in [*ratios.items(), (("all", "both"), [x for v in ratios.values() for x in v])]:
        err = np.abs(np.array(found) - 1)
        print(
            f"  {group:18} {direction:4}  {len(found):>2} rows  priced / measured {min(found):.2f}-{max(found):.2f}, "
            f"mean |error| {err.mean():.1%}, max {err.max():.1%}"
        )


def _flops(row: dict[str, str]) -> float:
    return 2.0 * float(row["m"]) * float(row["n"]) * float(row["k"])


def fp8_rowwise() -> None:
    """Row-wise / per-tensor FP8 kernel time per source and shape, and the fitted GEMM curves' errors."""
    rows = read_csv_rows(KERNELS / "fp8_rowwise_gemm_h100.csv")
    print("\nFP8 row-wise scaling (fp8_rowwise_gemm_h100.csv): row-wise / per-tensor cuBLAS time, same source, shape")
    current = []
    for row in (r for r in rows if r["scaling"] == "rowwise"):
        shape = (row["source"], row["m"], row["n"], row["k"])
        for ref in (r for r in rows if r["kernel"] == "cublas" and r["scaling"] == "tensorwise"):
            if (ref["source"], ref["m"], ref["n"], ref["k"]) != shape:
                continue
            ratio = fp8_kernel_seconds(row) / fp8_kernel_seconds(ref)
            if row["kernel"] in CURRENT_ROWWISE:
                current.append(ratio)
            print(f"  {row['kernel']:21} {row['m']:>5} x {row['n']:>5} x {row['k']:>5}  x{ratio:.3f}")
    geomean = float(np.exp(np.mean(np.log(current))))
    add = min(current) >= 1.0 and geomean >= 1.05
    print(f"  current row-wise kernels: {len(current)} ratios, min x{min(current):.3f}, geomean x{geomean:.3f}", end="")
    print(f" -> {'a rowwise model' if add else 'no rowwise model'} (rule: all >= 1 and geomean >= 1.05)")
    system = Job.from_presets("llama3-8b", "dgx-h100").system
    print("  fitted curves (dgx-h100) on the measured rows: signed error of predicted time")
    for dtype, scalings in (("fp8", ("tensorwise", "rowwise")), ("bf16", ("bf16",))):
        costs = AnalyticCostModel(system, dtype)
        for scaling in scalings:
            for kernel, gpu in sorted({(r["kernel"], r["gpu"]) for r in rows if r["scaling"] == scaling}):
                sel = [r for r in rows if (r["scaling"], r["kernel"], r["gpu"]) == (scaling, kernel, gpu)]
                err = [float(costs.gemm_s(_flops(r))) / fp8_kernel_seconds(r) - 1 for r in sel]
                print(f"    {dtype:4} curve on {scaling:10} {kernel:21} {gpu:9} {len(sel)} rows: ", end="")
                print(", ".join(f"{e:+.1%}" for e in err))


def fp8_refit() -> None:
    """The fp8 curve refitted on a second source (session 56, not adopted: fit_efficiency_curves.py's docstring):
    the Azure cuBLASLt table and the per-tensor cuBLAS kernels of fp8_rowwise_gemm_h100.csv, each file weighing the
    same, latency pinned as fitted; each curve's time / measured on both files and on the lent H200's fp8 GEMMs
    at training shapes (data/measured/h200_campaign/gemm.csv: torch._scaled_mm as Transformer Engine runs it,
    forward with fast accumulation, gradients without; held out), by pass."""
    from itercast.costs.curves import Curve, curves

    data = shared_data_dir()
    if data is None:
        print("\nfp8 refit: no shared data (set ITERCAST_DATA), skipped")
        return
    fitted = curves()["gemm"]["fp8"]
    azure, cublas = cublaslt_gemms(data, "fp8"), fp8_cublas_h100()
    both = azure + cublas
    weights = np.r_[np.full(len(azure.m), 1 / len(azure.m)), np.full(len(cublas.m), 1 / len(cublas.m))]
    refit = fit_latency_curve(both.flops, both.seconds, H100_FP8_PEAK, alpha_s=fitted["alpha_s"], weights=weights)
    campaign = [
        r
        for r in read_csv_rows(Path(__file__).resolve().parents[1] / "data/measured/h200_campaign/gemm.csv")
        if r["dtype"] == "fp8" and r["status"] == "ok" and r["model"] != "square"
    ]
    print("\nfp8 curve refitted on both H100 files (not adopted): geomean of priced / measured time")
    print(f"  {'curve':8} {'e_max':>6} {'log_half':>8} {'gamma':>6}  {'Azure':>6} {'cuBLAS':>6}", end="")
    print("".join(f" {'H200 ' + p:>12}" for p in ("fprop", "dgrad", "wgrad")))
    by_pass = {}  # the H200's (FLOPs, seconds) per pass
    for pas in ("fprop", "dgrad", "wgrad"):
        sel = [r for r in campaign if r["pass"] == pas]
        flops = np.array([2.0 * float(r["m"]) * float(r["n"]) * float(r["k"]) for r in sel])
        by_pass[pas] = flops, np.array([float(r["median_ms"]) * 1e-3 for r in sel])
    for name, fit in (("fitted", fitted), ("refit", refit)):
        c = Curve(fit["e_max"], fit["log_half"], fit["gamma"])
        tables = [(azure.flops, azure.seconds), (cublas.flops, cublas.seconds), *by_pass.values()]
        ratios = [np.exp(np.mean(np.log((fit["alpha_s"] + f / (H100_FP8_PEAK * c(f))) / t))) for f, t in tables]
        print(f"  {name:8} {fit['e_max']:6.3f} {fit['log_half']:8.2f} {fit['gamma']:6.2f}  ", end="")
        print(f"{ratios[0]:6.3f} {ratios[1]:6.3f}" + "".join(f" {r:12.3f}" for r in ratios[2:]))


def power_limits() -> None:
    """The rule on each capped family's bf16 rows, and every row's error without and with the cap."""
    rows = [r for r in read_csv_rows(KERNELS / "power_limit_gemm.csv") if r["gpu"] == "h100" and r["power_limit_w"]]
    system = Job.from_presets("llama3-8b", "dgx-h100").system
    nominal_w = POWER_LIMITS["H100-SXM"].nominal_w
    print("\npower-capped H100 (power_limit_gemm.csv): bf16 curve as fitted / measured time")
    for watts in sorted({float(r["power_limit_w"]) for r in rows}):
        capped = system.model_copy(update={"gpu": system.gpu.model_copy(update={"power_limit_w": watts})})
        errors = {}  # dtype: (kernel, signed errors of predicted time at nominal power, at the limit)
        for dtype in ("bf16", "fp8"):
            sel = [r for r in rows if float(r["power_limit_w"]) == watts and r["dtype"] == dtype]
            measured_s = np.array([float(r["milliseconds"]) * 1e-3 for r in sel])
            errors[dtype] = tuple(
                np.array([float(AnalyticCostModel(s, dtype).gemm_s(_flops(r))) for r in sel]) / measured_s - 1
                for s in (system, capped)
            )
        ratios = 1 + errors["bf16"][0]
        geomean, spread = float(np.exp(np.mean(np.log(ratios)))), float(ratios.max() / ratios.min())
        model = ratios.max() < 1.0 and spread <= 1.15 and geomean >= watts / nominal_w
        print(f"  {watts:g} W: ratios {', '.join(f'{x:.3f}' for x in ratios)}; max / min {spread:.3f}, ", end="")
        print(f"geomean {geomean:.3f} (>= {watts / nominal_w:.3f}?) -> {'a power model' if model else 'no model'}")
        print(f"  GPUSpec fraction at {watts:g} W: {capped.gpu.compute_throughput_fraction():.3f}; ", end="")
        print("signed error of predicted time, nominal -> capped:")
        for dtype, (before, after) in errors.items():
            role = "in-sample" if dtype == "bf16" else "held out"
            kernel = next(r["kernel"] for r in rows if r["dtype"] == dtype)
            print(f"    {dtype:4} {kernel:21} ({role}): ", end="")
            print(", ".join(f"{b:+.1%} -> {a:+.1%}" for b, a in zip(before, after, strict=True)), end="")
            print(f"; mean |error| {np.mean(np.abs(before)):.1%} -> {np.mean(np.abs(after)):.1%}")


#: CTA tiles (rows × columns of the output) a cuBLAS-like heuristic picks among for the shape-aware form
GEMM_TILES = ((128, 256), (256, 128), (128, 128), (64, 128), (128, 64), (64, 64))
#: (peak FLOP/s, SMs, HBM bytes/s) of the GPUs the GEMM tables measured (datasheets; fit_efficiency_curves)
GEMM_GPUS = {"h100": (H100_BF16_PEAK, 132, HBM["h100"]), "a100": (A100_BF16_PEAK, 108, HBM["a100"])}


def _waves_s(params: np.ndarray, rows: GemmRows, peak: float, sms: int, hbm: float) -> np.ndarray:
    """Seconds of `rows` in the shape-aware form: latency exp(params[0]) + the longer of the best tile's
    waves (ceil(tiles / SMs) waves of 2·tile·k FLOPs per SM at params[1] of the SM's peak) and the
    operands' and output's 2-byte HBM traffic at params[2] of the bandwidth."""
    best = np.full(len(rows.m), np.inf)
    for tm, tn in GEMM_TILES:
        waves = np.ceil(rows.b * np.ceil(rows.m / tm) * np.ceil(rows.n / tn) / sms)
        best = np.minimum(best, waves * 2 * tm * tn * rows.k / (peak / sms * params[1]))
    traffic_s = rows.b * (rows.m * rows.k + rows.k * rows.n + rows.m * rows.n) * 2 / (hbm * params[2])
    return np.exp(params[0]) + np.maximum(best, traffic_s)


def gemm_shapes() -> None:
    """The FLOPs curve beside the shape-aware form on every GEMM table (module docstring)."""
    from scipy.optimize import least_squares

    data = shared_data_dir()
    if data is None:
        print("\nGEMM curve form: no shared data (set ITERCAST_DATA), skipped")
        return
    xla, vidur = xla_gemms(data, "bf16xbf16->bf16"), vidur_gemms(data, "h100")
    tables: dict[str, tuple[GemmRows, str, float]] = {
        "xla h100 bf16 (fitted)": (xla, "h100", H100_BF16_PEAK),
        "vidur h100 bf16 (fitted)": (vidur, "h100", H100_BF16_PEAK),
        "vidur a100 bf16 (held out)": (vidur_gemms(data, "a100"), "a100", A100_BF16_PEAK),
    }
    for dtype, gpu, peak in (("fp16", "a100", A100_BF16_PEAK), ("fp8", "h100", H100_FP8_PEAK)):
        role = "held out" if dtype == "fp16" else "fitted apart"
        tables[f"cublasLt {gpu} {dtype} ({role})"] = (cublaslt_gemms(data, dtype), gpu, peak)
    both = xla + vidur
    weights = np.sqrt(np.r_[np.full(len(xla.m), 1 / len(xla.m)), np.full(len(vidur.m), 1 / len(vidur.m))])
    h100 = GEMM_GPUS["h100"]
    bounds = ([np.log(1e-7), 0.1, 0.1], [np.log(1e-4), 1.0, 1.0])
    x0 = [np.log(5e-6), 0.8, 0.8]
    bf16 = least_squares(lambda p: weights * np.log(_waves_s(p, both, *h100) / both.seconds), x0, bounds=bounds).x
    fp8_rows = tables["cublasLt h100 fp8 (fitted apart)"][0]
    fp8_gpu = (H100_FP8_PEAK, 132, HBM["h100"])
    fp8 = least_squares(lambda p: np.log(_waves_s(p, fp8_rows, *fp8_gpu) / fp8_rows.seconds), x0, bounds=bounds).x
    print(f"\nGEMM curve form: tiles in waves fitted, latency {np.exp(bf16[0]) * 1e6:.2f} us, bf16 efficiency ", end="")
    print(f"{bf16[1]:.3f} (HBM {bf16[2]:.3f}); fp8 {fp8[1]:.3f} (HBM {fp8[2]:.3f})")
    print(
        f"{'table':32} {'rows':>5}  {'FLOPs curve: mean |err| / max |err| / mean log err':>50}  {'tiles in waves':>30}"
    )
    system = Job.from_presets("llama3-8b", "dgx-h100").system
    for name, (rows, gpu, peak) in tables.items():
        costs = AnalyticCostModel(system, "fp8" if peak == H100_FP8_PEAK else "bf16")
        curve_s = costs.gemm_alpha_s + rows.flops / (peak * costs.gemm_curve(rows.flops))
        params, (_, sms, hbm) = (fp8 if peak == H100_FP8_PEAK else bf16), GEMM_GPUS[gpu]
        wave_s = _waves_s(params, rows, peak, sms, hbm)
        print(f"{name:32} {len(rows.m):>5}  ", end="")
        for predicted in (curve_s, wave_s):
            worst = np.max(np.abs(predicted / rows.seconds - 1))
            log_err = np.mean(np.log(predicted / rows.seconds))
            print(f"{mean_abs_err(predicted, rows.seconds):>18.1%} / {worst:6.1%} / {log_err:+.3f}", end="  ")
        print()


def own_gemm_curves() -> None:
    """Which GPUs need GEMM curves of their own: V100's (curves.json gemm_by_gpu: Alpa's dots, and for fp16
    DeepBench's training-shaped GEMMs too) against the H100 curve at V100's peak, and on DeepBench's V100 GEMMs
    against the fp16 curve fitted on Alpa's squares alone (until session 54); and the same curve form fitted on
    A100's own GEMMs (vidur's projections and the cuBLASLt fp16 table, each weighing the same), whose e_max
    beside the H100 curve's says whether A100 needs one."""
    from fit_efficiency_curves import ALPA_V100_DOTS, deepbench_v100_gemms, training_shaped

    from itercast.costs.curves import curve, curves
    from itercast.costs.fitting import fit_latency_curve

    data = shared_data_dir()
    if data is None:
        print("\nGEMM curves by GPU: no shared data (set ITERCAST_DATA), skipped")
        return
    shared = curves()["gemm"]
    v100 = Job.from_dicts({"preset": "gpt3-175b"}, {"dtype": "fp16"}, {"preset": "v100-p3.16xlarge"}).system
    dots = [r for r in read_csv_rows(data / "profiling" / "alpa_v100_p3.16xlarge_prof_db.csv") if r["op"] == "dot"]
    print("\nGEMM curves by GPU: Alpa's V100 dots (one per size), mean / max |error|, mean signed at n >= 2048")
    for key, (dtype, peak) in ALPA_V100_DOTS.items():
        sel = {r["x"]: r for r in dots if r["dtype"] == dtype and float(r["x"]) > 0}.values()
        flops, seconds = (np.array([float(r[c]) for r in sel]) for c in ("x", "time_s"))
        big = flops >= 2 * 2048**3
        h100 = shared[key]
        as_h100 = h100["alpha_s"] + flops / (peak * curve(h100)(flops))
        own = AnalyticCostModel(v100, "fp16" if key == "bf16" else "fp32").gemm_s(flops)
        for name, predicted in (("H100 curve", as_h100), ("V100's own", own)):
            signed = predicted[big] / seconds[big] - 1
            print(
                f"  {dtype} {len(flops):>3} sizes  {name:10} "
                f"{mean_abs_err(predicted, seconds):6.1%} / {np.max(np.abs(predicted / seconds - 1)):6.1%} / "
                f"{signed.mean():+6.1%}"
            )
    bench = deepbench_v100_gemms()
    training = training_shaped(bench)
    own = AnalyticCostModel(v100, "fp16").gemm_s(bench.flops)
    fp16 = [r for r in dots if r["dtype"] == "f16" and float(r["x"]) > 0]  # every row, as fit_gemm_v100 fits
    alpha_s, peak = curves()["gemm_by_gpu"]["V100"]["bf16"]["alpha_s"], ALPA_V100_DOTS["bf16"][1]
    squares = fit_latency_curve(  # the fp16 curve as fitted until session 54: Alpa's dots alone
        *(np.array([float(r[c]) for r in fp16]) for c in ("x", "time_s")), peak, alpha_s=alpha_s
    )
    alpa_only = alpha_s + bench.flops / (peak * curve(squares)(bench.flops))
    print("  DeepBench's V100 fp16 GEMMs (cuBLAS 10.1, DGX-1), geomean predicted / measured, mean / max |error|:")
    for name, keep in (("training shapes (fitted since session 54)", training), ("every row", np.ones_like(training))):
        for label, predicted in (("V100's own", own), ("squares only", alpa_only)):
            ratio = predicted[keep] / bench.seconds[keep]
            print(
                f"    {name:42} {int(keep.sum()):>3} rows  {label:12} {np.exp(np.log(ratio).mean()):.3f}  "
                f"{mean_abs_err(predicted[keep], bench.seconds[keep]):6.1%} / {np.max(np.abs(ratio - 1)):6.1%}"
            )
    cublaslt = cublaslt_gemms(data, "fp16")
    vidur = vidur_gemms(data, "a100")
    both = vidur + cublaslt
    weights = np.r_[np.full(len(vidur.m), 1 / len(vidur.m)), np.full(len(cublaslt.m), 1 / len(cublaslt.m))]
    a100 = fit_latency_curve(
        both.flops, both.seconds, A100_BF16_PEAK, alpha_s=shared["bf16"]["alpha_s"], weights=weights
    )
    print(
        f"  A100's own GEMMs fitted alike: e_max {a100['e_max']:.3f} (H100 curve {shared['bf16']['e_max']:.3f}), "
        f"mean |error| {a100['fit_mean_abs_err']:.1%}: no curve of its own"
    )


def own_all_reduce() -> None:
    """One node's all-reduce on GPUs without NVLink SHARP: the H100 node's curve (fitted with its in-switch
    reduction) at their links' bandwidth against each GPU's own curve (curves.json
    collectives.intra_node_by_gpu): A100 at 300 GB/s on vidur's DGX A100 medians (2, 4, 8 GPUs) and Azure's
    ND A100 v4 nccl-tests (8 GPUs); V100 on Alpa's p3.16xlarge all-reduces from 1 MiB less its harness's time
    (its all-reduce of 0 bytes, layout by layout), the 8-GPU group its curve was fitted on at 150 GB/s and, not
    fitted on, the groups of 2 and 4 (`stride` GPUs apart, several at once where the host holds them) at the links
    the hybrid cube mesh gives them (the preset's NodeSpec.group_bandwidth_bytes_per_s). Mean |error| from 1 MiB
    and mean signed error from 8 MB."""
    from itercast.costs.analytic import bus_bytes
    from itercast.costs.curves import curves
    from itercast.costs.fitting import collective_time_s
    from itercast.profile.importers import alpa_one_host_collectives

    data = shared_data_dir()
    if data is None:
        print("\nA100 and V100 all-reduce: no shared data (set ITERCAST_DATA), skipped")
        return
    a100: dict[str, list[tuple[int, float, float]]] = {f"vidur {n} GPUs": [] for n in (2, 4, 8)}
    for r in read_csv_rows(data / "kernels" / "vidur" / "network__a100_dgx__all_reduce.csv"):
        if r["devices_per_node"] == r["num_workers"]:
            n = int(r["num_workers"])
            a100[f"vidur {n} GPUs"].append((n, float(r["size"]), float(r["time_stats.all_reduce.median"]) * 1e-3))
    azure = read_csv_rows(data / "collectives" / "azure_ai_benchmarking_guide_allreduce_1node.csv")
    a100["azure 8 GPUs"] = [
        (
            8,
            float(r["bytes"]),
            float(bus_bytes("all_reduce", float(r["bytes"]), 8, 1)) / (float(r["A100_ND_v4_busbw_GBs"]) * 1e9),
        )
        for r in azure
    ]
    # Alpa's all-reduces from 1 MiB, less its harness's time (its all-reduce of 0 bytes, per group size and dtype)
    node = Job.from_dicts({"preset": "gpt3-175b"}, {"dtype": "fp16"}, {"preset": "v100-p3.16xlarge"}).system.node
    v100: dict[str, list[tuple[int, float, float]]] = {}
    links_of = {"A100": dict.fromkeys(a100, 300e9), "V100": {}}
    for k, stride, size, seconds in alpa_one_host_collectives(
        data / "profiling" / "alpa_v100_p3.16xlarge_prof_db.csv", 2**20, "all_reduce"
    ):
        key = "alpa 8 (fitted)" if k == 8 else f"alpa {k} stride {stride}"
        v100.setdefault(key, []).append((k, size, seconds))
        links_of["V100"][key] = node.group_bandwidth_bytes_per_s(k, stride)
    table = curves()["collectives"]
    for gpu, points in (("A100", a100), ("V100", v100)):
        fits = {
            "H100 curve": table["intra_node"]["all_reduce"],
            f"{gpu}'s own": table["intra_node_by_gpu"][gpu]["all_reduce"],
        }
        print(f"\n{gpu} one-node all-reduce: mean |error| from 1 MiB / mean signed from 8 MB")
        for source, rows in sorted(points.items()):
            links = links_of[gpu][source]
            n, size, seconds = (np.array(c, dtype=np.float64) for c in zip(*rows, strict=True))
            bus = np.array([float(bus_bytes("all_reduce", x, int(k), 1)) for k, x in zip(n, size, strict=True)])
            print(f"  {source:16} {links / 1e9:4.0f} GB/s {len(rows):>4} sizes", end="")
            full = 300e9 if gpu == "A100" else node.intra_node_bandwidth_bytes_per_s
            for name, fit in fits.items():
                signed = collective_time_s(fit, bus, 1, n, links, ramp_scale=full / links) / seconds - 1
                print(f"  {name} {np.mean(np.abs(signed)):6.1%} / {signed[size >= 8e6].mean():+6.1%}", end="")
            print()


def a100_sends() -> None:
    """Sends between two A100s of one node (vidur's DGX A100 send_recv medians, devices_per_node 2, 2 KB-67 MB), held
    out of every fit: priced by the dgx-a100 preset on the only send curve, vidur's H100 one, at the A100's 300 GB/s.
    Mean |error| over every size, mean signed from 8 MiB. Its sends across two nodes are left out: vidur's A100
    cluster reaches about 6 GB/s of bus bandwidth a GPU across nodes (its 2-node all-reduces), not a DGX A100's
    25 GB/s NICs, so they say nothing of the preset."""
    data = shared_data_dir()
    if data is None:
        print("\nA100 sends: no shared data (set ITERCAST_DATA), skipped")
        return
    costs = AnalyticCostModel(Job.from_presets("llama3-8b", "dgx-a100").system, "bf16")
    rows = read_csv_rows(data / "kernels" / "vidur" / "network__a100_dgx__send_recv.csv")
    one_node = [r for r in rows if r["devices_per_node"] == "2"]
    sent = [(float(r["size"]), float(r["time_stats.send_recv.median"]) * 1e-3) for r in one_node]
    size, seconds = (np.array(c) for c in zip(*sent, strict=True))
    signed = np.array([costs.p2p_s(x, False, 1) for x in size]) / seconds - 1
    print(
        f"\nA100 sends in one node (vidur's DGX A100, held out) on the H100 send curve at 300 GB/s: {len(sent)} sizes, "
        f"mean |error| {np.abs(signed).mean():.1%}, mean signed from 8 MiB {signed[size >= 2**23].mean():+.1%}"
    )


def mesh_collectives() -> None:
    """Every collective Alpa measured within one p3.16xlarge (2, 4 and 8 GPUs; groups `stride` GPUs apart, several
    at once where the host holds them), less its harness's 0-byte time, against the v100-p3.16xlarge preset's cost
    model, which prices a ring on the links its GPUs have to each other (NodeSpec.group_bandwidth_bytes_per_s) and an
    all-to-all on its exchanges with each peer (NodeSpec.alltoall_bandwidth_bytes_per_s). Mean signed and mean |error|
    from 8 MiB, and the worst size's signed error. Fitted on: the all-reduce of all 8 (curves.json V100); the
    all-to-alls of 2 GPUs (curves.json mesh_alltoall) and of GPUs 0, 2, 4 and 6 (the preset's host path); the
    all-gather and reduce-scatter run on the H100 node's curves. Held out: every other layout. Then a pipeline send
    (AnalyticCostModel.p2p_s, priced on a mesh as one exchange of a 2-GPU all-to-all) of half such an all-to-all's
    buffer against it, on the pairs 4 apart."""
    from itercast.config.job import load_system
    from itercast.hardware.topology import place_group
    from itercast.profile.importers import alpa_one_host_collectives

    data = shared_data_dir()
    if data is None:
        print("\np3.16xlarge collectives: no shared data (set ITERCAST_DATA), skipped")
        return
    costs = AnalyticCostModel(load_system("v100-p3.16xlarge"), "fp16")
    print("\np3.16xlarge collectives priced on the cube mesh's links: mean signed / mean |error| / worst from 8 MiB")
    for op in ("all_reduce", "all_gather", "reduce_scatter", "alltoall"):
        rows = alpa_one_host_collectives(data / "profiling" / "alpa_v100_p3.16xlarge_prof_db.csv", 2**23, op)
        for k, stride in sorted({(k, stride) for k, stride, _, _ in rows}):
            signed = np.array(
                [
                    costs.collective_s(op, size, place_group(k, stride, 8)) / seconds - 1
                    for n, st, size, seconds in rows
                    if (n, st) == (k, stride)
                ]
            )
            print(
                f"  {op:14} {k} GPUs {stride} apart {len(signed):>3} sizes  {signed.mean():+7.1%} / "
                f"{np.abs(signed).mean():6.1%} / {signed[np.argmax(np.abs(signed))]:+7.1%}"
            )
    # a 2-GPU all-to-all is one exchange each way: what a pipeline's send and receive of half its buffer do at once.
    # p2p_s prices the worst pair of the node at its stride: only 4 apart is every pair linked, as the measured
    # GPUs 0 and 4 are (1 and 2 apart, GPUs 3 and 4 and GPUs 2 and 4 have no link; no 2-GPU exchange without a link
    # was measured). vidur's H100 send curve on the pair's links had priced these 32% too fast (session 37).
    rows = alpa_one_host_collectives(data / "profiling" / "alpa_v100_p3.16xlarge_prof_db.csv", 2**23, "alltoall")
    signed = np.array([costs.p2p_s(n / 2, False, 4) / t - 1 for k, st, n, t in rows if (k, st) == (2, 4)])
    print(f"  p2p_s as the 2-GPU exchange, 4 apart {len(signed):>3} sizes  {signed.mean():+7.1%} / ", end="")
    print(f"{np.abs(signed).mean():6.1%} / {signed[np.argmax(np.abs(signed))]:+7.1%}")


def moe_grouped_gemms() -> None:
    """Qwen3-30B-A3B's expert up_proj as one grouped GEMM on an H100 (data/published/kernels/moe_grouped_gemm_h100.csv:
    128 experts of 512 rows, K 2048, N 1536, bf16; each step the forward, out.sum() and the backward's input and
    weight gradients, kernels' device time) against the dgx-h100 preset's price of the same work as a step prices an
    MoE layer's experts (workloads/transformer_ops.py: one GEMM per expert on the FLOPs curve, count = experts): three
    GEMMs of 2 · 512 · 2048 · 1536 FLOPs an expert, and the sum's two passes over the output (read it; write its
    gradient of ones) as elementwise memory traffic. Only the uniform rows: the skewed ones print no expert's size."""
    rows = [r for r in read_csv_rows(KERNELS / "moe_grouped_gemm_h100.csv") if r["distribution"] == "uniform"]
    costs = AnalyticCostModel(Job.from_presets("llama3-8b", "dgx-h100").system, "bf16")
    print("\nMoE expert GEMMs, one grouped launch on an H100 (moe_grouped_gemm_h100.csv, uniform): priced / measured")
    for r in rows:
        experts, total, k, n = (int(r[c]) for c in ("experts", "rows_total", "k", "n"))
        gemms_s = 3 * experts * float(costs.gemm_s(2 * total / experts * k * n))
        sum_s = 2 * float(costs.memory_s("elementwise", total * n * 2))
        measured_s = float(r["ms_per_step"]) * 1e-3
        print(
            f"  {r['implementation']:26} measured {measured_s * 1e3:6.3f} ms  priced {(gemms_s + sum_s) * 1e3:6.3f} ms "
            f"(GEMMs {gemms_s * 1e3:.3f}, sum {sum_s * 1e3:.3f})  x{(gemms_s + sum_s) / measured_s:.2f}"
        )


if __name__ == "__main__":
    main()
