"""The simulator's two loops as array kernels: Kahn's topological sort and the max-plus pass.

Written once in plain Python over flat arrays (CSR). With numba installed (`pip install
itercast[fast]`) they are compiled; without it the same functions run as Python over lists.
tests/test_sim_kernels.py checks that both give identical results.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

try:  # optional accelerator
    from numba import njit

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised where numba is absent
    HAVE_NUMBA = False


def topological_order(n: int, is_head: Any, out_ptr: Any, out_v: Any, indeg: Any, order: Any) -> int:
    """Kahn's algorithm on nodes 0..n−1 (only heads count); fills `order`, returns how many were placed.
    `indeg` is consumed. Fewer than the number of heads placed means a cycle."""
    head = 0
    tail = 0
    for v in range(n):
        if is_head[v] and indeg[v] == 0:
            order[tail] = v
            tail += 1
    while head < tail:
        u = order[head]
        head += 1
        for k in range(out_ptr[u], out_ptr[u + 1]):
            w = out_v[k]
            indeg[w] -= 1
            if indeg[w] == 0:
                order[tail] = w
                tail += 1
    return tail


def max_plus(
    order: Any,
    grp_ptr: Any,
    grp_tasks: Any,
    in_ptr: Any,
    in_src: Any,
    in_lat: Any,
    dur: Any,
    start: Any,
    end: Any,
    binding: Any,
) -> None:
    """start(v) = max(end(u) + latency) over v's predecessors, jointly over a collective's members;
    nodes visited in topological order; node i of `order` has tasks grp_tasks[grp_ptr[i]:grp_ptr[i+1]]."""
    for i in range(len(order)):
        best = 0.0
        arg = -1
        for j in range(grp_ptr[i], grp_ptr[i + 1]):
            t = grp_tasks[j]
            for k in range(in_ptr[t], in_ptr[t + 1]):
                e = end[in_src[k]] + in_lat[k]
                if e > best:
                    best = e
                    arg = in_src[k]
        for j in range(grp_ptr[i], grp_ptr[i + 1]):
            t = grp_tasks[j]
            start[t] = best
            end[t] = best + dur[t]
            binding[t] = arg


def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    return njit(cache=True, nogil=True)(fn) if HAVE_NUMBA else fn


topological_order_kernel = _compiled(topological_order)
max_plus_kernel = _compiled(max_plus)


def run_topological_order(
    n: int, is_head: np.ndarray, out_ptr: np.ndarray, out_v: np.ndarray, indeg: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(order of heads, remaining in-degrees), in the index dtype of `out_v`; `indeg` is consumed."""
    order = np.zeros(n, dtype=out_v.dtype)
    if HAVE_NUMBA:
        placed = topological_order_kernel(n, is_head, out_ptr, out_v, indeg, order)
        return order[:placed].copy(), indeg
    heads, ptr, succ, deg = (a.tolist() for a in (is_head, out_ptr, out_v, indeg))
    out = [0] * n
    placed = topological_order(n, heads, ptr, succ, deg, out)
    return np.asarray(out[:placed], dtype=out_v.dtype), np.asarray(deg, dtype=out_v.dtype)


#: a compiled graph's structure: (order, grp_ptr, grp_tasks, in_ptr, in_src, in_lat); see engine.CompiledGraph
Structure = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def run_max_plus(structure: Structure, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, binding) per task for scalar durations."""
    n = dur.shape[0]
    if HAVE_NUMBA:
        start, end, binding = np.zeros(n), np.zeros(n), np.full(n, -1, dtype=np.int64)
        max_plus_kernel(*structure, dur, start, end, binding)
        return start, end, binding
    start_l, end_l, bind_l = [0.0] * n, [0.0] * n, [-1] * n
    order, grp_ptr, grp_tasks, in_ptr, in_src, in_lat, dur_l = (a.tolist() for a in (*structure, dur))
    max_plus(order, grp_ptr, grp_tasks, in_ptr, in_src, in_lat, dur_l, start_l, end_l, bind_l)
    return np.asarray(start_l), np.asarray(end_l), np.asarray(bind_l, dtype=np.int64)


def max_plus_samples(
    order: Any, grp_ptr: Any, grp_tasks: Any, in_ptr: Any, in_src: Any, in_lat: Any, dur: Any, end: Any, ready: Any
) -> None:
    """`max_plus` for S samples at once: dur and end are (tasks, S); `ready` is scratch of length S.
    A node's start is the element-wise max over its predecessors' ends (+ latency)."""
    samples = dur.shape[1]
    for i in range(len(order)):
        for s in range(samples):
            ready[s] = 0.0
        for j in range(grp_ptr[i], grp_ptr[i + 1]):
            t = grp_tasks[j]
            for k in range(in_ptr[t], in_ptr[t + 1]):
                src = in_src[k]
                lat = in_lat[k]
                for s in range(samples):
                    e = end[src, s] + lat
                    if e > ready[s]:
                        ready[s] = e
        for j in range(grp_ptr[i], grp_ptr[i + 1]):
            t = grp_tasks[j]
            for s in range(samples):
                end[t, s] = ready[s] + dur[t, s]


max_plus_samples_kernel = _compiled(max_plus_samples)


def run_max_plus_samples(structure: Structure, dur: np.ndarray) -> np.ndarray:
    """End times (tasks, S) for sampled durations (tasks, S)."""
    end = np.zeros_like(dur)
    ready = np.zeros(dur.shape[1])
    if HAVE_NUMBA:
        max_plus_samples_kernel(*structure, dur, end, ready)
        return end
    order, grp_ptr, grp_tasks, in_ptr, in_src, in_lat = structure
    # Python path: vectorise over samples with numpy instead of a per-sample loop
    in_ptr_l, in_src_l, in_lat_l = in_ptr.tolist(), in_src.tolist(), in_lat.tolist()
    grp_l, tasks_l = grp_ptr.tolist(), grp_tasks.tolist()
    for i in range(order.shape[0]):
        r = np.zeros(dur.shape[1])
        members = tasks_l[grp_l[i] : grp_l[i + 1]]
        for t in members:
            for k in range(in_ptr_l[t], in_ptr_l[t + 1]):
                np.maximum(r, end[in_src_l[k]] + in_lat_l[k], out=r)
        for t in members:
            end[t] = r + dur[t]
    return end
