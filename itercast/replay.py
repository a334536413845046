"""`replay(paths)`: import Kineto traces, rebuild the step graph, simulate it, compare with the measurement."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from itercast.errors import ConfigError
from itercast.predict import summarise_path
from itercast.sim.analysis import Breakdown, breakdown
from itercast.sim.engine import SimResult, simulate
from itercast.sim.sharing import resimulate_shared, simulate_shared
from itercast.traces.execution_trace import link, other_process_note, read_execution_trace
from itercast.traces.kineto import RankTrace, TraceError, read_traces
from itercast.traces.replay_graph import ReplayGraph, StepMark, build_replay_graph
from itercast.traces.restage import restage
from itercast.traces.whatif import (
    ET_DTYPES,
    WhatIf,
    apply_host_overheads,
    apply_whatif,
    kernel_class,
    matmul_flops,
)

#: a step whose GPU is busy this share of its time or more is GPU-bound: the GPU never waits long
#: for the host, so what-ifs on kernels move it; below it the host (or a sync) leaves the GPU idle
GPU_BOUND_BUSY = 0.9


@dataclass
class StepReplay:
    rank: int
    step: int
    measured_s: float
    replayed_s: float
    gpu_busy: float = 0.0  # measured share of the step during which some GPU op of the rank ran (own events)

    @property
    def error(self) -> float:
        return self.replayed_s / self.measured_s - 1 if self.measured_s > 0 else 0.0

    @property
    def bound(self) -> str:
        return "gpu" if self.gpu_busy >= GPU_BOUND_BUSY else "host"


@dataclass
class ReplayResult:
    traces: list[RankTrace]
    replay_graph: ReplayGraph
    sim: SimResult
    steps: list[StepReplay]
    breakdown: Breakdown
    span_gpu_busy: float  # measured share of its span during which some GPU op ran (busiest rank)
    measured_span_s: float = 0.0  # first to last measured event or step mark, the longest rank's (_span_us)

    def to_dict(self) -> dict[str, Any]:
        ignored: dict[str, int] = {}
        for t in self.traces:
            for reason, n in t.ignored.items():
                ignored[reason] = ignored.get(reason, 0) + n
        return {
            "steps": [
                {
                    "rank": s.rank,
                    "step": s.step,
                    "measured_s": s.measured_s,
                    "replayed_s": s.replayed_s,
                    "error": s.error,
                    "gpu_busy": s.gpu_busy,
                    "bound": s.bound,
                }
                for s in self.steps
            ],
            "replayed_span_s": self.sim.step_time_s,
            "measured_span_s": self.measured_span_s,
            "gpu_busy": self.span_gpu_busy,
            "breakdown": self.breakdown.as_dict(),
            "critical_path": summarise_path(self.sim),
            "events": sum(t.num_events for t in self.traces),
            "tasks": self.sim.graph.num_tasks,
            "ignored_events": ignored,
            "inferences": dict(self.replay_graph.notes),
            "files": [t.path for t in self.traces],
            "ranks": [t.rank if t.rank is not None else i for i, t in enumerate(self.traces)],
            "matched_ranks": list(self.replay_graph.matched_ranks),
        }


def replay(paths: list[str | Path], graph: ReplayGraph | None = None) -> ReplayResult:
    """Replay traces (one file per rank, or directories of them). `graph` lets a what-if pass a changed graph."""
    traces = read_traces(list(paths))
    rg = graph or build_replay_graph(traces)
    return replay_graph(traces, rg)


def replay_graph(traces: list[RankTrace], rg: ReplayGraph, sim: SimResult | None = None) -> ReplayResult:
    """The replayed steps of `rg` (built from `traces`); `sim`: its simulation, if already run."""
    if rg.graph.num_tasks == 0:
        files = ", ".join(t.path for t in traces)
        raise TraceError(f"{files}: nothing to replay: no CUDA runtime call, GPU op or collective became a task")
    sim = sim or simulate(rg.graph)
    own = {t.rank if t.rank is not None else i: t for i, t in enumerate(traces)}
    steps = []
    for m in rg.steps:
        t = own[m.rank]
        _, _, ts_us, dur_us = next(s_ for s_ in t.steps if s_[0] == m.step)
        steps.append(
            StepReplay(m.rank, m.step, m.measured_s, _step_s(sim, m), measured_gpu_busy(t, ts_us, ts_us + dur_us))
        )
    span = max((measured_gpu_busy(t, *_span_us(t)) for t in traces), default=0.0)
    measured_s = max((end - start for start, end in map(_span_us, traces)), default=0.0) * 1e-6
    return ReplayResult(traces, rg, sim, steps, breakdown(sim), span, measured_s)


def restaged_result(traces: list[RankTrace], rg: ReplayGraph, host_cores: int | None = None) -> ReplayResult:
    """The simulated steps of a re-staged pipeline (restage.restage): one per new stage and measured
    step, none measured (measured_s NaN, no GPU busy share); its stages, one process each, share
    `host_cores` (sim/sharing.py) where given."""
    sim = simulate(rg.graph) if host_cores is None else simulate_shared(rg.graph, host_cores, {})
    steps = [StepReplay(m.rank, m.step, m.measured_s, _step_s(sim, m)) for m in rg.steps]
    return ReplayResult(traces, rg, sim, steps, breakdown(sim), 0.0)


def _step_s(sim: SimResult, m: StepMark) -> float:
    """A step's simulated time: from its first bound to its last (each a task's start or end)."""
    start = float(sim.end_s[m.start_task] if m.start_is_task_end else sim.start_s[m.start_task])
    end = float(sim.end_s[m.end_task] if m.end_is_task_end else sim.start_s[m.end_task])
    return end - start


def measured_gpu_busy(t: RankTrace, start_us: float, end_us: float) -> float:
    """Share of [start_us, end_us] during which some GPU op of the trace ran, as measured: from
    this rank's own events only, so it does not change with the other ranks' files beside it."""
    if end_us <= start_us or not t.num_ops:
        return 0.0
    lo = np.clip(t.op_ts_us, start_us, end_us)
    hi = np.clip(t.op_ts_us + t.op_dur_us, start_us, end_us)
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], np.maximum.accumulate(hi[order])
    # a gap opens where an interval starts after every earlier one has ended
    gaps = np.maximum(0.0, lo[1:] - hi[:-1]).sum() + (lo[0] - start_us) + (end_us - hi[-1])
    return float(1.0 - gaps / (end_us - start_us))


def _span_us(t: RankTrace) -> tuple[float, float]:
    """First to last measured event (runtime call, GPU op or ProfilerStep mark) of a trace, µs: the replay's span
    starts at its first step's mark too, so a step is never longer than the span that holds it."""
    starts = [float(a.min()) for a in (t.call_ts_us, t.op_ts_us) if a.size]
    ends = [float((a + d).max()) for a, d in ((t.call_ts_us, t.call_dur_us), (t.op_ts_us, t.op_dur_us)) if a.size]
    starts += [ts for _, _, ts, _ in t.steps]
    ends += [ts + dur for _, _, ts, dur in t.steps]
    return (min(starts), max(ends)) if starts else (0.0, 0.0)


def replay_whatif(
    paths: Sequence[str | Path],
    whatif: WhatIf,
    execution_traces: Sequence[str | Path] = (),
) -> tuple[ReplayResult, ReplayResult, Counter]:
    """Baseline replay and the replay under `whatif`, plus what changed. Execution traces (one per
    trace file, same order) give GEMM shapes for `whatif.gpu`. With `whatif.host_cores` the ranks'
    CPU work shares that many cores (sim/sharing.py): the measured sharing divided out of each task,
    the what-if's (its data- or tensor-parallel size's processes, or its pipeline stages) applied."""
    cores = whatif.host_cores
    if cores is not None and cores < 1:
        raise ConfigError(
            f"--host-cores: expected the number of cores of the host that ran the ranks (≥ 1); got {cores}"
        )
    traces = read_traces(list(paths))
    base = build_replay_graph(traces)
    if whatif.pp_stages is not None:
        alone = WhatIf(pp_stages=whatif.pp_stages, curves=whatif.curves, host_cores=cores)
        if whatif != alone or execution_traces:
            raise ConfigError("--pp-stages re-stages the traces on its own: give it without other what-ifs")
        staged, counts = restage(base, traces, whatif.pp_stages, whatif.curves, cores)
        return replay_graph(traces, base), restaged_result(traces, staged, cores), counts
    if execution_traces and whatif.gpu is None:
        raise ConfigError("--et: the execution traces give the GEMM shapes --gpu re-times; give --gpu too")
    linked: Counter = Counter()  # what linking the execution traces found (other_process_note)
    flops = gemm_shapes(traces, base, list(execution_traces), linked) if execution_traces else None
    changed, counts = apply_whatif(base, traces, whatif, flops)
    counts.update(linked)
    if whatif.host is not None:
        changed, host_counts = apply_host_overheads(changed, traces, whatif.host)
        counts.update(host_counts)
    measured = replay_graph(traces, base)
    if cores is None:
        result = replay_graph(traces, changed)
        _note_gpu_past_steps(measured, result, counts)
        return measured, result, counts
    # every rank of the run on the host; each loaded rank stands for world / loaded of them (symmetry)
    world = max((t.world_size or 0 for t in traces), default=0) or len(traces)
    ranks = [t.rank if t.rank is not None else i for i, t in enumerate(traces)]
    after = whatif.dp or whatif.tp or world
    sim = resimulate_shared(
        measured.sim,
        changed.graph,
        cores,
        {r: world / len(ranks) for r in ranks},
        {r: after / len(ranks) for r in ranks},
    )
    counts[f"CPU work shares {cores} host cores: {world} processes measured, {after} in the what-if"] += 1
    result = replay_graph(traces, changed, sim)
    _note_gpu_past_steps(measured, result, counts)
    return measured, result, counts


#: GPU work running on this much longer past a rank's last marked step than in the replayed trace is said
GPU_PAST_STEPS_NOTICE_S = 1e-4


def _gpu_past_steps_s(result: ReplayResult) -> dict[int, float]:
    """Per rank with marked steps: how long its GPU work runs on after the end of its last marked step."""
    rg, sim = result.replay_graph, result.sim
    out = {}
    for rank, tasks in rg.gpu_task.items():
        marks = [m for m in rg.steps if m.rank == rank]
        if not marks or not len(tasks):
            continue
        last = marks[-1]
        end = float(sim.end_s[last.end_task] if last.end_is_task_end else sim.start_s[last.end_task])
        out[rank] = float(sim.end_s[tasks].max()) - end
    return out


def _note_gpu_past_steps(measured: ReplayResult, changed: ReplayResult, counts: Counter) -> None:
    """Say when the what-if's GPU work runs on past the last marked step (a step is bounded by its host
    marks, ProfilerStep): the steps shown leave that time out, the whole what-if span holds it."""
    before, after = _gpu_past_steps_s(measured), _gpu_past_steps_s(changed)
    left_out = {r: after[r] - max(before.get(r, 0.0), 0.0) for r in after}
    longer = {r: s for r, s in left_out.items() if s > GPU_PAST_STEPS_NOTICE_S}
    if longer:
        worst = max(longer.values())
        counts[
            f"ranks whose GPU work runs on up to {worst * 1e3:.3f} ms past their last marked step, longer than "
            "replayed: the steps shown leave it out (the what-if's whole span holds it)"
        ] = len(longer)


def gemm_shapes(
    traces: list[RankTrace], rg: ReplayGraph, et_paths: Sequence[str | Path], notes: Counter
) -> dict[int, tuple[float, str, float]]:
    """GPU task → (FLOPs, dtype, share) for GEMM kernels launched by a matmul operator of a linked execution
    trace: the operator's FLOPs and dtype, and the kernel's share of the measured time of that operator's GEMM
    kernels (a split-K GEMM and its reduction kernel share one matmul's time; a lone kernel has share 1).
    `notes` counts each pair recorded by two processes (other_process_note)."""
    if len(et_paths) != len(traces):
        raise ConfigError(f"--et: give one execution trace per Kineto trace ({len(traces)}); got {len(et_paths)}")
    out: dict[int, tuple[float, str, float]] = {}
    for index, (trace, et_path) in enumerate(zip(traces, et_paths, strict=True)):
        et = read_execution_trace(et_path)
        tl = link(et, trace)
        if note := other_process_note(et, trace):
            notes[note] += 1
        rank = trace.rank if trace.rank is not None else index
        kernels: dict[int, list[int]] = defaultdict(list)  # ET node id → its GEMM-class GPU ops
        matmuls: dict[int, tuple[float, str]] = {}
        for op in range(trace.num_ops):
            node = tl.node_of_gpu_op(et, op)
            if node is None or kernel_class(trace.names[trace.op_name[op]]) != "gemm":
                continue
            flops = matmul_flops(node.name, node.input_shapes)
            if flops:
                dtype = ET_DTYPES.get(next((t for t in node.input_types if t.startswith("Tensor")), ""), "fp32")
                kernels[node.id].append(op)
                matmuls[node.id] = (flops, dtype)
        for node_id, ops in kernels.items():
            measured_us = trace.op_dur_us[ops]
            total_us = float(measured_us.sum())
            for op, us in zip(ops, measured_us.tolist(), strict=True):
                share = us / total_us if total_us > 0 else 1 / len(ops)
                out[int(rg.gpu_task[rank][op])] = (*matmuls[node_id], share)
    return out
