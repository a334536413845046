"""Host calls that wait for the GPU, found in a Kineto trace (DESIGN.md §7: host waits are derived,
not replayed).

A runtime call that blocks until GPU work finishes measures the GPU, not the host: replaying its
measured duration would keep a GPU-bound step fixed under any kernel what-if. Each such call becomes
a wait on the GPU ops it waited for (edges in the replay graph) plus its own overhead:
- synchronisations: `cuda{Device,Stream,Event}Synchronize`, blocking `cudaMemcpy`, `cudaMemcpyAsync`
  to pageable host memory (host_overheads.synchronising_calls), and the copy of `.item()`
  (`aten::_local_scalar_dense` copies a scalar to the host and waits for it: PyTorch
  aten/src/ATen/native/cuda/CUDAScalar.cu, `at::cuda::memcpy_and_sync`). They wait for the op whose
  measured end they waited for (every stream's last op for `cudaDeviceSynchronize`, the copy itself
  for a blocking copy); their own time is the part after that end.
- launch back-pressure: a stream's launch queue holds a bounded number of pending launches (about
  1,000 per stream: NVIDIA developer forum "CUDA stream are blocked when launch lots of kernels
  (>1000)", t/68937, and StackOverflow 53970187); a launch into a full queue returns only when an
  earlier op on the stream completes. A launch call far longer than its name's median while its
  stream holds nearly the queue's depth of launched-not-started ops waits for the op on that stream
  whose measured end came last before the call returned; its own time is the name's median.
  The depth is measured from the trace: the most ops pending at the start of any long launch
  (DEFAULT_QUEUE_DEPTH where no launch was held). Every other launch gets the same wait as an edge
  that the measurement leaves slack, so a what-if that slows the GPU fills the queue and holds the host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from itercast.traces.host_overheads import synchronising_calls
from itercast.traces.kineto import RankTrace

EPS_US = 1.0  # timestamps are µs; closer than this counts as "at the same time"
LAUNCH_CALL = re.compile(r"^cu(da)?Launch")  # cudaLaunchKernel(ExC), cuLaunchKernel(Ex), cudaLaunchCooperativeKernel
#: a launch this many times its name's median duration is long: launches cost a few µs
#: (StackOverflow 53970187: 4-5 µs, against ~190 µs once the queue is full)
LONG_LAUNCH_FACTOR = 10.0
#: a queue shallower than this is not the launch queue (~1,000 per stream, sources above): long
#: launches with fewer ops pending are something else (lazy module loading, allocator calls)
MIN_QUEUE_DEPTH = 64
#: a long launch is back-pressure when its stream holds at least this share of the measured depth:
#: Kineto aligns GPU and CPU clocks to a few µs, so an op starting as the launch begins may be
#: counted as started or pending; a tenth of the queue absorbs that without taking a half-empty queue
QUEUE_FULL_SHARE = 0.9
#: the depth used where the trace never shows a full queue (sources above: "about 1000 kernels" per
#: stream; 1024 as the brief of issue 30 and common reports round it)
DEFAULT_QUEUE_DEPTH = 1024
LOCAL_SCALAR = "aten::_local_scalar_dense"


@dataclass(frozen=True)
class HostWait:
    """Runtime call `call` (trace call index) waits for GPU ops `ops` (trace op indices), then
    `lag_us` (the measured slack between their end and its own work), then runs `own_us`."""

    call: int
    ops: tuple[int, ...]
    own_us: float
    lag_us: float
    kind: str


def host_waits(t: RankTrace, call_of: np.ndarray) -> tuple[list[HostWait], LaunchQueue | None]:
    """Every host call of the trace that waited for the GPU, and its launch queues (None where
    nothing was launched). `call_of[k]`: the call that launched op k (−1 none)."""
    held, queue = launch_queue(t, call_of)
    return sync_waits(t, call_of) + held, queue


def sync_waits(t: RankTrace, call_of: np.ndarray) -> list[HostWait]:
    """Synchronising calls and blocking copies: each waits for the GPU op whose end it waited for."""
    blocking = synchronising_calls(t, call_of) | _local_scalar_copies(t)
    calls = np.flatnonzero(blocking)
    if not calls.size or not t.num_ops:
        return []
    ends = t.op_ts_us + t.op_dur_us
    op_launch_ts = np.where(call_of >= 0, t.call_ts_us[np.maximum(call_of, 0)], t.op_ts_us)
    by_launch = np.argsort(op_launch_ts, kind="stable")
    out = []
    for c in calls.tolist():
        name = t.names[t.call_name[c]]
        ts, te = float(t.call_ts_us[c]), float(t.call_ts_us[c] + t.call_dur_us[c])
        if name.startswith("cudaMemcpy"):  # a blocking copy waits for itself
            before = np.flatnonzero(call_of == c)
        else:
            launched = by_launch[: int(np.searchsorted(op_launch_ts[by_launch], ts, side="right"))]
            before = launched[ends[launched] <= te + EPS_US]
        if not before.size:
            continue
        last_per_stream: dict[int, int] = {}
        for k in before[np.argsort(op_launch_ts[before], kind="stable")].tolist():
            last_per_stream[int(t.op_stream[k])] = k
        waited = list(last_per_stream.values())
        if name != "cudaDeviceSynchronize":
            waited = [max(waited, key=lambda k: ends[k])]
        binding = max(float(ends[k]) for k in waited)
        own = te - binding if binding > ts else te - ts  # it waited: its own time is the part after the GPU
        out.append(HostWait(c, tuple(waited), max(0.0, own), 0.0, "synchronisations linked to GPU ops"))
    return out


def _local_scalar_copies(t: RankTrace) -> np.ndarray:
    """Mask over runtime calls: the `cudaMemcpyAsync` inside an `aten::_local_scalar_dense` of its thread."""
    mask = np.zeros(t.call_ts_us.shape[0], dtype=bool)
    if LOCAL_SCALAR not in t.names or "cudaMemcpyAsync" not in t.names:
        return mask
    scalar = np.flatnonzero(t.cpu_name == t.names.index(LOCAL_SCALAR))
    copies = np.flatnonzero(t.call_name == t.names.index("cudaMemcpyAsync"))
    for op in scalar.tolist():
        lo, hi = t.cpu_ts_us[op], t.cpu_ts_us[op] + t.cpu_dur_us[op]
        inside = (t.call_tid[copies] == t.cpu_tid[op]) & (t.call_ts_us[copies] >= lo) & (t.call_ts_us[copies] <= hi)
        mask[copies[inside]] = True
    return mask


@dataclass(frozen=True)
class LaunchQueue:
    """A rank's launch queues: `depth` launched-not-started ops per stream (`measured`: seen full in
    the trace, else DEFAULT_QUEUE_DEPTH), and for the launch calls `calls` the op `frees` whose end
    lets them enqueue (the op `depth` + 1 places earlier on the stream): edges that hold the host
    back when a what-if slows the GPU, kept only where the measurement agrees."""

    depth: int
    measured: bool
    calls: np.ndarray
    frees: np.ndarray


def launch_queue(t: RankTrace, call_of: np.ndarray) -> tuple[list[HostWait], LaunchQueue | None]:
    """Launches held back by a full launch queue, and the queue (module docstring)."""
    ops = np.flatnonzero(call_of >= 0)
    if not ops.size:
        return [], None
    calls = call_of[ops]
    pending = _pending_at_launch(t, call_of, ops)
    is_launch = np.array([bool(LAUNCH_CALL.match(n)) for n in t.names], dtype=bool)[t.call_name[calls]]
    dur = t.call_dur_us[calls]
    typical = np.zeros(ops.shape[0])
    for name in np.unique(t.call_name[calls]).tolist():
        same = t.call_name[calls] == name
        typical[same] = np.median(dur[same])
    long_ = is_launch & (dur > LONG_LAUNCH_FACTOR * typical) & (pending >= MIN_QUEUE_DEPTH)
    measured = bool(long_.any())
    depth = int(pending[long_].max()) if measured else max(DEFAULT_QUEUE_DEPTH, int(pending.max()) + 1)
    held = long_ & (pending >= QUEUE_FULL_SHARE * depth)
    frees = _slot_freed_by(t, call_of, ops, depth)
    ends = t.op_ts_us + t.op_dur_us
    free_end = ends[np.maximum(frees, 0)]
    te = t.call_ts_us[calls] + dur
    waits = held & (frees >= 0) & (free_end <= te + EPS_US)
    lag = np.maximum(0.0, te - typical - free_end)
    kind = "launches held by a full launch queue"
    rows = zip(calls[waits].tolist(), frees[waits].tolist(), typical[waits].tolist(), lag[waits].tolist(), strict=True)
    out = [HostWait(c, (f,), own, g, kind) for c, f, own, g in rows]
    agree = ~held & (frees >= 0) & (free_end <= t.call_ts_us[calls] + EPS_US)  # not binding as measured
    return out, LaunchQueue(depth, measured, calls[agree], frees[agree])


def _slot_freed_by(t: RankTrace, call_of: np.ndarray, ops: np.ndarray, depth: int) -> np.ndarray:
    """For each op in `ops`: the op `depth` + 1 launches earlier on its stream (−1 none): with `depth`
    ops pending, a launch returns when the running op ends and the next starts."""
    launch_ts = t.call_ts_us[call_of[ops]]
    out = np.full(ops.shape[0], -1, dtype=np.int64)
    for stream in np.unique(t.op_stream[ops]).tolist():
        mine = np.flatnonzero(t.op_stream[ops] == stream)
        mine = mine[np.argsort(launch_ts[mine], kind="stable")]
        out[mine[depth + 1 :]] = ops[mine[: -(depth + 1)]] if mine.shape[0] > depth + 1 else []
    return out


def _pending_at_launch(t: RankTrace, call_of: np.ndarray, ops: np.ndarray) -> np.ndarray:
    """For each op in `ops`: the ops on its stream launched before its launch call began and not yet
    started then (a stream runs its ops in order, so started ones are a prefix by start time)."""
    launched = call_of >= 0
    launch_ts = np.where(launched, t.call_ts_us[np.maximum(call_of, 0)], np.inf)
    out = np.zeros(ops.shape[0], dtype=np.int64)
    for stream in np.unique(t.op_stream[ops]).tolist():
        on = t.op_stream == stream
        sorted_launch = np.sort(launch_ts[on & launched])
        sorted_start = np.sort(t.op_ts_us[on & launched])
        mine = t.op_stream[ops] == stream
        at = t.call_ts_us[call_of[ops[mine]]]
        out[mine] = np.searchsorted(sorted_launch, at, side="left") - np.searchsorted(sorted_start, at, side="right")
    return out
