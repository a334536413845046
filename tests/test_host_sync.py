"""Host synchronisations in the step graph, computed by hand (issues 27 and 28).

1. Megatron-Core's 1F1B calls torch.cuda.synchronize() after every batched exchange (NVIDIA/Megatron-LM
   d98e8a64 p2p_communication.py _communicate: batch_p2p_comm and batch_p2p_sync; model_parallel_config.py
   batch_p2p_sync True; training/argument_utils.py batch_p2p_comm = not overlap_p2p_comm, off without
   interleaving): the host's next launch waits for the device (transformer.py _host_sync).
2. CUDA_LAUNCH_BLOCKING=1 (plan.cuda_launch_blocking): every launch returns once its kernel has ended, so a
   stage's work runs one task at a time in program order (transformer.py TransformerStepBuilder._task).

Stages of F = 1 s forward and B = 2 s backward in n = 4 kernels, launches of h = 0.1 s (the host issues a
pass's 4 kernels in 0.4 s, less than either pass: GPU-bound), exchanges of T = 0.25 s.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from helpers import FreeCosts, fast_vs_graph, plan_of
from test_golden import MODEL, SYSTEM

from itercast.config.job import Job
from itercast.errors import ConfigError
from itercast.search.fast_estimate import FastEstimator, _blocking_interleaved, _blocking_pipeline, _host_synced
from itercast.sim.engine import simulate
from itercast.workloads.transformer import PassCost, TransformerStepBuilder, UnitCosts

F, B, T, N, H = 1.0, 2.0, 0.25, 4, 0.1


class ReduceCosts(FreeCosts):
    """FreeCosts, but a gradient reduce-scatter (of any bytes) takes R = 0.5 s."""

    def collective_s(self, kind, nbytes, group):
        return 0.5 if kind == "reduce_scatter" and nbytes > 0 else 0.0


def builder(
    stages: int, micro: int, h: float = H, costs: FreeCosts | None = None, dp: int = 1, **plan: Any
) -> TransformerStepBuilder:
    """`micro` micro-batches over `stages` stages of one model chunk each (two when interleaved), `dp`
    replicas; the embedding and head free, each chunk's pass F or B seconds in N kernels."""
    chunks = int(plan.get("virtual_pipeline", 1))
    fields = dict(pipeline_parallel=stages, data_parallel=dp, micro_batch_size=1, global_batch_size=micro * dp)
    gpu = {**SYSTEM["gpu"], "kernel_launch_overhead_s": h}
    system = {**SYSTEM, "gpu": gpu, "node": {**SYSTEM["node"], "gpus_per_node": stages * dp}, "num_nodes": 1}
    job = Job.from_dicts({**MODEL, "num_layers": stages * chunks}, fields | plan, system)
    b = TransformerStepBuilder(job, costs=costs or FreeCosts())
    free = PassCost(0.0, 0.0, 0)
    b.stage_units = [UnitCosts(PassCost(F, 0.0, N), PassCost(B, 0.0, N), free, free, free, free)] * stages
    b.p2p_s = dict.fromkeys(b.p2p_s, T)
    return b


def starts(b: TransformerStepBuilder) -> dict[str, list[float]]:
    """Start of each named task, per stage, in seconds."""
    g = b.build()
    result = simulate(g)
    out: dict[str, list[float]] = {}
    for task in range(g.num_tasks):
        out.setdefault(g.names[g.name[task]], []).append(float(result.start_s[task]))
    return out


def step_s(b: TransformerStepBuilder) -> float:
    return simulate(b.build()).step_time_s


def test_megatron_exchange_exposes_the_next_launch():
    # 2 stages, 2 micro-batches. Stage 0: F0 | send act0, sync | F1 | send act1 + recv grad0, sync | B0 |
    # recv grad1, sync | B1. Stage 1: recv act0, sync | F0 | B0 | send grad0 + recv act1, sync | F1 | B1 |
    # send grad1, sync (its forward's send and backward's receive are no-ops: no sync between F and B).
    # Stage 0: F0's first launch 0.1, F0 to 1.1, act0 to 1.35. Stage 1 synced at 1.35: F0's first launch
    # to 1.45, F0 to 2.45; B0 launched while F0 runs (the host ahead), on the stream 2.45 to 4.45; the
    # pair meets then (stage 0 waits since F1 ended at 2.45), 4.70. Both synced: stage 1's F1 launched to
    # 4.80, runs to 5.80, B1 to 7.80; grad1 to 8.05; stage 0 synced, B1 launched to 8.15, runs to 10.15.
    # = 3F + 3B + 3T + 4h: the first launch and the one after each of the 3 exchanges on the path.
    megatron = builder(2, 2, pipeline_p2p="megatron")
    assert step_s(megatron) == pytest.approx(3 * F + 3 * B + 3 * T + 4 * H)  # 10.15
    # before, the host ran ahead: only the first launch shows, 3F + 3B + 3T + h = 9.85
    # (tests/test_megatron_pipeline.py's 3F + 3B + 3T with h = 0)
    assert step_s(builder(2, 2, h=0.0, pipeline_p2p="megatron")) == pytest.approx(3 * F + 3 * B + 3 * T)
    seen = starts(builder(2, 2, pipeline_p2p="megatron"))
    # stage 1's F1 waits h for its launch after the pair met at 4.70; its B0 had been launched ahead
    assert seen["F1.c0.0"][1] == pytest.approx(4.70 + H)
    assert seen["B0.c0.0"][1] == pytest.approx(2.45)  # right at F0's end: not synced
    assert seen["launch.B0.c0.0"][1] == pytest.approx(1.75)  # after F0's 4 launches, 1.35 + 0.4


def test_synchronize_waits_for_the_dp_stream():
    # ZeRO-2 reduces each backward's gradients on the DP stream (R = 0.5 s); torch.cuda.synchronize is
    # device-wide: stage 1's sync after "send grad0 + recv act1" waits for its B0 reduction too. B0 ends
    # 4.45 (as above), the pair meets then and ends 4.70, the reduction runs 4.45 to 4.95: stage 1's F1
    # launched 4.95 to 5.05 (4.70 to 4.80 without it)
    b = builder(2, 2, costs=ReduceCosts(), pipeline_p2p="megatron", dp=2, zero_stage=2)
    seen = starts(b)
    assert seen["F1.c0.0"][1] == pytest.approx(4.95 + H)
    g = b.graph
    assert g is not None
    syncs = [t for t in range(g.num_tasks) if g.names[g.name[t]] == "cuda_synchronize"]
    waits_for_dp = {g.kinds[g.resource_kind[g.resource[s]]] for s in g.edge_src[np.isin(g.edge_dst, syncs)]}
    assert "dp_comm" in waits_for_dp


def test_interleaved_megatron_does_not_synchronize():
    # overlap_p2p_comm (every launcher's choice with VP > 1) turns batch_p2p_comm off: no synchronize
    g = builder(2, 4, pipeline_p2p="megatron", virtual_pipeline=2, schedule="interleaved-1f1b").build()
    assert "cuda_synchronize" not in {g.names[g.name[t]] for t in range(g.num_tasks)}
    g = builder(2, 4, pipeline_p2p="megatron").build()
    # 1F1B on 2 stages, 4 micro-batches: stage 0 syncs after send act0, 3 batched pairs, recv grad3 (5);
    # stage 1 after recv act0, 3 batched pairs, send grad3 (5)
    assert sum(g.names[g.name[t]] == "cuda_synchronize" for t in range(g.num_tasks)) == 10


def test_launch_blocking_serialises_a_stage_and_stops_dp_overlap():
    # One stage, 2 micro-batches, ZeRO-2 (a reduce-scatter of R = 0.5 after each backward), launches h = 0.1.
    # Asynchronous: F0 0.1 to 1.1, B0 to 3.1, its reduction 3.1 to 3.6 beside F1 (3.1 to 4.1), B1 to 6.1,
    # its reduction to 6.6.
    plan = dict(dp=2, zero_stage=2)
    assert step_s(builder(1, 2, costs=ReduceCosts(), **plan)) == pytest.approx(H + 2 * (F + B) + 0.5)  # 6.6
    # CUDA_LAUNCH_BLOCKING=1: each pass n·h + its compute, the reductions in line: F0 0 to 1.4, B0 to 3.8,
    # R 4.3, F1 5.7, B1 8.1, R 8.6 = 2 (2 N h + F + B + R)
    blocking = builder(1, 2, costs=ReduceCosts(), cuda_launch_blocking=True, **plan)
    assert step_s(blocking) == pytest.approx(2 * (2 * N * H + F + B + 0.5))  # 8.6
    seen = starts(builder(1, 2, costs=ReduceCosts(), cuda_launch_blocking=True, **plan))
    assert seen["F1.c0.0"][0] == pytest.approx(4.3 + N * H)  # after B0's reduction and F1's 4 launches


def test_launch_blocking_pipeline_waits_for_the_input_before_launching():
    # 2 stages, 1 micro-batch, overlapped sends: stage 0's F0 takes N h + F = 1.4, its send to 1.65;
    # stage 1's host waits in its receive until then, runs F0 to 3.05 and B0 (N h + B = 2.4) to 5.45 one
    # kernel at a time; grad0 reaches stage 0 at 5.70, whose B0 ends 8.1 = 2 (N h + F) + 2 (N h + B) + 2T
    b = builder(2, 1, cuda_launch_blocking=True)
    assert step_s(b) == pytest.approx(2 * (N * H + F) + 2 * (N * H + B) + 2 * T)  # 8.1


def test_fast_path_refuses_launch_blocking():
    fe = FastEstimator({"preset": "gpt3-1.3b"}, {"preset": "dgx-a100", "num_nodes": 1})
    jobs, _ = fe.jobs([{"cuda_launch_blocking": True, "global_batch_size": 8}])
    with pytest.raises(ConfigError, match=r"plan\.cuda_launch_blocking"):
        fe.step_time_s([j for j in jobs if j is not None])


def test_fast_path_prices_the_synchronize():
    # the same 2 stages: per micro-batch stage 0's backward and stage 1's forward follow a sync, each
    # max(h, n h + C/n − C) = max(0.1, 0.4 + 0.5 − 2) = 0.1 later; _blocking_pipeline's stages then
    # 3.1 each, 2 (3.1 + T) + T + 3.1 = 10.05, and the first launch 0.1: the graph's 10.15
    fwd, bwd = np.array([[F, F]]), np.array([[B, B]])
    none, kernels = np.zeros((1, 2)), np.full((1, 2), float(N))
    synced = _host_synced((fwd, bwd), (none, none), (kernels, kernels), H)
    assert synced == pytest.approx(np.array([[H, H]]))
    fast = _blocking_pipeline(fwd + bwd + synced, np.array([2]), np.array([T]), deepspeed=False)[0] + H
    assert fast == pytest.approx(step_s(builder(2, 2, pipeline_p2p="megatron")))
    # host-bound: 40 kernels of h = 0.1 issue a forward in 4 s: it ends n h + C/n = 4.025 after its sync
    assert _host_synced((fwd, bwd), (none, none), (kernels * 10, kernels * 10), H)[0, 1] == pytest.approx(3.025)
    # uniform stages, launches 1% of a forward: the fast path within 0.5% of the graph (measured worst 0.4%)
    for stages, micro in itertools.product((2, 3, 4), (1, 2, 8)):
        b = builder(stages, micro, h=0.01, pipeline_p2p="megatron")
        fw, bw = np.full((1, stages), F), np.full((1, stages), B)
        n = np.full((1, stages), float(N))
        s = _host_synced((fw, bw), (np.zeros_like(fw),) * 2, (n, n), 0.01)
        fast = _blocking_pipeline(fw + bw + s, np.array([micro]), np.array([T]), deepspeed=False)[0] + 0.01
        assert fast == pytest.approx(step_s(b), rel=0.005)


def test_blocking_interleaved_synchronises_before_forwards_and_the_cool_down():
    # Megatron-LM's interleaved schedule without overlap_p2p_comm on 3 stages × 2 chunks, 3 micro-batches, each
    # chunk's pass F or B in N kernels: the longest chain of tests/test_megatron_pipeline.py (8 forwards, 8
    # backwards, 12 exchanges) has 13 passes after a synchronisation, each δ = max(h, N h + C/N − C) = h later
    # (GPU-bound): the first forward (its first launch), the chain's 4 other forwards down the first chunk and GPU
    # 2's warm-up, GPU 2's 3 steady forwards (not their backwards: no exchange inside a pair), its 3 cool-down
    # backwards, and m2's last backwards on GPUs 1 and 0: 8F + 8B + 12T + 13h
    blocking = dict(pipeline_p2p="megatron", virtual_pipeline=2, schedule="interleaved-1f1b", overlap_p2p_comm=False)
    assert step_s(builder(3, 3, **blocking)) == pytest.approx(8 * F + 8 * B + 12 * T + 13 * H)  # 28.3
    # the fast path: every stage δ later at its v forwards and, per micro-batch, the last stage's (v − 1) p / M
    # cool-down backwards: 2h + h = 0.3 on a stage of 2 (F + B) = 6 a micro-batch; 3·6.3 + 2·6.3/2 + 12T + h = 28.3
    fwd, bwd = np.full((1, 3), 2 * F), np.full((1, 3), 2 * B)
    none, kernels, micro = np.zeros((1, 3)), np.full((1, 3), 2.0 * N), np.array([3])
    synced = _host_synced((fwd, bwd), (none, none), (kernels, kernels), H, interleaved=(2, micro))
    assert synced == pytest.approx(np.full((1, 3), 3 * H))
    # host-bound: 40 kernels a chunk pass issue it in 4 s, a forward's ending N h + C/N − C = 4 + 1/40 − 1 = 3.025
    # late, a backward's 4 + 2/40 − 2 = 2.05: 2·3.025 + 2.05
    many = _host_synced((fwd, bwd), (none, none), (kernels * 10, kernels * 10), H, interleaved=(2, micro))
    assert many == pytest.approx(np.full((1, 3), 8.1))
    assert _blocking_interleaved(fwd + bwd + synced, micro, 2, np.array([T]))[0] + H == pytest.approx(28.3)
    # uniform stages, launches a tenth of a forward: within 0.3% of the graph (measured worst 0.24% over p 3-5, v 2-3
    # and 1-3 micro-batches a stage; 1.5% with launches of 0.3, the host issuing a chunk pass slower than F runs)
    for stages, chunks, groups in itertools.product((3, 4), (2, 3), (1, 3)):
        micro = np.array([stages * groups])
        fwd, bwd = np.full((1, stages), chunks * F), np.full((1, stages), chunks * B)
        none, kernels = np.zeros((1, stages)), np.full((1, stages), float(chunks * N))
        synced = _host_synced((fwd, bwd), (none, none), (kernels, kernels), H, interleaved=(chunks, micro))
        fast = _blocking_interleaved(fwd + bwd + synced, micro, chunks, np.array([T]))[0] + H
        b = builder(stages, int(micro[0]), **blocking | {"virtual_pipeline": chunks})
        assert fast == pytest.approx(step_s(b), rel=0.003)


def test_fast_path_agrees_with_graph_on_synchronized_megatron_plans():
    # real costs, launches of the dgx-a100 preset, with the gradient and parameter overlaps on (the
    # reductions after the last backward); measured worst 1.2e-3 (the overlaps' own approximation: 4e-4
    # before the synchronize)
    plans = []
    for i, (tp, pp, zero) in enumerate(itertools.product([1, 2, 8], [2, 4], [0, 1])):
        plan = plan_of(tp, pp, 1, "1f1b", zero, sequence_parallel=tp > 1, pipeline_p2p="megatron")
        plan["global_batch_size"] = (64, 256)[i % 2]
        plans.append(plan)
    valid, rel = fast_vs_graph("gpt3-1.3b", {"preset": "dgx-a100", "num_nodes": 4}, plans)
    assert len(valid) == 12 and rel.max() < 2e-3
