"""Compute slowed by communication running beside it on the same GPU (issue 27 item 2).

The max-plus simulator treats a collective on another stream as free for the compute it hides
behind. It is not: NCCL's kernels hold SMs (one CTA per channel; NCCL_MIN/MAX_CTAS) and HBM
bandwidth while they run. Kernel-level measurements: Lee et al., "Characterizing Compute-
Communication Overlap in GPU-Accelerated Distributed Deep Learning" (arXiv 2507.03114, A100, H100,
MI250, MI210, GPT and LLaMA layers on 4 GPUs): compute 18.9% slower on average while a collective
overlaps it, 40% at most; the NVIDIA developer forum thread "Compute-Communication Overlap Causes
Severe GEMM Performance Degradation because of Tail Effect" (t/337991, H100): a 132-block GEMM
beside a 24-block ncclAllGather takes ~2× (its second wave), 24/132 = 18% of the SMs taken.

Model (fluid): while any communication task of its rank is in flight, a compute task progresses
at 1/(1 + s) of its rate alone, s = GPUSpec.overlap_compute_slowdown of that rank's GPU. Over o
seconds of overlap in a schedule it does o/(1 + s) seconds of its work, so it needs
    duration = duration alone + s/(1 + s) · o
(a task overlapped throughout: duration alone × (1 + s), the measured slowdown). o depends on the
schedule, so this is a fixed point: simulate, stretch every compute task by its overlap, simulate
again from the original durations plus the stretch, until the step moves less than 1e-4 relative
(at most 5 rounds). Communication itself is not slowed; concurrent collectives on one GPU count
once (their union); a collective on the compute stream itself (blocking TP) is never concurrent
with that stream's compute and stretches nothing. Applied by predict() to model-built transformer
steps only (DLRM and trace replays keep their measured or plain durations); within a layer pass the
same model prices a kernel beside its pass's own collectives (workloads/transformer.py `_beside_s`):
a collective there and one of the graph beside the same pass both count (not their union).

Co-running ranks (issue 29 item 5; `simulate_with_corunning`): the same fluid model and fixed point
with "communication of my rank" replaced by "compute of another rank of my node". Ranks that share a
host's memory bandwidth and caches (DLRM's gloo ranks on one CPU) run each kernel at its co-running
speed only while another rank of the host computes too, alone otherwise: s per task is the ratio of
its co-running to its alone price − 1 (workloads/dlrm/step.py, `co_running`), o the seconds of its
span during which a compute task of another rank of its node runs (their union). Host and
communication tasks neither slow nor are slowed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from itercast.graph.execgraph import Category, ExecGraph
from itercast.sim.engine import SimResult, simulate

#: The step's relative change at which the fixed point stops, and the most rounds it takes.
TOLERANCE = 1e-4
MAX_ROUNDS = 5


def simulate_with_contention(graph: ExecGraph, slowdown_per_rank: np.ndarray) -> SimResult:
    """Simulate `graph` with each compute task stretched by the communication of its rank that
    overlaps it (module docstring); `slowdown_per_rank[r]` is s of rank r's GPU. The result's
    graph carries the stretched durations. All s zero: exactly `simulate(graph)`."""
    rank_of_task = graph.resource_rank[graph.resource]
    compute = graph.category == Category.COMPUTE
    s = np.asarray(slowdown_per_rank, dtype=np.float64)[rank_of_task]
    comm = graph.category == Category.COMMUNICATION
    return _stretched(graph, np.where(compute, s, 0.0), lambda rank: comm & (rank_of_task == rank))


def simulate_with_corunning(graph: ExecGraph, slowdown_per_task: np.ndarray, node_of_rank: np.ndarray) -> SimResult:
    """Simulate `graph` with each compute task stretched by the compute of the other ranks of its node
    that overlaps it (module docstring); `slowdown_per_task[t]` is s of task t (co-running / alone
    seconds − 1; read for compute tasks only), `node_of_rank[r]` the node of rank r. The result's
    graph carries the stretched durations. All s zero: exactly `simulate(graph)`."""
    rank_of_task = graph.resource_rank[graph.resource]
    node_of_task = np.asarray(node_of_rank)[rank_of_task]
    compute = graph.category == Category.COMPUTE
    s = np.where(compute, np.asarray(slowdown_per_task, dtype=np.float64), 0.0)
    node_of = dict(zip(rank_of_task.tolist(), node_of_task.tolist(), strict=True))
    return _stretched(graph, s, lambda rank: compute & (node_of_task == node_of[rank]) & (rank_of_task != rank))


def _stretched(graph: ExecGraph, slowdown: np.ndarray, slowed_by: Callable[[int], np.ndarray]) -> SimResult:
    """The fixed point of the module docstring: each task t of rank r stretched by
    slowdown[t]/(1 + slowdown[t]) × the seconds of its span during which a task of `slowed_by(r)` runs."""
    rank_of_task = graph.resource_rank[graph.resource]
    stretch = slowdown / (1.0 + slowdown)
    sim = simulate(graph)
    if not stretch.any():
        return sim
    base = graph.duration_s
    for _ in range(MAX_ROUNDS):
        overlap_s = overlapped_s(sim, slowed_by, rank_of_task)
        new = simulate(graph.with_durations(base + stretch * overlap_s))
        moved = abs(new.step_time_s - sim.step_time_s)
        sim = new
        if moved <= TOLERANCE * sim.step_time_s:
            break
    return sim


def overlapped_s(sim: SimResult, slowed_by: Callable[[int], np.ndarray], rank_of_task: np.ndarray) -> np.ndarray:
    """Per task of rank r, the seconds of [start, end) during which at least one task of the mask
    `slowed_by(r)` runs."""
    out = np.zeros(sim.graph.num_tasks)
    for rank in np.unique(rank_of_task).tolist():
        mine, others = rank_of_task == rank, slowed_by(rank)
        lo, hi = _union(sim.start_s[others], sim.end_s[others])
        if lo.size:
            out[mine] = _covered_until(lo, hi, sim.end_s[mine]) - _covered_until(lo, hi, sim.start_s[mine])
    return out


def _union(start_s: np.ndarray, end_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals [lo, hi) covering the union of [start, end)."""
    keep = end_s > start_s
    order = np.argsort(start_s[keep], kind="stable")
    starts, ends = start_s[keep][order], np.maximum.accumulate(end_s[keep][order])
    if not starts.size:  # nothing in flight (a rank without communication: one GPU)
        return starts, ends
    new = np.ones(starts.size, dtype=bool)
    new[1:] = starts[1:] > ends[:-1]  # a gap before this interval: a new run starts
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, starts.size - 1)
    return starts[first], ends[last]


def _covered_until(lo: np.ndarray, hi: np.ndarray, t_s: np.ndarray) -> np.ndarray:
    """Seconds of the union of [lo, hi) before each time t."""
    before = np.concatenate([[0.0], np.cumsum(hi - lo)])  # covered before interval i starts
    i = np.searchsorted(lo, t_s, side="right") - 1  # the last interval starting at or before t
    inside = np.clip(t_s - lo[np.maximum(i, 0)], 0.0, (hi - lo)[np.maximum(i, 0)])
    return np.where(i >= 0, before[np.maximum(i, 0)] + inside, 0.0)
