"""Stream PyTorch profiler (Kineto) Chrome-trace JSON into compact per-rank columns.

Reads `.json` or `.json.gz` with ijson (events one at a time: memory grows with the events kept,
never with the file's text), interns names, and keeps what replay needs:
- host runtime calls (cat cuda_runtime / cuda_driver): thread, name, start, duration, correlation;
- GPU ops (cat kernel, gpu_memcpy, gpu_memset): stream, name, start, duration, correlation, and
  NCCL metadata ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype",
  "Process Group Ranks", "Process Group Name", "Process Group Description"): on the kernel where
  PyTorch put it there, else taken from the
  `record_param_comms` CPU op (or the `nccl:<collective>` annotation, which names only the
  collective) around the kernel's launch call on the launching thread, as HolisticTraceAnalysis does
  (arg names as PyTorch writes them: torch/csrc/profiler/util.h kCommsName, kInMsgNelems, …);
- iteration marks (`ProfilerStep#N` annotations); `distributedInfo` (rank, world size); the GPU's
  name (`deviceProperties`);
- CPU ops (thread, name, start, duration, record-function id, input dims) to link execution traces;
- CPU collectives (`gloo:<collective>` annotations on the gloo worker threads: thread, name, start,
  duration), which replay joins to their `c10d::` launch ops (cpu_collectives.py).
Everything else is counted by reason in `ignored` (nothing is dropped silently). Timestamps are µs
in Kineto; absolute or relative to `baseTimeNanoseconds` (the offset is added). Stored in µs as
read; the graph builder converts to seconds.
"""

from __future__ import annotations

import json
import math
import re
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ijson
import numpy as np

from itercast.graph.execgraph import Interner
from itercast.traces.json_stream import TraceError, _HeadTailReader, _open, _top_level_value

HOST_CATEGORIES = {"cuda_runtime", "cuda_driver"}
GPU_CATEGORIES = {"kernel": 0, "gpu_memcpy": 1, "gpu_memset": 2}
STEP_NAME = re.compile(r"ProfilerStep#(\d+)")
NCCL_KEYS = (
    "Collective name",
    "In msg nelems",
    "Out msg nelems",
    "Group size",
    "dtype",
    "Process Group Ranks",
    "Process Group Name",
    "Process Group Description",
)
MAX_NAME_CHARS = 512  # longer names (templated kernels) are cut: interning cost stays bounded
MAX_TS_US = 1e17  # ~3,000 years in µs: absolute Kineto timestamps are ~1.7e15


@dataclass
class RankTrace:
    """One rank's trace in columns. Times in µs."""

    path: str
    rank: int | None
    world_size: int | None
    names: list[str]
    call_tid: np.ndarray
    call_name: np.ndarray
    call_ts_us: np.ndarray
    call_dur_us: np.ndarray
    call_corr: np.ndarray
    op_stream: np.ndarray
    op_kind: np.ndarray  # 0 kernel, 1 memcpy, 2 memset
    op_name: np.ndarray
    op_ts_us: np.ndarray
    op_dur_us: np.ndarray
    op_corr: np.ndarray
    op_nccl: list[dict[str, Any] | None]
    steps: list[tuple[int, int, float, float]]  # (step number, thread, start µs, duration µs)
    cpu_tid: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    cpu_name: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    cpu_ts_us: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cpu_dur_us: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cpu_rf_id: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # "Record function id", −1 if absent
    cpu_input_dims: list[str] = field(default_factory=list)  # "Input Dims" as compact JSON (for checking links)
    # explicit stream waits ("cuda_sync" Stream Wait Event, recorded with PyTorch's enable_cuda_sync_events):
    # rows (waiting stream, producer stream, correlation of the cudaEventRecord, correlation of the wait call)
    stream_waits: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.int64))
    comm_tid: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # gloo:<collective> annotations
    comm_name: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    comm_ts_us: np.ndarray = field(default_factory=lambda: np.zeros(0))
    comm_dur_us: np.ndarray = field(default_factory=lambda: np.zeros(0))
    ignored: Counter = field(default_factory=Counter)
    num_events: int = 0
    device_name: str | None = None  # the GPU's name (first entry of `deviceProperties`), None if absent
    host_pid: int | None = None  # the process that ran its CPU operators (their `pid`), None if not an integer
    # `distributedInfo.pg_config`: the run's process groups (pg_desc, pg_size, ranks), as recorded
    process_groups: list[dict[str, Any]] = field(default_factory=list)

    @property
    def num_ops(self) -> int:
        return int(self.op_ts_us.shape[0])

    def launch_calls(self) -> np.ndarray:
        """The runtime call that launched each GPU op (by correlation id), −1 where the trace has none."""
        corr = self.call_corr
        if not corr.size:
            return np.full(self.num_ops, -1, dtype=np.int64)
        by_corr = np.argsort(corr, kind="stable")
        pos = np.minimum(np.searchsorted(corr[by_corr], self.op_corr), corr.shape[0] - 1)
        found = (self.op_corr >= 0) & (corr[by_corr][pos] == self.op_corr)
        return np.where(found, by_corr[pos], -1).astype(np.int64)

    def top_level_ops(self, tid: int) -> np.ndarray:
        """CPU ops of thread `tid` that no other CPU op of that thread encloses, in time order
        (indices into the cpu_* columns): the operators the thread dispatched one after another."""
        own = np.flatnonzero(self.cpu_tid == tid)
        own = own[np.lexsort((-self.cpu_dur_us[own], self.cpu_ts_us[own]))]  # parents before children
        ends = self.cpu_ts_us[own] + self.cpu_dur_us[own]
        reach = np.maximum.accumulate(np.concatenate([[-np.inf], ends[:-1]]))  # latest end before each op
        return own[self.cpu_ts_us[own] >= reach]


class _Table:
    """The events of one kind, appended row by row into typed arrays (at most 8 bytes a field: no
    Python object per event); `column` hands one out as numpy without a copy."""

    def __init__(self, **typecodes: str) -> None:
        self.cols: dict[str, array[Any]] = {name: array(code) for name, code in typecodes.items()}

    def add(self, *values: float) -> None:
        for col, value in zip(self.cols.values(), values, strict=True):
            col.append(value)

    def column(self, name: str) -> np.ndarray:
        col = self.cols[name]
        return np.frombuffer(col, dtype={"q": np.int64, "i": np.int32, "b": np.int8, "d": np.float64}[col.typecode])


@dataclass
class _Columns:
    names: Interner = field(default_factory=Interner)
    calls: _Table = field(default_factory=lambda: _Table(tid="q", name="i", ts="d", dur="d", corr="q"))
    ops: _Table = field(default_factory=lambda: _Table(stream="q", kind="b", name="i", ts="d", dur="d", corr="q"))
    nccl: list[dict[str, Any] | None] = field(default_factory=list)
    steps: list[tuple[int, int, float, float]] = field(default_factory=list)
    cpu: _Table = field(default_factory=lambda: _Table(tid="q", name="i", ts="d", dur="d", rf_id="q"))
    gloo: _Table = field(default_factory=lambda: _Table(tid="q", name="i", ts="d", dur="d"))
    cpu_dims: list[str] = field(default_factory=list)
    dims_seen: dict[str, str] = field(default_factory=dict)  # one string object per distinct Input Dims
    waits: list[tuple[int, int, int, int]] = field(default_factory=list)
    comms: list[tuple[int, float, float, dict[str, Any]]] = field(default_factory=list)  # (tid, ts, dur, NCCL fields)
    cpu_pids: Counter = field(default_factory=Counter)  # the process ids of the CPU operators
    ignored: Counter = field(default_factory=Counter)
    count: int = 0


def read_kineto(path: str | Path) -> RankTrace:
    """Read one Kineto trace file (`.json` or `.json.gz`)."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    cols = _Columns()
    try:
        with _open(path) as raw:
            tap = _HeadTailReader(raw, path)
            for event in ijson.items(tap, "traceEvents.item", use_float=True):
                _take_checked(event, cols, path)
    except (ijson.JSONError, EOFError, OSError, UnicodeDecodeError) as exc:
        detail = " ".join(str(exc).split())  # ijson's messages span lines
        raise TraceError(f"{path}: malformed or truncated trace after {cols.count} events ({detail})") from None
    text = tap.edges()
    if '"traceEvents"' not in text:
        raise TraceError(f"{path}: not a Kineto trace (no `traceEvents` array)")
    base_ns = _top_level_value(text, "baseTimeNanoseconds") or 0
    info = _top_level_value(text, "distributedInfo") or {}
    if not isinstance(info, dict) or not isinstance(base_ns, int | float):
        raise TraceError(f"{path}: `distributedInfo` must be an object and `baseTimeNanoseconds` a number")
    props = _top_level_value(text, "deviceProperties")
    device = props[0].get("name") if isinstance(props, list) and props and isinstance(props[0], dict) else None
    trace = _finish(path, cols, float(base_ns) / 1000.0, info)
    trace.device_name = str(device) if device is not None else None
    groups = info.get("pg_config")
    trace.process_groups = [g for g in groups if isinstance(g, dict)] if isinstance(groups, list) else []
    return trace


class _BadField(ValueError):
    """An event field that is missing, of the wrong type, or out of range (the message says which)."""


def _take_checked(e: Any, c: _Columns, path: Path) -> None:
    """_take, with a malformed event turned into one clear error naming the file, event and field."""
    try:
        if not isinstance(e, dict):
            raise _BadField(f"expected an object; got {type(e).__name__}")
        _take(e, c)
    except _BadField as exc:
        where = f"{e.get('ph')}, {e.get('cat')}, {str(e.get('name', ''))[:60]!r}" if isinstance(e, dict) else ""
        raise TraceError(f"{path}: event #{c.count} ({where}): {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:  # an int field that is not an integer, a nested odd type
        raise TraceError(f"{path}: event #{c.count}: a field has the wrong type or is missing ({exc})") from None


def _time(e: dict[str, Any], key: str, default: float | None = None) -> float:
    """A time field in µs: present (unless defaulted), a finite number, |value| ≤ MAX_TS_US, and
    for durations not negative."""
    value = e.get(key, default)
    if value is None:
        raise _BadField(f"missing field `{key}`")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _BadField(f"field `{key}`: expected a number; got {value!r:.40}")
    value = float(value)
    if not abs(value) <= MAX_TS_US:  # also NaN
        raise _BadField(f"field `{key}`: expected a finite number of µs within ±{MAX_TS_US:.0e}; got {value!r}")
    if key == "dur" and value < 0:
        raise _BadField(f"field `dur`: expected a duration ≥ 0; got {value!r}")
    return value


def _args(e: dict[str, Any]) -> dict[str, Any]:
    args = e.get("args")
    if args is None:
        return {}
    if not isinstance(args, dict):
        raise _BadField(f"field `args`: expected an object; got {type(args).__name__}")
    return args


def _take(e: dict[str, Any], c: _Columns) -> None:
    c.count += 1
    ph, cat = e.get("ph"), e.get("cat")
    name = str(e.get("name", ""))[:MAX_NAME_CHARS]
    if ph == "X" and cat in HOST_CATEGORIES:
        args = _args(e)
        c.calls.add(
            int(e.get("tid", 0)),
            c.names(name),
            _time(e, "ts"),
            _time(e, "dur", 0.0),
            int(args.get("correlation", -1)),
        )
    elif ph == "X" and cat in GPU_CATEGORIES:
        args = _args(e)
        c.ops.add(
            int(args.get("stream", e.get("tid", 0))),
            GPU_CATEGORIES[cat],
            c.names(name),
            _time(e, "ts"),
            _time(e, "dur", 0.0),
            int(args.get("correlation", -1)),
        )
        meta = {k: args[k] for k in NCCL_KEYS if k in args} if "nccl" in name.lower() else None
        c.nccl.append(meta)
    elif ph == "X" and (m := STEP_NAME.fullmatch(name)) and cat in ("user_annotation", "cpu_op"):
        c.steps.append((int(m.group(1)), int(e.get("tid", 0)), _time(e, "ts"), _time(e, "dur", 0.0)))
    elif ph == "X" and cat == "cuda_sync":
        args = _args(e)
        if name == "Stream Wait Event" and int(args.get("wait_on_stream", -1)) >= 0:
            c.waits.append(
                (
                    int(args.get("stream", e.get("tid", -1))),
                    int(args["wait_on_stream"]),
                    int(args.get("wait_on_cuda_event_record_corr_id", -1)),
                    int(args.get("correlation", -1)),
                )
            )
        else:
            c.ignored["cuda_sync without a producer stream (the runtime call is used)"] += 1
    elif ph in ("s", "f", "t"):
        c.ignored["flow event (launch links come from correlation ids)"] += 1
    elif ph == "M":
        c.ignored["metadata"] += 1
    elif ph == "X" and cat == "user_annotation" and name.startswith("nccl:"):
        c.comms.append((int(e.get("tid", 0)), _time(e, "ts"), _time(e, "dur", 0.0), {"Collective name": name[5:]}))
    elif ph == "X" and cat == "user_annotation" and name.startswith("gloo:"):
        c.gloo.add(int(e.get("tid", 0)), c.names(name), _time(e, "ts"), _time(e, "dur", 0.0))
    elif ph == "X" and cat == "cpu_op":  # kept for linking to execution traces; replay times host gaps
        args = _args(e)
        if name == "record_param_comms" and (meta := {k: args[k] for k in NCCL_KEYS if k in args}):
            c.comms.append((int(e.get("tid", 0)), _time(e, "ts"), _time(e, "dur", 0.0), meta))
        c.cpu.add(
            int(e.get("tid", 0)),
            c.names(name),
            _time(e, "ts"),
            _time(e, "dur", 0.0),
            int(args.get("Record function id", -1)),
        )
        if (pid := integer_or_none(e.get("pid"))) is not None:  # a list or an object would not hash
            c.cpu_pids[pid] += 1
        dims = args.get("Input Dims")
        text = json.dumps(dims, separators=(",", ":"))[:MAX_NAME_CHARS] if dims is not None else ""
        c.cpu_dims.append(c.dims_seen.setdefault(text, text))
    elif ph == "X" and cat in ("user_annotation", "gpu_user_annotation", "python_function"):
        c.ignored[f"{cat} (annotation)"] += 1
    else:
        c.ignored[f"other ({ph}, {cat})"] += 1


def _count(path: Path, info: dict[str, Any], field: str, least: int) -> int | None:
    """distributedInfo's `field` (rank, world_size): an integer of at least `least`, or None where absent."""
    value = info.get(field)
    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not number or value != int(value) or value < least:
        raise TraceError(f"{path}: distributedInfo.{field}: expected an integer of at least {least}; got {value!r}")
    return int(value)


def _finish(path: Path, c: _Columns, base_us: float, info: dict[str, Any]) -> RankTrace:
    calls, cpu, ops, gloo = c.calls.column, c.cpu.column, c.ops.column, c.gloo.column
    world = _count(path, info, "world_size", 1)
    rank = _count(path, info, "rank", 0)
    if rank is not None and world is not None and rank >= world:
        raise TraceError(f"{path}: distributedInfo.rank: expected below its world_size {world}; got {rank}")
    return RankTrace(
        path=str(path),
        rank=rank,
        world_size=world,
        names=c.names.names,
        call_tid=calls("tid"),
        call_name=calls("name"),
        call_ts_us=calls("ts") + base_us,
        call_dur_us=calls("dur"),
        call_corr=calls("corr"),
        op_stream=ops("stream"),
        op_kind=ops("kind"),
        op_name=ops("name"),
        op_ts_us=ops("ts") + base_us,
        op_dur_us=ops("dur"),
        op_corr=ops("corr"),
        op_nccl=_nccl_metadata(c),
        steps=_unique_steps(path, c.steps, base_us),
        cpu_tid=cpu("tid"),
        cpu_name=cpu("name"),
        cpu_ts_us=cpu("ts") + base_us,
        cpu_dur_us=cpu("dur"),
        cpu_rf_id=cpu("rf_id"),
        cpu_input_dims=c.cpu_dims,
        stream_waits=np.array(c.waits, dtype=np.int64).reshape(-1, 4),
        comm_tid=gloo("tid"),
        comm_name=gloo("name"),
        comm_ts_us=gloo("ts") + base_us,
        comm_dur_us=gloo("dur"),
        ignored=c.ignored,
        num_events=c.count,
        host_pid=c.cpu_pids.most_common(1)[0][0] if c.cpu_pids else None,  # the process of the most operators
    )


def integer_or_none(value: Any) -> int | None:
    """`value` where it is an integer (a process id), else None (not a bool, float, string, list)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _unique_steps(
    path: Path, steps: list[tuple[int, int, float, float]], base_us: float
) -> list[tuple[int, int, float, float]]:
    """Step marks once each: a mark repeated exactly (the same step recorded twice) counts once; one
    step number marked at two different times is an error, not two steps."""
    seen: dict[int, tuple[int, int, float, float]] = {}
    for n, tid, ts, dur in steps:
        found = seen.setdefault(n, (n, tid, ts, dur))
        if (found[2], found[3]) != (ts, dur):
            raise TraceError(
                f"{path}: ProfilerStep#{n} is marked twice at different times ({found[2]:.0f} µs for "
                f"{found[3]:.0f} µs, and {ts:.0f} µs for {dur:.0f} µs)"
            )
    return [(n, tid, ts + base_us, dur) for n, tid, ts, dur in seen.values()]


def _nccl_metadata(c: _Columns) -> list[dict[str, Any] | None]:
    """Each NCCL kernel's fields: its own, completed by the communication records (record_param_comms,
    nccl:<collective>) around its launch call on the launching thread, innermost last (it wins)."""
    out = list(c.nccl)
    if not c.comms:
        return out
    calls = zip(c.calls.cols["tid"], c.calls.cols["ts"], c.calls.cols["corr"], strict=True)
    by_corr = {corr: (tid, ts) for tid, ts, corr in calls if corr >= 0}
    op_corr = c.ops.cols["corr"]
    records = sorted(c.comms, key=lambda r: (r[1], -r[2]))  # outer before inner at the same start
    for k, meta in enumerate(out):
        if meta is None or all(key in meta for key in ("Collective name", "In msg nelems", "dtype")):
            continue
        launch = by_corr.get(op_corr[k])
        if launch is None:
            continue
        tid, ts = launch
        for r_tid, r_ts, r_dur, fields in records:
            if r_tid == tid and r_ts <= ts <= r_ts + r_dur:
                meta.update({key: v for key, v in fields.items() if key not in meta or key == "Collective name"})
    return out


def read_traces(paths: list[str | Path], *, one_job: bool = True) -> list[RankTrace]:
    """Read a list of files or directories (every *.json / *.json.gz inside), one rank per file,
    sorted by rank (files without `distributedInfo` keep their order). `one_job`: refuse traces that
    are not the ranks of one run (_check_one_job); False for statistics taken trace by trace (host
    overheads), which any runs may pool."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.name.endswith((".json", ".json.gz")))
            if not found:
                raise TraceError(f"{p}: directory holds no .json or .json.gz trace")
            files += found
        else:
            files.append(p)
    traces = [read_kineto(f) for f in files]
    for t in traces:
        if not (t.num_ops or t.call_ts_us.size or t.cpu_ts_us.size):
            seen = ", ".join(f"{n} {why}" for why, n in t.ignored.most_common(3)) or "no events"
            raise TraceError(
                f"{t.path}: nothing to replay: no GPU ops, CUDA runtime calls or CPU ops ({seen}); expected a "
                "PyTorch profiler (Kineto) trace (itercast's own --trace output is a timeline to view, not to replay)"
            )
    if not one_job:
        return traces
    _check_one_job(traces)
    ranks = [t.rank for t in traces if t.rank is not None]
    if len(traces) > 1 and len(ranks) == len(traces):
        if len(set(ranks)) != len(ranks):
            raise TraceError(f"two traces claim the same rank: {sorted(ranks)}")
        traces.sort(key=lambda t: t.rank or 0)
    return traces


def _check_one_job(traces: list[RankTrace]) -> None:
    """Traces replayed together are the ranks of one run: they agree on the world size and were
    recorded at the same time (their spans overlap), else they are refused."""
    worlds = {t.world_size for t in traces if t.world_size is not None}
    if len(worlds) > 1:
        raise TraceError(f"the traces come from runs of different world sizes {sorted(worlds)}: replay one job's ranks")
    spans = []
    for t in traces:
        starts = [a for a in (t.op_ts_us, t.call_ts_us, t.cpu_ts_us) if a.size]
        ends = [
            a + d
            for a, d in ((t.op_ts_us, t.op_dur_us), (t.call_ts_us, t.call_dur_us), (t.cpu_ts_us, t.cpu_dur_us))
            if a.size
        ]
        spans.append((min(float(a.min()) for a in starts), max(float(e.max()) for e in ends), t.path))
    latest_start = max(spans, key=lambda sp: sp[0])
    earliest_end = min(spans, key=lambda sp: sp[1])
    if latest_start[0] > earliest_end[1]:
        raise TraceError(
            f"{earliest_end[2]} ends before {latest_start[2]} starts (at {earliest_end[1]:.0f} and "
            f"{latest_start[0]:.0f} µs): ranks of one job are profiled at the same time; these look like different runs"
        )
