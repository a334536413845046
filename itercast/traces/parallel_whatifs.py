"""Parallelism what-ifs on a replayed trace (DESIGN.md §4, §7; issue 30 item 3).

Data-parallel size (`--dp N`): every gradient reduction of the trace (an all-reduce, reduce-scatter
or all-gather over the whole world: a data-parallel-only run; NCCL kernels and gloo collectives
alike) keeps its bucket and its replayed time (the transfer where it was matched across ranks), scaled
by the collective model of the trace's system for the new group over the old:

    t_new = t_replayed × model(kind, bytes, N) / model(kind, bytes, n)

(costs/analytic.collective_s: ring bus bytes 2(n−1)/n × bytes for an all-reduce, (n−1)/n for the
others, over the placement's bandwidth, plus the fit's latency terms, at least the latency floor;
0 at N = 1, where the reductions and their rendezvous go: each rank runs on alone).
The ratio keeps what the trace measured (its machine, its contention) and moves only what the group
size changes; what else a bigger group changes (stragglers) is not modelled. On a host given by
`--host-cores` (every rank on it), a CPU collective's scheduler waits come out first and the
target's go in (retime_cpu_collective, sim/sharing.scheduler_wait_s); compute contention on the
shared cores is the processor sharing of sim/sharing.py. The model: `--system`'s if given, else
the trace's GPU's preset, else CPU_SYSTEM for CPU collectives; a calibration's collective curves
replace the built-in ones. Sizes: from metadata or Input Dims, else inferred from the time
(collective_sizes.infer_bytes).

Pipeline stages (`--pp-stages`): refused on a trace without pipeline sends (nothing to replicate or
join); re-staging a pipelined trace: restage.py.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from itercast.config.job import load_system
from itercast.costs.analytic import AnalyticCostModel
from itercast.errors import ConfigError
from itercast.hardware.topology import place_group
from itercast.sim.sharing import scheduler_wait_s
from itercast.traces.collective_sizes import collective_sizes, infer_bytes, trace_system
from itercast.traces.kineto import RankTrace
from itercast.traces.replay_graph import ReplayGraph

#: the system preset whose collective model times gloo collectives of a CPU trace (systems.yaml cpu-host)
CPU_SYSTEM = "cpu-host"
#: the collectives of a data-parallel gradient reduction (DDP: all-reduce; ZeRO/FSDP: reduce-scatter
#: of gradients, all-gather of parameters)
GRADIENT_KINDS = ("all_reduce", "reduce_scatter", "all_gather")
#: point-to-point between pipeline stages: NCCL's SendRecv kernels (src/device/generate.py), c10d's
#: send/recv ops and gloo's annotations of them
PIPELINE_SENDS = ("sendrecv", "c10d::send", "c10d::recv", "gloo:send", "gloo:recv")


def retime_data_parallel(
    rg: ReplayGraph,
    traces: list[RankTrace],
    dp: int,
    durations: np.ndarray,
    changes: Counter,
    system: str | None = None,
    curves: dict[str, Any] | None = None,
    host_cores: int | None = None,
) -> np.ndarray:
    """Scale `durations` of the trace's gradient reductions from their group size to `dp` (module
    docstring); returns the tasks that no longer rendezvous (all of them at `dp` 1: no peers).
    `host_cores`: the one host's cores, for the scheduler waits of CPU collectives."""
    if dp < 1:
        raise ConfigError(f"--dp: expected a data-parallel size ≥ 1; got {dp}")
    world = max((t.world_size or 0 for t in traces), default=0)
    found = _gradient_reductions(rg, traces, world, changes)
    if not found:
        raise ConfigError(
            "--dp: the traces hold no gradient reduction (all-reduce, reduce-scatter or all-gather over the "
            f"whole world of {world or 'unknown'} ranks) to re-time: record a data-parallel run of 2 or more ranks"
        )
    models: dict[str, AnalyticCostModel] = {}
    for task, (kind, nbytes, group, own_system, inferred) in found.items():
        name = system or own_system
        model = models.setdefault(name, AnalyticCostModel(load_system(name), "bf16", curves))
        if host_cores is not None and name == CPU_SYSTEM:
            durations[task] = retime_cpu_collective(model, kind, nbytes, group, dp, float(durations[task]), host_cores)
        else:
            durations[task] *= group_time_ratio(model, kind, nbytes, group, dp)
        how = " (size inferred)" if inferred else ""
        changes[f"gradient {kind} re-timed from data-parallel {group} to {dp} on {name}'s model{how}"] += 1
    return np.fromiter(found, np.int64, len(found)) if dp == 1 else np.zeros(0, np.int64)


def group_time_ratio(model: AnalyticCostModel, kind: str, nbytes: float, old: int, new: int) -> float:
    """The collective model's time for `new` ranks over its time for `old` (one node's placement)."""
    per_node = model.system.node.gpus_per_node
    old_s = model.collective_s(kind, nbytes, place_group(old, 1, per_node))
    return model.collective_s(kind, nbytes, place_group(new, 1, per_node)) / old_s


def retime_cpu_collective(
    model: AnalyticCostModel, kind: str, nbytes: float, old: int, new: int, duration_s: float, cores: int
) -> float:
    """A CPU collective of `duration_s` over `old` ranks of a `cores`-core host, re-timed for `new`:
    its scheduler waits taken out, the rest scaled by group_time_ratio, the new group's waits added
    (0 at `new` 1: no collective)."""
    if new == 1:
        return 0.0
    own_s = max(duration_s - scheduler_wait_s(kind, old, cores), 0.0)
    return own_s * group_time_ratio(model, kind, nbytes, old, new) + scheduler_wait_s(kind, new, cores)


def _gradient_reductions(
    rg: ReplayGraph, traces: list[RankTrace], world: int, changes: Counter
) -> dict[int, tuple[str, float, int, str, bool]]:
    """Task → (kind, bytes, group size, system preset, bytes inferred from the time) of each gradient
    reduction over the whole world."""
    out: dict[int, tuple[str, float, int, str, bool]] = {}
    durations = rg.graph.duration_s
    system_of = {t.rank if t.rank is not None else i: trace_system(t) for i, t in enumerate(traces)}
    rank_of = {int(task): rank for rank, tasks in rg.gpu_task.items() for task in tasks.tolist()}
    sizes, missing = collective_sizes(traces, rg.gpu_task, rg.nccl_meta, durations)
    for why, n in missing.items():
        changes[f"NCCL kernels kept at measured time ({why})"] += n
    for task, size in sizes.items():
        system = system_of.get(rank_of[task])
        if size.kind in GRADIENT_KINDS and size.group_size == world and system is not None:
            out[task] = (size.kind, size.nbytes, size.group_size, system, size.inferred)
        else:
            changes["collectives kept at measured time (not a gradient reduction over the whole world)"] += 1
    for task, meta in rg.cpu_comm.items():
        group, kind = int(meta["group_size"]), str(meta["kind"])
        nbytes = meta["nbytes"] or infer_bytes(CPU_SYSTEM, kind, group, float(durations[task]))
        if kind in GRADIENT_KINDS and group == world and group >= 2 and nbytes:
            out[task] = (kind, float(nbytes), group, CPU_SYSTEM, not meta["nbytes"])
        else:
            changes["gloo collectives kept at measured time (not a sized gradient reduction over the world)"] += 1
    return out


def check_pipeline_stages(rg: ReplayGraph, traces: list[RankTrace], stages: int) -> None:
    """`--pp-stages`: one ConfigError saying why the traces cannot support it."""
    if stages < 1:
        raise ConfigError(f"--pp-stages: expected a number of pipeline stages ≥ 1; got {stages}")
    names = {rg.graph.names[rg.graph.name[task]].lower() for task in rg.nccl_meta}
    names |= {t.names[k].lower() for t in traces for k in np.unique(np.concatenate([t.cpu_name, t.comm_name]))}
    if not any(send in name for name in names for send in PIPELINE_SENDS):
        raise ConfigError(
            "--pp-stages: the traces hold no pipeline sends (NCCL SendRecv kernels, c10d/gloo send or recv): "
            "a run without pipeline stages has no stage graphs to replicate or join"
        )
