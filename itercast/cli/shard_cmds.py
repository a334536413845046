"""`itercast shard`: the fastest embedding-table shardings of a DLRM on a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, cast

import numpy as np
import typer
from rich.table import Table

from itercast.cli.app import (
    BatchPerRankOpt,
    CalibrationOpt,
    JsonOpt,
    SetOpt,
    app,
    console,
    echo_json,
    fail,
    warn,
    warn_other_system,
    working,
)
from itercast.config.job import blame_overrides, parse_section, raw_sections, read_yaml_file
from itercast.config.presets import preset, preset_names
from itercast.config.system import SystemConfig
from itercast.errors import ConfigError
from itercast.profile.calibrate import load_calibration
from itercast.sim.analysis import breakdown, critical_path
from itercast.workload import sharding_summary
from itercast.workloads.dlrm import (
    DLRMConfig,
    DLRMStep,
    Shard,
    ShardingResult,
    check_sharding,
    dlrm_model,
    dlrm_notes,
    dlrm_step,
    load_index_sample,
    plan_sharding,
)

MAX_MODEL_BYTES = 4 << 20


@app.command("shard")
def shard_cmd(
    model: Annotated[str, typer.Option(metavar="NAME|FILE", help="A DLRM preset (itercast presets) or a YAML file.")],
    system: Annotated[str, typer.Option(metavar="NAME", help="System preset.")] = "dgx-h100",
    set_: SetOpt = None,
    calibration: CalibrationOpt = None,
    indices: Annotated[
        list[str] | None,
        typer.Option(
            metavar="TABLE=FILE",
            help="A sample of a table's real indices (.npy or text integers), for its distinct rows (repeatable).",
        ),
    ] = None,
    nodes: Annotated[int, typer.Option(min=1, max=4096, help="Nodes of the system.")] = 1,
    batch_per_rank: BatchPerRankOpt = 4096,
    top: Annotated[int, typer.Option(min=1, max=1000, help="Plans to show.")] = 5,
    sharding: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="Price this sharding instead of searching: YAML `TABLE: {strategy: …, ranks: [...]}`.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Shard a DLRM's embedding tables over the GPUs (table-, column-, row-wise, data-parallel and
    mixes) for the least step time: every combination when there are few, else greedily, each plan
    priced by simulating its step on every rank; plans that fit first."""
    dlrm, sys_cfg, result, notes = _price(
        model, system, nodes, set_, calibration, indices, sharding, batch_per_rank, as_json
    )
    out: dict[str, Any] = {
        "model": dlrm.name,
        "system": sys_cfg.name,
        "plans": [_plan_dict(plan, step, batch_per_rank * sys_cfg.num_gpus) for plan, step in result.plans[:top]],
        "world_size": sys_cfg.num_gpus,
        "batch_per_rank": batch_per_rank,
        "method": result.method,
        "evaluated": result.evaluated,
        "host_overheads": result.plans[0][1].host_source,
        "notes": notes,  # what the prices leave out, as warned
    }
    if as_json:
        echo_json(out)
        return
    console.print(
        f"{dlrm.name} on {sys_cfg.num_gpus}× {sys_cfg.gpu.name}, {batch_per_rank} samples per GPU: "
        f"{result.evaluated:,} plans priced ({result.method}); host overheads: {out['host_overheads']}",
        highlight=False,
    )
    table = Table()
    for col in ("#", "step", "GiB/GPU", "sharding"):
        table.add_column(col, justify="right" if col != "sharding" else "left")
    for i, (plan, step) in enumerate(result.plans[:top], 1):
        table.add_row(
            str(i),
            f"{step.step_time_s * 1e3:.2f} ms",
            f"{step.memory_per_gpu_bytes / 2**30:.1f}" + ("" if step.fits else " OOM"),
            sharding_summary(plan),
        )
    console.print(table)


def _price(
    model: str,
    system: str,
    nodes: int,
    set_: list[str] | None,
    calibration: Path | None,
    indices: list[str] | None,
    sharding: Path | None,
    batch_per_rank: int,
    quiet: bool,
) -> tuple[DLRMConfig, SystemConfig, ShardingResult, list[str]]:
    """The model, the system, the priced sharding(s) (the given one, else the planner's) and the notes on what
    their prices leave out, each warned; every input problem is one error line and exit 2."""
    try:
        raw = raw_sections(overrides=set_ or [], system=system)
        if raw["plan"]:
            raise ConfigError(
                "--set plan.*: shard takes the plan's batch as --batch-per-rank and a sharding to price as --sharding "
                "FILE (its --set: model.FIELD=VALUE, system.FIELD=VALUE)"
            )
        if "num_nodes" in raw["system"] and raw["system"]["num_nodes"] != nodes and nodes != 1:
            raise ConfigError(
                f"--nodes {nodes} and --set system.num_nodes={raw['system']['num_nodes']} disagree: give one of them"
            )
        dlrm = load_dlrm(model, raw["model"], set_ or [])
        sys_cfg = cast(SystemConfig, parse_section("system", {"num_nodes": nodes, **raw["system"]}, "--system/--set"))
        cal = load_calibration(calibration) if calibration else None
        counts = _index_samples(indices or [], dlrm)
        with working("pricing shardings…", quiet):
            if sharding is not None:
                plan = load_sharding(sharding, dlrm, sys_cfg.num_gpus)
                step = dlrm_step(dlrm, sys_cfg, plan, batch_per_rank, cal, counts)
                found = ShardingResult([(plan, step)], "given", 1)
            else:
                found = plan_sharding(dlrm, sys_cfg, batch_per_rank, calibration=cal, index_counts=counts)
    except (ConfigError, ValueError) as exc:  # CalibrationError is a ValueError
        fail(str(exc).replace("\n", "\n  "))
    # what the prices rest on, said once they stand (bad input is one error line, nothing before it)
    if cal is not None and calibration is not None:
        warn_other_system(calibration, cal, sys_cfg)
    # and the calibrated curves the chosen sharding's step priced beyond their rows
    said = [*dlrm_notes(dlrm, sys_cfg, batch_per_rank, cal), *found.plans[0][1].extrapolated]
    for note in said:
        warn(note)
    return dlrm, sys_cfg, found, said


def _plan_dict(plan: dict[str, Shard], step: DLRMStep, samples_per_step: int) -> dict[str, Any]:
    """A priced sharding as JSON: tables, step time, throughput (the step's `samples_per_step` over its time, as
    `search` of a DLRM gives it), memory, the step by cause on the rank that finishes last, and the critical
    path (task names in order, repeats merged)."""
    g = step.graph
    path = [g.names[g.name[t]] for t in critical_path(step.sim)]
    return {
        "tables": [{"name": n, "strategy": s.strategy, "ranks": list(s.ranks)} for n, s in plan.items()],
        "step_time_s": step.step_time_s,
        "samples_per_s": samples_per_step / step.step_time_s,
        "memory_per_gpu_bytes": step.memory_per_gpu_bytes,
        "fits": step.fits,
        "breakdown": breakdown(step.sim).as_dict(),
        "critical_path": [name for i, name in enumerate(path) if i == 0 or path[i - 1] != name],
    }


def _index_samples(items: list[str], dlrm: DLRMConfig) -> dict[str, np.ndarray]:
    """`TABLE=FILE` options → each table's row frequencies (workloads/dlrm.load_index_sample)."""
    tables = {t.name: t for t in dlrm.tables}
    out = {}
    for item in items:
        name, sep, file = item.partition("=")
        if not sep or not file:
            raise ConfigError(f"--indices {item!r}: expected TABLE=FILE")
        if name not in tables:
            raise ConfigError(
                f"--indices {item!r}: {dlrm.name} has no table {name!r} (tables: {', '.join(list(tables)[:10])}…)"
            )
        out[name] = load_index_sample(Path(file), tables[name])
    return out


def load_sharding(path: Path, dlrm: DLRMConfig, world: int) -> dict[str, Shard]:
    """A sharding file, every problem named."""
    doc = read_yaml_file(path, "sharding", MAX_MODEL_BYTES)
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping TABLE: {{strategy, ranks}}; got {type(doc).__name__}")
    plan: dict[str, Shard] = {}
    for name, entry in doc.items():
        if not isinstance(entry, dict) or set(entry) != {"strategy", "ranks"}:
            raise ConfigError(f"{path}: table {name!r}: expected {{strategy: …, ranks: [...]}}; got {entry!r:.80}")
        ranks = entry["ranks"]
        if not isinstance(ranks, list) or not all(type(r) is int for r in ranks) or not ranks:
            raise ConfigError(f"{path}: table {name!r}: ranks must be a list of integers; got {ranks!r:.80}")
        plan[str(name)] = Shard(entry["strategy"], tuple(ranks))
    problems = check_sharding(dlrm, plan, world)
    if problems:
        raise ConfigError("\n".join(f"{path}: {p}" for p in problems))
    return plan


def load_dlrm(
    text: str, overrides: dict[str, Any] | None = None, given: list[str] | tuple[str, ...] = ()
) -> DLRMConfig:
    """A DLRM preset by name, or a YAML file of the same fields; `overrides` (`--set model.X=…`, as `given`, one
    table's field as `model.tables.0.X`) merged over either's fields, an error about one naming its --set."""
    if text in preset_names("dlrm"):
        fields, source = preset("dlrm", text), f"preset {text}"
    else:
        path = Path(text)
        if not path.is_file():
            raise ConfigError(f"--model {text}: neither a DLRM preset ({', '.join(preset_names('dlrm'))}) nor a file")
        fields, source = read_yaml_file(path, "DLRM model", MAX_MODEL_BYTES), str(path)
        if not isinstance(fields, dict):
            raise ConfigError(f"{path}: expected a mapping of DLRM fields; got {type(fields).__name__}")
    try:
        return dlrm_model(overrides or {}, source, fields)
    except ConfigError as exc:
        raise blame_overrides(exc, source, given) from None
