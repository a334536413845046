"""Slicing a job's layers into pipeline stages for the step `predict` reports, within the memory it reports.

The exact dynamic programme (stage_slicing.py) searches the lumped objective (M − 1)·max + Σ of the
stages' per-micro-batch times, priced by the same unit costs as `predict` (layer_costs.py), and
checks each candidate stage's memory with memory.StageMemory for the stage it would be (its in-flight
micro-batches capped at M, ZeRO-3's gathered layers, the embedding and the logits included). That
objective leaves out what `predict` adds once per step (the data-parallel reduction behind the last
backward, the optimizer, the fill's sends), so the slicings within `slack` of its optimum are priced
as `predict` assembles a step: on one kind of GPU by the closed-form fast path (search/fast_estimate.py,
within 2% of the graph on uniform stages), and the `refine` best of those are simulated by
`predict` itself; on a mixed cluster the `refine` best by the lumped objective are simulated. The
step reported is `predict`'s for the slicing chosen.

On a cluster whose stages run at measured speeds (slice_job_at_speeds, the speed map's plan change):
the same programme with each stage's layers priced at its speed, the best few simulated at those speeds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from itercast.config.job import Job, parse_section
from itercast.config.model import ModelConfig
from itercast.memory import StageMemory
from itercast.parallel.plan_table import PlanTable
from itercast.predict import Prediction, predict
from itercast.search.fast_estimate import FastEstimator
from itercast.search.layer_costs import job_layer_costs
from itercast.search.stage_slicing import (
    DeviceGroup,
    LayerCosts,
    Slicing,
    StageBytes,
    exact_candidates,
    group_candidates,
    stage_candidates,
)
from itercast.sim.engine import simulate
from itercast.stochastic.placement import with_speeds
from itercast.stochastic.variability import StepGraph, build_transformer_step

#: how far above the lumped optimum a slicing may be and still be priced as predict does (5%: the
#: once-per-step terms the lumped objective leaves out are a few per cent of a step)
SLACK = 0.05
#: how many of the best-priced candidates predict simulates
REFINE = 3


@dataclass(frozen=True)
class JobSlicing:
    """The slicing chosen, its job (plan.pipeline_parallel and plan.stage_layers set) and predict's
    answer for it; `candidates`: slicings priced beyond the dynamic programme."""

    slicing: Slicing
    job: Job
    prediction: Prediction
    candidates: int

    @property
    def stage_layers(self) -> tuple[int, ...]:
        layers = self.job.plan.stage_layers
        assert layers is not None
        return layers


def job_with_stages(
    model: dict[str, Any], plan: dict[str, Any], system: dict[str, Any], stages: int, source: str = "<input>"
) -> Job:
    """The job on `stages` pipeline stages, its layers split as evenly as they go (the first stages
    take the remainder) unless plan.stage_layers gives them. With another stage count than the plan's,
    data parallelism is what the GPUs leave (a data_parallel the plan fixed is dropped)."""
    fields = {**plan, "pipeline_parallel": stages}
    if stages != plan.get("pipeline_parallel", 1):
        fields.pop("data_parallel", None)
    chunks = stages * int(plan.get("virtual_pipeline", 1))
    layers = cast(ModelConfig, parse_section("model", model, source)).num_layers
    if "stage_layers" not in plan and layers % chunks:
        base, extra = divmod(layers, chunks)
        fields["stage_layers"] = [base + (s < extra) for s in range(chunks)]
    return Job.from_dicts(model, fields, system, source)


def stage_layers_of(slicing: Slicing, kinds: list[str]) -> tuple[int, ...]:
    """Transformer layers of each stage of a slicing over the units `kinds` (embed, layer/moe…, head)."""
    ends = [*slicing.boundaries[1:], len(kinds)]
    return tuple(sum(k in ("layer", "moe") for k in kinds[a:b]) for a, b in zip(slicing.boundaries, ends, strict=True))


def unit_kinds_of(job: Job) -> list[str]:
    m = job.model
    return ["embed", *["moe" if m.is_moe_layer(i) else "layer" for i in range(m.num_layers)], "head"]


def stage_bytes_of(job: Job) -> StageBytes | None:
    """Memory of stage s of k over every span of units [i, j), by memory.StageMemory for `job` (k its
    pipeline stages); None under interleaving, where a device's chunks are not one span (the
    candidates' memory is then checked whole, by the fast path)."""
    if job.plan.virtual_pipeline > 1:
        return None
    kinds = unit_kinds_of(job)
    n = len(kinds)
    dense = np.concatenate([[0], np.cumsum([k == "layer" for k in kinds])])
    moe = np.concatenate([[0], np.cumsum([k == "moe" for k in kinds])])
    i, j = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    layers = np.maximum(dense[j] - dense[i], 0) + np.maximum(moe[j] - moe[i], 0)
    moe_layers = np.maximum(moe[j] - moe[i], 0)
    memory = StageMemory(job.model, job.system, PlanTable.of_jobs([job]))

    def table(stage: int, stages: int) -> np.ndarray:
        assert stages == job.plan.pipeline_parallel, "price each stage count with its own job"
        total = memory.columns(i == 0, j == n, stage, layers, moe_layers)["total"]
        return np.where(j > i, total, np.inf)

    return table


def slice_job(job: Job, calibration: dict[str, Any] | None = None, slack: float = SLACK) -> JobSlicing:
    """The fastest slicing of `job`'s layers into its plan.pipeline_parallel × virtual_pipeline stages
    (module docstring), among those that fit its GPUs' memory."""
    costs, _ = job_layer_costs(job, calibration)
    p = job.plan
    stages = p.pipeline_parallel * p.virtual_pipeline
    found = exact_candidates(costs, stages, job.num_microbatches, _capacity_bytes(job), stage_bytes_of(job), slack)
    jobs, ranked = _fitting(job, found, calibration)
    return _best(found, jobs, ranked[:REFINE], calibration, len(found))


def _capacity_bytes(job: Job) -> float:
    """What one stage may hold in the dynamic programme: the GPU's memory; unbounded under
    interleaving, where the candidates' memory is checked whole by the fast path (_fitting)."""
    return job.system.gpu.hbm_bytes if job.plan.virtual_pipeline == 1 else np.inf


def _fitting(job: Job, found: list[Slicing], calibration: dict[str, Any] | None) -> tuple[list[Job], list[int]]:
    """`job` re-sliced as each of `found`, and the indices of those that fit its GPUs' memory by the
    fast path (priced by `calibration`'s curves, as the layer costs were), its fastest first."""
    kinds = unit_kinds_of(job)
    return _fitting_jobs(job, [_with_layers(job, stage_layers_of(sl, kinds)) for sl in found], calibration)


def _fitting_jobs(job: Job, jobs: list[Job], calibration: dict[str, Any] | None) -> tuple[list[Job], list[int]]:
    """_fitting of re-sliced jobs."""
    fast = FastEstimator(job.model, job.system, calibration)
    priced = [fast.evaluate(PlanTable.of_jobs([j])) for j in jobs]
    ranked = sorted(
        (i for i, out in enumerate(priced) if bool(out["fits"][0])), key=lambda i: float(priced[i]["step_time_s"][0])
    )
    if not ranked:
        stages = job.plan.pipeline_parallel * job.plan.virtual_pipeline
        raise ValueError(f"no slicing into {stages} stages fits {job.system.gpu.name}'s memory")
    return jobs, ranked


def slice_job_on_groups(
    model: dict[str, Any],
    plan: dict[str, Any],
    system: dict[str, Any],
    groups: list[tuple[str, int]],
    calibration: dict[str, Any] | None = None,
    slack: float = SLACK,
) -> JobSlicing:
    """The fastest slicing of the job on a mixed cluster of `groups` (system preset, nodes) and the
    order of the groups along the pipeline. Each group prices the layers on its GPUs as if it ran the
    whole job (its stage costs) and checks each stage against its own memory; `system`'s other fields
    (node, network) hold for the mixed cluster."""
    total = sum(n for _, n in groups)
    base = {k: v for k, v in system.items() if k not in ("num_nodes", "device_groups")}
    per_group = []
    for preset, nodes in groups:
        job = Job.from_dicts(model, plan, {"preset": preset, "num_nodes": total})
        costs, _ = job_layer_costs(job, calibration)
        p, gpu = job.plan, job.system.gpu
        slots = nodes * job.system.node.gpus_per_node // p.stage_ranks
        per_group.append(DeviceGroup(f"{preset}:{nodes}", costs, slots, gpu.hbm_bytes, stage_bytes_of(job)))
    kinds = unit_kinds_of(job)
    found = group_candidates(per_group, job.plan.pipeline_parallel, job.num_microbatches, slack)
    by_name = dict(zip((g.name for g in per_group), groups, strict=True))
    jobs = []
    for sl in found[:REFINE]:
        order = [by_name[n] for i, n in enumerate(sl.stage_groups) if i == 0 or sl.stage_groups[i - 1] != n]
        mixed = {**base, "device_groups": [{"preset": g, "num_nodes": n} for g, n in order]}
        layers = {**plan, "stage_layers": list(stage_layers_of(sl, kinds))}
        jobs.append(Job.from_dicts(model, layers, mixed))
    return _best(found, jobs, list(range(len(jobs))), calibration, len(found))


def _with_layers(job: Job, stage_layers: tuple[int, ...]) -> Job:
    d = job.to_dict()
    return Job.from_dicts(d["model"], {**d["plan"], "stage_layers": list(stage_layers)}, d["system"])


def _best(
    found: list[Slicing], jobs: list[Job], order: list[int], calibration: dict[str, Any] | None, candidates: int
) -> JobSlicing:
    """Simulate the candidates `order` names; the one predict gives the least step wins."""
    simulated = [(i, predict(jobs[i], calibration)) for i in order]
    i, pred = min(simulated, key=lambda ip: ip[1].step_time_s)
    return JobSlicing(found[i], jobs[i], pred, candidates)


def interleaved_layers(num_layers: int, pp: int, vp: int, stage_speed: np.ndarray) -> list[tuple[int, ...]]:
    """Layer counts of the pp·vp virtual stages of an interleaved plan whose stages run at `stage_speed`, the least
    bottleneck first. Interleaved 1F1B runs virtual stage c on stage c mod pp, each stage's chunks one after
    another for every micro-batch, so a stage's time is its chunks' layers together over its speed, and the step
    follows the slowest stage: totals in proportion to the speeds (largest remainders rounded up), and every move
    of one layer between two stages from them; a stage's total split over its vp chunks as evenly as possible, the
    earlier chunks the larger, each at least vp layers a stage. Balancing each chunk as a stage of its own instead
    (the exact programme's stages) gave one chunk of the stage at 0.77 of the speed a layer and its others 5, slower
    than as it was: llama3-70b on 8 DGX H100 (tp 8 × pp 4 × vp 5, stage 1 at 0.769) was kept at 20.178 s, where
    these totals, [22, 16, 21, 21], run 18.139 s (`variability --speed-map`)."""
    share = num_layers * stage_speed / stage_speed.sum()
    base = np.floor(share).astype(int)
    base[np.argsort(base - share, kind="stable")[: num_layers - int(base.sum())]] += 1
    totals = [tuple(base.tolist())]
    for a in range(pp):
        for b in range(pp):
            moved = base.copy()
            moved[a], moved[b] = moved[a] - 1, moved[b] + 1
            if a != b and moved[a] >= vp:
                totals.append(tuple(moved.tolist()))
    totals = [t for t in totals if min(t) >= vp]
    totals.sort(key=lambda t: max(n / w for n, w in zip(t, stage_speed, strict=True)))
    out = []
    for t in totals:
        chunks = [[n // vp + (k < n % vp) for k in range(vp)] for n in t]  # stage s's chunks, the larger first
        out.append(tuple(chunks[c % pp][c // pp] for c in range(pp * vp)))
    return out


@dataclass(frozen=True)
class SpeedSlicing:
    """The slicing of a job's layers for pipeline stages that run at given speeds: its job (the plan
    as it was where no re-slicing beats it), that job's step graph with each stage's compute at its
    speed (stochastic/placement.with_speeds), the graph's simulated step, and how many re-slicings
    were simulated beside the plan as it was."""

    job: Job
    step: StepGraph
    step_s: float
    candidates: int

    @property
    def stage_layers(self) -> tuple[int, ...]:
        return self.job.plan.virtual_stage_layers(self.job.model.num_layers)


def slice_job_at_speeds(
    job: Job, stage_speed: np.ndarray, calibration: dict[str, Any] | None = None, slack: float = SLACK
) -> SpeedSlicing:
    """The plan change a cluster with slow GPUs allows without moving them: `job`'s layers re-sliced
    over its pipeline stages, stage s at relative speed stage_speed[s] (1 = nominal; its slowest
    GPU's), every other plan field kept. The exact programme (stage_candidates) prices stage s's
    layers at time / speed — their whole forward and backward, the tensor-parallel collectives too,
    where the graph slows only compute: an approximation of which slicings to simulate, no more — and
    checks each stage's memory as slice_job does; an interleaved plan is re-sliced by its stages'
    totals instead (interleaved_layers), its memory checked by the fast path. The REFINE best that fit,
    and the plan as it was, are simulated at the speeds (priced by `calibration`'s curves, None the
    built-in ones, as `variability`'s graph); the least step wins (ties: the plan as it was)."""
    p = job.plan
    if stage_speed.shape != (p.pipeline_parallel,):
        raise ValueError(f"a speed per pipeline stage: expected {p.pipeline_parallel}, got {stage_speed.size}")
    if p.virtual_pipeline > 1:
        layers = interleaved_layers(job.model.num_layers, p.pipeline_parallel, p.virtual_pipeline, stage_speed)
        jobs, fit = _fitting_jobs(job, [_with_layers(job, counts) for counts in layers], calibration)
        ranked = sorted(fit)  # interleaved_layers' order: the least bottleneck at the speeds first
    else:
        costs, _ = job_layer_costs(job, calibration)
        per_stage = [
            LayerCosts(costs.time_s / speed, costs.send_s, costs.static_bytes, costs.activation_bytes)
            for speed in stage_speed
        ]
        found = stage_candidates(per_stage, job.num_microbatches, _capacity_bytes(job), stage_bytes_of(job), slack)
        jobs, ranked = _fitting(job, found, calibration)
    tried = [job, *(jobs[i] for i in ranked[:REFINE])]
    options = []
    for j in tried:
        step = build_transformer_step(j, calibration)
        step = replace(step, graph=with_speeds(step.graph, stage_speed))
        options.append(SpeedSlicing(j, step, simulate(step.graph).step_time_s, len(tried) - 1))
    return min(options, key=lambda o: o.step_s)  # the first of equals: the plan as it was
