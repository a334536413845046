"""`itercast predict` and `itercast compare`: one job's step, or two side by side, of any workload."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from itercast.checked_runs import checked_note, checked_runs_json
from itercast.cli.app import (
    EXIT_OOM,
    CalibrationOpt,
    ExampleOpt,
    FormatOpt,
    JobFileArg,
    JsonOpt,
    ModelOpt,
    SetOpt,
    SystemOpt,
    app,
    calibration_curves,
    console,
    echo_json,
    fail,
    load_job,
    output_format,
    refuse_options,
    resolve_job_file,
    show_table,
    warn,
)
from itercast.costs.host_overheads import host_calibrated
from itercast.errors import ConfigError, DeadlockError
from itercast.predict import Forecast, Prediction
from itercast.traces.perfetto import write_chrome_trace
from itercast.workload import (
    DLRMWorkload,
    TransformerWorkload,
    compare_figures,
    load_workload,
    oom_note,
    same_kind,
)

MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "reserved")


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
    measured_starts: Annotated[
        bool,
        typer.Option(
            metavar="",
            help="--et --system --kineto: start each rank at its measured start (its step start against its "
            "first rendezvous in the Kineto traces), not all at 0.",
        ),
    ] = False,
) -> None:
    """Time per iteration, its breakdown and critical path, memory per GPU and throughput of any job (a
    transformer, or a DLRM under its plan's sharding, else the sharding planner's fastest); or, with
    --et, one iteration of a recorded PyTorch execution trace priced on a profiled device."""
    if et:
        if job_file or example or model or set_ or trace:
            fail("--et prices a trace: give it with --db or --system, not with a job, --model or --trace")
        from itercast.cli.et_cmds import predict_et

        predict_et(
            et,
            db,
            device_id,
            gpu,
            index_distribution,
            kineto or [],
            as_json,
            system,
            calibration,
            indices,
            measured_starts=measured_starts,
        )
        return
    et_only = {"--db": db, "--kineto": kineto, "--indices": indices, "--gpu": gpu, "--measured-starts": measured_starts}
    et_only |= {"--device-id": device_id is not None, "--index-distribution": index_distribution != "uniform"}
    refuse_options(et_only, "for an execution trace (--et); a job is priced without them")
    w = load_job(job_file, example, model, system, set_)
    cal = calibration_curves(calibration, w.job.system)
    try:
        result = w.predict(cal)
        if trace is not None:
            write_chrome_trace(result.sim, trace, [resolve_job_file(job_file, example, model, system), calibration])
    except (ConfigError, DeadlockError, ValueError) as exc:  # ValueError: no sharding fits
        fail(str(exc).replace("\n", "\n  "))
    # what its prices rest on, said once they stand; a transformer's the published runs of its model too
    checked = checked_note(w.job) if isinstance(w, TransformerWorkload) else None
    said = [*w.notes(cal, result), *([checked] if checked else [])]
    for note in (*said, *result.extrapolated):  # DLRM's as `shard` says them
        warn(note)
    if as_json:
        doc = result.to_dict()
        doc["notes"] = said  # what its prices leave out, as warned (the extrapolated ones under their own key)
        if isinstance(w, TransformerWorkload):  # the published runs of its model the note above summed up
            doc["checked_runs"] = checked_runs_json(w.job)
        echo_json(doc)
    else:
        print_forecast(w, result, trace)
        if isinstance(w, TransformerWorkload) and cal is not None and "host_overheads" in cal:
            host_s = host_calibrated(w.job.system, cal).gpu.kernel_launch_overhead_s
            console.print(
                f"host per kernel: {host_s * 1e6:.1f} µs from {calibration}'s host overheads (T1 + T2 + T4 + T3 "
                f"per launching operator; the preset's {w.job.system.gpu.kernel_launch_overhead_s * 1e6:.1f} µs)",
                highlight=False,
                markup=False,
            )
    if result.memory.oom:
        warn(oom_note(result.memory))
        if strict:
            raise typer.Exit(EXIT_OOM)


def different_jobs_note(a: dict[str, str], b: dict[str, str]) -> str | None:
    """What `compare` says when A and B name different models or systems (`{"model": …, "system": …}`; a
    saved result that names neither, as results saved before they did, is not checked): B − A is then two
    jobs' difference, not one plan's."""
    pairs = [(f"{key}s", a[key], b[key]) for key in ("model", "system") if key in a and key in b]
    if differ := [f"{what} {x} and {y}" for what, x, y in pairs if x != y]:
        return f"A and B are different {' and '.join(differ)}: B − A is two jobs' difference, not one plan's"
    return None


#: stage compute times further apart than this ratio are said beside the breakdown (print_forecast)
UNEVEN_STAGES = 1.05


#: the families `predict` names on the critical path, longest first (all of them are in --json's critical_path)
CRITICAL_FAMILIES = 5


def critical_path_line(r: Forecast, scale: float, unit: str) -> str:
    """One line of the step's critical path (predict.summarise_path's runs): its tasks' time by family, the
    CRITICAL_FAMILIES longest, and the ranks it runs through, in order."""
    by_family: dict[str, float] = {}
    for run in r.critical_path:
        by_family[run["family"]] = by_family.get(run["family"], 0.0) + run["end_s"] - run["start_s"]
    top = sorted(by_family.items(), key=lambda kv: -kv[1])[:CRITICAL_FAMILIES]
    ranks = [run["rank"] for run in r.critical_path]
    through = [rank for i, rank in enumerate(ranks) if i == 0 or ranks[i - 1] != rank]
    shown = " → ".join(str(x) for x in through[:8]) + (" → …" if len(through) > 8 else "")
    families = ", ".join(f"{name} {seconds * scale:.4g}" for name, seconds in top)
    return f"critical path ({unit} of its tasks by family, longest first): {families}; through rank {shown}"


def print_forecast(w: TransformerWorkload | DLRMWorkload, r: Forecast, trace: Path | None) -> None:
    """The headline, the summary, the breakdown of the rank that finishes last, its critical path and memory per
    GPU."""
    console.print(w.headline(), highlight=False, markup=False)
    head = Table(show_header=False, box=None)
    for name, value in w.summary_rows(r):
        head.add_row(name, value)
    console.print(head)
    scale, unit = (1.0, "seconds") if r.step_time_s >= 1 else (1e3, "ms")
    table = Table(title=f"breakdown (rank {r.breakdown.rank}, the last to finish)")
    table.add_column("part")
    table.add_column(unit, justify="right")
    table.add_column("share", justify="right")
    for key, part_s in r.breakdown.as_dict().items():
        if key != "rank":
            table.add_row(
                key.removesuffix("_s"), f"{float(part_s) * scale:.4f}", f"{float(part_s) / r.step_time_s:.1%}"
            )
    console.print(table)
    if isinstance(r, Prediction) and len(stages := r.stage_compute_s) > 1 and max(stages) > UNEVEN_STAGES * min(stages):
        each = ", ".join(f"{i}: {t * scale:.4g}" for i, t in enumerate(stages))
        console.print(
            f"stage compute ({unit}): {each}, {max(stages) / min(stages):.2f}× apart: the bubble above holds the waits "
            "for the slowest stage beside the pipeline's fill and drain (`itercast slice` balances the stages)",
            highlight=False,
        )
    console.print(critical_path_line(r, scale, unit), highlight=False, markup=False)
    parts = [float(getattr(r.memory, k + "_bytes")) for k in MEMORY_PARTS]
    # in MiB where a part would read 0.00 GiB though it is not zero (a DLRM's gradients and activations)
    unit, scale_b = ("MiB", 2**20) if any(0 < b < 0.005 * 2**30 for b in parts) else ("GiB", 2**30)
    mt = Table(title=f"memory per GPU ({unit})")
    for key in MEMORY_PARTS:
        mt.add_column(key, justify="right")
    mt.add_row(*(f"{b / scale_b:,.2f}" for b in parts))
    console.print(mt)
    if trace is not None:
        console.print(f"timeline written to {trace} (open in ui.perfetto.dev)")


@app.command("compare")
def compare_cmd(
    job_a: Annotated[Path, typer.Argument(metavar="A", help="First YAML job file, or a saved search/replay JSON.")],
    job_b: Annotated[Path, typer.Argument(metavar="B", help="Second, of the same kind.")],
    set_: SetOpt = None,
    as_json: JsonOpt = False,
    fmt: FormatOpt = "table",
    calibration: CalibrationOpt = None,
) -> None:
    """Two jobs of one workload side by side: step time, throughput, memory, and the difference per
    breakdown part (`--set` and `--calibration` apply to both); or two saved `search --json` results
    (their fastest plans) or two `replay --json` results."""
    from itercast.cli.report_cmds import result_figures, work_per_step

    fmt = output_format(fmt, as_json)
    fits: dict[str, bool] = {}  # two jobs: whether each fits its GPUs' memory (saved results say it themselves)
    try:
        if {job_a.suffix, job_b.suffix} == {".json"}:
            if calibration is not None or set_:
                option = "--calibration" if calibration is not None else "--set"
                raise ConfigError(
                    f"{option} applies to two jobs; saved results carry the plans and prices they were made with"
                )
            (kind_a, fig_a, id_a), (kind_b, fig_b, id_b) = result_figures(job_a), result_figures(job_b)
            if kind_a != kind_b:
                raise ConfigError(f"{job_a} is a {kind_a} result and {job_b} a {kind_b} result: compare like with like")
            if note := different_jobs_note(id_a, id_b):
                warn(note)
            work_a, work_b = work_per_step(fig_a), work_per_step(fig_b)
            if work_a and work_b and abs(work_b[0] / work_a[0] - 1) > 1e-3:
                warn(
                    f"A trains {work_a[0]:,.0f} {work_a[1]} a step and B {work_b[0]:,.0f}: their steps are not the "
                    "same work, so compare their throughput, not their step times"
                )
        else:
            a, b = (load_workload(path, set_ or []) for path in (job_a, job_b))
            same_kind(a, b, f"{job_a} and {job_b}")
            ids = [{"model": w.name, "system": w.job.system.name} for w in (a, b)]
            if note := different_jobs_note(*ids):
                warn(note)
            cal_a, cal_b = (calibration_curves(calibration, w.job.system) for w in (a, b))
            res_a, res_b = a.predict(cal_a), b.predict(cal_b)
            fig_a, fig_b = compare_figures(a, res_a), compare_figures(b, res_b)
            fits = {"a": not res_a.memory.oom, "b": not res_b.memory.oom}
            for name, path, r in (("A", job_a, res_a), ("B", job_b, res_b)):
                if r.memory.oom:
                    warn(oom_note(r.memory, f"{name} ({path})"))
            notes_a, notes_b = ([*w.notes(c, r), *r.extrapolated] for w, c, r in ((a, cal_a, res_a), (b, cal_b, res_b)))
            for note in dict.fromkeys([*notes_a, *notes_b]):  # each once, with the jobs it holds for
                held = [name for name, notes in (("A", notes_a), ("B", notes_b)) if note in notes]
                warn(f"{note} ({' and '.join(held)})")
        rows = {k: (v, fig_b[k]) for k, v in fig_a.items() if k in fig_b}
    except (ConfigError, DeadlockError, ValueError) as exc:
        fail(str(exc).replace("\n", "\n  "))
    if fmt == "json":
        doc: dict[str, Any] = {k: {"a": x, "b": y, "b_minus_a": y - x} for k, (x, y) in rows.items()}
        echo_json(doc | ({"fits_in_memory": fits} if fits else {}))
        return
    cells = [
        [key, f"{x:,.4g}", f"{y:,.4g}", f"{y - x:+,.4g}", f"{y / x:.3f}" if x else ""] for key, (x, y) in rows.items()
    ]
    show_table(["", "A", "B", "B − A", "B / A"], cells, fmt, f"A = {job_a}, B = {job_b}")
