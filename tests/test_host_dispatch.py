"""Host dispatch of a model-built step, by hand: each stage's host issues its kernels in stream order,
h seconds each, never waiting for the stream; a segment's first kernel waits for its own launch only,
its last for all of them (workloads/transformer.py host_launch_split, _run_segment), and the fast
path's host bounds say the same (search/fast_estimate.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import tiny_job
from test_fast_estimate import _zero1_exposed

from itercast.config.job import Job, load_system
from itercast.config.system import GPUSpec
from itercast.costs.op_model import fit_operator_models
from itercast.predict import predict
from itercast.profile.db import ProfileDB
from itercast.search.fast_estimate import FastEstimator, _after_last_launch, _behind_either
from itercast.workloads.transformer import host_launch_split


def test_a_llama_layer_forward_splits_its_launches_first_and_rest():
    # a Llama layer's forward issues 11 kernels (input norm, QKV, RoPE, attention, output projection,
    # residual, post-attention norm, up, activation, down, residual) at 25.35 us each: the first kernel
    # waits 25.35 us, the last 10 x 25.35 = 253.5 us more; 11 x 25.35 = 278.85 us in all
    first_s, rest_s = host_launch_split(11, 25.35e-6)
    assert first_s == pytest.approx(25.35e-6)
    assert rest_s == pytest.approx(253.5e-6)
    assert first_s + rest_s == pytest.approx(278.85e-6)


def test_a_segment_without_kernels_waits_for_no_launch():
    assert host_launch_split(0, 25.35e-6) == (0.0, 0.0)


def _tiny(launch_s: float, global_batch_size: int) -> Job:
    """tiny_job's llama (8 layers, 8 data-parallel H100) with GPUSpec.kernel_launch_overhead_s = launch_s."""
    job = tiny_job(global_batch_size=global_batch_size, overlap_grad_reduce=False)
    gpu = job.system.gpu.model_copy(update={"kernel_launch_overhead_s": launch_s})
    return Job(job.model, job.plan, job.system.model_copy(update={"gpu": gpu}))


def _both_s(launch_s: float, global_batch_size: int) -> tuple[float, float]:
    """(graph, fast path) step seconds of _tiny."""
    job = _tiny(launch_s, global_batch_size)
    return predict(job).step_time_s, float(FastEstimator(job.model, job.system).step_time_s([job])[0])


# One micro-batch's kernels on the tiny llama: forward = embedding lookup 1 + 8 layers x 11 + head 3
# (final norm, logits, cross-entropy) = 92; backward = head 4 + 8 x 15 + embedding 1 = 125; 217 in all.
@pytest.mark.parametrize("global_batch_size, microbatches", [(8, 1), (16, 2)])
def test_a_host_bound_step_grows_by_every_launch(global_batch_size: int, microbatches: int):
    # h = 1 ms and 2 ms, each far above a kernel of the tiny model (microseconds): host-bound, the
    # passes end at M x 217 x h + the last kernel, the gradient all-reduce and optimizer after them
    # alike, so one more ms per launch adds M x 217 x 1 ms: 0.217 s (M = 1), 0.434 s (M = 2)
    for one, two in zip(_both_s(1e-3, global_batch_size), _both_s(2e-3, global_batch_size), strict=True):
        assert two - one == pytest.approx(microbatches * 217 * 1e-3, rel=1e-9)


@pytest.mark.parametrize("global_batch_size", [8, 16])
def test_a_gpu_bound_step_waits_for_its_first_launch_only(global_batch_size: int):
    # h = 1 ns and 2 ns: the stream never catches up with the host; only the first kernel waits for
    # its own launch, so the step grows by 2 - 1 = 1 ns whatever the number of micro-batches
    for one, two in zip(_both_s(1e-9, global_batch_size), _both_s(2e-9, global_batch_size), strict=True):
        assert two - one == pytest.approx(1e-9, abs=1e-15)


def test_overlapped_reductions_follow_the_host_when_it_binds_by_hand():
    """Stage 0's backward in three gradient buckets: two layers (1.0 s on the stream, 20 kernels) and
    the embedding (one kernel of 0.05 s), reductions 1.5, 1.5 and 1.7 s; h = 0.1 s per launch."""
    grads = [(1.5, ["l"]), (1.5, ["l"]), (1.7, ["e"])]
    # the stream's chain alone: the units end at 1.0, 2.0, 2.05; the DP stream runs 1.0-2.5, 2.5-4.0,
    # 4.0-5.7: 5.7 - 2.05 = 3.65 s after the passes
    stream = _zero1_exposed("grad", grads, {"lb": 1.0, "eb": 0.05})
    assert stream == pytest.approx(3.65)
    # the host's chain alone: it issues the layers 0-2, 2-4 and the embedding 4-4.1 s, each unit's last
    # kernel (0.05 s) after its last launch: the units end at 2.05, 4.05, 4.15 (n h apart: 20 x 0.1,
    # 1 x 0.1); the DP stream runs 2.05-3.55, 4.05-5.55, 5.55-7.25: 7.25 - 4.15 = 3.1 s
    host = _zero1_exposed("grad", grads, {"lb": 2.0, "eb": 0.1})
    assert host == pytest.approx(3.1)

    def after(stream_end_s: float) -> float:
        """The reductions after passes that end at max(stream_end_s, 4.15), by _behind_either."""
        end = max(stream_end_s, 4.15)
        return float(_behind_either(*(np.array([x]) for x in (stream, host, end, stream_end_s, 4.15)))[0])

    # host-bound (the stream's chain ends at 2.05): the reductions end at 7.25 = 4.15 + 3.1 s (the
    # stream's pace alone would say 4.15 + 3.65 = 7.8)
    assert after(2.05) == pytest.approx(3.1)
    # the stream 1.5 s late into the backward (its forward held back by parameter gathers): the first
    # layer ends at max(2.5, 2.05) = 2.5, the second at max(3.5, 4.05) = 4.05, the embedding at
    # max(4.1, 4.15) = 4.15; the DP stream 2.5-4.0, 4.05-5.55, 5.55-7.25: 3.1 s after, max(3.65 - 0.6, 3.1)
    assert after(3.55) == pytest.approx(3.1)
    # 2.5 s late: the stream's chain binds throughout, ends 3.5, 4.5, 4.55; DP 3.5-5.0, 5.0-6.5,
    # 6.5-8.2: 8.2 - 4.55 = 3.65 s, max(3.65, 3.1 - 0.4)
    assert after(4.55) == pytest.approx(3.65)


def test_a_bucketed_backward_after_its_last_launch_by_hand():
    """The last two gradient buckets of a backward, a segment each: two layers (each 0.25 s of compute
    in 5 kernels and 0.15 s of blocking TP communication), then the embedding (0.02 s in 2 kernels,
    0.03 s of communication); h = 0.1 s per launch, the host behind the stream."""
    g = {f"first_grad_end{i}_{u}": np.array([0.0]) for i in (1, 2) for u in "lmeh"}
    g["first_grad_end1_e"], g["first_grad_end2_l"] = np.array([1.0]), np.array([2.0])
    f = {f"{of}{u}b": np.array([0.0]) for of in ("", "c_", "k_") for u in "lmeh"}
    f |= {"lb": np.array([0.4]), "c_lb": np.array([0.15]), "k_lb": np.array([5.0])}
    f |= {"eb": np.array([0.05]), "c_eb": np.array([0.03]), "k_eb": np.array([2.0])}
    rows = np.array([True])
    # the embedding alone after its last launch: its last kernel 0.02 / 2 = 0.01 s, its communication
    # 0.03 s: 0.04 s. From the layers' last launch, 2 x 0.1 = 0.2 s before it: their last kernel
    # 0.5 / 10 = 0.05 s, their communication 0.3 s, then the embedding's 0.05 s: 0.4 - 0.2 = 0.2 s
    assert _after_last_launch(g, f, rows, "first", 0.1)[0] == pytest.approx(0.2)
    # the embedding in a bucket of its own, the only one: 0.04 s
    g["first_grad_end2_l"] = np.array([0.0])
    assert _after_last_launch(g, f, rows, "first", 0.1)[0] == pytest.approx(0.04)


@pytest.mark.parametrize("launch_s", [1e-3, 2e-3])
def test_a_host_bound_step_with_gradient_buckets_agrees_with_the_graph(launch_s: float):
    """_tiny at M = 1 with its gradients reduced in buckets beside the backward (200k parameters: the
    head, each layer, the embedding). Host-bound, each layer's backward ends 15 x h after the one
    before, far more than its bucket's reduction (~51 us on the graph), so only the embedding's shows
    after the passes (a segment of one kernel after its launch); charged against the layers' stream
    time (~71 us each) instead, the fast path added ~53 us."""
    job = tiny_job(global_batch_size=8, overlap_grad_reduce=True, grad_bucket_size_params=200_000)
    gpu = job.system.gpu.model_copy(update={"kernel_launch_overhead_s": launch_s})
    job = Job(job.model, job.plan, job.system.model_copy(update={"gpu": gpu}))
    fast = float(FastEstimator(job.model, job.system).step_time_s([job])[0])
    assert fast == pytest.approx(predict(job).step_time_s, rel=1e-9)


def test_the_default_host_cost_per_kernel_is_what_an_h100_host_measured():
    """Every GPU whose host was not measured (the default, the A100 and V100 presets) and the measured
    H100 and H200 presets cost 11.3 µs of host per launching operator: the `launch` term that calibrate's
    NNLS (fit_operator_models) finds over data/measured/h100_profile.db's 21 host-program rows, 11.28 µs
    (Lin et al.'s 4–6 µs T_launch is the runtime call alone). The CPU host keeps its own 2 µs (its
    operators run on the host)."""
    db = ProfileDB(Path(__file__).resolve().parents[1] / "data" / "measured" / "h100_profile.db", readonly=True)
    host_rows = [m for m in db.measurements(device_id=db.choose_device(None)) if m.family == "host"]
    assert fit_operator_models(host_rows)["host_s"]["launch"] == pytest.approx(11.28e-6, abs=0.005e-6)
    spec = GPUSpec(name="x", peak_flops={"bf16": 1e15}, hbm_bytes=1e10, hbm_bandwidth_bytes_per_s=1e12, l2_bytes=1e7)
    assert spec.kernel_launch_overhead_s == 11.3e-6
    for preset in ("v100-p3.16xlarge", "dgx-a100", "dgx-h100", "h200"):
        assert load_system(preset).gpu.kernel_launch_overhead_s == 11.3e-6, preset
    assert load_system("cpu-host").gpu.kernel_launch_overhead_s == 2.0e-6
