"""A distributed step from execution traces: measured start skew between ranks, the autograd thread
walked in call order, operators on host tensors (traces/et_step.py, et_pricing.py, rendezvous.py)."""

from __future__ import annotations

import json

import pytest
from kineto_fixtures import call, kernel, step, write
from test_et_distributed import ALLREDUCE, HOST, LinearCosts, node, rank_trace, t

from itercast.hardware.topology import GroupPlacement
from itercast.traces.et_pricing import ETPricer
from itercast.traces.et_step import predict_step, thread_tops
from itercast.traces.execution_trace import _node, read_execution_trace
from itercast.traces.kineto import TraceError, read_kineto
from itercast.traces.rendezvous import measured_starts_s

THREAD = "[pytorch|profiler|execution_graph|thread]"


def test_a_late_starter_makes_its_peer_wait_and_is_timed_from_its_own_start(tmp_path):
    ets = [read_execution_trace(rank_trace(tmp_path / f"r{r}.json", with_mm=False)) for r in (0, 1)]
    pricers = [ETPricer(LinearCosts()) for _ in ets]  # type: ignore[arg-type]
    even = predict_step(ets, pricers, HOST, GroupPlacement(2, 1, 2))
    # each rank: TBE launched at 10 + 1 + 5 = 16 µs (host 18); all-reduce issued at 18 + 10 + 1 + 5 = 34
    # (host 36): rendezvous at 34, 4,000 B at 1 ns/B → 38; the add launched at 36 + 10 + 1 + 5 = 52 runs
    # 12,000 B: 52-64 µs
    assert [s.iteration_s for s in even] == pytest.approx([64e-6, 64e-6])
    pricers = [ETPricer(LinearCosts()) for _ in ets]  # type: ignore[arg-type]
    skewed = predict_step(ets, pricers, HOST, GroupPlacement(2, 1, 2), starts_s=[0.0, 30e-6])
    # rank 1 starts at 30: ready at 64, the rendezvous ends at 68. Rank 0's add (launched at 52) waits
    # for it: 68-80 → 80 µs; rank 1's add is launched at 30 + 52 = 82 → 94, i.e. 64 µs after its start
    assert [s.iteration_s for s in skewed] == pytest.approx([80e-6, 64e-6])
    with pytest.raises(ValueError, match="one start per trace"):
        predict_step(ets, pricers, HOST, GroupPlacement(2, 1, 2), starts_s=[0.0])


def test_the_autograd_threads_operators_are_walked_before_the_optimizer_that_follows_them(tmp_path):
    nodes = [
        {"name": "[pytorch|profiler|execution_graph|process]", "id": 1, "rf_id": 0, "parent": 1, "tid": 0},
        {"name": THREAD, "id": 2, "rf_id": 0, "parent": 1, "tid": 1},
        {**node(3, "## backward ##", []), "parent": 2},
        {**node(10, "aten::add_", [t(1, 1, [4])]), "parent": 2},  # the optimizer, after backward()
        {"name": THREAD, "id": 5, "rf_id": 0, "parent": 1, "tid": 2},
        {**node(6, "aten::mul", [t(2, 2, [4])]), "parent": 5, "tid": 2},  # the autograd thread
    ]
    path = tmp_path / "et.json"
    path.write_text(json.dumps({"schema": "1.0.1", "nodes": [{"inputs": [], "input_shapes": [], **n} for n in nodes]}))
    et = read_execution_trace(path)
    children: dict = {}
    for n in sorted(et.nodes, key=lambda n: n.id):
        if n.parent != n.id:
            children.setdefault(n.parent, []).append(n)
    assert [n.id for n in thread_tops(et, children)] == [3, 6, 10]


def test_an_operator_on_host_tensors_launches_nothing(tmp_path):
    pricer = ETPricer(LinearCosts())  # type: ignore[arg-type]
    on_gpu = _node(node(4, "aten::add_", [t(1, 1, [1000]), t(2, 2, [1000])], [t(1, 1, [1000])]))
    host_arg = t(3, 3, [1000])
    host_arg[0][5] = "cpu"
    on_cpu = _node(node(4, "aten::add_", [host_arg, host_arg], [host_arg]))
    priced = pricer.price(on_gpu, False)
    # 3 tensors of 1,000 floats at 1 ns/B
    assert priced is not None and priced.seconds == pytest.approx(12e-6)
    assert pricer.price(on_cpu, False) is None
    # the host-only add costs T1 10 + no-call 3 µs on the host and nothing on the GPU
    path = tmp_path / "cpu.json"
    root = {"name": THREAD, "id": 1, "rf_id": 0, "parent": 1, "tid": 1, "inputs": [], "input_shapes": []}
    path.write_text(json.dumps({"schema": "1.0.1", "nodes": [root, node(4, "aten::add_", [host_arg, host_arg])]}))
    (s,) = predict_step([read_execution_trace(path)], [pricer], HOST, GroupPlacement(1, 1, 1))
    assert s.iteration_s == pytest.approx(13e-6) and s.seconds_by_family == {}


def test_measured_starts_align_the_ranks_on_their_first_collective(tmp_path):
    # rank 0's step starts at 100 µs of its clock, its first NCCL kernel ends at 100 + 40 = 140;
    # rank 1's clock is 1,000 µs off: step at 1,125, kernel ends at 1,125 + 15 = 1,140.
    # Leads 40 and 15 µs: rank 1 started 40 − 15 = 25 µs after rank 0
    r0 = [
        step(1, 100, 200),
        call("cudaLaunchKernel", 110, 5, corr=1),
        kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 120, 20, corr=1),
    ]
    r1 = [
        step(1, 1125, 175),
        call("cudaLaunchKernel", 1127, 5, corr=1),
        kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 1130, 10, corr=1),
    ]
    traces = [read_kineto(write(tmp_path / f"w{r}.json", ev)) for r, ev in enumerate((r0, r1))]
    assert measured_starts_s(traces) == pytest.approx([0.0, 25e-6])
    silent = read_kineto(write(tmp_path / "w2.json", [step(1, 0, 50), kernel("volta_sgemm_128x64", 10, 5, corr=2)]))
    with pytest.raises(TraceError, match="no NCCL kernel"):
        measured_starts_s([traces[0], silent])


def test_a_collective_waits_for_the_compute_streams_work_before_it(tmp_path):
    # ProcessGroupNCCL makes its stream wait for the caller's current stream (syncStream), so an
    # all-reduce of an unrelated tensor still starts after the kernels launched before it.
    # add_ of 10,000 floats (3 × 40,000 B at 1 ns/B = 120 µs): T1 10, launch 5 + T2 1 → runs 16–136,
    # T3 2 → host 18. all-reduce of 1,000 floats: T1 10 + 5 + 1 → issued at 34, ready at the compute
    # stream's 136, 4,000 B → 136–140; T3 2 → host 36. The iteration: 140 µs (not 136)
    add_args = [t(21, 30, [10_000]), t(22, 31, [10_000]), (1, [], "Int")]
    nodes = [
        {"name": THREAD, "id": 1, "rf_id": 0, "parent": 1, "tid": 1, "inputs": [], "input_shapes": []},
        node(2, "aten::add_", add_args, [t(21, 30, [10_000])]),
        node(3, "c10d::allreduce_", ALLREDUCE),
    ]
    path = tmp_path / "et.json"
    path.write_text(json.dumps({"schema": "1.0.1", "nodes": nodes}))
    pricer = ETPricer(LinearCosts())  # type: ignore[arg-type]
    (s,) = predict_step([read_execution_trace(path)], [pricer], HOST, GroupPlacement(1, 1, 1))
    assert s.seconds_by_family == pytest.approx({"memory": 120e-6, "collective:all_reduce": 4e-6})
    assert s.iteration_s == pytest.approx(140e-6)
