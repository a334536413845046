"""Variability of a predicted step: sources, how they combine on the step graph, and what they cost.

Sources (coefficients of variation of log-normal factors with mean 1):
- compute_cv: per-task, per-step noise of compute (temporal);
- comm_cv: per-task, per-step noise of communication (heavier: network contention);
- network_cv: one factor per step shared by all communication (a congested or quiet network);
- gpu_cv: per-GPU speed across the fleet (spatial: manufacturing, power, thermals), drawn again for
  each sampled step (below): the spread over allocations of GPUs, not one run's fixed GPUs (run_cv);
- step_cv: one factor per step shared by every compute and communication task (a machine-wide state:
  ranks sharing a host's cores with other processes are descheduled together; measured on this 2-core
  CPU, validation/variability_cpu.py: log compute times of two ranks correlate 0.43 within a step);
- moe_imbalance_cv: per-task, per-step variation of the busiest expert-parallel rank's token load
  around model.moe_token_imbalance (mixture-of-experts models without padding to capacity): it
  scales the routed experts' share of each task (their kernels, their all-to-alls);
- step_autocorrelation: lag-1 correlation ρ of step_cv's log factor between consecutive steps of a run;
- run_cv: one factor per run (an allocation of nodes), shared by every step of that run.
DEFAULTS are illustrative, not fitted: Llama 3 (arXiv 2407.21783 §3.3.4) reports 1–2% throughput
variation; Sinha et al. (SC'22) 8% average same-SKU GPU variation (up to 22%); PRISM ~14% on GEMMs.
Fit them to your measurements (stochastic.distributions) and pass your own, or take the per-task
ones from a profiling database's repeats (noise_from_profile).

How they combine on a step graph whose ranks each stand for some GPUs (StepGraph; approximations, stated):
- a compute task stands for the GPUs that meet at its next collective (a transformer's tp·cp, a DLRM
  rank's one GPU): its noise is the maximum of that many draws, sampled directly (order statistics);
  and a transformer stage's compute is that of the slowest of its dp replicas, which meet at the gradient
  reduction (GraphSampler._slowest_replica: the stage's sum conditioned on being the largest of dp);
- a graph rank runs at the pace of its slowest GPU: per step, one factor per rank, the maximum of the
  persistent factors of the GPUs it stands for (a transformer's pipeline stage: dp·tp·cp GPUs, an
  upper bound: a slow GPU in one data-parallel replica only delays that replica until the gradient
  reduction; a DLRM rank: one GPU);
- communication tasks draw comm noise × the step's network factor; host tasks do not vary.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy import integrate, signal, special, stats

from itercast.config.job import Job
from itercast.graph.execgraph import Category, ExecGraph
from itercast.measurements import Measurement
from itercast.predict import simulate_transformer_step
from itercast.sim.analysis import critical_path
from itercast.sim.engine import simulate
from itercast.sim.montecarlo import simulate_samples


@dataclass(frozen=True)
class VariabilityModel:
    """The sources of the module docstring, each a coefficient of variation (dimensionless), and the
    correlation of step_cv's factor in time.

    step_autocorrelation: ρ in (−1, 1), the lag-1 correlation of the log step factor (step_cv) between
    consecutive steps of one run, a first-order autoregressive process (Box & Jenkins, "Time Series
    Analysis: Forecasting and Control", 1970, ch. 3): x_t = ρ·x_{t−1} + √(1−ρ²)·ε_t with ε i.i.d.
    standard normal, so each step's factor keeps its log-normal marginal and Corr(x_t, x_{t+k}) = ρ^k.
    Why: the blocks of MLPerf Training v4.0 Eos GPT-3 runs correlate up to +0.46 from one block of 9–11
    steps to the next (validation/variability_series.py): slow drift within a run (clocks, thermals:
    Llama 3, arXiv 2407.21783 §3.3.4, saw 1–2% diurnal throughput variation from temperature and DVFS).
    run_cv: one log-normal factor of mean 1 per run, scaling every compute and communication task of
    every step of that run (the node placement, clocks and network path of one allocation). Why: the
    Eos runs of one job differ by up to 0.7% (GPT-3, 512 GPUs) and 5% (LoRA, 1,024 GPUs) in median
    while each run's blocks vary far less; Sinha et al. (SC'22, arXiv 2208.11035) measured 8% average
    same-SKU GPU variation, which a fresh allocation redraws. Both default to 0 (independent steps, one
    run at the mean speed); ρ changes no single step's distribution, only sums over steps
    (ar1_mean_variance_factor; stochastic/time_to_train.py)."""

    compute_cv: float = 0.02
    comm_cv: float = 0.10
    network_cv: float = 0.05
    gpu_cv: float = 0.05
    moe_imbalance_cv: float = 0.10
    step_cv: float = 0.0
    run_cv: float = 0.0
    step_autocorrelation: float = 0.0

    def __post_init__(self) -> None:
        if not -1 < self.step_autocorrelation < 1:
            raise ValueError(f"step_autocorrelation: expected a number in (-1, 1); got {self.step_autocorrelation}")

    def halved(self, source: str) -> VariabilityModel:
        return replace(self, **{source: getattr(self, source) / 2})


#: the sources graph_attribution halves (run_cv only for figures pooled across runs: within one run it
#: changes nothing)
SOURCES = ("compute_cv", "comm_cv", "network_cv", "gpu_cv", "moe_imbalance_cv", "step_cv", "run_cv")
#: profiling-database families whose repeats measure compute noise
COMPUTE_FAMILIES = ("gemm", "conv", "attention")


def noise_from_profile(rows: Iterable[Measurement], min_repeats: int = 3) -> dict[str, float]:
    """compute_cv and comm_cv from a profiling database's repeats: the median over configurations of
    time_std_s / time_s, for compute (GEMM, convolution, attention) and collective rows with at least
    `min_repeats` timed runs. This is the temporal, per-task part measured on one device (cold caches
    included for compute, every rank's scheduling for collectives); network_cv and gpu_cv need a fleet.
    A family without such rows is left out of the result."""
    cvs: dict[str, list[float]] = {"compute_cv": [], "comm_cv": []}
    for m in rows:
        source = "compute_cv" if m.family in COMPUTE_FAMILIES else "comm_cv" if m.family == "collective" else None
        if source and m.repeats >= min_repeats:
            cvs[source].append(m.time_std_s / m.time_s)
    return {source: float(np.median(v)) for source, v in cvs.items() if v}


def _z_max(rng: np.random.Generator, k: int, shape: tuple[int, int]) -> np.ndarray:
    """Standard normals, each the maximum of k i.i.d. draws, sampled directly by inverting the CDF of
    the maximum, F_max(z) = Φ(z)^k: z = Φ⁻¹(U^(1/k)), one draw whatever k (8 or 65,536). Exact for
    i.i.d. draws; the approximation is treating the k ranks as i.i.d. and meeting right after."""
    return special.ndtri(rng.random(shape) ** (1.0 / k)) if k > 1 else rng.standard_normal(shape)


@functools.cache
def _z_max_moments(k: int) -> tuple[float, float]:
    """Mean and standard deviation of the maximum of k i.i.d. standard normals (density k·φ(z)·Φ(z)^(k−1),
    integrated numerically; k = 1: 0 and 1)."""
    if k == 1:
        return 0.0, 1.0

    def density(x: float) -> float:
        return k * float(special.ndtr(x)) ** (k - 1) * np.exp(-x * x / 2) / np.sqrt(2 * np.pi)

    mean = integrate.quad(lambda x: x * density(x), -np.inf, np.inf)[0]
    second = integrate.quad(lambda x: x * x * density(x), -np.inf, np.inf)[0]
    return mean, float(np.sqrt(second - mean * mean))


def lognormal(cv: float, z: np.ndarray) -> np.ndarray:
    """Log-normal factors of mean 1 and coefficient of variation `cv` from standard normals `z`."""
    sigma = np.sqrt(np.log1p(cv * cv))
    return np.exp(sigma * z - sigma * sigma / 2)


def ar1(z: np.ndarray, rho: float) -> np.ndarray:
    """A stationary AR(1) of standard normal marginal along the last axis of i.i.d. standard normals `z`
    (Box & Jenkins 1970, ch. 3): x_0 = z_0, x_t = ρ·x_{t−1} + √(1−ρ²)·z_t, one linear filter pass
    (scipy.signal.lfilter, its initial state set so that x_0 = z_0)."""
    if rho == 0:
        return z
    c = np.sqrt(1 - rho * rho)
    x, _ = signal.lfilter([c], [1.0, -rho], z, axis=-1, zi=(1 - c) * z[..., :1])
    return x


def ar1_mean_variance_factor(n: int | np.ndarray, rho: float) -> float | np.ndarray:
    """Var(mean of n consecutive values of an AR(1) of variance σ² and lag-1 correlation ρ) / (σ²/n).

    Var(Σ x_t) = σ² Σ_i Σ_j ρ^|i−j| = σ² [n + 2 Σ_{k=1}^{n−1} (n−k) ρ^k], so the factor is
    1 + 2 Σ_{k=1}^{n−1} (1 − k/n) ρ^k = (1+ρ)/(1−ρ) − 2ρ(1 − ρ^n) / (n (1−ρ)²) (the geometric sums
    in closed form), → (1+ρ)/(1−ρ) as n → ∞; 1 for independent values (ρ = 0) and for n = 1."""
    n = np.asarray(n, dtype=float)
    out = (1 + rho) / (1 - rho) - 2 * rho * (1 - rho**n) / (n * (1 - rho) ** 2)
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class StepGraph:
    """A step graph and what its ranks stand for: `gpus_per_task`, the GPUs that meet at a compute
    task's next collective (the order statistic of its noise); `gpus_per_rank`, the GPUs one graph rank
    stands for (it runs at its slowest one's pace); `expert_share`, per task, the share the router's
    load scales (none: nothing does)."""

    graph: ExecGraph
    gpus_per_task: int
    gpus_per_rank: int
    expert_share: np.ndarray | None = None
    #: per class (kernel family or collective), per task, the share of its duration; none: each
    #: non-host task wholly its graph family (class_shares_of)
    class_shares: dict[str, np.ndarray] | None = None
    #: data-parallel replicas each graph rank stands for (a transformer's dp), which meet at the step's
    #: gradient reduction: a stage's compute is its slowest replica's (GraphSampler._slowest_replica)
    replicas: int = 1


def transformer_step(
    job: Job,
    graph: ExecGraph,
    expert_share: np.ndarray | None = None,
    class_shares: dict[str, np.ndarray] | None = None,
) -> StepGraph:
    """A transformer's graph (one representative GPU per pipeline stage): a compute task stands for its
    tp·cp peers, a stage for its dp·tp·cp GPUs; the router's load varies nothing when the experts are
    padded to capacity."""
    p, m = job.plan, job.model
    padded = m.moe_capacity_factor is not None and m.moe_pad_to_capacity
    k_task = p.tensor_parallel * p.context_parallel
    return StepGraph(graph, k_task, p.dp * k_task, None if padded else expert_share, class_shares, p.dp)


def build_transformer_step(job: Job, calibration: dict[str, Any] | None = None) -> StepGraph:
    """`job`'s step graph priced by `calibration`'s curves (profile.calibrate.load_calibration; None: the
    built-in ones), each compute task stretched by the communication beside it as `predict` stretches it
    (predict.simulate_transformer_step: the graph its simulation returns), so that the deterministic step is
    predict's; with its routed-expert shares. The stretch is kept as it is under sampling: a draw that moves
    a task's overlap with the communication beside it does not re-price its contention (an approximation)."""
    builder, sim = simulate_transformer_step(job, calibration)
    return transformer_step(job, sim.graph, builder.expert_share(), builder.family_shares())


class GraphSampler:
    """Sampled task durations (tasks × samples) of one step graph under `model`.

    Consecutive samples of a call are consecutive steps: step_cv's factor follows the AR(1) of
    model.step_autocorrelation along them. `run_steps` None: the steps of one run at the mean speed
    (no run factor; the chain restarts, stationary, at each call: simulate_samples' blocks of 1,024).
    `run_steps` k: every k consecutive samples of a call are one run, with one factor of model.run_cv
    and a chain of their own (k = 1: each sample a step of a fresh run, the distribution pooled across
    runs); a call's last run is cut short when k does not divide the call's samples."""

    def __init__(self, step: StepGraph, model: VariabilityModel, run_steps: int | None = None) -> None:
        graph = step.graph
        share = np.zeros(graph.num_tasks) if step.expert_share is None else step.expert_share
        self.imbalanced = np.flatnonzero(share > 0)
        self.imbalanced_share = share[self.imbalanced]
        self.base, self.model = graph.duration_s, model
        self.compute = np.flatnonzero(graph.category == Category.COMPUTE)
        self.comm = np.flatnonzero(graph.category == Category.COMMUNICATION)
        ranks = graph.resource_rank[graph.resource]
        self.stage_of_compute = ranks[self.compute]
        self.stages = int(ranks.max()) + 1 if ranks.size else 1
        self.k_task = step.gpus_per_task
        self.gpus_per_stage = step.gpus_per_rank
        self.replicas = step.replicas
        self.run_steps = run_steps
        self.run_cv = model.run_cv if run_steps is not None else 0.0

    def __call__(self, rng: np.random.Generator, n: int) -> np.ndarray:
        m = self.model
        dur = np.repeat(self.base[:, None], n, axis=1)
        if self.compute.size:
            factor = np.ones((self.compute.size, n))
            if m.compute_cv > 0:
                z = _z_max(rng, self.k_task, (self.compute.size, n))
                if self.replicas > 1:
                    z = self._slowest_replica(rng, z)
                factor *= lognormal(m.compute_cv, z)
            if m.gpu_cv > 0:
                per_stage = lognormal(m.gpu_cv, _z_max(rng, self.gpus_per_stage, (self.stages, n)))
                factor *= per_stage[self.stage_of_compute]
            dur[self.compute] *= factor
        if self.comm.size and (m.comm_cv > 0 or m.network_cv > 0):
            noise = np.ones((self.comm.size, n))
            if m.comm_cv > 0:
                noise *= lognormal(m.comm_cv, rng.standard_normal((self.comm.size, n)))
            if m.network_cv > 0:
                noise *= lognormal(m.network_cv, rng.standard_normal((1, n)))
            dur[self.comm] *= noise
        if m.step_cv > 0 or self.run_cv > 0:
            shared = self._shared(rng, n)
            dur[self.compute] *= shared
            dur[self.comm] *= shared
        if self.imbalanced.size and m.moe_imbalance_cv > 0:
            load = lognormal(m.moe_imbalance_cv, rng.standard_normal((self.imbalanced.size, n)))
            dur[self.imbalanced] *= 1 + self.imbalanced_share[:, None] * (load - 1)
        return dur

    def _slowest_replica(self, rng: np.random.Generator, z: np.ndarray) -> np.ndarray:
        """Compute noise `z` (compute tasks × samples, each the maximum of k_task standard normals) redrawn as
        the slowest of `replicas` data-parallel replicas' per stage: the replicas run the same tasks and meet
        at the gradient reduction, so the stage takes the replica whose tasks sum longest. To first order
        in the noise a replica's stage time is Σ b_i·y_i (b the tasks' durations, y their noise standardised
        by the mean and sd of a maximum of k_task normals, _z_max_moments), whose projection u = d·y on
        d = b / |b| is standard normal; the slowest replica's is the maximum of `replicas` of them (_z_max),
        and its tasks are y conditioned on that sum (a Gaussian's conditional): y + d·(u_max − u). Exact
        for normal y; with many tasks a stage's sum is near normal whatever y (central limit)."""
        mean, sd = _z_max_moments(self.k_task)
        y = (z - mean) / sd
        u_max = _z_max(rng, self.replicas, (self.stages, z.shape[1]))
        base = self.base[self.compute]
        for stage in range(self.stages):
            rows = self.stage_of_compute == stage
            norm = float(np.linalg.norm(base[rows]))
            if norm > 0:
                d = base[rows] / norm
                y[rows] += d[:, None] * (u_max[stage] - d @ y[rows])[None, :]
        return mean + sd * y

    def _shared(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """(1, n) factors shared by every compute and communication task of a step: step_cv's factor
        (AR(1) along each run's steps) times its run's factor."""
        m, per_run = self.model, self.run_steps or n
        runs = -(-n // per_run)
        shared = np.ones((1, n))
        if m.step_cv > 0:
            z = ar1(rng.standard_normal((runs, per_run)), m.step_autocorrelation)
            shared *= lognormal(m.step_cv, z.reshape(1, -1)[:, :n])
        if self.run_cv > 0:
            shared *= lognormal(self.run_cv, np.repeat(rng.standard_normal(runs), per_run)[None, :n])
        return shared


class StepSampler(GraphSampler):
    """The sampler of a transformer `job`'s step graph (transformer_step)."""

    def __init__(
        self, job: Job, graph: ExecGraph, model: VariabilityModel, expert_share: np.ndarray | None = None
    ) -> None:
        """`expert_share`: per task, the share the router's load scales (TransformerStepBuilder.expert_share);
        none: nothing does (padded to capacity, or a dense model)."""
        super().__init__(transformer_step(job, graph, expert_share), model)


@dataclass(frozen=True)
class StepDistribution:
    deterministic_s: float
    samples_s: np.ndarray

    def quantiles(self) -> dict[str, float]:
        qs = np.percentile(self.samples_s, [50, 90, 95, 99])
        return {"p50_s": float(qs[0]), "p90_s": float(qs[1]), "p95_s": float(qs[2]), "p99_s": float(qs[3])}

    def probability_within(self, t_s: float) -> float:
        return float(np.mean(self.samples_s <= t_s))

    @property
    def slowdown(self) -> float:
        """Mean sampled step over the deterministic one: what variability at this scale costs."""
        return float(self.samples_s.mean() / self.deterministic_s)


def step_distribution(job: Job, model: VariabilityModel, samples: int = 10_000, seed: int = 0) -> StepDistribution:
    """A transformer job's step-time distribution (graph_distribution of build_transformer_step)."""
    return graph_distribution(build_transformer_step(job), model, samples, seed)


def graph_distribution(
    step: StepGraph, model: VariabilityModel, samples: int = 10_000, seed: int = 0, across_runs: bool = False
) -> StepDistribution:
    """The deterministic step and `samples` sampled steps of a step graph: of one run at the mean speed,
    or, `across_runs`, each of a fresh run (model.run_cv widens it; model.step_autocorrelation moves
    neither: it changes no single step's distribution)."""
    sampled = simulate_samples(step.graph, GraphSampler(step, model, run_steps_of(across_runs)), samples, seed)
    return StepDistribution(simulate(step.graph).step_time_s, sampled)


def run_steps_of(across_runs: bool) -> int | None:
    """GraphSampler's `run_steps` for a figure of one run at the mean speed (None: model.run_cv left out)
    or pooled across runs (1: each sample a step of a fresh run, its own draw of model.run_cv): the one
    convention of graph_distribution, graph_attribution and graph_sensitivity."""
    return 1 if across_runs else None


#: steps sampled per source or class by the attribution and the sensitivity (and the CLI's cap on them: each
#: resamples the whole step once per source or class)
ATTRIBUTION_SAMPLES = 4_000


def attribution(
    job: Job, model: VariabilityModel, samples: int = ATTRIBUTION_SAMPLES, seed: int = 0, across_runs: bool = False
) -> list[dict[str, Any]]:
    """A transformer job's attribution (graph_attribution of build_transformer_step)."""
    return graph_attribution(build_transformer_step(job), model, samples, seed, across_runs)


#: a p50→p99 spread below this share of the median step has no change worth a figure (spread_change None): a
#: host-bound DLRM step's 15 ns over 1.4 ms, halved by one source, read as "−41%"
SPREAD_FLOOR = 1e-3


def graph_attribution(
    step: StepGraph,
    model: VariabilityModel,
    samples: int = ATTRIBUTION_SAMPLES,
    seed: int = 0,
    across_runs: bool = False,
) -> list[dict[str, Any]]:
    """For each source: the relative change of the p95 (`p95_change`) and of the p50→p99 spread
    (`spread_change`) with that source's CV halved (same seed), each with its Monte Carlo standard error
    (`p95_change_se`, `spread_change_se`: paired_standard_error; both None where the spread is under SPREAD_FLOOR
    of the median step), of steps of one run at the mean speed or,
    `across_runs`, each of a fresh run (graph_distribution's convention). The run level (run_cv) is a
    source only across runs: within one run its factor is 1 (GraphSampler)."""
    graph, share, runs = step.graph, step.expert_share, run_steps_of(across_runs)
    base = simulate_samples(graph, GraphSampler(step, model, runs), samples, seed)
    spread = np.percentile(base, 99) - np.percentile(base, 50)
    spread_seen = spread > SPREAD_FLOOR * np.percentile(base, 50)
    out = []
    for source in SOURCES:
        if (
            getattr(model, source) == 0
            or (source == "moe_imbalance_cv" and (share is None or not share.any()))
            or (source == "run_cv" and runs is None)
        ):
            continue
        s = simulate_samples(graph, GraphSampler(step, model.halved(source), runs), samples, seed)
        row = {
            "source": source,
            "p95_change": float(_p95_change(base, s)),
            "p95_change_se": paired_standard_error(base, s, _p95_change, seed),
            "spread_change": None,
            "spread_change_se": None,
        }
        if spread_seen:
            row["spread_change"] = float(_spread_change(base, s))
            row["spread_change_se"] = paired_standard_error(base, s, _spread_change, seed)
        out.append(row)
    return sorted(out, key=lambda r: r["p95_change"])


#: collective families of the step graphs (TransformerStepBuilder.family_shares, graph families) by
#: kind and group, as the sensitivity table names them
_GROUPS = {"tp": "TP", "cp": "CP", "ep": "EP", "etp": "expert TP", "dp": "DP", "pp": "PP"}


def collective_label(kind: str) -> str:
    """A collective kind as the tables name it: `reduce_scatter` → "reduce-scatter", `p2p` → "send/recv"."""
    return {"p2p": "send/recv", "p2p_exposed": "send/recv (exposed ring)", "alltoall": "all-to-all"}.get(
        kind, kind.replace("_", "-")
    )


def class_label(family: str) -> str:
    """`tp_reduce_scatter` → "reduce-scatter × TP", `pp_p2p` → "send/recv × PP"; a kernel family as is."""
    if family == "grad_norm_all_reduce":
        return "all-reduce × PP (gradient norm)"
    group, _, kind = family.partition("_")
    if group not in _GROUPS or not kind:
        return family
    return f"{collective_label(kind)} × {_GROUPS[group]}"


def class_shares_of(step: StepGraph) -> dict[str, np.ndarray]:
    """The step's classes: its own `class_shares`, else each non-host task wholly its graph family."""
    if step.class_shares is not None:
        return step.class_shares
    g = step.graph
    out: dict[str, np.ndarray] = {}
    for task in np.flatnonzero(g.category != Category.HOST).tolist():
        out.setdefault(g.families[g.family[task]], np.zeros(g.num_tasks))[task] = 1.0
    return out


class _ClassNoise(GraphSampler):
    """The sampler of `model` (`runs`: GraphSampler's run_steps), then one class's share of each task
    scaled by a log-normal factor of CV `cv`, drawn after the model's (same seed: the model's draws are
    the base sampler's)."""

    def __init__(
        self, step: StepGraph, model: VariabilityModel, share: np.ndarray, cv: float, runs: int | None
    ) -> None:
        super().__init__(step, model, runs)
        self.tasks, self.cv = np.flatnonzero(share > 0), cv
        self.share = share[self.tasks]

    def __call__(self, rng: np.random.Generator, n: int) -> np.ndarray:
        dur = super().__call__(rng, n)
        factor = lognormal(self.cv, rng.standard_normal((self.tasks.size, n)))
        dur[self.tasks] *= 1 + self.share[:, None] * (factor - 1)
        return dur


#: paired bootstrap resamples behind a sampled figure's Monte Carlo standard error (paired_standard_error)
BOOTSTRAP_RESAMPLES = 200

#: a statistic of two paired sample arrays along an axis (scipy.stats.bootstrap's vectorized form)
PairedStatistic = Callable[[np.ndarray, np.ndarray, int], np.ndarray]


def paired_standard_error(base: np.ndarray, other: np.ndarray, statistic: PairedStatistic, seed: int = 0) -> float:
    """Monte Carlo standard error of `statistic`(base, other): its standard deviation over BOOTSTRAP_RESAMPLES
    paired bootstrap resamples of the samples (scipy.stats.bootstrap, paired: sample i of both arrays drawn
    together, as common random numbers draw them; Efron & Tibshirani 1993, ch. 6). A figure within about two
    standard errors of zero is noise of the sampling. Resamples are evaluated in batches of at most ~2M
    values, so memory stays bounded for long pooled arrays."""
    base, other = np.asarray(base, dtype=float), np.asarray(other, dtype=float)
    res = stats.bootstrap(
        (base, other),
        statistic,
        paired=True,
        vectorized=True,
        n_resamples=BOOTSTRAP_RESAMPLES,
        batch=max(1, 2_000_000 // base.size),
        method="percentile",
        random_state=np.random.default_rng(seed),
    )
    return float(res.standard_error)


#: below this share of the critical path in the classes the sensitivity varies, the rest is said (uncovered_note)
COVERED_PATH_MIN = 0.9


def uncovered_note(rows: list[dict[str, Any]]) -> list[str]:
    """What the sensitivity's classes (graph_sensitivity, trace_sensitivity rows) leave of the step's critical path,
    said where they cover less than COVERED_PATH_MIN of it: the rest is host time (launches, gaps between operators)
    or edge latencies, which none of the noise sources varies, so the quantiles hold it fixed."""
    covered = sum(r["critical_path_share"] for r in rows)
    if covered >= COVERED_PATH_MIN:
        return []
    return [
        f"the kernel and collective classes cover {covered:.0%} of the step's critical path: the other "
        f"{1 - covered:.0%} (host time between launches, gaps) varies with no noise source here, so the quantiles "
        "and the table of what to steady hold it fixed"
    ]


def p95_shift_per_cv(base: np.ndarray, noisy: np.ndarray, delta_cv: float, seed: int = 0) -> tuple[float, float]:
    """(p95 of `noisy` − p95 of `base`) / `delta_cv`, seconds per unit of CV, and its Monte Carlo standard
    error (paired_standard_error)."""
    shift = float(_p95_difference(base, noisy) / delta_cv)
    return shift, paired_standard_error(base, noisy, _p95_difference, seed) / delta_cv


def _p95_difference(base: np.ndarray, noisy: np.ndarray, axis: int = -1) -> np.ndarray:
    """p95 of `noisy` − p95 of `base` along `axis` (p95_shift_per_cv's statistic)."""
    return np.percentile(noisy, 95, axis=axis) - np.percentile(base, 95, axis=axis)


def _p95_change(base: np.ndarray, other: np.ndarray, axis: int = -1) -> np.ndarray:
    """p95 of `other` over p95 of `base`, − 1, along `axis` (graph_attribution's p95_change)."""
    return np.percentile(other, 95, axis=axis) / np.percentile(base, 95, axis=axis) - 1


def _spread_change(base: np.ndarray, other: np.ndarray, axis: int = -1) -> np.ndarray:
    """The p50→p99 spread of `other` over `base`'s, − 1, along `axis` (graph_attribution's spread_change)."""
    b50, b99 = np.percentile(base, [50, 99], axis=axis)
    o50, o99 = np.percentile(other, [50, 99], axis=axis)
    return (o99 - o50) / (b99 - b50) - 1


def graph_sensitivity(
    step: StepGraph,
    model: VariabilityModel,
    delta_cv: float = 0.25,
    samples: int = ATTRIBUTION_SAMPLES,
    seed: int = 0,
    across_runs: bool = False,
) -> list[dict[str, Any]]:
    """Per class (kernel family, collective kind × group): how much the step's p95 grows per unit
    of CV added to that class's time (`dp95_per_cv_s`: (p95 with `delta_cv` more − p95) / delta_cv,
    common random numbers) and that figure's Monte Carlo standard error (`dp95_per_cv_se_s`,
    p95_shift_per_cv), its seconds on the deterministic critical path and their share of the
    step, and its seconds in the whole graph. A class can be large and noisy yet off the critical
    path (dp95 ≈ 0), or small and on it (PRISM, arXiv 2510.15596: where a kernel sits on the critical
    path matters more than its own CV). Sorted by dp95, largest first. Noise added to many short
    tasks in series averages out, so such a class moves the p95 little; a figure within about two
    standard errors of zero is Monte Carlo noise (a different seed moves it). Steps of one run at the
    mean speed or, `across_runs`, each of a fresh run (graph_distribution's convention): the run level
    (model.run_cv) widens the base a class's noise adds to, so it moves every row."""
    g, runs = step.graph, run_steps_of(across_runs)
    det = simulate(g)
    on_path = np.zeros(g.num_tasks, dtype=bool)
    on_path[critical_path(det)] = True
    base = simulate_samples(g, GraphSampler(step, model, runs), samples, seed)
    out = []
    for name, share in class_shares_of(step).items():
        noisy = simulate_samples(g, _ClassNoise(step, model, share, delta_cv, runs), samples, seed)
        path_s = float(np.sum(g.duration_s * share * on_path))
        shift_s, se_s = p95_shift_per_cv(base, noisy, delta_cv, seed)
        out.append(
            {
                "class": class_label(name),
                "dp95_per_cv_s": shift_s,
                "dp95_per_cv_se_s": se_s,
                "critical_path_s": path_s,
                "critical_path_share": path_s / det.step_time_s,
                "total_s": float(np.sum(g.duration_s * share)),
            }
        )
    return sorted(out, key=lambda r: -r["dp95_per_cv_s"])
