"""CPU collectives (gloo) in a replayed trace (DESIGN.md §3, §7).

A CPU run's collectives show in its Kineto trace as a `c10d::<collective>` op on the thread that
launched it (DDP's reducer, from the backward pass) and a `gloo:<collective>` annotation on a gloo
worker thread that ran it (waiting for peers included). Replay makes each annotation a task on its
worker thread, after its launch op's start (with the measured lag to its start), and makes the
launching thread wait for it where the trace shows it waited: its longest idle stretch between the
launch and the end of the step (_waits), cut out of the thread's measured time by two zero-length
marks (one where its last op before the stretch ended, one where its next op began). A collective
that ended while the thread was busy is so waited for at its step's wait, as DDP's
finalize_backward waits for every bucket in order (torch/csrc/distributed/c10d/reducer.cpp): an
approximation where its bucket's gradient copy ran earlier than that wait. The collective is done
for its rank when that thread resumed, if before the annotation ends: on an oversubscribed CPU the
gloo thread closes its annotation when it is scheduled again, up to 6 ms after the waiting thread
resumed (data/measured/gloo_parallelism ws2: rank 1 resumes at 138.8 ms, the annotation ends at
144.7 ms). Across the loaded ranks the k-th collective of a kind is one rendezvous over the default
group (the trace's world); each member lasts from the last member's measured start to its own end
(its time after every peer had arrived: gloo's ring lets members end apart); a thread that resumed
before the last peer arrived did not wait for it (a 7 ms broadcast of tests/torch_trace_workload.py
on a loaded CPU whose launch op ran 5.5 ms and returned 1.6 ms before the root started).

The marks are extra zero-length "runtime calls" appended after the trace's own calls (a view of the
trace: the trace's call indices keep their meaning), so the host chains are cut at them.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from itercast.graph.execgraph import Category, GraphBuilder
from itercast.traces.collective_sizes import NCCL_KINDS
from itercast.traces.host_waits import EPS_US
from itercast.traces.kineto import RankTrace

#: bytes per element of a gloo collective's tensors: Kineto records a TensorList's dims, not its dtype;
#: CPU training runs in fp32 (an assumption, said where sizes are used)
CPU_ELEMENT_BYTES = 4
#: gloo's point-to-point annotations (ProcessGroupGloo SendWork/RecvWork): not collectives; the
#: pipeline what-if reads them (traces/pipeline_stages.py)
POINT_TO_POINT = ("gloo:send", "gloo:recv")
#: a gap of the launching thread this share of a collective's annotated time or longer is a wait for it
#: (a judgement: the gaps between a computing thread's ops are µs, waits for ms-long collectives ms)
WAIT_SHARE = 0.1
#: a gap right after a collective's launch this share of its annotated time or longer is a wait for it
#: at once (a synchronous collective: the thread resumes when it ends, up to a few ms before its
#: annotation closes on an oversubscribed CPU, see above); shorter gaps there are the OS taking the core
#: (1.8 ms after a 15 ms bucket's launch on rank 0 of data/measured/gloo_parallelism ws2)
SYNC_SHARE = 0.5


@dataclass(frozen=True)
class CpuCollective:
    """One gloo collective of a rank: its annotation (index into comm_*), kind, the view's call of its
    launch mark with the lag from it to the collective's start, the view's call that resumes after
    waiting for it (−1: never waited for), its buffer's bytes (None: no dims recorded), and when it
    was done for this rank (µs: its annotation's end, or the waiting thread's resume if earlier)."""

    op: int
    kind: str
    launch_call: int
    lag_us: float
    resume_call: int
    nbytes: float | None
    end_us: float


def op_collective_kind(name: str) -> str | None:
    """`gloo:all_reduce`, `c10d::allreduce_` → all_reduce (None: not a collective)."""
    return NCCL_KINDS.get(name.partition(":")[2].lstrip(":").rstrip("_").lower())


def with_collective_marks(t: RankTrace, notes: Counter) -> tuple[RankTrace, list[CpuCollective]]:
    """A view of the trace with launch and wait marks appended to its runtime calls, and its collectives."""
    if not t.comm_ts_us.size:
        return t, []
    launches = _pair_launches(t, notes)
    if not launches:
        return t, []
    marks: list[tuple[int, float, str]] = []  # (thread, time, name) of each appended call
    first = t.call_ts_us.shape[0]
    found: list[CpuCollective] = []
    resume_of: dict[tuple[int, float, float], int] = {}
    for (op, launch, kind), wait in zip(launches, _waits(t, launches), strict=True):
        tid = int(t.cpu_tid[launch])
        marks.append((tid, float(t.cpu_ts_us[launch]), t.names[t.cpu_name[launch]]))
        launch_call = first + len(marks) - 1
        resume, end_us = -1, float(t.comm_ts_us[op] + t.comm_dur_us[op])
        if wait is not None:
            end_us = min(end_us, wait[1])
            key = (tid, *wait)
            if key not in resume_of:
                marks += [(tid, wait[0], "cpu: waits for collectives"), (tid, wait[1], "cpu: resumes")]
                resume_of[key] = first + len(marks) - 1
            resume = resume_of[key]
        lag_us = max(0.0, float(t.comm_ts_us[op] - t.cpu_ts_us[launch]))
        nbytes = tensor_bytes(t.cpu_input_dims[launch])
        found.append(CpuCollective(op, kind, launch_call, lag_us, resume, nbytes, end_us))
    if never := sum(c.resume_call < 0 for c in found):
        notes["CPU collectives never waited for in the trace"] += never
    names = list(t.names)
    index = {n: i for i, n in enumerate(names)}
    for _, _, name in marks:
        if name not in index:
            index[name] = len(names)
            names.append(name)
    view = dataclasses.replace(
        t,
        names=names,
        call_tid=np.concatenate([t.call_tid, np.array([m[0] for m in marks], np.int64)]),
        call_name=np.concatenate([t.call_name, np.array([index[m[2]] for m in marks], t.call_name.dtype)]),
        call_ts_us=np.concatenate([t.call_ts_us, np.array([m[1] for m in marks])]),
        call_dur_us=np.concatenate([t.call_dur_us, np.zeros(len(marks))]),
        call_corr=np.concatenate([t.call_corr, np.full(len(marks), -1, np.int64)]),
    )
    return view, found


def _pair_launches(t: RankTrace, notes: Counter) -> list[tuple[int, int, str]]:
    """(annotation, launch op, kind) triples: the k-th `gloo:` annotation of a kind with the k-th `c10d::` op
    of that kind, each launch starting before its annotation; a kind whose counts or order disagree
    is left out (counted)."""
    pairs: list[tuple[int, int, str]] = []
    ops: dict[str, list[int]] = defaultdict(list)
    for k, name_id in enumerate(t.cpu_name.tolist()):
        name = t.names[name_id]
        if name.startswith("c10d::") and (kind := op_collective_kind(name)):
            ops[kind].append(k)
    runs: dict[str, list[int]] = defaultdict(list)
    for k in np.argsort(t.comm_ts_us, kind="stable").tolist():
        name = t.names[t.comm_name[k]]
        if name in POINT_TO_POINT:
            notes["gloo send/recv annotations (point-to-point: the thread's measured time is kept)"] += 1
            continue
        runs[op_collective_kind(name) or "?"].append(k)
    for kind, runs_of_kind in runs.items():
        launch = sorted(ops.get(kind, []), key=lambda k: float(t.cpu_ts_us[k]))
        if len(launch) != len(runs_of_kind) or any(
            t.cpu_ts_us[c] > t.comm_ts_us[a] + EPS_US for a, c in zip(runs_of_kind, launch, strict=True)
        ):
            notes[f"gloo {kind} annotations not paired with their c10d launch ops (left out)"] += len(runs_of_kind)
            continue
        pairs += [(a, c, kind) for a, c in zip(runs_of_kind, launch, strict=True)]
    return sorted(pairs, key=lambda p: float(t.cpu_ts_us[p[1]]))


def _waits(t: RankTrace, launches: list[tuple[int, int, str]]) -> list[tuple[float, float] | None]:
    """Per (annotation, launch, kind) in launch order: the idle stretch (start, end µs) of the launching
    thread during which it waited for the collective, or for the next one launched after it. Gaps are
    those between the thread's ops at the level of the launches (level_ops). A synchronous collective
    (no async_op) is waited for at once: inside its launch op, where that op runs on for SYNC_SHARE
    of the annotation after it starts (the stretch: from the annotation's start to the op's end), or
    in the gap right after the launch if it lasts SYNC_SHARE of the annotation. Otherwise:

    A collective launched in a step is waited for in that step (DDP, FSDP and pipeline schedules wait
    for their step's collectives before the optimizer): the stretch is the longest gap from the
    launch to the end of its step (the annotation's end outside steps), if it lasts WAIT_SHARE of the
    annotation or more; it may end before the annotation does (module docstring). Gaps while the
    thread computes are µs long, or a few ms where the OS took its core (2.1 ms on rank 1 of
    data/measured/gloo_parallelism ws2): shorter than the wait at the step's end."""
    out: list[tuple[float, float] | None] = []
    gaps: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for op, launch, _ in launches:
        tid, launch_us = int(t.cpu_tid[launch]), float(t.cpu_ts_us[launch])
        if tid not in gaps:
            top = level_ops(t, tid, [k for _, k, _ in launches if t.cpu_tid[k] == tid])
            gaps[tid] = ((t.cpu_ts_us[top] + t.cpu_dur_us[top])[:-1], t.cpu_ts_us[top][1:])
        idle_from, idle_to = gaps[tid]
        start, end = float(t.comm_ts_us[op]), float(t.comm_ts_us[op] + t.comm_dur_us[op])
        until = next((ts + dur for _, s_tid, ts, dur in t.steps if s_tid == tid and ts <= launch_us <= ts + dur), end)
        launch_end = launch_us + float(t.cpu_dur_us[launch])
        if launch_end - start >= SYNC_SHARE * (end - start):  # waited inside its launch op
            out.append((max(launch_us, start), launch_end))
            continue
        inside = np.flatnonzero((idle_from >= launch_us) & (idle_to <= until + EPS_US))
        longest = inside[np.argmax((idle_to - idle_from)[inside])] if inside.size else -1
        at_once = inside[np.abs(idle_from[inside] - launch_end) <= EPS_US]
        if at_once.size and idle_to[at_once[0]] - idle_from[at_once[0]] >= SYNC_SHARE * (end - start):
            longest = at_once[0]  # a synchronous collective (no async_op): waited for right after its launch
        waited = longest >= 0 and idle_to[longest] - idle_from[longest] >= WAIT_SHARE * (end - start)
        out.append((float(idle_from[longest]), float(idle_to[longest])) if waited else None)
    for i in range(len(out) - 2, -1, -1):  # never waited: waited for with the next one
        if out[i] is None:
            out[i] = out[i + 1]
    return out


def level_ops(t: RankTrace, tid: int, launches: list[int]) -> np.ndarray:
    """The thread's top-level ops, where an op that encloses a collective's launch gives way to its
    children (Megatron's f/g autograd functions and DDP's gradient hooks launch from inside an op):
    the gaps between them are where the thread waited."""
    own = np.flatnonzero(t.cpu_tid == tid)
    start, end = t.cpu_ts_us[own], t.cpu_ts_us[own] + t.cpu_dur_us[own]
    encloses = np.zeros(own.shape[0], dtype=bool)
    for k in launches:
        encloses |= (start <= t.cpu_ts_us[k]) & (end >= t.cpu_ts_us[k] + t.cpu_dur_us[k]) & (own != k)
    own = own[~encloses]
    own = own[np.lexsort((-t.cpu_dur_us[own], t.cpu_ts_us[own]))]  # parents before children
    ends = t.cpu_ts_us[own] + t.cpu_dur_us[own]
    reach = np.maximum.accumulate(np.concatenate([[-np.inf], ends[:-1]]))  # latest end before each op
    return own[t.cpu_ts_us[own] >= reach]


def tensor_bytes(dims_json: str) -> float | None:
    """Bytes of the tensors in a launch op's first input ("Input Dims": a tensor's shape, or a list of them)."""
    try:
        first = json.loads(dims_json)[0] if dims_json else None
    except (ValueError, IndexError, TypeError):
        return None
    shapes = first if first and all(isinstance(s, list) for s in first) else [first]
    try:
        elements = sum(float(np.prod(s)) for s in shapes if isinstance(s, list) and s)
    except (TypeError, ValueError):
        return None
    return elements * CPU_ELEMENT_BYTES if elements > 0 else None


def add_cpu_collectives(
    b: GraphBuilder,
    t: RankTrace,
    rank: int,
    collectives: list[CpuCollective],
    call_task: np.ndarray,
    before_call: np.ndarray,
) -> dict[int, dict]:
    """Each collective a task on its gloo thread after its launch mark. Returns task → metadata (kind,
    bytes, group size, rank; the idle piece before its resume mark and when that mark is, µs) for
    re-timing, rendezvous and the waits (`add_cpu_waits`)."""
    meta: dict[int, dict] = {}
    for c in sorted(collectives, key=lambda c: float(t.comm_ts_us[c.op])):
        res = b.resource(rank, f"gloo:{int(t.comm_tid[c.op])}")
        name = t.names[t.comm_name[c.op]]
        start_us = float(t.comm_ts_us[c.op])
        task = b.task(name, res, (c.end_us - start_us) * 1e-6, Category.COMMUNICATION, "collective")
        b.edge(int(call_task[c.launch_call]), task, c.lag_us * 1e-6)
        meta[task] = {
            "kind": c.kind,
            "nbytes": c.nbytes,
            "group_size": int(t.world_size or 0),
            "rank": rank,
            "start_us": start_us,
            "end_us": c.end_us,
            "piece": int(before_call[c.resume_call]) if c.resume_call >= 0 else -1,
            "resume_us": float(t.call_ts_us[c.resume_call]) if c.resume_call >= 0 else None,
        }
    return meta


def add_cpu_waits(b: GraphBuilder, comm_meta: dict[int, dict]) -> None:
    """Each resume mark's idle piece waits for the collectives it waited for and keeps only the
    measured part after the last of them; not for one done before its last peer arrived
    (`match_cpu_collectives`: the thread resumed while it was still open)."""
    waited: dict[int, list[int]] = defaultdict(list)
    for task, m in comm_meta.items():
        if m["piece"] >= 0 and not m.get("done_before_peers"):
            waited[m["piece"]].append(task)
    for piece, tasks in waited.items():
        last_end_us = max(comm_meta[task]["end_us"] for task in tasks)
        for task in tasks:
            b.edge(task, piece)
        resume_us = comm_meta[tasks[0]]["resume_us"]
        b.set_duration(piece, min(b.duration(piece), max(0.0, resume_us - last_end_us) * 1e-6))


def match_cpu_collectives(b: GraphBuilder, world: int, comm_meta: dict[int, dict], notes: Counter) -> tuple[int, ...]:
    """The k-th collective of a kind on every loaded rank is one rendezvous when all `world` ranks are
    loaded; each member lasts from the last member's start to its own end (`transfer_s`). A member
    done for its rank before the last member started (its waiting thread resumed then: the OS had
    taken the core inside the launch op, or a root's buffered sends) was not waited for there
    (`done_before_peers`, left out by `add_cpu_waits`). Returns the matched ranks."""
    ranks = {m["rank"] for m in comm_meta.values()}
    if len(ranks) < 2 or len(ranks) != world:
        if comm_meta:
            notes["CPU collectives kept at measured time (not every rank loaded)"] += len(comm_meta)
        return ()
    seq: dict[tuple[str, int], dict[int, int]] = defaultdict(dict)
    count: Counter = Counter()
    for task, m in sorted(comm_meta.items()):
        count[(m["rank"], m["kind"])] += 1
        seq[(m["kind"], count[(m["rank"], m["kind"])])][m["rank"]] = task
    for members in seq.values():
        if set(members) != ranks:
            notes["CPU collectives without all peers (measured time kept)"] += len(members)
            continue
        coll = b.new_collective()
        last_start_us = max(comm_meta[task]["start_us"] for task in members.values())
        for task in members.values():
            b.join_collective(task, coll)
            m = comm_meta[task]
            m["transfer_s"] = max(0.0, m["end_us"] - last_start_us) * 1e-6
            if m["end_us"] < last_start_us - EPS_US and m["piece"] >= 0:
                m["done_before_peers"] = True
                notes["CPU collectives done for a rank before its last peer arrived (not waited for)"] += 1
        notes["CPU collectives matched across ranks"] += 1
    return tuple(sorted(ranks))
