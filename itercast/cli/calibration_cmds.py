"""`itercast profile run|import` and `itercast calibrate`: measurements and calibrated curves."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from itercast.cli import app, console, fail
from itercast.config.job import load_system
from itercast.costs.calibrate import CalibrationError
from itercast.errors import ConfigError

profile_app = typer.Typer(no_args_is_help=True, help="Measure kernels on this device, or import outside measurements.")
app.add_typer(profile_app, name="profile")
IMPORTERS = ("alpa", "nccl-tidy", "nccl-log", "xla-matmul")


@profile_app.command("run")
def profile_run_cmd(
    db: Annotated[Path, typer.Option(help="Profiling database (SQLite; created if missing).")],
    device: Annotated[str, typer.Option(help="torch device: cpu or cuda.")] = "cpu",
    quick: Annotated[bool, typer.Option(help="A small grid (seconds) instead of the full one.")] = False,
    families: Annotated[
        str,
        typer.Option(help="Comma-separated: gemm, conv, attention, norm, elementwise, embedding, host, collective."),
    ] = "gemm,conv,attention,norm,elementwise,embedding,host,collective",
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs per configuration.")] = 10,
) -> None:
    """Microbenchmark the local device into DB (resumes where a previous run stopped)."""
    from itercast.profile.db import ProfileDB, ProfileError
    from itercast.profile.microbench import run

    try:
        counts = run(ProfileDB(db), device, quick, tuple(f.strip() for f in families.split(",")), repeats=repeats)
    except ProfileError as exc:
        fail(str(exc))
    console.print(f"{db}: {counts['measured']} configurations measured, {counts['already there']} already there")


@profile_app.command("import")
def profile_import_cmd(
    kind: Annotated[str, typer.Argument(help=f"One of: {', '.join(IMPORTERS)}.")],
    file: Annotated[Path, typer.Argument(help="The file to import.")],
    db: Annotated[Path, typer.Option(help="Profiling database (SQLite; created if missing).")],
    collective: Annotated[str, typer.Option(help="nccl-log: which collective the log measured.")] = "all_reduce",
    nodes: Annotated[int, typer.Option(min=1, help="nccl-log: nodes the run spanned.")] = 1,
    device_name: Annotated[str, typer.Option(help="nccl-log: a name for the machine.")] = "nccl-tests",
) -> None:
    """Import outside measurements (Alpa's database, nccl-tests, OpenXLA tables) into DB."""
    from itercast.profile import importers
    from itercast.profile.db import ProfileDB, ProfileError

    if kind not in IMPORTERS:
        fail(f"import kind {kind!r}: expected one of {', '.join(IMPORTERS)}")
    try:
        target = ProfileDB(db)
        if kind == "nccl-log":
            counts = importers.import_nccl_log(target, file, collective, nodes, device_name)
        else:
            counts = {
                "alpa": importers.import_alpa,
                "nccl-tidy": importers.import_nccl_tidy,
                "xla-matmul": importers.import_xla_matmul,
            }[kind](target, file)
    except ProfileError as exc:
        fail(str(exc))
    console.print(f"{db}: " + "; ".join(f"{k}: {v}" for k, v in counts.items()), highlight=False)


@app.command("calibrate")
def calibrate_cmd(
    db: Annotated[Path, typer.Argument(help="Profiling database (from `itercast profile`).")],
    system: Annotated[str, typer.Option(help="System preset the measurements were taken on (its peaks).")],
    out: Annotated[Path | None, typer.Option(help="Write the calibration file here.")] = None,
    device: Annotated[int | None, typer.Option(help="Device id in the database (default: the only one).")] = None,
    report: Annotated[
        bool, typer.Option(help="Print held-out errors: calibrated vs analytic vs straight line.")
    ] = False,
) -> None:
    """Refit the cost model's curves on a profiling database; check them on held-out rows."""
    from itercast.costs import calibrate as cal
    from itercast.costs.op_model import operator_report
    from itercast.profile.db import ProfileDB, ProfileError

    try:
        target, sys_cfg = ProfileDB(db), load_system(system)
        ids = [i for i, _, _ in target.devices()]
        if device is None and len(ids) != 1:
            raise CalibrationError(f"{db}: {len(ids)} devices; choose one with --device ({ids})")
        dev = device if device is not None else ids[0]
        if dev not in ids:
            raise CalibrationError(f"{db}: no device {dev} (have {ids})")
        if out is not None:
            doc = cal.calibrate(target, dev, sys_cfg)
            cal.write_calibration(doc, out)
            console.print(
                f"wrote {out}: " + ", ".join(k for k in doc if k not in ("format", "version", "system", "device"))
            )
        if report:
            _print_calibration_report(cal.report(target, dev, sys_cfg))
            operators = operator_report(list(target.measurements(device_id=dev)))
            if operators:
                _print_operator_report(operators)
    except (ProfileError, CalibrationError, ConfigError) as exc:
        fail(str(exc))


def _print_calibration_report(rows: list[dict]) -> None:
    table = Table(title="held-out geomean |error| (5-fold); in brackets: the smallest quarter of sizes")
    for col in ("family", "key", "rows", "calibrated", "analytic", "straight line"):
        table.add_column(col, justify="right" if col not in ("family", "key") else "left")
    for r in rows:
        cells = [f"{r[m]:.1%} ({r[m + '_smallest_quarter']:.1%})" for m in ("calibrated", "analytic", "straight_line")]
        table.add_row(r["family"], r["key"], str(r["rows"]), *cells)
    console.print(table)


def _print_operator_report(rows: list[dict]) -> None:
    table = Table(title="operator models, held-out geomean |error| (5-fold); in brackets: the smallest quarter")
    for col in ("operator", "rows", "operator model", "size-only curve", "straight line"):
        table.add_column(col, justify="left" if col == "operator" else "right", no_wrap=col == "operator")
    for r in rows:
        cells = [f"{r[m]:.1%} ({r[m + '_smallest_quarter']:.1%})" for m in ("model", "size_curve", "straight_line")]
        name, family = r["operator"].removeprefix("aten::").rsplit(":", 1)
        table.add_row(name if family in ("gemm", "memory") else f"{name} ({family})", str(r["rows"]), *cells)
    console.print(table)
