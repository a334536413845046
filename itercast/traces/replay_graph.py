"""Turn imported Kineto traces into an ExecGraph that replays them (DESIGN.md §3, §7).

Per rank (graph rank = trace rank):
- each host thread is a chain of tasks: the measured gaps between runtime calls (CPU op dispatch,
  Python, …) and the calls themselves; gaps are cut at `ProfilerStep` boundaries so steps can be timed;
- each GPU op sits on its stream and waits for its launch: an edge from the host task that ends where
  the launch call starts, with latency = measured start − launch start when the op was launched onto
  an idle stream, else the trace's median launch latency. An op launched while its stream was busy
  was queued (GPU-bound work: the GPU runs behind the host): it also waits for what held it (the
  previous op on its stream or a waited op) with the measured gap between them, so a kernel starts at
  max(launch + latency, what held it + gap) and queueing is never taken for launch latency;
- stream waits: exact where the trace has "cuda_sync" Stream Wait Event records (they name the producer
  stream and the cudaEventRecord); otherwise inferred from `cudaStreamWaitEvent` (no stream ids in
  Kineto): the next op the thread launches waits for the latest op launched before the call on
  another stream, if the measured times allow it;
- host calls that waited for the GPU (host_waits: synchronisations, blocking copies, `.item()`,
  launches held by a full launch queue) wait for the GPU ops they waited for and keep only their
  own time, so a GPU-bound step follows its kernels under what-ifs;
- host threads that sat idle while another thread ran its operators (the main thread during
  backward, the autograd thread during forward and before its first operator) wait for that
  thread's last runtime call in the stretch (_thread_waits), so a what-if that shortens one thread
  moves the other;
- NCCL kernels are matched across the loaded ranks into rendezvous collectives (rendezvous.py);
  without peers, measured durations are kept;
- CPU collectives (gloo) run on their worker threads after their `c10d::` launch and the launching
  thread waits for them where the trace shows it did (cpu_collectives.py); matched across ranks alike.
Every inference is checked against the measured times: an edge the measurements contradict is
not added. `ReplayGraph.notes` counts what was inferred and what could not be.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from itercast.graph.execgraph import Category, ExecGraph, GraphBuilder
from itercast.traces.cpu_collectives import (
    add_cpu_collectives,
    add_cpu_waits,
    match_cpu_collectives,
    with_collective_marks,
)
from itercast.traces.host_overheads import ThreadOps, late_starts, thread_ops, waiting_stretches
from itercast.traces.host_waits import EPS_US, host_waits
from itercast.traces.kineto import RankTrace
from itercast.traces.rendezvous import match_collectives
from itercast.traces.stream_waits import stream_wait_sources

DEFAULT_LAUNCH_LATENCY_US = 5.0


@dataclass
class StepMark:
    """Step `step` of `rank`: measured duration and the host tasks that bound it; each bound is the
    task's start, or its end where the flag says so (cuts after a thread's last runtime call)."""

    rank: int
    step: int
    measured_s: float
    start_task: int
    start_is_task_end: bool
    end_task: int
    end_is_task_end: bool


@dataclass
class HostChain:
    """One rank's host threads in the graph: the task of each runtime call (trace call order, −1
    none), each gap piece with the call it precedes (−1: after its thread's last call), and the calls
    whose gap ends in a wait for another thread (that piece holds only the part after the wait)."""

    call_task: np.ndarray
    piece_task: np.ndarray
    piece_call: np.ndarray
    waiting_calls: set[int]


@dataclass
class ReplayGraph:
    graph: ExecGraph
    steps: list[StepMark]
    gpu_task: dict[int, np.ndarray]  # rank -> task of each of its GPU ops (trace op order)
    nccl_meta: dict[int, dict]  # task -> NCCL metadata (with "group_ranks" when known)
    notes: Counter = field(default_factory=Counter)
    host: dict[int, HostChain] = field(default_factory=dict)  # rank -> its host chains
    matched_ranks: tuple[int, ...] = ()  # ranks whose collectives were matched across the loaded traces
    cpu_comm: dict[int, dict] = field(default_factory=dict)  # task -> CPU collective (cpu_collectives.py)

    def with_durations(self, duration_s: np.ndarray) -> ReplayGraph:
        return dataclasses.replace(self, graph=self.graph.with_durations(duration_s))

    def without_rendezvous(self, tasks: np.ndarray) -> ReplayGraph:
        """The same graph with `tasks` no longer members of collectives (a collective that a what-if
        removes: each rank then runs on without waiting for its peers)."""
        collective = self.graph.collective.copy()
        collective[tasks] = -1
        return dataclasses.replace(self, graph=dataclasses.replace(self.graph, collective=collective, _order=None))


def build_replay_graph(traces: list[RankTrace]) -> ReplayGraph:
    b = GraphBuilder()
    notes: Counter = Counter()
    steps: list[StepMark] = []
    gpu_task: dict[int, np.ndarray] = {}
    nccl_meta: dict[int, dict] = {}
    host: dict[int, HostChain] = {}
    cpu_comm: dict[int, dict] = {}
    t0 = min((f for t in traces if (f := _first_us(t)) is not None), default=0.0)
    for index, trace in enumerate(traces):
        rank = trace.rank if trace.rank is not None else index
        view, collectives = with_collective_marks(trace, notes)
        rb = _RankBuilder(b, view, rank, t0, notes, steps, gpu_task, nccl_meta)
        host[rank] = rb.build()
        cpu_comm |= add_cpu_collectives(b, view, rank, collectives, rb.call_task, rb.before_call)
    matched = match_collectives(b, traces, gpu_task, nccl_meta, notes)
    world = max((t.world_size or 0 for t in traces), default=0)
    matched_cpu = match_cpu_collectives(b, world, cpu_comm, notes)
    add_cpu_waits(b, cpu_comm)
    graph = b.build()
    durations = graph.duration_s.copy()
    for task, meta in (nccl_meta | cpu_comm).items():
        if "transfer_s" in meta:
            durations[task] = meta["transfer_s"]
    ranks = tuple(sorted(set(matched) | set(matched_cpu)))
    return ReplayGraph(graph.with_durations(durations), steps, gpu_task, nccl_meta, notes, host, ranks, cpu_comm)


class _RankBuilder:
    def __init__(
        self,
        b: GraphBuilder,
        t: RankTrace,
        rank: int,
        t0_us: float,
        notes: Counter,
        steps: list[StepMark],
        gpu_task: dict,
        nccl_meta: dict,
    ) -> None:
        self.b, self.t, self.rank, self.notes, self.steps = b, t, rank, notes, steps
        self.gpu_task, self.nccl_meta = gpu_task, nccl_meta
        self.t0 = t0_us  # one clock for all ranks: their measured offsets are kept
        self.clock: int | None = None  # a zero-length task at t0 on this rank, to anchor ops without a launch
        n_calls = t.call_ts_us.shape[0]
        self.call_task = np.full(n_calls, -1, dtype=np.int64)  # call index -> task of the call
        self.before_call = np.full(n_calls, -1, dtype=np.int64)  # call index -> host task ending where it starts
        self.call_of = t.launch_calls()  # GPU op -> its launching call (−1 none)
        self.pieces: list[np.ndarray] = []  # rows (gap piece task, call index it precedes or −1)
        self.waiting_calls: set[int] = set()
        # trace name id -> graph name id
        self.name_map = np.array([b.name_id(n) for n in t.names], dtype=np.int64) if t.names else np.zeros(0, np.int64)

    def build(self) -> HostChain:
        self._host_chains()
        self._thread_waits()
        self._gpu_ops()
        pieces = np.concatenate(self.pieces) if self.pieces else np.zeros((0, 2), np.int64)
        return HostChain(self.call_task, pieces[:, 0], pieces[:, 1], self.waiting_calls)

    # -- host -------------------------------------------------------------------------------
    def _host_chains(self) -> None:
        t = self.t
        cuts: dict[int, list[tuple[float, int, bool]]] = defaultdict(list)  # tid -> (time, step, is_end)
        for number, tid, ts, dur in t.steps:
            cuts[tid] += [(ts, number, False), (ts + dur, number, True)]
        for tid in sorted(set(t.call_tid.tolist()) | set(cuts)):
            calls = np.flatnonzero(t.call_tid == tid)
            self._chain(tid, calls[np.argsort(t.call_ts_us[calls], kind="stable")], sorted(cuts.get(tid, [])))

    def _chain(self, tid: int, calls: np.ndarray, cuts: list[tuple[float, int, bool]]) -> None:
        """One host thread: gap pieces and calls, built as arrays. Gap k runs from the cursor (the
        latest end of earlier calls, or t0) to call k's start and is split at the step cuts inside it."""
        t, b = self.t, self.b
        ts, end = t.call_ts_us[calls], t.call_ts_us[calls] + t.call_dur_us[calls]
        n = calls.shape[0]
        cursor = np.maximum.accumulate(np.concatenate([[self.t0], end]))  # cursor[k] before call k; [n] after all
        cut_t = np.array([c[0] for c in cuts], dtype=np.float64)
        group = np.searchsorted(ts, cut_t, side="left")  # cut j lies in gap group[j] (n: after the last call)
        per_gap = np.bincount(group, minlength=n + 1)
        # flat boundaries: for gap k (k < n): cursor_k, its cuts, ts_k; trailing: cursor_n, its cuts
        bounds_per_gap = per_gap + 2
        bounds_per_gap[n] -= 1
        gstart = np.concatenate([[0], np.cumsum(bounds_per_gap)])
        flat = np.empty(int(gstart[-1]))
        flat[gstart[:-1]] = cursor
        flat[gstart[1 : n + 1] - 1] = ts
        cut_rank = np.arange(cut_t.shape[0]) - np.concatenate([[0], np.cumsum(per_gap)])[group]
        flat[gstart[group] + 1 + cut_rank] = cut_t
        run = np.maximum.accumulate(flat)  # a cut before the cursor is a zero-length piece (as time goes)
        piece_dur = np.diff(run)
        last_of_group = gstart[1:] - 1
        keep = np.ones(piece_dur.shape[0], dtype=bool)
        keep[last_of_group[:-1]] = False  # no piece from a group's last boundary into the next group
        keep = keep[: piece_dur.shape[0]]
        piece_dur = piece_dur[keep]
        # interleave: pieces of gap 0, call 0, pieces of gap 1, call 1, …, trailing pieces
        pieces = per_gap + 1
        pieces[n] -= 1
        call_pos = np.cumsum(pieces[:n]) + np.arange(n)
        total = int(pieces.sum()) + n
        is_call = np.zeros(total, dtype=bool)
        is_call[call_pos] = True
        dur_us = np.empty(total)
        dur_us[~is_call] = piece_dur
        dur_us[call_pos] = np.maximum(0.0, end - np.maximum(ts, cursor[:n]))
        names = np.full(total, b.name_id("cpu"), dtype=np.int64)
        names[call_pos] = self.name_map[t.call_name[calls]] if n else names[call_pos]
        families = np.where(is_call, b.family_id("runtime"), b.family_id("host_gap"))
        res = b.resource(self.rank, f"host:{tid}")
        first = b.add_tasks(names, np.full(total, res), dur_us * 1e-6, np.full(total, int(Category.HOST)), families)
        self.call_task[calls] = first + call_pos
        self.before_call[calls] = first + call_pos - 1
        piece_pos = np.flatnonzero(~is_call)  # global position of each gap piece
        precedes = np.searchsorted(call_pos, piece_pos)  # k: the piece lies in gap k
        self.pieces.append(np.column_stack([first + piece_pos, np.append(calls, -1)[precedes]]))
        piece_start = np.concatenate([[0], np.cumsum(pieces)])
        marks: dict[tuple[int, bool], tuple[int, bool]] = {}
        for j, (_, number, is_end) in enumerate(cuts):
            g, r = int(group[j]), int(cut_rank[j])
            if g < n:  # the piece after the cut starts at it
                marks[(number, is_end)] = (first + int(piece_pos[piece_start[g] + r + 1]), False)
            else:  # trailing: the piece ending at the cut
                marks[(number, is_end)] = (first + int(piece_pos[piece_start[g] + r]), True)
        self._record_steps(marks)

    def _thread_waits(self) -> None:
        """A thread that sat idle while another thread ran its operators waited for that thread (the
        main thread during backward, the autograd thread during forward; host_overheads.waiting_stretches),
        and so did a thread whose first operator started late (the autograd thread, before the main
        thread's backward call; host_overheads.late_starts): without that wait its first gap would run
        from the trace's start and pin it where it was measured, whatever a what-if moves before it.
        The gap piece that ends at the waiting thread's next runtime call then depends on the other
        thread's last runtime call inside the stretch, and its own time is the part after that call."""
        t = self.t
        threads = {int(tid): thread_ops(t, int(tid)) for tid in np.unique(t.cpu_tid)}
        call_end = t.call_ts_us + t.call_dur_us
        for a, stretches in waiting_stretches(list(threads.values())).items():
            th = threads[a]
            for waited, other in stretches:
                self._wait(th, threads[other], th.end_us[waited], th.start_us[waited + 1], call_end)
        for a, others in late_starts(list(threads.values())).items():
            for other in others:  # idle since the trace began
                self._wait(threads[a], threads[other], np.array([-np.inf]), threads[a].start_us[:1], call_end)

    def _wait(
        self, th: ThreadOps, other: ThreadOps, idle_from: np.ndarray, idle_to: np.ndarray, call_end: np.ndarray
    ) -> None:
        """Thread `th` idle over the stretches [idle_from, idle_to) (µs) waited for thread `other`;
        `call_end`: every runtime call's end (µs)."""
        t = self.t
        b_calls = other.calls[np.argsort(call_end[other.calls], kind="stable")]
        src = np.searchsorted(call_end[b_calls], idle_to + EPS_US, side="right") - 1
        dst = np.searchsorted(t.call_ts_us[th.calls], idle_to - EPS_US, side="left")
        ok = (src >= 0) & (dst < th.calls.shape[0])
        ok[ok] &= call_end[b_calls[src[ok]]] > idle_from[ok]  # the other thread called inside it
        for sc, dc in zip(src[ok].tolist(), dst[ok].tolist(), strict=True):
            call = int(th.calls[dc])
            piece = int(self.before_call[call])
            self.b.edge(int(self.call_task[b_calls[sc]]), piece)
            after = max(0.0, float(t.call_ts_us[call] - call_end[b_calls[sc]])) * 1e-6
            self.b.set_duration(piece, min(self.b.duration(piece), after))
            self.waiting_calls.add(call)
            self.notes["host threads waiting for another thread"] += 1

    def _record_steps(self, marks: dict) -> None:
        for number, _, _, dur in self.t.steps:
            start, end = marks.get((number, False)), marks.get((number, True))
            if start is not None and end is not None:
                self.steps.append(StepMark(self.rank, number, dur * 1e-6, *start, *end))

    # -- GPU --------------------------------------------------------------------------------
    def _gpu_ops(self) -> None:
        t, b = self.t, self.b
        if not t.num_ops:
            return
        waits = stream_wait_sources(self.t, self.call_of, self.notes)
        latencies, holder = self._launch_latencies(waits)
        measured = latencies[latencies >= 0]
        median = float(np.median(measured)) if measured.size else DEFAULT_LAUNCH_LATENCY_US
        self.notes[f"rank {self.rank} median launch latency ns"] = round(median * 1000)
        order = np.lexsort((t.op_ts_us, t.op_stream))
        kinds = _stream_kinds(t)
        uniq = np.array(sorted(kinds), dtype=np.int64)
        res_of = np.array([b.resource(self.rank, kinds[int(s_)]) for s_ in uniq], dtype=np.int64)
        res = res_of[np.searchsorted(uniq, t.op_stream[order])]
        names = self.name_map[t.op_name[order]]
        nccl_names = np.array(["nccl" in n.lower() for n in t.names], dtype=bool)
        nccl = nccl_names[t.op_name[order]]
        fam_ids = np.array([b.family_id(f) for f in ("kernel", "memcpy", "memset")])
        first = b.add_tasks(
            names,
            res,
            t.op_dur_us[order] * 1e-6,
            np.where(nccl, int(Category.COMMUNICATION), int(Category.COMPUTE)),
            fam_ids[t.op_kind[order].astype(np.int64)],
        )
        task_of = np.empty(t.num_ops, dtype=np.int64)
        task_of[order] = first + np.arange(order.shape[0])
        call_of = self.call_of
        has = call_of >= 0
        lat_us = np.where(latencies >= 0, latencies, median)
        b.add_edges(self.before_call[call_of[has]], task_of[has], lat_us[has] * 1e-6)
        orphans = np.flatnonzero(~has)
        if orphans.size:  # launched from a thread the trace does not show: pin to its measured start
            b.add_edges(
                np.full(orphans.shape[0], self._clock()),
                task_of[orphans],
                np.maximum(0.0, t.op_ts_us[orphans] - self.t0) * 1e-6,
            )
            self.notes["GPU ops without a launch call (anchored at their measured start)"] += int(orphans.shape[0])
        self.gpu_task[self.rank] = task_of
        for k in np.flatnonzero(nccl_names[t.op_name]).tolist():
            self.nccl_meta[int(task_of[k])] = dict(t.op_nccl[k] or {})
        for k, sources in waits.items():  # every GPU task exists now: add the waits
            for src in sources:
                b.edge(int(task_of[src]), int(task_of[k]))
        queued = np.flatnonzero(holder >= 0)  # the measured gap after what held each queued op
        gap_us = np.maximum(0.0, t.op_ts_us[queued] - (t.op_ts_us + t.op_dur_us)[holder[queued]])
        b.add_edges(task_of[holder[queued]], task_of[queued], gap_us * 1e-6)
        self.notes[f"rank {self.rank} GPU ops queued behind earlier work"] = int(queued.shape[0])
        self._host_waits(task_of)

    def _clock(self) -> int:
        if self.clock is None:
            self.clock = self.b.task("clock", self.b.resource(self.rank, "clock"), 0.0, Category.HOST, "clock")
        return self.clock

    def _launch_latencies(self, waits: dict[int, list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Per op: the launch latency where it can be measured, −1 elsewhere; and what held a queued op.

        A launch latency shows only where the op was launched onto an idle stream (its launch call
        started after the previous op on the stream and every inferred wait had ended): measured start
        − launch start. An op launched while its stream was still busy was queued (GPU-bound work runs
        behind the host by up to hundreds of ms): its start − launch is queueing, not latency. It
        started a measured gap after whatever held it (the previous op on its stream, or a waited op):
        `holder` names that op (−1 where none), so the replay keeps the gap (the GPU's time between
        back-to-back kernels) and lets the holder's what-if move it."""
        t = self.t
        ends = t.op_ts_us + t.op_dur_us
        order = np.lexsort((t.op_ts_us, t.op_stream))
        held = np.full(t.num_ops, -np.inf)
        holder = np.full(t.num_ops, -1, dtype=np.int64)
        same = t.op_stream[order[1:]] == t.op_stream[order[:-1]]
        held[order[1:][same]] = ends[order[:-1][same]]
        holder[order[1:][same]] = order[:-1][same]
        for k, sources in waits.items():
            src = max(sources, key=lambda s_: ends[s_])
            if ends[src] > held[k]:
                held[k], holder[k] = ends[src], src
        call_of = self.call_of
        launched = call_of >= 0
        launch_ts = np.full(t.num_ops, -np.inf)  # no runtime calls in the trace: nothing was launched
        launch_ts[launched] = t.call_ts_us[call_of[launched]]
        idle = launched & (launch_ts >= held - EPS_US)
        lat = np.full(t.num_ops, -1.0)
        lat[idle] = np.maximum(0.0, t.op_ts_us[idle] - launch_ts[idle])
        holder[idle] = -1
        return lat, holder

    def _host_waits(self, task_of: np.ndarray) -> None:
        """Host calls that waited for the GPU wait for those ops and keep only their own time (host_waits)."""
        waits, queue = host_waits(self.t, self.call_of)
        if queue is not None:
            how = "measured" if queue.measured else "default, never full in the trace"
            self.notes[f"rank {self.rank} launch queue depth ({how})"] = queue.depth
            self.b.add_edges(task_of[queue.frees], self.call_task[queue.calls])
        for w in waits:
            task = int(self.call_task[w.call])
            for k in w.ops:
                self.b.edge(int(task_of[k]), task, w.lag_us * 1e-6)
            self.b.set_duration(task, w.own_us * 1e-6)
            self.notes[w.kind] += 1


def _first_us(t: RankTrace) -> float | None:
    firsts = [float(a.min()) for a in (t.call_ts_us, t.op_ts_us) if a.size] + [s[2] for s in t.steps]
    return min(firsts) if firsts else None


def _stream_kinds(t: RankTrace) -> dict[int, str]:
    """The busiest non-NCCL stream is 'compute' (the breakdown's main stream); others by id."""
    streams = np.unique(t.op_stream)
    nccl = np.array(["nccl" in n.lower() for n in t.names], dtype=bool)[t.op_name] if t.names else np.zeros(0, bool)
    busy = np.bincount(
        np.searchsorted(streams, t.op_stream), weights=np.where(nccl, 0.0, t.op_dur_us), minlength=streams.shape[0]
    )
    main = int(streams[np.argmax(busy)]) if busy.size and busy.max() > 0 else None
    return {int(s): ("compute" if s == main else f"stream:{s}") for s in streams.tolist()}
