"""Where to put slow GPUs: the best and worst ranks of a step graph for k devices that are f× slower.

A graph rank (a transformer's pipeline stage of dp·tp·cp GPUs, a DLRM's one GPU) runs at the pace of
its slowest GPU (the model of stochastic/variability.py), so what matters is only which ranks receive
at least one slow device. Packing the k devices into as few ranks as possible (⌈k / GPUs per rank⌉)
costs least; spreading them over as many as possible (min(k, ranks)) costs most. Ranks differ
(embedding on the first stage, head on the last, their place in the schedule; a DLRM rank's tables),
so each rank's cost is simulated alone and the cheapest / dearest are chosen; the chosen set is then
simulated together. Exhaustive over sets when there are few ranks (≤ 12), greedy beyond.

From a measured speed map (`read_speed_map`, `map_speeds`): GPUs of any speeds, grouped by speed into
ranks and the groups assigned to ranks (exhaustive up to EXHAUSTIVE_MAX_RANKS, sorted pairing beyond),
against the rank order. The plan change beside it (the layers re-sliced over stages of those speeds) is
search/job_slicing.py slice_job_at_speeds (search imports stochastic, not the other way).
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from itercast.config.job import Job
from itercast.errors import ConfigError
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


#: graph ranks up to which every assignment of speed blocks to ranks is simulated (6! = 720)
EXHAUSTIVE_MAX_RANKS = 6
#: deterministic best assignments re-ranked by the p95 when a noise model prices it
P95_CANDIDATES = 5


@dataclass(frozen=True)
class SpeedMapping:
    """Measured GPU speeds mapped to a step graph's ranks: the naive mapping (rank order: GPU i takes
    global rank i, Megatron's order, pipeline stage outermost, so graph rank r holds GPUs r·g … r·g +
    g − 1) against the best found (`method`); `best_gpus[r]`: the GPUs graph rank r gets;
    `naive_speeds[r]`, `best_speeds[r]`: rank r's speed (its slowest GPU's) under each. The p95s
    are None where no noise model priced them."""

    baseline_s: float  # every GPU at speed 1
    naive_s: float
    best_s: float
    best_gpus: tuple[tuple[int, ...], ...]
    method: str
    naive_speeds: tuple[float, ...]
    best_speeds: tuple[float, ...]
    naive_p95_s: float | None = None
    best_p95_s: float | None = None

    @property
    def gain(self) -> float:
        """How much the best mapping saves over the naive one in the deterministic step (a ratio)."""
        return self.naive_s / self.best_s

    @property
    def p95_gain(self) -> float | None:
        """The same in the p95, where priced (a ratio; Monte Carlo noise aside, ≥ 1)."""
        if self.naive_p95_s is None or self.best_p95_s is None:
            return None
        return self.naive_p95_s / self.best_p95_s


def with_speeds(graph: ExecGraph, rank_speed: np.ndarray) -> ExecGraph:
    """`graph` with each rank's compute at its speed (a rank runs at its slowest GPU's pace: a rank
    at 0.8 takes 1/0.8 as long)."""
    ranks = graph.resource_rank[graph.resource]
    scaled = graph.duration_s.copy()
    compute = graph.category == Category.COMPUTE
    scaled[compute] /= rank_speed[ranks[compute]]
    return graph.with_durations(scaled)


def _step_with_speeds(graph: ExecGraph, rank_speed: np.ndarray) -> float:
    return simulate(with_speeds(graph, rank_speed)).step_time_s


def map_speeds(
    graph: ExecGraph,
    gpus_per_rank: int,
    speeds: np.ndarray,
    p95: Callable[[ExecGraph], float] | None = None,
    exhaustive_max_ranks: int = EXHAUSTIVE_MAX_RANKS,
) -> SpeedMapping:
    """The mapping of GPUs (their relative `speeds`, 1 = nominal) onto the graph's ranks that
    minimises the step. A rank runs at its slowest GPU's pace, so the best groups the slowest GPUs
    together: GPUs sorted by speed form blocks of `gpus_per_rank`, and the blocks are assigned to
    ranks, every assignment tried up to `exhaustive_max_ranks` ranks; beyond, the slowest block goes
    to the rank whose slowing alone costs least, the next to the next (sorted pairing; each rank's
    cost simulated alone). With `p95` (the step graph's p95 under a noise model, same seed for every
    call: common random numbers), the P95_CANDIDATES best assignments by the deterministic step and
    the naive mapping are priced by it and the lowest p95 is chosen. Within a rank (its tensor- and
    data-parallel groups) the graph has one representative GPU, so which group inside a stage takes
    the slow GPUs is not told apart. PRISM (arXiv 2510.15596) reports up to 1.26× from placement on
    its clusters; nothing here reproduces that figure."""
    ranks = graph.resource_rank[graph.resource]
    n_ranks = int(ranks.max()) + 1 if ranks.size else 1
    if speeds.size != n_ranks * gpus_per_rank:
        raise ValueError(f"a speed per GPU: expected {n_ranks * gpus_per_rank}, got {speeds.size}")
    naive = speeds.reshape(n_ranks, gpus_per_rank).min(axis=1)
    order = np.argsort(speeds, kind="stable")
    blocks = order.reshape(n_ranks, gpus_per_rank)  # block 0: the slowest GPUs
    block_speed = speeds[blocks].min(axis=1)
    if n_ranks <= exhaustive_max_ranks:
        method = "exhaustive"
        options = sorted(
            (_step_with_speeds(graph, block_speed[list(p)]), p) for p in itertools.permutations(range(n_ranks))
        )
    else:
        method = "sorted pairing"
        slowest = np.ones(n_ranks)
        alone = []
        for r in range(n_ranks):
            slowest[r] = block_speed[0]
            alone.append((_step_with_speeds(graph, slowest), r))
            slowest[r] = 1.0
        rank_order = [r for _, r in sorted(alone)]  # cheapest to slow first
        perm = tuple(int(b) for _, b in sorted(zip(rank_order, range(n_ranks), strict=True)))
        options = [(_step_with_speeds(graph, block_speed[list(perm)]), perm)]
    naive_s, (best_s, perm) = _step_with_speeds(graph, naive), options[0]
    naive_p95 = best_p95 = None
    if p95 is not None:
        k = min(len(options), P95_CANDIDATES)
        method += f", the {k} best by the step re-ranked by p95" if k > 1 else ", its p95 priced"
        naive_p95 = p95(with_speeds(graph, naive))
        best_p95, best_s, perm = min(
            (p95(with_speeds(graph, block_speed[list(p)])), t, p) for t, p in options[:P95_CANDIDATES]
        )
    best_gpus = tuple(tuple(int(g) for g in sorted(blocks[b])) for b in perm)
    speeds_of = (tuple(float(v) for v in naive), tuple(float(block_speed[b]) for b in perm))
    return SpeedMapping(
        simulate(graph).step_time_s, naive_s, best_s, best_gpus, method, *speeds_of, naive_p95, best_p95
    )


def read_speed_map(path: Path, num_gpus: int, gpus_per_node: int) -> np.ndarray:
    """Relative speed per GPU from a CSV with columns `gpu,speed` (global GPU index) or `node,speed`
    (every GPU of the node); GPUs it does not name run at 1. Bad rows raise ConfigError naming the
    file, line, field, what was expected and what was found."""
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            return _speeds(path, csv.DictReader(fh), num_gpus, gpus_per_node)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"{path}: cannot read a speed map CSV: {exc}") from None


def _speeds(path: Path, reader: csv.DictReader, num_gpus: int, gpus_per_node: int) -> np.ndarray:
    fields = set(reader.fieldnames or ())
    key = "gpu" if "gpu" in fields else "node" if "node" in fields else None
    if key is None or "speed" not in fields:
        raise ConfigError(f"{path}: header: expected columns gpu,speed or node,speed; got {sorted(fields)}")
    count = num_gpus if key == "gpu" else num_gpus // gpus_per_node
    speeds = np.ones(num_gpus)
    seen: set[int] = set()
    for line, row in enumerate(reader, start=2):
        where = f"{path}:{line}"
        if line - 1 > count:  # bounded: one row per GPU or node at most
            raise ConfigError(f"{where}: more rows than the job's {count} {key}s")
        try:
            index, speed = int(row[key]), float(row["speed"])
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected an integer {key} and a number speed; got {row}") from None
        if not 0 <= index < count:
            raise ConfigError(f"{where}: {key} {index}: the job has {count} {key}s (0..{count - 1})")
        if not math.isfinite(speed) or speed <= 0:
            raise ConfigError(f"{where}: speed: expected a finite number > 0; got {row['speed']}")
        if index in seen:
            raise ConfigError(f"{where}: {key} {index} named twice")
        seen.add(index)
        if key == "gpu":
            speeds[index] = speed
        else:
            speeds[index * gpus_per_node : (index + 1) * gpus_per_node] = speed
    return speeds
