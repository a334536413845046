"""Host overheads measured to price ANOTHER workload (traces/host_overheads.py measure(…,
other_workloads=True)): T1 as the reference counts it (gaps under 200 µs, Tukey's outliers removed),
an operator that launches nothing at its name's median duration (at least 6 samples), else its
category's median, else T1 alone; and the ET walk charging them. Every expected value is worked out by
hand below (times in µs); `calibrate --host-trace … --for-another-workload` writes them."""

from __future__ import annotations

import json

import pytest
from kineto_fixtures import cpu_op, step, write
from test_et_distributed import LinearCosts
from typer.testing import CliRunner

from itercast.cli import app
from itercast.hardware.topology import GroupPlacement
from itercast.profile.calibrate import load_calibration
from itercast.traces.et_pricing import ETPricer
from itercast.traces.et_step import predict_step
from itercast.traces.execution_trace import ExecutionTrace, read_execution_trace
from itercast.traces.host_overheads import HostOverheads, measure
from itercast.traces.kineto import TraceError, read_traces

THREAD = "[pytorch|profiler|execution_graph|thread]"


def other_workload_step() -> list[dict]:
    """Step [0, 1000], one thread, no runtime call: seven aten::view of 1, 2, 3, 4, 5, 6 and 100 µs,
    then two aten::lift_fresh of 20 and 30 µs; the gaps between them 4, 4, 4, 4, 6, 6, 60 and 300."""
    ops = [("aten::view", 10, 1), ("aten::view", 15, 2), ("aten::view", 21, 3), ("aten::view", 28, 4)]
    ops += [("aten::view", 36, 5), ("aten::view", 47, 6), ("aten::view", 59, 100)]
    ops += [("aten::lift_fresh", 219, 20), ("aten::lift_fresh", 539, 30)]
    return [step(1, 0, 1000)] + [cpu_op(name, ts, dur) for name, ts, dur in ops]


def test_t1_keeps_the_gaps_the_reference_counts(tmp_path):
    traces = read_traces([write(tmp_path / "o.json", other_workload_step())])
    # the same software's T1: every gap, (4 × 4 + 2 × 6 + 60 + 300) / 8 = 388 / 8
    assert measure(traces).t1_us == pytest.approx(388 / 8)
    # another workload's: 300 ≥ 200 dropped; of 4, 4, 4, 4, 6, 6, 60 the quartiles are 4 (position 1.5)
    # and 6 (position 4.5), Tukey's fences 4 − 1.5 × 2 = 1 and 6 + 1.5 × 2 = 9: 60 dropped too
    other = measure(traces, other_workloads=True)
    assert other.t1_us == pytest.approx((4 * 4 + 2 * 6) / 6)
    assert other.samples["t1"] == 6


def test_an_operator_that_launches_nothing_costs_its_name_median_else_its_category_else_nothing(tmp_path):
    traces = read_traces([write(tmp_path / "o.json", other_workload_step())])
    same, other = measure(traces), measure(traces, other_workloads=True)
    # seven views (≥ 6): their median 4, not their mean (1 + 2 + 3 + 4 + 5 + 6 + 100) / 7 = 121 / 7
    assert other.op_us("no_call_us", "aten::view") == pytest.approx(4.0)
    assert same.op_us("no_call_us", "aten::view") == pytest.approx(121 / 7)
    # two lift_fresh (< 6): the median of the view category's nine, 1 2 3 4 5 6 20 30 100 → 5
    assert other.op_us("no_call_us", "aten::lift_fresh") == pytest.approx(5.0)
    assert other.no_call_by_category == pytest.approx({"view": 5.0})
    # never seen, in a view category measured: 5; in a category not measured (allocation) or none: 0
    assert other.op_us("no_call_us", "aten::transpose") == pytest.approx(5.0)
    assert other.op_us("no_call_us", "aten::empty") == 0.0
    assert other.op_us("no_call_us", "aten::fill_") == 0.0
    # the same software keeps the pooled median over all nine operators, 5, for every unseen name
    assert same.op_us("no_call_us", "aten::fill_") == pytest.approx(5.0)
    assert HostOverheads.from_dict(other.to_dict()).no_call_by_category == other.no_call_by_category


def cpu_ops_trace(tmp_path) -> ExecutionTrace:
    """aten::view, aten::lift_fresh, aten::fill_ and aten::empty, each on a host tensor: none launches."""
    root = {"name": THREAD, "id": 1, "rf_id": 0, "parent": 1, "tid": 1, "inputs": [], "input_shapes": []}
    host_tensor = [7, 7, 0, 4, 4, "cpu"]
    nodes = [root] + [
        {
            "name": name,
            "id": i,
            "rf_id": i,
            "parent": 1,
            "tid": 1,
            "inputs": [host_tensor],
            "input_shapes": [[4]],
            "input_types": ["Tensor(float)"],
            "outputs": [],
            "output_shapes": [],
            "output_types": [],
        }
        for i, name in enumerate(["aten::view", "aten::lift_fresh", "aten::fill_", "aten::empty"], start=2)
    ]
    (tmp_path / "et.json").write_text(json.dumps({"schema": "1.0.1", "nodes": nodes}))
    return read_execution_trace(tmp_path / "et.json")


def test_the_et_walk_charges_other_workload_overheads_to_operators_that_launch_nothing(tmp_path):
    other = measure(read_traces([write(tmp_path / "o.json", other_workload_step())]), other_workloads=True)
    et = cpu_ops_trace(tmp_path)
    (s,) = predict_step([et], [ETPricer(LinearCosts())], other, GroupPlacement(1, 1, 1))  # type: ignore[arg-type]
    # four operators × T1 28 / 6, then view 4 (its median) + lift_fresh 5 (the view category's) + fill_ 0
    # + empty 0 (no category measured): 4 × 28 / 6 + 9 µs
    assert s.host_s == pytest.approx((4 * 28 / 6 + 4 + 5) * 1e-6)
    assert s.iteration_s == pytest.approx(s.host_s)


def two_runs(tmp_path) -> list[str]:
    """Two traces of different runs and world sizes, step [0, 1000], one thread, only aten::view (no call).
    a (world 2): views of 1, 1, 2, 3, 20 µs at 10, 13, 16, 21, 64: 4 gaps 2, 2, 3, 40;
    b (world 4): views of 1, 2, 4 µs at 10, 16, 318: 2 gaps 5, 300."""
    a = [("aten::view", 10, 1), ("aten::view", 13, 1), ("aten::view", 16, 2), ("aten::view", 21, 3)]
    a += [("aten::view", 64, 20)]
    b = [("aten::view", 10, 1), ("aten::view", 16, 2), ("aten::view", 318, 4)]
    return [
        str(write(tmp_path / name, [step(1, 0, 1000)] + [cpu_op(*op) for op in ops], distributedInfo=info))
        for name, ops, info in [
            ("a.json", a, {"rank": 0, "world_size": 2}),
            ("b.json", b, {"rank": 0, "world_size": 4}),
        ]
    ]


def test_calibrate_for_another_workload_from_runs_of_two_world_sizes(tmp_path):
    a, b = two_runs(tmp_path)
    runner = CliRunner()
    cal = tmp_path / "other.json"
    res = runner.invoke(
        app, ["calibrate", "--host-trace", a, "--host-trace", b, "--for-another-workload", "--out", str(cal)]
    )
    assert res.exit_code == 0, res.output
    other = HostOverheads.from_dict(load_calibration(cal)["host_overheads"])
    # a's 4 gaps 2, 2, 3, 40, all under 200: quartiles 2 (position 0.75) and 3 + 0.25 × 37 = 12.25 (position
    # 2.25), the upper fence 12.25 + 1.5 × 10.25 = 27.625 drops 40; b's 300 ≥ 200 dropped, 5 alone stays:
    # T1 (2 + 2 + 3 + 5) / 4 = 3
    assert other.t1_us == pytest.approx(3.0)
    assert other.samples["t1"] == 4
    # 8 views (≥ 6): 1 1 1 2 2 3 4 20, median 2; the view category the same 8; unseen names: nothing
    assert other.op_us("no_call_us", "aten::view") == pytest.approx(2.0)
    assert other.no_call_by_category == pytest.approx({"view": 2.0})
    assert other.op_us("no_call_us", "aten::fill_") == 0.0
    # without the switch, the same software's: the mean of all 6 gaps, (2 + 2 + 3 + 40 + 5 + 300) / 6,
    # and the views' mean (1 + 1 + 2 + 3 + 20 + 1 + 2 + 4) / 8
    res = runner.invoke(app, ["calibrate", "--host-trace", a, "--host-trace", b, "--out", str(cal)])
    assert res.exit_code == 0, res.output
    same = HostOverheads.from_dict(load_calibration(cal)["host_overheads"])
    assert same.t1_us == pytest.approx(352 / 6)
    assert same.op_us("no_call_us", "aten::view") == pytest.approx(34 / 8)
    # a replay still takes one job's ranks only
    with pytest.raises(TraceError, match="different world sizes"):
        read_traces([a, b])


def test_calibrate_for_another_workload_bad_input_is_one_line_exit_2(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["calibrate", "--for-another-workload"])
    assert res.exit_code == 2
    assert res.output == (
        "error: --for-another-workload: expected --host-trace FILE beside it (it chooses how to measure them), "
        "got none\n"
    )
    # one gap, 300 µs: nothing under 200 µs to take T1 from (the same software's T1 is that gap)
    path = write(tmp_path / "far.json", [step(1, 0, 1000), cpu_op("aten::view", 10, 1), cpu_op("aten::view", 311, 1)])
    res = runner.invoke(app, ["calibrate", "--host-trace", str(path), "--for-another-workload"])
    assert res.exit_code == 2
    assert res.output == (
        f"error: {path}: no gap under 200 µs between two operators inside the chosen steps: "
        "nothing to measure T1 from for another workload\n"
    )
    res = runner.invoke(app, ["calibrate", "--host-trace", str(path)])
    assert res.exit_code == 0, res.output
