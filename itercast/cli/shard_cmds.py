"""`itercast shard`: the fastest embedding-table shardings of a DLRM on a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, cast

import typer
from pydantic import ValidationError
from rich.table import Table

from itercast.cli import JsonOpt, app, console, echo_json, fail, working
from itercast.config.job import load_system, plain_yaml
from itercast.config.presets import preset, preset_names
from itercast.config.system import SystemConfig
from itercast.errors import ConfigError
from itercast.user_files import read_small_text
from itercast.workloads.dlrm import DLRMConfig, Shard, ShardingResult, check_sharding, dlrm_step, plan_sharding

MAX_MODEL_BYTES = 4 << 20


@app.command("shard")
def shard_cmd(
    model: Annotated[str, typer.Option(metavar="NAME|FILE", help="A DLRM preset (itercast presets) or a YAML file.")],
    system: Annotated[str, typer.Option(metavar="NAME", help="System preset.")] = "dgx-h100",
    nodes: Annotated[int, typer.Option(min=1, max=4096, help="Nodes of the system.")] = 1,
    batch_per_rank: Annotated[int, typer.Option(min=1, max=10_000_000, help="Samples per GPU per step.")] = 4096,
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
    try:
        dlrm = _load_model(model)
        sys_cfg = cast(SystemConfig, load_system(system, num_nodes=nodes))
        with working("pricing shardings…", as_json):
            if sharding is not None:
                plan = _load_sharding(sharding, dlrm, sys_cfg.num_gpus)
                result = ShardingResult([(plan, dlrm_step(dlrm, sys_cfg, plan, batch_per_rank))], "given", 1)
            else:
                result = plan_sharding(dlrm, sys_cfg, batch_per_rank)
    except (ConfigError, ValueError) as exc:
        fail(str(exc).replace("\n", "\n  "))
    plans = [
        {
            "tables": [{"name": n, "strategy": s.strategy, "ranks": list(s.ranks)} for n, s in plan.items()],
            "step_time_s": step.step_time_s,
            "memory_per_gpu_bytes": step.memory_per_gpu_bytes,
            "fits": step.fits,
        }
        for plan, step in result.plans[:top]
    ]
    out: dict[str, Any] = {
        "plans": plans,
        "world_size": sys_cfg.num_gpus,
        "batch_per_rank": batch_per_rank,
        "method": result.method,
        "evaluated": result.evaluated,
    }
    if as_json:
        echo_json(out)
        return
    console.print(
        f"{dlrm.name} on {sys_cfg.num_gpus}× {sys_cfg.gpu.name}, {batch_per_rank} samples per GPU: "
        f"{result.evaluated:,} plans priced ({result.method})",
        highlight=False,
    )
    table = Table()
    for col in ("#", "s/step", "GiB/GPU", "sharding"):
        table.add_column(col, justify="right" if col != "sharding" else "left")
    for i, (plan, step) in enumerate(result.plans[:top], 1):
        table.add_row(
            str(i),
            f"{step.step_time_s * 1e3:.2f} ms",
            f"{step.memory_per_gpu_bytes / 2**30:.1f}" + ("" if step.fits else " OOM"),
            _summary(plan),
        )
    console.print(table)


def _summary(plan: dict[str, Shard]) -> str:
    """`t0 TW@0, t1 RW, …`: a sharding on one line."""
    short = {"table_wise": "TW", "column_wise": "CW", "row_wise": "RW", "data_parallel": "DP"}
    parts = []
    for name, s in plan.items():
        where = f"@{','.join(map(str, s.ranks))}" if s.strategy in ("table_wise", "column_wise") else ""
        parts.append(f"{name} {short[s.strategy]}{where}")
    return ", ".join(parts)


def _load_sharding(path: Path, dlrm: DLRMConfig, world: int) -> dict[str, Shard]:
    """A sharding file, every problem named."""
    doc = plain_yaml(read_small_text(path, "sharding", MAX_MODEL_BYTES), str(path))
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


def _load_model(text: str) -> DLRMConfig:
    """A DLRM preset by name, or a YAML file of the same fields."""
    if text in preset_names("dlrm"):
        fields, source = preset("dlrm", text), f"preset {text}"
    else:
        path = Path(text)
        if not path.is_file():
            raise ConfigError(f"--model {text}: neither a DLRM preset ({', '.join(preset_names('dlrm'))}) nor a file")
        fields, source = plain_yaml(read_small_text(path, "DLRM model", MAX_MODEL_BYTES), str(path)), str(path)
        if not isinstance(fields, dict):
            raise ConfigError(f"{path}: expected a mapping of DLRM fields; got {type(fields).__name__}")
    try:
        return DLRMConfig.model_validate(fields)
    except ValidationError as exc:
        problems = [f"{source}: `{'.'.join(map(str, e['loc']))}`: {e['msg']}" for e in exc.errors()]
        raise ConfigError("\n".join(problems)) from None
