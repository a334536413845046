"""Step-time distributions measured on this CPU: fit on some runs, predict the others (KS distance, p95).

    python validation/variability_cpu.py

Data: data/measured/cpu_mlp_{1,2}rank.csv (tools/measure_step_times.py: 10 runs × 300 iterations of a
small MLP training loop, 1 process and 2 gloo DDP processes; rank 0's times; runs one after another)
and cpu_mlp_{1,2}rank_20runs.csv (the same, 20 runs, measured on another day). Two splits, nothing
fitted on the predicted runs in either:
- time-ordered: the first half of the runs fit, the second half predicted (forecasting later runs:
  drift of the machine over the minutes between them is not foreseeable from earlier runs);
- interleaved: even runs fit, odd runs are predicted (the fitted runs span the same period as the
  predicted ones: the question "what will a run on this machine look like").

Model: step = centre × R × E. E is the per-step noise around a run's median (step / run median),
its family chosen by KS on the training runs (normal, gamma, log-normal). R is the run-level regime:
log-normal, with σ the spread of log run medians across training runs, centred on their mean. The
prediction is a Monte Carlo mixture over R and E, compared with the pooled held-out runs. Printed
too: the noise model alone (held-out steps divided by their own run median, i.e. with the regime
known), which isolates what the regime costs. Targets (issue #5): KS ≤ 10%, p95 within 2%.

Then (issue #33 item 5; skipped without torch) multi-process runs measured live, with one rank slowed
by a known amount: W gloo processes (W = 2 and 4 on this 2-core machine, one thread each) repeat a
step of a 512×512 float32 matmul then an all-reduce of 256 KiB; rank W−1 adds a busy loop of known
length after its matmul. Per run: 300 timed steps after 20 warm-up ones, rank 0's step times.
Fitting and checking runs are apart: a CALIBRATION run (nobody slowed) fits the model; CHECK runs
(nobody slowed, then the busy loop at about half and once the matmul's time) are predicted and never
fitted. The fit: each rank's mean matmul time and the pooled CV of matmul times around their rank's
mean; the collective's time per step (the step's end minus the last rank's matmul end: the
transfer, without the wait for peers), its mean and CV. The prediction is itercast's own step
model: a graph of W ranks (matmul as compute, the busy loop as a host task of its known length, the
all-reduce as one collective), sampled by stochastic/variability.GraphSampler (log-normal compute and
communication noise of the fitted CVs, i.i.d. per rank and step) through the max-plus Monte Carlo
(sim/montecarlo.py). Printed per case: KS distance and p95 error. Target (issue #33): KS ≤ 15%, p95
within 2%.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.graph.execgraph import Category, GraphBuilder
from itercast.stochastic.distributions import fit_best
from itercast.stochastic.variability import StepGraph, VariabilityModel, graph_distribution

DATA = Path(__file__).resolve().parents[1] / "data" / "measured"
FILES = ("cpu_mlp_1rank.csv", "cpu_mlp_2rank.csv", "cpu_mlp_1rank_20runs.csv", "cpu_mlp_2rank_20runs.csv")


def runs(path: Path) -> dict[int, np.ndarray]:
    a = np.genfromtxt(path, delimiter=",", comments="#", skip_header=5)
    rank0 = a[a[:, 1] == 0]
    return {int(r): rank0[rank0[:, 0] == r][:, 3] for r in np.unique(rank0[:, 0])}


def check(data: dict[int, np.ndarray], train: list[int], test: list[int], rng: np.random.Generator) -> str:
    medians = {r: float(np.median(x)) for r, x in data.items()}
    noise = fit_best(np.concatenate([data[r] / medians[r] for r in train]))
    log_m = np.log([medians[r] for r in train])
    centre, sigma = float(np.exp(log_m.mean())), float(log_m.std(ddof=1))
    predicted = centre * np.exp(sigma * rng.standard_normal(200_000)) * noise.sample(rng, 200_000)
    held = np.concatenate([data[r] for r in test])
    ks = stats.ks_2samp(predicted, held).statistic
    p95_err = np.percentile(predicted, 95) / np.percentile(held, 95) - 1
    within = np.concatenate([data[r] / medians[r] for r in test])
    ks_noise = stats.kstest(within, noise.dist.cdf).statistic
    p95_noise = noise.ppf(0.95) / np.percentile(within, 95) - 1
    return (
        f"KS {ks:.1%}, p95 error {p95_err:+.1%} | noise model alone (regime known): KS {ks_noise:.1%}, "
        f"p95 error {p95_noise:+.1%} | noise {noise.family}, regime σ {sigma:.3f}"
    )


MATMUL_SIZE = 512  # 512×512 float32: 2.9 ms on one thread of this CPU
GRADIENT_FLOATS = 65_536  # 256 KiB all-reduced per step
WARMUP_STEPS, TIMED_STEPS = 20, 300


@dataclass(frozen=True)
class Calibration:
    """Fitted on an un-slowed run: each rank's mean compute (s), the pooled compute CV, the collective's
    mean transfer time (s) and its CV."""

    compute_s: tuple[float, ...]
    compute_cv: float
    comm_s: float
    comm_cv: float


def calibrate(times: np.ndarray) -> Calibration:
    """From a run's timestamps (ranks × steps × (start, compute end, all-reduce end), seconds): the
    collective's transfer per step is its end minus the last rank's compute end (the wait for peers
    removed, DESIGN §3 rule 3)."""
    compute = times[:, :, 1] - times[:, :, 0]
    mean = compute.mean(axis=1)
    transfer = times[:, :, 2].max(axis=0) - times[:, :, 1].max(axis=0)
    return Calibration(
        tuple(float(m) for m in mean),
        float((compute / mean[:, None]).std()),
        float(transfer.mean()),
        float(transfer.std() / transfer.mean()),
    )


def predict_steps(cal: Calibration, slow_rank: int, extra_s: float, samples: int, seed: int = 0) -> np.ndarray:
    """Step-time samples of the fork-join step: each rank's compute (its calibrated mean, the fitted
    CV), `extra_s` of host work after it on `slow_rank`, then one all-reduce across all ranks."""
    b = GraphBuilder()
    coll = b.new_collective()
    for rank, compute_s in enumerate(cal.compute_s):
        cpu = b.resource(rank, "compute")
        last = b.task("matmul", cpu, compute_s, Category.COMPUTE, "gemm")
        if rank == slow_rank and extra_s > 0:
            last = b.task("busy_loop", cpu, extra_s, Category.HOST, "host", [last])
        b.task("all_reduce", cpu, cal.comm_s, Category.COMMUNICATION, "all_reduce", [last], collective=coll)
    model = VariabilityModel(cal.compute_cv, cal.comm_cv, network_cv=0.0, gpu_cv=0.0, moe_imbalance_cv=0.0)
    return graph_distribution(StepGraph(b.build(), 1, 1), model, samples, seed).samples_s


def compare(predicted: np.ndarray, measured: np.ndarray) -> tuple[float, float, float]:
    """(two-sample KS distance, p95 error predicted / measured − 1, KS of both divided by their medians:
    the spread's shape alone, without the run's level)."""
    ks = float(stats.ks_2samp(predicted, measured).statistic)
    centred = float(stats.ks_2samp(predicted / np.median(predicted), measured / np.median(measured)).statistic)
    return ks, float(np.percentile(predicted, 95) / np.percentile(measured, 95) - 1), centred


def _worker(rank: int, world: int, init_file: str, slow_rank: int, extra_s: float, out: str) -> None:
    """One gloo process: matmul, the busy loop on `slow_rank`, all-reduce; timestamps to out/rank.npy."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    a, b = torch.randn(MATMUL_SIZE, MATMUL_SIZE), torch.randn(MATMUL_SIZE, MATMUL_SIZE)
    c, grad = torch.empty(MATMUL_SIZE, MATMUL_SIZE), torch.ones(GRADIENT_FLOATS)
    stamps = np.zeros((WARMUP_STEPS + TIMED_STEPS, 3))
    dist.barrier()
    for i in range(stamps.shape[0]):
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        if rank == slow_rank:
            end = time.perf_counter() + extra_s
            while time.perf_counter() < end:
                pass
        t1 = time.perf_counter()
        dist.all_reduce(grad)
        stamps[i] = t0, t1, time.perf_counter()
    np.save(Path(out) / f"{rank}.npy", stamps[WARMUP_STEPS:])
    dist.destroy_process_group()


def measure(world: int, slow_rank: int, extra_s: float) -> np.ndarray:
    """Timestamps (ranks × steps × 3, seconds; CLOCK_MONOTONIC, shared by the processes) of one run."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init = str(Path(tmp) / "rendezvous")
        mp.spawn(_worker, args=(world, init, slow_rank, extra_s, tmp), nprocs=world, join=True)
        return np.stack([np.load(Path(tmp) / f"{r}.npy") for r in range(world)])


def slowed_rank_cases() -> None:
    """Calibrate on an un-slowed run per world size, predict un-slowed and slowed check runs."""
    if importlib.util.find_spec("torch") is None:
        print("multi-process runs: torch is not installed (pip install itercast[torch]); skipped")
        return
    print(f"\nmulti-process gloo runs, {TIMED_STEPS} steps each (rank 0's step: compute start to all-reduce end)")
    print(
        f"{'world':>5} {'run':11} {'busy loop':>9} {'measured p50/p95 ms':>20} {'predicted p50/p95 ms':>21} "
        f"{'KS':>6} {'p95 err':>8} {'KS centred':>10}"
    )
    for world in (2, 4):
        cal = calibrate(measure(world, -1, 0.0))
        print(
            f"{world:5d} calibration  compute {np.mean(cal.compute_s) * 1e3:.2f} ms (CV {cal.compute_cv:.1%}), "
            f"all-reduce {cal.comm_s * 1e3:.2f} ms (CV {cal.comm_cv:.1%}): fitted, not checked"
        )
        for extra_s in (0.0, 0.5 * max(cal.compute_s), max(cal.compute_s)):
            times = measure(world, world - 1, extra_s)
            measured = times[0, :, 2] - times[0, :, 0]
            predicted = predict_steps(cal, world - 1, extra_s, 20_000)
            ks, p95_err, ks_centred = compare(predicted, measured)
            mp50, mp95 = np.percentile(measured, [50, 95]) * 1e3
            pp50, pp95 = np.percentile(predicted, [50, 95]) * 1e3
            print(
                f"{world:5d} {'check':11} {extra_s * 1e3:6.2f} ms {mp50:9.2f} / {mp95:8.2f} {pp50:10.2f} / {pp95:8.2f} "
                f"{ks:6.1%} {p95_err:+8.1%} {ks_centred:10.1%}"
            )


def main() -> None:
    rng = np.random.default_rng(0)
    for name in FILES:
        data = runs(DATA / name)
        order = sorted(data)
        half = len(order) // 2
        print(f"{name}: run medians (ms) {', '.join(f'{np.median(data[r]) * 1e3:.1f}' for r in order)}")
        print(
            f"  time-ordered ({order[:half]} fit, {order[half:]} predicted): "
            + check(data, order[:half], order[half:], rng)
        )
        print(
            f"  interleaved ({order[0::2]} fit, {order[1::2]} predicted): " + check(data, order[0::2], order[1::2], rng)
        )
    slowed_rank_cases()


if __name__ == "__main__":
    main()
