"""Public step-time series of real multi-GPU training: the variability model fitted on some runs, checked on others.

    python validation/variability_series.py
    python validation/variability_series.py --extract CHECKOUT   # re-parse the logs into data/published/step_series/

Data (issue #33 item 5): MLPerf Training v4.0 result logs of NVIDIA's Eos submissions
(mlcommons/training_results_v4.0@6fe954378efe4a1a1bd665550b18ff8f26018def, NVIDIA/results/<system>/<benchmark>/
result_<run>.txt), parsed into data/published/step_series/*.csv (one row per training block). No public
per-iteration series of ≥ 8 GPUs and ≥ 100 consecutive steps could be read whole here: the logs pasted in
GitHub issues come as excerpts of a few lines, and these MLPerf logs time BLOCKS, not steps: the
`:::MLLOG` events block_start / block_stop (time_ms) bracket the training between two evaluations,
10-11 steps of GPT-3 175B, 3 steps of Llama-2-70B LoRA. What is checked is therefore the distribution of
the mean step time over a block.

Rule for what counts as training, fixed before any error was computed:
- a block is the time from block_start to block_stop; evaluation (eval_start..eval_stop) lies outside it,
  and no checkpoint is saved inside a timed MLPerf run (the logs print no save);
- the first block of each run is left out (it holds warm-up: CUDA-graph capture, the first data loads;
  LoRA's first block also spans 57 steps, not 3), and so is any block whose step count differs from the
  series' most common one (a shorter last block).

Split: the first half of each system's runs (in run number order) fit, the other half is checked,
never fitted. Fit (what a block series identifies): the centre, median step time of the fitted blocks,
and the spread, σ_b, the standard deviation of their log step times. The model is itercast's own: a
one-task step graph of the centre's length whose only noise is VariabilityModel.step_cv (one factor per
step shared by every task of the step), sampled by GraphSampler through the max-plus Monte Carlo
(graph_distribution, as the `variability` command samples); a block is the mean of n sampled steps. With
independent steps a block's log-σ is σ_step / √n, so step_cv is fitted as the CV of a log-normal of
σ_step = σ_b √n (σ² = ln(1 + CV²)). Printed per series: KS distance and p95 error (predicted / measured − 1)
on the checked blocks, and the floor: the checked blocks' own drift, the first half of them (time
order, run by run) against the second half. Also printed: each run's median, the lag-1 autocorrelation
of blocks within a run (pooled), and blocks more than 3 robust standard deviations (1.4826 × MAD) above
the series median (periodic spikes would show as regular block numbers). Target (issue #33): KS ≤ 15%,
p95 within 2%.

Run level and step correlation (VariabilityModel.run_cv, .step_autocorrelation; issue #33 item 5). The
estimators were fixed, and written here, before any check figure of this model was computed. On the FIT
runs only, with y the log per-step seconds of a run's kept blocks, d = y minus its run's mean, n the steps
of a block, B̄ the fit runs' mean block count, rounded:
- ρ_b, the blocks' lag-1 correlation pooled within the fit runs: Σ d_t·d_{t+1} / Σ d_t² over all runs;
  converted to the steps' ρ: the ρ in [0, 0.99] at which the lag-1 correlation of consecutive n-step means
  of an AR(1), ρ(1 − ρⁿ)² / ((1 − ρ)² · n · g(n, ρ)), equals ρ_b (g: ar1_mean_variance_factor); ρ_b ≤ 0
  gives ρ = 0 (one fit run holds ~22 blocks: ρ_b's standard error is about 1/√22 ≈ 0.2);
- σ, the step's log-σ: the blocks' pooled within-run variance s_w² = Σ d² / Σ (B_r − 1), and a block mean
  of an AR(1) has variance σ²/n · g(n, ρ), so σ² = n·s_w² / g(n, ρ) (step_cv = √(e^{σ²} − 1)); the run
  mean's absorbing part of a slow drift biases s_w² low by about g(B̄, ρ_b)/B̄, not corrected;
- σ_run, the run level: with ≥ 2 fit runs, σ_run² = max(0, variance (ddof 1) of the runs' log medians −
  (π/2)·s_w²·g(B̄, ρ_b)/B̄), the second term the sampling variance of a run's median (π/2: a median's
  variance over a mean's, normal data; g(B̄, ρ_b): the blocks' own correlation); 5 fit runs give it 4
  degrees of freedom (a variance's relative standard error √(2/4) ≈ 71% on σ_run², normal data). With
  ONE fit run (the three GPT-3 systems, 3 runs each) the series holds no between-run information:
  σ_run² is borrowed, the pooled σ_run² of the systems with ≥ 2 fit runs (weighted by runs − 1): another
  job on the same cluster (Eos, NeMo 24.04), a weak stand-in, printed as "borrowed".
Prediction: runs of the check runs' mean block count, each run one GraphSampler run (run_steps = its
steps: one run factor, an AR(1) chain of its own), blocks the means of n consecutive sampled steps, pooled
across runs; KS and p95 error are printed beside the independent-steps model's.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from scipy import optimize
from variability_cpu import _lag1, compare

from itercast.graph.execgraph import Category, GraphBuilder
from itercast.sim.montecarlo import simulate_samples
from itercast.stochastic.variability import (
    GraphSampler,
    StepGraph,
    VariabilityModel,
    ar1_mean_variance_factor,
    graph_distribution,
)

SERIES = Path(__file__).resolve().parents[1] / "data" / "published" / "step_series"
SOURCE_REPO = "mlcommons/training_results_v4.0"
SOURCE_COMMIT = "6fe954378efe4a1a1bd665550b18ff8f26018def"
COLUMNS = "run,block,steps,seconds"
SAMPLES = 20_000


@dataclass(frozen=True)
class Source:
    """One MLPerf system's result logs: the folder under NVIDIA/results, its GPU count (nodes × 8 H100,
    the log's submission_platform), the model, and how a block's steps are counted: GPT-3 blocks carry
    `epoch_count` in tokens (steps = tokens / (sequence length × global batch)), LoRA blocks the samples
    trained so far (`samples_count`; steps = difference / global batch)."""

    name: str
    folder: str
    gpus: int
    model: str
    runs: int


SOURCES = (
    Source("gpt3_eos_n64", "eos_n64_ngc24.04_nemo/gpt3", 512, "GPT-3 175B pre-training (NeMo 24.04)", 3),
    Source("gpt3_eos_n1344", "eos-dfw_n1344_ngc24.04_nemo/gpt3", 10_752, "GPT-3 175B pre-training (NeMo 24.04)", 3),
    Source("gpt3_eos_n1452", "eos-dfw_n1452_ngc24.04_nemo/gpt3", 11_616, "GPT-3 175B pre-training (NeMo 24.04)", 3),
    Source(
        "lora_eos_n128", "eos_n128_ngc24.04_nemo/llama2_70b_lora", 1024, "Llama-2-70B LoRA fine-tuning (NeMo 24.04)", 10
    ),
    Source("lora_eos_n8", "eos_n8_ngc24.04_nemo/llama2_70b_lora", 64, "Llama-2-70B LoRA fine-tuning (NeMo 24.04)", 10),
)


def mllog(line: str) -> dict | None:
    """The JSON record of a `:::MLLOG {...}` line (mlcommons/logging format), None for any other line."""
    head = ":::MLLOG "
    return json.loads(line[len(head) :]) if line.startswith(head) else None


def parse_blocks(text: str) -> list[tuple[float, float]]:
    """(steps, seconds) of each training block of one MLPerf result log, in order: seconds from block_start
    to the next block_stop (time_ms), steps from the block's tokens (GPT-3: metadata epoch_count /
    (max_sequence_length × global_batch_size)) or its samples (LoRA: block_stop's samples_count minus
    block_start's, / global_batch_size). Other events (init, eval, per-rank duplicates before the run)
    are skipped."""
    records = [r for r in (mllog(line) for line in text.splitlines()) if r is not None]
    first = {r["key"]: r["value"] for r in reversed(records)}
    batch, seq = first["global_batch_size"], first.get("max_sequence_length")
    blocks: list[tuple[float, float]] = []
    start: dict | None = None
    for r in records:
        if r["key"] == "block_start":
            start = r
        elif r["key"] == "block_stop" and start is not None:
            meta0, meta1 = start["metadata"], r["metadata"]
            if "epoch_count" in meta1:
                steps = meta1["epoch_count"] / (seq * batch)
            else:
                steps = (meta1["samples_count"] - meta0["samples_count"]) / batch
            blocks.append((steps, (r["time_ms"] - start["time_ms"]) / 1e3))
            start = None
    return blocks


def extract(checkout: Path) -> None:
    """Parse every source's result logs from a checkout of SOURCE_REPO into SERIES/<name>.csv."""
    SERIES.mkdir(parents=True, exist_ok=True)
    for s in SOURCES:
        rows = []
        for run in range(s.runs):
            blocks = parse_blocks((checkout / "NVIDIA" / "results" / s.folder / f"result_{run}.txt").read_text())
            rows += [f"{run},{b},{steps:g},{sec:.3f}" for b, (steps, sec) in enumerate(blocks)]
        header = [
            f"# source: {SOURCE_REPO}@{SOURCE_COMMIT}:NVIDIA/results/{s.folder}/result_{{0..{s.runs - 1}}}.txt",
            f"# system: NVIDIA Eos, {s.gpus // 8} x DGX H100 ({s.gpus} H100-SXM5-80GB); model: {s.model}",
            "# block: training between MLLOG block_start and block_stop (evaluation outside it); steps in "
            "the block; seconds: block_stop time_ms - block_start time_ms; parsed by "
            "python validation/variability_series.py --extract",
            COLUMNS,
        ]
        (SERIES / f"{s.name}.csv").write_text("\n".join(header + rows) + "\n")


def load(path: Path) -> np.ndarray:
    """Rows (run, block, steps, seconds) of a series CSV."""
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return np.array([[float(v) for v in line.split(",")] for line in lines[lines.index(COLUMNS) + 1 :]])


def training_blocks(rows: np.ndarray) -> dict[int, np.ndarray]:
    """Per run, the per-step seconds (block seconds / steps) of the blocks the rule keeps: not a run's
    first block, and only blocks of the series' most common step count."""
    kept = rows[rows[:, 1] > 0]
    counts, freq = np.unique(kept[:, 2], return_counts=True)
    kept = kept[kept[:, 2] == counts[np.argmax(freq)]]
    return {int(r): kept[kept[:, 0] == r][:, 3] / kept[kept[:, 0] == r][:, 2] for r in np.unique(kept[:, 0])}


def _one_task_step(centre_s: float) -> StepGraph:
    """A step graph of one compute task of `centre_s` seconds (one GPU: no order statistic)."""
    b = GraphBuilder()
    b.task("step", b.resource(0, "compute"), centre_s, Category.COMPUTE, "gemm")
    return StepGraph(b.build(), 1, 1)


def _shared_only(step_cv: float, run_cv: float = 0.0, rho: float = 0.0) -> VariabilityModel:
    """The model with only the factors shared by a step's tasks: the step's, its run's, their correlation."""
    return VariabilityModel(0.0, 0.0, 0.0, 0.0, 0.0, step_cv=step_cv, run_cv=run_cv, step_autocorrelation=rho)


def predict_blocks(centre_s: float, step_cv: float, steps: int, blocks: int, seed: int = 0) -> np.ndarray:
    """Per-step seconds of `blocks` sampled blocks: itercast's Monte Carlo over a one-task step graph of
    `centre_s` whose only noise is the per-step factor step_cv; each block the mean of `steps` draws."""
    step = _one_task_step(centre_s)
    draws = graph_distribution(step, _shared_only(step_cv), steps * blocks, seed).samples_s
    return draws.reshape(blocks, steps).mean(axis=1)


#: the largest step ρ the fit returns (ar1_mean_variance_factor diverges at 1)
RHO_MAX = 0.99


def block_lag1_of_steps(rho: float, n: int) -> float:
    """Lag-1 correlation of consecutive means of n steps of an AR(1) of lag-1 ρ: the covariance of
    two adjacent n-step means is σ²/n² Σ_i Σ_j ρ^(n+j−i) = σ²/n² · ρ(1 − ρⁿ)² / (1 − ρ)², their variance
    σ²/n · g(n, ρ) (ar1_mean_variance_factor)."""
    if rho == 0:
        return 0.0
    return rho * (1 - rho**n) ** 2 / ((1 - rho) ** 2 * n * float(ar1_mean_variance_factor(n, rho)))


def step_rho(block_lag1: float, n: int) -> float:
    """The steps' ρ in [0, RHO_MAX] whose n-step means correlate `block_lag1` (0 when it is ≤ 0)."""
    if block_lag1 <= 0:
        return 0.0
    if block_lag1 >= block_lag1_of_steps(RHO_MAX, n):
        return RHO_MAX
    return float(optimize.brentq(lambda r: block_lag1_of_steps(r, n) - block_lag1, 0.0, RHO_MAX))


@dataclass(frozen=True)
class RunFit:
    """The fit of the module docstring's run-level estimators on a system's fit runs: the steps'
    lag-1 ρ (from the blocks' pooled lag-1), step_cv corrected for it, σ_run² (None: one fit run)."""

    steps: int
    fit_runs: int
    block_lag1: float
    rho: float
    step_cv: float
    run_var: float | None


def fit_runs(runs: list[np.ndarray], steps: int) -> RunFit:
    """The module docstring's estimators on the per-step seconds of each fit run's blocks."""
    d = [np.log(x) - np.log(x).mean() for x in runs]
    ss = sum(float((v * v).sum()) for v in d)
    block_lag1 = sum(float((v[1:] * v[:-1]).sum()) for v in d) / ss
    within_var = ss / sum(v.size - 1 for v in d)
    rho = step_rho(block_lag1, steps)
    sigma2 = steps * within_var / float(ar1_mean_variance_factor(steps, rho))
    run_var = None
    if len(runs) >= 2:
        blocks = round(float(np.mean([x.size for x in runs])))
        median_var = np.pi / 2 * within_var * float(ar1_mean_variance_factor(blocks, block_lag1)) / blocks
        run_var = max(0.0, float(np.var([np.log(np.median(x)) for x in runs], ddof=1)) - median_var)
    return RunFit(steps, len(runs), block_lag1, rho, float(np.sqrt(np.expm1(sigma2))), run_var)


def pooled_run_var(fits: list[RunFit]) -> float:
    """σ_run² pooled over the fits that have one (≥ 2 fit runs), weighted by fit runs − 1; 0 if none has."""
    own = [(f.fit_runs - 1, f.run_var) for f in fits if f.run_var is not None]
    return sum(w * v for w, v in own) / sum(w for w, _ in own) if own else 0.0


def predict_runs(
    centre_s: float, fit: RunFit, run_var: float, blocks_per_run: int, blocks: int, seed: int = 0
) -> np.ndarray:
    """Per-step seconds of about `blocks` sampled blocks pooled across runs of `blocks_per_run` blocks:
    itercast's Monte Carlo (GraphSampler, one run per `blocks_per_run` × steps consecutive samples: one
    run factor, an AR(1) chain of their own; every simulate_samples block holds whole runs)."""
    run_steps = blocks_per_run * fit.steps
    runs = -(-blocks // blocks_per_run)
    model = _shared_only(fit.step_cv, float(np.sqrt(np.expm1(run_var))), fit.rho)
    step = _one_task_step(centre_s)
    sampler = GraphSampler(step, model, run_steps)
    block = run_steps * max(1, 1024 // run_steps)
    draws = simulate_samples(step.graph, sampler, runs * run_steps, seed, block=block)
    return draws.reshape(-1, fit.steps).mean(axis=1)


def spikes(per_run: dict[int, np.ndarray]) -> list[str]:
    """'run:block' of blocks more than 3 robust standard deviations (1.4826 × MAD) above the median (block
    numbers counted among the kept blocks, from 1)."""
    pooled = np.concatenate(list(per_run.values()))
    median = float(np.median(pooled))
    limit = median + 3 * 1.4826 * float(np.median(np.abs(pooled - median)))
    return [f"{r}:{i + 1}" for r, x in per_run.items() for i in np.flatnonzero(x > limit)]


@dataclass(frozen=True)
class Series:
    """One system's kept blocks (per-step seconds per run), its fit and check runs, and the run-level fit."""

    path: Path
    total_runs: int
    steps: int
    per_run: dict[int, np.ndarray]
    fit: list[int]
    check: list[int]
    run_fit: RunFit


def load_series(path: Path, runs: int) -> Series:
    """The series of `path`, the first half of its `runs` for fitting (fit_runs on them), the rest checked."""
    rows = load(path)
    steps = int(np.bincount(rows[rows[:, 1] > 0][:, 2].astype(int)).argmax())
    per_run = training_blocks(rows)
    order = sorted(per_run)
    fit, held = order[: runs // 2], order[runs // 2 :]
    run_fit = fit_runs([per_run[r] for r in fit], steps)
    return Series(path, int(rows[:, 0].max()) + 1, steps, per_run, fit, held, run_fit)


def check(s: Series, borrowed_run_var: float) -> None:
    """Print the figures the module docstring lists: the independent-steps model, then the run level's."""
    per_run, steps, f = s.per_run, s.steps, s.run_fit
    fitted = np.concatenate([per_run[r] for r in s.fit])
    held = np.concatenate([per_run[r] for r in s.check])
    centre = float(np.median(fitted))
    sigma_block = float(np.log(fitted).std(ddof=1))
    step_cv = float(np.sqrt(np.expm1((sigma_block * np.sqrt(steps)) ** 2)))
    predicted = predict_blocks(centre, step_cv, steps, SAMPLES)
    ks, p95_err, ks_centred = compare(predicted, held)
    half = held.size // 2
    floor_ks, floor_p95, _ = compare(held[:half], held[half:])
    lag1 = float(np.mean([_lag1(x) for x in per_run.values() if x.size > 2]))
    run_var = f.run_var if f.run_var is not None else borrowed_run_var
    per_check_run = round(held.size / len(s.check))
    runs_ks, runs_p95, runs_centred = compare(predict_runs(centre, f, run_var, per_check_run, SAMPLES), held)
    print(f"{s.path.name}: {s.total_runs} runs, {held.size + fitted.size} kept blocks of {steps} steps")
    print("  run medians (s/step): " + ", ".join(f"{np.median(per_run[r]):.3f}" for r in sorted(per_run)))
    print(
        f"  FIT runs {s.fit} ({fitted.size} blocks): centre {centre:.3f} s/step, block CV "
        f"{fitted.std(ddof=1) / fitted.mean():.2%}, step_cv {step_cv:.2%} (independent steps)"
    )
    print(
        f"  CHECK runs {s.check} ({held.size} blocks): KS {ks:.1%}, p95 {p95_err:+.2%} (centred KS "
        f"{ks_centred:.1%}) | floor, first vs second half: KS {floor_ks:.1%}, p95 {floor_p95:+.2%}"
    )
    print(
        f"  lag-1 autocorrelation of blocks within a run {lag1:+.2f}; blocks > 3 robust sd: {spikes(per_run) or 'none'}"
    )
    source = f"from {f.fit_runs} fit runs" if f.run_var is not None else "borrowed: pooled over the systems with ≥ 2"
    print(
        f"  run level, FIT runs: blocks' lag-1 {f.block_lag1:+.2f} -> steps' rho {f.rho:.3f}; step_cv {f.step_cv:.2%} "
        f"(corrected for rho); run_cv {np.sqrt(np.expm1(run_var)):.2%} ({source})"
    )
    print(
        f"  CHECK with run level and rho ({per_check_run}-block runs): KS {runs_ks:.1%}, p95 {runs_p95:+.2%} "
        f"(centred KS {runs_centred:.1%}) | independent steps: KS {ks:.1%}, p95 {p95_err:+.2%}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--extract", type=Path, metavar="CHECKOUT", help=f"a checkout of {SOURCE_REPO} to parse")
    args = ap.parse_args()
    if args.extract:
        extract(args.extract)
    series = []
    for s in SOURCES:
        path = SERIES / f"{s.name}.csv"
        if not path.exists():
            print(f"{path}: missing; run with --extract CHECKOUT", file=sys.stderr)
            sys.exit(2)
        series.append(load_series(path, s.runs))
    borrowed = pooled_run_var([x.run_fit for x in series])
    for s, x in zip(SOURCES, series, strict=True):
        print(f"\n{s.model}, {s.gpus} H100 (NVIDIA/results/{s.folder})")
        check(x, borrowed)


if __name__ == "__main__":
    main()
