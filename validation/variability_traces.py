"""Trace-fitted variability (stochastic/trace_variability.py) checked on held-out steps of the shared traces.

    python validation/variability_traces.py          # reads $ITERCAST_DATA or ../shared/data
    python validation/variability_traces.py --samples 4000

For every single-rank trace with at least three steps, each step in turn is held out: the
variability model is fitted on the other steps only, and the step-time distribution it forecasts
is the Monte Carlo samples of those other steps (every class's durations drawn from a fitted step,
sim/montecarlo.py's max-plus kernel over the whole replay graph). The held-out step's own durations
never enter its forecast. Reported per held-out step: the measured time, the forecast p5/p50/p95,
and the probability integral transform (PIT: the forecast's probability of a step no longer than
the measured one). A calibrated forecast gives PIT values spread uniformly on [0, 1]; pooled over
all held-out steps the script prints their Kolmogorov–Smirnov distance from uniform, the share of
held-out steps inside the forecast's 90% interval, and the geomean |error| of the forecast p50.
Beside it, the baseline a user has without a model: the other steps' measured times as the forecast.

The 8-rank DLRM trace holds one step per rank, so it has no step to hold out and is left out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.costs.fitting import geomean_abs_err
from itercast.data_paths import shared_data_dir
from itercast.stochastic.trace_variability import fit_trace_variability, trace_step_distribution
from itercast.traces.kineto import read_traces
from itercast.traces.replay_graph import build_replay_graph

MIN_STEPS = 3  # two fitted steps at least


def pit(samples: np.ndarray, value: float) -> float:
    """Mid-rank probability integral transform: P(X < value) + P(X = value) / 2."""
    return float(np.mean(samples < value) + 0.5 * np.mean(samples == value))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=2000, help="Monte Carlo samples per fitted step")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    data = shared_data_dir()
    if data is None:
        print("no shared data (set ITERCAST_DATA or place ../shared/data beside the repo): nothing to validate")
        return
    print(
        f"{'trace':34} {'step':>4} {'measured':>9} | model: {'p5':>7} {'p50':>7} {'p95':>7} {'PIT':>4}"
        f" | others: {'min':>7} {'max':>7} {'PIT':>4}  (ms)"
    )
    forecasts: dict[str, list[np.ndarray]] = {"trace-fitted model": [], "other steps as measured": []}
    measured = []
    for path in sorted((data / "traces").glob("*.json.gz")):
        traces = read_traces([path])
        rg = build_replay_graph(traces)
        if len(traces) != 1 or len(rg.steps) < MIN_STEPS:
            continue
        step_s = np.array([m.measured_s for m in rg.steps])
        for held, mark in enumerate(rg.steps):
            fit = [j for j in range(len(rg.steps)) if j != held]
            model = fit_trace_variability(rg, fit)
            forecast = trace_step_distribution(rg, model, args.samples, args.seed).step_s[fit].ravel()
            others = step_s[fit]
            forecasts["trace-fitted model"].append(forecast)
            forecasts["other steps as measured"].append(others)
            value = float(mark.measured_s)
            measured.append(value)
            q = np.quantile(forecast, [0.05, 0.5, 0.95]) * 1e3
            print(
                f"{path.name.removesuffix('.json.gz')[:34]:34} {mark.step:4d} {value * 1e3:9.2f} | "
                f"{q[0]:7.2f} {q[1]:7.2f} {q[2]:7.2f} {pit(forecast, value):4.2f} | "
                f"{others.min() * 1e3:7.2f} {others.max() * 1e3:7.2f} {pit(others, value):4.2f}"
            )
    if not measured:
        print("no single-rank trace with at least three steps")
        return
    meas = np.array(measured)
    for name, dists in forecasts.items():
        pits = [pit(d, v) for d, v in zip(dists, meas, strict=True)]
        baseline = name == "other steps as measured"  # two to five values: their range
        lo_hi = [(d.min(), d.max()) if baseline else tuple(np.quantile(d, [0.05, 0.95])) for d in dists]
        inside = np.mean([lo <= v <= hi for (lo, hi), v in zip(lo_hi, meas, strict=True)])
        p50 = np.array([np.median(d) for d in dists])
        print(
            f"{name:24} held-out steps {meas.size}  PIT KS vs uniform {stats.kstest(pits, 'uniform').statistic:.1%}  "
            f"inside {'min–max' if baseline else 'p5–p95'} {inside:.0%}  "
            f"p50 geomean |error| {geomean_abs_err(p50, meas):.2%}"
        )


if __name__ == "__main__":
    main()
