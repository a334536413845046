"""Processor sharing of one host's cores by its ranks' CPU work (`replay --host-cores N`; issue 30).

When more CPU work is runnable on a host than it has cores, the OS scheduler shares them: each
runnable thread progresses at cores / runnable of its speed (processor sharing, the fluid limit of
round-robin time slices; Kleinrock, Queueing Systems vol. 2, §4.4). A thread that waits does not
count: c10d's `Work::wait` blocks on a condition variable (pytorch/pytorch
torch/csrc/distributed/c10d/Work.cpp: `cv_.wait(lock, ...)`), gloo's receives and sends wait on one
(pytorch/gloo gloo/transport/tcp/unbound_buffer.cc: `recvCv_.wait_for`, `sendCv_.wait_for`) and its
TCP loop sleeps in `epoll_wait` (gloo/transport/tcp/loop.cc): none of them polls a core.

In a replay graph a wait is an edge, not a task, so the rule is: every task that is not a GPU op
uses one core of the host while it runs (host threads' operators and the gaps between them, a gloo
worker's collective after the rendezvous, a loopback send: TCP on one host is copies by the CPU).
The load at time t is the sum of the running tasks' rank weights (a simulated rank that stands for
k symmetric ranks of the run weighs k, DESIGN.md §3 "scale by symmetry"); each such task then runs
at min(1, cores / load). Assumed: every rank of the run on one host (the gloo runs of
data/measured), and work that a shared core slows in proportion (no cache or memory-bandwidth
effects).

A measured trace was taken under its own sharing: `shared_work_s` divides it out (the work a task
would take alone); `simulate_shared` applies a target's.

A collective whose ranks outnumber the host's cores also waits for the scheduler at every round of its
ring: a rank's thread that a message wakes finds the cores taken and runs after a time slice
(`scheduler_wait_s`: rounds × the scheduler's base slice). The replay's `--dp`/`--tp` what-ifs take
the trace's waits out of its CPU collectives and add the target's (parallel_whatifs.retime_cpu_collective).
"""

from __future__ import annotations

import heapq

import numpy as np

from itercast.graph.execgraph import ExecGraph
from itercast.sim.engine import SimResult, compile_graph

#: op families of GPU tasks (traces/replay_graph.py): they run on the device, not on a host core
GPU_FAMILIES = ("kernel", "memcpy", "memset")
#: remaining work (s) below which a task is done: float round-off of the rate updates
DONE_S = 1e-12
#: the scheduler's time slice (s) before scaling: Linux EEVDF's `sysctl_sched_base_slice` = 0.75 ms
#: (kernel/sched/fair.c, normalized_sysctl_sched_base_slice), scaled by 1 + ilog2(min(cores, 8))
#: (`get_update_sysctl_factor`, SCHED_TUNABLESCALING_LOG, the default): 1.5 ms on 2 cores
BASE_SLICE_S = 0.75e-3
#: rounds of a collective over k ranks that each wait for a peer's message: gloo's ring all-reduce
#: (reduce-scatter then all-gather: 2(k − 1)), all-gather and all-to-all (k − 1). c10d's gloo
#: reduce-scatter is taken as an all-reduce's 2(k − 1): measured so on this host (below), source unread.
SCHEDULER_ROUNDS = {
    "all_reduce": lambda k: 2 * (k - 1),
    "reduce_scatter": lambda k: 2 * (k - 1),
    "all_gather": lambda k: k - 1,
    "alltoall": lambda k: k - 1,
}


def core_tasks(graph: ExecGraph) -> np.ndarray:
    """Per task: whether it uses a host core while it runs (module docstring)."""
    gpu = np.array([f in GPU_FAMILIES for f in graph.families], dtype=bool)
    return ~gpu[graph.family] if gpu.size else np.ones(graph.num_tasks, dtype=bool)


def shared_work_s(
    start_s: np.ndarray, end_s: np.ndarray, weight: np.ndarray, cores: float, from_s: np.ndarray, to_s: np.ndarray
) -> np.ndarray:
    """∫ min(1, cores / load(t)) dt from each `from_s` to `to_s` (s), where load(t) is the summed
    `weight` of the intervals [start_s, end_s) that hold t: the work done alone in that time."""
    times = np.concatenate([start_s, end_s])
    order = np.argsort(times, kind="stable")
    t = times[order]
    load = np.cumsum(np.concatenate([weight, -weight])[order])  # on [t[i], t[i + 1])
    rate = np.where(load > cores, cores / np.maximum(load, cores), 1.0)
    done = np.concatenate([[0.0], np.cumsum(rate[:-1] * np.diff(t))]) if t.size else np.zeros(1)
    at = t if t.size else np.zeros(1)
    return np.interp(to_s, at, done) - np.interp(from_s, at, done)


def scheduler_wait_s(kind: str, ranks: int, cores: int) -> float:
    """Seconds a collective of `ranks` processes on one host of `cores` cores waits for the scheduler:
    0 while every rank has a core; else one base slice × (1 + ilog2(min(cores, 8))) per round
    (SCHEDULER_ROUNDS; a kind without rounds there waits 0). Checked (not fitted) on this project's
    2-core VM, gloo collectives of 256 B–256 KiB measured by `itercast profile run --families collective
    --collective-ranks 2,3,4` (data/measured/gloo_collectives_oversubscribed.db), median over sizes:
    all-reduce 3 ranks 5.6 ms (predicted 6.0 + the 2-rank 0.9), 4 ranks 10.3 ms (9.0 + 0.9);
    all-gather 3.0 and 6.2 ms (3.0, 4.5 + 0.6); all-to-all 2.8 and 4.4 ms (3.0, 4.5 + 0.5). The ranks
    are every process on the host (the what-ifs' data- or tensor-parallel-only runs)."""
    if ranks <= cores or kind not in SCHEDULER_ROUNDS:
        return 0.0
    slice_s = BASE_SLICE_S * min(cores, 8).bit_length()  # 1 + ilog2
    return float(SCHEDULER_ROUNDS[kind](ranks)) * slice_s


def task_weights(graph: ExecGraph, weight_of_rank: dict[int, float]) -> np.ndarray:
    """Per task: the weight of its rank (1 where not given)."""
    ranks = graph.resource_rank[graph.resource]
    return np.array([weight_of_rank.get(int(r), 1.0) for r in ranks.tolist()], dtype=np.float64)


def resimulate_shared(
    measured: SimResult, graph: ExecGraph, cores: float, source: dict[int, float], target: dict[int, float]
) -> SimResult:
    """`graph` (the tasks of `measured.graph`, other durations) on `cores` shared at the `target`
    rank weights, each core task's duration first divided by the slowdown it had in `measured`
    at the `source` weights (its work alone: shared_work_s over its simulated span)."""
    core = core_tasks(measured.graph)
    s, e = measured.start_s[core], measured.end_s[core]
    alone = shared_work_s(s, e, task_weights(measured.graph, source)[core], cores, s, e)
    durations = graph.duration_s.astype(np.float64)
    durations[core] *= np.where(e > s, alone / np.where(e > s, e - s, 1.0), 1.0)
    return simulate_shared(graph.with_durations(durations), cores, target)


def simulate_shared(graph: ExecGraph, cores: float, weight_of_rank: dict[int, float]) -> SimResult:
    """Event-driven simulation of the graph's rules (engine.py) where the tasks that use a core
    (core_tasks) share `cores`: `duration_s` is each task's work alone; while the running core
    tasks weigh `load` (their ranks' weights), each progresses at min(1, cores / load)."""
    c = compile_graph(graph)
    n = graph.num_tasks
    uses_core = core_tasks(graph).tolist()
    weight = task_weights(graph, weight_of_rank).tolist()
    work = graph.duration_s.astype(np.float64).tolist()
    node_of = np.empty(n, dtype=np.int64)
    node_of[c.grp_tasks] = np.repeat(c.order, np.diff(c.grp_ptr))
    members: dict[int, list[int]] = {}
    for head, lo, hi in zip(c.order.tolist(), c.grp_ptr[:-1].tolist(), c.grp_ptr[1:].tolist(), strict=True):
        members[head] = c.grp_tasks[lo:hi].tolist()
    dst = np.repeat(np.arange(n), np.diff(c.in_ptr))
    by_src = np.argsort(c.in_src, kind="stable")
    out_ptr = np.concatenate([[0], np.cumsum(np.bincount(c.in_src, minlength=n))]).tolist()
    out_dst, out_lat = dst[by_src].tolist(), c.in_lat[by_src].tolist()
    pending = np.bincount(node_of[dst], minlength=n).tolist()
    ready, binding = [0.0] * n, [-1] * n
    start, end = [0.0] * n, [0.0] * n
    events = [(0.0, 0, head) for head in c.order.tolist() if pending[head] == 0]  # (time, 0 start | 1 end, id)
    heapq.heapify(events)
    running: dict[int, float] = {}  # core task -> work left (s)
    load, now = 0.0, 0.0

    def finish(task: int, at: float) -> None:
        end[task] = at
        for k in range(out_ptr[task], out_ptr[task + 1]):
            head = int(node_of[out_dst[k]])
            if at + out_lat[k] > ready[head] or binding[head] < 0:
                ready[head], binding[head] = max(ready[head], at + out_lat[k]), task
            pending[head] -= 1
            if pending[head] == 0:
                heapq.heappush(events, (ready[head], 0, head))

    while events or running:
        rate = min(1.0, cores / load) if load > cores else 1.0
        next_done = now + min(running.values()) / rate if running else np.inf
        at = min(next_done, events[0][0] if events else np.inf)
        for task in running:
            running[task] -= (at - now) * rate
        now = at
        for task in [t for t, left in running.items() if left <= DONE_S]:
            del running[task]
            load -= weight[task]
            finish(task, now)
        while events and events[0][0] <= now:
            _, kind, item = heapq.heappop(events)
            if kind == 1:
                finish(item, now)
                continue
            for task in members[item]:
                start[task] = now
                if uses_core[task] and work[task] > DONE_S:
                    running[task] = work[task]
                    load += weight[task]
                else:
                    heapq.heappush(events, (now + work[task], 1, task))
    # a collective's members start together: each task's binding predecessor is its node's
    return SimResult(graph, np.asarray(start), np.asarray(end), np.asarray(binding, dtype=np.int64)[node_of])
