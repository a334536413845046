"""The simulator: exact max-plus evaluation of an ExecGraph (DESIGN.md §3).

Semantics (these rules *are* the simulator):
1. A task starts when all its predecessors have ended (plus the edge's latency) and its resource is
   free. Tasks on one resource run one at a time, in the order the graph gives (stream order).
2. Edges carry an optional latency in seconds (e.g. CPU launch → kernel start).
3. A collective is one logical operation with a member task on each participating rank. All members
   start together when the last member is ready (rendezvous); each then runs for its duration.
4. Host effects (dispatch, launch, synchronisation, gaps) are ordinary tasks on host resources.

With a fixed order per resource this is a longest-path computation:
    start(v) = max(end(u) + latency(u→v) for predecessors u, end(previous task on v's resource)),
maximised jointly over the members of a collective. Collectives are contracted to one node; a
cycle in the contracted graph is a deadlock and is reported with the tasks on it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from itercast.errors import DeadlockError
from itercast.graph.execgraph import ExecGraph


@dataclass(frozen=True)
class CompiledGraph:
    """Structure of a graph prepared for evaluation (independent of durations).

    order: node ids in topological order (a node is a task, or the first member of a collective);
    members[node]: the tasks of a collective node; predecessors of task t (explicit edges and the
    previous task on its resource) are in_src[in_ptr[t]:in_ptr[t+1]] with latencies in in_lat.
    """

    order: list[int]
    members: dict[int, list[int]]
    in_ptr: list[int]
    in_src: list[int]
    in_lat: list[float]

    def predecessors(self, task: int) -> list[tuple[int, float]]:
        lo, hi = self.in_ptr[task], self.in_ptr[task + 1]
        return list(zip(self.in_src[lo:hi], self.in_lat[lo:hi], strict=True))


@dataclass
class SimResult:
    """Times of one simulated step. `binding[t]` is the predecessor whose end set t's start (-1: none)."""

    graph: ExecGraph
    start_s: np.ndarray
    end_s: np.ndarray
    binding: np.ndarray

    @property
    def step_time_s(self) -> float:
        return float(self.end_s.max()) if self.end_s.size else 0.0

    @property
    def final_task(self) -> int:
        return int(np.argmax(self.end_s))


def compile_graph(graph: ExecGraph) -> CompiledGraph:
    """Add stream-order edges, contract collectives, sort topologically (Kahn); cache on the graph."""
    if graph._order is not None:
        return graph._order  # type: ignore[return-value]
    n = graph.num_tasks
    by_res = np.argsort(graph.resource, kind="stable")
    same = graph.resource[by_res[1:]] == graph.resource[by_res[:-1]]
    src = np.concatenate([graph.edge_src, by_res[:-1][same]])
    dst = np.concatenate([graph.edge_dst, by_res[1:][same]])
    lat = np.concatenate([graph.edge_latency_s, np.zeros(int(same.sum()))])
    node_of = np.arange(n)
    coll = graph.collective
    in_coll = np.flatnonzero(coll >= 0)
    members: dict[int, list[int]] = {}
    if in_coll.size:
        ids, first = np.unique(coll[in_coll], return_index=True)
        head_of = dict(zip(ids.tolist(), in_coll[first].tolist(), strict=True))
        for t, c in zip(in_coll.tolist(), coll[in_coll].tolist(), strict=True):
            node_of[t] = head_of[c]
            members.setdefault(head_of[c], []).append(t)
    u, v = node_of[src], node_of[dst]
    loops = np.flatnonzero(u == v)
    if loops.size:
        k = int(loops[0])
        raise DeadlockError(
            f"deadlock: collective member {graph.task_label(int(dst[k]))} depends on "
            f"{graph.task_label(int(src[k]))} of the same collective"
        )
    by_dst = np.argsort(dst, kind="stable")
    in_ptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))]).tolist()
    by_u = np.argsort(u, kind="stable")
    out_ptr = np.concatenate([[0], np.cumsum(np.bincount(u, minlength=n))]).tolist()
    out_v = v[by_u].tolist()
    indeg = np.bincount(v, minlength=n).tolist()
    heads = np.flatnonzero(node_of == np.arange(n)).tolist()
    queue = deque(x for x in heads if indeg[x] == 0)
    order: list[int] = []
    while queue:
        x = queue.popleft()
        order.append(x)
        for y in out_v[out_ptr[x] : out_ptr[x + 1]]:
            indeg[y] -= 1
            if indeg[y] == 0:
                queue.append(y)
    compiled = CompiledGraph(order, members, in_ptr, src[by_dst].tolist(), lat[by_dst].tolist())
    if len(order) != len(heads):
        raise DeadlockError(_describe_cycle(graph, compiled, node_of.tolist(), indeg))
    graph._order = compiled  # type: ignore[assignment]
    return compiled


def simulate(graph: ExecGraph) -> SimResult:
    """Evaluate the step with scalar durations: start/end per task and the binding predecessor."""
    if graph.duration_s.ndim != 1:
        raise ValueError("simulate() takes scalar durations; sampled durations go to Monte Carlo")
    compiled = compile_graph(graph)
    dur = graph.duration_s.tolist()
    n = len(dur)
    start = [0.0] * n
    end = [0.0] * n
    binding = [-1] * n
    ptr, in_src, in_lat, members = compiled.in_ptr, compiled.in_src, compiled.in_lat, compiled.members
    for v in compiled.order:
        group = members.get(v, (v,))
        best, arg = 0.0, -1
        for t in group:
            for k in range(ptr[t], ptr[t + 1]):
                e = end[in_src[k]] + in_lat[k]
                if e > best:
                    best, arg = e, in_src[k]
        for t in group:
            start[t], end[t], binding[t] = best, best + dur[t], arg
    return SimResult(graph, np.asarray(start), np.asarray(end), np.asarray(binding, dtype=np.int64))


def _describe_cycle(graph: ExecGraph, compiled: CompiledGraph, node_of: list[int], indeg: list[int]) -> str:
    """Walk predecessors among unprocessed nodes until one repeats; name the tasks on that loop."""
    stuck = {node_of[t] for t in range(len(node_of)) if indeg[node_of[t]] > 0}
    preds: dict[int, int] = {}
    for t in range(len(node_of)):
        v = node_of[t]
        if v in stuck:
            for s, _ in compiled.predecessors(t):
                if node_of[s] in stuck:
                    preds.setdefault(v, node_of[s])
    v = next(iter(stuck))
    seen: list[int] = []
    while v not in seen:
        seen.append(v)
        v = preds[v]
    loop = seen[seen.index(v) :]
    labels = " → ".join(graph.task_label(t) for t in reversed(loop[:10]))
    more = f" (+{len(loop) - 10} more)" if len(loop) > 10 else ""
    return f"deadlock: {len(stuck)} tasks can never start; cycle: {labels}{more}"
