"""Monte Carlo over the step graph: S sampled durations per task, one vectorised pass (DESIGN.md §3, §5).

`simulate_samples(graph, sample)` draws durations block by block (bounded memory: tasks × block
floats at a time) with a caller-supplied sampler, and returns the S step times. The semantics are
the simulator's: for every sample, start = max over predecessors' ends (+ latency), collectives
rendezvous. A collective draws ONE duration, shared by its members (the head member's draw).
With zero variance the result equals `simulate` exactly (tested).

What the draws are is the sampler's business: stochastic/variability.py's StepSampler draws a task
that stands for k symmetric ranks as the maximum of k draws, sampled directly (order statistics).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from itercast.graph.execgraph import ExecGraph
from itercast.sim.engine import compile_graph
from itercast.sim.kernels import run_max_plus_samples

#: sampler(rng, count) -> (tasks, count) durations in seconds
Sampler = Callable[[np.random.Generator, int], np.ndarray]


def simulate_samples(graph: ExecGraph, sample: Sampler, samples: int, seed: int = 0, block: int = 1024) -> np.ndarray:
    """Step time of each of `samples` draws (seconds), reproducible for a given seed.

    Blocks of `block` samples run on a thread pool (sampling is numpy ufuncs and the max-plus
    kernel is compiled without the GIL); block i draws from child i of the seed's SeedSequence,
    so the result does not depend on how many threads ran."""
    if samples < 1:
        raise ValueError(f"samples must be ≥ 1; got {samples}")
    c = compile_graph(graph)
    head = _collective_head_of(graph)
    starts = list(range(0, samples, block))
    seeds = np.random.SeedSequence(seed).spawn(len(starts))
    out = np.empty(samples)

    def run(i: int) -> None:
        lo = starts[i]
        count = min(block, samples - lo)
        dur = np.asarray(sample(np.random.default_rng(seeds[i]), count), dtype=np.float64)
        if dur.shape != (graph.num_tasks, count):
            raise ValueError(f"sampler returned {dur.shape}; expected ({graph.num_tasks}, {count})")
        if head is not None:
            dur = dur[head]  # every collective member takes its head member's draw
        out[lo : lo + count] = run_max_plus_samples(c.arrays, dur).max(axis=0)

    with ThreadPoolExecutor(max_workers=min(len(starts), os.cpu_count() or 1)) as pool:
        list(pool.map(run, range(len(starts))))
    return out


def _collective_head_of(graph: ExecGraph) -> np.ndarray | None:
    coll = graph.collective
    members = np.flatnonzero(coll >= 0)
    if not members.size:
        return None
    head = np.arange(graph.num_tasks)
    _, first = np.unique(coll[members], return_index=True)
    lookup = dict(zip(coll[members][first].tolist(), members[first].tolist(), strict=True))
    head[members] = [lookup[c] for c in coll[members].tolist()]
    return head
