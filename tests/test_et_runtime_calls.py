"""Host time per runtime call in a step priced from execution traces: the calls each operator makes,
counted per operator name on other Kineto traces (traces/host_overheads.py measure, calls_per_op),
charged by the ET walk (traces/et_step.py), leave one rank out, and `predict --et --measured-starts`.
Every expected value is worked out by hand below (times in µs)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from kineto_fixtures import call, cpu_op, kernel, step, write
from test_et_distributed import TBE, LinearCosts, node, rank_trace, t
from typer.testing import CliRunner

from itercast.cli import app
from itercast.hardware.topology import GroupPlacement
from itercast.profile.calibrate import host_overheads_only
from itercast.traces.et_pricing import ETPricer
from itercast.traces.et_step import predict_step
from itercast.traces.execution_trace import ExecutionTrace, read_execution_trace
from itercast.traces.host_overheads import HostOverheadError, HostOverheads, left_out, measure, with_calls_of
from itercast.traces.kineto import read_kineto, read_traces

LAUNCH = "cudaLaunchKernel"
THREAD = "[pytorch|profiler|execution_graph|thread]"


def calibration_step() -> list[dict]:
    """Step [0, 100]: aten::mul 10–40 makes 3 launches (12–16, 20–24, 30–34); aten::view 45–50 makes
    none; aten::to 55–85 launches (57–61) then waits in cudaStreamSynchronize (65–75)."""
    return [
        step(1, 0, 100),
        cpu_op("aten::mul", 10, 30),
        call(LAUNCH, 12, 4),
        call(LAUNCH, 20, 4),
        call(LAUNCH, 30, 4),
        cpu_op("aten::view", 45, 5),
        cpu_op("aten::to", 55, 30),
        call(LAUNCH, 57, 4),
        call("cudaStreamSynchronize", 65, 10),
    ]


def test_runtime_calls_are_counted_per_operator_name_and_priced_by_t2_t4_t5(tmp_path):
    o = measure(read_traces([write(tmp_path / "cal.json", calibration_step())]))
    # T1: 40→45 and 50→55; T4 of a launch: 4 (the synchronising call is not timed)
    assert o.t1_us == pytest.approx(5.0) and o.t4_us == pytest.approx({LAUNCH: 4.0})
    # aten::mul: T2 12 − 10 = 2, T5 (20 − 16, 30 − 24) → 5, T3 40 − 34 = 6
    assert o.per_op["aten::mul"] == pytest.approx({"t2_us": 2.0, "t3_us": 6.0, "t5_us": 5.0})
    assert o.calls_per_op == {
        "aten::mul": {LAUNCH: 3.0},
        "aten::to": {LAUNCH: 1.0, "synchronising": 1.0},  # aten::view makes no call: not counted
    }
    # mul: T2 2 + 3 launches × 4 + 2 gaps × T5 5 = 24; to: T2 57 − 55 = 2 + 4 + 0 (its wait is the
    # GPU's) + 1 gap × T5 (65 − 61 = 4) = 10; an operator never counted: None
    assert o.calls_us("aten::mul") == pytest.approx(24.0)
    assert o.calls_us("aten::to") == pytest.approx(10.0)
    assert o.calls_us("aten::relu") is None
    assert HostOverheads.from_dict(o.to_dict()).calls_per_op == o.calls_per_op


def mul_trace(tmp_path) -> ExecutionTrace:
    """One aten::mul of two 1,000-float GPU tensors into a third (12,000 B: 12 µs at 1 ns/B)."""
    root = {"name": THREAD, "id": 1, "rf_id": 0, "parent": 1, "tid": 1, "inputs": [], "input_shapes": []}
    mul = node(4, "aten::mul", [t(1, 1, [1000]), t(2, 2, [1000])], [t(3, 3, [1000])])
    (tmp_path / "et.json").write_text(json.dumps({"schema": "1.0.1", "nodes": [root, mul]}))
    return read_execution_trace(tmp_path / "et.json")


def test_an_operator_with_3_runtime_calls_in_the_calibration_trace_is_charged_3_launches(tmp_path):
    o = measure(read_traces([write(tmp_path / "cal.json", calibration_step())]))
    et = mul_trace(tmp_path)
    (s,) = predict_step([et], [ETPricer(LinearCosts())], o, GroupPlacement(1, 1, 1))  # type: ignore[arg-type]
    # T1 5, then 3 launches: T2 2 + T4 4 (the walked one: the kernel is issued at 5 + 2 + 4 = 11 and runs
    # 11–23) + 2 × (T5 5 + T4 4), then T3 6: 5 + 2 + 3 × 4 + 2 × 5 + 6 = 35 µs of host, the step's end
    assert s.host_s == pytest.approx(35e-6) and s.iteration_s == pytest.approx(35e-6)
    assert not s.default_calls
    # never counted elsewhere: one call for its one priced launch, 5 + 2 + 4 + 6 = 17 µs; the kernel
    # ends later, at 23 µs
    (d,) = predict_step([et], [ETPricer(LinearCosts())], replace(o, calls_per_op={}), GroupPlacement(1, 1, 1))  # type: ignore[arg-type]
    assert d.host_s == pytest.approx(17e-6) and d.iteration_s == pytest.approx(23e-6)
    assert d.default_calls == {"aten::mul": 1}


def test_malformed_call_counts_are_one_line():
    doc = HostOverheads(1.0, {}, {}, dict.fromkeys(("t2_us", "t3_us", "t5_us", "no_call_us"), 0.0)).to_dict()
    doc["calls_per_op"] = {"aten::mul": {LAUNCH: -1}}
    with pytest.raises(HostOverheadError, match=r"calls_per_op\.aten::mul\.cudaLaunchKernel: .*\(calls\), got -1"):
        HostOverheads.from_dict(doc)


def rank_kineto(tbe_launches: int, nccl_end_us: float) -> list[dict]:
    """One rank's Kineto step [0, 200] of rank_trace's operators: the TBE lookup 10–40 making
    `tbe_launches` launches, the all-reduce 50–60 (its NCCL kernel 60 → `nccl_end_us`), the add 90–100."""
    events = [step(1, 0, 200), cpu_op(TBE, 10, 30)]
    events += [call(LAUNCH, 12 + 10 * i, 5) for i in range(tbe_launches)]
    events += [cpu_op("c10d::allreduce_", 50, 10), call(LAUNCH, 52, 5, corr=3)]
    events += [kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 60, nccl_end_us - 60, corr=3)]
    return [*events, cpu_op("aten::add_", 90, 10), call(LAUNCH, 92, 5)]


def test_each_rank_is_charged_the_calls_counted_on_the_other_ranks(tmp_path):
    paths = [write(tmp_path / f"w{r}.json", rank_kineto(2 + r, 80 - 10 * r)) for r in (0, 1)]
    runs = [read_kineto(p) for p in paths]
    # rank 0's TBE made 2 launches, rank 1's 3: each rank gets the other's count
    counted = [m.calls_per_op[TBE] for m in left_out(runs)]
    assert counted == [{LAUNCH: 3.0}, {LAUNCH: 2.0}]
    base = replace(measure(runs), calls_per_op={"aten::relu": {LAUNCH: 4.0}, TBE: {LAUNCH: 9.0}})
    merged = with_calls_of(base, left_out(runs)[0])
    assert merged.calls_per_op[TBE] == {LAUNCH: 3.0} and merged.calls_per_op["aten::relu"] == {LAUNCH: 4.0}


def test_cli_measured_starts_and_calls_left_out_through_predict(tmp_path):
    ets, kin = tmp_path / "ets", tmp_path / "kin"
    ets.mkdir(), kin.mkdir()
    for r in (0, 1):
        rank_trace(ets / f"rank{r}.json", with_mm=False)
        write(kin / f"worker{r}.json", rank_kineto(2 + r, 80 - 10 * r))
    # T1 10, T2 1, T3 2, T5 0.5, no call 3, T4 5 per launch; no call counts of its own
    host = HostOverheads(10.0, {LAUNCH: 5.0}, {}, {"t2_us": 1.0, "t3_us": 2.0, "t5_us": 0.5, "no_call_us": 3.0})
    cal = tmp_path / "host.json"
    cal.write_text(json.dumps(host_overheads_only(host)))
    base = ["predict", "--et", str(ets), "--system", "v100-p3.16xlarge", "--calibration", str(cal)]
    res = CliRunner().invoke(app, [*base, "--kineto", str(kin), "--measured-starts", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{") :])
    # rank 0's NCCL kernel ends 80 µs after its step start, rank 1's 70: rank 1 started 10 µs later
    assert out["measured_starts_s"] == pytest.approx([0.0, 10e-6])
    assert "leave one rank out" in out["runtime_calls"]
    # rank 0, its TBE charged rank 1's 3 launches: T1 10 + T2 1 + 3 × T4 5 + 2 × T5 0.5 + T3 2 = 29; the
    # all-reduce and the add, 1 launch each: 10 + 1 + 5 + 2 = 18 each → 65 µs. Rank 1, rank 0's 2 launches:
    # 10 + 1 + 2 × 5 + 0.5 + 2 = 23.5, + 18 + 18 = 59.5 µs
    assert [r["host_s"] for r in out["ranks"]] == pytest.approx([65e-6, 59.5e-6])
    assert [r["default_call_ops"] for r in out["ranks"]] == [{}, {}]
    res = CliRunner().invoke(app, [*base, "--measured-starts"])
    assert res.exit_code == 2 and "--measured-starts" in res.output and "--kineto" in res.output
    assert "Traceback" not in res.output


def test_launches_walked_beyond_the_counted_calls_cost_no_more_host_time(tmp_path):
    # a composite operator (priced through its children) counted at 1 launch elsewhere, whose two muls
    # the walk launches: T1 10 µs, T2 1, T3 2, T5 0.5, T4 5 per launch
    counted = {"aten::my_composite": {LAUNCH: 1.0}}
    host = HostOverheads(10.0, {LAUNCH: 5.0}, {}, {"t2_us": 1.0, "t3_us": 2.0, "t5_us": 0.5, "no_call_us": 3.0})
    root = {"name": THREAD, "id": 1, "rf_id": 0, "parent": 1, "tid": 1, "inputs": [], "input_shapes": []}
    args, out = [t(1, 1, [1000]), t(2, 2, [1000])], [t(3, 3, [1000])]
    nodes = [root, node(4, "aten::my_composite", args, out)]
    nodes += [{**node(i, "aten::mul", args, out), "parent": 4} for i in (5, 6)]
    (tmp_path / "et.json").write_text(json.dumps({"schema": "1.0.1", "nodes": nodes}))
    et = read_execution_trace(tmp_path / "et.json")
    (s,) = predict_step([et], [ETPricer(LinearCosts())], replace(host, calls_per_op=counted), GroupPlacement(1, 1, 1))  # type: ignore[arg-type]
    # its one counted call, T2 1 + T4 5, issues the first mul at 10 + 6 = 16 µs; the second is issued at
    # no cost at 16 too; T3 2 → host 18 µs. The muls (12,000 B each) run 16–28 and 28–40
    assert s.host_s == pytest.approx(18e-6) and s.iteration_s == pytest.approx(40e-6)
    # one call per launch walked: 10 + (1 + 5) + (0.5 + 5) + 2 = 23.5 µs of host
    (d,) = predict_step([et], [ETPricer(LinearCosts())], host, GroupPlacement(1, 1, 1))  # type: ignore[arg-type]
    assert d.host_s == pytest.approx(23.5e-6) and d.default_calls == {"aten::my_composite": 1}
