"""`itercast slice`: the fastest slicing of layers into pipeline stages (exact, relaxed, or both)."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from itercast.cli import (
    CalibrationOpt,
    ExampleOpt,
    JobFileArg,
    JsonOpt,
    ModelOpt,
    SetOpt,
    SystemOpt,
    app,
    console,
    echo_json,
    fail,
    finite,
    resolve_job_file,
)
from itercast.config.job import Job, parse_section, raw_sections
from itercast.config.model import ModelConfig
from itercast.config.plan import PlanConfig
from itercast.errors import ConfigError
from itercast.profile.calibrate import load_calibration
from itercast.search.layer_costs import job_layer_costs, read_layer_csv
from itercast.search.stage_slicing import (
    DeviceGroup,
    LayerCosts,
    Slicing,
    best_stage_count,
    slice_best_stages,
    slice_exact,
    slice_groups,
    slice_relaxed,
)


@app.command("slice")
def slice_cmd(
    job_file: JobFileArg = None,
    model: ModelOpt = None,
    system: SystemOpt = None,
    set_: SetOpt = None,
    example: ExampleOpt = False,
    as_json: JsonOpt = False,
    layer_times: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE", help="CSV with columns layer,time_s[,activation_bytes,memory_bytes] instead of a job."
        ),
    ] = None,
    stages: Annotated[
        str | None, typer.Option(metavar="K|auto", help="Stages (default: the plan's pipeline_parallel; CSV: auto).")
    ] = None,
    max_stages: Annotated[int, typer.Option(min=1, max=4096, help="Largest stage count --stages auto tries.")] = 64,
    microbatches: Annotated[
        int | None, typer.Option(min=1, max=10_000_000, help="Micro-batches per step (default: the job's; CSV: 1).")
    ] = None,
    memory_gib: Annotated[
        float | None,
        typer.Option(
            callback=finite(0, above=True), help="Memory a stage may use (default: the GPU's, less its reserve)."
        ),
    ] = None,
    send_gbps: Annotated[
        float,
        typer.Option(callback=finite(0, above=True), help="CSV: link bandwidth for activation_bytes, GB/s (1e9 B/s)."),
    ] = 25.0,
    method: Annotated[
        str, typer.Option(metavar="exact|relaxed|both", help="Exact DP, the relaxation, or both.")
    ] = "exact",
    starts: Annotated[int, typer.Option(min=1, max=4096, help="Random starts of the relaxation.")] = 16,
    workers: Annotated[
        int, typer.Option(min=1, max=256, help="Processes for the relaxation's starts.")
    ] = os.cpu_count() or 1,
    calibration: CalibrationOpt = None,
    device_groups: Annotated[
        str | None,
        typer.Option(
            metavar="PRESET:NODES,…",
            help="A mixed cluster: system presets and their nodes (e.g. dgx-h100:2,dgx-a100:2); each group's "
            "GPUs price the layers and the search also places the stages on the groups.",
        ),
    ] = None,
) -> None:
    """Slice layers into pipeline stages for the least step time, (m − 1)·max + Σ stage times, with each
    stage's send to the next and its memory; from the cost models of a job or a CSV of measured times."""
    try:
        src = _Source(
            job_file,
            example,
            model,
            system,
            set_ or [],
            layer_times,
            load_calibration(calibration) if calibration else None,
        )
        if device_groups is not None:
            out = _slice_mixed(src, device_groups, stages, max_stages, microbatches, method)
        else:
            out = _slice_one_device(
                src, stages, max_stages, microbatches, memory_gib, send_gbps, method, starts, workers
            )
    except (ConfigError, ValueError) as exc:
        fail(str(exc))
    if as_json:
        echo_json(out)
    else:
        _print(out)


@dataclass(frozen=True)
class _Source:
    """Where the layers come from: a job (file, --example, presets, overrides) or a CSV."""

    job_file: Path | None
    example: bool
    model: str | None
    system: str | None
    overrides: list[str]
    layer_times: Path | None
    calibration: dict[str, Any] | None  # curves the job's layers are priced with

    def sections(self) -> tuple[dict[str, Any], str]:
        """The job's raw sections and a name for messages."""
        path = resolve_job_file(self.job_file, self.example, self.model, self.system)
        return raw_sections(path, self.overrides, self.model, self.system), str(path) if path else "<command line>"


def _slice_one_device(
    src: _Source,
    stages: str | None,
    max_stages: int,
    microbatches: int | None,
    memory_gib: float | None,
    send_gbps: float,
    method: str,
    starts: int,
    workers: int,
) -> dict[str, Any]:
    """Slicing on one kind of device: exact, relaxed, or both."""
    costs, names, m, limit, default_k = _inputs(src, microbatches, send_gbps)
    if memory_gib is not None:
        limit = memory_gib * 2**30
    k = _stage_count(stages, default_k, costs)
    if method not in ("exact", "relaxed", "both"):
        raise ConfigError(f"--method: expected exact, relaxed or both; got {method!r}")
    out: dict[str, Any] = {
        "layers": costs.num_layers,
        "microbatches": m,
        "memory_limit_bytes": limit if math.isfinite(limit) else None,  # None: no limit
    }
    if method in ("exact", "both"):
        t0 = time.perf_counter()
        exact = slice_exact(costs, k, m, limit) if k else slice_best_stages(costs, m, max_stages, limit)
        out |= _as_dict(exact, time.perf_counter() - t0, names)
    if method in ("relaxed", "both"):
        t0 = time.perf_counter()
        relaxed = slice_relaxed(costs, k or len(out.get("boundaries", [])) or 1, m, starts, workers)
        found = _as_dict(relaxed, time.perf_counter() - t0, names) | {"starts": starts}
        if method == "relaxed":
            out |= found
        else:
            found["gap"] = relaxed.step_time_s / out["step_time_s"] - 1
            out["relaxed"] = found
    return out


def _slice_mixed(
    src: _Source,
    spec: str,
    stages: str | None,
    max_stages: int,
    microbatches: int | None,
    method: str,
) -> dict[str, Any]:
    """`slice --device-groups`: the job's layers priced on each group's GPUs, stages placed on groups."""
    if src.layer_times is not None:
        raise ConfigError("--device-groups needs a job (each group's GPUs price its layers), not --layer-times")
    if method != "exact":
        raise ConfigError("--device-groups: the search is exact (the relaxation prices one device)")
    raw, _ = src.sections()
    parsed = _groups(spec)
    total_nodes = sum(n for _, n in parsed)
    groups: list[DeviceGroup] = []
    names: list[str] = []
    job: Job | None = None
    for preset, nodes in parsed:
        job = _job_to_slice(raw["model"], raw["plan"], {"preset": preset, "num_nodes": total_nodes}, spec)
        p, gpu = job.plan, job.system.gpu
        costs, names = job_layer_costs(job, src.calibration)
        slots = nodes * job.system.node.gpus_per_node // (p.tensor_parallel * p.context_parallel * p.dp)
        groups.append(DeviceGroup(f"{preset}:{nodes}", costs, slots, gpu.hbm_bytes - gpu.reserved_bytes))
    assert job is not None
    m = microbatches or job.num_microbatches
    L, room = groups[0].costs.num_layers, sum(g.slots for g in groups)
    k = _stage_count(stages, job.plan.pipeline_parallel, groups[0].costs)
    t0 = time.perf_counter()
    if k:
        best = slice_groups(groups, k, m)
    else:
        best = best_stage_count(lambda n: slice_groups(groups, n, m), min(max_stages, L, room), "the groups")
    out: dict[str, Any] = {"layers": L, "microbatches": m, "device_groups": [g.name for g in groups]}
    out |= _as_dict(best, time.perf_counter() - t0, names) | {"stage_groups": best.stage_groups}
    return out


def _job_to_slice(model: dict[str, Any], plan: dict[str, Any], system: dict[str, Any], source: str) -> Job:
    """The job whose layers are sliced. Its layers need not divide evenly into its stages (that is
    what slicing is for): without plan.stage_layers, a near-even split stands in for validation."""
    m, p = parse_section("model", model, source), parse_section("plan", plan, source)
    assert isinstance(m, ModelConfig) and isinstance(p, PlanConfig)
    stages = p.pipeline_parallel * p.virtual_pipeline
    if p.stage_layers is None and m.num_layers % stages and m.num_layers >= stages:
        base, extra = divmod(m.num_layers, stages)
        plan = {**plan, "stage_layers": [base + (s < extra) for s in range(stages)]}
    return Job.from_dicts(model, plan, system, source)


def _groups(spec: str) -> list[tuple[str, int]]:
    """`PRESET:NODES,…` → [(preset, nodes)]."""
    out = []
    for item in spec.split(","):
        preset, _, nodes = item.strip().partition(":")
        if not preset or not nodes.isdigit() or int(nodes) < 1:
            raise ConfigError(f"--device-groups: expected PRESET:NODES (e.g. dgx-a100:2); got {item.strip()!r}")
        out.append((preset, int(nodes)))
    return out


def _inputs(
    src: _Source,
    microbatches: int | None,
    send_gbps: float,
) -> tuple[LayerCosts, list[str], int, float, int]:
    """(costs, layer names, micro-batches, memory limit in bytes, default stages: 0 = auto) from a
    CSV or a job (its pipeline_parallel)."""
    if src.layer_times is not None:
        if src.job_file or src.example or src.model or src.system or src.overrides or src.calibration:
            raise ConfigError(
                "give either --layer-times or a job (file, --example, --model/--system, --calibration), not both"
            )
        costs, names = read_layer_csv(src.layer_times, send_gbps * 1e9)
        return costs, names, microbatches or 1, math.inf, 0
    raw, source = src.sections()
    job = _job_to_slice(raw["model"], raw["plan"], raw["system"], source)
    costs, names = job_layer_costs(job, src.calibration)
    gpu = job.system.gpu
    m = microbatches or job.num_microbatches
    return costs, names, m, gpu.hbm_bytes - gpu.reserved_bytes, job.plan.pipeline_parallel


def _stage_count(text: str | None, default: int, costs: LayerCosts) -> int:
    """Stages asked for; 0 means auto (every count up to --max-stages)."""
    if text is None:
        return default
    if text == "auto":
        return 0
    try:
        k = int(text)
    except ValueError:
        raise ConfigError(f"--stages: expected a whole number or auto; got {text!r}") from None
    if not 1 <= k <= costs.num_layers:
        raise ConfigError(f"--stages {k}: expected 1..{costs.num_layers} (one layer per stage at most)")
    return k


def _as_dict(s: Slicing, seconds: float, names: list[str]) -> dict[str, Any]:
    ends = [*s.boundaries[1:], len(names)]
    layers = [sum(n.startswith("layer ") for n in names[a:b]) for a, b in zip(s.boundaries, ends, strict=True)]
    from_job = names[0] == "embedding" and names[-1] == "head"
    return {
        # a job's slicing as plan.stage_layers (transformer layers per stage), ready for `predict`
        **({"stage_layers": layers} if from_job else {}),
        "stages": len(s.boundaries),
        "boundaries": s.boundaries,
        "first_layer_names": [names[b] for b in s.boundaries],
        "stage_times_s": s.stage_times_s,
        "bottleneck_s": s.bottleneck_s,
        "step_time_s": s.step_time_s,
        "seconds": seconds,
    }


def _print(out: dict[str, Any]) -> None:
    table = Table(title=f"{out['layers']} layers, {out['microbatches']} micro-batches: {out['stages']} stages")
    for col in ("stage", "first layer", "layers", "time per micro-batch ms"):
        table.add_column(col, justify="right")
    ends = [*out["boundaries"][1:], out["layers"]]
    for s, (b, e, t) in enumerate(zip(out["boundaries"], ends, out["stage_times_s"], strict=True)):
        table.add_row(str(s), out["first_layer_names"][s], str(e - b), f"{t * 1e3:.3f}")
    console.print(table)
    step, bottleneck_ms = out["step_time_s"], out["bottleneck_s"] * 1e3
    console.print(f"step {step:.4f} s, bottleneck {bottleneck_ms:.3f} ms (found in {out['seconds'] * 1e3:.1f} ms)")
    if "stage_groups" in out:
        console.print("stages on groups: " + ", ".join(out["stage_groups"]), highlight=False)
    if "relaxed" in out:
        r = out["relaxed"]
        console.print(
            f"relaxed ({r['starts']} starts, {r['seconds']:.2f} s): step {r['step_time_s']:.4f} s, "
            f"gap {r['gap']:+.2%} to the exact optimum",
            highlight=False,
        )
