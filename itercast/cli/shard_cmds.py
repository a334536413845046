"""`itercast shard`: the fastest embedding-table shardings of a DLRM on a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, cast

import typer
from rich.table import Table

from itercast.cli.app import (
    CalibrationOpt,
    JobFileArg,
    JsonOpt,
    SetOpt,
    app,
    console,
    echo_json,
    fail,
    refuse_options,
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
from itercast.workload import DLRMWorkload, load_workload, parse_sharding_line, sharding_summary
from itercast.workloads.dlrm import (
    DLRMConfig,
    DLRMJob,
    DLRMStep,
    IndexSample,
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
MAX_SHARDING_BYTES = 16 << 20  # a saved `shard --json` of its top plans, critical paths and all, is a few MB at most
SYSTEM, BATCH_PER_RANK = "dgx-h100", 4096  # shard's defaults without a job file (--system, --batch-per-rank)


@app.command("shard")
def shard_cmd(
    job_file: JobFileArg = None,
    model: Annotated[
        str | None, typer.Option(metavar="NAME|FILE", help="A DLRM preset (itercast presets) or a YAML file.")
    ] = None,
    system: Annotated[str | None, typer.Option(metavar="NAME", help="System preset [default: dgx-h100].")] = None,
    set_: SetOpt = None,
    calibration: CalibrationOpt = None,
    indices: Annotated[
        list[str] | None,
        typer.Option(
            metavar="TABLE=FILE",
            help="A sample of a table's real indices (.npy or text integers), for its distinct rows (repeatable).",
        ),
    ] = None,
    nodes: Annotated[int | None, typer.Option(min=1, max=4096, help="Nodes of the system [default: 1].")] = None,
    batch_per_rank: Annotated[
        int | None,
        typer.Option(min=1, max=10_000_000, help=f"Samples per GPU per step [default: {BATCH_PER_RANK}]."),
    ] = None,
    top: Annotated[int, typer.Option(min=1, max=1000, help="Plans to show.")] = 5,
    sharding: Annotated[
        str | None,
        typer.Option(
            metavar="FILE|LINE",
            help="Price this sharding instead of searching: YAML `TABLE: {strategy: …, ranks: [...]}`, a saved "
            "`shard --json` (its first plan), or the table's line as shard prints it (`t0 TW@0, t1 RW, t2 CW@0-3`).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Shard a DLRM's embedding tables over the GPUs (table-, column-, row-wise, data-parallel and
    mixes) for the least step time: every combination when there are few, else greedily (each candidate
    simulated on one rank of each load, the step being symmetric in the ranks), the plans listed priced on
    every rank; plans that fit first, equally fast ones by memory. A DLRM job file gives the model,
    system, samples per GPU and (its plan.sharding) a sharding to price."""
    if job_file is not None:
        given = {"--model": model, "--system": system, "--nodes": nodes, "--batch-per-rank": batch_per_rank}
        refuse_options({k: v is not None for k, v in given.items()}, f"{job_file} gives them (--set changes them)")
        job, job_sharding = _job(job_file, set_ or [])
        dlrm, sys_cfg, batch_per_rank = job.model, job.system, job.plan.batch_per_rank
    else:
        if model is None:
            fail("shard: give a DLRM job file or --model NAME|FILE")
        (dlrm, sys_cfg), job_sharding = _presets(model, system or SYSTEM, nodes or 1, set_ or []), None
        batch_per_rank = batch_per_rank or BATCH_PER_RANK
    result, notes = _price(dlrm, sys_cfg, calibration, indices, sharding, job_sharding, batch_per_rank, as_json)
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
        f"{result.evaluated:,} plan{'s' if result.evaluated != 1 else ''} priced ({result.method}); "
        f"host overheads: {out['host_overheads']}",
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


def _job(path: Path, overrides: list[str]) -> tuple[DLRMJob, dict[str, Shard] | None]:
    """A DLRM job file with its --set overrides, and its plan's sharding (None: the planner's); a transformer's
    job or any problem is one error line."""
    try:
        w = load_workload(path, overrides)
    except ConfigError as exc:
        fail(str(exc).replace("\n", "\n  "))
    if not isinstance(w, DLRMWorkload):
        fail(
            f"shard: {path} is a transformer's job; shard places a DLRM's embedding tables (`itercast search` "
            "searches a transformer's plans)"
        )
    return w.job, w.job.shards()


def _presets(model: str, system: str, nodes: int, set_: list[str]) -> tuple[DLRMConfig, SystemConfig]:
    """--model and --system with --nodes and --set (model.* and system.* fields); one error line each."""
    try:
        raw = raw_sections(overrides=set_, system=system)
        if raw["plan"]:
            raise ConfigError(
                "--set plan.*: shard takes the plan's batch as --batch-per-rank and a sharding to price as --sharding "
                "FILE (its --set: model.FIELD=VALUE, system.FIELD=VALUE)"
            )
        if "num_nodes" in raw["system"] and raw["system"]["num_nodes"] != nodes and nodes != 1:
            raise ConfigError(
                f"--nodes {nodes} and --set system.num_nodes={raw['system']['num_nodes']} disagree: give one of them"
            )
        dlrm = load_dlrm(model, raw["model"], set_)
        return dlrm, cast(
            SystemConfig, parse_section("system", {"num_nodes": nodes, **raw["system"]}, "--system/--set")
        )
    except ConfigError as exc:
        fail(str(exc).replace("\n", "\n  "))


def _price(
    dlrm: DLRMConfig,
    sys_cfg: SystemConfig,
    calibration: Path | None,
    indices: list[str] | None,
    sharding: str | None,
    job_sharding: dict[str, Shard] | None,
    batch_per_rank: int,
    quiet: bool,
) -> tuple[ShardingResult, list[str]]:
    """The priced sharding(s) (--sharding's, else the job's plan.sharding, else the planner's) and the notes on
    what their prices leave out, each warned; every input problem is one error line and exit 2."""
    try:
        cal = load_calibration(calibration) if calibration else None
        counts = _index_samples(indices or [], dlrm)
        with working("pricing shardings…", quiet):
            given = load_sharding(sharding, dlrm, sys_cfg.num_gpus) if sharding is not None else job_sharding
            if given is not None:
                plan = given
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
    top = found.plans[0][0]
    said = [*dlrm_notes(dlrm, sys_cfg, batch_per_rank, cal, top, counts), *found.plans[0][1].extrapolated]
    for note in said:
        warn(note)
    return found, said


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


def _index_samples(items: list[str], dlrm: DLRMConfig) -> dict[str, IndexSample]:
    """`TABLE=FILE` options → each table's sample of real indices (workloads/dlrm.load_index_sample)."""
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
        if name in out:
            raise ConfigError(f"--indices {item!r}: table {name!r} is given a sample twice; give it one")
        out[name] = load_index_sample(Path(file), tables[name])
    return out


def load_sharding(given: str, dlrm: DLRMConfig, world: int) -> dict[str, Shard]:
    """--sharding, every problem named: a file, `TABLE: {strategy, ranks}` or a saved `shard --json` (or a DLRM's
    `search --json`), whose first plan's tables are read; else the line `shard` prints (workload.parse_sharding_line)
    where no such file is and the text has a table's code (`t0 TW@0, t1 RW`)."""
    path = Path(given)
    if not path.exists() and " " in given.strip():
        line = parse_sharding_line(given, world)
        if problems := check_sharding(dlrm, line, world):
            raise ConfigError("\n".join(f"--sharding: {p}" for p in problems))
        return line
    doc = read_yaml_file(path, "sharding", MAX_SHARDING_BYTES)
    if isinstance(doc, dict) and "plans" in doc:
        plans = doc["plans"]
        tables = plans[0].get("tables") if isinstance(plans, list) and plans and isinstance(plans[0], dict) else None
        if not isinstance(tables, list) or not all(isinstance(t, dict) and "name" in t for t in tables):
            raise ConfigError(f"{path}: `plans[0].tables`: expected a saved sharding's tables; got {tables!r:.80}")
        doc = {t["name"]: {k: v for k, v in t.items() if k != "name"} for t in tables}
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
