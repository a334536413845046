"""Variability fitted on traces with repeated iterations, and step-time distributions from them.

Fitting (`fit_trace_variability`): a task of the replay graph (traces/replay_graph.py) recurs once
per step: its key is (rank, task name, k-th non-empty occurrence of that name within the step). Over the
steps where a key recurs, its duration divided by the key's median is a ratio r. Ratios are
pooled per class: the kernel classes of traces/whatif.py (gemm, nccl, elementwise, ...) for GPU
ops, "host" for runtime calls. Host gaps (the measured time between two calls on a thread) keep
their measured durations: the k-th gap of a step is not the k-th gap of another once the steps make
different numbers of calls, and a gap that was idle waited for work the graph must produce, not
sample (drawing them from other steps gave a 3-step CNN trace of 220–225 ms steps a p50 of 314 ms;
kept, every step drawn whole reproduces its measured time). Each step's ratios are split into
- a step factor per class: the median ratio of that class in that step (what moves together in a
  step: clock or power state, a network regime, host contention), and
- residuals r / step factor (each task's own noise).
Both stay empirical pools (no parametric form is imposed; `fit_best` can summarise them).

The pools summarise the spread per class (`summary`). Sampling (`trace_step_distribution`) is a
bootstrap by class that keeps every duration at its own scale: per sample and class, one fitted
step is drawn, and every recurring task of that class takes the duration its key had in that step
(its median where the key missed that step); tasks that do not recur keep their measured
duration. What moved together within a class in one step moves together in the sample, while the
classes combine in ways no single step showed. (Drawing pooled ratios per task instead multiplies
a host gap of microseconds by ratios seen on gaps that absorbed waits, and explodes.) All steps
of the graph are simulated in one pass (sim/montecarlo.py's max-plus kernel), so rendezvous,
streams and host chains shape the spread. Attribution: the same draws with one class's durations
pulled halfway to their medians (half its spread); sensitivity (`trace_sensitivity`): the same draws
with noise of a known CV added to one class, NCCL kernels told apart by collective kind and process
group where PyTorch's metadata names it (`attribution_classes`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from itercast.sim.analysis import critical_path
from itercast.sim.engine import compile_graph, simulate
from itercast.sim.kernels import run_max_plus_samples
from itercast.stochastic.variability import collective_label, lognormal, p95_shift_per_cv
from itercast.traces.collective_sizes import collective_kind
from itercast.traces.replay_graph import ReplayGraph
from itercast.traces.whatif import kernel_class

MIN_STEPS = 2  # a key must recur in this many steps to give ratios


@dataclass
class TraceVariability:
    """Per-class pools of step factors and residual ratios, and what each task samples from."""

    classes: list[str]
    step_factors: dict[str, np.ndarray]
    residuals: dict[str, np.ndarray]
    task_class: np.ndarray  # class index per task, −1: keeps its measured duration
    base_s: np.ndarray  # the key's median duration per task (measured where it does not recur)
    steps_used: int
    #: duration (s) of each task's key in each fitted step, (tasks, fitted steps); the median where missing
    by_step_s: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    notes: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per class: tasks, coefficient of variation of residuals and of step factors."""
        out = {}
        for i, c in enumerate(self.classes):
            res, fac = self.residuals[c], self.step_factors[c]
            out[c] = {
                "tasks": int(np.sum(self.task_class == i)),
                "residual_cv": float(np.std(res) / np.mean(res)) if res.size else 0.0,
                "step_factor_cv": float(np.std(fac) / np.mean(fac)) if fac.size else 0.0,
            }
        return out


#: process-group descriptions (PyTorch's "Process Group Description", torch/csrc/profiler/util.h
#: kProcessGroupDesc) by parallel group: Megatron-Core's group_desc (core/parallel_state.py:
#: TENSOR_MODEL_PARALLEL_GROUP, DATA_PARALLEL_GROUP_WITH_CP, EXPERT_MODEL_PARALLEL_GROUP, ...) and
#: torch DeviceMesh's "mesh_<dim>" (torchtitan's dims tp, cp, pp, ep, dp_shard, dp_replicate, ...)
GROUP_DESCRIPTIONS = (
    ("expert TP", re.compile(r"^expert_tensor|^mesh_etp$", re.IGNORECASE)),
    ("expert DP", re.compile(r"^expert_data", re.IGNORECASE)),
    ("EP", re.compile(r"^expert_model|^mesh_ep$", re.IGNORECASE)),
    ("TP", re.compile(r"^tensor_model_parallel_group$|^mesh_tp$", re.IGNORECASE)),
    ("CP", re.compile(r"^context_parallel_group$|^mesh_cp$", re.IGNORECASE)),
    ("PP", re.compile(r"^pipeline_model_parallel_group$|^mesh_pp$", re.IGNORECASE)),
    ("DP", re.compile(r"^data_parallel_group|^mesh_dp", re.IGNORECASE)),
)


def task_classes(rg: ReplayGraph) -> list[str]:
    """Class of every task for fitting: "host" for runtime calls, a kernel class for GPU ops (all
    NCCL kernels one "nccl" class: their step factors are drawn together), "" for host gaps (kept as
    measured)."""
    g = rg.graph
    out = []
    for t in range(g.num_tasks):
        family = g.families[g.family[t]]
        out.append(
            "" if family == "host_gap" else "host" if family == "runtime" else kernel_class(g.names[g.name[t]], family)
        )
    return out


def collective_class(kernel_name: str, meta: dict | None) -> str:
    """An NCCL kernel's class, "nccl <kind> × <group>": the kind from its "Collective name" or else
    its name (traces/collective_sizes.py collective_kind; a SendRecv kernel "send/recv"); the group
    from its process group's description where it names a parallel group (GROUP_DESCRIPTIONS), else
    "group <description or name>" with its ranks where known, else "unknown group" (a trace without
    PyTorch's process-group metadata)."""
    meta = meta or {}
    kind = collective_kind(meta, kernel_name)
    if kind is None:  # SendRecv kernels carry point-to-point and all-to-all alike (collective_sizes.py)
        kind = "p2p" if "sendrecv" in kernel_name.lower() else "collective"
    desc, name = str(meta.get("Process Group Description", "")), str(meta.get("Process Group Name", ""))
    ranks = meta.get("Process Group Ranks")
    group = next((label for label, rx in GROUP_DESCRIPTIONS if rx.search(desc)), None)
    if group is None and (desc or name):
        group = f"group {desc or name}" + (f" (ranks {ranks})" if ranks else "")
    elif group is None:
        group = f"group of ranks {ranks}" if ranks else "unknown group"
    return f"nccl {collective_label(kind)} × {group}"


def attribution_classes(rg: ReplayGraph) -> list[str]:
    """Class of every task for attribution: task_classes, with NCCL kernels by collective kind and
    process group (collective_class)."""
    g = rg.graph
    return [
        collective_class(g.names[g.name[t]], rg.nccl_meta.get(t)) if c == "nccl" else c
        for t, c in enumerate(task_classes(rg))
    ]


def _step_of_tasks(rg: ReplayGraph, start_s: np.ndarray, end_s: np.ndarray) -> np.ndarray:
    """Index of the step mark each task starts in (by the replayed times, per rank), −1 outside."""
    g = rg.graph
    rank = g.resource_rank[g.resource]
    out = np.full(g.num_tasks, -1)
    for i, m in enumerate(rg.steps):
        lo = float(end_s[m.start_task] if m.start_is_task_end else start_s[m.start_task])
        hi = float(end_s[m.end_task] if m.end_is_task_end else start_s[m.end_task])
        out[(rank == m.rank) & (start_s >= lo) & (start_s < hi)] = i
    return out


def fit_trace_variability(rg: ReplayGraph, fit_steps: list[int] | None = None) -> TraceVariability:
    """Pools from the steps `fit_steps` (indices into rg.steps; all when None)."""
    g = rg.graph
    sim = simulate(g)
    step = _step_of_tasks(rg, sim.start_s, sim.end_s)
    chosen = set(range(len(rg.steps)) if fit_steps is None else fit_steps)
    cls_names = task_classes(rg)
    classes = sorted(set(cls_names) - {""})
    cls_index = {c: i for i, c in enumerate(classes)}
    key_tasks: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    seen: dict[tuple[int, int], int] = defaultdict(int)
    rank = g.resource_rank[g.resource]
    for t in np.argsort(sim.start_s, kind="stable").tolist():
        s = int(step[t])
        if s < 0 or g.duration_s[t] <= 0 or not cls_names[t]:  # empty pieces and host gaps need no key
            continue
        occurrence = seen[(s, int(g.name[t]))]
        seen[(s, int(g.name[t]))] += 1
        key_tasks[(int(rank[t]), int(g.name[t]), occurrence)].append(t)
    base = g.duration_s.copy()
    fit_order = sorted(chosen)
    column = {st: j for j, st in enumerate(fit_order)}
    by_step = np.repeat(g.duration_s[:, None], len(fit_order), axis=1)
    task_class = np.full(g.num_tasks, -1)
    ratios: dict[tuple[int, str], list[float]] = defaultdict(list)
    ratio_of: dict[int, float] = {}
    for tasks in key_tasks.values():
        fit = [t for t in tasks if int(step[t]) in chosen and g.duration_s[t] > 0]
        if len(fit) < MIN_STEPS:
            continue
        median = float(np.median(g.duration_s[fit]))
        if median <= 0:
            continue
        base[tasks] = median
        row = np.full(len(fit_order), median)
        for t in fit:
            row[column[int(step[t])]] = g.duration_s[t]
        by_step[tasks] = row
        for t in tasks:
            task_class[t] = cls_index[cls_names[t]]
        for t in fit:
            ratio_of[t] = float(g.duration_s[t]) / median
            ratios[(int(step[t]), cls_names[t])].append(ratio_of[t])
    step_factors: dict[str, list[float]] = defaultdict(list)
    residuals: dict[str, list[float]] = defaultdict(list)
    factor = {key: float(np.median(v)) for key, v in ratios.items()}
    for (s, c), values in ratios.items():
        step_factors[c].append(factor[(s, c)])
        residuals[c] += [v / factor[(s, c)] for v in values]
    return TraceVariability(
        classes,
        {c: np.array(step_factors.get(c, [1.0])) for c in classes},
        {c: np.array(residuals.get(c, [1.0])) for c in classes},
        task_class,
        base,
        len(chosen),
        by_step,
        {"recurring tasks": int(np.sum(task_class >= 0)), "tasks kept as measured": int(np.sum(task_class < 0))},
    )


@dataclass
class TraceStepSamples:
    """Sampled durations (seconds) of every step mark: array (steps, samples)."""

    step_s: np.ndarray

    def pooled(self) -> np.ndarray:
        """Every step's samples together."""
        return self.step_s.ravel()


def trace_step_distribution(
    rg: ReplayGraph,
    model: TraceVariability,
    samples: int = 1000,
    seed: int = 0,
    shrink: dict[str, float] | None = None,
    block: int = 256,
    added_cv: tuple[np.ndarray, float] | None = None,
) -> TraceStepSamples:
    """Monte Carlo over the whole replay graph. `shrink`: class → factor on its ratios' distance from 1
    (0.5 halves that class's spread), for attribution. `added_cv` (tasks, CV): those tasks' sampled
    durations times an independent log-normal factor of that CV each, drawn from a generator of their
    own so that the model's draws stay those of the same seed without it (common random numbers)."""
    if samples < 1:
        raise ValueError(f"samples must be ≥ 1; got {samples}")
    g = rg.graph
    compiled = compile_graph(g)
    rng = np.random.default_rng(seed)
    added_rng = np.random.default_rng((seed, 1))
    out = np.empty((len(rg.steps), samples))
    for lo in range(0, samples, block):
        n = min(block, samples - lo)
        dur = np.repeat(g.duration_s[:, None], n, axis=1)
        for i, c in enumerate(model.classes):
            # one fitted step per sample, drawn for every class so that runs with a class shrunk share draws
            pick = rng.integers(0, model.by_step_s.shape[1], size=n)
            rows = np.flatnonzero(model.task_class == i)
            if rows.size:
                k = (shrink or {}).get(c, 1.0)
                median = model.base_s[rows][:, None]
                dur[rows] = median + k * (model.by_step_s[rows][:, pick] - median)
        if added_cv is not None:
            tasks, cv = added_cv
            dur[tasks] *= lognormal(cv, added_rng.standard_normal((tasks.size, n)))
        end = run_max_plus_samples(compiled.arrays, dur)
        start = end - dur
        for i, m in enumerate(rg.steps):
            a = end[m.start_task] if m.start_is_task_end else start[m.start_task]
            b = end[m.end_task] if m.end_is_task_end else start[m.end_task]
            out[i, lo : lo + n] = b - a
    return TraceStepSamples(out)


def trace_attribution(
    rg: ReplayGraph, model: TraceVariability, samples: int = 1000, seed: int = 0, quantile: float = 0.95
) -> dict[str, float]:
    """Relative change of the pooled step-time `quantile` when each class's spread is halved (same seed)."""
    base = np.quantile(trace_step_distribution(rg, model, samples, seed).pooled(), quantile)
    out = {}
    for c in model.classes:
        if np.any(model.task_class == model.classes.index(c)):
            q = np.quantile(trace_step_distribution(rg, model, samples, seed, {c: 0.5}).pooled(), quantile)
            out[c] = float(q / base - 1)
    return out


def trace_sensitivity(
    rg: ReplayGraph, model: TraceVariability, delta_cv: float = 0.25, samples: int = 1000, seed: int = 0
) -> list[dict[str, Any]]:
    """Per attribution class (attribution_classes: kernel class, NCCL collective kind × group): how
    much the pooled step p95 grows per unit of CV added to that class's tasks (`dp95_per_cv_s`:
    (p95 with `delta_cv` more − p95) / delta_cv, common random numbers; `dp95_per_cv_se_s` its Monte
    Carlo standard error, variability.p95_shift_per_cv), its seconds on the critical
    path of the measured trace replayed and their share of that path (`critical_path_share`), and
    its seconds in the whole trace (`total_s`; both over every traced step of every rank). The
    graph-model counterpart is stochastic/variability.py graph_sensitivity. Sorted by dp95, largest
    first."""
    g = rg.graph
    classes = np.array(attribution_classes(rg), dtype=object)
    sim = simulate(g)
    on_path = np.zeros(g.num_tasks, dtype=bool)
    on_path[critical_path(sim)] = True
    base = trace_step_distribution(rg, model, samples, seed).pooled()
    out = []
    for c in sorted(set(classes.tolist()) - {""}):
        tasks = np.flatnonzero(classes == c)
        noisy = trace_step_distribution(rg, model, samples, seed, added_cv=(tasks, delta_cv)).pooled()
        path_s = float(g.duration_s[tasks][on_path[tasks]].sum())
        shift_s, se_s = p95_shift_per_cv(base, noisy, delta_cv, seed)
        out.append(
            {
                "class": c,
                "dp95_per_cv_s": shift_s,
                "dp95_per_cv_se_s": se_s,
                "critical_path_s": path_s,
                "critical_path_share": path_s / sim.step_time_s,
                "total_s": float(g.duration_s[tasks].sum()),
            }
        )
    return sorted(out, key=lambda r: -r["dp95_per_cv_s"])
