"""Monte Carlo engine: exact at zero variance, a rendezvous at the maximum, shared collective draws, seeds.

What the draws are (log-normal noise, order statistics) is tested with the sampler production uses,
stochastic.variability.StepSampler, in tests/test_variability.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from test_engine_properties import random_graphs

from itercast.graph.execgraph import Category, GraphBuilder
from itercast.sim import kernels
from itercast.sim.engine import compile_graph, simulate
from itercast.sim.montecarlo import _collective_head_of, simulate_samples


def constant(graph):
    return lambda rng, n: np.repeat(graph.duration_s[:, None], n, axis=1)


@settings(max_examples=60, deadline=None)
@given(random_graphs())
def test_zero_variance_equals_the_deterministic_simulation(graph):
    assert np.all(simulate_samples(graph, constant(graph), 5, block=2) == simulate(graph).step_time_s)


def fork_join(k: int):
    """k ranks each run one task, then meet in a zero-length collective."""
    b = GraphBuilder()
    coll = b.new_collective()
    for r in range(k):
        work = b.task("work", b.resource(r, "compute"), 1.0, Category.COMPUTE, "gemm")
        b.task("barrier", b.resource(r, "compute"), 0.0, Category.COMMUNICATION, "all_reduce", [work], collective=coll)
    return b.build()


@pytest.mark.parametrize("k", [1, 4, 16])
def test_max_of_k_exponentials_has_the_harmonic_mean(k):
    # E[max of k i.i.d. Exp(1)] = H_k = 1 + 1/2 + … + 1/k; the step ends at that maximum.
    g = fork_join(k)
    work = g.category == Category.COMPUTE

    def sample(rng, n):
        d = np.zeros((g.num_tasks, n))
        d[work] = rng.exponential(1.0, (int(work.sum()), n))
        return d

    steps = simulate_samples(g, sample, 40_000, seed=1)
    harmonic = sum(1.0 / i for i in range(1, k + 1))
    stderr = np.sqrt(sum(1.0 / i**2 for i in range(1, k + 1)) / 40_000)  # Var[max] = Σ 1/i²
    assert abs(steps.mean() - harmonic) < 4 * stderr


def test_a_collective_draws_one_duration_for_all_members():
    g = fork_join(3)
    coll = g.collective >= 0

    def sample(rng, n):
        d = np.ones((g.num_tasks, n))
        d[coll] = rng.uniform(1, 2, (int(coll.sum()), n))  # different draws per member: the head's wins
        return d

    head = _collective_head_of(g)
    assert len({int(head[t]) for t in np.flatnonzero(coll)}) == 1
    steps = simulate_samples(g, sample, 200, seed=3)
    first = sample(np.random.default_rng(np.random.SeedSequence(3).spawn(1)[0]), 200)  # block 0's generator
    assert np.allclose(steps, 1.0 + first[np.flatnonzero(coll)[0]])  # work (1) + the head member's draw


def test_same_seed_same_samples_other_seed_other_samples():
    g = fork_join(4)

    def sample(rng, n):
        return rng.exponential(1.0, (g.num_tasks, n))

    a, b, c = (simulate_samples(g, sample, 500, seed=s) for s in (5, 5, 6))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


@settings(max_examples=30, deadline=None)
@given(random_graphs())
def test_compiled_and_numpy_sample_paths_agree(graph):
    if not kernels.HAVE_NUMBA:
        pytest.skip("numba not installed: only the numpy path exists")
    c = compile_graph(graph)
    dur = graph.duration_s[:, None] * np.random.default_rng(0).uniform(0.5, 1.5, (graph.num_tasks, 7))
    fast = kernels.run_max_plus_samples(c.arrays, dur)
    kernels.HAVE_NUMBA = False
    try:
        slow = kernels.run_max_plus_samples(c.arrays, dur)
    finally:
        kernels.HAVE_NUMBA = True
    assert np.allclose(fast, slow, rtol=0, atol=1e-12)


def test_samples_do_not_depend_on_how_many_threads_ran(monkeypatch):
    g = fork_join(3)

    def sample(rng, n):
        return rng.uniform(1, 2, (g.num_tasks, n))

    many = simulate_samples(g, sample, 300, seed=4, block=64)
    monkeypatch.setattr("itercast.sim.montecarlo.os.cpu_count", lambda: 1)
    assert np.array_equal(simulate_samples(g, sample, 300, seed=4, block=64), many)
