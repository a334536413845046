"""Closed-form step time for many plans at once: the fast path for search (DESIGN.md §3).

Same cost models and the same per-layer ops as the graph simulation; what changes is how the
step is assembled. Layer costs depend on only a few plan fields (tensor and context parallel,
micro-batch, sequence parallel, recompute, dtype, flash) and are cached on them; the rest is
numpy arithmetic over arrays of plans:

    stage time     S_s = v · (t_f + t_b) + embedding (first stage) + head (last stage)
    pipeline       M · max_s S_s + (p − 1) · mean_s S_s / v + 2 (p − 1) · t_p2p
                   (exact for uniform stages without sends: (M + p − 1)·t for 1F1B/GPipe,
                   M·t + (p − 1)·t/v for interleaved; Narayanan et al. SC'21 §2.2)
    exposed DP     max(G / n, G − W (n − 1) / n) for G seconds of gradient reduction in n buckets
                   behind a last backward of W seconds (the graph's bucket pipeline, uniform buckets)
    + exposed parameter gathers (ZeRO-1/2, same form, behind the first forward) + embedding and
    gradient-norm all-reduces + optimizer + the first launch.
Approximations: stages are treated as uniform but for the embedding and head, and sends cost the
same on every hop. tests/test_fast_estimate.py bounds the disagreement with the graph simulation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from itercast.config.job import Job
from itercast.costs.analytic import AnalyticCostModel
from itercast.errors import ConfigError
from itercast.memory import stage_params
from itercast.workloads.transformer import (
    GRAD_NORM_BYTES,
    Groups,
    UnitCosts,
    grad_collective,
    optimizer_step_bytes,
    p2p_message_bytes,
    weight_bytes,
)

_LAYER_KEY = (
    "tensor_parallel",
    "context_parallel",
    "micro_batch_size",
    "sequence_parallel",
    "recompute",
    "dtype",
    "flash_attention",
)


class FastEstimator:
    """Estimates for one model and system over many plans; caches layer costs across calls."""

    def __init__(self, model: dict[str, Any], system: dict[str, Any]) -> None:
        self.model, self.system = model, system
        self._units: dict[tuple, UnitCosts] = {}
        self._costs: dict[str, AnalyticCostModel] = {}

    def jobs(self, plans: Sequence[dict[str, Any]]) -> tuple[list[Job | None], list[str]]:
        """Validate plans. Aligned with `plans`: a job and "" where valid, None and every problem where not."""
        jobs: list[Job | None] = []
        errors: list[str] = []
        for plan in plans:
            try:
                jobs.append(Job.from_dicts(self.model, plan, self.system))
                errors.append("")
            except ConfigError as exc:
                jobs.append(None)
                errors.append("; ".join(str(exc).splitlines()))
        return jobs, errors

    def step_time_s(self, jobs: Sequence[Job]) -> np.ndarray:
        """Predicted seconds per step for each job (same model and system)."""
        cols = [self._features(job) for job in jobs]
        f = {k: np.array([c[k] for c in cols], dtype=np.float64) for k in cols[0]}
        p, v, M = f["pp"], f["vp"], f["microbatches"]
        per_stage = v * (f["tf"] + f["tb"])
        first, last = per_stage + f["embed"], per_stage + f["head"]
        single = p == 1
        slowest = np.where(single, per_stage + f["embed"] + f["head"], np.maximum(first, last))
        mean = np.where(single, slowest, (per_stage * np.maximum(p - 2, 0) + first + last) / p)
        pipeline = M * slowest + (p - 1) * mean / v + 2 * (p - 1) * f["p2p"]
        exposed_grad = _exposed(f["grad"], f["buckets"], f["tb"] * v, f["overlap_grad"])
        exposed_gather = _exposed(f["gather"], f["buckets"], f["tf"] * v, f["overlap_gather"])
        return pipeline + exposed_grad + exposed_gather + f["tail"] + f["first_launch"]

    def _features(self, job: Job) -> dict[str, float]:
        p, m = job.plan, job.model
        units = self._unit_costs(job)
        costs = self._costs[p.dtype]
        groups = Groups.of(job)
        layers = m.num_layers / (p.pipeline_parallel * p.virtual_pipeline)
        lf, lb = units.layer_fwd, units.layer_bwd
        params = max(stage_params(job, s) for s in {0, p.pipeline_parallel - 1})
        sync = groups.grad.size > 1
        buckets = max(1.0, math.ceil(params / p.grad_bucket_size_params))
        grad = (
            costs.collective_s(grad_collective(job), params * p.grad_bytes / buckets, groups.grad) * buckets
            if sync
            else 0.0
        )
        gather = 0.0
        if sync and p.zero_stage in (1, 2):
            gather = costs.collective_s("all_gather", params * weight_bytes(job) / buckets, groups.grad) * buckets
        shard = groups.grad.size if p.zero_stage >= 1 else 1
        tail = float(costs.memory_s("elementwise", optimizer_step_bytes(job, params / shard)))
        if p.pipeline_parallel > 1:
            tail += costs.collective_s("all_reduce", GRAD_NORM_BYTES, groups.model)
            if m.tied:
                tail += costs.collective_s(
                    "all_reduce", m.vocab_size * m.hidden_size / p.tensor_parallel * p.grad_bytes, groups.embedding
                )
        kernels = layers * lf.kernels + units.embed_fwd.kernels
        return {
            "pp": p.pipeline_parallel,
            "vp": p.virtual_pipeline,
            "microbatches": job.num_microbatches,
            "tf": layers * (lf.compute_s + lf.comm_s),
            "tb": layers * (lb.compute_s + lb.comm_s),
            "embed": sum(u.compute_s + u.comm_s for u in (units.embed_fwd, units.embed_bwd)),
            "head": sum(u.compute_s + u.comm_s for u in (units.head_fwd, units.head_bwd)),
            "p2p": costs.p2p_s(p2p_message_bytes(job), groups.stage_cross_node) if p.pipeline_parallel > 1 else 0.0,
            "grad": grad,
            "gather": gather,
            "buckets": buckets,
            "overlap_grad": float(p.overlap_grad_reduce),
            "overlap_gather": float(p.overlap_param_gather),
            "tail": tail,
            "first_launch": kernels * job.system.gpu.kernel_launch_overhead_s,
        }

    def _unit_costs(self, job: Job) -> UnitCosts:
        p = job.plan
        key = tuple(getattr(p, k) for k in _LAYER_KEY)
        found = self._units.get(key)
        if found is None:
            costs = self._costs.setdefault(p.dtype, AnalyticCostModel(job.system, p.dtype))
            found = self._units[key] = UnitCosts.of(job, costs, Groups.of(job))
        return found


def _exposed(total_s: np.ndarray, buckets: np.ndarray, window_s: np.ndarray, overlap: np.ndarray) -> np.ndarray:
    """Communication of total_s in `buckets` pieces released uniformly over window_s (or after it)."""
    hidden = np.maximum(total_s / buckets, total_s - window_s * (buckets - 1) / buckets)
    return np.where(overlap > 0, hidden, total_s)
