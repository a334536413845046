"""Host calls that wait for the GPU are derived, not replayed: hand-built traces of each kind of wait,
step times worked out by hand (µs)."""

from __future__ import annotations

import pytest
from kineto_fixtures import call, cpu_op, kernel, step, write

from itercast.replay import replay, replay_whatif
from itercast.traces.whatif import WhatIf


def memcpy(name: str, ts: float, dur: float, corr: int, stream: int = 7) -> dict:
    return {**kernel(name, ts, dur, corr, stream), "cat": "gpu_memcpy"}


def steps_us(paths, scale: dict[str, float]) -> tuple[float, float, float]:
    """(measured, replayed, what-if) of the first step, µs."""
    base, changed, _ = replay_whatif(paths, WhatIf(scale))
    return base.steps[0].measured_s * 1e6, base.steps[0].replayed_s * 1e6, changed.steps[0].replayed_s * 1e6


def one_kernel_then(sync: str) -> list[dict]:
    """Step 0–100: launch 10–15 → GEMM 20–70 (launch latency 10); `sync` 30–75 waits until 70 and
    then takes its own 5 µs; the host works 25 µs more until the step ends at 100."""
    return [
        step(1, 0, 100),
        call("cudaLaunchKernel", 10, 5, corr=1),
        kernel("volta_sgemm_128x64", 20, 50, corr=1),
        call(sync, 30, 45),
    ]


@pytest.mark.parametrize("sync", ["cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"])
def test_a_synchronisation_waits_for_the_kernel_and_keeps_only_its_own_time(tmp_path, sync):
    path = [write(tmp_path / "t.json", one_kernel_then(sync))]
    # ×2: GEMM 20–120, sync ends 120 + 5 = 125, host 25 more → 150
    assert steps_us(path, {"gemm": 2}) == pytest.approx((100, 100, 150))
    # ×0.5: GEMM 20–45, sync 45–50, host → 75
    assert steps_us(path, {"gemm": 0.5}) == pytest.approx((100, 100, 75))


def test_a_blocking_copy_waits_for_its_own_copy(tmp_path):
    # cudaMemcpy 10–60 launches its copy 20–55 (latency 10), then 5 µs of its own; host 40 more → 100
    events = [
        step(1, 0, 100),
        call("cudaMemcpy", 10, 50, corr=1),
        memcpy("Memcpy DtoH (Device -> Pinned)", 20, 35, corr=1),
    ]
    path = [write(tmp_path / "t.json", events)]
    # copy ×2: 20–90, call ends 95, host 40 more → 135
    assert steps_us(path, {"memcpy": 2}) == pytest.approx((100, 100, 135))


def test_an_async_copy_followed_by_a_sync_waits_for_the_kernel_before_it(tmp_path):
    # GEMM 20–70; cudaMemcpyAsync 30–32 queues its copy behind it (70–72); the stream sync 35–77
    # waits for the copy and takes 5 µs of its own; host 23 more → 100
    events = [
        step(1, 0, 100),
        call("cudaLaunchKernel", 10, 5, corr=1),
        kernel("volta_sgemm_128x64", 20, 50, corr=1),
        call("cudaMemcpyAsync", 30, 2, corr=2),
        memcpy("Memcpy DtoH (Device -> Pinned)", 70, 2, corr=2),
        call("cudaStreamSynchronize", 35, 42),
    ]
    path = [write(tmp_path / "t.json", events)]
    # GEMM ×2: 20–120, copy 120–122, sync ends 127, host 23 → 150
    assert steps_us(path, {"gemm": 2}) == pytest.approx((100, 100, 150))


def test_item_waits_for_its_scalar_copy_without_a_sync_call(tmp_path):
    # .item(): aten::_local_scalar_dense 28–76 holds a cudaMemcpyAsync 30–75 to pinned memory (no
    # sync call, not pageable): it waits for its copy, queued behind the GEMM at 70–72, then 3 µs
    events = [
        step(1, 0, 100),
        call("cudaLaunchKernel", 10, 5, corr=1),
        kernel("volta_sgemm_128x64", 20, 50, corr=1),
        cpu_op("aten::_local_scalar_dense", 28, 48),
        call("cudaMemcpyAsync", 30, 45, corr=2),
        memcpy("Memcpy DtoH (Device -> Pinned)", 70, 2, corr=2),
    ]
    path = [write(tmp_path / "t.json", events)]
    # GEMM ×2: 20–120, copy 120–122, call ends 125, host 25 more → 150
    assert steps_us(path, {"gemm": 2}) == pytest.approx((100, 100, 150))


def backpressure_trace() -> list[dict]:
    """80 GEMMs of 100 µs back to back from 5 µs (GEMM i: 5 + 100 i to 105 + 100 i). Launches 0–70
    take 1 µs each at t = i; the 71st finds 70 pending and waits until GEMM 0 ends (71–106);
    launch j ≥ 72 starts where j − 1 ended and returns when GEMM j − 71 ends (at 106 + 100 (j − 71)):
    launch 79 ends at 906; the host works 4 µs more and the step ends at 910."""
    events = [step(1, 0, 910)]
    ts = 0.0
    for i in range(80):
        end = i + 1.0 if i <= 70 else 106.0 + 100 * (i - 71)
        events += [
            call("cudaLaunchKernel", ts, end - ts, corr=i + 1),
            kernel("sm80_gemm", 5 + 100 * i, 100, corr=i + 1),
        ]
        ts = end
    return events


def test_a_full_launch_queue_makes_the_host_wait_for_the_gpu(tmp_path):
    path = [write(tmp_path / "t.json", backpressure_trace())]
    base = replay(path)
    assert base.steps[0].gpu_busy == pytest.approx(905 / 910)  # busy from 5 to 910
    assert base.replay_graph.notes["rank 0 launch queue depth (measured)"] == 70
    assert base.replay_graph.notes["launches held by a full launch queue"] == 9  # launches 71–79
    # ×2: GEMM i ends at 205 + 200 i; launch 71 waits for GEMM 0 (205) and takes the 1 µs median;
    # launch 79 waits for GEMM 8 (1805) → 1806, host 4 µs → 1810 (1.99× the 910 measured)
    assert steps_us(path, {"gemm": 2}) == pytest.approx((910, 910, 1810))
    # ×0.5: GEMM i ends at 55 + 50 i; launch 71 at 71 no longer waits (GEMM 0 ended at 55), 72 waits
    # until 105, …, 79 until 455 → 456, host 4 → 460 (0.51×)
    assert steps_us(path, {"gemm": 0.5}) == pytest.approx((910, 910, 460))


def test_short_launches_with_a_shallow_queue_are_not_back_pressure(tmp_path):
    # one slow launch (60 µs, 12× the 5 µs median) with one op pending: lazy loading, not a full queue
    events = [
        step(1, 0, 200),
        call("cudaLaunchKernel", 0, 5, corr=1),
        kernel("sm80_gemm", 10, 100, corr=1),
        call("cudaLaunchKernel", 5, 5, corr=2),
        kernel("sm80_gemm", 110, 20, corr=2),
        call("cudaLaunchKernel", 10, 60, corr=3),
        kernel("sm80_gemm", 130, 20, corr=3),
    ]
    path = [write(tmp_path / "t.json", events)]
    r = replay(path)
    assert "launches held by a full launch queue" not in r.replay_graph.notes
    # the host's 60 µs are its own: the step stays 200 whatever the GPU does (no sync)
    assert steps_us(path, {"gemm": 0.5}) == pytest.approx((200, 200, 200))


def two_ranks(tmp_path):
    """Rank 0: kernel 10–60 and an all-reduce 60–90 in step 0–100; rank 1 is late: its all-reduce
    runs 85–90 (it arrived last, so 5 µs is the transfer)."""
    paths = []
    for rank, nccl_start in ((0, 60), (1, 85)):
        events = [
            step(1, 0, 100),
            call("cudaLaunchKernel", 5, 2, corr=1),
            kernel("sm80_gemm", 10, 50, corr=1),
            call("cudaLaunchKernel", 8 + 40 * rank, 2, corr=2),
            kernel("ncclKernel_AllReduce_RING_LL_Sum_float", nccl_start, 90 - nccl_start, corr=2, stream=9),
        ]
        paths.append(write(tmp_path / f"r{rank}.json", events, distributedInfo={"rank": rank, "world_size": 2}))
    return paths


def test_gpu_busy_of_a_rank_does_not_depend_on_the_other_files_loaded(tmp_path):
    p0, p1 = two_ranks(tmp_path)
    alone, both = replay([p0]), replay([p0, p1])
    # rank 0 measured: GEMM 10–60 and all-reduce 60–90 → 80 µs of 100
    assert alone.steps[0].gpu_busy == pytest.approx(0.8)
    assert both.steps[0].gpu_busy == pytest.approx(0.8)
    assert both.to_dict()["matched_ranks"] == [0, 1] and alone.to_dict()["matched_ranks"] == []


def test_a_queue_never_full_in_the_trace_holds_the_host_at_the_default_depth(tmp_path):
    # 1,030 launches of 1 µs back to back from 0; GEMM i runs 2 + 100 i to 102 + 100 i. At the last
    # launch (1,029 µs) 11 GEMMs have started: 1,018 pending, never the 1,024 of a full queue.
    events = [step(1, 0, 1040)]
    for i in range(1030):
        events += [call("cudaLaunchKernel", i, 1, corr=i + 1), kernel("sm80_gemm", 2 + 100 * i, 100, corr=i + 1)]
    path = [write(tmp_path / "t.json", events)]
    assert replay(path).replay_graph.notes["rank 0 launch queue depth (default, never full in the trace)"] == 1024
    # ×10: GEMM k ends at 1,002 + 1,000 k. Launch j ≥ 1,025 needs GEMM j − 1,025 done: launch 1,025
    # still goes at 1,025 (GEMM 0 ended at 1,002); 1,026 waits until 2,002 (+1 µs), 1,027 until 3,002,
    # 1,028 until 4,002, 1,029 until 5,002 → 5,003; the host's last 10 µs → 5,013
    assert steps_us(path, {"gemm": 10}) == pytest.approx((1040, 1040, 5013))


def test_a_sync_that_finds_the_gpu_done_keeps_only_its_own_time(tmp_path):
    # GEMM 20–40; cudaStreamSynchronize 50–53 starts after it ended: nothing to wait for, its own
    # 3 µs; host 47 µs more until the step ends at 100
    events = [
        step(1, 0, 100),
        call("cudaLaunchKernel", 10, 5, corr=1),
        kernel("volta_sgemm_128x64", 20, 20, corr=1),
        call("cudaStreamSynchronize", 50, 3),
    ]
    path = [write(tmp_path / "t.json", events)]
    # ×2: GEMM 20–60, the sync from 50 waits until 60, then 3 µs → 63, host 47 → 110
    assert steps_us(path, {"gemm": 2}) == pytest.approx((100, 100, 110))


def test_a_device_synchronisation_waits_for_every_streams_last_op(tmp_path):
    # GEMM 20–70 on stream 7, an elementwise kernel 25–60 on stream 8; cudaDeviceSynchronize 30–75
    # waits for both (the later ends at 70) and takes 5 µs of its own; host 25 µs more → 100
    events = [
        step(1, 0, 100),
        call("cudaLaunchKernel", 10, 1, corr=1),
        call("cudaLaunchKernel", 12, 1, corr=2),
        kernel("volta_sgemm_128x64", 20, 50, corr=1, stream=7),
        kernel("vectorized_elementwise_kernel", 25, 35, corr=2, stream=8),
        call("cudaDeviceSynchronize", 30, 45),
    ]
    path = [write(tmp_path / "t.json", events)]
    # elementwise ×3: 25–130 on stream 8, the sync ends 130 + 5 = 135, host 25 → 160
    assert steps_us(path, {"elementwise": 3}) == pytest.approx((100, 100, 160))


def test_a_stream_wait_holds_the_next_launch_until_the_latest_op_on_the_other_streams(tmp_path):
    # cudaStreamWaitEvent at 14 after launches onto stream 7 (elementwise 20–40) and stream 8 (GEMM
    # 22–62): the kernel launched next, on stream 9, waited for the one that ended last (the GEMM:
    # it starts at 62, lasts 10); cudaDeviceSynchronize 20–77 waits for it, 5 µs own; host 23 → 100
    events = [
        step(1, 0, 100),
        call("cudaLaunchKernel", 10, 1, corr=1),
        call("cudaLaunchKernel", 12, 1, corr=2),
        call("cudaStreamWaitEvent", 14, 1),
        call("cudaLaunchKernel", 16, 1, corr=3),
        kernel("vectorized_elementwise_kernel", 20, 20, corr=1, stream=7),
        kernel("volta_sgemm_128x64", 22, 40, corr=2, stream=8),
        kernel("vectorized_elementwise_kernel", 62, 10, corr=3, stream=9),
        call("cudaDeviceSynchronize", 20, 57),
    ]
    path = [write(tmp_path / "t.json", events)]
    # GEMM ×2: 22–102, the waiting kernel 102–112, the sync ends 117, host 23 → 140
    assert steps_us(path, {"gemm": 2}) == pytest.approx((100, 100, 140))


def test_an_unmeasured_launch_latency_is_the_median_of_the_measured_ones(tmp_path):
    # Launches onto an idle stream measure 5, 5 and 20 µs (median 5, mean 10). The last kernel was
    # launched at 70 while the GEMM still ran: queued, no latency measured, so it takes the median.
    events = [
        step(1, 0, 200),
        call("cudaLaunchKernel", 10, 1, corr=1),
        kernel("vectorized_elementwise_kernel", 15, 5, corr=1),  # 15–20, latency 5
        call("cudaLaunchKernel", 25, 1, corr=2),
        kernel("vectorized_elementwise_kernel", 30, 5, corr=2),  # 30–35, latency 5
        call("cudaLaunchKernel", 40, 1, corr=3),
        kernel("volta_sgemm_128x64", 60, 100, corr=3),  # 60–160, latency 20
        call("cudaLaunchKernel", 70, 1, corr=4),
        kernel("vectorized_elementwise_kernel", 160, 10, corr=4),  # queued behind the GEMM: 160–170
        call("cudaDeviceSynchronize", 75, 100),  # waits until 170, then 5 µs of its own
    ]
    path = [write(tmp_path / "t.json", events)]
    base, _, _ = replay_whatif(path, WhatIf({"gemm": 0.1}))
    assert base.replay_graph.notes["rank 0 median launch latency ns"] == 5000
    # GEMM ×0.1: 60–70; the queued kernel starts at its launch (70) + 5 µs = 75, ends 85; the sync
    # ends 90, host 25 → 115
    assert steps_us(path, {"gemm": 0.1}) == pytest.approx((200, 200, 115))
