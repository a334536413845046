"""Tensor-parallel size on a replayed CPU (gloo) trace: `replay --tp N` (issue 30 item 3; DESIGN.md §4, §7).

Megatron-style tensor parallelism (Shoeybi et al. 2019, "Megatron-LM", §3, Fig. 3) splits each
layer's weights over the TP group: a column-parallel GEMM's output dimension and the next
row-parallel GEMM's contraction dimension hold F/t of a full F, and the row-parallel output is
all-reduced (the g operator forward; the f operator all-reduces the column-parallel input gradient
backward: megatron/core/tensor_parallel/mappings.py). Either way a TP all-reduce reduces the output of a
GEMM whose contraction is a sharded dimension. From a trace at TP t:

- t and the TP collectives: the trace's process groups (`distributedInfo.pg_config`) name a
  tensor-parallel group (pg_desc TENSOR_MODEL_PARALLEL_GROUP as Megatron-Core's parallel_state.py
  names it, or `tp`) over every rank: gloo collectives record no group, so only then are they all
  TP's. Otherwise refused, as are GPU traces (their kernels are not the operators read here).
- the sharded sizes: for each TP all-reduce, the contraction of the last GEMM (costs/aten_ops.GEMM_OPS)
  launched before it on its thread whose output has the all-reduce's elements.
- sharded work: on that thread, from the first GEMM carrying a sharded size after a TP all-reduce
  (or the step's start) up to the next TP all-reduce (or the step's end), each top-level operator
  whose dims (its own or its children's) carry a sharded size (an operator that encloses a TP
  all-reduce, as the f/g autograd functions do, counts by its children: its wait is not work).
  Before that first GEMM the replicated work runs (bias after the reduction, norms, residuals, the loss): kept.

Re-timing for TP N: a sharded operator's time × t/N (a GEMM's FLOPs are linear in its one sharded
dimension, an elementwise operator's bytes too), added to the host piece that held it; the gaps
between operators (Python, dispatch) keep their measured time: the same operators run. TP
all-reduces keep their bytes and are re-timed by the collective model's ratio for N ranks over t
(parallel_whatifs.group_time_ratio, as `--dp` does); at N = 1 they go. The what-if's N ranks are
simulated by the trace's t, each standing for N/t (DESIGN.md §3 symmetry). Approximation: where a
sharded size equals a replicated dimension (4h/t = h at t = 4), replicated operators inside a
sharded stretch that carry it scale too (the g operator's copy of its input).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import numpy as np

from itercast.config.job import load_system
from itercast.costs.analytic import AnalyticCostModel
from itercast.costs.aten_ops import GEMM_OPS
from itercast.errors import ConfigError
from itercast.traces.cpu_collectives import CPU_ELEMENT_BYTES, CpuCollective, level_ops, with_collective_marks
from itercast.traces.kineto import RankTrace
from itercast.traces.parallel_whatifs import CPU_SYSTEM, group_time_ratio, retime_cpu_collective
from itercast.traces.replay_graph import ReplayGraph

#: process-group descriptions of a TP group: Megatron-Core's (parallel_state.py) and a plain `tp`
TP_GROUP = re.compile(r"tensor_model_parallel|^tp$", re.IGNORECASE)


def tensor_parallel_size(traces: list[RankTrace]) -> int:
    """The traces' TP size: that of their named TP group, which must span every rank (module docstring)."""
    sizes = {
        g.get("pg_size")
        for t in traces
        for g in t.process_groups
        if isinstance(g.get("pg_desc"), str) and TP_GROUP.search(g["pg_desc"])
    }
    world = max((t.world_size or 0 for t in traces), default=0)
    if not sizes:
        raise ConfigError(
            "--tp: the traces name no tensor-parallel process group (distributedInfo.pg_config with pg_desc "
            "TENSOR_MODEL_PARALLEL_GROUP or tp): their TP collectives cannot be identified"
        )
    if sizes != {world} or world < 2:
        raise ConfigError(
            f"--tp: expected one tensor-parallel group over all {world} ranks (gloo collectives record no "
            f"group, so only then are they all TP's); got groups of {sorted(map(str, sizes))} ranks"
        )
    if any(t.num_ops for t in traces):
        raise ConfigError("--tp: re-times a CPU (gloo) trace's operators; these traces hold GPU ops")
    return world


def retime_tensor_parallel(
    rg: ReplayGraph,
    traces: list[RankTrace],
    tp: int,
    durations: np.ndarray,
    changes: Counter,
    curves: dict[str, Any] | None = None,
    host_cores: int | None = None,
) -> np.ndarray:
    """Re-time `durations` from the traces' TP size to `tp` (module docstring); returns the tasks
    that no longer rendezvous (every TP all-reduce at `tp` 1). `host_cores`: the one host's cores,
    for the all-reduces' scheduler waits (parallel_whatifs.retime_cpu_collective)."""
    if tp < 1:
        raise ConfigError(f"--tp: expected a tensor-parallel size ≥ 1; got {tp}")
    old = tensor_parallel_size(traces)
    for index, trace in enumerate(traces):
        rank = trace.rank if trace.rank is not None else index
        view, collectives = with_collective_marks(trace, Counter())
        delta_us = _sharded_us(view, collectives, old, tp, changes)
        for tid, per_op in delta_us.items():
            _add_to_pieces(rg, view, rank, tid, per_op, durations)
    model = AnalyticCostModel(load_system(CPU_SYSTEM), "bf16", curves)
    reduces = [task for task, m in rg.cpu_comm.items() if m["kind"] == "all_reduce"]
    for task in reduces:
        nbytes = rg.cpu_comm[task]["nbytes"]
        if not nbytes:
            changes["TP all-reduces kept at measured time (no dims recorded)"] += 1
            continue
        if host_cores is None:
            durations[task] *= group_time_ratio(model, "all_reduce", nbytes, old, tp)
        else:
            durations[task] = retime_cpu_collective(
                model, "all_reduce", nbytes, old, tp, float(durations[task]), host_cores
            )
        changes[f"TP all_reduce re-timed from {old} to {tp} ranks on {CPU_SYSTEM}'s model"] += 1
    return np.array(reduces, np.int64) if tp == 1 else np.zeros(0, np.int64)


def _sharded_us(
    t: RankTrace, collectives: list[CpuCollective], old: int, new: int, changes: Counter
) -> dict[int, list[tuple[float, float]]]:
    """Per launching thread: (start µs, change of time µs) of each sharded top-level operator."""
    out: dict[int, list[tuple[float, float]]] = {}
    launches = [(float(t.call_ts_us[c.launch_call]), int(t.call_tid[c.launch_call]), c) for c in collectives]
    for tid in sorted({tid for _, tid, c in launches if c.kind == "all_reduce"}):
        own = np.flatnonzero(t.cpu_tid == tid)
        own = own[np.lexsort((-t.cpu_dur_us[own], t.cpu_ts_us[own]))]
        gemms = {int(k): d for k in own.tolist() if (d := _gemm_dims(t, int(k))) is not None}
        reduce_at = sorted(ts for ts, th, c in launches if th == tid and c.kind == "all_reduce")
        sizes = _sharded_sizes(t, gemms, [c for _, th, c in launches if th == tid and c.kind == "all_reduce"])
        if not sizes:
            raise ConfigError(
                f"{t.path}: --tp: no TP all-reduce reduces a GEMM's output (Megatron's row-parallel "
                "layer or column-parallel input gradient): the sharded dimension cannot be identified"
            )
        carries = np.array([bool(_dims_of(t.cpu_input_dims[k]) & sizes) for k in own.tolist()], dtype=bool)
        sharded_gemm = np.array([k in gemms and bool(set(gemms[k]) & sizes) for k in own.tolist()], dtype=bool)
        ts = t.cpu_ts_us[own]
        bounds = np.sort(np.concatenate([reduce_at, [s_[2] for s_ in t.steps if s_[1] == tid]]))
        rows, opened = [], -1  # opened: the stretch (between two bounds) whose sharded work has begun
        launch_ops = [k for k in own.tolist() if t.names[t.cpu_name[k]] == "c10d::allreduce_"]
        for top in level_ops(t, tid, launch_ops).tolist():
            start_us, dur_us = float(t.cpu_ts_us[top]), float(t.cpu_dur_us[top])
            lo, hi = np.searchsorted(ts, [start_us, start_us + dur_us], side="left")
            stretch = int(np.searchsorted(bounds, start_us, side="right"))
            if sharded_gemm[lo : max(hi, lo + 1)].any():
                opened = stretch
            if opened == stretch and carries[lo : max(hi, lo + 1)].any():
                rows.append((start_us, dur_us * (old / new - 1.0)))
        changes[f"sharded operators re-timed × {old}/{new} (sharded sizes {sorted(sizes)})"] += len(rows)
        out[tid] = rows
    return out


def _sharded_sizes(t: RankTrace, gemms: dict[int, tuple[int, int, int]], reduces: list[CpuCollective]) -> set[int]:
    """The contraction of the last GEMM before each all-reduce's launch whose output (rows × n) has
    the all-reduce's elements."""
    order = sorted(gemms, key=lambda k: float(t.cpu_ts_us[k]))
    starts = np.array([t.cpu_ts_us[k] for k in order])
    sizes = set()
    for c in reduces:
        upto = int(np.searchsorted(starts, t.call_ts_us[c.launch_call], side="left"))
        for k in reversed(order[:upto]):
            rows, inner, n = gemms[k]
            if c.nbytes is not None and rows * n * CPU_ELEMENT_BYTES == c.nbytes:
                sizes.add(inner)
                break
    return sizes


def _gemm_dims(t: RankTrace, k: int) -> tuple[int, int, int] | None:
    """(rows, contraction, columns) of a GEMM operator from its input dims (a batch folds into rows)."""
    name = t.names[t.cpu_name[k]]
    if name not in GEMM_OPS:
        return None
    try:
        shapes = json.loads(t.cpu_input_dims[k])
        a, b = shapes[GEMM_OPS[name]], shapes[GEMM_OPS[name] + 1]
        return int(np.prod(a[:-1])), int(a[-1]), int(b[-1])
    except (ValueError, IndexError, TypeError):
        return None


def _dims_of(dims_json: str) -> set[int]:
    """Every dimension of every tensor in an operator's "Input Dims"."""
    try:
        found = json.loads(dims_json) if dims_json else []
    except ValueError:
        return set()
    out: set[int] = set()
    stack = [found]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, int):
            out.add(item)
    return out


def _add_to_pieces(
    rg: ReplayGraph, t: RankTrace, rank: int, tid: int, rows: list[tuple[float, float]], durations: np.ndarray
) -> None:
    """Add each (start µs, change µs) to the host piece of thread `tid` that held that start: the
    thread's pieces end, in order, at its runtime calls and step bounds (replay_graph._chain)."""
    chain, g = rg.host[rank], rg.graph
    kind = g.kinds.index(f"host:{tid}")
    res = g.resource[chain.piece_task]
    pieces = np.sort(chain.piece_task[(g.resource_kind[res] == kind) & (g.resource_rank[res] == rank)])
    cuts = [x for _, s_tid, ts, dur in t.steps if s_tid == tid for x in (ts, ts + dur)]
    ends = np.sort(np.concatenate([t.call_ts_us[t.call_tid == tid], cuts]))
    if ends.shape[0] != pieces.shape[0]:
        raise ConfigError(f"{t.path}: --tp: thread {tid}'s host pieces do not follow its calls and steps")
    for start_us, change_us in rows:
        piece = int(pieces[min(int(np.searchsorted(ends, start_us, side="right")), pieces.shape[0] - 1)])
        durations[piece] = max(0.0, durations[piece] + change_us * 1e-6)
