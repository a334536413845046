"""Collective sizes for re-timing: from metadata, else inferred from the measured time on the trace's
own system (flagged), else kept and counted; `replay` says how many it re-timed and which ranks it matched."""

from __future__ import annotations

import pytest
from kineto_fixtures import call, fp32_all_reduce_comms, kernel, step, write
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import load_system
from itercast.costs.analytic import AnalyticCostModel
from itercast.hardware.topology import GroupPlacement
from itercast.replay import replay_whatif
from itercast.traces.collective_sizes import collective_sizes, infer_bytes, trace_system
from itercast.traces.kineto import read_traces
from itercast.traces.replay_graph import build_replay_graph
from itercast.traces.whatif import WhatIf

RUN = CliRunner()
V100 = {"deviceProperties": [{"id": 0, "name": "Tesla V100-SXM2-32GB"}]}
MIB = 1 << 20
LOAD_ALL = "(load every rank's trace to tell them apart)"


def all_reduce_s(system: str, nbytes: float, gpus: int) -> float:
    return AnalyticCostModel(load_system(system), "bf16").collective_s(
        "all_reduce", nbytes, GroupPlacement(gpus, 1, gpus)
    )


def nccl_step(nccl_us: float, names: tuple[str, ...] = ("ncclKernel_AllReduce_RING_LL_Sum_float",)) -> list[dict]:
    """Step 0–(30 + n·nccl_us + 20): each NCCL kernel launched at 10 + …, back to back from 20; a
    device sync waits for the last and takes 5 µs; the host 15 µs more."""
    events: list[dict] = []
    for i, name in enumerate(names):
        events += [call("cudaLaunchKernel", 10 + i, 1, corr=i + 1), kernel(name, 20 + i * nccl_us, nccl_us, corr=i + 1)]
    end = 20 + len(names) * nccl_us
    events += [call("cudaDeviceSynchronize", 15, end + 5 - 15)]
    return [step(1, 0, end + 20), *events]


def test_size_inferred_from_the_time_recovers_the_bytes_on_the_traces_system(tmp_path):
    # a 4 MiB fp32 all-reduce over 2 V100s takes t on the model; a kernel of t µs reads back as 4 MiB
    t_s = all_reduce_s("v100-p3.16xlarge", 4 * MIB, 2)
    assert infer_bytes("v100-p3.16xlarge", "all_reduce", 2, t_s) == pytest.approx(4 * MIB, rel=1e-9)
    path = write(tmp_path / "t.json", nccl_step(t_s * 1e6), distributedInfo={"rank": 0, "world_size": 2}, **V100)
    traces = read_traces([path])
    assert trace_system(traces[0]) == "v100-p3.16xlarge"
    rg = build_replay_graph(traces)
    sizes, missing = collective_sizes(traces, rg.gpu_task, rg.nccl_meta, rg.graph.duration_s)
    (size,) = sizes.values()
    assert (size.kind, size.group_size, size.inferred) == ("all_reduce", 2, True)
    assert size.nbytes == pytest.approx(4 * MIB, rel=1e-6) and not missing


def test_retiming_an_inferred_collective_on_a_larger_group(tmp_path):
    t_s = all_reduce_s("v100-p3.16xlarge", 4 * MIB, 2)
    path = write(tmp_path / "t.json", nccl_step(t_s * 1e6), distributedInfo={"rank": 0, "world_size": 2}, **V100)
    base, moved, counts = replay_whatif([path], WhatIf(system="v100-p3.16xlarge", world_size=8))
    # one rank alone: the size inferred from a time that holds any wait for the peer, which is re-timed with it
    whole = "unmatched collectives re-timed whole: the wait for peers their measured time holds re-timed as transfer"
    assert counts == {"re-timed all_reduce on v100-p3.16xlarge (size inferred)": 1, f"{whole} {LOAD_ALL}": 1}
    # the step: kernel from 20 µs, then the sync's 5 µs and the host's 15 µs
    assert moved.steps[0].replayed_s == pytest.approx(40e-6 + all_reduce_s("v100-p3.16xlarge", 4 * MIB, 8))
    assert base.steps[0].replayed_s == pytest.approx(40e-6 + t_s)


def test_a_single_ranks_gradient_reduction_rescaled_by_data_parallel_size_says_its_wait_goes_with_it(tmp_path):
    t_s = all_reduce_s("v100-p3.16xlarge", 4 * MIB, 2)
    path = write(tmp_path / "t.json", nccl_step(t_s * 1e6), distributedInfo={"rank": 0, "world_size": 2}, **V100)
    _, moved, counts = replay_whatif([path], WhatIf(dp=4))
    whole = "unmatched collectives re-timed whole: the wait for peers their measured time holds re-timed as transfer"
    assert counts[f"{whole} {LOAD_ALL}"] == 1
    assert moved.steps[0].replayed_s == pytest.approx(40e-6 + all_reduce_s("v100-p3.16xlarge", 4 * MIB, 4))


def test_system_and_data_parallel_what_ifs_count_each_collective_once(tmp_path):
    """User probe 6: --system re-times every sized collective, then --dp the gradient reductions again; each
    collective counts once, under --dp's label ('re-timed 48 of 64', '80 of 64 kept' before). The one all-reduce
    here: on dgx-h100's model over 4 GPUs, whichever what-if is given with --dp."""
    comms = fp32_all_reduce_comms(5, 20, MIB, 2)
    path = write(tmp_path / "t.json", [comms, *nccl_step(50)], distributedInfo={"rank": 0, "world_size": 2}, **V100)
    _, both, counts = replay_whatif([path], WhatIf(system="dgx-h100", dp=4))
    retimed = {k: n for k, n in counts.items() if k.startswith(("re-timed", "gradient"))}
    assert retimed == {"gradient all_reduce re-timed from data-parallel 2 to 4 on dgx-h100's model": 1}
    assert both.steps[0].replayed_s == pytest.approx(40e-6 + all_reduce_s("dgx-h100", 4 * MIB, 4))


def test_sizes_from_record_param_comms_are_not_inferred(tmp_path):
    comms = fp32_all_reduce_comms(5, 20, MIB, 2)
    path = write(tmp_path / "t.json", [comms, *nccl_step(50)], **V100)
    _, moved, counts = replay_whatif([path], WhatIf(system="dgx-h100"))
    wait = "unmatched collectives kept their measured wait for peers beyond v100-p3.16xlarge's model"
    assert counts == {"re-timed all_reduce on dgx-h100": 1, wait: 1}
    # measured 50 µs, under the V100 model's 270.9 µs for these 4 MiB on one link: no wait to keep
    assert all_reduce_s("v100-p3.16xlarge", 4 * MIB, 2) > 50e-6
    assert moved.steps[0].replayed_s == pytest.approx(40e-6 + all_reduce_s("dgx-h100", 4 * MIB, 2))


def test_a_single_ranks_collective_keeps_its_wait_for_peers_on_another_network(tmp_path):
    """One rank's 4 MiB all-reduce measured at 400 µs, which its own V100 model moves in 270.9 µs: two GPUs of
    the p3.16xlarge's mesh share one 25 GB/s link (GPUs 0 and 1: NV1), its curve's ramp on 150 / 25 = 6 times the
    bytes (V100's own one-node curve: 18.18 µs + 4,194,304 bus bytes / (25 GB/s × 0.9305 / (1 + e^(0.5357 ×
    (15.3372 − ln 25,165,824)))) = 18.18 + 252.68): the other 129.1 µs were spent waiting for its peer, which a
    faster network does not shorten, so on dgx-h100 it takes the H100 model's 39.1 µs plus that wait, not the
    39.1 alone."""
    comms = fp32_all_reduce_comms(5, 20, MIB, 2)
    path = write(tmp_path / "t.json", [comms, *nccl_step(400)], **V100)
    _, moved, _ = replay_whatif([path], WhatIf(system="dgx-h100"))
    waited_s = 400e-6 - all_reduce_s("v100-p3.16xlarge", 4 * MIB, 2)
    assert waited_s == pytest.approx(129.1e-6, abs=0.1e-6)
    assert moved.steps[0].replayed_s == pytest.approx(40e-6 + all_reduce_s("dgx-h100", 4 * MIB, 2) + waited_s)


def test_cli_counts_retimed_and_kept_collectives_and_names_the_ranks(tmp_path):
    # SendRecv names no collective and has no metadata: it keeps its time; the all-reduce is inferred
    t_us = all_reduce_s("v100-p3.16xlarge", 4 * MIB, 2) * 1e6
    names = ("ncclKernel_AllReduce_RING_LL_Sum_float", "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8")
    path = write(tmp_path / "t.json", nccl_step(t_us, names), distributedInfo={"rank": 3, "world_size": 4}, **V100)
    out = RUN.invoke(app, ["replay", str(path), "--system", "dgx-h100"])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "re-timed 1 of 2 collectives (1 with sizes inferred" in text
    assert "warning: 1 of 2 collectives keep their measured time" in text
    assert "ranks loaded: 3; no collective matched across ranks" in text


def test_retiming_collectives_of_a_trace_without_any_is_one_line_exit_2(tmp_path):
    path = write(
        tmp_path / "t.json", [step(1, 0, 50), call("cudaLaunchKernel", 1, 1, corr=1), kernel("sgemm", 5, 9, corr=1)]
    )
    out = RUN.invoke(app, ["replay", str(path), "--system", "dgx-h100"])
    assert out.exit_code == 2
    assert (
        out.output.count("\n") == 1
        and "hold no NCCL kernels to re-time" in out.output
        and "Traceback" not in out.output
    )


def sizes_of(paths: list) -> list:
    traces = read_traces(paths)
    rg = build_replay_graph(traces)
    sizes, _ = collective_sizes(traces, rg.gpu_task, rg.nccl_meta, rg.graph.duration_s)
    return [sizes[task] for task in sorted(sizes)]


def test_an_all_gathers_size_is_its_gathered_bf16_buffer(tmp_path):
    # PyTorch records an all-gather's shard as "In msg nelems" and the gathered buffer as "Out msg
    # nelems"; the cost model's all-gather takes the whole buffer: 2^20 bf16 elements × 2 B = 2 MiB
    meta = {"Collective name": "allgather", "In msg nelems": 1 << 18, "Out msg nelems": 1 << 20}
    meta |= {"dtype": "BFloat16", "Group size": 4}
    events = [step(1, 0, 100), call("cudaLaunchKernel", 10, 5, corr=1)]
    events += [kernel("ncclDevKernel_AllGather_RING_LL", 20, 50, corr=1, **meta)]
    (size,) = sizes_of([write(tmp_path / "t.json", events)])
    assert (size.kind, size.nbytes, size.group_size, size.inferred) == ("all_gather", 2 * MIB, 4, False)


def test_a_sub_groups_size_is_its_process_group_ranks_not_the_world(tmp_path):
    # ranks 0 and 2 of a world of 4: a group of 2; 2^20 fp32 elements = 4 MiB
    meta = {"Collective name": "allreduce", "In msg nelems": MIB, "dtype": "Float", "Process Group Ranks": "[0, 2]"}
    events = [step(1, 0, 100), call("cudaLaunchKernel", 10, 5, corr=1)]
    events += [kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 20, 50, corr=1, **meta)]
    (size,) = sizes_of([write(tmp_path / "t.json", events, distributedInfo={"rank": 0, "world_size": 4})])
    assert (size.kind, size.nbytes, size.group_size) == ("all_reduce", 4 * MIB, 2)


ALL_REDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float"


def late_peer_all_reduce(tmp_path) -> list:
    """Two ranks' traces of one 4 MiB all-reduce on V100s, launched at 10 µs on each: rank 1 arrived last
    (its kernel 220 → 220 + t, the transfer); rank 0's kernel (20 → 220 + t) also holds its 200 µs wait."""
    t_us = all_reduce_s("v100-p3.16xlarge", 4 * MIB, 2) * 1e6
    paths = []
    for rank, wait_us in ((0, 200.0), (1, 0.0)):
        events = [step(1, 0, 500 + t_us), call("cudaLaunchKernel", 10, 5, corr=1)]
        events += [kernel(ALL_REDUCE, 220 - wait_us, wait_us + t_us, corr=1)]
        info = {"rank": rank, "world_size": 2}
        paths.append(write(tmp_path / f"r{rank}.json", events, distributedInfo=info, **V100))
    return paths


def test_a_matched_collective_infers_one_size_from_its_transfer_not_a_members_wait(tmp_path):
    # both members of one all-reduce move the same 4 MiB: rank 1 arrived last, its kernel is the
    # transfer (t); rank 0's kernel also holds its 200 µs wait for rank 1, which is not data
    sizes = sizes_of(late_peer_all_reduce(tmp_path))
    assert [s.inferred for s in sizes] == [True, True]
    assert [s.nbytes for s in sizes] == pytest.approx([4 * MIB, 4 * MIB], rel=1e-6)


def test_a_dropped_collective_still_waits_for_its_peers_and_says_so(tmp_path):
    """--drop nccl on an all-reduce matched across two ranks: no transfer, but rank 0 (launched at 10, its
    kernel from 20) still waits for rank 1's, which started at 220: rank 0's kernel ends at 220 (was 220 + t).
    Said: a what-if without communication that still holds a rank for a late peer looked like a bug."""
    _, moved, counts = replay_whatif(late_peer_all_reduce(tmp_path), WhatIf(scale={"nccl": 0.0}))
    assert counts["dropped nccl"] == 2
    kept = "dropped collectives that still wait for their peers (zero transfer; a late rank still holds them)"
    assert counts[kept] == 2
    g = moved.sim.graph
    ends = sorted(float(moved.sim.end_s[t]) for t in range(g.num_tasks) if g.names[g.name[t]] == ALL_REDUCE)
    assert ends == pytest.approx([220e-6, 220e-6])


def test_scaling_a_single_ranks_collective_keeps_its_wait_for_peers(tmp_path):
    """The same rank's 400 µs all-reduce (270.9 µs of V100 transfer, 129.1 µs of wait for its peer): halving NCCL's
    kernels halves the transfer, 129.1 + 135.4 = 264.6 µs, not the 200 µs that halving the wait too would give;
    dropping them leaves the wait, as a dropped collective matched across ranks keeps its rendezvous."""
    comms = fp32_all_reduce_comms(5, 20, MIB, 2)
    path = write(tmp_path / "t.json", [comms, *nccl_step(400)], **V100)
    transfer_s = all_reduce_s("v100-p3.16xlarge", 4 * MIB, 2)
    wait = "unmatched collectives kept their measured wait for peers beyond v100-p3.16xlarge's model"
    _, halved, counts = replay_whatif([path], WhatIf(scale={"nccl": 0.5}))
    assert counts == {"scaled nccl": 1, wait: 1}
    assert halved.steps[0].replayed_s == pytest.approx(40e-6 + 129.1e-6 + 0.5 * transfer_s, abs=0.1e-6)
    assert halved.steps[0].replayed_s == pytest.approx(304.55e-6, abs=0.1e-6)
    _, dropped, _ = replay_whatif([path], WhatIf(scale={"nccl": 0.0}))
    assert dropped.steps[0].replayed_s == pytest.approx(40e-6 + 129.1e-6, abs=0.1e-6)
    # on dgx-h100 and halved: the H100 model's time halved, the wait once (counted once)
    _, both, counts = replay_whatif([path], WhatIf(scale={"nccl": 0.5}, system="dgx-h100"))
    assert counts == {"re-timed all_reduce on dgx-h100": 1, wait: 1, "scaled nccl": 1}
    assert both.steps[0].replayed_s == pytest.approx(
        40e-6 + 400e-6 - transfer_s + 0.5 * all_reduce_s("dgx-h100", 4 * MIB, 2)
    )


def test_scaling_a_collective_whose_wait_cannot_be_told_apart_says_so(tmp_path):
    # no size metadata: the 400 µs cannot be split into transfer and wait; all of it is halved, and said
    path = write(tmp_path / "t.json", nccl_step(400), distributedInfo={"rank": 0, "world_size": 2}, **V100)
    _, halved, counts = replay_whatif([path], WhatIf(scale={"nccl": 0.5}))
    whole = "unmatched collectives scaled whole (no wait for peers told from the transfer)"
    assert counts == {"scaled nccl": 1, whole: 1}
    assert halved.steps[0].replayed_s == pytest.approx(40e-6 + 200e-6)
