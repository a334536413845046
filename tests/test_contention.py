"""Compute slowed by communication beside it on the same GPU (sim/contention.py), by hand.

The fluid model: while a collective of its rank is in flight a compute task runs at 1/(1 + s) of its
rate, so o seconds of overlap cost it s/(1 + s)·o more; at s = 0.2 that is o/6.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from itercast.config.job import Job
from itercast.graph.execgraph import Category, GraphBuilder
from itercast.predict import predict
from itercast.sim.contention import simulate_with_contention
from itercast.sim.engine import simulate

C, M = Category.COMPUTE, Category.COMMUNICATION
MS = 1e-3


def test_compute_beside_a_collective_runs_slower_for_the_overlap():
    # 10 ms of compute beside a 4 ms collective, both from 0, s = 0.2: the first 4 ms do 4/1.2 =
    # 3.333 ms of the work, the 6.667 ms left run alone: 4 + 6.667 = 10.667 ms = 10 + 0.2/1.2·4
    b = GraphBuilder()
    gemm = b.task("gemm", b.resource(0, "compute"), 10 * MS, C, "gemm")
    b.task("grad_reduce_scatter", b.resource(0, "dp_comm"), 4 * MS, M, "dp_reduce_scatter")
    r = simulate_with_contention(b.build(), np.array([0.2]))
    assert r.end_s[gemm] == pytest.approx(10 * MS + 4 * MS / 6)
    assert r.end_s[1] == pytest.approx(4 * MS)  # the collective itself is not slowed
    assert r.step_time_s == pytest.approx(32 / 3 * MS)  # 10.667 ms


def test_a_blocking_collective_on_the_compute_stream_slows_nothing():
    # a TP all-reduce on the compute stream runs after the GEMM, never beside it: 10 + 4 = 14 ms
    b = GraphBuilder()
    comp = b.resource(0, "compute")
    b.task("gemm", comp, 10 * MS, C, "gemm")
    b.task("tp_all_reduce", comp, 4 * MS, M, "tp_collective")
    assert simulate_with_contention(b.build(), np.array([0.2])).step_time_s == pytest.approx(14 * MS)


def test_a_rank_without_communication_runs_as_alone():
    # one GPU: a 10 ms GEMM and nothing in flight beside it (a collective of 0 s is never in flight): 10 ms at s = 0.2
    b = GraphBuilder()
    b.task("gemm", b.resource(0, "compute"), 10 * MS, C, "gemm")
    assert simulate_with_contention(b.build(), np.array([0.2])).step_time_s == pytest.approx(10 * MS)
    b.task("empty_all_reduce", b.resource(0, "dp_comm"), 0.0, M, "dp_all_reduce")
    assert simulate_with_contention(b.build(), np.array([0.2])).step_time_s == pytest.approx(10 * MS)


def test_zero_slowdown_is_the_plain_simulation():
    b = GraphBuilder()
    comp, dp = b.resource(0, "compute"), b.resource(0, "dp_comm")
    first = b.task("gemm", comp, 3 * MS, C, "gemm")
    b.task("grad_all_reduce", dp, 5 * MS, M, "dp_all_reduce", [first])
    b.task("gemm2", comp, 4 * MS, C, "gemm")
    g = b.build()
    plain, zero = simulate(g), simulate_with_contention(g, np.array([0.0]))
    assert zero.start_s.tolist() == plain.start_s.tolist() and zero.end_s.tolist() == plain.end_s.tolist()


def test_concurrent_collectives_count_once_and_only_on_their_own_rank():
    # rank 0: dp_comm [0, 4) and p2p [2, 6) cover 6 ms of a 10 ms GEMM: 10 + 6/6 = 11 ms. A 9 ms
    # collective on rank 1 does not touch rank 0.
    b = GraphBuilder()
    gemm = b.task("gemm", b.resource(0, "compute"), 10 * MS, C, "gemm")
    b.task("grad_all_reduce", b.resource(0, "dp_comm"), 4 * MS, M, "dp_all_reduce")
    wait = b.task("wait", b.resource(0, "host"), 2 * MS, Category.HOST, "host")
    b.task("send", b.resource(0, "p2p_next"), 4 * MS, M, "pp_p2p", [wait])
    b.task("other", b.resource(1, "dp_comm"), 9 * MS, M, "dp_all_reduce")
    r = simulate_with_contention(b.build(), np.array([0.2, 0.2]))
    assert r.end_s[gemm] == pytest.approx(11 * MS)


def test_the_stretch_moves_later_collectives_until_a_fixed_point():
    # comm1 [0, 3) beside A (6 ms): A = 6 + 3/6 = 6.5 ms. comm2 (4 ms) waits for A: [6.5, 10.5),
    # beside B (10 ms, from 6.5): B = 10 + 4/6 = 10.667 ms; the step 6.5 + 10.667 = 17.167 ms
    b = GraphBuilder()
    comp, dp = b.resource(0, "compute"), b.resource(0, "dp_comm")
    b.task("comm1", dp, 3 * MS, M, "dp_all_gather")
    a = b.task("a", comp, 6 * MS, C, "gemm")
    b.task("comm2", dp, 4 * MS, M, "dp_reduce_scatter", [a])
    b.task("b", comp, 10 * MS, C, "gemm")
    r = simulate_with_contention(b.build(), np.array([0.2]))
    assert r.end_s[a] == pytest.approx(6.5 * MS)
    assert r.start_s[2] == pytest.approx(6.5 * MS)
    assert r.step_time_s == pytest.approx((6.5 + 10 + 4 / 6) * MS)


def _gpt_on_dgx_h100(slowdown: float) -> Job:
    """GPT-3 1.3B on 2 DGX H100 nodes, dp 16, ZeRO-1 with overlapped gradient reduction."""
    job = Job.from_presets(
        "gpt3-1.3b",
        "dgx-h100",
        num_nodes=2,
        plan={"data_parallel": 16, "global_batch_size": 64, "micro_batch_size": 2, "zero_stage": 1},
    )
    gpu = job.system.gpu.model_copy(update={"overlap_compute_slowdown": slowdown})
    return dataclasses.replace(job, system=job.system.model_copy(update={"gpu": gpu}))


def test_predict_at_zero_slowdown_is_unchanged_and_at_the_preset_value_slower():
    plain, slowed = predict(_gpt_on_dgx_h100(0.0)), predict(_gpt_on_dgx_h100(0.189))
    assert "overlap_contention" not in plain.family_time_s
    assert slowed.family_time_s["overlap_contention"] > 0
    # the stretch is at most what a whole-step overlap would cost: every compute second × 0.189
    compute_s = plain.breakdown.compute_s
    assert plain.step_time_s < slowed.step_time_s <= plain.step_time_s + 0.189 * compute_s + 1e-12
