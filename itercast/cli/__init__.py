"""Command line: `itercast predict | search | slice | replay | variability | report | profile run|import |
calibrate | presets`.

Commands live beside this file, one module per area; importing them registers them on `app`.
"""

from __future__ import annotations

import json
import math
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata, resources
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from itercast.config.job import Job
from itercast.config.presets import preset_names, preset_source
from itercast.errors import ConfigError, DeadlockError
from itercast.predict import Prediction, predict
from itercast.profile.calibrate import CalibrationError, load_calibration
from itercast.traces.perfetto import write_chrome_trace

app = typer.Typer(
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Forecast distributed deep-learning training before paying for the GPUs.",
)
console = Console()
EXAMPLE = "gpt3-175b-a100.yaml"
EXIT_OOM = 3  # `predict --strict`: the plan does not fit in memory


def _version(value: bool) -> None:
    if value:
        typer.echo(f"itercast {metadata.version('itercast')}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool,
        typer.Option("--version", metavar="", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Forecast distributed deep-learning training before paying for the GPUs."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _interrupted)


def _interrupted(signum: int, frame: object) -> None:
    """Ctrl-C: say what was kept and how to go on, exit 130 (128 + SIGINT)."""
    typer.echo(
        "\ninterrupted: outputs are written whole or not at all, and a profiling database keeps every "
        "configuration it committed; run the same command again to resume (`profile run` skips what "
        "the database holds)",
        err=True,
    )
    raise SystemExit(130)


@contextmanager
def working(message: str, quiet: bool = False) -> Iterator[None]:
    """A spinner on stderr while a long step runs (none with --json or when stderr is no terminal)."""
    if quiet:
        yield
        return
    with Console(stderr=True).status(message):
        yield


def resolve_job_file(job_file: Path | None, example: bool, model: str | None, system: str | None) -> Path | None:
    """The job file to read: the given one, or the built-in example; fails if the job is underspecified."""
    if example:
        if job_file is not None:
            fail("give either a job file or --example, not both")
        return Path(str(resources.files("itercast").joinpath("examples", EXAMPLE)))
    if job_file is None and (model is None or system is None):
        fail("need a job file, --example, or both --model and --system")
    return job_file


# The job inputs every job-taking command accepts (predict, variability): one definition.
JobFileArg = Annotated[
    Path | None, typer.Argument(metavar="JOB.yaml", help="YAML job file with sections model, plan, system.")
]
ModelOpt = Annotated[str | None, typer.Option(metavar="NAME", help="Model preset (see `itercast presets`).")]
SystemOpt = Annotated[str | None, typer.Option(metavar="NAME", help="System preset (see `itercast presets`).")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", metavar="SECTION.FIELD=VALUE", help="Override a job field (repeatable)."),
]
ExampleOpt = Annotated[bool, typer.Option(metavar="", help=f"Use the built-in example job ({EXAMPLE}).")]
JsonOpt = Annotated[bool, typer.Option("--json", metavar="", help="Print a JSON object instead of a table.")]
BatchPerRankOpt = Annotated[int, typer.Option(min=1, max=10_000_000, help="DLRM: samples per GPU per step.")]
CalibrationOpt = Annotated[
    Path | None,
    typer.Option(metavar="FILE", help="Calibration file from `itercast calibrate` (else the built-in curves)."),
]


def finite(low: float = -math.inf, high: float = math.inf, above: bool = False):
    """A typer callback: the option's value must be a finite number in [low, high] (or above `low`
    when `above`); click's own ranges let NaN through, and inf past an upper bound not given."""

    def check(value: float | None) -> float | None:
        if value is None:
            return value
        if not math.isfinite(value) or value > high or value < low or (above and value == low):
            bound = f"> {low:g}" if above else f"≥ {low:g}" if math.isfinite(low) else ""
            upper = f" and ≤ {high:g}" if math.isfinite(high) else ""
            raise typer.BadParameter(f"expected a finite number {bound}{upper}; got {value}")
        return value

    return check


def echo_json(doc: object) -> None:
    """Print a JSON document, strict: a NaN or infinity (which JSON lacks) is an error, not `NaN`."""
    try:
        text = json.dumps(doc, indent=1, allow_nan=False)
    except ValueError as exc:
        fail(f"the result holds a number JSON cannot carry ({exc}); please report this with the input")
    typer.echo(text)


def sizes_option(text: str, option: str) -> tuple[int, ...]:
    """An option's comma-separated sizes, "512,4096" → (512, 4096), sorted and distinct; a
    ConfigError naming the option otherwise."""
    try:
        sizes = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise ConfigError(f"{option}: expected whole numbers separated by commas; got {text!r}") from None
    if not sizes or sizes[0] < 1 or sizes[-1] > 10_000_000:
        raise ConfigError(f"{option}: expected sizes in 1..10000000; got {text!r}")
    return sizes


def warn(message: str) -> None:
    """A warning on stderr (the answer on stdout stays parseable)."""
    Console(stderr=True, soft_wrap=True).print(f"[bold yellow]warning:[/] {message}", highlight=False)


def fail(message: str) -> NoReturn:
    """A user error: the message on stderr, exit code 2, no traceback."""
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(2)


@app.command("predict")
def predict_cmd(
    job_file: JobFileArg = None,
    model: ModelOpt = None,
    system: SystemOpt = None,
    set_: SetOpt = None,
    example: ExampleOpt = False,
    as_json: JsonOpt = False,
    trace: Annotated[
        Path | None, typer.Option(metavar="FILE", help="Write the predicted timeline as Chrome/Perfetto JSON.")
    ] = None,
    calibration: CalibrationOpt = None,
    strict: Annotated[
        bool, typer.Option(metavar="", help=f"Exit {EXIT_OOM} when the plan does not fit in memory.")
    ] = False,
    et: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="FILE|DIR",
            help="Price PyTorch execution traces (repeatable, or a directory: every rank) instead of a job.",
        ),
    ] = None,
    db: Annotated[
        Path | None, typer.Option(metavar="FILE", help="--et: the profiling database of the device to price on.")
    ] = None,
    device_id: Annotated[
        int | None, typer.Option(help="--et: device id in the database (default: the only one).")
    ] = None,
    gpu: Annotated[bool, typer.Option(metavar="", help="--et: price host and GPU on two clocks.")] = False,
    kineto: Annotated[
        list[Path] | None,
        typer.Option(metavar="FILE|DIR", help="--et: Kineto traces of the same step (one per rank), to check against."),
    ] = None,
    indices: Annotated[
        Path | None, typer.Option(metavar="FILE", help="--et: a sample of real embedding indices, in their order.")
    ] = None,
    index_distribution: Annotated[
        str,
        typer.Option(metavar="uniform|zipf:ALPHA", help="--et: how embedding-bag indices are drawn (row reuse)."),
    ] = "uniform",
    sharding: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="DLRM: the embedding sharding (`itercast shard`); else the planner's best."),
    ] = None,
    batch_per_rank: BatchPerRankOpt = 4096,
) -> None:
    """Time per iteration, its breakdown and critical path, memory per GPU and MFU; for a DLRM
    preset (--model), one step under an embedding sharding; or, with --et, one iteration of a
    recorded PyTorch execution trace priced on a profiled device."""
    if et:
        if job_file or example or model or set_ or trace:
            fail("--et prices a trace: give it with --db or --system, not with a job, --model or --trace")
        from itercast.cli.et_cmds import predict_et

        predict_et(et, db, device_id, gpu, index_distribution, kineto or [], as_json, system, calibration, indices)
        return
    if model is not None and model in preset_names("dlrm"):
        if job_file or example or trace:
            fail(
                f"--model {model} is a DLRM: give it with --system, --set system.FIELD=VALUE, --sharding, --calibration"
            )
        from itercast.cli.shard_cmds import predict_dlrm

        predict_dlrm(model, system or "dgx-h100", set_, calibration, sharding, batch_per_rank, as_json)
        return
    if sharding is not None:
        fail("--sharding is for a DLRM model (--model dlrm-…); this job is a transformer")
    job_file = resolve_job_file(job_file, example, model, system)
    try:
        job = Job.load(job_file, set_ or [], model=model, system=system)
        cal = load_calibration(calibration) if calibration else None
        result = predict(job, cal)
    except (ConfigError, DeadlockError, CalibrationError) as exc:
        fail(str(exc).replace("\n", "\n  "))
    if cal is not None and cal.get("system") not in (None, job.system.name):
        warn(
            f"{calibration} was fitted for system {cal['system']!r}; this job runs on {job.system.name!r} "
            f"({job.system.gpu.name}): the curves describe the other machine"
        )
    if trace is not None:
        try:
            write_chrome_trace(result.sim, trace, [job_file, calibration])
        except ConfigError as exc:
            fail(str(exc))
    if as_json:
        echo_json(result.to_dict())
    else:
        _print_prediction(result, trace)
    if result.memory.oom:
        mem = result.memory
        warn(
            f"the plan does not fit: {mem.total_bytes / 2**30:.1f} GiB per GPU on stage {mem.stage}, "
            f"{mem.capacity_bytes / 2**30:.0f} GiB available (`itercast search` finds plans that fit)"
        )
        if strict:
            raise typer.Exit(EXIT_OOM)


@app.command("compare")
def compare_cmd(
    job_a: Annotated[Path, typer.Argument(metavar="A", help="First YAML job file, or a saved search/replay JSON.")],
    job_b: Annotated[Path, typer.Argument(metavar="B", help="Second, of the same kind.")],
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Two jobs side by side: step time, throughput, memory, and the difference per breakdown part
    (`--set` applies to both); or two saved `search --json` results (their fastest plans) or two
    `replay --json` results."""
    from itercast.cli.report_cmds import result_figures

    try:
        if {job_a.suffix, job_b.suffix} == {".json"}:
            (kind_a, fig_a), (kind_b, fig_b) = result_figures(job_a), result_figures(job_b)
            if kind_a != kind_b:
                raise ConfigError(f"{job_a} is a {kind_a} result and {job_b} a {kind_b} result: compare like with like")
            rows = {k: (v, fig_b[k]) for k, v in fig_a.items() if k in fig_b}
        else:
            a, b = (predict(Job.load(path, set_ or [])) for path in (job_a, job_b))
            rows = {
                "step_time_s": (a.step_time_s, b.step_time_s),
                "tokens_per_s": (a.tokens_per_s, b.tokens_per_s),
                "mfu": (a.mfu, b.mfu),
                "memory_per_gpu_bytes": (a.memory.total_bytes, b.memory.total_bytes),
                **{
                    f"breakdown.{k}": (v, b.breakdown.as_dict()[k])
                    for k, v in a.breakdown.as_dict().items()
                    if k != "rank"
                },
            }
    except (ConfigError, DeadlockError) as exc:
        fail(str(exc).replace("\n", "\n  "))
    if as_json:
        echo_json({k: {"a": x, "b": y, "b_minus_a": y - x} for k, (x, y) in rows.items()})
        return
    table = Table(title=f"A = {job_a}, B = {job_b}")
    for col in ("", "A", "B", "B − A", "B / A"):
        table.add_column(col, justify="right")
    for key, (x, y) in rows.items():
        table.add_row(key, f"{x:,.4g}", f"{y:,.4g}", f"{y - x:+,.4g}", f"{y / x:.3f}" if x else "")
    console.print(table)


@app.command("fields")
def fields_cmd() -> None:
    """The canonical job fields, one a line: section.field, type, default, meaning (units in the names).
    Set them with `--set SECTION.FIELD=VALUE`, or as the same keys in a job file."""
    from pydantic import BaseModel

    from itercast.config.model import ModelConfig
    from itercast.config.plan import PlanConfig
    from itercast.config.system import SystemConfig

    def lines(prefix: str, schema: type[BaseModel]) -> list[str]:
        out = []
        for name, info in schema.model_fields.items():
            ann = info.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                out += lines(f"{prefix}.{name}", ann)
                continue
            kind = _type_name(ann)
            default = "required" if info.is_required() else repr(info.default)
            out.append(f"{prefix}.{name:<34} {kind:<44} {default:<12} {info.description or ''}".rstrip())
        return out

    for section, schema in (("model", ModelConfig), ("plan", PlanConfig), ("system", SystemConfig)):
        typer.echo("\n".join(lines(section, schema)))


def _type_name(ann: object) -> str:
    """A field's type as a user reads it: `int | None`, `tuple[int, ...]`, `'1f1b' | 'gpipe'` (the
    constraints of Annotated types are left to the error messages)."""
    import types
    import typing

    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else _type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    return "None" if ann is type(None) else getattr(ann, "__name__", str(ann))


presets_app = typer.Typer(help="Model and system presets: list them, or show one.", invoke_without_command=True)
app.add_typer(presets_app, name="presets")


@presets_app.callback()
def presets_cmd(ctx: typer.Context) -> None:
    """List the model and system presets (`itercast presets show NAME` for one)."""
    if ctx.invoked_subcommand is None:
        for section in ("model", "system", "dlrm"):
            console.print(f"[bold]{section}s:[/] " + ", ".join(preset_names(section)))


@presets_app.command("show")
def presets_show_cmd(name: Annotated[str, typer.Argument(help="A preset name (see `itercast presets`).")]) -> None:
    """Every field of a preset as written, with units in the field names and sources in the comments."""
    try:
        section, text = preset_source(name)
    except ConfigError as exc:
        fail(str(exc))
    console.print(
        f"# {section} preset; use it as `{section}: {name}` in a job file or --{section} {name}", markup=False
    )
    console.print(text, markup=False, highlight=False)


def _print_prediction(r: Prediction, trace: Path | None) -> None:
    job = r.job
    p = job.plan
    experts = f" (experts: ep {p.expert_parallel} × etp {p.etp})" if job.model.is_moe else ""
    gpus = job.stage_gpus()
    kinds = " + ".join(
        f"{job.system.num_gpus * sum(g == k for g in gpus) // len(gpus)}× {k.name}"
        for i, k in enumerate(gpus)
        if k not in gpus[:i]
    )
    console.print(
        f"[bold]{job.model.name}[/] on {kinds} "
        f"({job.system.name}, {job.system.num_nodes} nodes) — dp {p.dp} × tp {p.tensor_parallel} "
        f"× pp {p.pipeline_parallel} × cp {p.context_parallel}{experts}, {p.schedule}, "
        f"{job.num_microbatches} micro-batches",
        highlight=False,
    )
    head = Table(show_header=False, box=None)
    head.add_row("step time", f"{r.step_time_s:.3f} s")
    if job.system.device_groups:
        head.add_row("stages on", ", ".join(f"{s}: {g.name}" for s, g in enumerate(gpus)))
    head.add_row(
        "throughput", f"{r.tokens_per_s:,.0f} tokens/s, {r.model_tflops_per_gpu:.1f} TFLOP/s per GPU, MFU {r.mfu:.1%}"
    )
    if r.hardware_flops_per_step > r.model_flops_per_step:
        counted = r.hardware_flops_per_step / r.step_time_s / job.system.num_gpus / 1e12
        head.add_row(
            "", f"(model FLOPs only; counting the {p.recompute} recompute as papers often do: {counted:.1f} TFLOP/s)"
        )
    mem = r.memory
    head.add_row(
        "memory per GPU",
        f"{mem.total_bytes / 2**30:.1f} GiB of {mem.capacity_bytes / 2**30:.0f} GiB"
        + (" [bold red]OOM[/]" if mem.oom else "")
        + f" (stage {mem.stage})",
    )
    console.print(head)
    table = Table(title=f"breakdown (rank {r.breakdown.rank}, the last to finish)")
    table.add_column("part")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for key, value in r.breakdown.as_dict().items():
        if key != "rank":
            table.add_row(key.removesuffix("_s"), f"{value:.4f}", f"{value / r.step_time_s:.1%}")
    console.print(table)
    mt = Table(title="memory per GPU (GiB)")
    for key in ("weights", "gradients", "optimizer", "activations", "reserved"):
        mt.add_column(key, justify="right")
    mt.add_row(
        *(
            f"{getattr(mem, k + '_bytes') / 2**30:.2f}"
            for k in ("weights", "gradients", "optimizer", "activations", "reserved")
        )
    )
    console.print(mt)
    if trace is not None:
        console.print(f"timeline written to {trace} (open in ui.perfetto.dev)")


def main() -> None:  # pragma: no cover - console entry for `python -m itercast`
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


from itercast.cli import (  # noqa: E402,F401  (register the commands)
    calibration_cmds,
    replay_cmds,
    report_cmds,
    search_cmds,
    shard_cmds,
    slice_cmds,
    variability_cmds,
)
