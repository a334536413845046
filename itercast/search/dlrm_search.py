"""Search over a DLRM's plans: embedding shardings × samples per GPU, ranked by throughput.

For each batch per GPU the sharding planner (workloads/dlrm.plan_sharding: every combination when
there are few, else greedy plus the uniform plans) prices its candidate shardings by simulating the
step on every rank; the plans of every batch are then ranked by samples per second over the whole
cluster, those that fit in memory first. A larger batch per GPU usually runs more samples per
second; whether the model converges as well at that batch is the user's call, so the batches
searched are given (default: the plan's, a quarter of it up to four times it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from itercast.workloads.dlrm import DLRMJob, DLRMStep, Shard, plan_sharding


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
    index_counts: dict[str, np.ndarray] | None = None,
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
