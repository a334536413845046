"""Parallelism what-ifs on a trace: gloo collectives replayed (launch, rendezvous, the thread's wait),
`--dp N` re-times gradient reductions by the collective model's ratio (by hand: an alpha-beta fit,
ring bus factor 2(n−1)/n), `--dp 1` drops them and their rendezvous; `--pp-stages` on a trace
without pipeline sends, `--dp` on a trace without gradient reductions: one line, exit 2."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from kineto_fixtures import call, cpu_op, fp32_all_reduce_comms, kernel, step, write
from typer.testing import CliRunner

from itercast.cli import app
from itercast.costs.curves import curves
from itercast.replay import replay, replay_whatif
from itercast.traces.whatif import WhatIf

WHOLE = (
    "unmatched collectives re-timed whole: the wait for peers their measured time holds re-timed as transfer "
    "(load every rank's trace to tell them apart)"
)

RUN = CliRunner()
ELEMENTS = 3_125_000  # fp32: 12.5e6 bytes
ALPHA_S = 1e-3
# A plain alpha-beta fit: eff = e_max / (1 + exp(gamma (log_half − ln x))) = 2 / (1 + e^0) = 1 at gamma 0
ALPHA_BETA = {"alpha0_s": ALPHA_S, "e_max": 2.0, "log_half": 0.0, "gamma": 0.0}


def alpha_beta(section: str) -> dict:
    """The built-in curves with the all-reduce of `section` replaced by ALPHA_BETA."""
    fits = copy.deepcopy(curves())
    fits["collectives"].setdefault(section, {})["all_reduce"] = dict(ALPHA_BETA)
    return fits


def gloo_rank(tmp_path, rank: int, mm_us: float = 1000.0, dims: bool = True) -> str:
    """Step 0–(mm + 2,300) µs on thread 100: backward (aten::mm) until mm_us, c10d::allreduce_ for
    10 µs launching a 12.5 MB all-reduce that gloo thread 200 runs from 5 µs after the launch for
    2,000 µs; the thread idles until it resumes (5 µs after the end), copies the bucket (100 µs),
    steps the optimizer (90 µs) and ends the step 100 µs later."""
    launch = cpu_op("c10d::allreduce_", mm_us, 10)
    launch["args"] = {"Input Dims": [[[ELEMENTS]], [], []]} if dims else {}
    gloo = {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 100, "tid": 200}
    gloo |= {"ts": mm_us + 5, "dur": 2000.0}
    events = [
        step(1, 0, mm_us + 2300),
        cpu_op("aten::mm", 0, mm_us),
        launch,
        gloo,
        cpu_op("torch.distributed.ddp.reducer::copy_bucket_to_grad", mm_us + 2010, 100),
        cpu_op("aten::add_", mm_us + 2110, 90),
    ]
    info = {"rank": rank, "world_size": 2, "backend": "gloo"}
    return str(write(tmp_path / f"r{rank}.json", events, distributedInfo=info))


def test_a_gloo_all_reduce_replays_exactly_and_matches_the_ranks(tmp_path):
    result = replay([gloo_rank(tmp_path, 0), gloo_rank(tmp_path, 1)])
    assert [s.replayed_s for s in result.steps] == pytest.approx([3300e-6, 3300e-6])
    assert result.to_dict()["matched_ranks"] == [0, 1]
    assert result.replay_graph.notes["CPU collectives matched across ranks"] == 1
    (size,) = {m["nbytes"] for m in result.replay_graph.cpu_comm.values()}
    assert size == ELEMENTS * 4  # fp32


def test_dp_4_retimes_the_all_reduce_by_the_ring_bus_factor_ratio(tmp_path):
    # cpu-host: 1 "GPU" a node, so a group of n is n nodes over one 1.25e9 B/s NIC each (systems.yaml);
    # bus bytes = 2(n−1)/n × 12.5e6: n = 2 → 12.5e6, n = 4 → 18.75e6
    t2_s = ALPHA_S + 12.5e6 * (2 * (2 - 1) / 2) / 1.25e9  # 0.011 s
    t4_s = ALPHA_S + 12.5e6 * (2 * (4 - 1) / 4) / 1.25e9  # 0.016 s
    # both above the latency floor 2 × ⌈log2 n⌉ × 50 µs (100 and 200 µs)
    paths = [gloo_rank(tmp_path, 0), gloo_rank(tmp_path, 1)]
    _, moved, counts = replay_whatif(paths, WhatIf(dp=4, curves=alpha_beta("inter_node")))
    assert counts == {"gradient all_reduce re-timed from data-parallel 2 to 4 on cpu-host's model": 2}
    # the 2,000 µs transfer × 16/11; the thread resumes 5 µs after it and runs 290 µs more
    expected_s = 1005e-6 + 2000e-6 * t4_s / t2_s + 5e-6 + 290e-6
    assert expected_s == pytest.approx(4209.0909e-6)
    assert [s.replayed_s for s in moved.steps] == pytest.approx([expected_s, expected_s])


def test_a_gloo_all_reduce_without_input_dims_is_sized_from_its_time_and_flagged(tmp_path):
    paths = [gloo_rank(tmp_path, 0, dims=False), gloo_rank(tmp_path, 1, dims=False)]
    _, _, counts = replay_whatif(paths, WhatIf(dp=4))
    assert counts == {"gradient all_reduce re-timed from data-parallel 2 to 4 on cpu-host's model (size inferred)": 2}


def test_dp_1_drops_the_reductions_and_their_rendezvous(tmp_path):
    # rank 1 computes 500 µs longer: measured, rank 0's all-reduce waits for it; alone, it does not
    paths = [gloo_rank(tmp_path, 0), gloo_rank(tmp_path, 1, mm_us=1500.0)]
    _, alone, _ = replay_whatif(paths, WhatIf(dp=1))
    # rank 0: mm 1,000 + c10d 10, the 5 µs after the (now empty) all-reduce, 290 µs to the step's end
    assert alone.steps[0].replayed_s == pytest.approx((1000 + 10 + 5 + 290) * 1e-6)
    assert alone.steps[1].replayed_s == pytest.approx((1500 + 10 + 5 + 290) * 1e-6)


def test_dp_on_an_nccl_all_reduce_with_sizes_from_record_param_comms(tmp_path):
    # V100 node: 8 GPUs on the p3.16xlarge's cube mesh of 25e9 B/s links (systems.yaml), so 2 GPUs share 1 link
    # (GPUs 0 and 1) and 4 have 4 (GPU 0's to 1, 2 and 3: 1 + 1 + 2); 1.5e8 bytes:
    # t(2) = 1e-3 + 1.5e8 × 1 / 25e9 = 7e-3 s, t(4) = 1e-3 + 1.5e8 × 1.5 / 100e9 = 3.25e-3 s
    comms = fp32_all_reduce_comms(5, 20, 37_500_000, 2)
    events = [
        step(1, 0, 90),
        comms,
        call("cudaLaunchKernel", 10, 1, corr=1),
        kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 20, 50, corr=1),
        call("cudaDeviceSynchronize", 15, 60),
    ]
    top = {"distributedInfo": {"rank": 0, "world_size": 2}, "deviceProperties": [{"name": "Tesla V100-SXM2-32GB"}]}
    path = write(tmp_path / "t.json", events, **top)
    _, moved, counts = replay_whatif([path], WhatIf(dp=4, curves=alpha_beta("intra_node")))
    # one rank alone: its all-reduce's measured time, any wait for its peer in it, re-timed whole (said)
    assert counts == {"gradient all_reduce re-timed from data-parallel 2 to 4 on v100-p3.16xlarge's model": 1, WHOLE: 1}
    # the kernel from 20 µs for 50 µs × 3.25/7, then the sync's 5 µs and the host's 15 µs
    assert moved.steps[0].replayed_s == pytest.approx((20 + 50 * 3.25e-3 / 7e-3 + 5 + 15) * 1e-6)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pp-stages", "2"], "--pp-stages: the traces hold no pipeline sends"),
        (["--dp", "0"], "--dp: expected a data-parallel size ≥ 1; got 0"),
        (["--dp", "4", "--world-size", "4", "--system", "cpu-host"], "give one"),
        # a group of 0 or fewer GPUs was once taken as "the trace's own group" (0 is falsy) or priced
        (["--world-size", "0", "--system", "cpu-host"], "--world-size: expected a data-parallel group size ≥ 1; got 0"),
        (["--world-size", "-3", "--system", "cpu-host"], "got -3"),
        # a class given twice was once the last one given, in silence
        (["--scale", "gemm=2", "--drop", "gemm"], "expected one factor per kernel class; got 'gemm' twice, factors 2"),
        (["--scale", "gemm=2", "--scale", "gemm=0.5"], "factors 2 and 0.5"),
        # both once counted the same collectives, re-timed and dropped
        (["--dp", "4", "--drop", "nccl"], "--drop nccl removes the collectives --dp re-times; give one of them"),
        (["--system", "cpu-host", "--drop", "nccl"], "the collectives --system re-times"),
    ],
)
def test_a_parallelism_whatif_the_trace_cannot_support_is_one_line_exit_2(tmp_path, args, message):
    out = RUN.invoke(app, ["replay", gloo_rank(tmp_path, 0), gloo_rank(tmp_path, 1), *args])
    assert out.exit_code == 2, out.output
    assert out.output.count("\n") == 1 and message in out.output and "Traceback" not in out.output


def test_dp_on_a_trace_without_gradient_reductions_is_one_line_exit_2(tmp_path):
    path = write(tmp_path / "t.json", [step(1, 0, 50), cpu_op("aten::mm", 1, 40)])
    out = RUN.invoke(app, ["replay", str(path), "--dp", "2"])
    assert out.exit_code == 2
    assert out.output.count("\n") == 1 and "--dp: the traces hold no gradient reduction" in out.output


def test_cli_dp_prints_the_retimed_reductions_and_the_matched_ranks(tmp_path):
    out = RUN.invoke(app, ["replay", gloo_rank(tmp_path, 0), gloo_rank(tmp_path, 1), "--dp", "4"])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "ranks loaded: 0, 1; collectives matched across ranks 0, 1" in text
    assert "re-timed 2 of 2 collectives" in text and "host-bound" not in text


GLOO = Path(__file__).resolve().parents[1] / "data" / "measured" / "gloo_parallelism"


@pytest.mark.skipif(not GLOO.is_dir(), reason="data/measured/gloo_parallelism absent")
def test_measured_gloo_ddp_traces_replay_every_step_and_match_every_rank():
    # real PyTorch DDP runs over gloo (tools/measure_gloo_parallelism.py): 2 buckets a step
    paths = sorted(GLOO.glob("ws2.rank*.trace.json.gz"))
    base, same, _ = replay_whatif(paths, WhatIf(dp=2))
    assert max(abs(s.error) for s in base.steps) < 1e-3
    assert base.to_dict()["matched_ranks"] == [0, 1]
    assert len(base.replay_graph.cpu_comm) == 2 * 6 * 2  # ranks × steps × buckets
    assert [s.replayed_s for s in same.steps] == pytest.approx([s.replayed_s for s in base.steps])


def test_a_rank_that_resumed_before_its_peer_arrived_did_not_wait_for_the_collective(tmp_path):
    # Rank 1's c10d::broadcast_ runs 100–1,500 µs (the OS took its core: data/measured-like noise)
    # while its gloo thread receives 200–2,100; the root, rank 0, only starts sending at 2,015. The
    # thread resumed at 1,500, before the last peer arrived, so it cannot have waited for the data:
    # replay keeps its measured 3,000 µs instead of holding it until the root's 2,015 (3,515 µs).
    info = {"world_size": 2, "backend": "gloo"}
    gloo = {"ph": "X", "cat": "user_annotation", "name": "gloo:broadcast", "pid": 100, "tid": 200}
    root = [
        step(1, 0, 3000),
        cpu_op("aten::mm", 0, 2000),
        cpu_op("c10d::broadcast_", 2000, 10),
        gloo | {"ts": 2015, "dur": 35},
        cpu_op("aten::add_", 2060, 940),
    ]
    receiver = [
        step(1, 0, 3000),
        cpu_op("c10d::broadcast_", 100, 1400),
        gloo | {"ts": 200, "dur": 1900},
        cpu_op("aten::mm", 1500, 1500),
    ]
    paths = [
        str(write(tmp_path / "r0.json", root, distributedInfo=info | {"rank": 0})),
        str(write(tmp_path / "r1.json", receiver, distributedInfo=info | {"rank": 1})),
    ]
    result = replay(paths)
    assert result.to_dict()["matched_ranks"] == [0, 1]
    assert [s.replayed_s for s in result.steps] == pytest.approx([3000e-6, 3000e-6])
    note = "CPU collectives done for a rank before its last peer arrived (not waited for)"
    assert result.replay_graph.notes[note] == 1


def test_dp_retimes_only_the_reductions_over_the_whole_world(tmp_path):
    # World of 4 V100s (one 8-GPU p3.16xlarge: GPUs 0–3 on 4 of their 25e9 B/s links, all 8 on 6). Two
    # all-reduces of 1.5e8 B on one stream: over all 4 ranks (the gradient reduction) 20–70 µs, then over a group
    # of 2 (a sub-group: not data parallelism) 70–110 µs, queued behind it. The sync 15–115 waits for it, 5 µs
    # own; host 85 → 200. --dp 8: t(4) = 1e-3 + 1.5e8 × 2·3/4 / 100e9 = 3.25e-3 s, t(8) = 1e-3 + 1.5e8 × 2·7/8
    # / 150e9 = 2.75e-3 s: the first × 11/13 = 42.3 µs (20–62.3); the sub-group's kept at 40 µs; sync 5, +85
    def all_reduce(ts: float, dur: float, corr: int, group: int) -> dict:
        meta = {"Collective name": "allreduce", "In msg nelems": 37_500_000, "dtype": "Float", "Group size": group}
        return kernel("ncclKernel_AllReduce_RING_LL_Sum_float", ts, dur, corr, **meta)

    events = [
        step(1, 0, 200),
        call("cudaLaunchKernel", 10, 1, corr=1),
        call("cudaLaunchKernel", 12, 1, corr=2),
        all_reduce(20, 50, 1, group=4),
        all_reduce(70, 40, 2, group=2),
        call("cudaDeviceSynchronize", 15, 100),
    ]
    top = {"distributedInfo": {"rank": 0, "world_size": 4}, "deviceProperties": [{"name": "Tesla V100-SXM2-32GB"}]}
    path = write(tmp_path / "t.json", events, **top)
    _, moved, counts = replay_whatif([path], WhatIf(dp=8, curves=alpha_beta("intra_node")))
    assert counts == {
        "gradient all_reduce re-timed from data-parallel 4 to 8 on v100-p3.16xlarge's model": 1,
        "collectives kept at measured time (not a gradient reduction over the whole world)": 1,
        WHOLE: 1,
    }
    assert moved.steps[0].replayed_s == pytest.approx((20 + 50 * 2.75e-3 / 3.25e-3 + 40 + 5 + 85) * 1e-6)
