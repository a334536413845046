"""Monte Carlo over the step graph: S sampled durations per task, one vectorised pass (DESIGN.md §3, §5).

`simulate_samples(graph, sample)` draws durations block by block (bounded memory: tasks × block
floats at a time) with a caller-supplied sampler, and returns the S step times. The semantics are
the simulator's: for every sample, start = max over predecessors' ends (+ latency), collectives
rendezvous. A collective draws ONE duration, shared by its members (the head member's draw).
With zero variance the result equals `simulate` exactly (tested).

`max_of_k` samples the maximum of k i.i.d. draws directly by inverting the CDF of the maximum,
F_max(x) = F(x)^k, i.e. x = F⁻¹(U^(1/k)): a rendezvous over k symmetric ranks then costs one draw,
the same for k = 8 or 65,536. Exact for i.i.d. draws; the approximation lies in treating ranks as
i.i.d. and synchronised at that task (say so where it is used).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from scipy import special

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


def max_of_k(quantile: Callable[[np.ndarray], np.ndarray], k: np.ndarray | int, u: np.ndarray) -> np.ndarray:
    """Maximum of k i.i.d. draws of a distribution given by its quantile function, from uniforms u."""
    return quantile(np.power(u, 1.0 / np.asarray(k, dtype=np.float64)))


def lognormal_quantile(mean: np.ndarray | float, cv: np.ndarray | float) -> Callable[[np.ndarray], np.ndarray]:
    """Quantile function of the log-normal with the given mean and coefficient of variation."""
    sigma = np.sqrt(np.log1p(np.square(cv)))
    mu = np.log(mean) - sigma**2 / 2

    def q(p: np.ndarray) -> np.ndarray:
        return np.exp(mu + sigma * special.ndtri(p))

    return q


def exponential_quantile(mean: float) -> Callable[[np.ndarray], np.ndarray]:
    def q(p: np.ndarray) -> np.ndarray:
        return -mean * np.log1p(-p)

    return q


class LogNormalNoise:
    """Sampler: task t lasts mean[t] × a log-normal factor of mean 1 and coefficient of variation
    cv[t], maximised over k[t] i.i.d. draws (the k ranks it stands for meet right after it).
    Draws only what is needed: constant where cv = 0, plain normals where k = 1, and the
    order-statistic inverse CDF only where k > 1."""

    def __init__(self, mean_s: np.ndarray, cv: np.ndarray, k: np.ndarray) -> None:
        self.mean_s = np.asarray(mean_s, dtype=np.float64)
        sigma = np.sqrt(np.log1p(np.square(np.broadcast_to(cv, self.mean_s.shape))))
        self.sigma, self.mu = sigma[:, None], (-(sigma**2) / 2)[:, None]
        k = np.broadcast_to(np.asarray(k, dtype=np.float64), self.mean_s.shape)
        self.single = np.flatnonzero((sigma > 0) & (k <= 1))
        self.multi = np.flatnonzero((sigma > 0) & (k > 1))
        self.inv_k = (1.0 / k[self.multi])[:, None]

    def __call__(self, rng: np.random.Generator, n: int) -> np.ndarray:
        z = np.zeros((self.mean_s.shape[0], n))
        z[self.single] = rng.standard_normal((self.single.shape[0], n))
        z[self.multi] = special.ndtri(np.power(rng.random((self.multi.shape[0], n)), self.inv_k))
        return self.mean_s[:, None] * np.exp(self.mu + self.sigma * z)
