"""A pipeline stage's measured step, read from its trace (DESIGN.md §7; issue 30 item 3).

A stage of a CPU pipeline run (gloo: `c10d::recv_` and `c10d::send` ops on the thread that also
computes; torch.distributed point-to-point) runs, per step, one forward and one backward unit per
micro-batch. Each unit is read from that thread's top-level ops inside the step (ProfilerStep):

- a receive opens a unit of the direction that follows it (forward when the next compute op is not
  an autograd op, backward when it is: `autograd::engine::evaluate_function: …`, which CPU autograd
  runs on the calling thread); in a direction the stage does not receive (the first stage's
  forwards, the last stage's backwards), the unit opens at its first op after the previous send;
- a send closes the unit of its direction (the direction of the compute op before it), and so does
  a compute op of the other direction (the last stage turns from its last forward to its first
  backward without a send or a receive);
- ops outside any unit (zero_grad before a receiving stage's first unit, the optimizer after the
  last) are the stage's other work (`rest_s`).

A unit's work is the time of its ops and of the gaps before them (the thread's Python between
operators), in µs as measured; the time inside receives (waiting for the peer, then the copy) and
the gaps in which one of the stage's sends completed (gloo:send annotations end when `wait()`
returns: the thread waited for its sends) are not work: the what-if re-creates those waits. An
approximation: work before the first stage's first forward op (zero_grad) counts in its first
forward unit, and the first stage's work after its last send is other work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from itercast.errors import ConfigError
from itercast.traces.cpu_collectives import tensor_bytes
from itercast.traces.host_waits import EPS_US
from itercast.traces.kineto import RankTrace

RECV, SEND = "c10d::recv", "c10d::send"
#: the top-level op of each backward function that CPU autograd runs (torch/csrc/autograd/engine.cpp
#: names its RECORD_FUNCTION "autograd::engine::evaluate_function: <node>")
BACKWARD_OP = "autograd::engine::evaluate_function"
FORWARD, BACKWARD = "F", "B"
#: (from µs, to µs) → the work (µs) done alone in each stretch: divides out a shared host's slowdown
AloneUs = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class StageStep:
    """One measured step of one stage: the work (s) of each micro-batch's forward and backward
    unit, the stage's other work, its units in the order it ran them ((direction, micro-batch)),
    and the bytes of one activation it sends or receives (None: no dims recorded)."""

    rank: int
    step: int
    forward_s: np.ndarray
    backward_s: np.ndarray
    rest_s: float
    order: tuple[tuple[str, int], ...]
    activation_bytes: float | None

    @property
    def micro_batches(self) -> int:
        return int(self.forward_s.shape[0])


def stage_steps(t: RankTrace, rank: int, alone_us: AloneUs | None = None) -> list[StageStep]:
    """Every step of a stage's trace (module docstring); ConfigError where a step is not a pipeline
    step (no sends or receives, unequal forward and backward units). `alone_us`: the work done
    alone in each measured stretch (sim/sharing.shared_work_s), to divide out the host's sharing."""
    send_ends = _send_ends(t)
    out = []
    for number, tid, ts, dur in t.steps:
        top = _step_ops(t, tid, ts, dur)
        out.append(_stage_step(t, rank, number, top, (ts, ts + dur), send_ends, alone_us))
    return out


def work_stretches_us(t: RankTrace) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (µs) of each stretch in which a stage's thread worked in its steps (its ops
    and the gaps before them; not its receives, nor the gaps in which it waited for its sends)."""
    send_ends = _send_ends(t)
    starts, ends = [], []
    for _, tid, ts, dur in t.steps:
        work_us, stop_us = _work_us(t, _step_ops(t, tid, ts, dur), (ts, ts + dur), send_ends)
        starts.append(stop_us - work_us)
        ends.append(stop_us)
    return (np.concatenate(starts), np.concatenate(ends)) if starts else (np.zeros(0), np.zeros(0))


def _send_ends(t: RankTrace) -> np.ndarray:
    is_send = np.array([t.names[n] == "gloo:send" for n in t.comm_name.tolist()], dtype=bool)
    return np.sort((t.comm_ts_us + t.comm_dur_us)[is_send]) if is_send.size else np.zeros(0)


def _step_ops(t: RankTrace, tid: int, ts: float, dur: float) -> np.ndarray:
    top = t.top_level_ops(tid)
    return top[(t.cpu_ts_us[top] >= ts) & (t.cpu_ts_us[top] < ts + dur)]


def _stage_step(
    t: RankTrace,
    rank: int,
    number: int,
    top: np.ndarray,
    span_us: tuple[float, float],
    send_ends: np.ndarray,
    alone_us: AloneUs | None,
) -> StageStep:
    items, rest_us = _items(t, top, span_us, send_ends, alone_us)
    counts = {(kind, d): sum(1 for k, dd, _, _ in items if (k, dd) == (kind, d)) for kind in "rs" for d in "fb"}
    units_f, units_b = max(counts[("r", "f")], counts[("s", "f")]), max(counts[("r", "b")], counts[("s", "b")])
    where = f"{t.path}: step {number}"
    if units_f == 0 or units_f != units_b:
        raise ConfigError(
            f"{where}: expected one forward and one backward send or receive per micro-batch; got "
            f"{units_f} forward and {units_b} backward"
        )
    work = {FORWARD: np.zeros(units_f), BACKWARD: np.zeros(units_f)}
    receives = {d: counts[("r", d)] > 0 for d in "fb"}
    opened = {"f": -1, "b": -1}  # the open unit of each direction (−1: none)
    seen = {("r", d): 0 for d in "fb"} | {("s", d): 0 for d in "fb"}
    order: list[tuple[str, int]] = []
    activation = None
    for kind, d, work_us, op in items:
        if kind == "r":
            opened = {"f": -1, "b": -1}
            opened[d] = seen[("r", d)]
            seen[("r", d)] += 1
            order.append((FORWARD if d == "f" else BACKWARD, opened[d]))
            activation = activation or tensor_bytes(t.cpu_input_dims[op])
            continue
        if kind == "c":
            opened["b" if d == "f" else "f"] = -1
            if opened[d] < 0 and not receives[d] and seen[("s", d)] < units_f:
                opened[d] = seen[("s", d)]
                order.append((FORWARD if d == "f" else BACKWARD, opened[d]))
        unit = opened[d]
        if unit >= 0:
            work[FORWARD if d == "f" else BACKWARD][unit] += work_us * 1e-6
        else:
            rest_us += work_us
        if kind == "s":
            seen[("s", d)] += 1
            opened[d] = -1
            activation = tensor_bytes(t.cpu_input_dims[op]) or activation
    if sorted(order) != sorted((x, k) for x in (FORWARD, BACKWARD) for k in range(units_f)):
        raise ConfigError(f"{where}: micro-batch units not read one by one (ran {_describe(order)})")
    return StageStep(rank, number, work[FORWARD], work[BACKWARD], rest_us * 1e-6, tuple(order), activation)


def _work_us(
    t: RankTrace, top: np.ndarray, span_us: tuple[float, float], send_ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per top-level op, then the step's trailing gap: the work (µs: the op's time not overlapping
    earlier ops, and the gap before it unless one of the stage's sends completed in it; 0 for a
    receive) and where that work ends (µs)."""
    start, end = t.cpu_ts_us[top], t.cpu_ts_us[top] + t.cpu_dur_us[top]
    cursor = np.maximum.accumulate(np.concatenate([[span_us[0]], end]))
    gap = np.maximum(0.0, np.append(start, span_us[1]) - cursor)
    waited = np.searchsorted(send_ends, np.append(start, span_us[1]) + EPS_US, side="right") > np.searchsorted(
        send_ends, cursor - EPS_US, side="left"
    )
    gap = np.where(waited, 0.0, gap)
    receive = np.array([t.names[t.cpu_name[k]].startswith(RECV) for k in top.tolist()], dtype=bool)
    own = np.where(receive, 0.0, gap[:-1] + end - np.maximum(start, cursor[:-1]))
    return np.append(own, gap[-1]), np.append(end, span_us[1])


def _items(
    t: RankTrace, top: np.ndarray, span_us: tuple[float, float], send_ends: np.ndarray, alone_us: AloneUs | None
) -> tuple[list[tuple[str, str, float, int]], float]:
    """(kind: r receive, s send, c compute; direction f/b; work µs; op) per top-level op, and the
    step's trailing gap (µs: other work, unless a send completed in it)."""
    work, stop = _work_us(t, top, span_us, send_ends)
    if alone_us is not None:
        work = alone_us(stop - work, stop)
    names = [t.names[t.cpu_name[k]] for k in top.tolist()]
    direction = ["b" if n.startswith(BACKWARD_OP) else "f" for n in names]
    kinds = ["r" if n.startswith(RECV) else "s" if n.startswith(SEND) else "c" for n in names]
    items: list[tuple[str, str, float, int]] = []
    for i, (kind, op) in enumerate(zip(kinds, top.tolist(), strict=True)):
        if kind == "r":  # the direction of the compute op after it
            d = next((direction[j] for j in range(i + 1, len(kinds)) if kinds[j] == "c"), "f")
        elif kind == "s":  # the direction of the compute op before it
            d = next((direction[j] for j in range(i - 1, -1, -1) if kinds[j] == "c"), "f")
        else:
            d = direction[i]
        items.append((kind, d, float(work[i]), op))
    return items, float(work[-1])


def _describe(order: list[tuple[str, int]]) -> str:
    return " ".join(f"{d}{k}" for d, k in order) or "nothing"
