"""Compute slowed by the compute of another rank of the same host (sim/contention.py,
simulate_with_corunning), by hand.

The fluid model: while a compute task of another rank of its node runs, a compute task runs at
1/(1 + s) of its rate, so o seconds of such overlap cost it s/(1 + s)·o more; at s = 0.5 that is o/3.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_dlrm import model, system
from test_golden import flat, linear_calibration

from itercast.graph.execgraph import Category, ExecGraph, GraphBuilder
from itercast.sim.contention import simulate_with_corunning
from itercast.sim.engine import simulate
from itercast.workloads.dlrm import Shard, dlrm_step, no_overheads
from itercast.workloads.dlrm.step import corunning_slowdown

C = Category.COMPUTE


def _two_ranks() -> tuple[ExecGraph, int, int]:
    """Rank 0 computes 10 s, rank 1 computes 4 s then idles; both from 0."""
    b = GraphBuilder()
    long = b.task("embedding_fwd", b.resource(0, "compute"), 10.0, C, "embedding")
    short = b.task("embedding_fwd", b.resource(1, "compute"), 4.0, C, "embedding")
    return b.build(), long, short


def test_both_ranks_slow_while_both_compute_and_the_long_one_runs_alone_after():
    # s = 0.5 on both, stretch s/(1 + s) = 1/3. The fluid answer: while both run each progresses at
    # 1/1.5, so the 4 s task takes 4 × 1.5 = 6 s; the 10 s one did 6/1.5 = 4 s of its work by then
    # and runs its 6 s left alone: 12 s (fixed point: short = 4 + short/3 = 6, long = 10 + 6/3 = 12).
    # The fixed point iterates from the plain schedule: short_k = 4 + short_{k-1}/3, short_0 = 4, its
    # error 6 − short_k = 2/3^k; long_k = 10 + short_{k-1}/3. Round 5 (MAX_ROUNDS; it moved 4/243 s,
    # above 1e-4 relative): short_5 = 6 − 2/243 s, long_5 = 10 + (6 − 2/81)/3 = 12 − 2/243 s.
    graph, long, short = _two_ranks()
    r = simulate_with_corunning(graph, np.full(2, 0.5), np.array([0, 0]))
    assert r.end_s[short] == pytest.approx(6 - 2 / 243, rel=1e-12)
    assert r.end_s[long] == pytest.approx(12 - 2 / 243, rel=1e-12)
    assert r.step_time_s == pytest.approx(12 - 2 / 243, rel=1e-12)


def test_each_task_takes_its_own_slowdown():
    # s 0.5 on rank 0, 0.25 on rank 1 (stretch 1/5). Fluid: the short task runs 4 × 1.25 = 5 s; the
    # long one does 5/1.5 = 10/3 s of work in that time, then 20/3 alone: 10 + 5/3 = 11.667 s.
    # Rounds: short_k = 4 + short_{k-1}/5 (error 1/5^k, short_0 = 4); long_k = 10 + short_{k-1}/3:
    # long_5 = 10 + (5 − 1/625)/3 = 11.667 − 1/1875 s; short_5 = 5 − 1/3125 s.
    graph, long, short = _two_ranks()
    r = simulate_with_corunning(graph, np.array([0.5, 0.25]), np.array([0, 0]))
    assert r.end_s[short] == pytest.approx(5 - 1 / 3125, rel=1e-12)
    assert r.end_s[long] == pytest.approx(10 + 5 / 3 - 1 / 1875, rel=1e-12)


def test_ranks_on_different_nodes_do_not_slow_each_other():
    # the same two tasks, rank 0 on node 0 and rank 1 on node 1: 10 s and 4 s, as alone
    graph, long, short = _two_ranks()
    r = simulate_with_corunning(graph, np.full(2, 0.5), np.array([0, 1]))
    assert (r.end_s[long], r.end_s[short]) == (10.0, 4.0)


def test_the_other_ranks_communication_and_host_time_slow_nothing():
    # rank 1 spends 10 s in a collective and 10 s of host time beside rank 0's 10 s of compute, and
    # rank 0's own second stream computes beside it: no other rank computes, so 10 s at s = 0.5
    b = GraphBuilder()
    gemm = b.task("mlp", b.resource(0, "compute"), 10.0, C, "mlp")
    b.task("mlp", b.resource(0, "compute2"), 10.0, C, "mlp")
    b.task("all_reduce", b.resource(1, "dp_comm"), 10.0, Category.COMMUNICATION, "all_reduce")
    b.task("host:mlp", b.resource(1, "host"), 10.0, Category.HOST, "host")
    r = simulate_with_corunning(b.build(), np.full(4, 0.5), np.array([0, 0]))
    assert r.end_s[gemm] == 10.0


def test_zero_slowdown_is_the_plain_simulation():
    graph, _, _ = _two_ranks()
    plain, zero = simulate(graph), simulate_with_corunning(graph, np.zeros(2), np.array([0, 0]))
    assert zero.end_s.tolist() == plain.end_s.tolist()


def _slower_compute() -> dict:
    """test_golden's linear calibration with GEMM and memory curves at efficiency 1.6 / 2 = 0.8 (e_max
    1.6): every compute task 1/0.8 = 1.25 times its linear seconds, s = 0.25; collectives unchanged."""
    cal = linear_calibration()
    cal["gemm"] = {k: flat(e_max=1.6) for k in cal["gemm"]}
    cal["memory"] = {k: flat(e_max=1.6) for k in cal["memory"]}
    return cal


def _step(plan: dict[str, Shard], co_running: dict | None, calibration: dict | None = None) -> float:
    cal = calibration or linear_calibration()
    return dlrm_step(
        model(2), system(2), plan, 64, cal, host_overheads=no_overheads(), co_running=co_running
    ).step_time_s


def test_a_dlrm_task_takes_its_co_running_over_alone_seconds_as_s():
    # the same step on both calibrations, task for task: 1.25 − 1 = 0.25 for compute, 0 for the exchanges
    plan = {"t0": Shard("table_wise", (0,)), "t1": Shard("table_wise", (1,))}
    sys2, cal = system(2), linear_calibration()
    alone = dlrm_step(model(2), sys2, plan, 64, cal, host_overheads=no_overheads()).graph
    corun = dlrm_step(model(2), sys2, plan, 64, _slower_compute(), host_overheads=no_overheads()).graph
    s = corunning_slowdown(alone, corun)
    compute = (alone.category == C) & (alone.duration_s > 0)
    assert s[compute] == pytest.approx(np.full(int(compute.sum()), 0.25))
    assert s[alone.category == Category.COMMUNICATION].tolist() == [0.0] * 8  # 4 collectives × 2 ranks


def test_symmetric_ranks_co_run_throughout_and_a_rank_without_tables_spares_the_other():
    # one table per rank: the two ranks' timelines are the same, every compute task beside its twin,
    # so each runs at its co-running price: D = d + D/5, D = 1.25 d; five rounds leave d/(4 × 5^5)
    # a task, below 1e-4 of the step. Both tables on rank 0: rank 1 idles while rank 0 looks up, and
    # those seconds stay at the alone price: between the alone and the co-running step.
    even = {"t0": Shard("table_wise", (0,)), "t1": Shard("table_wise", (1,))}
    assert _step(even, _slower_compute()) == pytest.approx(_step(even, None, _slower_compute()), rel=1e-4)
    stacked = {"t0": Shard("table_wise", (0,)), "t1": Shard("table_wise", (0,))}
    alone, everywhere = _step(stacked, None), _step(stacked, None, _slower_compute())
    assert alone < _step(stacked, _slower_compute()) < everywhere - 1e-4 * everywhere


def test_co_running_on_the_alone_calibration_is_the_plain_step():
    plan = {"t0": Shard("row_wise", (0, 1)), "t1": Shard("data_parallel", (0, 1))}
    assert _step(plan, linear_calibration()) == _step(plan, None)
