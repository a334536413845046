"""`replay --host-cores N` (sim/sharing.py): ranks' CPU work sharing a host's cores (processor
sharing), waits using none; the measured sharing divided out of a trace, the what-if's applied;
bad core counts: one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_replay_pipeline import two_stage_trace
from typer.testing import CliRunner

from itercast.cli import app
from itercast.graph.execgraph import Category, ExecGraph, GraphBuilder
from itercast.replay import replay_whatif
from itercast.sim.engine import simulate
from itercast.sim.sharing import resimulate_shared, shared_work_s, simulate_shared
from itercast.traces.whatif import WhatIf

RUN = CliRunner()
GLOO = Path(__file__).resolve().parents[1] / "data" / "measured" / "gloo_parallelism"
MS = 1e-3


def two_ranks(work_s: float) -> ExecGraph:
    """Rank 0 and rank 1: one host task of `work_s` each, independent."""
    b = GraphBuilder()
    for rank in (0, 1):
        b.task("work", b.resource(rank, "host:1"), work_s, Category.HOST, "runtime")
    return b.build()


def test_two_ranks_on_one_core_each_take_twice_their_work():
    sim = simulate_shared(two_ranks(10 * MS), 1, {})
    # both run from 0 at 1 core / 2 runnable = half speed: 10 ms of work takes 20 ms
    assert sim.end_s.tolist() == pytest.approx([20 * MS, 20 * MS])


def test_a_blocking_wait_frees_the_core_for_the_other_rank():
    b = GraphBuilder()
    first = b.task("a1", b.resource(0, "host:1"), 4 * MS, Category.HOST, "runtime")
    waited = b.task("kernel", b.resource(0, "compute"), 5 * MS, Category.COMPUTE, "kernel", [first])
    second = b.task("a2", b.resource(0, "host:1"), 6 * MS, Category.HOST, "runtime", [waited])
    other = b.task("c", b.resource(1, "host:1"), 10 * MS, Category.HOST, "runtime")
    sim = simulate_shared(b.build(), 1, {})
    # 0–8 ms: a1 and c share the core: a1's 4 ms done at 8 ms, c has 4 of its 10 ms done
    # 8–13 ms: rank 0 waits 5 ms for the kernel (no core): c alone, 4 + 5 = 9 ms done
    # 13–15 ms: a2 and c share: c's last 1 ms takes 2 ms; a2 has 1 ms done
    # 15–20 ms: a2 alone: its last 5 ms
    assert sim.end_s[[first, waited, other, second]].tolist() == pytest.approx([8 * MS, 13 * MS, 15 * MS, 20 * MS])


def test_a_rank_standing_for_two_weighs_twice():
    sim = simulate_shared(two_ranks(10 * MS), 2, {0: 2.0, 1: 2.0})
    # load 2 + 2 = 4 on 2 cores: each at half speed
    assert sim.end_s.tolist() == pytest.approx([20 * MS, 20 * MS])


def test_the_work_done_alone_in_a_shared_stretch():
    starts, ends, weight = np.array([0.0, 0.0]), np.array([20.0, 10.0]), np.array([1.0, 1.0])
    alone = shared_work_s(starts, ends, weight, 1, np.array([0.0, 0.0, 10.0]), np.array([20.0, 10.0, 20.0]))
    # 0–10: two runnable on one core (rate 1/2), 10–20: one (rate 1)
    assert alone.tolist() == pytest.approx([10 / 2 + 10, 10 / 2, 10])


def test_the_measured_sharing_is_divided_out_and_the_target_applied():
    graph = two_ranks(20 * MS)  # as measured: both ranks 20 ms at once on 1 core
    measured = simulate(graph)
    alone = resimulate_shared(measured, graph, 1, {0: 1.0, 1: 1.0}, {0: 0.5, 1: 0.5})
    # divided out: 20 ms at rate 1/2 = 10 ms of work; target: one process (0.5 + 0.5) on 1 core
    assert alone.end_s.tolist() == pytest.approx([10 * MS, 10 * MS])
    crowded = resimulate_shared(measured, graph, 1, {0: 1.0, 1: 1.0}, {0: 2.0, 1: 2.0})
    # four processes on 1 core: 10 ms of work at rate 1/4
    assert crowded.end_s.tolist() == pytest.approx([40 * MS, 40 * MS])


def test_merging_stages_that_shared_one_core_keeps_their_work_alone(tmp_path):
    _, merged, _ = replay_whatif(two_stage_trace(tmp_path), WhatIf(pp_stages=1, host_cores=1))
    # stage 0 works 0–200, 520–720, 730–950 µs; stage 1 105–205, 210–730 (receives are waits):
    # both run on the core in 105–200 and 520–720, each at half speed there
    s0_forward = 100 + (5 + 95 / 2)  # unit 1 (100–200) shared for 95 µs
    s0_backward = 200 / 2 + 200  # unit 0 (520–720) shared throughout
    s0_rest = 20
    s1_forward = (95 / 2 + 5) + 100  # unit 0 (105–205) shared for 95 µs
    s1_backward = 200 + (10 + 190 / 2)  # unit 1 (510–710) shared for 190 µs
    s1_rest = 10 / 2 + 10  # 710–730, shared until 720
    expected_us = s0_forward + s0_backward + s0_rest + s1_forward + s1_backward + s1_rest
    assert expected_us == pytest.approx(945)  # 1240 µs with the measured times kept
    assert [s.replayed_s * 1e6 for s in merged.steps] == pytest.approx([expected_us])


@pytest.mark.skipif(not GLOO.is_dir(), reason="data/measured/gloo_parallelism absent")
def test_the_same_size_on_the_same_cores_replays_the_measured_run():
    paths = sorted(GLOO.glob("ws2.rank*.trace.json.gz"))
    base, same, counts = replay_whatif(paths, WhatIf(dp=2, host_cores=2))
    assert [s.replayed_s for s in same.steps] == pytest.approx([s.replayed_s for s in base.steps], rel=1e-6)
    assert counts["CPU work shares 2 host cores: 2 processes measured, 2 in the what-if"] == 1


@pytest.mark.parametrize("cores", ["0", "-2"])
def test_a_core_count_below_one_is_one_line_and_exit_2(tmp_path, cores):
    result = RUN.invoke(app, ["replay", *two_stage_trace(tmp_path), "--pp-stages", "1", "--host-cores", cores])
    assert result.exit_code == 2
    assert (
        f"--host-cores: expected the number of cores of the host that ran the ranks (≥ 1); got {cores}" in result.output
    )
    assert "Traceback" not in result.output


# -- scheduler waits of a collective whose ranks outnumber the host's cores ----------------------


def test_scheduler_wait_is_one_base_slice_per_ring_round_once_ranks_outnumber_cores():
    from itercast.sim.sharing import scheduler_wait_s

    # 2 cores: slice 0.75 ms × (1 + log2 2) = 1.5 ms; a 4-rank ring all-reduce has 2 × 3 rounds
    assert scheduler_wait_s("all_reduce", 4, 2) == pytest.approx(6 * 1.5 * MS)
    # all-gather and all-to-all: 3 − 1 = 2 rounds at 3 ranks
    assert scheduler_wait_s("all_gather", 3, 2) == pytest.approx(2 * 1.5 * MS)
    assert scheduler_wait_s("alltoall", 3, 2) == pytest.approx(2 * 1.5 * MS)
    # every rank has a core: no wait
    assert scheduler_wait_s("all_reduce", 2, 2) == 0.0
    # 16 cores: the scale stops at 8 cores, 1 + log2 8 = 4 → 3 ms; 32 ranks: 2 × 31 rounds
    assert scheduler_wait_s("all_reduce", 32, 16) == pytest.approx(62 * 3 * MS)


class _BandwidthOnly:
    """A collective model of pure ring bandwidth (1 byte/s, no latency) on 8-rank nodes."""

    class system:
        class node:
            gpus_per_node = 8

    @staticmethod
    def collective_s(kind: str, nbytes: float, group) -> float:
        n = group.size
        return 2 * (n - 1) / n * nbytes


def test_cpu_collective_retimed_without_the_traces_waits_and_with_the_targets():
    from itercast.traces.parallel_whatifs import retime_cpu_collective

    model = _BandwidthOnly()
    # 2 → 4 ranks on 2 cores: 5 ms × (2·3/4)/(2·1/2) = 7.5 ms, plus 6 rounds × 1.5 ms = 9 ms
    assert retime_cpu_collective(model, "all_reduce", 1e6, 2, 4, 5 * MS, 2) == pytest.approx(16.5 * MS)
    # 4 → 2: the 9 ms of waits out of 20 ms, the 11 ms left × 1/1.5, no waits at 2 ranks
    assert retime_cpu_collective(model, "all_reduce", 1e6, 4, 2, 20 * MS, 2) == pytest.approx(11 / 1.5 * MS)
    # 4 → 1: no collective at all
    assert retime_cpu_collective(model, "all_reduce", 1e6, 4, 1, 20 * MS, 2) == 0.0


def test_profile_run_refuses_collective_groups_of_one_rank(tmp_path):
    db = tmp_path / "p.db"
    out = RUN.invoke(app, ["profile", "run", "--db", str(db), "--families", "collective", "--collective-ranks", "1,2"])
    assert out.exit_code == 2
    assert "--collective-ranks: expected groups of 2 or more ranks; got '1,2'" in out.output
    assert not db.exists()
