"""The compiled simulator kernels and their plain-Python source give identical results."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from test_engine_properties import random_graphs

from itercast.sim import kernels
from itercast.sim.engine import compile_graph


@settings(max_examples=60, deadline=None)
@given(random_graphs())
def test_compiled_and_python_max_plus_agree(graph):
    if not kernels.HAVE_NUMBA:
        pytest.skip("numba not installed: only the Python path exists")
    c = compile_graph(graph)
    args = (*c.arrays, graph.duration_s)
    n = graph.num_tasks
    fast = [np.zeros(n), np.zeros(n), np.full(n, -1, dtype=np.int64)]
    kernels.max_plus_kernel(*args, *fast)
    slow = [[0.0] * n, [0.0] * n, [-1] * n]
    kernels.max_plus(*[a.tolist() for a in args], *slow)
    for a, b in zip(fast, slow, strict=True):
        assert a.tolist() == b


@settings(max_examples=40, deadline=None)
@given(random_graphs())
def test_simulation_without_numba_gives_the_same_times(graph):
    from itercast.sim.engine import simulate

    fast = simulate(graph.with_durations(graph.duration_s.copy()))
    saved = kernels.HAVE_NUMBA
    kernels.HAVE_NUMBA = False
    try:
        fresh = graph.with_durations(graph.duration_s.copy())
        fresh._order = None  # recompile on the Python path too
        slow = simulate(fresh)
    finally:
        kernels.HAVE_NUMBA = saved
    assert fast.start_s.tolist() == slow.start_s.tolist() and fast.binding.tolist() == slow.binding.tolist()
