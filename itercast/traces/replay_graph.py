"""Turn imported Kineto traces into an ExecGraph that replays them (DESIGN.md §3, §7).

Per rank (graph rank = trace rank):
- each host thread is a chain of tasks: the measured gaps between runtime calls (CPU op dispatch,
  Python, …) and the calls themselves; gaps are cut at `ProfilerStep` boundaries so steps can be timed;
- each GPU op sits on its stream and waits for its launch: an edge from the host task that ends where
  the launch call starts, with latency = measured start − launch start when the op was launch-bound,
  else the trace's median launch latency (so a what-if does not freeze queueing delays);
- `cudaStreamWaitEvent` (no stream ids in Kineto): the next op the thread launches waits for the
  latest op launched before the call on another stream, if the measured times allow it;
- `cuda{Device,Stream,Event}Synchronize` and blocking `cudaMemcpy`: the call waits for the GPU op
  whose measured end it waited for; its own duration becomes the part after that end;
- NCCL kernels are matched across the loaded ranks (process group + collective + order of issue,
  or kernel name + order when the trace has no NCCL metadata) into rendezvous collectives whose
  duration is the smallest member duration: the last member to arrive waits for nobody, so its
  kernel time is the transfer (method "last_arrival"). Without peers, measured durations are kept.
Every inference is checked against the measured times: an edge the measurements contradict is
not added. `ReplayGraph.notes` counts what was inferred and what could not be.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from itercast.graph.execgraph import Category, ExecGraph, GraphBuilder
from itercast.traces.kineto import RankTrace

EPS_US = 1.0  # timestamps are µs; closer than this counts as "at the same time"
DEFAULT_LAUNCH_LATENCY_US = 5.0
SYNC_CALLS = {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy"}
WAIT_CALL = "cudaStreamWaitEvent"
KERNEL_BASE = re.compile(r"^[^(<]+")


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
class ReplayGraph:
    graph: ExecGraph
    steps: list[StepMark]
    gpu_task: dict[tuple[int, int], int]  # (rank, op index) -> task
    nccl_meta: dict[int, dict]  # task -> NCCL metadata (with "group_ranks" when known)
    notes: Counter = field(default_factory=Counter)


def build_replay_graph(traces: list[RankTrace]) -> ReplayGraph:
    b = GraphBuilder()
    notes: Counter = Counter()
    steps: list[StepMark] = []
    gpu_task: dict[tuple[int, int], int] = {}
    nccl_meta: dict[int, dict] = {}
    t0 = min((_first_us(t) for t in traces if _first_us(t) is not None), default=0.0)
    for index, trace in enumerate(traces):
        rank = trace.rank if trace.rank is not None else index
        _RankBuilder(b, trace, rank, t0, notes, steps, gpu_task, nccl_meta).build()
    _match_collectives(b, traces, gpu_task, nccl_meta, notes)
    graph = b.build()
    durations = graph.duration_s.copy()
    for task, meta in nccl_meta.items():
        if "transfer_s" in meta:
            durations[task] = meta["transfer_s"]
    return ReplayGraph(graph.with_durations(durations), steps, gpu_task, nccl_meta, notes)


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
        self.call_task: dict[int, int] = {}  # call index -> task of the call
        self.before_call: dict[int, int] = {}  # call index -> host task ending where the call starts

    def build(self) -> None:
        self._host_chains()
        self._gpu_ops()

    # -- host -------------------------------------------------------------------------------
    def _host_chains(self) -> None:
        t = self.t
        cuts: dict[int, list[tuple[float, int, bool]]] = defaultdict(list)  # tid -> (time, step, is_end)
        for number, tid, ts, dur in t.steps:
            cuts[tid] += [(ts, number, False), (ts + dur, number, True)]
        tids = sorted(set(t.call_tid.tolist()) | set(cuts))
        for tid in tids:
            self._chain(tid, np.flatnonzero(t.call_tid == tid), sorted(cuts.get(tid, [])))

    def _chain(self, tid: int, calls: np.ndarray, cuts: list[tuple[float, int, bool]]) -> None:
        t, b = self.t, self.b
        res = b.resource(self.rank, f"host:{tid}")
        calls = calls[np.argsort(t.call_ts_us[calls], kind="stable")]
        starts = [float(t.call_ts_us[c]) for c in calls]
        cursor = self.t0
        last = None
        marks: dict[tuple[int, bool], tuple[int, bool]] = {}
        ci = 0
        for k, c in enumerate(calls.tolist()):
            ts, dur = starts[k], float(t.call_dur_us[c])
            while ci < len(cuts) and cuts[ci][0] <= ts:
                last = self._gap(res, cursor, cuts[ci][0], last)
                cursor = max(cursor, cuts[ci][0])
                marks[(cuts[ci][1], cuts[ci][2])] = (b.num_tasks, False)  # the next task starts at the cut
                ci += 1
            last = self._gap(res, cursor, ts, last)
            self.before_call[c] = last
            end = ts + dur
            start = max(ts, cursor)
            last = b.task(
                t.names[t.call_name[c]],
                res,
                max(0.0, end - start) * 1e-6,
                Category.HOST,
                "runtime",
                [last] if last is not None else [],
            )
            self.call_task[c] = last
            cursor = max(cursor, end)
        while ci < len(cuts):  # cuts after the last call: a trailing gap ends exactly at the cut
            last = self._gap(res, cursor, cuts[ci][0], last)
            cursor = max(cursor, cuts[ci][0])
            marks[(cuts[ci][1], cuts[ci][2])] = (last, True)
            ci += 1
        self._record_steps(marks)

    def _gap(self, res: int, start_us: float, end_us: float, last: int | None) -> int:
        return self.b.task(
            "cpu",
            res,
            max(0.0, end_us - start_us) * 1e-6,
            Category.HOST,
            "host_gap",
            [last] if last is not None else [],
        )

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
        launch = self._launch_index()
        streams = _stream_kinds(t)
        order = np.lexsort((t.op_ts_us, t.op_stream))
        waits = self._wait_sources(launch)
        latencies = self._launch_latencies(order, launch, waits)
        median = float(np.median(latencies[latencies >= 0])) if (latencies >= 0).any() else DEFAULT_LAUNCH_LATENCY_US
        self.notes[f"rank {self.rank} median launch latency µs"] = round(median, 3)
        for k in order.tolist():
            stream = int(t.op_stream[k])
            res = b.resource(self.rank, streams[stream])
            deps, lat = [], median * 1e-6
            call = launch.get(int(t.op_corr[k]))
            if call is not None:
                deps.append(self.before_call[call])
                if latencies[k] >= 0:
                    lat = latencies[k] * 1e-6
            else:  # launched from a thread the trace does not show: pin to its measured start
                deps.append(self._clock())
                lat = max(0.0, float(t.op_ts_us[k]) - self.t0) * 1e-6
                self.notes["GPU ops without a launch call (anchored at their measured start)"] += 1
            name = t.names[t.op_name[k]]
            nccl = "nccl" in name.lower()
            cat = Category.COMMUNICATION if nccl else Category.COMPUTE
            family = ("kernel", "memcpy", "memset")[t.op_kind[k]]
            task = b.task(name, res, float(t.op_dur_us[k]) * 1e-6, cat, family, deps, latency_s=lat)
            self.gpu_task[(self.rank, k)] = task
            if nccl:
                self.nccl_meta[task] = dict(t.op_nccl[k] or {})
        for k, sources in waits.items():  # every GPU task exists now: add the inferred waits
            for src in sources:
                b.edge(self.gpu_task[(self.rank, src)], self.gpu_task[(self.rank, k)])
                self.notes["cross-stream waits inferred (cudaStreamWaitEvent)"] += 1
        self._sync_edges(launch)

    def _clock(self) -> int:
        if self.clock is None:
            self.clock = self.b.task("clock", self.b.resource(self.rank, "clock"), 0.0, Category.HOST, "clock")
        return self.clock

    def _launch_index(self) -> dict[int, int]:
        t = self.t
        ok = t.call_corr >= 0
        return dict(zip(t.call_corr[ok].tolist(), np.flatnonzero(ok).tolist(), strict=True))

    def _launch_latencies(self, order: np.ndarray, launch: dict[int, int], waits: dict[int, list[int]]) -> np.ndarray:
        """Measured start − launch start for ops that nothing else held back; −1 elsewhere."""
        t = self.t
        lat = np.full(t.num_ops, -1.0)
        prev_end: dict[int, float] = {}
        ends = t.op_ts_us + t.op_dur_us
        for k in order.tolist():
            stream = int(t.op_stream[k])
            held = max([prev_end.get(stream, -np.inf), *(ends[s] for s in waits.get(k, ()))])
            call = launch.get(int(t.op_corr[k]))
            if call is not None and t.op_ts_us[k] - held > EPS_US:
                lat[k] = max(0.0, float(t.op_ts_us[k] - t.call_ts_us[call]))
            prev_end[stream] = float(ends[k])
        return lat

    def _wait_sources(self, launch: dict[int, int]) -> dict[int, list[int]]:
        """For each cudaStreamWaitEvent: the next op its thread launches waits for the latest op
        launched before the call on another stream, when the measured times allow it. One sweep
        over calls in time order."""
        t = self.t
        ends = t.op_ts_us + t.op_dur_us
        op_of_call = {c: k for k, c in ((k, launch.get(int(t.op_corr[k]))) for k in range(t.num_ops)) if c is not None}
        wait_name = t.names.index(WAIT_CALL) if WAIT_CALL in t.names else -1
        order = np.argsort(t.call_ts_us, kind="stable").tolist()
        next_launch: dict[int, int] = {}  # call -> op launched next by the same thread
        pending: dict[int, list[int]] = defaultdict(list)  # thread -> waits still looking for a launch
        last_per_stream: dict[int, int] = {}
        found: list[tuple[int, dict[int, int]]] = []  # (wait call, streams' last ops at that moment)
        for c in order:
            tid = int(t.call_tid[c])
            if int(t.call_name[c]) == wait_name:
                pending[tid].append(c)
                found.append((c, dict(last_per_stream)))
            k = op_of_call.get(c)
            if k is not None:
                for w in pending.pop(tid, []):
                    next_launch[w] = k
                last_per_stream[int(t.op_stream[k])] = k
        out: dict[int, list[int]] = defaultdict(list)
        for w, last in found:
            nxt = next_launch.get(w)
            if nxt is None:
                self.notes["stream waits with no later launch on their thread"] += 1
                continue
            cands = [k for s, k in last.items() if s != t.op_stream[nxt] and ends[k] <= t.op_ts_us[nxt] + EPS_US]
            if cands:
                out[nxt].append(max(cands, key=lambda k: ends[k]))
            else:
                self.notes["stream waits the measured times rule out"] += 1
        return out

    def _sync_edges(self, launch: dict[int, int]) -> None:
        """Synchronising calls wait for the GPU op whose end they measurably waited for."""
        t = self.t
        ends = t.op_ts_us + t.op_dur_us
        op_launch_ts = np.array(
            [t.call_ts_us[launch[c]] if c in launch else t.op_ts_us[k] for k, c in enumerate(t.op_corr.tolist())]
        )
        for c in range(t.call_ts_us.shape[0]):
            name = t.names[t.call_name[c]]
            if name not in SYNC_CALLS:
                continue
            ts, te = t.call_ts_us[c], t.call_ts_us[c] + t.call_dur_us[c]
            before = np.flatnonzero((op_launch_ts <= ts) & (ends <= te + EPS_US))
            if name == "cudaMemcpy":
                before = np.array([k for k in range(t.num_ops) if launch.get(int(t.op_corr[k])) == c], dtype=int)
            if not before.size:
                continue
            last_per_stream: dict[int, int] = {}
            for k in before[np.argsort(op_launch_ts[before], kind="stable")].tolist():
                last_per_stream[int(t.op_stream[k])] = k
            waited = list(last_per_stream.values())
            if name != "cudaDeviceSynchronize":
                waited = [max(waited, key=lambda k: ends[k])]
            task = self.call_task[c]
            for k in waited:
                self.b.edge(self.gpu_task[(self.rank, k)], task)
            binding = max(ends[k] for k in waited)
            if binding > ts:  # it waited: only the part after the GPU finished is the call's own time
                self.b.set_duration(task, max(0.0, te - binding) * 1e-6)
            self.notes["synchronisations linked to GPU ops"] += 1


def _first_us(t: RankTrace) -> float | None:
    firsts = [float(a.min()) for a in (t.call_ts_us, t.op_ts_us) if a.size] + [s[2] for s in t.steps]
    return min(firsts) if firsts else None


def _stream_kinds(t: RankTrace) -> dict[int, str]:
    """The busiest non-NCCL stream is 'compute' (the breakdown's main stream); others by id."""
    busy: dict[int, float] = defaultdict(float)
    for k in range(t.num_ops):
        if "nccl" not in t.names[t.op_name[k]].lower():
            busy[int(t.op_stream[k])] += float(t.op_dur_us[k])
    main = max(busy, key=busy.get) if busy else None
    return {int(s): ("compute" if s == main else f"stream:{s}") for s in set(t.op_stream.tolist())}


def _match_collectives(
    b: GraphBuilder, traces: list[RankTrace], gpu_task: dict, nccl_meta: dict, notes: Counter
) -> None:
    """Rendezvous NCCL kernels across the loaded ranks: k-th issue of a collective on a group."""
    loaded = {t.rank if t.rank is not None else i for i, t in enumerate(traces)}
    if len(traces) < 2:
        if nccl_meta:
            notes["NCCL kernels kept at measured time (peers not loaded)"] += len(nccl_meta)
        return
    seq: dict[tuple, dict[int, int]] = defaultdict(dict)
    counters: Counter = Counter()
    for i, t in enumerate(traces):
        rank = t.rank if t.rank is not None else i
        for k in np.argsort(t.op_ts_us, kind="stable").tolist():
            task = gpu_task.get((rank, k))
            if task is None or task not in nccl_meta:
                continue
            meta = nccl_meta[task]
            group = meta.get("Process Group Ranks")
            key = (
                (group, meta.get("Collective name"))
                if group
                else ("?", KERNEL_BASE.match(t.names[t.op_name[k]]).group(0))
            )
            counters[(rank, key)] += 1
            seq[(key, counters[(rank, key)])][rank] = task
    for (key, _), members in seq.items():
        group = key[0]
        expected = set(_parse_ranks(group)) & loaded if group != "?" else loaded
        if set(members) != expected or len(members) < 2:
            notes["NCCL kernels without all peers loaded (measured time kept)"] += len(members)
            continue
        coll = b.new_collective()
        durations = [b.duration(task) for task in members.values()]
        for task in members.values():
            b.join_collective(task, coll)
            nccl_meta[task]["transfer_s"] = min(durations)
            nccl_meta[task]["method"] = "last_arrival"
        notes["NCCL collectives matched across ranks"] += 1


def _parse_ranks(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", str(text))]
