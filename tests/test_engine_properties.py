"""Invariants of the simulator on random graphs (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from itercast.graph.execgraph import Category, GraphBuilder
from itercast.sim.analysis import breakdown
from itercast.sim.engine import compile_graph, simulate


@st.composite
def random_graphs(draw):
    """Tasks on up to 3 ranks × 2 streams, random earlier dependencies, some 2-rank collectives
    whose members are added consecutively and depend only on earlier tasks (so no deadlock)."""
    b = GraphBuilder()
    n = draw(st.integers(2, 25))
    added = 0
    while added < n:
        dur = draw(st.floats(0.0, 5.0, allow_nan=False))
        if added >= 2 and draw(st.booleans()) and draw(st.booleans()):
            coll = b.new_collective()
            ranks = draw(st.sampled_from([(0, 1), (1, 2), (0, 2)]))
            before = added  # members depend only on tasks added before the collective
            for rank in ranks:
                deps = draw(st.lists(st.integers(0, before - 1), max_size=2))
                b.task(
                    "coll",
                    b.resource(rank, "comm"),
                    dur,
                    Category.COMMUNICATION,
                    "all_reduce",
                    deps=deps,
                    collective=coll,
                )
                added += 1
        else:
            rank, kind = draw(st.integers(0, 2)), draw(st.sampled_from(["compute", "comm"]))
            deps = draw(st.lists(st.integers(0, added - 1), max_size=3)) if added else []
            lat = draw(st.sampled_from([0.0, 0.5]))
            b.task("t", b.resource(rank, kind), dur, Category.COMPUTE, "gemm", deps=deps, latency_s=lat)
            added += 1
    return b.build()


@settings(max_examples=150, deadline=None)
@given(random_graphs(), st.data())
def test_more_work_never_shortens_a_step(graph, data):
    base = simulate(graph).step_time_s
    task = data.draw(st.integers(0, graph.num_tasks - 1))
    longer = graph.duration_s.copy()
    longer[task] += data.draw(st.floats(0.01, 3.0))
    assert simulate(graph.with_durations(longer)).step_time_s >= base - 1e-12


@settings(max_examples=150, deadline=None)
@given(random_graphs())
def test_tasks_respect_dependencies_streams_and_rendezvous(graph):
    r = simulate(graph)
    compiled = compile_graph(graph)
    for t in range(graph.num_tasks):
        for s, lat in compiled.predecessors(t):  # explicit edges and the previous task on the same stream
            assert r.start_s[t] >= r.end_s[s] + lat - 1e-12
    for c in set(graph.collective.tolist()) - {-1}:
        members = np.flatnonzero(graph.collective == c)
        ready = max((r.end_s[s] + lat for m in members for s, lat in compiled.predecessors(m)), default=0.0)
        assert np.all(r.start_s[members] == r.start_s[members[0]])  # start together
        assert r.start_s[members[0]] == ready  # … when the last member is ready, not later


@settings(max_examples=150, deadline=None)
@given(random_graphs())
def test_breakdown_parts_sum_to_the_step_time(graph):
    r = simulate(graph)
    assert abs(breakdown(r).total_s - r.step_time_s) <= 1e-9 * max(1.0, r.step_time_s)
