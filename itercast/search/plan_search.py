"""`itercast search`: the fastest plans that fit, over the whole plan space, in two speeds.

1. Every GPU count of the request is one piece of work: enumerate the plans the chosen framework
   runs as columns (plan_space.py, frameworks.py), price them all with the closed form
   (fast_estimate.py: step time and memory), keep the candidates: the fastest plans whose memory (predict's:
   tensors, CUDA context, NCCL buffers) and a margin for the allocator's fragmentation fit, and the Pareto
   fronts. Pieces run in a local process pool, or on Ray (`backend="ray"`) when a sweep outgrows one machine.
2. The best `top_k` candidates are re-scored by the graph simulation (`predict`), the reference,
   and ranked by it; the result says how far the two speeds disagreed on them. Plans are ranked by
   the request's objective (objectives.py: step time, per sequence when global batches vary; seconds
   per token; GPU-hours per token) and each carries its seconds and GPU-hours per token. Across node
   counts the front of time to a token budget against GPU-hours per token says which count and plan
   to run. Each plan shown carries the framework's launch settings (launch_settings.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from itercast.config.job import Job
from itercast.config.model import ModelConfig
from itercast.config.plan import PlanConfig
from itercast.config.system import GPUSpec, SystemConfig
from itercast.errors import ConfigError
from itercast.memory import describe_reserve
from itercast.predict import predict
from itercast.search.fast_estimate import FastEstimator
from itercast.search.frameworks import framework, runnable_plan
from itercast.search.launch_settings import launch_settings
from itercast.search.objectives import check_objective, objective_values, pareto_front, time_cost_front, token_figures
from itercast.search.plan_space import SpaceCounts, SpaceOptions, enumerate_plans
from itercast.workloads.transformer_ops import priced_notes

Progress = Callable[[int, int], None]  # (pieces done, pieces in all)

#: Margin the search keeps free beside a transformer plan's memory for the caching allocator's fragmentation
#: (a DLRM's shardings are ranked on predict's total alone: dlrm_search.py), as a share
#: of its activations. GMLake (Guo et al., ASPLOS'24) removes 15% on average (up to 33%) of the PyTorch caching
#: allocator's fragmentation over eight LLMs on A100-80GB; only activations are counted, since weights,
#: gradients and optimizer state live in buffers allocated once (Megatron-Core param_and_grad_buffer, FSDP2
#: flat shards, DeepSpeed contiguous_gradients). A margin for a recommendation, not part of predict's verdict
#: (memory.py's module docstring says why).
FRAGMENTATION_OF_ACTIVATIONS = 0.15


def describe_margin(gpu: GPUSpec, fixed_bytes: float | None) -> str:
    """One line for the search's header: the reserve in each plan's memory and the margin kept beside it."""
    kept = (
        f"{fixed_bytes / 2**30:.2f} GiB (--memory-headroom-gib)"
        if fixed_bytes is not None
        else f"{FRAGMENTATION_OF_ACTIVATIONS:.0%} of activations (fragmentation)"
    )
    return f"{describe_reserve(gpu)}; kept free beside it: {kept}"


@dataclass(frozen=True)
class SearchRequest:
    """One search: the model and system (its num_nodes is replaced by each searched count), the
    shared plan fields with the global batch, what may vary, and how much memory a plan may use:
    its memory (predict's: tensors and memory.reserve_bytes) plus `memory_margin_bytes` (None:
    FRAGMENTATION_OF_ACTIVATIONS of its activations) within `max_memory_fraction` of the GPU's memory;
    plans ranked by `objective` (objectives.OBJECTIVES), `token_budget` (tokens, optional) prices each
    plan's time and GPU-hours to train that many; `calibration`: curves from profile.calibrate.load_calibration
    that price every plan, in the fast path and the graph's re-score alike (None: the built-in ones)."""

    model: ModelConfig
    system: SystemConfig
    base: PlanConfig
    node_counts: tuple[int, ...]
    options: SpaceOptions = field(default_factory=SpaceOptions)
    max_memory_fraction: float = 1.0
    memory_margin_bytes: float | None = None
    top_k: int = 20
    include_oom: bool = False
    objective: str = "step"
    token_budget: float | None = None
    calibration: dict[str, Any] | None = None


@dataclass
class Candidates:
    """What one piece of work keeps: rows (plan fields + fast figures) and its counts."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    counts: SpaceCounts = field(default_factory=SpaceCounts)
    valid: int = 0
    fitting: int = 0
    least_memory_bytes: float = float("inf")


@dataclass(frozen=True)
class SearchResult:
    plans: list[dict[str, Any]]  # re-scored by the graph, fastest first
    pareto_memory: list[dict[str, Any]]  # fast figures: no faster plan needs less memory
    pareto_gpus: list[dict[str, Any]]  # fast figures: the fastest plan per GPU count, if faster than fewer GPUs
    pareto_cost: list[dict[str, Any]]  # fast figures: no plan is both faster per token and cheaper per token
    evaluated: int
    valid: int
    fitting: int
    seconds: float
    fast_vs_graph_max: float  # max |fast / graph − 1| over the re-scored plans
    framework: str = "megatron-core"
    headroom: str = ""  # the memory beyond the tensors and the margin kept free (describe_margin)
    objective: str = "step"
    token_budget: float | None = None
    ranking_note: str = ""  # distribution objectives: distribution_rank.rank_by_distribution's sentence
    priced_with: str = "the built-in curves"  # or the calibration's (calibration_source)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plans": self.plans,
            "pareto_time_memory": self.pareto_memory,
            "pareto_time_gpus": self.pareto_gpus,
            "pareto_time_gpu_hours": self.pareto_cost,
            "evaluated": self.evaluated,
            "valid": self.valid,
            "fitting": self.fitting,
            "seconds": self.seconds,
            "fast_vs_graph_max_rel": self.fast_vs_graph_max,
            "framework": self.framework,
            "memory_headroom": self.headroom,
            "objective": self.objective,
            "token_budget": self.token_budget,
            "ranking_note": self.ranking_note,
            "priced_with": self.priced_with,
        }


def search_piece(request: SearchRequest, num_nodes: int) -> Candidates:
    """Enumerate and price every plan on `num_nodes` nodes; keep the candidates."""
    system = request.system.model_copy(update={"num_nodes": num_nodes})
    table, counts = enumerate_plans(request.model, system, request.base, system.num_gpus, request.options)
    out = Candidates(counts=counts, valid=len(table))
    if not len(table):
        return out
    est = _estimator(request.model, request.system, request.calibration).evaluate(table)
    mem, step, gbs = est["memory_per_gpu_bytes"], est["step_time_s"], table.cols["gbs"]
    batches_vary = len(request.options.global_batch_sizes) > 1
    rank = step / gbs if batches_vary else step  # time, for the time × memory front
    seq, gpus = request.model.seq_length, system.num_gpus
    objective = objective_values(request.objective, step, gbs, seq, gpus, batches_vary)
    fixed = request.memory_margin_bytes
    acts = est["memory_activations_bytes"]
    margin = FRAGMENTATION_OF_ACTIVATIONS * acts if fixed is None else np.full(len(table), fixed)
    needed = mem + margin
    fits = needed <= request.max_memory_fraction * system.gpu.hbm_bytes
    out.fitting, out.least_memory_bytes = int(fits.sum()), float(needed.min())
    fw = framework(request.options.framework)
    allowed = np.ones_like(fits) if request.include_oom else fits
    order = np.argsort(np.where(allowed, objective, np.inf), kind="stable")
    keep = set(order[: min(request.top_k, int(allowed.sum()))].tolist())
    keep |= set(pareto_front(rank[allowed], mem[allowed], np.flatnonzero(allowed)))
    for row in sorted(keep):
        out.rows.append(
            {
                "plan": runnable_plan(fw, table.plan_fields(row)),
                "num_nodes": num_nodes,
                "num_gpus": system.num_gpus,
                "fast_step_time_s": float(step[row]),
                "fast_rank_s": float(rank[row]),  # step time, or per sequence when batches vary
                "memory_per_gpu_bytes": float(mem[row]),
                "reserved_bytes": float(est["memory_reserved_bytes"][row]),
                "margin_bytes": float(margin[row]),
                "fits": bool(fits[row]),
            }
        )
    return out


_ESTIMATORS: dict[str, FastEstimator] = {}


def _estimator(model: ModelConfig, system: SystemConfig, calibration: dict[str, Any] | None) -> FastEstimator:
    """One estimator per model, system and calibration in this process, whatever the node count: its unit
    and group costs depend on the GPUs per node and the plan, not on how many nodes there are, so a
    sweep over node counts reuses them."""
    key = json.dumps([model.model_dump(), system.model_dump(exclude={"num_nodes"}), calibration], sort_keys=True)
    found = _ESTIMATORS.get(key)
    if found is None:
        found = _ESTIMATORS[key] = FastEstimator(model, system, calibration)
    return found


def check_fast_path_plan(plan: dict[str, Any]) -> None:
    """Plan fields the search's fast path does not price (one line naming the field), which only the graph
    simulation (`itercast predict`) prices: DeepSpeed v0.3's per-tensor ZeRO-3 collectives (plan.zero3_collectives)."""
    value = plan.get("zero3_collectives", "coalesced")
    if value != "coalesced":
        raise ConfigError(
            f"plan.zero3_collectives {value} (DeepSpeed v0.3's ZeRO-3) is priced by `itercast predict`, not by the "
            "search's fast path: expected coalesced"
        )


def run_search(
    request: SearchRequest, backend: str = "local", workers: int = 1, progress: Progress | None = None
) -> SearchResult:
    """Search every node count of the request; re-score the best by the graph simulation. A
    distribution objective (p95, …) ranks by the deterministic step here; distribution_rank re-ranks."""
    check_objective(request.objective)
    check_fast_path_plan(request.base.model_dump())
    if request.system.device_groups:
        raise ConfigError(
            "search covers clusters of one GPU kind; for system.device_groups, `itercast slice --device-groups` "
            "maps stages to the groups and `itercast predict` prices a plan on them"
        )
    start = time.perf_counter()
    pieces = _run_pieces(request, backend, workers, progress)
    counts, rows = SpaceCounts(), []
    valid = fitting = 0
    least = float("inf")
    for piece in pieces:
        counts.add(piece.counts)
        rows += piece.rows
        valid, fitting = valid + piece.valid, fitting + piece.fitting
        least = min(least, piece.least_memory_bytes)
    if not valid:
        raise ConfigError(f"no valid plan: {_tightest(counts)}")
    if not rows:
        fraction = request.max_memory_fraction
        raise ConfigError(
            f"no plan fits: the least memory any of the {valid:,} valid plans needs is "
            f"{least / 2**30:.1f} GiB per GPU with its margin, "
            f"over the {fraction:.0%} of {request.system.gpu.hbm_bytes / 2**30:.3g} GiB allowed "
            "(--max-memory-fraction, --memory-headroom-gib); try more GPUs, a smaller global batch, recompute or ZeRO"
        )
    rows.sort(key=lambda r: objective_of(request, r, r["fast_step_time_s"]))
    fw_name = framework(request.options.framework).name
    best = [_rescore(request, r) for r in rows[: request.top_k]]
    for r in best:
        r["launch"] = launch_settings(fw_name, r["plan"], request.model, r["num_nodes"])
    best.sort(key=lambda r: objective_of(request, r, r["step_time_s"]))
    gaps = [abs(r["fast_step_time_s"] / r["step_time_s"] - 1) for r in best]
    fast_rows = [r for r in rows if r["fits"] or request.include_oom]
    return SearchResult(
        plans=best,
        pareto_memory=[fast_rows[i] for i in _pareto_rows(fast_rows, "memory_per_gpu_bytes")],
        pareto_gpus=[fast_rows[i] for i in _pareto_rows(fast_rows, "num_gpus")],
        pareto_cost=time_cost_front(fast_rows, request.model.seq_length, request.token_budget),
        evaluated=counts.generated,
        valid=valid,
        fitting=fitting,
        seconds=time.perf_counter() - start,
        fast_vs_graph_max=max(gaps),
        framework=fw_name,
        headroom=describe_margin(request.system.gpu, request.memory_margin_bytes),
        objective=request.objective,
        token_budget=request.token_budget,
        priced_with=calibration_source(request.calibration),
    )


def calibration_source(calibration: dict[str, Any] | None) -> str:
    """What a search's plans were priced with, said in its result: the built-in curves, or a calibration
    fitted for a system (its `system`; with host overheads, those too)."""
    if calibration is None:
        return "the built-in curves"
    host = " and its host overheads" if "host_overheads" in calibration else ""
    return f"a calibration fitted for {calibration.get('system') or 'an unnamed system'}{host}"


def _run_pieces(request: SearchRequest, backend: str, workers: int, progress: Progress | None) -> list[Candidates]:
    counts = request.node_counts
    if backend == "ray":
        return _run_on_ray(request, counts, progress)
    if backend != "local":
        raise ConfigError(f"--backend: expected local or ray; got {backend!r}")
    if workers <= 1 or len(counts) == 1:
        return list(_reporting((search_piece(request, n) for n in counts), len(counts), progress))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(_reporting(pool.map(search_piece, [request] * len(counts), counts), len(counts), progress))


def _run_on_ray(request: SearchRequest, counts: tuple[int, ...], progress: Progress | None) -> list[Candidates]:
    """Each node count a Ray task on the cluster `ray.init()` finds (a local one if none runs)."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--backend ray needs Ray: pip install 'itercast[ray]'") from None
    if not ray.is_initialized():
        ray.init(log_to_driver=False)
    remote = ray.remote(search_piece)
    refs = [remote.remote(request, n) for n in counts]
    results: dict[Any, Candidates] = {}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        results[done[0]] = ray.get(done[0])
        if progress:
            progress(len(results), len(refs))
    return [results[r] for r in refs]


def _reporting(pieces: Iterable[Candidates], total: int, progress: Progress | None) -> Iterable[Candidates]:
    for i, piece in enumerate(pieces, 1):
        if progress:
            progress(i, total)
        yield piece


def plan_job(request: SearchRequest, row: dict[str, Any]) -> Job:
    """The job of one candidate row: the request's model, the row's plan, on the row's node count."""
    system = request.system.model_copy(update={"num_nodes": row["num_nodes"]})
    return Job.from_dicts(request.model.model_dump(), row["plan"], system.model_dump())


def _rescore(request: SearchRequest, row: dict[str, Any]) -> dict[str, Any]:
    """The graph simulation's figures for one candidate (the same fields through Job validation), with what
    its price leaves out (`priced_notes`, as `predict` says them)."""
    job = plan_job(request, row)
    r = predict(job, request.calibration)
    gbs, seq = row["plan"]["global_batch_size"], request.model.seq_length
    return {
        **row,
        "step_time_s": r.step_time_s,
        "tokens_per_s": r.tokens_per_s,
        **token_figures(r.step_time_s, gbs, seq, row["num_gpus"], request.token_budget),
        "mfu": r.mfu,
        "model_tflops_per_gpu": r.model_tflops_per_gpu,
        "memory_per_gpu_bytes": r.memory.total_bytes,
        "breakdown": r.breakdown.as_dict(),
        "extrapolated": list(r.extrapolated),  # calibrated curves priced beyond their rows (predict)
        "notes": priced_notes(job.model, job.plan, job.system),
    }


def objective_of(request: SearchRequest, row: dict[str, Any], step_time_s: float) -> float:
    """A row's objective (smaller is better) for the step time given: the fast path's or the graph's."""
    batches_vary = len(request.options.global_batch_sizes) > 1
    gbs, seq = row["plan"]["global_batch_size"], request.model.seq_length
    return float(objective_values(request.objective, step_time_s, gbs, seq, row["num_gpus"], batches_vary))


def _pareto_rows(rows: list[dict[str, Any]], key: str) -> list[int]:
    time_s = np.array([r["fast_rank_s"] for r in rows])
    other = np.array([r[key] for r in rows], dtype=np.float64)
    return pareto_front(time_s, other, np.arange(len(rows)))


def _tightest(counts: SpaceCounts) -> str:
    """The rule that removed the last plans (the tightest constraint), and what each removed."""
    removed = {k: v for k, v in counts.removed.items() if v}
    last = next(reversed(removed)) if removed else "nothing generated"
    detail = ", ".join(f"{k}: {v:,}" for k, v in removed.items())
    return f"of {counts.generated:,} generated, the last were removed by '{last}' ({detail})"
