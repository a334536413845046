"""What-if changes to a replayed trace: scale or drop kernel classes, re-time NCCL collectives with
the collective model of another system or another data-parallel world size (their sizes:
collective_sizes.py), change the data-parallel size (parallel_whatifs.py) or a CPU trace's
tensor-parallel size (tensor_parallel.py), re-time GEMMs from
execution-trace shapes, re-time the host (DESIGN.md §4, §7)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from itercast.config.job import load_system
from itercast.costs.analytic import AnalyticCostModel
from itercast.errors import ConfigError
from itercast.hardware.topology import place_group
from itercast.traces.collective_sizes import CollectiveSize, builtin_model, collective_sizes, trace_system
from itercast.traces.host_overheads import HostOverheads, modelled_host_us, synchronising_calls, thread_ops
from itercast.traces.kineto import RankTrace
from itercast.traces.parallel_whatifs import retime_data_parallel
from itercast.traces.replay_graph import ReplayGraph
from itercast.traces.tensor_parallel import retime_tensor_parallel

#: Kernel classes by name, first match wins (kept as data: add rules, not code).
#: Kernel classes by name, the first match wins: batch norms before convolutions (cuDNN runs both),
#: convolutions before GEMMs (cuDNN's and CUTLASS's implicit-GEMM fprop/dgrad/wgrad kernels and their
#: split-K reductions), fbgemm_gpu's kernels (embedding tables and their index permutes) not GEMMs for
#: the "gemm" inside "fbgemm"; cuDNN's layout transposes are elementwise (memory-bound copies)
KERNEL_CLASSES: list[tuple[str, re.Pattern[str]]] = [
    (name, re.compile(pattern, re.IGNORECASE))
    for name, pattern in (
        ("nccl", r"nccl"),
        ("attention", r"flash|fmha|attention|sdpa"),
        ("embedding", r"embedding|fbgemm_gpu|lookup|index_select|indexselect|gather|scatter"),
        ("norm", r"norm|softmax|bn_fw|bn_bw|gammabeta"),
        ("conv", r"conv|fprop|dgrad|wgrad|winograd|implicit_gemm|scudnn|cask_cudnn|cutlass_cudnn"),
        ("gemm", r"(?<!fb)gemm|cutlass|cublas|xmma|matmul|wgmma|s884|h884|s1688|h1688|s16816|sm\d+_mma|gemv"),
        ("reduce", r"reduce|sum_kernel|mean"),
        ("optimizer", r"adam|sgd|multi_tensor"),
        ("elementwise", r"elementwise|vectorized|unrolled|pointwise|copy_kernel|fill|nchwtonhwc|nhwctonchw"),
    )
]
OP_FAMILY_CLASSES = {"memcpy": "memcpy", "memset": "memset"}
#: a dropped collective matched across the loaded ranks keeps its rendezvous: no transfer, but each member
#: still waits for the last to arrive (NCCL's collectives synchronise their ranks), so rank skew stays
DROPPED_RENDEZVOUS = "dropped collectives that still wait for their peers (zero transfer; a late rank still holds them)"
#: an unmatched collective (a single rank's) whose measured time, wait for peers included, a what-if re-timed whole
WAIT_AS_TRANSFER = (
    "unmatched collectives re-timed whole: the wait for peers their measured time holds re-timed as transfer "
    "(load every rank's trace to tell them apart)"
)


def kernel_class(name: str, family: str = "kernel") -> str:
    if family in OP_FAMILY_CLASSES:
        return OP_FAMILY_CLASSES[family]
    return next((cls for cls, rx in KERNEL_CLASSES if rx.search(name)), "other")


@dataclass(frozen=True)
class WhatIf:
    """scale: kernel class → factor (0 drops the class); system: a system preset whose collective
    model re-times NCCL kernels; world_size: the data-parallel group size for that re-timing;
    gpu: a system preset whose GEMM model re-times GEMM kernels whose shapes an execution trace gives;
    host: host overheads T1–T5 that re-time the host chains (apply_host_overheads);
    dp: a data-parallel size for the gradient reductions (parallel_whatifs.retime_data_parallel);
    pp_stages: a number of pipeline stages, given alone (restage.restage: a new step graph);
    curves: calibrated curves (profile.calibrate.load_calibration) for the collective models;
    host_cores: the cores of the host that ran every rank: the ranks' CPU work shares them, in the
    trace and in the what-if (sim/sharing.py); None: no sharing (each task keeps its time);
    tp: a tensor-parallel size for a CPU trace's sharded operators and TP all-reduces
    (tensor_parallel.retime_tensor_parallel)."""

    scale: dict[str, float] = field(default_factory=dict)
    system: str | None = None
    world_size: int | None = None
    gpu: str | None = None
    host: HostOverheads | None = None
    dp: int | None = None
    pp_stages: int | None = None
    curves: dict | None = None
    host_cores: int | None = None
    tp: int | None = None

    @property
    def empty(self) -> bool:
        return not self.scale and all(
            v is None for v in (self.system, self.world_size, self.gpu, self.host, self.dp, self.pp_stages, self.tp)
        )


def matmul_flops(name: str, shapes: list) -> float | None:
    """FLOPs (2 per multiply-add) of a matmul operator from its input shapes, or None."""
    t = [s for s in shapes if isinstance(s, list) and s and all(isinstance(x, int | float) for x in s)]
    try:
        if name == "aten::mm":
            (m, k), (_, n) = t[0], t[1]
        elif name == "aten::addmm":
            (m, k), (_, n) = t[1], t[2]
        elif name in ("aten::bmm", "aten::baddbmm"):
            a, b_ = (t[1], t[2]) if name == "aten::baddbmm" else (t[0], t[1])
            return 2.0 * a[0] * a[1] * a[2] * b_[2]
        elif name == "aten::linear":
            rows = float(np.prod(t[0][:-1]))
            return 2.0 * rows * t[0][-1] * t[1][0]
        else:
            return None
    except (IndexError, ValueError, TypeError):
        return None
    return 2.0 * m * k * n


ET_DTYPES = {"Tensor(float)": "fp32", "Tensor(c10::Half)": "fp16", "Tensor(c10::BFloat16)": "bf16"}


def apply_whatif(
    rg: ReplayGraph,
    traces: list[RankTrace],
    whatif: WhatIf,
    gemm_flops: dict[int, tuple[float, str, float]] | None = None,
) -> tuple[ReplayGraph, Counter]:
    """A copy of the replay graph (built from `traces`) with changed GPU durations, and counts of
    what changed. gemm_flops: GPU task → (FLOPs, dtype, share) for GEMM kernels whose matmul's shapes an
    execution trace gave (replay.gemm_shapes). Scale factors apply last, to the re-timed durations too."""
    g = rg.graph
    durations = g.duration_s.copy()
    changes: Counter = Counter()
    known = {c for c, _ in KERNEL_CLASSES} | set(OP_FAMILY_CLASSES.values()) | {"other"}
    unknown = set(whatif.scale) - known
    if unknown:
        raise ConfigError(f"what-if: unknown kernel class {sorted(unknown)}; known: {sorted(known)}")
    if any(f < 0 for f in whatif.scale.values()):
        raise ConfigError(f"what-if: scale factors must be ≥ 0; got {whatif.scale}")
    if whatif.world_size is not None and whatif.world_size < 1:
        raise ConfigError(f"--world-size: expected a data-parallel group size ≥ 1; got {whatif.world_size}")
    if whatif.pp_stages is not None:
        raise ConfigError("what-if: --pp-stages builds a new step graph (restage.restage), not new durations")
    if whatif.dp is not None and whatif.world_size is not None:
        raise ConfigError("what-if: --dp and --world-size both set the data-parallel group size; give one")
    if whatif.tp is not None and (whatif.dp is not None or whatif.world_size is not None):
        raise ConfigError("what-if: --tp re-times a tensor-parallel-only trace; give it without --dp/--world-size")
    options = (("--system", whatif.system), ("--world-size", whatif.world_size), ("--dp", whatif.dp))
    retiming = "/".join(o for o, v in options if v is not None)
    if whatif.scale.get("nccl") == 0 and retiming:  # the re-timed collectives would be counted, then dropped
        raise ConfigError(f"what-if: --drop nccl removes the collectives {retiming} re-times; give one of them")
    sizes, missing = (
        collective_sizes(traces, rg.gpu_task, rg.nccl_meta, rg.graph.duration_s)
        if whatif.system is not None or "nccl" in whatif.scale
        else ({}, Counter())
    )
    waits = _peer_waits(rg, sizes)
    retimed: dict[int, str] = {}  # task → its label in `changes`
    if whatif.system is not None or whatif.world_size is not None:
        retimed = _retime_collectives(rg, whatif, durations, changes, sizes, missing, waits)
    alone = np.zeros(0, np.int64)
    if whatif.dp is not None:
        before = durations.copy()
        dp_changes: Counter = Counter()
        alone = retime_data_parallel(
            rg, traces, whatif.dp, durations, dp_changes, whatif.system, whatif.curves, whatif.host_cores
        )
        if retimed:  # --system re-timed every sized collective first: count each once, a gradient reduction as --dp's
            for task in (t for t in retimed if durations[t] != before[t]):
                changes[retimed[task]] -= 1
                if not changes[retimed[task]]:
                    del changes[retimed[task]]
            dp_changes = Counter({k: n for k, n in dp_changes.items() if "kept at measured time" not in k})
        changes.update(dp_changes)
        unmatched = [t for t, meta in rg.nccl_meta.items() if "transfer_s" not in meta]
        if whole := sum(int(durations[t] != before[t]) for t in unmatched):
            changes[WAIT_AS_TRANSFER] += whole
    if whatif.tp is not None:
        alone = retime_tensor_parallel(rg, traces, whatif.tp, durations, changes, whatif.curves, whatif.host_cores)
    if whatif.gpu is not None:
        own = {
            task: trace_system(t)
            for index, t in enumerate(traces)
            for task in rg.gpu_task.get(t.rank if t.rank is not None else index, np.zeros(0, np.int64)).tolist()
        }
        _retime_gemms(whatif.gpu, gemm_flops or {}, own, durations, changes)
    # scaled last, so that a class re-timed above (--system, --gpu) is scaled (or dropped) at its new time
    gpu_tasks = sorted(set(np.concatenate(list(rg.gpu_task.values())).tolist())) if rg.gpu_task else []
    matched: set[str] = set()
    freed = set(alone.tolist())  # collectives a --dp/--tp what-if took out of their rendezvous
    for task in gpu_tasks:
        cls = kernel_class(g.names[g.name[task]], g.families[g.family[task]])
        if cls in whatif.scale:
            said = None if task in retimed else changes  # a re-timed collective's wait was said there
            verb = _scale_verb(whatif.scale[cls])
            wait_s = _kept_wait_s(task, waits, said, f"{verb} whole") if cls == "nccl" else 0.0
            wait_s = min(wait_s, float(durations[task]))  # a what-if above may have shortened it below the wait
            durations[task] = wait_s + (durations[task] - wait_s) * whatif.scale[cls]
            changes[f"{verb} {cls}"] += 1
            matched.add(cls)
            if whatif.scale[cls] == 0 and g.collective[task] >= 0 and task not in freed:
                changes[DROPPED_RENDEZVOUS] += 1
    for cls in sorted(set(whatif.scale) - matched):
        changes[f"{_scale_verb(whatif.scale[cls])} {cls}: the traces have no such kernel, nothing changed"] = 0
    changed = rg.without_rendezvous(alone) if alone.size else rg
    return changed.with_durations(durations), changes


def _scale_verb(factor: float) -> str:
    """How a scale factor's change is counted: a factor of 0 (--drop) removes the class."""
    return "dropped" if factor == 0 else "scaled"


def _peer_waits(rg: ReplayGraph, sizes: dict[int, CollectiveSize]) -> dict[int, tuple[float, str] | None]:
    """NCCL task → (its measured wait for peers in seconds, the preset it was told apart on), for each
    collective not matched across the loaded ranks (a single rank's trace), None where it cannot be told
    apart; matched collectives are absent (they wait through the replay graph's rendezvous).

    An unmatched collective holds its wait for peers inside its measured time: the measured time less the
    trace's own system's model time for the same bytes (collective_sizes' own_system), on the built-in
    model on which collective_sizes infers sizes too. A what-if keeps that wait, since neither a faster
    network nor a faster kernel makes the other ranks arrive sooner. It cannot be told apart (None) where
    the bytes were inferred from that measured time (the wait is in the size: an upper bound, flagged), where
    no preset has the trace's GPU, or where no size is known (`sizes`: collective_sizes'; none, no waits)."""
    if not sizes:
        return {}
    waits: dict[int, tuple[float, str] | None] = {}
    for task, meta in rg.nccl_meta.items():
        if "transfer_s" in meta:
            continue
        size = sizes.get(task)
        if size is None or size.inferred or size.own_system is None:
            waits[task] = None
            continue
        own = builtin_model(size.own_system)
        own_group = place_group(size.group_size, 1, own.system.node.gpus_per_node)
        measured_s = float(rg.graph.duration_s[task])
        waits[task] = (max(0.0, measured_s - own.collective_s(size.kind, size.nbytes, own_group)), size.own_system)
    return waits


def _kept_wait_s(
    task: int, waits: dict[int, tuple[float, str] | None], changes: Counter | None, verb: str = ""
) -> float:
    """The wait for peers a what-if keeps for `task` (_peer_waits; 0 for a matched collective or one whose wait
    cannot be told apart), counted in `changes` unless None: kept beyond its preset's model, or `verb` without."""
    wait = waits.get(task)
    if changes is not None and task in waits:
        if wait is None:
            changes[f"unmatched collectives {verb} (no wait for peers told from the transfer)"] += 1
        else:
            changes[f"unmatched collectives kept their measured wait for peers beyond {wait[1]}'s model"] += 1
    return wait[0] if wait is not None else 0.0


def _retime_collectives(
    rg: ReplayGraph,
    whatif: WhatIf,
    durations: np.ndarray,
    changes: Counter,
    sizes: dict[int, CollectiveSize],
    missing: Counter,
    waits: dict[int, tuple[float, str] | None],
) -> dict[int, str]:
    """Collectives re-timed on `whatif.system`'s model (over `whatif.world_size` GPUs if given) from
    their `sizes` (collective_sizes: metadata, else inferred from their time on the trace's system; `missing`,
    why the others have none), an
    unmatched one's wait for peers (`waits`, _peer_waits) added to the new model time; where that wait
    cannot be told apart it is dropped (with inferred bytes it is in the size instead): counted in `changes`.
    Returns the tasks re-timed, each with the label it is counted under."""
    if whatif.system is None:
        raise ConfigError("what-if: --world-size re-times collectives with a system's model; also give --system")
    if not rg.nccl_meta:
        raise ConfigError("what-if --system/--world-size: the traces hold no NCCL kernels to re-time")
    costs = AnalyticCostModel(load_system(whatif.system), "bf16", whatif.curves)
    labels: dict[int, str] = {}
    for task, size in sizes.items():
        group = place_group(whatif.world_size or size.group_size, 1, costs.system.node.gpus_per_node)
        said = None if size.inferred else changes  # an inferred size holds the wait, re-timed as bytes:
        wait_s = _kept_wait_s(task, waits, said, "re-timed without a wait")
        if size.inferred and task in waits:  # said so for an unmatched collective
            changes[WAIT_AS_TRANSFER] += 1
        durations[task] = costs.collective_s(size.kind, size.nbytes, group) + wait_s
        labels[task] = f"re-timed {size.kind} on {whatif.system}" + (" (size inferred)" if size.inferred else "")
        changes[labels[task]] += 1
    for why, n in missing.items():
        changes[f"NCCL kernels kept at measured time ({why})"] += n
    return labels


def _retime_gemms(
    gpu: str,
    gemm_flops: dict[int, tuple[float, str, float]],
    own: dict[int, str | None],
    durations: np.ndarray,
    changes: Counter,
) -> None:
    """Each GEMM kernel's measured time scaled by the GEMM model's time of its matmul on `gpu` over that on the
    trace's own GPU (`own`: task → the system preset of its trace's GPU, collective_sizes.trace_system): the
    measurement keeps what the model misses on both GPUs alike (a small fp32 matmul's launch-bound kernels, which
    the FLOP model prices 2.8× the measurement on PARAM's V100 DLRM trace), and the trace's own GPU changes
    nothing. A trace whose GPU no preset has: the kernel at its share of its matmul's model time on `gpu`,
    absolute, and said."""
    if not gemm_flops:
        raise ConfigError("what-if: --gpu re-times GEMMs from their shapes; give the execution traces (--et)")
    models: dict[tuple[str, str], AnalyticCostModel] = {}

    def model_s(system: str, dtype: str, flops: float) -> float:
        if (system, dtype) not in models:
            models[system, dtype] = AnalyticCostModel(load_system(system), dtype)
        return float(models[system, dtype].gemm_s(flops))

    for task, (flops, dtype, share) in gemm_flops.items():
        if (source := own.get(task)) == gpu:
            changes[f"GEMMs kept at their measured time: {gpu} is the traces' own GPU"] += 1
        elif source is not None:
            durations[task] *= model_s(gpu, dtype, flops) / model_s(source, dtype, flops)
            changes[f"re-timed GEMMs from shapes on {gpu}: measured × the model's {gpu} / {source} time"] += 1
        else:
            durations[task] = model_s(gpu, dtype, flops) * share
            changes[f"re-timed GEMMs from shapes on {gpu}, absolute (no system preset has the trace's GPU)"] += 1


def apply_host_overheads(
    rg: ReplayGraph, traces: list[RankTrace], model: HostOverheads, ranks: set[int] | None = None
) -> tuple[ReplayGraph, Counter]:
    """A copy of the replay graph whose host chains (of `ranks`, default all) take their gaps and
    runtime-call durations from the T1–T5 model instead of the measurement. A gap split at step
    boundaries keeps its split in proportion; gaps ending in a wait for another thread keep their
    measured remainder (the wait itself is an edge); what the model does not cover stays measured
    (host_overheads.modelled_host_us). `traces` in the order the graph was built from."""
    durations = rg.graph.duration_s.copy()
    changes: Counter = Counter()
    for index, t in enumerate(traces):
        rank = t.rank if t.rank is not None else index
        chain = rg.host.get(rank)
        if chain is None or (ranks is not None and rank not in ranks):
            continue
        # one slot per call of the chain (its marks of CPU collectives included: they keep their
        # measured gaps), the last for pieces after a thread's last call
        gap_of_call = np.full(chain.call_task.shape[0] + 1, np.nan)
        sync = synchronising_calls(t, t.launch_calls())
        for tid in np.unique(t.call_tid).tolist():
            th = thread_ops(t, int(tid))
            gap_us, dur_us = modelled_host_us(t, th, model, sync)
            ok = np.isfinite(dur_us)
            durations[chain.call_task[th.calls[ok]]] = dur_us[ok] * 1e-6
            changes["runtime calls from T4"] += int(ok.sum())
            gap_of_call[th.calls] = gap_us
        if chain.waiting_calls:
            gap_of_call[np.fromiter(chain.waiting_calls, np.int64)] = np.nan
        target = gap_of_call[chain.piece_call]  # piece_call −1 reads the last slot (NaN)
        modelled = np.isfinite(target)
        calls, pieces = chain.piece_call[modelled], chain.piece_task[modelled]
        gaps, slot = np.unique(calls, return_inverse=True)
        measured = np.bincount(slot, weights=durations[pieces])[slot]
        count = np.bincount(slot)[slot]
        share = np.where(measured > 0, durations[pieces] / np.where(measured > 0, measured, 1.0), 1.0 / count)
        durations[pieces] = target[modelled] * 1e-6 * share
        changes["host gaps from T1-T3, T5"] += int(gaps.shape[0])
        changes["host gaps kept as measured"] += int(np.unique(chain.piece_call[~modelled]).shape[0])
    return rg.with_durations(durations), changes
