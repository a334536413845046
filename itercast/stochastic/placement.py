"""Where to put slow GPUs: the best and worst ranks of a step graph for k devices that are f× slower.

A graph rank (a transformer's pipeline stage of dp·tp·cp GPUs, a DLRM's one GPU) runs at the pace of
its slowest GPU (the model of stochastic/variability.py), so what matters is only which ranks receive
at least one slow device. Packing the k devices into as few ranks as possible (⌈k / GPUs per rank⌉)
costs least; spreading them over as many as possible (min(k, ranks)) costs most. Ranks differ
(embedding on the first stage, head on the last, their place in the schedule; a DLRM rank's tables),
so each rank's cost is simulated alone and the cheapest / dearest are chosen; the chosen set is then
simulated together. Exhaustive over sets when there are few ranks (≤ 12), greedy beyond.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from itercast.config.job import Job
from itercast.graph.execgraph import Category, ExecGraph
from itercast.sim.engine import simulate
from itercast.workloads.transformer import TransformerStepBuilder

EXHAUSTIVE_MAX_STAGES = 12


@dataclass(frozen=True)
class Placement:
    slow_gpus: int
    slowdown: float
    baseline_s: float
    best_stages: tuple[int, ...]
    best_s: float
    worst_stages: tuple[int, ...]
    worst_s: float

    @property
    def worth(self) -> float:
        """How much the best placement saves over the worst (a ratio ≥ 1)."""
        return self.worst_s / self.best_s


def _step_with_slow(graph: ExecGraph, stages: tuple[int, ...], slowdown: float) -> float:
    ranks = graph.resource_rank[graph.resource]
    scaled = graph.duration_s.copy()
    mask = (graph.category == Category.COMPUTE) & np.isin(ranks, stages)
    scaled[mask] *= slowdown
    return simulate(graph.with_durations(scaled)).step_time_s


def place_slow_gpus(job: Job, slow_gpus: int, slowdown: float) -> Placement:
    """A transformer job: its pipeline stages, each of dp·tp·cp GPUs."""
    p = job.plan
    per_stage = p.dp * p.tensor_parallel * p.context_parallel
    return place_slow_on_graph(TransformerStepBuilder(job).build(), per_stage, slow_gpus, slowdown)


def place_slow_on_graph(graph: ExecGraph, gpus_per_rank: int, slow_gpus: int, slowdown: float) -> Placement:
    """The best and worst ranks of `graph` (each standing for `gpus_per_rank` GPUs) for `slow_gpus`
    devices `slowdown`× slower."""
    if slow_gpus < 1 or slowdown < 1:
        raise ValueError(f"need slow_gpus ≥ 1 and slowdown ≥ 1; got {slow_gpus}, {slowdown}")
    ranks = graph.resource_rank[graph.resource]
    stages = int(ranks.max()) + 1 if ranks.size else 1
    per_stage = gpus_per_rank
    fewest, most = min(stages, math.ceil(slow_gpus / per_stage)), min(stages, slow_gpus)
    if stages <= EXHAUSTIVE_MAX_STAGES:

        def pick(count: int, worst: bool) -> tuple[tuple[int, ...], float]:
            options = [(_step_with_slow(graph, s, slowdown), s) for s in itertools.combinations(range(stages), count)]
            t, s = max(options) if worst else min(options)
            return s, t
    else:  # greedy: rank stages by their cost alone
        alone = sorted((_step_with_slow(graph, (s,), slowdown), s) for s in range(stages))

        def pick(count: int, worst: bool) -> tuple[tuple[int, ...], float]:
            chosen = tuple(sorted(s for _, s in (alone[-count:] if worst else alone[:count])))
            return chosen, _step_with_slow(graph, chosen, slowdown)

    best, best_s = pick(fewest, worst=False)
    worst, worst_s = pick(most, worst=True)
    return Placement(slow_gpus, slowdown, simulate(graph).step_time_s, best, best_s, worst, worst_s)
