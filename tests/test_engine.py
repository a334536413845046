"""The simulator's semantics on hand-computed graphs (DESIGN.md §3 rules 1–3)."""

from __future__ import annotations

import numpy as np
import pytest

from itercast.errors import DeadlockError
from itercast.graph.execgraph import Category, GraphBuilder
from itercast.sim.analysis import breakdown, critical_path
from itercast.sim.engine import simulate

C, M = Category.COMPUTE, Category.COMMUNICATION


def two_ranks_one_collective():
    b = GraphBuilder()
    r0, r1 = b.resource(0, "compute"), b.resource(1, "compute")
    b.task("a", r0, 1.0, C, "gemm")
    b.task("x", r1, 3.0, C, "gemm")
    coll = b.new_collective()
    b.task("ar", r0, 2.0, M, "all_reduce", collective=coll)
    b.task("ar", r1, 2.0, M, "all_reduce", collective=coll)
    b.task("z", r0, 1.0, C, "gemm")
    return b.build()


def test_collective_starts_when_last_member_is_ready():
    r = simulate(two_ranks_one_collective())
    # rank 0 is ready at 1, rank 1 at 3: both members run 3..5; z runs 5..6.
    assert r.start_s.tolist() == [0.0, 0.0, 3.0, 3.0, 5.0]
    assert r.end_s.tolist() == [1.0, 3.0, 5.0, 5.0, 6.0]
    assert r.step_time_s == 6.0


def test_critical_path_crosses_to_the_late_rank():
    r = simulate(two_ranks_one_collective())
    assert critical_path(r) == [1, 2, 4]  # x (rank 1) → all-reduce member on rank 0 → z


def test_breakdown_charges_waiting_for_another_rank_to_bubble():
    bd = breakdown(simulate(two_ranks_one_collective()))
    assert (bd.rank, bd.compute_s, bd.exposed_comm_s, bd.bubble_s, bd.idle_s) == (0, 2.0, 2.0, 2.0, 0.0)
    assert bd.total_s == 6.0


def test_breakdown_charges_a_wait_for_its_own_side_stream_to_compute():
    # rank 0 runs a (1 s) while its side stream computes s (3 s); b waits for s: 1..3 is this rank's compute
    b = GraphBuilder()
    gpu, side = b.resource(0, "compute"), b.resource(0, "side")
    s = b.task("s", side, 3.0, C, "gemm")
    b.task("a", gpu, 1.0, C, "gemm")
    b.task("b", gpu, 1.0, C, "gemm", deps=[s])
    bd = breakdown(simulate(b.build()))
    assert (bd.compute_s, bd.bubble_s, bd.idle_s, bd.total_s) == (4.0, 0.0, 0.0, 4.0)


def test_breakdown_charges_the_last_ranks_tail_to_what_ends_the_step():
    # the step ends with an all-reduce on rank 0's comm stream, 1..3 after its last compute
    b = GraphBuilder()
    gpu, comm = b.resource(0, "compute"), b.resource(0, "dp_comm")
    a = b.task("a", gpu, 1.0, C, "gemm")
    b.task("grad_ar", comm, 2.0, M, "all_reduce", deps=[a])
    bd = breakdown(simulate(b.build()))
    assert (bd.compute_s, bd.exposed_comm_s, bd.idle_s) == (1.0, 2.0, 0.0)


def test_breakdown_charges_a_host_task_on_the_stream_to_host_overhead():
    b = GraphBuilder()
    gpu = b.resource(0, "compute")
    b.task("sync", gpu, 0.5, Category.HOST, "host_sync")
    b.task("a", gpu, 1.0, C, "gemm")
    bd = breakdown(simulate(b.build()))
    assert (bd.host_overhead_s, bd.compute_s, bd.exposed_comm_s) == (0.5, 1.0, 0.0)


def test_tasks_added_one_by_one_and_in_blocks_keep_their_rows():
    b = GraphBuilder()
    r = b.resource(0, "compute")
    b.task("a", r, 1.0, C, "gemm")
    name, fam = b.name_id("blk"), b.family_id("gemm")
    b.add_tasks(np.full(2, name), np.full(2, r), np.array([2.0, 3.0]), np.full(2, int(C)), np.full(2, fam))
    b.task("d", r, 4.0, C, "gemm")
    assert [b.duration(t) for t in range(4)] == [1.0, 2.0, 3.0, 4.0]
    assert b.build().duration_s.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_stream_order_serialises_independent_tasks():
    b = GraphBuilder()
    r = b.resource(0, "compute")
    b.task("a", r, 2.0, C, "gemm")
    b.task("b", r, 3.0, C, "gemm")
    res = simulate(b.build())
    assert res.start_s.tolist() == [0.0, 2.0] and res.step_time_s == 5.0


def test_edge_latency_delays_successor_and_counts_as_host_overhead():
    b = GraphBuilder()
    host, gpu = b.resource(0, "host"), b.resource(0, "compute")
    launch = b.task("launch", host, 0.5, Category.HOST, "host_launch")
    b.task("kernel", gpu, 1.0, C, "gemm", deps=[launch], latency_s=0.25)
    r = simulate(b.build())
    assert r.start_s[1] == 0.75 and r.step_time_s == 1.75
    bd = breakdown(r)
    assert (bd.host_overhead_s, bd.compute_s) == (0.75, 1.0)


def test_comm_stream_overlaps_compute_and_exposes_only_the_tail():
    b = GraphBuilder()
    gpu, comm = b.resource(0, "compute"), b.resource(0, "dp_comm")
    a = b.task("bwd", gpu, 4.0, C, "gemm")
    g = b.task("grad_ar", comm, 3.0, M, "all_reduce", deps=[a])
    b.task("other", gpu, 1.0, C, "gemm")
    b.task("optimizer", gpu, 1.0, C, "optimizer", deps=[g])
    r = simulate(b.build())
    assert r.step_time_s == 8.0  # 4 + 3 (all-reduce, 1 s hidden behind 'other') + 1
    bd = breakdown(r)
    assert (bd.compute_s, bd.exposed_comm_s) == (6.0, 2.0)


def test_crossed_collective_order_is_a_deadlock_naming_the_tasks():
    b = GraphBuilder()
    r0, r1 = b.resource(0, "comm"), b.resource(1, "comm")
    ca, cb = b.new_collective(), b.new_collective()
    b.task("A", r0, 1.0, M, "all_reduce", collective=ca)
    b.task("B", r0, 1.0, M, "all_reduce", collective=cb)
    b.task("B", r1, 1.0, M, "all_reduce", collective=cb)
    b.task("A", r1, 1.0, M, "all_reduce", collective=ca)
    with pytest.raises(DeadlockError, match=r"deadlock: .*(A@.*B@|B@.*A@)"):
        simulate(b.build())


def test_collective_member_waiting_on_its_own_collective_is_a_deadlock():
    b = GraphBuilder()
    r0, r1 = b.resource(0, "comm"), b.resource(1, "comm")
    c = b.new_collective()
    first = b.task("ar", r0, 1.0, M, "all_reduce", collective=c)
    b.task("ar", r1, 1.0, M, "all_reduce", deps=[first], collective=c)
    with pytest.raises(DeadlockError, match="same collective"):
        simulate(b.build())


def test_dependency_on_a_task_not_yet_added_is_rejected():
    b = GraphBuilder()
    r = b.resource(0, "compute")
    with pytest.raises(ValueError, match="not an existing task"):
        b.task("a", r, 1.0, C, "gemm", deps=[3])
