"""`itercast profile run|import` and `itercast calibrate`: measurements and calibrated curves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from itercast.cli.app import Group, app, console, fail, sizes_option, warn
from itercast.config.job import load_system
from itercast.errors import ConfigError
from itercast.profile.calibrate import CalibrationError
from itercast.profile.microbench import FLUSH_BYTES
from itercast.traces.host_overheads import HostOverheads
from itercast.user_files import check_output

if TYPE_CHECKING:
    from itercast.config.system import SystemConfig
    from itercast.profile.db import ProfileDB

profile_app = typer.Typer(
    cls=Group,
    no_args_is_help=True,
    rich_markup_mode="markdown",
    help="Measure kernels on this device, or import outside measurements.",
)
app.add_typer(profile_app, name="profile")
IMPORTERS = ("alpa", "nccl-tidy", "nccl-log", "xla-matmul", "xla-collective")
HOST_KINDS = (  # (field, type, where) of the per-operator host overheads
    ("t2_us", "T2", "operator start to its first runtime call"),
    ("t3_us", "T3", "last runtime call to operator end"),
    ("t5_us", "T5", "between runtime calls of one operator"),
    ("no_call_us", "T5", "operator without runtime calls (whole)"),
)


@profile_app.command("run")
def profile_run_cmd(
    db: Annotated[Path, typer.Option(metavar="FILE", help="Profiling database (SQLite; created if missing).")],
    device: Annotated[str, typer.Option(help="torch device: cpu or cuda.")] = "cpu",
    quick: Annotated[bool, typer.Option(metavar="", help="A small grid (seconds) instead of the full one.")] = False,
    families: Annotated[
        str,
        typer.Option(help="Comma-separated: gemm, conv, attention, norm, elementwise, embedding, host, collective."),
    ] = "gemm,conv,attention,norm,elementwise,embedding,host,collective",
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs per configuration.")] = 10,
    passes: Annotated[
        int, typer.Option(min=1, help="Measure the grid this many times, each pass shuffled; read as their median.")
    ] = 1,
    threads: Annotated[
        int | None,
        typer.Option(min=1, max=1024, help="CPU threads per operator (default: torch's); 1 for one rank per core."),
    ] = None,
    embedding_batches: Annotated[
        str | None,
        typer.Option(
            metavar="N,N,…",
            help="Bags per embedding call (default: 512 and 4096 on a CPU, 512 and 8192 on a GPU); cover the "
            "largest shard's pooling × samples.",
        ),
    ] = None,
    embedding_dims: Annotated[
        str | None,
        typer.Option(
            metavar="N,N,…",
            help="Embedding widths (default: 32 and 128 on a CPU); cover the widths of the tables you will price.",
        ),
    ] = None,
    flush_mib: Annotated[
        int,
        typer.Option(
            min=0,
            max=4096,
            help="MiB written before each timed run (cold caches). Default: a GPU's L2 or a CPU's last-level "
            "cache whole; another size is part of the device's fingerprint.",
        ),
    ] = FLUSH_BYTES >> 20,
    collective_ranks: Annotated[
        str | None,
        typer.Option(
            metavar="N,N,…",
            help="Group sizes of the collective benchmarks (default: 2); more ranks than cores measures the "
            "host oversubscribed, as such a run uses it.",
        ),
    ] = None,
) -> None:
    """Microbenchmark the local device into DB (resumes where a previous run stopped)."""
    from itercast.measurements import ProfileError
    from itercast.profile.db import ProfileDB
    from itercast.profile.microbench import check_device, run

    created = not db.exists()
    target = None
    try:
        chosen = tuple(f.strip() for f in families.split(","))
        batches = sizes_option(embedding_batches, "--embedding-batches") if embedding_batches else None
        dims = sizes_option(embedding_dims, "--embedding-dims") if embedding_dims else None
        ranks = sizes_option(collective_ranks, "--collective-ranks") if collective_ranks else None
        if ranks and ranks[0] < 2:
            raise ConfigError(f"--collective-ranks: expected groups of 2 or more ranks; got {collective_ranks!r}")
        check_device(device)  # before the database is created
        target = ProfileDB(db)
        counts = run(
            target,
            device,
            quick,
            chosen,
            repeats=repeats,
            passes=passes,
            threads=threads,
            embedding_batches=batches,
            embedding_dims=dims,
            collective_ranks=ranks,
            flush_bytes=flush_mib << 20,
        )
    except (ProfileError, ConfigError) as exc:
        _forget_new_database(db, created, target)
        fail(str(exc))
    console.print(f"{db}: {counts['measured']} configurations measured, {counts['already there']} already there")


@profile_app.command("import")
def profile_import_cmd(
    kind: Annotated[str, typer.Argument(help=f"One of: {', '.join(IMPORTERS)}.")],
    file: Annotated[Path, typer.Argument(metavar="FILE", help="The file to import.")],
    db: Annotated[Path, typer.Option(metavar="FILE", help="Profiling database (SQLite; created if missing).")],
    collective: Annotated[str, typer.Option(help="nccl-log: which collective the log measured.")] = "all_reduce",
    nodes: Annotated[int, typer.Option(min=1, help="nccl-log: nodes the run spanned.")] = 1,
    device_name: Annotated[str, typer.Option(help="nccl-log: a name for the machine.")] = "nccl-tests",
) -> None:
    """Import outside measurements (Alpa's database, nccl-tests, OpenXLA tables) into DB."""
    from itercast.measurements import ProfileError
    from itercast.profile import importers
    from itercast.profile.db import ProfileDB

    if kind not in IMPORTERS:
        fail(f"import kind {kind!r}: expected one of {', '.join(IMPORTERS)}")
    created = not db.exists()
    target = None
    try:
        check_output(db, [file])
        target = ProfileDB(db)
        if kind == "nccl-log":
            counts = importers.import_nccl_log(target, file, collective, nodes, device_name)
        else:
            counts = {
                "alpa": importers.import_alpa,
                "nccl-tidy": importers.import_nccl_tidy,
                "xla-matmul": importers.import_xla_matmul,
                "xla-collective": importers.import_xla_collectives,
            }[kind](target, file)
    except ConfigError as exc:  # the database path: a link, a missing directory, the file imported
        fail(str(exc))
    except ProfileError as exc:
        _forget_new_database(db, created, target)
        fail(str(exc))
    console.print(f"{db}: " + "; ".join(f"{k}: {v}" for k, v in counts.items()), highlight=False)


def _forget_new_database(db: Path, created: bool, target: Any) -> None:
    """After a failed run or import: a database it created holds nothing of use, so none is left behind
    (closed first); one that existed keeps what it held."""
    if target is not None:
        target.close()
    if created:
        for leftover in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
            leftover.unlink(missing_ok=True)


@app.command("calibrate")
def calibrate_cmd(
    db: Annotated[
        Path | None, typer.Argument(metavar="FILE", help="Profiling database (from `itercast profile`).")
    ] = None,
    system: Annotated[
        str | None, typer.Option(help="System preset the database's measurements were taken on (its peaks).")
    ] = None,
    out: Annotated[Path | None, typer.Option(metavar="FILE", help="Write the calibration file here.")] = None,
    device: Annotated[int | None, typer.Option(help="Device id in the database (default: the only one).")] = None,
    report: Annotated[
        bool, typer.Option(metavar="", help="Print held-out errors: calibrated vs analytic vs straight line.")
    ] = False,
    host_trace: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="FILE", help="Kineto trace (file or directory) to measure host overheads T1–T5 from (repeatable)."
        ),
    ] = None,
    host_steps: Annotated[
        str | None, typer.Option(help="Only these ProfilerStep numbers of the host traces, e.g. 3,4,5.")
    ] = None,
    for_another_workload: Annotated[
        bool,
        typer.Option(
            metavar="",
            help="Host overheads to price ANOTHER workload than the traces' (the reference's overheads from other "
            "workloads): T1 from gaps under 200 µs without Tukey's outliers, an operator that launches nothing at "
            "its name's or category's median duration. Default: to price the same software (means over all gaps).",
        ),
    ] = False,
) -> None:
    """Refit the cost model's curves on a profiling database and/or measure host overheads from
    traces; write them as one calibration file; check the curves on held-out rows. Host traces may
    come from different runs and world sizes: the overheads are measured trace by trace
    (traces/host_overheads.py)."""
    from itercast.costs.op_model import operator_report
    from itercast.measurements import ProfileError
    from itercast.profile import calibrate as cal
    from itercast.profile.db import ProfileDB
    from itercast.traces.host_overheads import HostOverheadError, measure
    from itercast.traces.kineto import TraceError, read_traces

    try:
        steps = {int(x) for x in host_steps.split(",")} if host_steps else None
    except ValueError:
        fail(f"--host-steps: expected comma-separated step numbers, got {host_steps!r}")
    if for_another_workload and not host_trace:
        fail("--for-another-workload: expected --host-trace FILE beside it (it chooses how to measure them), got none")
    try:
        if db is None and not host_trace:
            raise CalibrationError("give a profiling database, or --host-trace, or both")
        if db is not None and not db.is_file():  # said first: a missing file is the first thing to fix
            raise CalibrationError(f"{db}: no such profiling database")
        if db is not None and out is None and not report and not host_trace:
            raise CalibrationError(f"{db}: nothing to do; give --out FILE (the calibration) or --report (its fit)")
        doc: dict = {}
        notes: list[str] = []  # what the database's fit leaves built-in or misses (cal.fit_notes)
        if db is not None:
            target = ProfileDB(db, readonly=True)
            if system is None:
                raise CalibrationError(
                    f"{db}: --system is required with a profiling database (the machine it measured)"
                )
            sys_cfg = load_system(system)
            dev = target.choose_device(device)
            if note := measured_elsewhere_note(db, target, dev, sys_cfg):
                warn(note)
            doc = cal.calibrate(target, dev, sys_cfg) if out is not None else {}
            if bad := cal.unusable_fits(doc):
                raise CalibrationError(
                    f"{db}: " + "; ".join(bad) + ": not one kernel's times (a unit slip or corrupt rows?); "
                    "nothing written"
                )
            notes = cal.fit_notes(target, dev, doc) if out is not None else []
            if report:
                _print_calibration_report(cal.report(target, dev, sys_cfg))
                operators = operator_report(list(target.measurements(device_id=dev)))
                if operators:
                    _print_operator_report(operators)
        if host_trace:
            traces = read_traces(list(host_trace), one_job=False)
            overheads = measure(traces, steps, other_workloads=for_another_workload)
            _print_host_overheads(overheads)
            gpus = sorted({t.device_name for t in traces if t.device_name})
            doc = doc | cal.host_overheads_only(overheads, " and ".join(gpus) or cal.HOST_DEVICE_CPU)
        if out is not None:
            written = [k for k in doc if k not in ("format", "version", "system", "device", "host_device")]
            if not written:  # a file that changes nothing would read as a calibration
                for note in notes:
                    warn(note)
                raise CalibrationError(
                    f"{db}: nothing to calibrate (no family with {cal.MIN_ROWS} rows or more, no operator model); "
                    "nothing written"
                )
            cal.write_calibration(doc, out, [db, *(host_trace or [])])
            console.print(f"wrote {out}: " + ", ".join(written))
            for note in notes:
                warn(note)
    except (ProfileError, CalibrationError, ConfigError, TraceError, HostOverheadError) as exc:
        fail(str(exc))


def measured_elsewhere_note(db: Path, target: ProfileDB, device: int, system: SystemConfig) -> str | None:
    """A warning when the database's device is not the system's GPU: a profile of this machine by its fingerprint
    (et_ranks.other_device_note), an imported one (nccl-tests logs, Alpa's table) by whether its name or its
    fingerprint names the system's GPU family (H100 of H100-SXM5-80GB); None when they agree, or where the device
    says neither (a synthetic one, no `device` or `source` in its fingerprint). Its measurements are
    fitted to the system's model all the same: curves of another GPU's or another network's speed."""
    from itercast.cli.et_ranks import other_device_note

    name, fingerprint = next((n, f) for i, n, f in target.devices() if i == device)
    if "device" in fingerprint:
        return other_device_note(db, fingerprint, system)
    family = system.gpu.name.split("-")[0].lower()
    if "source" not in fingerprint or family in f"{name} {json.dumps(fingerprint)}".lower():
        return None
    return (
        f"{db}: device {device} ({name!r}) does not name {system.gpu.name}, the GPU of {system.name!r}: its "
        "measurements are fitted to that system's model as if measured on it; check they were, or give the "
        "system that ran them (--system)"
    )


def _print_host_overheads(o: HostOverheads) -> None:
    table = Table(
        title="host overheads T1–T5 (µs: T1, T4 means; T2, T3, T5 medians over all operators, per name in the file)"
    )
    for col in ("type", "where", "µs", "samples"):
        table.add_column(col, justify="right" if col in ("µs", "samples") else "left")
    table.add_row("T1", "between two operators", f"{o.t1_us:.1f}", str(o.samples.get("t1", "")))
    for kind, label, where in HOST_KINDS:
        table.add_row(label, where, f"{o.pooled[kind]:.1f}", str(o.samples.get(kind.removesuffix("_us"), "")))
    for category, us in sorted(o.no_call_by_category.items()):
        table.add_row("T5", f"operator without runtime calls, {category} (median)", f"{us:.1f}", "")
    for name, us in sorted(o.t4_us.items(), key=lambda kv: -kv[1])[:8]:
        table.add_row("T4", name, f"{us:.1f}", "")
    console.print(table)


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
