"""`itercast slice`: the fastest slicing of layers into pipeline stages (exact, relaxed, or both)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, cast

import typer
from rich.console import Console
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

from itercast.cli.app import (
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
    warn,
    warn_other_system,
)
from itercast.config.job import parse_section, raw_sections
from itercast.config.model import ModelConfig
from itercast.config.system import SystemConfig
from itercast.errors import ConfigError, DeadlockError
from itercast.profile.calibrate import load_calibration
from itercast.search.job_slicing import JobSlicing, job_with_stages, slice_job, slice_job_on_groups
from itercast.search.layer_costs import job_layer_costs, read_layer_csv
from itercast.search.stage_slicing import LayerCosts, Slicing, slice_best_stages, slice_exact, slice_relaxed
from itercast.workloads.dlrm import is_dlrm_model
from itercast.workloads.transformer_ops import priced_notes

SEND_GBPS = 25.0  # --send-gbps's default, GB/s: the link a --layer-times CSV's activation_bytes cross


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
        int | None,
        typer.Option(
            min=1,
            max=10_000_000,
            help="Micro-batches per step of --layer-times (default 1); a job's are its plan's global_batch_size / "
            "(micro_batch_size × data_parallel).",
        ),
    ] = None,
    memory_gib: Annotated[
        float | None,
        typer.Option(
            callback=finite(0, above=True), help="Memory a stage may use (default: the GPU's, less its reserve)."
        ),
    ] = None,
    send_gbps: Annotated[
        float | None,
        typer.Option(
            callback=finite(0, above=True),
            help=f"CSV: link bandwidth for activation_bytes, GB/s (1e9 B/s) [default: {SEND_GBPS:g}].",
        ),
    ] = None,
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
            "GPUs price the layers and the search also places the stages on the groups. Default: the job's "
            "system.device_groups, if it has them.",
        ),
    ] = None,
) -> None:
    """Slice a pipelined transformer's layers into stages for the least step time `predict` reports,
    within the memory it reports (search/job_slicing.py; a CSV of measured times: (m − 1)·max + Σ stage
    times, each stage's send to the next and its memory). Prints the slicing as plan.stage_layers."""
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
        if layer_times is not None:
            if device_groups is not None:
                raise ConfigError("--device-groups is for a job; --layer-times are one device's measured times")
            send = send_gbps or SEND_GBPS
            out = _slice_csv(src, stages, max_stages, microbatches, memory_gib, send, method, starts, workers)
        else:
            raw, source = src.sections()
            if is_dlrm_model(raw["model"]):
                fail("slice: slicing layers into pipeline stages is for pipelined transformers; this job is a DLRM")
            if memory_gib is not None:
                raise ConfigError("--memory-gib is for --layer-times; a job's stages use its GPUs' memory")
            if send_gbps is not None:
                raise ConfigError("--send-gbps is for --layer-times; a job's sends are priced on its system's links")
            if microbatches is not None:
                raise ConfigError(
                    "--microbatches is for --layer-times; a job's micro-batches are its plan's global_batch_size / "
                    "(micro_batch_size × data_parallel): set those (--set plan.global_batch_size=…)"
                )
            if calibration is not None and src.calibration is not None:
                system_of = cast(SystemConfig, parse_section("system", raw["system"], source))
                warn_other_system(calibration, src.calibration, system_of)
            out = _slice_job(src, raw, source, stages, max_stages, device_groups, method, starts, workers, as_json)
    except (ConfigError, DeadlockError, ValueError) as exc:
        fail(str(exc).replace("\n", "\n  "))
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


def _slice_csv(
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
    """Slicing of a CSV's measured layers: exact, relaxed, or both."""
    if src.job_file or src.example or src.model or src.system or src.overrides or src.calibration:
        raise ConfigError(
            "give either --layer-times or a job (file, --example, --model/--system, --calibration), not both"
        )
    assert src.layer_times is not None
    costs, names = read_layer_csv(src.layer_times, send_gbps * 1e9)
    m = microbatches or 1
    limit = math.inf if memory_gib is None else memory_gib * 2**30
    k = _stage_count(stages, 0, costs.num_layers)
    out: dict[str, Any] = {
        "layers": costs.num_layers,
        "microbatches": m,
        "memory_limit_bytes": limit if math.isfinite(limit) else None,  # None: no limit
    }
    if _method(method) in ("exact", "both"):
        t0 = time.perf_counter()
        exact = slice_exact(costs, k, m, limit) if k else slice_best_stages(costs, m, max_stages, limit)
        out |= _as_dict(exact, time.perf_counter() - t0, names)
    if method in ("relaxed", "both"):
        out |= _relaxed(costs, k or len(out.get("boundaries", [])) or 1, m, starts, workers, names, method, limit)
    return out


def _method(method: str) -> str:
    if method not in ("exact", "relaxed", "both"):
        raise ConfigError(f"--method: expected exact, relaxed or both; got {method!r}")
    return method


def _relaxed(
    costs: LayerCosts, k: int, m: int, starts: int, workers: int, names: list[str], method: str, limit: float
) -> dict[str, Any]:
    """The relaxation's slicing into k stages (--method relaxed), or beside the exact one with its gap
    to the exact optimum of the same objective (--method both)."""
    t0 = time.perf_counter()
    relaxed = slice_relaxed(costs, k, m, starts, workers)
    found = _as_dict(relaxed, time.perf_counter() - t0, names) | {"starts": starts}
    if method == "relaxed":
        return found
    found["gap"] = relaxed.step_time_s / slice_exact(costs, k, m, limit).step_time_s - 1
    return {"relaxed": found}


def _slice_job(
    src: _Source,
    raw: dict[str, Any],
    source: str,
    stages: str | None,
    max_stages: int,
    device_groups: str | None,
    method: str,
    starts: int,
    workers: int,
    quiet: bool,
) -> dict[str, Any]:
    """A job's slicing as `predict` prices it: into the plan's (or --stages) pipeline stages, or with
    --stages auto into every stage count its GPUs and layers allow, the fastest that fits."""
    groups = _groups(device_groups) if device_groups is not None else _job_groups(raw["system"], source)
    if device_groups is not None and groups is not None:  # the cluster is the groups' (their nodes), as in a job file
        given = [{"preset": preset, "num_nodes": nodes} for preset, nodes in groups]
        raw = {**raw, "system": {**raw["system"], "device_groups": given}}
    if _method(method) != "exact" and groups is not None:
        raise ConfigError("--device-groups: the search is exact (the relaxation prices one device)")
    layers = cast(ModelConfig, parse_section("model", raw["model"], source)).num_layers
    units = layers + 2  # the embedding, every layer, the head
    k = _stage_count(stages, int(raw["plan"].get("pipeline_parallel", 1)), units)
    counts = [k] if k else list(range(1, min(max_stages, units) + 1))
    t0 = time.perf_counter()
    found: list[JobSlicing] = []
    with _progress(len(counts), quiet or len(counts) == 1) as step:
        for n in counts:
            try:
                job = job_with_stages(raw["model"], raw["plan"], raw["system"], n, source)
                found.append(
                    slice_job(job, src.calibration)
                    if groups is None
                    else slice_job_on_groups(
                        raw["model"], job.to_dict()["plan"], raw["system"], groups, src.calibration
                    )
                )
            except (ConfigError, ValueError):
                if k:
                    raise  # the count asked for: say why it cannot be
            step()
    if not found:
        raise ValueError(f"no stage count in 1..{counts[-1]} gives a valid plan that fits the GPUs' memory")
    best = min(found, key=lambda js: js.prediction.step_time_s)
    # what the slicing's price rests on and calibrated curves priced beyond their rows, as predict says them
    notes = priced_notes(best.job.model, best.job.plan, best.job.system)
    for note in (*notes, *best.prediction.extrapolated):
        warn(note)
    out = _job_dict(best, time.perf_counter() - t0, src.calibration) | {"notes": notes}
    if method in ("relaxed", "both"):
        costs, names = job_layer_costs(best.job, src.calibration)
        out |= _relaxed(costs, out["stages"], out["microbatches"], starts, workers, names, method, math.inf)
    return out


@contextmanager
def _progress(total: int, quiet: bool) -> Iterator[Callable[[], None]]:
    """A progress bar over stage counts on stderr (none for one count, with --json, or off a terminal)."""
    if quiet:
        yield lambda: None
        return
    columns = (TextColumn("slicing: stage counts"), BarColumn(), TextColumn("{task.completed}/{task.total}"))
    with RichProgress(*columns, TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("slice", total=total)
        yield lambda: bar.advance(task)


def _job_dict(js: JobSlicing, seconds: float, calibration: dict[str, Any] | None) -> dict[str, Any]:
    """A job's slicing: predict's step for it, its stage_layers, and the lumped objective's stages."""
    _, names = job_layer_costs(js.job, calibration)
    s, r = js.slicing, js.prediction
    return {
        "layers": len(names),
        "microbatches": js.job.num_microbatches,
        "memory_limit_bytes": r.memory.capacity_bytes,
        "stage_layers": list(js.stage_layers),
        # the plan the slicing is for (--stages auto picks the pipeline size, and with it data_parallel)
        "data_parallel": js.job.plan.data_parallel,
        "pipeline_parallel": js.job.plan.pipeline_parallel,
        "virtual_pipeline": js.job.plan.virtual_pipeline,
        "stages": len(s.boundaries),
        "boundaries": s.boundaries,
        "first_layer_names": [names[b] for b in s.boundaries],
        "stage_times_s": s.stage_times_s,
        "bottleneck_s": s.bottleneck_s,
        "step_time_s": r.step_time_s,  # predict's, for this slicing
        "lumped_step_time_s": s.step_time_s,  # (m − 1)·max + Σ of the stages' per-micro-batch times
        "memory_per_gpu_bytes": r.memory.total_bytes,
        "candidates": js.candidates,
        "seconds": seconds,
        **(
            {"stage_groups": s.stage_groups, "device_groups": _pipeline_order(s.stage_groups)} if s.stage_groups else {}
        ),
    }


def _pipeline_order(stage_groups: list[str]) -> list[dict[str, Any]]:
    """system.device_groups in the order the slicing runs the pipeline over them (job_slicing.slice_job_on_groups:
    stages fill the groups in the order listed), from each stage's group `PRESET:NODES`; predict places the
    stage_layers the same way only with the groups in this order."""
    runs = [g for i, g in enumerate(stage_groups) if i == 0 or stage_groups[i - 1] != g]
    return [{"preset": g.rpartition(":")[0], "num_nodes": int(g.rpartition(":")[2])} for g in runs]


def _groups(spec: str) -> list[tuple[str, int]]:
    """`PRESET:NODES,…` → [(preset, nodes)]."""
    out = []
    for item in spec.split(","):
        preset, _, nodes = item.strip().partition(":")
        if not preset or not nodes.isdigit() or int(nodes) < 1:
            raise ConfigError(f"--device-groups: expected PRESET:NODES (e.g. dgx-a100:2); got {item.strip()!r}")
        out.append((preset, int(nodes)))
    return out


def _job_groups(system: dict[str, Any], source: str) -> list[tuple[str, int]] | None:
    """The job file's mixed cluster (system.device_groups) as --device-groups takes it, [(preset, nodes)]; None
    without one. A group that sets more than its preset and nodes is refused: slice prices each group as its
    preset."""
    groups = system.get("device_groups") or None
    if groups is None:
        return None
    out = []
    for i, group in enumerate(groups):
        extra = sorted(set(group) - {"preset", "num_nodes"}) if isinstance(group, dict) else ["(not a mapping)"]
        if extra or not isinstance(group.get("preset"), str) or not isinstance(group.get("num_nodes"), int):
            raise ConfigError(
                f"{source}: system.device_groups[{i}]: slice places stages on groups of a preset and its num_nodes; "
                f"got {group!r} (give them with --device-groups PRESET:NODES,…)"
            )
        out.append((group["preset"], group["num_nodes"]))
    return out


def _stage_count(text: str | None, default: int, units: int) -> int:
    """Stages asked for; 0 means auto (every count up to --max-stages)."""
    if text is None:
        return default
    if text == "auto":
        return 0
    try:
        k = int(text)
    except ValueError:
        raise ConfigError(f"--stages: expected a whole number or auto; got {text!r}") from None
    if not 1 <= k <= units:
        raise ConfigError(f"--stages {k}: expected 1..{units} (one layer per stage at most)")
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
    found = f"bottleneck {bottleneck_ms:.3f} ms (found in {out['seconds']:.2f} s)"
    if "lumped_step_time_s" in out:
        lumped = out["lumped_step_time_s"]
        vp = out["virtual_pipeline"]
        objective = (
            f"the slicer's (m − 1)·max + Σ over its {out['stages']} chunks, not an interleaved step: {lumped:.4f} s"
            if vp > 1
            else f"(m − 1)·max + Σ: {lumped:.4f} s"
        )
        console.print(f"step {step:.4f} s as `predict` prices it ({objective}), {found}")
    else:
        console.print(f"step {step:.4f} s, {found}")
    if "stage_layers" in out:  # plain lines, never wrapped: they are pasted into a job file
        if "pipeline_parallel" in out:  # a job's slicing: the plan it is for
            plan = {"data_parallel": out["data_parallel"], "pipeline_parallel": out["pipeline_parallel"]}
            plan |= {"virtual_pipeline": out["virtual_pipeline"]} if out["virtual_pipeline"] > 1 else {}
        else:  # a layer-costs file's slicing: its stages
            plan = {"pipeline_parallel": out["stages"]}
        lines = "".join(f"  {k}: {v}\n" for k, v in plan.items())
        typer.echo(f"paste under `plan:` in the job file:\n{lines}  stage_layers: {out['stage_layers']}")
    if "stage_groups" in out:
        console.print("stages on groups: " + ", ".join(out["stage_groups"]), highlight=False)
        groups = ", ".join(f"{{preset: {g['preset']}, num_nodes: {g['num_nodes']}}}" for g in out["device_groups"])
        typer.echo(
            f"and under `system:`, the groups in this order (the first stages on the first):\n"
            f"  device_groups: [{groups}]"
        )
    if "relaxed" in out:
        r = out["relaxed"]
        console.print(
            f"relaxed ({r['starts']} starts, {r['seconds']:.2f} s): step {r['step_time_s']:.4f} s, "
            f"gap {r['gap']:+.2%} to the exact optimum",
            highlight=False,
        )
