"""Host dispatch of a model-built step, by hand: each stage's host issues its kernels in stream order,
h seconds each, never waiting for the stream; a segment's first kernel waits for its own launch only,
its last for all of them (workloads/transformer.py host_launch_split, _run_segment), and the fast
path's host bounds say the same (search/fast_estimate.py)."""

from __future__ import annotations

import pytest
from helpers import tiny_job

from itercast.config.job import Job
from itercast.predict import predict
from itercast.search.fast_estimate import FastEstimator
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
