"""Ranking searched plans by their step-time distribution (`search --objective p50|p95|p99|mean`).

run_search ranks plans by the deterministic step (fast path, then the graph simulation of the
best). For a distribution objective the first `top` of those plans are then sampled with the
variability model (stochastic/variability.py, the `variability` command's CVs): each plan's step
graph, `samples` Monte Carlo steps, the SAME seed for every plan (common random numbers: a plan's
figure differs from another's by the plans, not by the draws; the draws line up task for task only
between graphs of one shape; Law & Kelton, Simulation Modeling and Analysis, §11.2), each of one
run at the mean speed or, `across_runs`, of a fresh run (variability.run_steps_of). Alone, the run
level (model.run_cv) multiplies every compute and communication task by the run's factor: a step
with no host task on its path by that factor, so each plan's quantiles by the same number (exactly
with the same draws, else up to Monte Carlo error), and the order stays; beside per-task noise it can
move plans. They are re-ranked by p50, p95, p99 or the mean of those samples; plans past `top` keep
their deterministic order after them. A plan whose step is one long critical path of noisy tasks can
lose to a deterministically slower, steadier one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from itercast.search.objectives import DISTRIBUTION_OBJECTIVES
from itercast.search.plan_search import SearchRequest, SearchResult, objective_of, plan_job
from itercast.stochastic.variability import VariabilityModel, build_transformer_step, graph_distribution

PlanProgress = Callable[[int, int], None]  # (plans sampled, plans to sample)


@dataclass(frozen=True)
class DistributionOptions:
    """How plans are sampled: the variability model, Monte Carlo samples per plan, the one seed
    every plan shares, how many of the deterministically best plans are sampled, and whether each
    sample is a step of one run at the mean speed (False) or of a fresh run (`across_runs`: the run
    level, model.run_cv, in the ranking)."""

    model: VariabilityModel = field(default_factory=VariabilityModel)
    samples: int = 2_000
    seed: int = 0
    top: int = 20
    across_runs: bool = False


def rank_by_distribution(
    result: SearchResult, request: SearchRequest, options: DistributionOptions, progress: PlanProgress | None = None
) -> SearchResult:
    """`result` (a distribution objective's search) with its first `options.top` plans sampled and
    re-ranked by the objective's figure; every plan gains its `deterministic_rank` (1-based) and
    `distribution` (p50_s, p90_s, p95_s, p99_s, mean_s in seconds; None past `top`), and
    `ranking_note` says whether the order changed."""
    key = DISTRIBUTION_OBJECTIVES[request.objective]
    plans = [{**row, "deterministic_rank": rank, "distribution": None} for rank, row in enumerate(result.plans, 1)]
    sampled = plans[: options.top]
    for done, row in enumerate(sampled, 1):
        step = build_transformer_step(plan_job(request, row), request.calibration)
        dist = graph_distribution(step, options.model, options.samples, options.seed, options.across_runs)
        row["distribution"] = {**dist.quantiles(), "mean_s": float(dist.samples_s.mean())}
        if progress is not None:
            progress(done, len(sampled))
    # the figure in the objective's unit: per sequence when the searched batches vary (objective_values)
    sampled.sort(key=lambda r: objective_of(request, r, r["distribution"][key]))
    note = ranking_note(request.objective, [r["deterministic_rank"] for r in sampled])
    return replace(result, plans=sampled + plans[len(sampled) :], ranking_note=note)


def ranking_note(objective: str, deterministic_ranks: list[int]) -> str:
    """One sentence: whether the plans' order by `objective` (their deterministic ranks, listed in
    that order) is the deterministic one, and if not, where the objective's first plan ranked."""
    moved = sum(rank != i for i, rank in enumerate(deterministic_ranks, 1))
    n = len(deterministic_ranks)
    if not moved:
        return f"variability does not change the ranking: by {objective} the {n} plans sampled keep their order"
    return (
        f"variability changes the ranking: rank 1 by {objective} is rank {deterministic_ranks[0]} "
        f"deterministically; {moved} of the {n} plans sampled move"
    )
