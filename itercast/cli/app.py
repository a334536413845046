"""What every command shares: the app, its console, the job options, errors and output helpers."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib import metadata, resources
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer._click.exceptions import ClickException  # click as typer >= 0.29 vendors it
from typer.core import TyperGroup

from itercast.config.system import SystemConfig
from itercast.errors import ConfigError
from itercast.profile.calibrate import HOST_DEVICE_CPU, CalibrationError, load_calibration
from itercast.traces.collective_sizes import GPU_FAMILY
from itercast.workload import DLRMWorkload, TransformerWorkload, load_workload


class Group(TyperGroup):
    """A command group whose `-h/--help`, and its commands', shows no type (click's flag reads `<bool>`),
    and whose usage errors (an unknown option, a value out of range, a missing argument) are one line on
    stderr, exit 2, as the commands' own errors (`fail`): typer frames them in a five-line box."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        call = {"complete_var": complete_var, "windows_expand_args": windows_expand_args, **extra}
        if not standalone_mode:
            return super().main(args, prog_name, standalone_mode=False, **call)
        try:
            code = super().main(args, prog_name, standalone_mode=False, **call)
        except ClickException as exc:
            ctx = getattr(exc, "ctx", None)
            where = f"{ctx.command_path}: " if ctx is not None else ""
            hint = f" ({ctx.command_path} -h for help)" if ctx is not None else ""
            Console(stderr=True, soft_wrap=True).print(
                f"[bold red]error:[/] {escape(where + exc.format_message() + hint)}", highlight=False
            )
            sys.exit(exc.exit_code)
        except typer.Abort:
            typer.echo("Aborted.", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)  # a command's return value is not an exit code: 0

    def get_help_option(self, ctx: Any) -> Any:
        return _untyped(super().get_help_option(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _untyped(command.get_help_option(ctx))
        return command


def _untyped(option: Any) -> Any:
    """A help option shown without a type (an empty metavar)."""
    if option is not None:
        option.metavar = ""
    return option


app = typer.Typer(
    cls=Group,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # a help paragraph is one paragraph, not its source lines
    help="Forecast distributed deep-learning training before paying for the GPUs.",
)
#: stdout's width when it is no terminal (a pipe, a file): wide enough that no table column is cut to
#: `…` (a terminal keeps its own width, and rich wraps or folds what does not fit)
PIPE_WIDTH = 1_000
console = Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)
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
def working(message: str, quiet: bool = False) -> Iterator[Callable[[str], None]]:
    """A spinner on stderr while a long step runs (none with --json or when stderr is no terminal); yields a
    function that replaces its message, for work done in phases."""
    if quiet:
        yield lambda _: None
        return
    with Console(stderr=True).status(message) as status:
        yield status.update


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
    Path | None,
    typer.Argument(
        metavar="JOB.yaml",
        help="YAML job file with sections model, plan, system (a transformer, or a DLRM: `model: dlrm-small`).",
    ),
]
ModelOpt = Annotated[
    str | None, typer.Option(metavar="NAME", help="Model preset, a transformer or a DLRM (see `itercast presets`).")
]
SystemOpt = Annotated[str | None, typer.Option(metavar="NAME", help="System preset (see `itercast presets`).")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", metavar="SECTION.FIELD=VALUE", help="Override a job field (repeatable)."),
]
ExampleOpt = Annotated[bool, typer.Option(metavar="", help=f"Use the built-in example job ({EXAMPLE}).")]
JsonOpt = Annotated[bool, typer.Option("--json", metavar="", help="Print a JSON object instead of a table.")]
BatchPerRankOpt = Annotated[int, typer.Option(min=1, max=10_000_000, help="DLRM: samples per GPU per step.")]
FormatOpt = Annotated[
    str,
    typer.Option("--format", metavar="table|csv|json", help="Output: a table, CSV rows, or JSON (as --json)."),
]
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


def output_format(fmt: str, as_json: bool) -> str:
    """--format's value (--json stands for --format json); a wrong one is one error line."""
    if fmt not in ("table", "csv", "json"):
        fail(f"--format: expected table, csv or json; got {fmt!r}")
    if as_json and fmt == "csv":
        fail("--json and --format csv: give one (--json is --format json)")
    return "json" if as_json else fmt


def show_table(headers: list[str], rows: list[list[str]], fmt: str, title: str | None = None) -> None:
    """Rows as a table (first column left, the others right; off a terminal never cut, module
    PIPE_WIDTH) or, with fmt "csv", as CSV lines with a header."""
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(headers)
        writer.writerows([[_plain(cell) for cell in row] for row in rows])
        typer.echo(buffer.getvalue(), nl=False)
        return
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for i, name in enumerate(headers):
        table.add_column(name, justify="left" if i == 0 else "right", overflow="fold")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def _plain(cell: str) -> str:
    """A table cell as a CSV reader parses it: `183,127` → `183127` (no thousands separators)."""
    return cell.replace(",", "") if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?", cell) else cell


def warn(message: str) -> None:
    """A warning on stderr (the answer on stdout stays parseable)."""
    Console(stderr=True, soft_wrap=True).print(f"[bold yellow]warning:[/] {escape(message)}", highlight=False)


def fail(message: str) -> NoReturn:
    """A user error: the message on stderr, exit code 2, no traceback; printed as written (escaped: a `[@RANKS]` or a
    file named `[x].yaml` is no markup)."""
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(2)


def refuse_options(options: Mapping[str, object], reason: str) -> None:
    """One error line naming every option of `options` (flag → value) that was given (a true value),
    for options the command's mode does not use: `reason` says whose they are."""
    if given := [flag for flag, value in options.items() if value]:
        fail(f"{', '.join(given)}: {reason}")


def calibration_curves(path: Path | None, system: SystemConfig) -> dict[str, Any] | None:
    """--calibration: the file's curves (None: the built-in ones); a file that does not load is one error line
    and exit 2; a warning when it was fitted for another system than the job's."""
    if path is None:
        return None
    try:
        cal = load_calibration(path)
    except CalibrationError as exc:
        fail(str(exc))
    warn_other_system(path, cal, system)
    return cal


def warn_other_system(path: Path, cal: dict[str, Any], system: SystemConfig) -> None:
    """A warning when the calibration at `path` was fitted for another system than the job's, and one when its host
    overheads were measured on traces of another kind of GPU, or of none (`host_device`, calibrate --host-trace):
    a CPU run's operators take milliseconds of host where a GPU's launch them in microseconds."""
    if cal.get("system") not in (None, system.name):
        warn(
            f"{path} was fitted for system {cal['system']!r}; this job runs on {system.name!r} "
            f"({system.gpu.name}): the curves describe the other machine"
        )
    host = cal.get("host_device")
    if host is not None and not same_gpu_kind(str(host), system):
        ran = "traces that ran no GPU" if host == HOST_DEVICE_CPU else f"traces of {host}"
        warn(
            f"{path}'s host overheads were measured on {ran}; this job runs on {system.gpu.name}: "
            "its per-operator host costs are the other machine's"
        )


def same_gpu_kind(device: str, system: SystemConfig) -> bool:
    """Whether `device` (a GPU's name, or calibrate's HOST_DEVICE_CPU) is the kind of the system's GPU: its family
    (A100 of 'NVIDIA A100-SXM4-80GB', collective_sizes.GPU_FAMILY) in the system's GPU name, or both a CPU."""
    if device == HOST_DEVICE_CPU:
        return system.gpu.executes_on_host
    families = GPU_FAMILY.findall(device)
    return bool(families) and all(f in system.gpu.name for f in families)


def load_job(
    job_file: Path | None, example: bool, model: str | None, system: str | None, overrides: list[str] | None
) -> TransformerWorkload | DLRMWorkload:
    """The workload of a job file, --example or presets with `--set` overrides (a transformer or a
    DLRM, as its model section says); a problem is one error line and exit 2."""
    path = resolve_job_file(job_file, example, model, system)
    try:
        return load_workload(path, overrides or [], model, system)
    except ConfigError as exc:
        fail(str(exc).replace("\n", "\n  "))
