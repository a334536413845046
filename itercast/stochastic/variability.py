"""Variability of a predicted step: sources, how they combine on the step graph, and what they cost.

Sources (coefficients of variation of log-normal factors with mean 1):
- compute_cv: per-task, per-step noise of compute (temporal);
- comm_cv: per-task, per-step noise of communication (heavier: network contention);
- network_cv: one factor per step shared by all communication (a congested or quiet network);
- gpu_cv: persistent per-GPU speed across the fleet (spatial: manufacturing, power, thermals);
- moe_imbalance_cv: per-task, per-step variation of the busiest expert-parallel rank's token load
  around model.moe_token_imbalance (mixture-of-experts models without padding to capacity): it
  scales the routed experts' share of each task (their kernels, their all-to-alls).
DEFAULTS are illustrative, not fitted: Llama 3 (arXiv 2407.21783 §3.3.4) reports 1–2% throughput
variation; Sinha et al. (SC'22) 8% average same-SKU GPU variation (up to 22%); PRISM ~14% on GEMMs.
Fit them to your measurements (stochastic.distributions) and pass your own, or take the per-task
ones from a profiling database's repeats (noise_from_profile).

How they combine on the graph of one representative GPU per pipeline stage (approximations, stated):
- a compute task stands for the tp·cp GPUs that meet at the next tensor-parallel collective: its noise
  is the maximum of tp·cp draws, sampled directly (order statistics);
- a stage runs at the pace of its slowest GPU: per step, one factor per stage, the maximum of its
  dp·tp·cp GPUs' persistent factors (an upper bound: a slow GPU in one data-parallel replica only
  delays that replica until the gradient reduction);
- communication tasks draw comm noise × the step's network factor; host tasks do not vary.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy import special

from itercast.config.job import Job
from itercast.graph.execgraph import Category, ExecGraph
from itercast.measurements import Measurement
from itercast.sim.engine import simulate
from itercast.sim.montecarlo import simulate_samples
from itercast.workloads.transformer import TransformerStepBuilder


@dataclass(frozen=True)
class VariabilityModel:
    compute_cv: float = 0.02
    comm_cv: float = 0.10
    network_cv: float = 0.05
    gpu_cv: float = 0.05
    moe_imbalance_cv: float = 0.10

    def halved(self, source: str) -> VariabilityModel:
        return replace(self, **{source: getattr(self, source) / 2})


SOURCES = ("compute_cv", "comm_cv", "network_cv", "gpu_cv", "moe_imbalance_cv")
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


def _lognormal(cv: float, z: np.ndarray) -> np.ndarray:
    sigma = np.sqrt(np.log1p(cv * cv))
    return np.exp(sigma * z - sigma * sigma / 2)


class StepSampler:
    """Sampled task durations (tasks × samples) of one step of `job` under `model`."""

    def __init__(
        self, job: Job, graph: ExecGraph, model: VariabilityModel, expert_share: np.ndarray | None = None
    ) -> None:
        """`expert_share`: per task, the share the router's load scales (TransformerStepBuilder.expert_share);
        none: nothing does (padded to capacity, or a dense model)."""
        p = job.plan
        padded = job.model.moe_capacity_factor is not None and job.model.moe_pad_to_capacity
        share = np.zeros(graph.num_tasks) if expert_share is None or padded else expert_share
        self.imbalanced = np.flatnonzero(share > 0)
        self.imbalanced_share = share[self.imbalanced]
        self.base, self.model = graph.duration_s, model
        self.compute = np.flatnonzero(graph.category == Category.COMPUTE)
        self.comm = np.flatnonzero(graph.category == Category.COMMUNICATION)
        ranks = graph.resource_rank[graph.resource]
        self.stage_of_compute = ranks[self.compute]
        self.stages = int(ranks.max()) + 1 if ranks.size else 1
        self.k_task = p.tensor_parallel * p.context_parallel
        self.gpus_per_stage = p.dp * p.tensor_parallel * p.context_parallel

    def __call__(self, rng: np.random.Generator, n: int) -> np.ndarray:
        m = self.model
        dur = np.repeat(self.base[:, None], n, axis=1)
        if self.compute.size:
            factor = np.ones((self.compute.size, n))
            if m.compute_cv > 0:
                factor *= _lognormal(m.compute_cv, _z_max(rng, self.k_task, (self.compute.size, n)))
            if m.gpu_cv > 0:
                per_stage = _lognormal(m.gpu_cv, _z_max(rng, self.gpus_per_stage, (self.stages, n)))
                factor *= per_stage[self.stage_of_compute]
            dur[self.compute] *= factor
        if self.comm.size and (m.comm_cv > 0 or m.network_cv > 0):
            noise = np.ones((self.comm.size, n))
            if m.comm_cv > 0:
                noise *= _lognormal(m.comm_cv, rng.standard_normal((self.comm.size, n)))
            if m.network_cv > 0:
                noise *= _lognormal(m.network_cv, rng.standard_normal((1, n)))
            dur[self.comm] *= noise
        if self.imbalanced.size and m.moe_imbalance_cv > 0:
            load = _lognormal(m.moe_imbalance_cv, rng.standard_normal((self.imbalanced.size, n)))
            dur[self.imbalanced] *= 1 + self.imbalanced_share[:, None] * (load - 1)
        return dur


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
    builder = TransformerStepBuilder(job)
    graph = builder.build()
    sampler = StepSampler(job, graph, model, builder.expert_share())
    return StepDistribution(simulate(graph).step_time_s, simulate_samples(graph, sampler, samples, seed))


def attribution(job: Job, model: VariabilityModel, samples: int = 4_000, seed: int = 0) -> list[dict[str, Any]]:
    """For each source: the p95 and the p50→p99 spread with that source's CV halved (same seed)."""
    builder = TransformerStepBuilder(job)
    graph = builder.build()
    share = builder.expert_share()
    base = simulate_samples(graph, StepSampler(job, graph, model, share), samples, seed)
    b95, bspread = np.percentile(base, 95), np.percentile(base, 99) - np.percentile(base, 50)
    out = []
    for source in SOURCES:
        if getattr(model, source) == 0 or (source == "moe_imbalance_cv" and not share.any()):
            continue
        s = simulate_samples(graph, StepSampler(job, graph, model.halved(source), share), samples, seed)
        spread = np.percentile(s, 99) - np.percentile(s, 50)
        out.append(
            {
                "source": source,
                "p95_change": float(np.percentile(s, 95) / b95 - 1),
                "spread_change": float(spread / bspread - 1) if bspread > 0 else 0.0,
            }
        )
    return sorted(out, key=lambda r: r["p95_change"])
