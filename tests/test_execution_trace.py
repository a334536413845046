"""PyTorch execution traces: import, data dependencies, links to Kineto, GEMM shapes for what-ifs."""

from __future__ import annotations

import json

import pytest
from kineto_fixtures import call, kernel, step, write

from itercast.errors import ConfigError
from itercast.replay import replay_whatif
from itercast.traces.execution_trace import link, read_execution_trace
from itercast.traces.kineto import TraceError, read_kineto
from itercast.traces.whatif import WhatIf, matmul_flops

#: what the --gpu what-if says of a trace whose GPU no system preset has (the fixtures name none)
ABSOLUTE = "re-timed GEMMs from shapes on dgx-h100, absolute (no system preset has the trace's GPU)"


def et_node(nid, name, rf_id, inputs, shapes, outputs, out_shapes, types=None):
    return {
        "id": nid,
        "name": name,
        "rf_id": rf_id,
        "parent": 1,
        "tid": 1,
        "inputs": inputs,
        "input_shapes": shapes,
        "input_types": types or ["Tensor(float)"] * len(inputs),
        "outputs": outputs,
        "output_shapes": out_shapes,
    }


def tensor(tid, numel):
    return [tid, tid, 0, numel, 4, "cuda:0"]


def pair(tmp_path, rf_in_kineto: bool, split_k: bool = False, et_pid: int = 100, device: str | None = None):
    """An addmm (bias 256, [64,512]×[512,256]) then a relu reading its output. `split_k`: the addmm's
    200 µs on the GPU are a 150 µs GEMM kernel and a 50 µs split-K reduction, launched apart. The Kineto
    trace's CPU operators ran in process 100; the execution trace says it was recorded by `et_pid`; `device`:
    the GPU its deviceProperties name (none by default)."""
    nodes = [
        et_node(
            2,
            "aten::addmm",
            10,
            [tensor(1, 256), tensor(2, 64 * 512), tensor(3, 512 * 256)],
            [[256], [64, 512], [512, 256]],
            [tensor(4, 64 * 256)],
            [[64, 256]],
        ),
        et_node(3, "aten::relu", 11, [tensor(4, 64 * 256)], [[64, 256]], [tensor(5, 64 * 256)], [[64, 256]]),
    ]
    et = tmp_path / "et.json"
    et.write_text(json.dumps({"schema": "1.0.1", "pid": et_pid, "nodes": nodes}))

    def cpu(name, ts, dur, rf):
        args = {"Input Dims": [[256], [64, 512], [512, 256]] if name == "aten::addmm" else [[64, 256]]}
        if rf_in_kineto:
            args["Record function id"] = rf
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 100, "tid": 100, "ts": ts, "dur": dur, "args": args}

    events = [
        step(1, 0, 400),
        cpu("aten::addmm", 10, 30, 10),
        call("cudaLaunchKernel", 20, 5, corr=1),
        *(
            (
                kernel("ampere_sgemm_64x64_nn", 30, 150, corr=1),
                call("cudaLaunchKernel", 27, 3, corr=3),
                kernel("void splitKreduce_kernel<float>(cublasSplitKParams<float>)", 180, 50, corr=3),
            )
            if split_k
            else (kernel("ampere_sgemm_64x64_nn", 30, 200, corr=1),)
        ),
        cpu("aten::relu", 50, 20, 11),
        call("cudaLaunchKernel", 55, 5, corr=2),
        kernel("vectorized_elementwise_kernel", 230, 10, corr=2),
        call("cudaDeviceSynchronize", 70, 171),
    ]
    top = {"deviceProperties": [{"name": device}]} if device else {}
    return et, write(tmp_path / "k.json", events, **top)


@pytest.mark.parametrize("rf", [True, False])
def test_link_by_record_function_id_or_by_order_gives_gemm_shapes(tmp_path, rf):
    et_path, k_path = pair(tmp_path, rf)
    et, k = read_execution_trace(et_path), read_kineto(k_path)
    tl = link(et, k)
    assert tl.method == ("record function id" if rf else "name and order of issue")
    assert tl.stats["linked CPU ops"] == 2 and tl.stats["GPU ops with a linked CPU op"] == 2
    node = tl.node_of_gpu_op(et, 0)
    assert node.name == "aten::addmm" and matmul_flops(node.name, node.input_shapes) == 2 * 64 * 512 * 256
    assert et.data_edges() == [(2, 3)]  # relu reads the tensor addmm wrote


def test_gpu_what_if_retimes_the_gemm_from_its_shapes(tmp_path):
    et_path, k_path = pair(tmp_path, True)
    base, moved, changes = replay_whatif([k_path], WhatIf(gpu="dgx-h100"), [et_path])
    from itercast.config.job import Job
    from itercast.costs.analytic import AnalyticCostModel

    model = AnalyticCostModel(Job.from_presets("gpt3-1.3b", "dgx-h100").system, "fp32")
    gemm_s = float(model.gemm_s(2 * 64 * 512 * 256))
    g = moved.sim.graph
    task = next(t for t in range(g.num_tasks) if g.names[g.name[t]].startswith("ampere_sgemm"))
    assert changes == {ABSOLUTE: 1} and g.duration_s[task] == pytest.approx(gemm_s)
    # By hand: the GEMM now ends at 30 + ~11 µs, so the ReLU kernel is bound by its own launch at 55 µs
    # plus the trace's median launch latency (10 µs, the GEMM's): 65–75; the sync waits until 75, takes
    # its own 1 µs, and the 159 µs of CPU work that followed it ends the step at 235 µs instead of 400.
    assert gemm_s < 25e-6
    assert (base.steps[0].replayed_s, moved.steps[0].replayed_s) == pytest.approx((400e-6, 235e-6), abs=1e-9)


def test_gpu_what_if_scales_the_measured_gemm_by_the_models_ratio(tmp_path):
    """A trace of an A100 (deviceProperties): the 200 µs GEMM kernel is scaled by the model's H100 / A100 time of
    its matmul; on its own GPU it keeps its measured time exactly (a FLOP model that misses a small GEMM misses it
    on both GPUs alike)."""
    from itercast.config.job import load_system
    from itercast.costs.analytic import AnalyticCostModel

    et_path, k_path = pair(tmp_path, True, device="NVIDIA A100-SXM4-80GB")
    flops = 2 * 64 * 512 * 256
    h100, a100 = (float(AnalyticCostModel(load_system(s), "fp32").gemm_s(flops)) for s in ("dgx-h100", "dgx-a100"))
    for gpu, expected in (("dgx-h100", 200e-6 * h100 / a100), ("dgx-a100", 200e-6)):
        _, moved, changes = replay_whatif([k_path], WhatIf(gpu=gpu), [et_path])
        g = moved.sim.graph
        task = next(t for t in range(g.num_tasks) if g.names[g.name[t]].startswith("ampere_sgemm"))
        assert g.duration_s[task] == pytest.approx(expected, rel=1e-9)
        said = f"re-timed GEMMs from shapes on {gpu}: measured × the model's {gpu} / dgx-a100 time"
        assert changes == {
            said if gpu != "dgx-a100" else "GEMMs kept at their measured time: dgx-a100 is the traces' own GPU": 1
        }
    assert h100 < a100  # the faster GPU shortens the measured kernel


def test_an_execution_trace_of_another_process_is_said_and_still_linked(tmp_path):
    """PARAM's DLRM pairs (dlrm_eg_<r>.json with worker<r>'s Kineto trace) share their pid, 59811 + r; another
    rank's execution trace links just as well where the ranks run the same operators: said, not refused."""
    et_path, k_path = pair(tmp_path, True, et_pid=101)
    assert read_execution_trace(et_path).pid == 101 and read_kineto(k_path).host_pid == 100
    _, _, changes = replay_whatif([k_path], WhatIf(gpu="dgx-h100"), [et_path])
    (note,) = [k for k in changes if "recorded by process 101" in k]
    assert f"{k_path} by process 100: not one process's pair" in note
    assert changes[ABSOLUTE] == 1
    # a trace whose operators name no integer process has none, and is read as before
    odd = [{"ph": "X", "cat": "cpu_op", "name": "mm", "pid": pid, "tid": 1, "ts": 0, "dur": 1} for pid in ([1], "a")]
    assert read_kineto(write(tmp_path / "odd.json", odd)).host_pid is None


def test_predict_says_an_execution_trace_of_another_process_beside_its_kineto_trace(tmp_path):
    from typer.testing import CliRunner

    from itercast.cli import app

    for et_pid, said in ((101, True), (100, False)):
        et_path, k_path = pair(tmp_path, True, et_pid=et_pid)
        args = ["predict", "--et", str(et_path), "--kineto", str(k_path), "--system", "dgx-h100"]
        out = CliRunner().invoke(app, args)
        assert out.exit_code == 0, out.output
        assert ("was recorded by process 101" in " ".join(out.output.split())) is said


def test_gpu_what_if_splits_a_split_k_matmuls_time_between_its_kernels_then_scales(tmp_path):
    from itercast.config.job import Job
    from itercast.costs.analytic import AnalyticCostModel

    et_path, k_path = pair(tmp_path, True, split_k=True)
    gemm_s = float(
        AnalyticCostModel(Job.from_presets("gpt3-1.3b", "dgx-h100").system, "fp32").gemm_s(2 * 64 * 512 * 256)
    )

    def kernels(whatif):
        _, moved, changes = replay_whatif([k_path], whatif, [et_path])
        g = moved.sim.graph
        by_name = {g.names[g.name[t]][:12]: float(g.duration_s[t]) for t in range(g.num_tasks)}
        return by_name["ampere_sgemm"], by_name["void splitKr"], changes

    # one matmul's time on the H100, shared as measured: 150 / 200 and 50 / 200 (each kernel got all of it)
    gemm, reduce, changes = kernels(WhatIf(gpu="dgx-h100"))
    assert changes == {ABSOLUTE: 2}
    assert (gemm, reduce) == pytest.approx((0.75 * gemm_s, 0.25 * gemm_s))
    # a scale applies to the re-timed kernels (it was overwritten by the re-timing)
    gemm, reduce, changes = kernels(WhatIf(gpu="dgx-h100", scale={"gemm": 0.5}))
    assert (gemm, reduce) == pytest.approx((0.375 * gemm_s, 0.125 * gemm_s)) and changes["scaled gemm"] == 2
    # a class the traces lack is said, not silently ignored
    _, _, changes = kernels(WhatIf(gpu="dgx-h100", scale={"attention": 0.5}))
    assert changes["scaled attention: the traces have no such kernel, nothing changed"] == 0
    # a factor of 0 (--drop) is counted as dropped, its kernels take no time
    gemm, reduce, changes = kernels(WhatIf(gpu="dgx-h100", scale={"gemm": 0.0}))
    assert (gemm, reduce, changes["dropped gemm"], changes["scaled gemm"]) == (0.0, 0.0, 2, 0)


def test_execution_traces_without_gpu_are_refused(tmp_path):
    et_path, k_path = pair(tmp_path, True)
    with pytest.raises(ConfigError, match="give --gpu too"):
        replay_whatif([k_path], WhatIf(scale={"gemm": 0.5}), [et_path])


def test_gpu_what_if_needs_execution_traces(tmp_path):
    _, k_path = pair(tmp_path, True)
    with pytest.raises(ConfigError, match="give the execution traces"):
        replay_whatif([k_path], WhatIf(gpu="dgx-h100"))


def test_truncated_execution_trace_is_named(tmp_path):
    bad = tmp_path / "et.json"
    bad.write_text('{"schema": "1.0.1", "nodes": [{"id": 1, "name": "a"')
    with pytest.raises(TraceError, match=r"et\.json: malformed or truncated execution trace"):
        read_execution_trace(bad)


@pytest.mark.parametrize("nodes", [10, 1_300, 3_000])  # 2 KB; 317 KB (one to two edge windows); 731 KB
def test_schema_is_found_whatever_the_file_size(tmp_path, nodes):
    path = tmp_path / "et.json"
    body = [et_node(i, "aten::relu", i, [tensor(i, 8)], [[8]], [tensor(i + 1, 8)], [[8]]) for i in range(2, nodes + 2)]
    path.write_text(json.dumps({"schema": "1.0.1", "nodes": body}))
    assert nodes != 1_300 or 1 << 18 < path.stat().st_size < 1 << 19
    et = read_execution_trace(path)
    assert et.schema == "1.0.1" and len(et.nodes) == nodes


def test_real_execution_trace_links_by_record_function_id(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    x = torch.randn(32, 64)
    observer = ExecutionTraceObserver().register_callback(str(tmp_path / "et.json"))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        observer.start()
        model(x).sum().backward()
        observer.stop()
    observer.unregister_callback()
    prof.export_chrome_trace(str(tmp_path / "kineto.json"))
    et, k = read_execution_trace(tmp_path / "et.json"), read_kineto(tmp_path / "kineto.json")
    tl = link(et, k)
    addmm = [n for n in et.nodes if n.name == "aten::addmm"]
    assert tl.method == "record function id" and tl.stats["linked CPU ops"] >= 0.9 * len(k.cpu_ts_us)
    assert matmul_flops("aten::addmm", addmm[0].input_shapes) == 2 * 32 * 64 * 128


def test_gpu_work_a_what_if_pushes_past_the_last_step_is_said(tmp_path):
    # a 200 µs GEMM launched at 20 µs in a 300 µs step ends at 220 µs, 80 µs before the step's host mark;
    # twice as long it ends at 420 µs, 120 µs past it, and no host call waits for it: the step stays 300 µs
    events = [
        step(1, 0, 300),
        call("cudaLaunchKernel", 10, 5, corr=1),
        kernel("ampere_sgemm_64x64_nn", 20, 200, corr=1),
    ]
    path = write(tmp_path / "k.json", events)
    base, moved, changes = replay_whatif([path], WhatIf(scale={"gemm": 2.0}))
    assert (base.steps[0].replayed_s, moved.steps[0].replayed_s) == pytest.approx((300e-6, 300e-6))
    said = [k for k in changes if k.startswith("ranks whose GPU work runs on up to 0.120 ms past")]
    assert len(said) == 1 and changes[said[0]] == 1
    _, _, calm = replay_whatif([path], WhatIf(scale={"gemm": 1.2}))  # ends at 260 µs, inside the step
    assert not any(k.startswith("ranks whose GPU work") for k in calm)
