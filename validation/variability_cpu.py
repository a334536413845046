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
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.stochastic.distributions import fit_best

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


if __name__ == "__main__":
    main()
