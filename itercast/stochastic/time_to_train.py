"""Time to train with failures and checkpoints: expectation, distribution, interruptions, deadline, best interval.

Model: Daly's complete restart-dump model (J. T. Daly, "A higher order estimate of the optimum
checkpoint interval for restart dumps", Future Generation Computer Systems 22(3), 2006,
doi:10.1016/j.future.2004.11.016, §3). Failures arrive as a Poisson process through the whole wall
time, restarts included. A synchronous job stops when any of its GPUs does, so the job's rate is
λ = GPUs / MTBF_per_GPU (its MTBF is the per-GPU one divided by the GPUs). Work runs in segments
of τ seconds, each followed by a checkpoint of δ seconds; a failure loses the segment in progress
and costs a restart of R seconds, which a failure during it starts over. A segment of s = τ + δ
then takes, in expectation,

    E[segment] = e^{λR} · (e^{λs} − 1) / λ

(Daly's T_w / (T_s/τ) with M = 1/λ). Per segment, the failed attempts are geometric with success
probability e^{−λs} (mean e^{λs} − 1); per restart, the failed restarts are geometric with success
probability e^{−λR}. Over K segments both counts are negative-binomial: Monte Carlo samples them
directly, and the time lost per failure (a truncated exponential on [0, s] or [0, R]) is summed by
its first two moments (a normal approximation, exact in mean; the tests check the mean against the
closed form). Interruptions arrive at rate λ through all wall time: λ · E[wall] are expected.
The effective training time (useful training over elapsed time, the Llama 3 paper's measure,
arXiv 2407.21783 §3.3.4) is τ / E[segment] over a long run. The best interval minimises E[wall]
numerically; Young's first-order τ ≈ √(2δ/λ) (J. W. Young, "A first order approximation to the
optimum checkpoint interval", CACM 17(9), 1974) is reported beside it.

Step variability (stochastic/variability.py's step_cv, step_autocorrelation, run_cv) stretches the
failure-free work: N steps of mean m take N·m·R·M̄, R the run's factor (log-normal, mean 1, CV run_cv)
and M̄ the mean of the N step factors S_t = exp(σ x_t − σ²/2), σ² = ln(1 + step_cv²), x an AR(1) of
lag-1 ρ. Cov(S_t, S_{t+k}) = exp(σ² ρ^k) − 1 ≈ σ² ρ^k (small σ), so Var M̄ ≈ σ²/N · [1 + 2 Σ_{k<N}
(1 − k/N) ρ^k] (variability.ar1_mean_variance_factor), → σ²/N · (1+ρ)/(1−ρ) for large N; R is drawn
once per job, independent of M̄, so the job's relative variance is ≈ σ_run² + σ²/N · (1+ρ)/(1−ρ) to
first order: the step term shrinks as 1/N (a long job's own step noise averages out), the run term
does not. Both are sampled as log-normal factors of mean 1 (variability.lognormal) and stretch the
training part of the wall time only, (factor − 1) × work added to each sample: checkpoints and
restarts keep their length, and the failures a slower run would meet in its longer work are not
added (second order: λ × the extra work, per sample).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from itercast.stochastic.variability import ar1_mean_variance_factor, lognormal

HOUR_S = 3600.0
DAY_S = 24 * HOUR_S


@dataclass(frozen=True)
class FailureModel:
    """mtbf_per_gpu_s: mean time between failures of one GPU (its share of node, network, software);
    checkpoint_s: time the training stops to write one checkpoint; restart_s: time from a failure to
    training again (detection, rescheduling, initialisation, loading the checkpoint)."""

    mtbf_per_gpu_s: float
    checkpoint_s: float
    restart_s: float

    @classmethod
    def from_interruptions(
        cls, interruptions: int, wall_s: float, num_gpus: int, checkpoint_s: float, restart_s: float
    ) -> FailureModel:
        """The per-GPU MTBF of a job that saw `interruptions` in `wall_s` seconds on `num_gpus` GPUs:
        failures arrive at rate λ through all wall time (the model's assumption), so the maximum
        likelihood rate is interruptions / wall_s and the per-GPU MTBF num_gpus · wall_s / interruptions."""
        return cls(num_gpus * wall_s / interruptions, checkpoint_s, restart_s)

    def job_failure_rate(self, num_gpus: int) -> float:
        """Failures of the whole job per second."""
        return num_gpus / self.mtbf_per_gpu_s


@dataclass(frozen=True)
class TimeToTrain:
    """work_s: failure-free training time; interval_s: work between checkpoints; expected_s: expected
    wall time; quantiles_s: its p50_s/p90_s/p95_s/p99_s (seconds); goodput: work_s / expected_s (effective training
    time); young_interval_s: Young's √(2δ/λ); deadline_probability: P(wall ≤ deadline) at interval_s;
    expected_interruptions: failures expected during the wall time (restarts included);
    deadline_interval_s, best_deadline_probability: the interval that maximises P(wall ≤ deadline) and that
    probability (deadline_interval; None without a deadline, interval_s where the interval was given)."""

    work_s: float
    interval_s: float
    expected_s: float
    quantiles_s: dict[str, float]
    goodput: float
    young_interval_s: float
    deadline_probability: float | None
    expected_interruptions: float
    deadline_interval_s: float | None = None
    best_deadline_probability: float | None = None


#: ln of the expected attempts of one segment (λ × (work + checkpoint + restart)) beyond which a job is refused
#: as never finishing: e^13.8 ≈ a million tries, where e^(λs) would soon overflow and the samplers' failure
#: probability underflow
MAX_LOG_ATTEMPTS = 13.8


def _refuse_unfinishable(work_s: float, rate: float, fm: FailureModel, num_gpus: int) -> None:
    """A ValueError when a segment of `work_s` seconds with its checkpoint and a restart needs more than
    e^MAX_LOG_ATTEMPTS attempts at `rate` failures a second: the job would not finish."""
    tries = rate * (work_s + fm.checkpoint_s + fm.restart_s)
    if tries > MAX_LOG_ATTEMPTS:
        overheads = f"{fm.checkpoint_s:g} s checkpoint and a {fm.restart_s:g} s restart"
        what = f"a {overheads} alone need" if work_s == 0 else f"{work_s:.3g} s of work with its {overheads} needs"
        raise ValueError(
            f"time to train: the job would not finish: its {num_gpus} GPUs fail every {1 / rate:.3g} s on average, "
            f"and {what} about e^{tries:.0f} attempts (a longer MTBF, or shorter checkpoints and restarts)"
        )


def _segment_s(length_s: float, rate: float, fm: FailureModel) -> float:
    """E[time] of one segment of `length_s` seconds (work and its checkpoint) with its failures and
    restarts: e^{λR} (e^{λs} − 1) / λ (module docstring); s itself without failures."""
    if rate == 0:
        return length_s
    return math.expm1(rate * length_s) / rate * math.exp(rate * fm.restart_s)


def _segments(work_s: float, interval_s: float) -> tuple[int, float]:
    """(Whole segments of `interval_s`, the last segment's work, 0 when it divides) of `work_s`."""
    whole = math.floor(work_s / interval_s * (1 + 1e-12))  # 5 intervals of work are 5, not 4 and a sliver
    return whole, max(0.0, work_s - whole * interval_s)


def expected_time_s(work_s: float, interval_s: float, rate: float, fm: FailureModel) -> float:
    """E[wall time] for `work_s` seconds of training in segments of `interval_s`, each with its
    checkpoint, the last one shorter when the interval does not divide the work (closed form)."""
    whole, rest_s = _segments(work_s, interval_s)
    last = _segment_s(rest_s + fm.checkpoint_s, rate, fm) if rest_s > 0 else 0.0
    return whole * _segment_s(interval_s + fm.checkpoint_s, rate, fm) + last


def effective_training_time(interval_s: float, rate: float, fm: FailureModel) -> float:
    """Useful training over elapsed time in a long run: interval_s / E[segment]."""
    return interval_s / _segment_s(interval_s + fm.checkpoint_s, rate, fm)


def best_interval_s(work_s: float, rate: float, fm: FailureModel) -> float:
    """Checkpoint interval minimising the expected wall time of `work_s` seconds of training (math.inf: a
    long run). A long run's E[wall] is work_s × E[segment] / τ: the τ minimising E[segment] / τ. A finite
    run cut at that τ leaves a shorter last segment that still pays a whole checkpoint; cut into k equal
    segments its E[wall] is k × E[segment of work_s / k] (expected_time_s), least at a k beside
    work_s / τ, so the best of those is taken (a run of 2.5 long-run intervals: 3 equal segments, 4.6%
    shorter than 2 intervals and a half; a run shorter than one interval: one segment, or two if failures
    make that shorter)."""
    if rate == 0:
        return work_s
    young = math.sqrt(2 * fm.checkpoint_s / rate)
    res = optimize.minimize_scalar(
        lambda t: _segment_s(t + fm.checkpoint_s, rate, fm) / t,
        bounds=(max(young / 100, 1e-3), young * 100),
        method="bounded",
        options={"xatol": 1e-6 * young},
    )
    if math.isinf(work_s):
        return float(res.x)
    near = math.floor(work_s / float(res.x))
    counts = {k for k in (near - 1, near, near + 1, near + 2) if k >= 1}
    return min((work_s / k for k in sorted(counts)), key=lambda t: expected_time_s(work_s, t, rate, fm))


def longest_restart_s(target: float, rate: float, checkpoint_s: float) -> float:
    """The longest restart keeping the effective training time at `target` or above, at the best
    interval: restarts only scale E[segment] by e^{λR}, so R = ln(best effective with R = 0 / target) / λ
    (negative: the checkpoint alone already costs more than 1 − target)."""
    no_restart = FailureModel(1.0, checkpoint_s, 0.0)
    best = effective_training_time(best_interval_s(math.inf, rate, no_restart), rate, no_restart)
    return math.log(best / target) / rate


#: interruption counts up to this are summed draw by draw (exactly); above, by the normal approximation
EXACT_COUNTS = 64


def _truncated_exponential_sums(
    rng: np.random.Generator, counts: np.ndarray, rate: float, length_s: float
) -> np.ndarray:
    """Sums of `counts` draws of an exponential of `rate` conditioned below `length_s` (the time a
    failure interrupts into a span of that length): draw by draw (inverse CDF, −ln(1 − u·q)/rate with
    q = 1 − e^(−rate·length)) for counts up to EXACT_COUNTS, else by their first two moments (normal
    approximation, clipped at 0: with few failures that clip would put a lump at no time lost)."""
    if length_s <= 0:
        return np.zeros(counts.shape)
    p = math.exp(-rate * length_s)
    q = -math.expm1(-rate * length_s)
    m1 = 1 / rate - length_s * p / q
    m2 = 2 / rate**2 - (length_s * length_s + 2 * length_s / rate) * p / q
    noise = np.sqrt(counts * max(m2 - m1 * m1, 0.0)) * rng.standard_normal(counts.shape)
    out = np.maximum(counts * m1 + noise, 0.0)
    few = counts <= EXACT_COUNTS
    most = int(counts[few].max()) if few.any() else 0
    if most > 0:
        draws = -np.log1p(-rng.random((int(few.sum()), most)) * q) / rate
        out[few] = np.where(np.arange(most) < counts[few][:, None], draws, 0.0).sum(axis=1)
    return out


def _negative_binomial(rng: np.random.Generator, successes: np.ndarray | int, p: float, samples: int) -> np.ndarray:
    """Failures before `successes` successes of probability p (0 where successes is 0)."""
    n = np.broadcast_to(np.asarray(successes), (samples,))
    if p >= 1.0:
        return np.zeros(samples, dtype=np.int64)
    return np.where(n > 0, rng.negative_binomial(np.maximum(n, 1), p, samples), 0)


def sample_time_s(
    work_s: float, interval_s: float, rate: float, fm: FailureModel, samples: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(wall-time samples, interruption counts): failed segments are negative-binomial over the
    segments, failed restarts negative-binomial over the failures."""
    rng = np.random.default_rng(seed)
    whole, rest_s = _segments(work_s, interval_s)
    s = interval_s + fm.checkpoint_s
    last = rest_s + fm.checkpoint_s if rest_s > 0 else 0.0  # the shorter last segment (expected_time_s)
    if rate == 0:
        return np.full(samples, whole * s + last), np.zeros(samples, dtype=np.int64)
    failures = _negative_binomial(rng, whole, math.exp(-rate * s), samples)
    last_failures = _negative_binomial(rng, int(last > 0), math.exp(-rate * last), samples)
    interrupted = failures + last_failures
    failed_restarts = _negative_binomial(rng, interrupted, math.exp(-rate * fm.restart_s), samples)
    wall = (
        whole * s
        + last
        + _truncated_exponential_sums(rng, failures, rate, s)
        + _truncated_exponential_sums(rng, last_failures, rate, last)
        + interrupted * fm.restart_s
        + _truncated_exponential_sums(rng, failed_restarts, rate, fm.restart_s)
    )
    return wall, interrupted + failed_restarts


#: equal-segment counts tried by deadline_interval: a geometric grid from one segment to the most the deadline
#: leaves room for, then as many between the best one's neighbours
DEADLINE_GRID = 48


def deadline_interval(
    work_s: float,
    deadline_s: float,
    rate: float,
    fm: FailureModel,
    least_s: float,
    samples: int,
    seed: int,
    stretch_s: np.ndarray,
) -> tuple[float, float]:
    """(The checkpoint interval maximising P(wall ≤ deadline), that probability) for `work_s` seconds of work cut
    into k equal segments. The interval least in expectation (best_interval_s) minimises the mean, not the tail
    the deadline reads: with rare failures it is long, and one failure then loses much of it, so P(deadline) at
    that interval can rise as failures grow more frequent and the interval shorter; the best P(deadline) cannot
    (for one k, more failures never make a run shorter). Every segment pays its checkpoint δ, so k is at most
    (deadline − work)/δ (beyond, no run is in time), and at least what keeps a segment's attempts within
    e^MAX_LOG_ATTEMPTS (fewer never finish); counts between the two on a geometric grid of
    DEADLINE_GRID, then as many between the best one's neighbours, each sampled by sample_time_s with the same
    seed and `stretch_s` (the step variability's added seconds per sample, speed_factors); `least_s` the least
    expected interval (best_interval_s); of equal
    probabilities the one least in expectation is kept, and the least expected interval unless the best beats
    it by more than two standard errors of their difference (a sampling noise's lead is no reason to move)."""
    most = int(min((deadline_s - work_s) / fm.checkpoint_s, 1e7)) if fm.checkpoint_s > 0 else 10**7
    if most < 1 or rate == 0:  # no run in time, or every run the same: the least expected interval
        wall, _ = sample_time_s(work_s, least_s, rate, fm, samples, seed)
        return least_s, float(np.mean(wall + stretch_s <= deadline_s))
    # the fewest segments a run can finish in: λ (s + δ + R) within MAX_LOG_ATTEMPTS (_refuse_unfinishable)
    fewest = max(1, math.ceil(rate * work_s / max(MAX_LOG_ATTEMPTS - rate * (fm.checkpoint_s + fm.restart_s), 1e-9)))
    if fewest > most:
        return least_s, 0.0
    tried: dict[int, tuple[float, float]] = {}

    def score(k: int) -> tuple[float, float]:
        if k not in tried:
            wall, _ = sample_time_s(work_s, work_s / k, rate, fm, samples, seed)
            tried[k] = (float(np.mean(wall + stretch_s <= deadline_s)), -expected_time_s(work_s, work_s / k, rate, fm))
        return tried[k]

    least = max(1, round(work_s / least_s))
    ends = min(max(least, fewest), most)
    grid = sorted({*np.unique(np.geomspace(fewest, most, DEADLINE_GRID).round().astype(int)).tolist(), ends})
    best = max(grid, key=score)
    at = grid.index(best)
    low, high = grid[max(at - 1, 0)], grid[min(at + 1, len(grid) - 1)]
    best = max([best, *np.unique(np.geomspace(low, high, DEADLINE_GRID).round().astype(int)).tolist()], key=score)
    (p_best, _), (p_least, _) = tried[best], tried[ends]
    if p_best - p_least <= 2 * math.sqrt((p_best * (1 - p_best) + p_least * (1 - p_least)) / samples):
        best = ends  # within two standard errors of the least expected interval's: not told apart from it
    return work_s / best, tried[best][0]


def speed_factors(
    steps: int, step_cv: float, step_autocorrelation: float, run_cv: float, samples: int, seed: int
) -> np.ndarray:
    """Per sample, a job's mean step over `steps` steps relative to the mean step (module docstring):
    a log-normal of mean 1 and CV² = exp(σ²/N · ar1_mean_variance_factor(N, ρ)) − 1, σ² = ln(1 + step_cv²),
    times the run's log-normal factor of CV run_cv."""
    rng = np.random.default_rng((seed, 1))  # a stream apart from the failures' (sample_time_s)
    sigma2_mean = math.log1p(step_cv**2) / steps * ar1_mean_variance_factor(steps, step_autocorrelation)
    mean_cv = math.sqrt(math.expm1(sigma2_mean))
    return lognormal(mean_cv, rng.standard_normal(samples)) * lognormal(run_cv, rng.standard_normal(samples))


def time_to_train(
    step_s: float,
    steps: int,
    num_gpus: int,
    fm: FailureModel,
    interval_s: float | None = None,
    deadline_s: float | None = None,
    samples: int = 20_000,
    seed: int = 0,
    step_cv: float = 0.0,
    step_autocorrelation: float = 0.0,
    run_cv: float = 0.0,
) -> TimeToTrain:
    """Wall time of `steps` steps of `step_s` seconds (their mean) on `num_gpus` GPUs with failures and
    checkpoints. `step_cv`: one step's CV within a run, taken whole as an AR(1) of lag-1
    `step_autocorrelation` (an upper bound on the job's spread when only part of the step, the shared
    step factor, is correlated: independent parts average out faster); `run_cv`: the run's factor."""
    if not (step_s > 0 and steps >= 1 and num_gpus >= 1 and (interval_s is None or interval_s > 0)):
        raise ValueError(
            f"time to train: expected step_s > 0, steps ≥ 1, num_gpus ≥ 1 and interval_s > 0; got step_s {step_s}, "
            f"steps {steps}, num_gpus {num_gpus}, interval_s {interval_s}"
        )
    work = step_s * steps
    rate = fm.job_failure_rate(num_gpus)
    _refuse_unfinishable(0.0, rate, fm, num_gpus)  # before the interval's search, whose segments would overflow
    tau = interval_s if interval_s is not None else best_interval_s(work, rate, fm)
    _refuse_unfinishable(min(tau, work), rate, fm, num_gpus)
    draws, _ = sample_time_s(work, tau, rate, fm, samples, seed)
    stretch_s = np.zeros(samples)
    if step_cv > 0 or run_cv > 0:
        stretch_s = (speed_factors(steps, step_cv, step_autocorrelation, run_cv, samples, seed) - 1) * work
    draws = draws + stretch_s
    in_time = float(np.mean(draws <= deadline_s)) if deadline_s is not None else None
    best: tuple[float | None, float | None] = (None, None)
    if deadline_s is not None:
        # a given interval's own probability is the best there is, and none beats every sample in time
        fixed = interval_s is not None or in_time == 1.0
        best = (tau, in_time) if fixed else deadline_interval(work, deadline_s, rate, fm, tau, samples, seed, stretch_s)
    qs = dict(zip(("p50_s", "p90_s", "p95_s", "p99_s"), np.percentile(draws, [50, 90, 95, 99]).tolist(), strict=True))
    expected = expected_time_s(work, tau, rate, fm)
    return TimeToTrain(
        work,
        tau,
        expected,
        qs,
        work / expected,
        math.sqrt(2 * fm.checkpoint_s / rate) if rate else work,
        in_time,
        rate * expected,
        *best,
    )
