"""Message size of each NCCL collective in a replayed trace, for re-timing it (DESIGN.md §4, §7).

From the trace's metadata where PyTorch recorded it: "Collective name", "In msg nelems",
"Out msg nelems", "dtype", "Group size" on the kernel or on the `record_param_comms` CPU op around
its launch (arg names of torch/csrc/profiler/util.h, kInMsgNelems …; kineto.py reads them). Where
it did not (older PyTorch wrote record_param_comms without sizes), inferred: the bytes for which
the collective model of the trace's own system (its GPU named in `deviceProperties`) takes the
measured time (the transfer time where the collective was matched across ranks; else the kernel's
time, which includes waiting for peers, so the size is an upper bound). Flagged `inferred`.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from itercast.config.job import load_system
from itercast.config.presets import preset_names
from itercast.costs.analytic import AnalyticCostModel
from itercast.hardware.topology import place_group
from itercast.traces.kineto import RankTrace
from itercast.traces.rendezvous import parse_ranks

NCCL_KINDS = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allgather": "all_gather",
    "_allgather_base": "all_gather",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "alltoall": "alltoall",
    "all_to_all": "alltoall",
    "alltoall_base": "alltoall",
    "broadcast": "broadcast",
}
#: the collective in an NCCL kernel's name (ncclKernel_AllReduce_RING_LL_Sum_float,
#: ncclDevKernel_AllGather_RING_LL, …: NCCL src/device/generate.py); SendRecv carries point-to-point
#: and all-to-all alike, so it names no collective
KERNEL_KINDS = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter"}
KERNEL_KINDS |= {"Broadcast": "broadcast"}
KERNEL_KIND = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+?)_")
DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "double": 8,
    "int": 4,
    "int32": 4,
    "long": 8,
    "int64": 8,
    "byte": 1,
    "char": 1,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
GPU_FAMILY = re.compile(r"[A-Z]\d{2,3}")  # V100, A100, H100, H200: the part of a GPU's name that names its kind
MAX_INFERRED_BYTES = 1 << 40  # no training collective moves a TiB: a time the model cannot reach stays measured


@dataclass(frozen=True)
class CollectiveSize:
    """A collective's kind, full-buffer bytes and group size; `inferred` where the bytes came from its time;
    `own_system`: the system preset of the trace's GPU (trace_system), None where no preset has it."""

    kind: str
    nbytes: float
    group_size: int
    inferred: bool
    own_system: str | None = None


def collective_kind(meta: dict, kernel_name: str) -> str | None:
    """The collective from its metadata, else from the NCCL kernel's name (None: unknown)."""
    kind = NCCL_KINDS.get(str(meta.get("Collective name", "")).lower())
    if kind is None and (m := KERNEL_KIND.search(kernel_name)):
        kind = KERNEL_KINDS.get(m.group(1))
    return kind


def trace_system(t: RankTrace) -> str | None:
    """The system preset whose GPU is the trace's (same family, e.g. V100), None if none is."""
    m = GPU_FAMILY.search(t.device_name or "")
    if m is None:
        return None
    return next((name for name in preset_names("system") if m.group(0) in load_system(name).gpu.name), None)


def collective_sizes(
    traces: list[RankTrace], gpu_task: dict[int, np.ndarray], nccl_meta: dict[int, dict], duration_s: np.ndarray
) -> tuple[dict[int, CollectiveSize], Counter]:
    """NCCL task → its size where metadata gives it or its time lets the model infer it; counts of
    why the others have none. `duration_s`: the replay graph's (measured) task durations."""
    sizes: dict[int, CollectiveSize] = {}
    missing: Counter = Counter()
    for index, t in enumerate(traces):
        rank = t.rank if t.rank is not None else index
        system = trace_system(t)
        for k, task in enumerate(gpu_task.get(rank, np.zeros(0, np.int64)).tolist()):
            meta = nccl_meta.get(task)
            if meta is None:
                continue
            kind = collective_kind(meta, t.names[t.op_name[k]])
            group = _group_size(meta, t)
            elems = meta.get("Out msg nelems" if kind == "all_gather" else "In msg nelems")
            item = DTYPE_BYTES.get(str(meta.get("dtype", "")).lower())
            if kind is None or group < 2:
                missing["no collective kind or group size"] += 1
            elif elems is not None and item is not None:
                sizes[task] = CollectiveSize(kind, float(elems) * item, group, False, system)
            elif system is None:
                missing[f"no size metadata, and no system preset for GPU {t.device_name!r}"] += 1
            elif (nbytes := infer_bytes(system, kind, group, float(meta.get("transfer_s", duration_s[task])))) is None:
                missing["no size metadata, and a time the collective model cannot reach"] += 1
            else:
                sizes[task] = CollectiveSize(kind, nbytes, group, True, system)
    return sizes, missing


def _group_size(meta: dict, t: RankTrace) -> int:
    if meta.get("Group size"):
        return int(meta["Group size"])
    ranks = parse_ranks(meta.get("Process Group Ranks", ""))
    return len(ranks) if ranks else int(t.world_size or 0)


@functools.cache
def builtin_model(system: str) -> AnalyticCostModel:
    """The system preset's collective model on the built-in curves (what sizes are inferred on)."""
    return AnalyticCostModel(load_system(system), "bf16")


def infer_bytes(system: str, kind: str, group_size: int, time_s: float) -> float | None:
    """Bytes for which `kind` over `group_size` GPUs of `system` takes `time_s` on the collective
    model (bisection on the log of the size; the model's time grows with the size), None where the
    time is at or below the model's latency floor or beyond MAX_INFERRED_BYTES."""
    model = builtin_model(system)
    group = place_group(group_size, 1, model.system.node.gpus_per_node)
    lo, hi = 1.0, float(MAX_INFERRED_BYTES)
    if model.collective_s(kind, lo, group) >= time_s or model.collective_s(kind, hi, group) < time_s:
        return None
    for _ in range(64):  # 2^-64 of the 40-bit log range: far below a byte
        mid = float(np.sqrt(lo * hi))
        lo, hi = (mid, hi) if model.collective_s(kind, mid, group) < time_s else (lo, mid)
    return hi
