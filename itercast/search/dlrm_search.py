"""Search over a DLRM's plans: embedding shardings × samples per GPU, ranked by throughput.

For each batch per GPU the sharding planner (workloads/dlrm.plan_sharding: every combination when
there are few, else greedy plus the uniform plans) prices its candidate shardings by simulating the
step on every rank; the plans of every batch are then ranked by samples per second over the whole
cluster, those that fit in memory first. A larger batch per GPU usually runs more samples per
second; whether the model converges as well at that batch is the user's call, so the batches
searched are given (default: the plan's, a quarter of it up to four times it).

With a distribution objective (`--objective p50|p95|p99|mean`) the first plans are sampled as a
transformer search's are (search/distribution_rank.py: the variability model, one seed for every plan)
and re-ranked by samples per second at the objective's step (batch × GPUs / that step).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from itercast.search.distribution_rank import DistributionOptions, PlanProgress, ranking_note
from itercast.search.objectives import DISTRIBUTION_OBJECTIVES
from itercast.stochastic.variability import StepGraph, graph_distribution
from itercast.workloads.dlrm import DLRMJob, DLRMStep, IndexSample, Shard, plan_sharding


@dataclass(frozen=True)
class DLRMPlanResult:
    """One priced plan: the batch per GPU, the sharding and its simulated step."""

    batch_per_rank: int
    sharding: dict[str, Shard]
    step: DLRMStep
    world: int

    @property
    def samples_per_s(self) -> float:
        return self.batch_per_rank * self.world / self.step.step_time_s


def default_batches(batch_per_rank: int) -> list[int]:
    """The plan's batch per GPU, a quarter and a half of it, and twice and four times it (at least 1)."""
    return sorted({max(1, batch_per_rank * k // 4) for k in (1, 2, 4, 8, 16)})


def search_dlrm(
    job: DLRMJob,
    batches: Sequence[int],
    calibration: dict[str, Any] | None = None,
    index_counts: dict[str, IndexSample] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[DLRMPlanResult], int]:
    """Every batch's priced shardings, fastest in samples per second first (plans that fit before
    those that do not), and how many plans were priced. `progress(done, total)` after each batch.
    ValueError when no sharding fits (the memory of a DLRM step does not depend on its batch here)."""
    world, found, evaluated = job.system.num_gpus, [], 0
    for i, b in enumerate(batches):
        result = plan_sharding(job.model, job.system, b, calibration=calibration, index_counts=index_counts)
        found += [DLRMPlanResult(b, plan, step, world) for plan, step in result.plans]
        evaluated += result.evaluated
        if progress is not None:
            progress(i + 1, len(batches))
    found.sort(key=lambda r: (not r.step.fits, -r.samples_per_s))
    return found, evaluated


def rank_by_distribution(
    found: list[DLRMPlanResult], objective: str, options: DistributionOptions, progress: PlanProgress | None = None
) -> tuple[list[tuple[DLRMPlanResult, dict[str, float] | None, int]], str]:
    """The first `options.top` plans of `found` sampled (each step's graph, every GPU a rank, as
    `variability` samples a DLRM: workload.DLRMWorkload.step_graph) and re-ranked, those that fit first,
    by samples per second at the `objective`'s step; the rest after them in their order. Each plan with
    its distribution (p50_s, p90_s, p95_s, p99_s, mean_s; None past `top`) and deterministic rank (from
    1), and ranking_note's sentence."""
    key = DISTRIBUTION_OBJECTIVES[objective]
    rows: list[tuple[DLRMPlanResult, dict[str, float] | None, int]] = []
    for rank, r in enumerate(found[: options.top], 1):
        step = StepGraph(r.step.graph, gpus_per_task=1, gpus_per_rank=1)
        dist = graph_distribution(step, options.model, options.samples, options.seed, options.across_runs)
        rows.append((r, {**dist.quantiles(), "mean_s": float(dist.samples_s.mean())}, rank))
        if progress is not None:
            progress(rank, min(options.top, len(found)))
    rows.sort(key=lambda row: (not row[0].step.fits, -row[0].batch_per_rank * row[0].world / row[1][key]))  # type: ignore[index]
    note = ranking_note(objective, [rank for _, _, rank in rows])
    rest = [(r, None, rank) for rank, r in enumerate(found[options.top :], options.top + 1)]
    return rows + rest, note
