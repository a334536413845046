"""Time to train with failures and checkpoints: expectation, distribution, deadline, best interval.

Model (renewal, exponential failures): the job fails at rate λ = GPUs / MTBF_per_GPU. Work runs
in segments of τ seconds followed by a checkpoint of δ seconds; a failure loses the segment in
progress and costs a restart of R seconds (failures during a restart are not modelled). A segment
of s = τ + δ then takes, in expectation (Daly, FGCS 2006, without failures during restart):

    E[segment] = (e^{λ s} − 1) · (1/λ + R)

and the number of failed attempts per segment is geometric with success probability e^{−λ s}, so
over K segments it is negative-binomial: Monte Carlo samples it directly, and the time lost per
failure (a truncated exponential on [0, s], plus R) is summed by its first two moments (a normal
approximation, exact in mean; the tests check the mean against the closed form).
The best interval minimises E[total] numerically; Young's τ ≈ √(2δ/λ) is reported beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize

HOUR_S = 3600.0


@dataclass(frozen=True)
class FailureModel:
    """mtbf_per_gpu_s: mean time between failures of one GPU (its share of node, network, software);
    checkpoint_s: time to write one checkpoint; restart_s: time from failure to training again."""

    mtbf_per_gpu_s: float
    checkpoint_s: float
    restart_s: float

    def job_failure_rate(self, num_gpus: int) -> float:
        return num_gpus / self.mtbf_per_gpu_s


@dataclass(frozen=True)
class TimeToTrain:
    work_s: float
    interval_s: float
    expected_s: float
    quantiles_s: dict[str, float]
    goodput: float
    young_interval_s: float
    deadline_probability: float | None


def expected_time_s(work_s: float, interval_s: float, rate: float, fm: FailureModel) -> float:
    """E[wall time] for `work_s` seconds of training in segments of `interval_s` (closed form)."""
    segments = work_s / interval_s
    s = interval_s + fm.checkpoint_s
    if rate == 0:
        return segments * s
    return segments * math.expm1(rate * s) * (1.0 / rate + fm.restart_s)


def best_interval_s(work_s: float, rate: float, fm: FailureModel) -> float:
    """Checkpoint interval minimising the expected wall time."""
    young = math.sqrt(2 * fm.checkpoint_s / rate) if rate > 0 else math.inf
    if young >= work_s:  # the run is shorter than a checkpoint interval: one segment
        return work_s
    res = optimize.minimize_scalar(
        lambda t: expected_time_s(work_s, t, rate, fm),
        bounds=(max(young / 100, 1e-3), min(work_s, young * 100)),
        method="bounded",
    )
    return float(res.x)


def sample_time_s(
    work_s: float, interval_s: float, rate: float, fm: FailureModel, samples: int, seed: int = 0
) -> np.ndarray:
    """Wall-time samples: failures per job are negative-binomial over the segments."""
    rng = np.random.default_rng(seed)
    segments = max(1, round(work_s / interval_s))
    s = interval_s + fm.checkpoint_s
    if rate == 0:
        return np.full(samples, segments * s)
    p = math.exp(-rate * s)
    failures = rng.negative_binomial(segments, p, samples)
    q = 1 - p  # truncated exponential on [0, s]: first two moments
    m1 = 1 / rate - s * p / q
    m2 = 2 / rate**2 - (s * s + 2 * s / rate) * p / q
    lost = failures * m1 + np.sqrt(failures * max(m2 - m1 * m1, 0.0)) * rng.standard_normal(samples)
    return segments * s + np.maximum(lost, 0.0) + failures * fm.restart_s


def time_to_train(
    step_s: float,
    steps: int,
    num_gpus: int,
    fm: FailureModel,
    interval_s: float | None = None,
    deadline_s: float | None = None,
    samples: int = 20_000,
    seed: int = 0,
) -> TimeToTrain:
    """Wall time of `steps` steps of `step_s` seconds on `num_gpus` GPUs with failures and checkpoints."""
    work = step_s * steps
    rate = fm.job_failure_rate(num_gpus)
    tau = interval_s if interval_s is not None else best_interval_s(work, rate, fm)
    draws = sample_time_s(work, tau, rate, fm, samples, seed)
    qs = dict(zip(("p50", "p90", "p95", "p99"), np.percentile(draws, [50, 90, 95, 99]).tolist(), strict=True))
    expected = expected_time_s(work, tau, rate, fm)
    return TimeToTrain(
        work,
        tau,
        expected,
        qs,
        work / expected,
        math.sqrt(2 * fm.checkpoint_s / rate) if rate else work,
        float(np.mean(draws <= deadline_s)) if deadline_s is not None else None,
    )
