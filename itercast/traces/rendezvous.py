"""Rendezvous of NCCL kernels across the loaded ranks' traces (DESIGN.md §7).

The k-th issue of a collective on a process group (its "Process Group Ranks" and "Collective name",
or the kernel's name and order where the trace has no NCCL metadata) is one collective on every
member rank. Its duration is the smallest member duration: the last member to arrive waits for
nobody, so its kernel time is the transfer (method "last_arrival"). A collective whose members are
not all loaded keeps its measured durations, waiting for peers included.

`measured_starts_s` places the ranks' steps on one clock through the same rendezvous: every member's
kernel of a collective ends together (the PARAM DLRM 8 × V100 step: the first all-to-all ends within
2 µs on all 8 ranks), so a rank's step start relative to the end of its first collective compares
across ranks without assuming their traces share a clock.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict

import numpy as np

from itercast.graph.execgraph import GraphBuilder
from itercast.traces.kineto import RankTrace, TraceError

KERNEL_BASE = re.compile(r"^[^(<]+")


def match_collectives(
    b: GraphBuilder, traces: list[RankTrace], gpu_task: dict, nccl_meta: dict, notes: Counter
) -> tuple[int, ...]:
    """Join each collective's member kernels (sets `transfer_s` and `method` in their metadata);
    returns the ranks that took part in at least one matched collective, in order."""
    loaded = {t.rank if t.rank is not None else i for i, t in enumerate(traces)}
    if len(traces) < 2:
        if nccl_meta:
            notes["NCCL kernels kept at measured time (peers not loaded)"] += len(nccl_meta)
        return ()
    seq: dict[tuple, dict[int, int]] = defaultdict(dict)
    counters: Counter = Counter()
    for i, t in enumerate(traces):
        rank = t.rank if t.rank is not None else i
        for k in np.argsort(t.op_ts_us, kind="stable").tolist():
            task = int(gpu_task[rank][k]) if rank in gpu_task else None
            if task is None or task not in nccl_meta:
                continue
            meta = nccl_meta[task]
            group = meta.get("Process Group Ranks")
            key = (group, meta.get("Collective name")) if group else ("?", kernel_base(t.names[t.op_name[k]]))
            counters[(rank, key)] += 1
            seq[(key, counters[(rank, key)])][rank] = task
    matched: set[int] = set()
    for (key, _), members in seq.items():
        group = key[0]
        expected = set(parse_ranks(group)) & loaded if group != "?" else loaded
        if set(members) != expected or len(members) < 2:
            notes["NCCL kernels without all peers loaded (measured time kept)"] += len(members)
            continue
        coll = b.new_collective()
        durations = [b.duration(task) for task in members.values()]
        for task in members.values():
            b.join_collective(task, coll)
            nccl_meta[task]["transfer_s"] = min(durations)
            nccl_meta[task]["method"] = "last_arrival"
        matched |= set(members)
        notes["NCCL collectives matched across ranks"] += 1
    return tuple(sorted(matched))


def measured_starts_s(traces: list[RankTrace]) -> list[float]:
    """Each rank's ProfilerStep start (s) after the earliest rank's: (latest lead) − its lead, where a
    rank's lead is the time from its step start to the end of its first NCCL kernel (the first
    rendezvous, the same instant on every rank). TraceError when a trace has no step mark or no NCCL
    kernel inside its step."""
    leads_us = []
    for t in traces:
        if not t.steps:
            raise TraceError(f"{t.path}: no ProfilerStep mark: the rank's start is unknown")
        start_us = t.steps[0][2]
        nccl = np.array(["nccl" in t.names[i].lower() for i in t.op_name.tolist()], dtype=bool)  # as kineto.py
        ends_us = (t.op_ts_us + t.op_dur_us)[nccl & (t.op_ts_us >= start_us)]
        if not ends_us.size:
            raise TraceError(f"{t.path}: no NCCL kernel in its first step: no rendezvous to align the ranks on")
        leads_us.append(float(ends_us.min()) - start_us)
    return [(max(leads_us) - lead) * 1e-6 for lead in leads_us]


def kernel_base(name: str) -> str:
    """A kernel's name without its argument list or template arguments."""
    m = KERNEL_BASE.match(name)
    return m.group(0) if m else name


def parse_ranks(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", str(text))]
