"""Command line: `itercast predict | replay | variability | profile run|import | calibrate | presets`."""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from itercast.config.job import Job, load_system
from itercast.config.presets import preset_names
from itercast.costs.calibrate import CalibrationError, load_calibration
from itercast.errors import ConfigError, DeadlockError
from itercast.predict import Prediction, predict
from itercast.replay import ReplayResult, replay_whatif
from itercast.traces.kineto import TraceError
from itercast.traces.perfetto import write_chrome_trace
from itercast.traces.whatif import WhatIf

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Forecast distributed deep-learning training before paying for the GPUs.",
)
console = Console()
EXAMPLE = "gpt3-175b-a100.yaml"


def fail(message: str) -> NoReturn:
    """A user error: the message on stderr, exit code 2, no traceback."""
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(2)


@app.command("predict")
def predict_cmd(
    job_file: Annotated[Path | None, typer.Argument(help="YAML job file with sections model, plan, system.")] = None,
    model: Annotated[str | None, typer.Option(help="Model preset (see `itercast presets`).")] = None,
    system: Annotated[str | None, typer.Option(help="System preset (see `itercast presets`).")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override SECTION.FIELD=VALUE (repeatable).")] = None,
    example: Annotated[bool, typer.Option(help=f"Use the built-in example job ({EXAMPLE}).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object instead of a table.")] = False,
    trace: Annotated[Path | None, typer.Option(help="Write the predicted timeline as Chrome/Perfetto JSON.")] = None,
    calibration: Annotated[
        Path | None, typer.Option(help="Calibration file from `itercast calibrate` (else the built-in curves).")
    ] = None,
) -> None:
    """Time per iteration, its breakdown and critical path, memory per GPU and MFU."""
    if example:
        if job_file is not None:
            fail("give either a job file or --example, not both")
        job_file = Path(str(resources.files("itercast").joinpath("examples", EXAMPLE)))
    if job_file is None and (model is None or system is None):
        fail("need a job file, --example, or both --model and --system")
    try:
        job = Job.load(job_file, set_ or [], model=model, system=system)
        result = predict(job, load_calibration(calibration) if calibration else None)
    except (ConfigError, DeadlockError, CalibrationError) as exc:
        fail(str(exc).replace("\n", "\n  "))
    if trace is not None:
        write_chrome_trace(result.sim, trace)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=1))
    else:
        _print_prediction(result, trace)


@app.command("replay")
def replay_cmd(
    traces: Annotated[
        list[Path], typer.Argument(help="Kineto trace files (.json/.json.gz), one per rank, or directories.")
    ],
    scale: Annotated[list[str] | None, typer.Option(help="What-if: CLASS=FACTOR, e.g. gemm=0.5 (repeatable).")] = None,
    drop: Annotated[list[str] | None, typer.Option(help="What-if: remove a kernel class (repeatable).")] = None,
    system: Annotated[str | None, typer.Option(help="What-if: re-time NCCL collectives on this system preset.")] = None,
    world_size: Annotated[
        int | None, typer.Option(help="What-if: data-parallel group size for re-timed collectives.")
    ] = None,
    gpu: Annotated[
        str | None, typer.Option(help="What-if: re-time GEMMs (shapes from --et) on this system's GPU.")
    ] = None,
    et: Annotated[list[Path] | None, typer.Option(help="PyTorch execution trace per trace file, same order.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object instead of a table.")] = False,
    trace: Annotated[
        Path | None, typer.Option(help="Write the replayed (what-if) timeline as Chrome/Perfetto JSON.")
    ] = None,
) -> None:
    """Replay profiler traces: measured vs replayed time per step, and what-if changes."""
    try:
        factors = dict(_factor(item) for item in scale or [])
        factors.update({cls: 0.0 for cls in drop or []})
        base, changed, counts = replay_whatif(list(traces), WhatIf(factors, system, world_size, gpu), et or [])
    except (ConfigError, TraceError, DeadlockError) as exc:
        fail(str(exc).replace("\n", "\n  "))
    result = changed
    if trace is not None:
        write_chrome_trace(result.sim, trace)
    if as_json:
        out = base.to_dict()
        for row, new in zip(out["steps"], changed.steps, strict=True):
            row["whatif_s"] = new.replayed_s
        out["whatif_changes"] = dict(counts)
        typer.echo(json.dumps(out, indent=1))
    else:
        _print_replay(base, changed, counts)


def _factor(item: str) -> tuple[str, float]:
    name, _, value = item.partition("=")
    try:
        return name.strip(), float(value)
    except ValueError:
        raise ConfigError(f"--scale {item!r}: expected CLASS=FACTOR, e.g. gemm=0.5") from None


def _print_replay(base: ReplayResult, changed: ReplayResult, counts: dict) -> None:
    d = base.to_dict()
    console.print(f"{len(base.traces)} trace(s), {d['events']:,} events → {d['tasks']:,} tasks", highlight=False)
    table = Table(title="steps: measured (ProfilerStep) vs replayed")
    for col in ("rank", "step", "measured ms", "replayed ms", "error") + (("what-if ms",) if counts else ()):
        table.add_column(col, justify="right")
    for s, w in zip(base.steps, changed.steps, strict=True):
        row = [str(s.rank), str(s.step), f"{s.measured_s * 1e3:.3f}", f"{s.replayed_s * 1e3:.3f}", f"{s.error:+.2%}"]
        table.add_row(*row, *((f"{w.replayed_s * 1e3:.3f}",) if counts else ()))
    console.print(table)
    for title, items in (("what-if", counts), ("inferred", d["inferences"]), ("events not used", d["ignored_events"])):
        if items:
            console.print(f"[bold]{title}:[/] " + "; ".join(f"{k}: {v}" for k, v in items.items()), highlight=False)


profile_app = typer.Typer(no_args_is_help=True, help="Measure kernels on this device, or import outside measurements.")
app.add_typer(profile_app, name="profile")
IMPORTERS = ("alpa", "nccl-tidy", "nccl-log", "xla-matmul")


@profile_app.command("run")
def profile_run_cmd(
    db: Annotated[Path, typer.Option(help="Profiling database (SQLite; created if missing).")],
    device: Annotated[str, typer.Option(help="torch device: cpu or cuda.")] = "cpu",
    quick: Annotated[bool, typer.Option(help="A small grid (seconds) instead of the full one.")] = False,
    families: Annotated[
        str, typer.Option(help="Comma-separated: gemm, elementwise, embedding.")
    ] = "gemm,elementwise,embedding",
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


@app.command("variability")
def variability_cmd(
    job_file: Annotated[Path | None, typer.Argument(help="YAML job file with sections model, plan, system.")] = None,
    model: Annotated[str | None, typer.Option(help="Model preset.")] = None,
    system: Annotated[str | None, typer.Option(help="System preset.")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override SECTION.FIELD=VALUE (repeatable).")] = None,
    samples: Annotated[int, typer.Option(min=100, help="Monte Carlo samples of the step.")] = 10_000,
    seed: Annotated[int, typer.Option(help="Random seed (same seed, same answer).")] = 0,
    compute_cv: Annotated[float, typer.Option(min=0, help="Per-task compute noise (CV).")] = 0.02,
    comm_cv: Annotated[float, typer.Option(min=0, help="Per-task communication noise (CV).")] = 0.10,
    network_cv: Annotated[float, typer.Option(min=0, help="Per-step shared network factor (CV).")] = 0.05,
    gpu_cv: Annotated[float, typer.Option(min=0, help="Persistent per-GPU speed across the fleet (CV).")] = 0.05,
    within_s: Annotated[float | None, typer.Option(help="Report P(step ≤ this many seconds).")] = None,
    steps: Annotated[int | None, typer.Option(help="Time to train this many steps, with failures.")] = None,
    mtbf_hours: Annotated[float, typer.Option(help="Mean time between failures of one GPU (hours).")] = 50_000.0,
    checkpoint_s: Annotated[float, typer.Option(help="Time to write a checkpoint (s).")] = 300.0,
    restart_s: Annotated[float, typer.Option(help="Time from a failure to training again (s).")] = 900.0,
    deadline_hours: Annotated[float | None, typer.Option(help="Report P(training ends within this).")] = None,
    slow_gpus: Annotated[
        int | None, typer.Option(min=1, help="Place this many slow GPUs (best vs worst stages).")
    ] = None,
    slow_factor: Annotated[float, typer.Option(min=1.0, help="How much slower each slow GPU is.")] = 1.5,
    plot: Annotated[Path | None, typer.Option(help="Write the step-time CDF as PNG (needs matplotlib).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object instead of a table.")] = False,
) -> None:
    """Step-time distribution (Monte Carlo), what drives its spread, slow-GPU placement, time to train."""
    from itercast.stochastic import variability as var
    from itercast.stochastic.time_to_train import HOUR_S, FailureModel, time_to_train

    if job_file is None and (model is None or system is None):
        fail("need a job file, or both --model and --system")
    try:
        job = Job.load(job_file, set_ or [], model=model, system=system)
        vm = var.VariabilityModel(compute_cv, comm_cv, network_cv, gpu_cv)
        dist = var.step_distribution(job, vm, samples, seed)
        attribution = var.attribution(job, vm, min(samples, 4_000), seed)
    except (ConfigError, DeadlockError) as exc:
        fail(str(exc).replace("\n", "\n  "))
    out: dict = {
        **dist.quantiles(),
        "deterministic_s": dist.deterministic_s,
        "mean_s": float(dist.samples_s.mean()),
        "slowdown": dist.slowdown,
        "samples": samples,
        "seed": seed,
        "model": vm.__dict__,
        "attribution": attribution,
    }
    if within_s is not None:
        out["p_within"] = {"t_s": within_s, "probability": dist.probability_within(within_s)}
    if plot is not None:
        from itercast.report.plots import step_cdf_png

        try:
            step_cdf_png(dist.samples_s, dist.deterministic_s, plot, f"{job.model.name} on {job.system.num_gpus} GPUs")
        except ConfigError as exc:
            fail(str(exc))
    if slow_gpus is not None:
        from itercast.stochastic.placement import place_slow_gpus

        pl = place_slow_gpus(job, slow_gpus, slow_factor)
        out["placement"] = {
            "slow_gpus": slow_gpus,
            "slowdown": slow_factor,
            "baseline_s": pl.baseline_s,
            "best_stages": list(pl.best_stages),
            "best_s": pl.best_s,
            "worst_stages": list(pl.worst_stages),
            "worst_s": pl.worst_s,
            "worth": pl.worth,
        }
    if steps is not None:
        ttt = time_to_train(
            out["mean_s"],
            steps,
            job.system.num_gpus,
            FailureModel(mtbf_hours * HOUR_S, checkpoint_s, restart_s),
            deadline_s=deadline_hours * HOUR_S if deadline_hours else None,
            seed=seed,
        )
        out["time_to_train"] = {
            "work_s": ttt.work_s,
            "expected_s": ttt.expected_s,
            "goodput": ttt.goodput,
            "checkpoint_interval_s": ttt.interval_s,
            "young_interval_s": ttt.young_interval_s,
            **ttt.quantiles_s,
            "deadline_probability": ttt.deadline_probability,
        }
    if as_json:
        typer.echo(json.dumps(out, indent=1))
        return
    head = Table(show_header=False, box=None)
    head.add_row("step (deterministic)", f"{dist.deterministic_s:.3f} s")
    head.add_row("step quantiles", "  ".join(f"{k[:3]} {out[k]:.3f} s" for k in ("p50_s", "p90_s", "p95_s", "p99_s")))
    head.add_row("slowdown from variability", f"{dist.slowdown:.3f}× (mean over deterministic)")
    if "p_within" in out:
        head.add_row(f"P(step ≤ {within_s} s)", f"{out['p_within']['probability']:.1%}")
    if "time_to_train" in out:
        t = out["time_to_train"]
        head.add_row(
            "time to train",
            f"{t['expected_s'] / 86400:.2f} days expected, goodput {t['goodput']:.1%}, "
            f"checkpoint every {t['checkpoint_interval_s'] / 60:.0f} min"
            + (f", P(deadline) {t['deadline_probability']:.1%}" if t["deadline_probability"] is not None else ""),
        )
    if "placement" in out:
        pl_out = out["placement"]
        head.add_row(
            f"{slow_gpus} GPUs {slow_factor}× slower",
            f"best on stages {pl_out['best_stages']}: "
            f"{pl_out['best_s']:.3f} s; worst on {pl_out['worst_stages']}: {pl_out['worst_s']:.3f} s "
            f"(placement worth {pl_out['worth']:.3f}×)",
        )
    console.print(head)
    table = Table(title="what drives the spread: the source's CV halved")
    for col in ("source", "p95 change", "p50→p99 spread change"):
        table.add_column(col, justify="right" if col != "source" else "left")
    for r in attribution:
        table.add_row(r["source"], f"{r['p95_change']:+.2%}", f"{r['spread_change']:+.1%}")
    console.print(table)


@app.command("presets")
def presets_cmd() -> None:
    """List the model and system presets."""
    for section in ("model", "system"):
        console.print(f"[bold]{section}s:[/] " + ", ".join(preset_names(section)))


def _print_prediction(r: Prediction, trace: Path | None) -> None:
    job = r.job
    p = job.plan
    console.print(
        f"[bold]{job.model.name}[/] on {job.system.num_gpus}× {job.system.gpu.name} "
        f"({job.system.name}, {job.system.num_nodes} nodes) — dp {p.dp} × tp {p.tensor_parallel} "
        f"× pp {p.pipeline_parallel} × cp {p.context_parallel}, {p.schedule}, {job.num_microbatches} micro-batches",
        highlight=False,
    )
    head = Table(show_header=False, box=None)
    head.add_row("step time", f"{r.step_time_s:.3f} s")
    head.add_row(
        "throughput", f"{r.tokens_per_s:,.0f} tokens/s, {r.model_tflops_per_gpu:.1f} TFLOP/s per GPU, MFU {r.mfu:.1%}"
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
