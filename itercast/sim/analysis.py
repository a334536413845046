"""Critical path and step-time breakdown of a simulated step.

Breakdown (exact: the parts sum to the step time). Take the rank whose task ends last and its
'compute' stream. Time on that stream is either busy (charged by the task's category: compute,
or communication that blocks the stream, e.g. a tensor-parallel all-reduce) or a gap. A gap is
explained by walking back the chain of binding predecessors from the task that waited: each
chain task's overlap with the gap is charged to communication (any communication task), host
overhead (host tasks and edge latencies), pipeline bubble (compute on another rank), or compute
(compute of this rank on another stream).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from itercast.graph.execgraph import Category
from itercast.sim.engine import SimResult


@dataclass(frozen=True)
class Breakdown:
    """Seconds of the step, by cause. `total_s` equals the step time."""

    compute_s: float
    exposed_comm_s: float
    bubble_s: float
    host_overhead_s: float
    idle_s: float
    rank: int

    @property
    def total_s(self) -> float:
        return self.compute_s + self.exposed_comm_s + self.bubble_s + self.host_overhead_s + self.idle_s

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def critical_path(result: SimResult) -> list[int]:
    """Task ids from the first to the last task of the chain that sets the step time."""
    path, t = [], result.final_task
    while t >= 0:
        path.append(t)
        t = int(result.binding[t])
    return path[::-1]


def breakdown(result: SimResult, rank: int | None = None) -> Breakdown:
    """The step by cause on `rank`'s compute stream (default: the rank that finishes last); on
    another rank, the time after its last task is idle."""
    g = result.graph
    final = result.final_task
    final_rank = int(g.resource_rank[g.resource[final]])
    rank = final_rank if rank is None else rank
    main = _main_resource(result, rank)
    buckets = dict.fromkeys(("compute_s", "exposed_comm_s", "bubble_s", "host_overhead_s", "idle_s"), 0.0)
    on_main = np.flatnonzero(g.resource == main)
    prev_end = 0.0
    for t in on_main.tolist():
        s, e = float(result.start_s[t]), float(result.end_s[t])
        if s > prev_end:
            _charge_gap(result, int(result.binding[t]), s, prev_end, rank, buckets)
        key = (
            "compute_s"
            if g.category[t] == Category.COMPUTE
            else ("exposed_comm_s" if g.category[t] == Category.COMMUNICATION else "host_overhead_s")
        )
        buckets[key] += e - s
        prev_end = e
    end = result.step_time_s
    if end > prev_end and rank != final_rank:
        buckets["idle_s"] += end - prev_end
    elif end > prev_end:
        _charge_gap(result, final, end, prev_end, rank, buckets)
    return Breakdown(rank=rank, **buckets)


def _main_resource(result: SimResult, rank: int) -> int:
    g = result.graph
    kind = g.kinds.index("compute") if "compute" in g.kinds else -1
    hits = np.flatnonzero((g.resource_rank == rank) & (g.resource_kind == kind))
    return int(hits[0]) if hits.size else int(g.resource[result.final_task])


def _charge_gap(
    result: SimResult,
    first: int,
    hi: float,
    lo: float,
    rank: int,
    buckets: dict[str, float],
) -> None:
    """Charge [lo, hi] to the chain of binding predecessors from `first` back (`first` ends at hi, or before
    it by an edge's latency)."""
    g = result.graph
    cursor, t = hi, first
    while cursor > lo and t >= 0:
        s, e = float(result.start_s[t]), float(result.end_s[t])
        if cursor > e:  # edge latency between t's end and its successor's start
            buckets["host_overhead_s"] += cursor - max(e, lo)
            cursor = max(e, lo)
        overlap = cursor - max(s, lo)
        if overlap > 0:
            cat = g.category[t]
            if cat == Category.COMMUNICATION:
                key = "exposed_comm_s"
            elif cat == Category.HOST:
                key = "host_overhead_s"
            else:
                same = int(g.resource_rank[g.resource[t]]) == rank
                key = "compute_s" if same else "bubble_s"
            buckets[key] += overlap
            cursor = max(s, lo)
        t = int(result.binding[t])
    if cursor > lo:
        buckets["idle_s"] += cursor - lo
