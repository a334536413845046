"""Host overheads T1–T5 from Kineto traces, cross-thread waits and blocking copies in the replay
graph, and host overheads as a replay what-if. Every expected value is worked out by hand from the
hand-written traces below (times in µs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kineto_fixtures import call, cpu_op, kernel, step, write
from typer.testing import CliRunner

from itercast.cli import app
from itercast.profile.calibrate import CalibrationError, load_calibration
from itercast.replay import replay, replay_whatif
from itercast.traces.host_overheads import HostOverheadError, HostOverheads, measure
from itercast.traces.kineto import read_traces
from itercast.traces.whatif import WhatIf

LAUNCH = "cudaLaunchKernel"
BACKWARD = 200  # the autograd thread


def two_thread_step() -> list[dict]:
    """Step [0, 200]. Main thread: linear 10–40 (calls 15–20, 25–28), view 45–50 (no call), relu
    52–70 (call 60–64), ones_like 72–75 (call 73–74), then idle while the autograd thread runs
    MmBackward0 80–170 (calls 90–95, 150–155), then _foreach_mul_ 180–190 (call 182–186)."""
    return [
        step(1, 0, 200),
        cpu_op("aten::linear", 10, 30),
        call(LAUNCH, 15, 5, corr=1),
        kernel("volta_sgemm_128x64", 22, 5, corr=1),
        call(LAUNCH, 25, 3),
        cpu_op("aten::view", 45, 5),
        cpu_op("aten::relu", 52, 18),
        call(LAUNCH, 60, 4),
        cpu_op("aten::ones_like", 72, 3),
        call(LAUNCH, 73, 1),
        cpu_op("autograd::engine::evaluate_function: MmBackward0", 80, 90, tid=BACKWARD),
        call(LAUNCH, 90, 5, tid=BACKWARD),
        call(LAUNCH, 150, 5, tid=BACKWARD),
        cpu_op("aten::_foreach_mul_", 180, 10),
        call(LAUNCH, 182, 4),
    ]


def test_t1_to_t5_by_hand(tmp_path):
    o = measure(read_traces([write(tmp_path / "t.json", two_thread_step())]))
    # T1: 40→45, 50→52, 70→72; the 75→180 stretch is a wait (MmBackward0 covers 90 of its 105 µs)
    assert o.t1_us == pytest.approx(3.0)
    assert o.samples["t1"] == 3
    assert o.per_op["aten::linear"] == pytest.approx({"t2_us": 5.0, "t3_us": 12.0, "t5_us": 5.0})
    assert o.per_op["aten::relu"] == pytest.approx({"t2_us": 8.0, "t3_us": 6.0})
    assert o.per_op["aten::view"] == pytest.approx({"no_call_us": 5.0})
    assert o.per_op["autograd::engine::evaluate_function: MmBackward0"] == pytest.approx(
        {"t2_us": 10.0, "t3_us": 15.0, "t5_us": 55.0}
    )
    assert o.t4_us[LAUNCH] == pytest.approx((5 + 3 + 4 + 1 + 5 + 5 + 4) / 7)
    # pooled: medians over all operators' samples (T2 5, 8, 1, 10, 2; T3 12, 6, 1, 15, 4; T5 5, 55)
    assert o.pooled == pytest.approx({"t2_us": 5.0, "t3_us": 6.0, "t5_us": 30.0, "no_call_us": 5.0})
    assert o.op_us("t2_us", "never seen") == 5.0


def test_steps_choose_the_operators(tmp_path):
    events = two_thread_step() + [e | {"ts": e["ts"] + 1000} for e in two_thread_step()]
    events[len(events) // 2] = step(2, 1000, 200)
    traces = read_traces([write(tmp_path / "t.json", events)])
    assert measure(traces, {2}).samples["t1"] == 3  # only step 2's gaps
    # both steps: also the gaps between them, main 190→1010 and autograd 170→1080 (main's operators
    # cover only 66 of those 910 µs: no wait), which the replay prices as T1 too
    assert measure(traces).samples["t1"] == 8
    assert measure(traces).t1_us == pytest.approx((2 * (5 + 2 + 2) + 820 + 910) / 8)
    with pytest.raises(HostOverheadError, match="nothing to measure"):
        measure(traces, {7})


def test_replay_waits_for_the_other_thread_and_prices_the_host(tmp_path):
    path = write(tmp_path / "t.json", two_thread_step())
    assert replay([path]).steps[0].replayed_s == pytest.approx(200e-6)
    # two waits: the main thread's for backward (75→180) and the autograd thread's first operator at
    # 80, after main's operators covered 56 of the 70 µs since the first operator (10): its first call
    # (90) waits for main's call ending at 74, 16 µs after it, not for a gap pinned at the trace's start
    assert replay([path]).replay_graph.notes["host threads waiting for another thread"] == 2
    model = measure(read_traces([path]))
    _, changed, counts = replay_whatif([path], WhatIf(host=model))
    # main: 15 (before its first call: kept) + 4 calls of T4 = 27/7 + gaps T5 5, T3+T1+view+T1+T2 =
    # 12+3+5+3+8 = 31, T3+T1+T2 = 6+3+1 = 10 → the autograd thread 16 µs after main's 4th call (kept),
    # 27/7 + T5 55 + 27/7 → main 27 µs after its call (kept), _foreach_mul_'s call 27/7 and the 14 µs tail
    assert changed.steps[0].replayed_s == pytest.approx((15 + 5 + 31 + 10 + 16 + 55 + 27 + 14 + 7 * 27 / 7) * 1e-6)
    assert counts["runtime calls from T4"] == 7
    # halve every overhead (no per-operator figures: the pooled ones, halved): main 15 + T5 15 + 3+1.5+
    # 2.5+1.5+2.5 + 3+1.5+2.5 and 4 calls of 27/14; then autograd 16 + T5 15, main 27 + 14, 7 calls in all.
    # Before the autograd thread waited for main it started at 90 whatever main did: 151.8 µs
    half = HostOverheads(
        model.t1_us / 2, {LAUNCH: model.t4_us[LAUNCH] / 2}, {}, {k: v / 2 for k, v in model.pooled.items()}
    )
    _, changed, _ = replay_whatif([path], WhatIf(host=half))
    assert changed.steps[0].replayed_s == pytest.approx((15 + 15 + 11 + 7 + 16 + 15 + 27 + 14 + 7 * 27 / 14) * 1e-6)


def test_a_what_if_before_backward_moves_the_autograd_threads_start(tmp_path):
    """Step [0, 110]. Main: mm 2–55 launches a GEMM (call 5–8, kernel 10–50) and synchronises 12–52;
    the autograd thread's first operator 60–98 calls 70–75; main's _foreach_mul_ 100–106 calls 101–103.
    With GEMMs twice as fast the kernel runs 10–30, the sync ends at 30 + its own 2 µs; the autograd
    thread's call 18 µs after it (50–55, measured 52 → 70), main's 26 µs after that (81–83, measured
    75 → 101) and its 7 µs tail: 90 µs. Before the autograd thread waited for main's forward, its first
    gap ran from the trace's start and pinned its call at 70: the step stayed at 110."""
    path = write(
        tmp_path / "t.json",
        [
            step(1, 0, 110),
            cpu_op("aten::mm", 2, 53),
            call(LAUNCH, 5, 3, corr=1),
            kernel("volta_sgemm_128x64", 10, 40, corr=1),
            call("cudaDeviceSynchronize", 12, 40),
            cpu_op("autograd::engine::evaluate_function: MmBackward0", 60, 38, tid=BACKWARD),
            call(LAUNCH, 70, 5, tid=BACKWARD),
            cpu_op("aten::_foreach_mul_", 100, 6),
            call(LAUNCH, 101, 2),
        ],
    )
    base, changed, _ = replay_whatif([path], WhatIf(scale={"gemm": 0.5}))
    assert base.steps[0].replayed_s == pytest.approx(110e-6)
    assert changed.steps[0].replayed_s == pytest.approx((30 + 2 + 18 + 5 + 26 + 2 + 7) * 1e-6)


def test_copy_to_pageable_memory_waits_for_the_gpu(tmp_path):
    """Step [0, 80]: GEMM 12–40 launched at 5; cudaMemcpyAsync 10–60 copies to pageable memory
    40–58, so the call returns at 60. With GEMMs twice as fast the copy runs 26–44 and the step
    ends 14 µs sooner (CUDA: an async copy to pageable host memory is synchronous)."""
    path = write(
        tmp_path / "t.json",
        [
            step(1, 0, 80),
            cpu_op("aten::mm", 4, 5),
            call(LAUNCH, 5, 3, corr=1),
            kernel("volta_sgemm_128x64", 12, 28, corr=1),
            cpu_op("aten::copy_", 9, 52),
            call("cudaMemcpyAsync", 10, 50, corr=2),
            {
                "ph": "X",
                "cat": "gpu_memcpy",
                "name": "Memcpy DtoH (Device -> Pageable)",
                "pid": 0,
                "tid": 7,
                "ts": 40,
                "dur": 18,
                "args": {"correlation": 2, "stream": 7},
            },
        ],
    )
    base, faster, _ = replay_whatif([path], WhatIf({"gemm": 0.5}))
    assert base.steps[0].replayed_s == pytest.approx(80e-6)
    assert faster.steps[0].replayed_s == pytest.approx(66e-6)
    assert measure(read_traces([path])).t4_us == {LAUNCH: 3.0}  # the blocking copy is not a T4 sample


def test_calibration_file_carries_host_overheads(tmp_path):
    path = write(tmp_path / "t.json", two_thread_step())
    cal = tmp_path / "cal.json"
    runner = CliRunner()
    res = runner.invoke(app, ["calibrate", "--host-trace", str(path), "--out", str(cal)])
    assert res.exit_code == 0, res.output
    assert HostOverheads.from_dict(load_calibration(cal)["host_overheads"]).t1_us == pytest.approx(3.0)
    res = runner.invoke(app, ["replay", str(path), "--calibration", str(cal), "--json"])
    assert res.exit_code == 0, res.output
    # as the same overheads measured in place (test_replay_waits_for_the_other_thread_and_prices_the_host)
    by_hand = (15 + 5 + 31 + 10 + 16 + 55 + 27 + 14 + 7 * 27 / 7) * 1e-6
    assert json.loads(res.output)["steps"][0]["whatif_s"] == pytest.approx(by_hand)
    doc = json.loads(cal.read_text())
    doc["host_overheads"]["t1_us"] = -1
    cal.write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match=r"host_overheads\.t1_us: expected a finite number ≥ 0 \(µs\), got -1"):
        load_calibration(cal)
    res = runner.invoke(app, ["calibrate"])
    assert res.exit_code != 0 and "give a profiling database, or --host-trace" in res.output
    res = runner.invoke(app, ["calibrate", "--host-trace", str(path), "--host-steps", "x"])
    assert res.exit_code != 0 and "--host-steps" in res.output


def test_a_host_calibration_names_the_gpu_its_traces_ran_and_warns_on_another(tmp_path):
    """User probe 9: host overheads measured on a CPU (gloo) run priced an H100 trace at 187 ms for 8 ms, and no
    warning said so: the file named no machine. It now records the traces' GPU (deviceProperties), or that
    they ran none, and a job on another kind of GPU is warned; the GPU's own is not. The fixture traces name no
    GPU; one naming an A100 records it."""
    plain = write(tmp_path / "cpu.json", two_thread_step())
    a100 = write(tmp_path / "a100.json", two_thread_step(), deviceProperties=[{"name": "NVIDIA A100-SXM4-80GB"}])
    runner = CliRunner()
    for trace, device in ((plain, "cpu"), (a100, "NVIDIA A100-SXM4-80GB")):
        cal = tmp_path / f"{trace.stem}.cal.json"
        res = runner.invoke(app, ["calibrate", "--host-trace", str(trace), "--out", str(cal)])
        assert res.exit_code == 0 and res.output.rstrip().endswith(f"wrote {cal}: host_overheads"), res.output
        assert json.loads(cal.read_text())["host_device"] == device
    args = ["predict", "--model", "gpt3-1.3b", "--set", "plan.global_batch_size=8", "--calibration"]
    cpu_on_h100 = runner.invoke(app, [*args, str(tmp_path / "cpu.cal.json"), "--system", "dgx-h100"])
    said = " ".join(cpu_on_h100.output.split())
    assert "host overheads were measured on traces that ran no GPU; this job runs on H100-SXM5-80GB" in said
    a100_on_h100 = runner.invoke(app, [*args, str(tmp_path / "a100.cal.json"), "--system", "dgx-h100"])
    assert "measured on traces of NVIDIA A100-SXM4-80GB; this job runs on H100" in " ".join(a100_on_h100.output.split())
    own = runner.invoke(app, [*args, str(tmp_path / "a100.cal.json"), "--system", "dgx-a100"])
    assert own.exit_code == 0 and "host overheads were measured" not in own.output
    # a host-only file prices no curve of its own: predict --et names the built-in ones ('analytic'), not the file's
    et = Path(__file__).resolve().parents[1] / "data" / "measured" / "h100_traces" / "gpt_8.et.json.gz"
    priced = runner.invoke(app, ["predict", "--et", str(et), "--system", "dgx-h100", "--calibration", str(cal)])
    assert priced.exit_code == 0 and f"(analytic; host overheads: {cal})" in " ".join(priced.output.split())
