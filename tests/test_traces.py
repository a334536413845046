"""Kineto import, replay semantics and what-ifs on hand-written traces with hand-computed times."""

from __future__ import annotations

import pytest
from kineto_fixtures import call, cpu_op, fp32_all_reduce_comms, gpu_bound_step, kernel, step, write

from itercast.config.job import Job
from itercast.costs.analytic import AnalyticCostModel
from itercast.errors import ConfigError
from itercast.hardware.topology import GroupPlacement
from itercast.replay import replay, replay_whatif
from itercast.traces.kineto import TraceError, read_kineto, read_traces
from itercast.traces.whatif import WhatIf, kernel_class


def test_import_keeps_calls_ops_steps_and_counts_the_rest(tmp_path):
    t = read_kineto(write(tmp_path / "t.json", gpu_bound_step(), distributedInfo={"rank": 3, "world_size": 8}))
    assert (t.rank, t.world_size, len(t.call_ts_us), t.num_ops, t.steps) == (3, 8, 2, 1, [(1, 100, 0.0, 100.0)])
    assert dict(t.ignored) == {} and t.names[t.cpu_name[0]] == "aten::mm" and t.cpu_rf_id.tolist() == [-1]


def test_events_not_used_are_counted_by_reason(tmp_path):
    extra = [
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 100, "tid": 100, "ts": 10},
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}},
        {"ph": "i", "name": "marker", "pid": 0, "tid": 0, "ts": 3},
    ]
    t = read_kineto(write(tmp_path / "t.json", gpu_bound_step() + extra))
    assert dict(t.ignored) == {
        "flow event (launch links come from correlation ids)": 1,
        "metadata": 1,
        "other (i, None)": 1,
    }
    assert t.num_events == len(gpu_bound_step()) + 3


def test_replay_json_and_timeline_carry_rendezvous_and_critical_path(tmp_path):
    from itercast.traces.perfetto import to_chrome_trace

    meta = {
        "Collective name": "allreduce",
        "In msg nelems": 16,
        "Out msg nelems": 16,
        "Group size": 2,
        "dtype": "Float",
        "Process Group Ranks": "[0, 1]",
    }
    paths = []
    for rank, start in ((0, 10), (1, 20)):
        events = [
            step(1, 0, 60),
            call("cudaLaunchKernel", start - 5, 2, corr=1),
            kernel("ncclKernel_AllReduce", start, 40 - start, corr=1, **meta),
            call("cudaDeviceSynchronize", 30, 15),
        ]
        paths.append(write(tmp_path / f"r{rank}.json", events, distributedInfo={"rank": rank, "world_size": 2}))
    res = replay(paths)
    flows = [e for e in to_chrome_trace(res.sim)["traceEvents"] if e.get("cat") == "collective"]
    assert len(flows) == 2 and {e["pid"] for e in flows} == {0, 1}  # one start, one finish: rank 0 → rank 1
    out = res.to_dict()
    assert out["critical_path"][-1]["end_s"] == pytest.approx(res.sim.step_time_s)


def test_relative_timestamps_with_base_time_equal_absolute_ones(tmp_path):
    absolute = [dict(e, ts=e["ts"] + 5_000_000) for e in gpu_bound_step()]
    a = read_kineto(write(tmp_path / "a.json", absolute))
    r = read_kineto(write(tmp_path / "r.json.gz", gpu_bound_step(), gz=True, baseTimeNanoseconds=5_000_000_000))
    assert a.op_ts_us.tolist() == r.op_ts_us.tolist() and a.steps == r.steps


def test_replay_of_a_gpu_bound_step_reproduces_the_measurement(tmp_path):
    r = replay([write(tmp_path / "t.json", gpu_bound_step())])
    assert [s.replayed_s for s in r.steps] == pytest.approx([100e-6], abs=1e-12)


def test_halving_the_gemm_shortens_the_synchronised_step(tmp_path):
    # GEMM 20–45; the sync starts at 30, waits until 45, then its own 5 µs; CPU gap of 25 µs → 75.
    _, whatif, changes = replay_whatif([write(tmp_path / "t.json", gpu_bound_step())], WhatIf({"gemm": 0.5}))
    assert whatif.steps[0].replayed_s == pytest.approx(75e-6, abs=1e-12)
    assert changes == {"scaled gemm": 1}


def test_inferred_stream_wait_moves_with_its_producer(tmp_path):
    events = [
        step(1, 0, 200),
        call("cudaLaunchKernel", 10, 2, corr=1),
        kernel("conv_fwd", 12, 50, corr=1, stream=7),
        call("cudaStreamWaitEvent", 20, 1),
        call("cudaLaunchKernel", 25, 2, corr=2),
        kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 62, 10, corr=2, stream=9),
        call("cudaDeviceSynchronize", 30, 45),
    ]
    base, half, _ = replay_whatif([write(tmp_path / "t.json", events)], WhatIf({"conv": 0.5}))
    g, sim = half.sim.graph, half.sim
    nccl = next(t for t in range(g.num_tasks) if g.names[g.name[t]].startswith("ncclKernel"))
    assert sim.start_s[nccl] == pytest.approx(37e-6)  # conv now ends at 12 + 25 = 37
    assert base.steps[0].replayed_s == pytest.approx(200e-6)


def test_two_rank_collective_waits_for_the_late_rank(tmp_path):
    meta = {
        "Collective name": "allreduce",
        "In msg nelems": 1 << 20,
        "Out msg nelems": 1 << 20,
        "Group size": 2,
        "dtype": "Float",
        "Process Group Ranks": "[0, 1]",
    }
    name = "ncclKernel_AllReduce_RING_LL_Sum_float"
    r0 = [
        step(1, 0, 100),
        call("cudaLaunchKernel", 5, 2, corr=1),
        kernel(name, 10, 30, corr=1, **meta),
        call("cudaDeviceSynchronize", 20, 25),
    ]  # rank 0 waited 25 µs inside its kernel for rank 1
    r1 = [
        step(1, 0, 100),
        call("cudaLaunchKernel", 30, 2, corr=1),
        kernel(name, 35, 5, corr=1, **meta),
        call("cudaDeviceSynchronize", 38, 7),
    ]
    paths = [
        write(tmp_path / "r0.json", r0, distributedInfo={"rank": 0, "world_size": 2}),
        write(tmp_path / "r1.json", r1, distributedInfo={"rank": 1, "world_size": 2}),
    ]
    res = replay(paths)
    g, sim = res.sim.graph, res.sim
    members = [t for t in range(g.num_tasks) if g.names[g.name[t]] == name]
    assert sim.start_s[members].tolist() == pytest.approx([35e-6, 35e-6]) and sim.end_s[
        members
    ].tolist() == pytest.approx([40e-6, 40e-6])
    assert res.replay_graph.notes["NCCL collectives matched across ranks"] == 1
    # re-timed on a DGX H100 (4 MiB fp32 all-reduce of 2 GPUs in one node) with the collective model:
    _, moved, changes = replay_whatif(paths, WhatIf(system="dgx-h100"))
    assert changes["re-timed all_reduce on dgx-h100"] == 2
    model = AnalyticCostModel(Job.from_presets("gpt3-1.3b", "dgx-h100").system, "bf16")
    expected = model.collective_s("all_reduce", 4.0 * (1 << 20), GroupPlacement(2, 1, 2))
    assert moved.sim.graph.duration_s[members].tolist() == pytest.approx([expected, expected])


def test_kernel_classes():
    assert [
        kernel_class(n)
        for n in (
            "volta_sgemm_128x64_nn",
            "ncclKernel_AllReduce",
            "cudnn::conv_fwd",
            "void at::native::vectorized_elementwise_kernel<4>",
            "flash_fwd_kernel",
        )
    ] == ["gemm", "nccl", "conv", "elementwise", "attention"]
    assert kernel_class("Memcpy HtoD", "memcpy") == "memcpy"
    # kernel names of the shared A100 CNN and V100 DLRM traces that the first match once misclassed:
    # implicit-GEMM convolutions, cuDNN's batch norms and layout transposes, fbgemm_gpu's permutes
    assert [
        kernel_class(n)
        for n in (
            "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize256x64x32",
            "void cutlass_cudnn_infer::Kernel<cutlass_tensorop_s1688dgrad_optimized_tf32_64x256_32x4_nhwc_align4>",
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nt_align4>",
            "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1, true>",
            "void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>",
            "void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int, int const*, int const*, int*)",
            "void splitKreduce_kernel<float, float, float, float, true, true, false>(cublasSplitKParams<float>)",
        )
    ] == ["conv", "conv", "gemm", "norm", "elementwise", "embedding", "gemm"]


def test_unknown_class_and_world_size_without_system_are_user_errors(tmp_path):
    path = write(tmp_path / "t.json", gpu_bound_step())
    with pytest.raises(ConfigError, match="unknown kernel class"):
        replay_whatif([path], WhatIf({"gemmm": 0.5}))
    with pytest.raises(ConfigError, match="also give --system"):
        replay_whatif([path], WhatIf(world_size=64))


@pytest.mark.parametrize(
    "text,match",
    [
        ('{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1', "malformed or truncated"),
        ('{"schemaVersion": 1}', "not a Kineto trace"),
        ("not json at all", "malformed or truncated"),
    ],
)
def test_bad_files_name_the_file(tmp_path, text, match):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(TraceError, match=f"bad.json: {match}"):
        read_kineto(bad)


def test_directory_without_traces_is_an_error(tmp_path):
    with pytest.raises(TraceError, match=r"holds no \.json"):
        read_traces([tmp_path])


def test_explicit_cuda_sync_wait_names_the_producer_the_heuristic_would_miss(tmp_path):
    # conv on stream 8 (10–30) is recorded by cudaEventRecord (corr 5); a longer GEMM on stream 9 (12–60)
    # is the latest-ending op, which the heuristic would pick. The cuda_sync record says stream 9's
    # consumer (an NCCL kernel on stream 7) waits on stream 8.
    sync = {
        "ph": "X",
        "cat": "cuda_sync",
        "name": "Stream Wait Event",
        "pid": 0,
        "tid": 7,
        "ts": 30,
        "dur": 0,
        "args": {"stream": 7, "wait_on_stream": 8, "wait_on_cuda_event_record_corr_id": 5, "correlation": 6},
    }
    events = [
        step(1, 0, 200),
        call("cudaLaunchKernel", 8, 1, corr=1),
        kernel("conv_fwd", 10, 20, corr=1, stream=8),
        call("cudaLaunchKernel", 11, 1, corr=2),
        kernel("volta_sgemm", 12, 48, corr=2, stream=9),
        call("cudaEventRecord", 14, 1, corr=5),
        call("cudaStreamWaitEvent", 16, 1, corr=6),
        call("cudaLaunchKernel", 18, 1, corr=7),
        kernel("ncclKernel_AllReduce", 61, 5, corr=7, stream=7),
        call("cudaDeviceSynchronize", 20, 47),
        sync,
    ]
    res = replay([write(tmp_path / "t.json", events)])
    g = res.sim.graph
    name = {g.names[g.name[t]]: t for t in range(g.num_tasks)}
    preds = {int(s) for s, d in zip(g.edge_src, g.edge_dst, strict=True) if d == name["ncclKernel_AllReduce"]}
    assert name["conv_fwd"] in preds and name["volta_sgemm"] not in preds
    assert res.replay_graph.notes["stream waits from cuda_sync records"] == 1


def test_queued_kernels_keep_their_gaps_not_their_queueing_as_launch_latency(tmp_path):
    # The host launches four GEMMs 2 µs apart (10, 12, 14, 16); the GPU runs them back to back,
    # 100 µs each with 2 µs between kernels (20, 122, 224, 326); a sync waits for the last (ends
    # 426) and takes 4 µs more; the CPU works 10 µs before the step ends at 440. Only the first
    # launch found its stream idle: the launch latency is 20 − 10 = 10 µs. The others were queued:
    # 110–310 µs after their launch is queueing, and taking it for latency froze the step.
    events = [step(1, 0, 440), call("cudaDeviceSynchronize", 18, 412)]
    for i in range(4):
        events += [call("cudaLaunchKernel", 10 + 2 * i, 1, corr=i + 1)]
        events += [kernel("sm90_xmma_gemm_bf16", 20 + 102 * i, 100, corr=i + 1)]
    path = write(tmp_path / "queued.json", events)
    base, half, _ = replay_whatif([path], WhatIf({"gemm": 0.5}))
    assert base.steps[0].replayed_s == pytest.approx(440e-6)
    assert base.replay_graph.notes["rank 0 median launch latency ns"] == 10_000
    assert base.steps[0].gpu_busy == pytest.approx(400 / 440)  # 4 × 100 µs of 440: "host" below 90%
    # halved: kernels at 20–70, 72–122, 124–174, 176–226; sync + 4 µs; CPU + 10 µs
    assert half.steps[0].replayed_s == pytest.approx(240e-6)


def test_collective_sizes_come_from_record_param_comms_around_the_launch(tmp_path):
    comms = fp32_all_reduce_comms(5, 20, 1 << 20, 8)
    events = [step(1, 0, 100), comms, call("cudaLaunchKernel", 10, 5, corr=1)]
    events += [kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 20, 50, corr=1), call("cudaDeviceSynchronize", 30, 45)]
    path = write(tmp_path / "nccl.json", events)
    trace = read_traces([path])[0]
    assert trace.op_nccl[0] == {
        "Collective name": "allreduce",
        "In msg nelems": 1 << 20,
        "dtype": "Float",
        "Group size": 8,
    }
    _, changed, counts = replay_whatif([path], WhatIf(system="dgx-h100"))
    # one rank, no GPU named in the trace: its wait for peers cannot be told from its transfer, and is said
    dropped = "unmatched collectives re-timed without a wait (no wait for peers told from the transfer)"
    assert counts == {"re-timed all_reduce on dgx-h100": 1, dropped: 1}
    costs = AnalyticCostModel(Job.from_presets("gpt3-1.3b", "dgx-h100").system, "bf16")
    all_reduce_s = costs.collective_s("all_reduce", 4 * (1 << 20), GroupPlacement(8, 1, 8))
    # kernel from 20 µs; the sync's 5 µs after it; the CPU's 25 µs after the sync
    assert changed.steps[0].replayed_s == pytest.approx(50e-6 + all_reduce_s)


def test_a_step_recorded_twice_counts_once(tmp_path):
    path = write(tmp_path / "t.json", [step(3, 0, 40), step(3, 0, 40), kernel("k", 5, 5, corr=1)])
    assert [s[::2] for s in read_kineto(path).steps] == [(3, 0.0)]


def test_an_operator_starting_as_the_previous_one_ends_is_top_level(tmp_path):
    # aten::linear 0–10 encloses aten::addmm 2–8; aten::relu starts at 10, where linear ends: a new
    # top-level operator, not linear's child; aten::add 12–14 lies inside relu 10–15
    events = [
        cpu_op("aten::linear", 0, 10),
        cpu_op("aten::addmm", 2, 6),
        cpu_op("aten::relu", 10, 5),
        cpu_op("aten::add", 12, 2),
    ]
    t = read_kineto(write(tmp_path / "t.json", events))
    assert [t.names[t.cpu_name[k]] for k in t.top_level_ops(100)] == ["aten::linear", "aten::relu"]


def test_the_measured_span_holds_the_steps_it_contains(tmp_path):
    """A step marked from 0 to 100 µs whose first launch is at 10 µs and last kernel ends at 60 µs: the measured span
    is the mark's 100 µs (first to last event alone it was 50, shorter than the step it holds)."""
    events = [step(1, 0, 100), call("cudaLaunchKernel", 10, 5, corr=1), kernel("sgemm", 20, 40, corr=1)]
    result = replay([write(tmp_path / "t.json", events)])
    assert result.steps[0].measured_s == pytest.approx(100e-6)
    assert result.measured_span_s == pytest.approx(100e-6)
    assert result.span_gpu_busy == pytest.approx(40 / 100)  # the kernel's 40 µs of the span
