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

    order: node ids (a node = a task, or the first member of a collective) in topological order;
    members[node]: its tasks; incoming[task]: (predecessor, latency) pairs incl. resource order.
    """

    order: list[int]
    members: dict[int, list[int]]
    incoming: list[list[tuple[int, float]]]


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
    incoming: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for s, d, lat in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_latency_s.tolist(), strict=False):
        incoming[d].append((s, lat))
    last_on: dict[int, int] = {}
    for t, r in enumerate(graph.resource.tolist()):
        prev = last_on.get(r)
        if prev is not None:
            incoming[t].append((prev, 0.0))
        last_on[r] = t
    node_of = list(range(n))
    members: dict[int, list[int]] = {}
    first_of: dict[int, int] = {}
    for t, c in enumerate(graph.collective.tolist()):
        if c >= 0:
            head = first_of.setdefault(c, t)
            node_of[t] = head
            members.setdefault(head, []).append(t)
    succ: dict[int, list[int]] = {}
    indeg = [0] * n
    for t in range(n):
        v = node_of[t]
        for s, _ in incoming[t]:
            u = node_of[s]
            if u == v:
                raise DeadlockError(
                    f"deadlock: collective member {graph.task_label(t)} depends on "
                    f"{graph.task_label(s)} of the same collective"
                )
            succ.setdefault(u, []).append(v)
            indeg[v] += 1
    heads = [t for t in range(n) if node_of[t] == t]
    queue = deque(v for v in heads if indeg[v] == 0)
    order: list[int] = []
    while queue:
        u = queue.popleft()
        order.append(u)
        for v in succ.get(u, ()):
            indeg[v] -= 1
            if indeg[v] == 0:
                queue.append(v)
    if len(order) != len(heads):
        raise DeadlockError(_describe_cycle(graph, incoming, node_of, indeg))
    compiled = CompiledGraph(order, members, incoming)
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
    incoming, members = compiled.incoming, compiled.members
    for v in compiled.order:
        group = members.get(v)
        if group is None:
            best, arg = 0.0, -1
            for s, lat in incoming[v]:
                e = end[s] + lat
                if e > best:
                    best, arg = e, s
            start[v], end[v], binding[v] = best, best + dur[v], arg
            continue
        best, arg = 0.0, -1
        for t in group:
            for s, lat in incoming[t]:
                e = end[s] + lat
                if e > best:
                    best, arg = e, s
        for t in group:
            start[t], end[t], binding[t] = best, best + dur[t], arg
    return SimResult(graph, np.asarray(start), np.asarray(end), np.asarray(binding, dtype=np.int64))


def _describe_cycle(
    graph: ExecGraph, incoming: list[list[tuple[int, float]]], node_of: list[int], indeg: list[int]
) -> str:
    """Walk predecessors among unprocessed nodes until one repeats; name the tasks on that loop."""
    stuck = {node_of[t] for t in range(len(node_of)) if indeg[node_of[t]] > 0}
    preds: dict[int, int] = {}
    for t in range(len(node_of)):
        v = node_of[t]
        if v in stuck:
            for s, _ in incoming[t]:
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
