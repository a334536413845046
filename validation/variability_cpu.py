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

Then (issue #33 item 5) multi-process runs with one rank slowed by a known amount, read from
data/measured/variability_slowed/w{2,4}.csv (`--live` re-measures them; needs torch): W gloo processes
(W = 2 and 4 on this 2-core machine, one thread each) repeat a step of a 512×512 float32 matmul then
an all-reduce of 256 KiB; rank W−1 adds a busy loop of known length after its matmul. Per run: 300
timed steps after 20 warm-up ones; rank 0's step times. Each world's four runs are taken twice: a
CALIBRATION run (nobody slowed) and CHECK runs (no busy loop, then about half and once the first
calibration's slowest compute). FIT: the two calibration runs only: each rank's mean matmul time,
the pooled CV of matmul times, the collective's time per step (the step's end minus the last rank's
matmul end: the transfer, without the wait for peers), its mean and CV, and the correlation across
ranks of log matmul times within a step. CHECK: each case's two repeats pooled, never fitted. The
prediction is itercast's own step model: a graph of W ranks (matmul as compute, the busy loop as a
host task of its known length, the all-reduce as one collective) sampled by GraphSampler through the
max-plus Monte Carlo (sim/montecarlo.py), with log-normal noise i.i.d. per rank and step
("independent", the model before) or with the correlated part of the variance carried by one factor
per step shared by all tasks (VariabilityModel.step_cv, "shared"). Printed per run: the diagnosis
(CV, lag-1 autocorrelation of steps, the share of the matmul's wall time spent descheduled, the cores
other processes kept busy); per case: KS and p95 error of both models, and the floor: KS and p95 of
one repeat against the other (the same case measured minutes apart: no model fitted elsewhere can be
expected to do better). Target (issue #33): KS ≤ 15%, p95 within 2%.
"""

from __future__ import annotations

import argparse
import os
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
    """Fitted on un-slowed runs: each rank's mean compute (s), the pooled compute CV, the collective's
    mean transfer time (s) and its CV, and the mean correlation across ranks of log compute times
    within a step (0: independent ranks)."""

    compute_s: tuple[float, ...]
    compute_cv: float
    comm_s: float
    comm_cv: float
    rank_correlation: float = 0.0


def calibrate(times: np.ndarray) -> Calibration:
    """From timestamps (ranks × steps × (start, compute end, all-reduce end), seconds; several runs
    joined along the steps): the collective's transfer per step is its end minus the last rank's
    compute end (the wait for peers removed, DESIGN §3 rule 3)."""
    compute = times[:, :, 1] - times[:, :, 0]
    mean = compute.mean(axis=1)
    transfer = times[:, :, 2].max(axis=0) - times[:, :, 1].max(axis=0)
    corr = np.corrcoef(np.log(compute))
    world = corr.shape[0] if corr.ndim else 1
    return Calibration(
        tuple(float(m) for m in mean),
        float((compute / mean[:, None]).std()),
        float(transfer.mean()),
        float(transfer.std() / transfer.mean()),
        float((corr.sum() - world) / (world * (world - 1))) if world > 1 else 0.0,
    )


def noise_model(cal: Calibration, shared: bool) -> VariabilityModel:
    """Independent log-normal noise of the fitted CVs per rank and step (`shared` false: the model before
    issue 33 item 5), or the same total log-variances split so that a step factor shared by every task
    (step_cv) carries the correlated part: σ_step² = ρ·σ_compute² (ρ the ranks' correlation, at most
    σ_comm²), each task keeping σ² − σ_step² of its own; σ² = ln(1 + CV²) for a log-normal."""
    var_c, var_t = np.log1p(cal.compute_cv**2), np.log1p(cal.comm_cv**2)
    var_s = min(max(cal.rank_correlation, 0.0) * var_c, var_t) if shared else 0.0
    cv = [float(np.sqrt(np.expm1(v))) for v in (var_c - var_s, var_t - var_s, var_s)]
    return VariabilityModel(cv[0], cv[1], network_cv=0.0, gpu_cv=0.0, moe_imbalance_cv=0.0, step_cv=cv[2])


def predict_steps(
    cal: Calibration, slow_rank: int, extra_s: float, samples: int, seed: int = 0, shared: bool = False
) -> np.ndarray:
    """Step-time samples of the fork-join step: each rank's compute (its calibrated mean, noise_model's
    noise), `extra_s` of host work after it on `slow_rank`, then one all-reduce across all ranks."""
    b = GraphBuilder()
    coll = b.new_collective()
    for rank, compute_s in enumerate(cal.compute_s):
        cpu = b.resource(rank, "compute")
        last = b.task("matmul", cpu, compute_s, Category.COMPUTE, "gemm")
        if rank == slow_rank and extra_s > 0:
            last = b.task("busy_loop", cpu, extra_s, Category.HOST, "host", [last])
        b.task("all_reduce", cpu, cal.comm_s, Category.COMMUNICATION, "all_reduce", [last], collective=coll)
    model = noise_model(cal, shared)
    return graph_distribution(StepGraph(b.build(), 1, 1), model, samples, seed).samples_s


def compare(predicted: np.ndarray, measured: np.ndarray) -> tuple[float, float, float]:
    """(two-sample KS distance, p95 error predicted / measured − 1, KS of both divided by their medians:
    the spread's shape alone, without the run's level)."""
    ks = float(stats.ks_2samp(predicted, measured).statistic)
    centred = float(stats.ks_2samp(predicted / np.median(predicted), measured / np.median(measured)).statistic)
    return ks, float(np.percentile(predicted, 95) / np.percentile(measured, 95) - 1), centred


def _worker(rank: int, world: int, init_file: str, slow_rank: int, extra_s: float, out: str) -> None:
    """One gloo process: matmul, the busy loop on `slow_rank`, all-reduce; per timed step (start, compute
    end, all-reduce end, the thread's CPU seconds over the compute) to out/rank.npy; over the timed
    steps, the process's CPU seconds (all threads) and the machine's busy CPU seconds to out/rank.cpu.npy."""
    import resource

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    a, b = torch.randn(MATMUL_SIZE, MATMUL_SIZE), torch.randn(MATMUL_SIZE, MATMUL_SIZE)
    c, grad = torch.empty(MATMUL_SIZE, MATMUL_SIZE), torch.ones(GRADIENT_FLOATS)
    stamps = np.zeros((WARMUP_STEPS + TIMED_STEPS, 4))
    dist.barrier()
    before = np.zeros(2)
    for i in range(stamps.shape[0]):
        if i == WARMUP_STEPS:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            before = np.array([usage.ru_utime + usage.ru_stime, _busy_cpu_s()])
        t0, c0 = time.perf_counter(), time.thread_time()
        torch.mm(a, b, out=c)
        if rank == slow_rank:
            end = time.perf_counter() + extra_s
            while time.perf_counter() < end:
                pass
        t1, c1 = time.perf_counter(), time.thread_time()
        dist.all_reduce(grad)
        stamps[i] = t0, t1, time.perf_counter(), c1 - c0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    np.save(Path(out) / f"{rank}.npy", stamps[WARMUP_STEPS:])
    np.save(Path(out) / f"{rank}.cpu.npy", np.array([usage.ru_utime + usage.ru_stime, _busy_cpu_s()]) - before)
    dist.destroy_process_group()


def _busy_cpu_s() -> float:
    """Seconds of CPU time the whole machine has spent busy since boot (/proc/stat: all but idle and
    iowait; USER_HZ = 100 ticks a second, proc(5))."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / 100


def measure(world: int, slow_rank: int, extra_s: float) -> tuple[np.ndarray, float]:
    """One run: timestamps (ranks × steps × 4: start, compute end, all-reduce end in seconds of
    CLOCK_MONOTONIC, shared by the processes, then the compute's thread CPU seconds) and the cores
    that OTHER processes kept busy meanwhile (machine busy CPU seconds minus the ranks' own, over the
    timed steps' wall time)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init = str(Path(tmp) / "rendezvous")
        mp.spawn(_worker, args=(world, init, slow_rank, extra_s, tmp), nprocs=world, join=True)
        times = np.stack([np.load(Path(tmp) / f"{r}.npy") for r in range(world)])
        cpu = np.stack([np.load(Path(tmp) / f"{r}.cpu.npy") for r in range(world)])
    # rank 0's reading of the machine's busy time, less every rank's own, over rank 0's timed wall time
    return times, max(cpu[0, 1] - cpu[:, 0].sum(), 0.0) / float(times[0, -1, 2] - times[0, 0, 0])


SLOWED = DATA / "variability_slowed"
COLUMNS = "run,case,extra_s,rank,step,start_s,compute_end_s,end_s,compute_cpu_s"
REPEATS = 2  # each world's four runs twice, in order: the second set gives the run-to-run spread


@dataclass(frozen=True)
class Run:
    """One measured run: `case` (calibration or check), the busy loop's seconds on the last rank, and
    the timestamps (ranks × steps × 4: start, compute end, all-reduce end, compute thread CPU seconds)."""

    number: int
    case: str
    extra_s: float
    times: np.ndarray

    @property
    def steps_s(self) -> np.ndarray:
        """Rank 0's step times: its compute start to its all-reduce end."""
        return self.times[0, :, 2] - self.times[0, :, 0]


def record(world: int, path: Path) -> None:
    """Measure `world`'s runs (a calibration, then checks with no busy loop, half and once the
    calibration's slowest compute; the four REPEATS times) and write them to `path` as CSV, the header
    naming the command, date, torch version and each run's load average and others' busy cores."""
    import torch

    rows, notes = [], []
    extras: tuple[float, ...] = ()
    for rep in range(REPEATS):
        for case in range(4):
            number = rep * 4 + case
            extra_s = extras[case - 1] if case else 0.0
            load0 = os.getloadavg()[0]
            times, others = measure(world, world - 1 if case else -1, extra_s)
            load1 = os.getloadavg()[0]
            if not extras:
                slowest_s = float((times[:, :, 1] - times[:, :, 0]).mean(axis=1).max())
                extras = (0.0, 0.5 * slowest_s, slowest_s)
            name = "check" if case else "calibration"
            notes.append(
                f"# run {number} {name} extra_s {extra_s:.6f} load {load0:.2f} {load1:.2f} others {others:.2f}"
            )
            times[:, :, :3] -= times[:, 0, 0].min()
            for rank in range(world):
                for step, (t0, t1, t2, cpu) in enumerate(times[rank]):
                    rows.append(f"{number},{name},{extra_s:.6f},{rank},{step},{t0:.7f},{t1:.7f},{t2:.7f},{cpu:.7f}")
            print(notes[-1][2:])
    header = [
        f"# command: python validation/variability_cpu.py --live (world {world}), {time.strftime('%Y-%m-%d %H:%M')}",
        f"# python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} cpus, threads per rank 1",
        f"# step: {MATMUL_SIZE}x{MATMUL_SIZE} float32 matmul, busy loop of extra_s on rank {world - 1}, "
        f"all-reduce of {GRADIENT_FLOATS} floats; {WARMUP_STEPS} warm-up steps then {TIMED_STEPS} timed",
        "# per run: load = os.getloadavg() 1-min at start and end; others = cores other processes kept busy "
        "(/proc/stat busy minus the ranks' own CPU time, over the timed steps)",
        *notes,
        COLUMNS,
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(header + rows) + "\n")


def load(path: Path) -> tuple[list[Run], list[str]]:
    """The runs of a file `record` wrote, and its header's run lines."""
    text = path.read_text().splitlines()
    notes = [line[2:] for line in text if line.startswith("# run ")]
    body = [line.split(",") for line in text[text.index(COLUMNS) + 1 :]]
    numbers = sorted({int(r[0]) for r in body})
    out = []
    for n in numbers:
        mine = [r for r in body if int(r[0]) == n]
        world, steps = max(int(r[3]) for r in mine) + 1, max(int(r[4]) for r in mine) + 1
        times = np.zeros((world, steps, 4))
        for r in mine:
            times[int(r[3]), int(r[4])] = [float(v) for v in r[5:]]
        out.append(Run(n, mine[0][1], float(mine[0][2]), times))
    return out, notes


def _lag1(x: np.ndarray) -> float:
    """Autocorrelation of consecutive values."""
    y = x - x.mean()
    return float((y[1:] * y[:-1]).mean() / y.var())


def describe_runs(runs: list[Run], notes: list[str]) -> None:
    """Per run: rank 0's step p50/p95, CV and lag-1 autocorrelation; the share of the ranks' compute
    wall time spent descheduled (wall minus the thread's CPU time); the cores others kept busy."""
    print(
        f"{'run':>5} {'case':11} {'busy loop':>9} {'p50/p95 ms':>15} {'CV':>6} {'lag-1':>6} {'descheduled':>11} others"
    )
    for run, note in zip(runs, notes, strict=True):
        x, t = run.steps_s, run.times
        wall = t[:, :, 1] - t[:, :, 0]
        p50, p95 = np.percentile(x, [50, 95]) * 1e3
        cv = x.std() / x.mean()
        print(
            f"{run.number:5d} {run.case:11} {run.extra_s * 1e3:6.2f} ms {p50:6.2f} / {p95:6.2f} {cv:6.1%} "
            f"{_lag1(x):6.2f} {1 - t[:, :, 3].sum() / wall.sum():11.0%} {note.split()[-1]}"
        )


def slowed_rank_cases(world: int, runs: list[Run]) -> None:
    """Fit on the calibration runs, predict each check case (its repeats pooled) with independent and
    with shared per-step noise; the floor: KS and p95 between the case's repeats, measured vs measured."""
    cal_runs = [r for r in runs if r.case == "calibration"]
    cal = calibrate(np.concatenate([r.times for r in cal_runs], axis=1))
    print(
        f"FIT on calibration runs {[r.number for r in cal_runs]} (nobody slowed): compute "
        f"{np.mean(cal.compute_s) * 1e3:.2f} ms (CV {cal.compute_cv:.1%}), all-reduce {cal.comm_s * 1e3:.2f} ms "
        f"(CV {cal.comm_cv:.1%}), ranks' log compute correlated {cal.rank_correlation:+.2f} within a step"
    )
    print(
        f"CHECK runs (never fitted), repeats pooled: {'busy loop':>9} {'runs':>6} {'independent KS/p95':>19} "
        f"{'shared KS/p95':>16} | floor: repeat vs repeat KS/p95"
    )
    for extra_s in sorted({r.extra_s for r in runs if r.case == "check"}):
        case = [r for r in runs if r.case == "check" and r.extra_s == extra_s]
        measured = np.concatenate([r.steps_s for r in case])
        cells = []
        for shared in (False, True):
            ks, p95_err, _ = compare(predict_steps(cal, world - 1, extra_s, 20_000, shared=shared), measured)
            cells.append(f"{ks:6.1%} / {p95_err:+6.1%}")
        ks, p95_err, _ = compare(case[0].steps_s, case[-1].steps_s)
        print(
            f"{'':40} {extra_s * 1e3:6.2f} ms {','.join(str(r.number) for r in case):>6} {cells[0]:>19} "
            f"{cells[1]:>16} | {ks:6.1%} / {p95_err:+6.1%}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--live", action="store_true", help=f"re-measure the slowed-rank runs into {SLOWED}")
    args = ap.parse_args()
    if args.live:
        for world in (2, 4):
            record(world, SLOWED / f"w{world}.csv")
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

    for world in (2, 4):
        measured, notes = load(SLOWED / f"w{world}.csv")
        print(f"\n{world} gloo processes on this 2-core machine (data/measured/variability_slowed/w{world}.csv)")
        describe_runs(measured, notes)
        slowed_rank_cases(world, measured)


if __name__ == "__main__":
    main()
