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

from dataclasses import dataclass

import numpy as np

from itercast.errors import DeadlockError
from itercast.graph.execgraph import ExecGraph
from itercast.sim.kernels import run_max_plus, run_topological_order


@dataclass(frozen=True)
class CompiledGraph:
    """Structure of a graph prepared for evaluation (independent of durations), as flat arrays.

    order: node heads in topological order (a node is a task, or the first member of a collective);
    the tasks of order[i] are grp_tasks[grp_ptr[i]:grp_ptr[i+1]]; predecessors of task t (explicit
    edges and the previous task on its resource) are in_src[in_ptr[t]:in_ptr[t+1]], latencies in_lat.
    """

    order: np.ndarray
    grp_ptr: np.ndarray
    grp_tasks: np.ndarray
    in_ptr: np.ndarray
    in_src: np.ndarray
    in_lat: np.ndarray

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The structure the kernels take: (order, grp_ptr, grp_tasks, in_ptr, in_src, in_lat)."""
        return self.order, self.grp_ptr, self.grp_tasks, self.in_ptr, self.in_src, self.in_lat

    def predecessors(self, task: int) -> list[tuple[int, float]]:
        lo, hi = int(self.in_ptr[task]), int(self.in_ptr[task + 1])
        return list(zip(self.in_src[lo:hi].tolist(), self.in_lat[lo:hi].tolist(), strict=True))


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
    """Add stream-order edges, contract collectives, sort topologically (Kahn); cache on the graph.

    Indices are int32 (a graph has fewer than 2^31 tasks) and every temporary is dropped as soon as
    it is used: this is the peak of a trace replay's memory (benchmarks/replay_memory.py)."""
    if graph._order is not None:
        return graph._order  # type: ignore[return-value]
    n = graph.num_tasks
    idx = np.int32 if n < 2**31 - 1 else np.int64
    by_res = np.argsort(graph.resource, kind="stable").astype(idx)
    same = graph.resource[by_res[1:]] == graph.resource[by_res[:-1]]
    src = np.concatenate([graph.edge_src.astype(idx), by_res[:-1][same]])
    dst = np.concatenate([graph.edge_dst.astype(idx), by_res[1:][same]])
    lat = np.concatenate([graph.edge_latency_s, np.zeros(int(same.sum()))])
    del by_res, same
    node_of = _collective_heads(graph.collective).astype(idx)
    u, v = node_of[src], node_of[dst]
    loops = np.flatnonzero(u == v)
    if loops.size:
        k = int(loops[0])
        raise DeadlockError(
            f"deadlock: collective member {graph.task_label(int(dst[k]))} depends on "
            f"{graph.task_label(int(src[k]))} of the same collective"
        )
    out_ptr = np.concatenate([[0], np.cumsum(np.bincount(u, minlength=n))]).astype(idx)
    succ = v[np.argsort(u, kind="stable")]
    del u
    is_head = node_of == np.arange(n, dtype=idx)
    order, indeg = run_topological_order(n, is_head, out_ptr, succ, np.bincount(v, minlength=n).astype(idx))
    del out_ptr, succ, v
    by_dst = np.argsort(dst, kind="stable")
    in_ptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))]).astype(idx)
    in_src, in_lat = src[by_dst], lat[by_dst]
    del src, lat, dst, by_dst
    if order.shape[0] != int(is_head.sum()):
        partial = CompiledGraph(order, order, order, in_ptr, in_src, in_lat)
        raise DeadlockError(_describe_cycle(graph, partial, node_of.tolist(), indeg.tolist()))
    del is_head, indeg
    # members of each node, in the order of `order`
    counts = np.bincount(node_of, minlength=n).astype(idx)
    first = np.concatenate([[0], np.cumsum(counts)]).astype(idx)
    lens = counts[order]
    grp_ptr = np.concatenate([[0], np.cumsum(lens)]).astype(idx)
    offsets = np.repeat(first[order] - grp_ptr[:-1], lens)  # gather each node's contiguous run of members
    del counts, first, lens
    offsets += np.arange(offsets.shape[0], dtype=idx)
    grp_tasks = np.argsort(node_of, kind="stable").astype(idx)[offsets]
    del offsets, node_of
    compiled = CompiledGraph(order, grp_ptr, grp_tasks, in_ptr, in_src, in_lat)
    graph._order = compiled  # type: ignore[assignment]
    return compiled


def _collective_heads(collective: np.ndarray) -> np.ndarray:
    """node_of[t]: t itself, or the first task of t's collective."""
    node_of = np.arange(collective.shape[0])
    in_coll = np.flatnonzero(collective >= 0)
    if in_coll.size:
        ids, inverse = np.unique(collective[in_coll], return_inverse=True)
        first = np.full(ids.shape[0], collective.shape[0])
        np.minimum.at(first, inverse, in_coll)
        node_of[in_coll] = first[inverse]
    return node_of


def simulate(graph: ExecGraph) -> SimResult:
    """Evaluate the step with scalar durations: start/end per task and the binding predecessor."""
    if graph.duration_s.ndim != 1:
        raise ValueError("simulate() takes scalar durations; sampled durations go to Monte Carlo")
    c = compile_graph(graph)
    start, end, binding = run_max_plus(c.arrays, graph.duration_s.astype(np.float64))
    return SimResult(graph, start, end, binding)


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
