"""`replay --pp-stages N` on a pipeline trace (traces/pipeline_stages.py, traces/restage.py): a
hand-built 2-stage GPipe trace of 2 micro-batches merged to 1 stage (its work serialised) and split
to 4 (the pipeline formula for uniform stages, sends re-timed by a hand-set point-to-point fit);
the measured gloo pipeline traces read as 8 micro-batches under GPipe; bad re-stagings: one line,
exit 2."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
from kineto_fixtures import cpu_op, step, write
from typer.testing import CliRunner

from itercast.cli import app
from itercast.costs.curves import curves
from itercast.replay import replay_whatif
from itercast.traces.kineto import read_traces
from itercast.traces.pipeline_stages import StageStep, stage_steps, work_stretches_us
from itercast.traces.restage import new_warmups, restage_steps, schedule_order
from itercast.traces.whatif import WhatIf

RUN = CliRunner()
GLOO = Path(__file__).resolve().parents[1] / "data" / "measured" / "gloo_pipeline"
ACTIVATION_DIMS = [[[32, 1024]], [], [], []]  # fp32: 32 × 1024 × 4 = 131,072 bytes
BACKWARD = "autograd::engine::evaluate_function: AddmmBackward0"


def p2o(name: str, ts: float, dur: float) -> dict:
    """A c10d send or receive of one activation."""
    return cpu_op(name, ts, dur) | {"args": {"Input Dims": ACTIVATION_DIMS}}


def two_stage_trace(tmp_path: Path) -> list[str]:
    """GPipe, 2 micro-batches, one step. Stage 0: forward units of 90 µs compute + a 10 µs send
    (100 µs each), backward units of 200 µs after a receive, then 20 µs of optimizer. Stage 1: forward
    units of 100 µs after a receive, backward units of 190 µs + a 10 µs send, 20 µs of optimizer."""
    stage0 = [
        step(1, 0, 950),
        cpu_op("aten::linear", 0, 90),
        p2o("c10d::send", 90, 10),
        cpu_op("aten::linear", 100, 90),
        p2o("c10d::send", 190, 10),
        p2o("c10d::recv_", 200, 320),
        cpu_op(BACKWARD, 520, 200),
        p2o("c10d::recv_", 720, 10),
        cpu_op(BACKWARD, 730, 200),
        cpu_op("aten::add_", 930, 20),
    ]
    stage1 = [
        step(1, 0, 730),
        p2o("c10d::recv_", 0, 105),
        cpu_op("aten::linear", 105, 100),
        p2o("c10d::recv_", 205, 5),
        cpu_op("aten::linear", 210, 100),
        cpu_op(BACKWARD, 310, 190),
        p2o("c10d::send", 500, 10),
        cpu_op(BACKWARD, 510, 190),
        p2o("c10d::send", 700, 10),
        cpu_op("aten::add_", 710, 20),
    ]
    return [
        str(write(tmp_path / f"s{rank}.json", events, distributedInfo={"rank": rank, "world_size": 2}))
        for rank, events in enumerate((stage0, stage1))
    ]


def p2p_fit(alpha_s: float) -> dict:
    """The built-in curves with the cross-node point-to-point fit made alpha + bytes / NIC bandwidth
    (eff = e_max / (1 + e^0) = 1 at gamma 0)."""
    fits = copy.deepcopy(curves())
    fits["collectives"]["p2p"]["inter_node"] = {"alpha0_s": alpha_s, "e_max": 2.0, "log_half": 0.0, "gamma": 0.0}
    return fits


def test_stages_are_read_as_micro_batch_units(tmp_path):
    s0, s1 = (stage_steps(t, t.rank)[0] for t in read_traces(two_stage_trace(tmp_path)))
    assert s0.forward_s * 1e6 == pytest.approx([90 + 10, 90 + 10])  # compute + its send
    assert s0.backward_s * 1e6 == pytest.approx([200, 200])  # the receives are waits, not work
    assert s1.forward_s * 1e6 == pytest.approx([100, 100])
    assert s1.backward_s * 1e6 == pytest.approx([190 + 10, 190 + 10])
    assert s0.rest_s * 1e6 == pytest.approx(20) and s1.rest_s * 1e6 == pytest.approx(20)
    assert s0.order == s1.order == (("F", 0), ("F", 1), ("B", 0), ("B", 1))
    assert s0.activation_bytes == 32 * 1024 * 4


def test_a_stage_works_outside_its_receives_and_its_waits_for_sends(tmp_path):
    # stage 0's second forward starts 50 µs after its first send, whose gloo transfer ends in that gap:
    # the thread waited for the send, so the gap is not work (else the unit would read 150 µs)
    stage0 = [
        step(1, 0, 1000),
        cpu_op("aten::linear", 0, 90),
        p2o("c10d::send", 90, 10),
        {"ph": "X", "cat": "user_annotation", "name": "gloo:send", "pid": 100, "tid": 200, "ts": 95, "dur": 45},
        cpu_op("aten::linear", 150, 90),
        p2o("c10d::send", 240, 10),
        p2o("c10d::recv_", 250, 320),
        cpu_op(BACKWARD, 570, 200),
        p2o("c10d::recv_", 770, 10),
        cpu_op(BACKWARD, 780, 200),
        cpu_op("aten::add_", 980, 20),
    ]
    info = {"rank": 0, "world_size": 2}
    (trace,) = read_traces([str(write(tmp_path / "s0.json", stage0, distributedInfo=info))])
    s0 = stage_steps(trace, 0)[0]
    assert s0.forward_s * 1e6 == pytest.approx([100, 100]) and s0.backward_s * 1e6 == pytest.approx([200, 200])
    # the stretches it worked in: its ops and the gaps before them, not its receives (330 µs) nor the
    # 50 µs it waited for its send: 1,000 - 330 - 50 = 620 µs
    starts, ends = work_stretches_us(trace)
    assert float(np.sum(ends - starts)) == pytest.approx(620)


def test_merging_two_stages_into_one_serialises_their_work(tmp_path):
    _, merged, counts = replay_whatif(two_stage_trace(tmp_path), WhatIf(pp_stages=1))
    # one rank runs both stages' units: forwards 2 × (100 + 100), backwards 2 × (200 + 200), optimizers 20 + 20
    expected_us = 2 * (100 + 100) + 2 * (200 + 200) + (20 + 20)
    assert expected_us == 1240
    assert [s.replayed_s * 1e6 for s in merged.steps] == pytest.approx([expected_us])
    assert "pipeline stages 2 -> 1 (merged); schedule GPipe, 2 micro-batches" in counts


def test_splitting_into_four_stages_follows_the_uniform_pipeline_formula(tmp_path):
    paths = two_stage_trace(tmp_path)
    _, split, _ = replay_whatif(paths, WhatIf(pp_stages=4, curves=p2p_fit(1e-6)))
    # each half stage: forward 100/2, backward 200/2 per micro-batch, optimizer 20/2 (µs)
    f_us, b_us, rest_us, m, n = 50.0, 100.0, 10.0, 2, 4
    # cpu-host: one rank a node, sends over a 1.25e9 B/s NIC (systems.yaml): 1 µs + 131,072 B / 1.25e9 B/s
    send_us = 1.0 + 131072 / 1.25e9 * 1e6
    assert send_us == pytest.approx(105.8576)  # above the 50 µs network latency floor
    # GPipe over uniform stages: (M + N − 1)(f + b); gloo sends start once the receiver has posted its
    # receive (after its previous unit), so each direction's critical path holds M + N − 2 sends
    expected_us = (m + n - 1) * (f_us + b_us) + 2 * (m + n - 2) * send_us + rest_us
    assert expected_us == pytest.approx(1606.8608)
    first = [s for s in split.steps if s.rank == 0]
    assert [s.replayed_s * 1e6 for s in first] == pytest.approx([expected_us])
    assert max(s.replayed_s for s in split.steps) * 1e6 == pytest.approx(expected_us)
    assert sorted(s.rank for s in split.steps) == [0, 1, 2, 3]


def test_schedule_order_runs_warmup_forwards_then_alternates():
    assert schedule_order(2, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]  # GPipe
    assert schedule_order(1, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]  # 1F1B, last stage


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pp-stages", "3"], "2 stages merge or split evenly: expected a divisor or multiple of 2; got 3"),
        (["--pp-stages", "4", "--dp", "2"], "--pp-stages re-stages the traces on its own"),
        (["--pp-stages", "0"], "expected a number of pipeline stages ≥ 1; got 0"),
    ],
)
def test_bad_restaging_is_one_line_and_exit_2(tmp_path, args, message):
    result = RUN.invoke(app, ["replay", *two_stage_trace(tmp_path), *args])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_a_split_says_its_stages_divide_each_traced_stage_evenly(tmp_path):
    """2 traced stages as 4: each split in 2 equal parts, which the traces cannot confirm; a merge says nothing."""
    split = RUN.invoke(app, ["replay", *two_stage_trace(tmp_path), "--pp-stages", "4"])
    assert split.exit_code == 0, split.output
    assert "--pp-stages 4: each traced stage's work is split into 2 equal stages" in split.stderr
    merged = RUN.invoke(app, ["replay", *two_stage_trace(tmp_path), "--pp-stages", "1"])
    assert merged.exit_code == 0 and "split into" not in merged.stderr


def test_one_stage_of_two_is_refused(tmp_path):
    result = RUN.invoke(app, ["replay", two_stage_trace(tmp_path)[0], "--pp-stages", "4"])
    assert result.exit_code == 2
    assert "expected the trace of every stage of a pipeline-only run (ranks 0..1); got ranks [0]" in result.output


def test_the_cli_prints_the_new_stages_steps(tmp_path):
    result = RUN.invoke(app, ["replay", *two_stage_trace(tmp_path), "--pp-stages", "1"])
    assert result.exit_code == 0, result.output
    assert "what-if step, mean over stages and steps: 1.240 ms" in result.output


@pytest.mark.skipif(not GLOO.is_dir(), reason="data/measured/gloo_pipeline absent")
def test_the_measured_gloo_pipeline_reads_as_eight_micro_batches_under_gpipe():
    for stages in (2, 4):
        for t in read_traces(sorted(GLOO.glob(f"pp{stages}.rank*.trace.json.gz"))):
            for st, (_, _, _, dur_us) in zip(stage_steps(t, t.rank), t.steps, strict=True):
                assert st.micro_batches == 8
                assert st.order == tuple(schedule_order(8, 8))
                work_s = st.forward_s.sum() + st.backward_s.sum() + st.rest_s
                assert 0 < work_s < dur_us * 1e-6  # the receives' waits are not work


def unit_stage(rank: int, order: str, activation_bytes: float | None = None) -> StageStep:
    """A stage of 4 micro-batches, 1 ms forwards and 2 ms backwards, that ran `order` ("F0 B0 …")."""
    units = tuple((u[0], int(u[1:])) for u in order.split())
    return StageStep(rank, 1, np.full(4, 1e-3), np.full(4, 2e-3), 0.0, units, activation_bytes)


def test_a_1f1b_split_keeps_p_minus_s_forwards_before_each_new_stages_first_backward():
    # 1F1B (Megatron-LM schedules.py forward_backward_pipelining_without_interleaving): stage s of p runs
    # p − s − 1 warm-up forwards, then one forward before its first backward: p − s forwards, at most M.
    # Traced on 2 stages, M = 4: stage 0 two, stage 1 one. On 4 stages: min(4, 4 − j) = 4, 3, 2, 1
    stages = [unit_stage(0, "F0 F1 B0 F2 B1 F3 B2 B3"), unit_stage(1, "F0 B0 F1 B1 F2 B2 F3 B3")]
    assert new_warmups(stages, 4) == ([4, 3, 2, 1], "1F1B")


def test_a_merged_stage_sends_the_activation_of_the_last_stage_it_merges():
    # 4 stages → 2: new stage 0 runs stages 0 and 1, so it sends what stage 1 sent (200 B), not stage 0's;
    # its forward units are the two stages' 1 ms forwards in series
    order = "F0 F1 F2 F3 B0 B1 B2 B3"
    merged, nbytes = restage_steps([unit_stage(s, order, 100.0 * (s + 1)) for s in range(4)], 2)
    assert nbytes == [200.0]
    assert merged[0].forward_s.tolist() == pytest.approx([2e-3] * 4)
