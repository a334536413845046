"""`itercast variability`: step-time distribution, what drives it, slow GPUs, time to train."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
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
    calibration_curves,
    console,
    echo_json,
    fail,
    finite,
    load_job,
    refuse_options,
    resolve_job_file,
    warn,
    working,
)
from itercast.config.job import Job
from itercast.errors import ConfigError, DeadlockError
from itercast.memory import estimate_memory
from itercast.search.job_slicing import slice_job_at_speeds
from itercast.stochastic import variability as var
from itercast.stochastic.placement import SpeedMapping, map_speeds, place_slow_on_graph, read_speed_map
from itercast.stochastic.time_to_train import HOUR_S, FailureModel, time_to_train
from itercast.workload import P50_ABOVE_REL, TransformerWorkload, oom_note, seconds

# The variability model's options, one definition for `variability` and `search --objective p95`
# (defaults: VariabilityModel's); variability_model() turns them into the model.
SamplesOpt = Annotated[int, typer.Option(min=100, max=10_000_000, help="Monte Carlo samples of the step.")]
SeedOpt = Annotated[int, typer.Option(help="Random seed (same seed, same answer).")]
ComputeCvOpt = Annotated[float, typer.Option(callback=finite(0, 10), help="Per-task compute noise (CV).")]
CommCvOpt = Annotated[float, typer.Option(callback=finite(0, 10), help="Per-task communication noise (CV).")]
NetworkCvOpt = Annotated[float, typer.Option(callback=finite(0, 10), help="Per-step shared network factor (CV).")]
GpuCvOpt = Annotated[
    float,
    typer.Option(
        callback=finite(0, 10),
        help="Per-GPU speed across the fleet (CV), drawn again each sampled step: the slowest of a stage's GPUs "
        "over allocations, not one run's fixed GPUs (those: --run-cv).",
    ),
]
StepCvOpt = Annotated[
    float,
    typer.Option(
        callback=finite(0, 10),
        help="Per-step factor shared by every task of the step (CV): what --step-autocorrelation correlates.",
    ),
]
MoeImbalanceCvOpt = Annotated[
    float,
    typer.Option(callback=finite(0, 10), help="Per-step variation of the busiest expert rank's tokens (CV; MoE)."),
]
NoiseFromDbOpt = Annotated[
    Path | None,
    typer.Option(metavar="FILE", help="Profiling database: take compute and communication noise from its repeats."),
]
RunCvOpt = Annotated[
    float, typer.Option(callback=finite(0, 10), help="Per-run speed, shared by all steps of a run (CV).")
]
AcrossRunsOpt = Annotated[
    bool,
    typer.Option("--across-runs", metavar="", help="Step quantiles pooled across runs (--run-cv), not of one run."),
]


def variability_model(
    compute_cv: float,
    comm_cv: float,
    network_cv: float,
    gpu_cv: float,
    moe_imbalance_cv: float,
    step_cv: float,
    noise_from_db: Path | None,
    quiet: bool,
) -> var.VariabilityModel:
    """The model the options give; --noise-from-db replaces compute_cv and comm_cv by its repeats'."""
    vm = var.VariabilityModel(compute_cv, comm_cv, network_cv, gpu_cv, moe_imbalance_cv, step_cv)
    return vm if noise_from_db is None else replace(vm, **_profile_noise(noise_from_db, quiet))


def _profile_noise(path: Path, quiet: bool) -> dict[str, float]:
    """compute_cv and comm_cv from the repeats of the device with the most rows in a profiling DB."""
    from itercast.measurements import ProfileError
    from itercast.profile.db import ProfileDB
    from itercast.stochastic.variability import noise_from_profile

    if not path.is_file():
        fail(f"{path}: no such profiling database")
    try:
        db = ProfileDB(path, readonly=True)
        devices = {i: name for i, name, _ in db.devices()}
        counts = {i: sum(1 for _ in db.measurements(device_id=i)) for i in devices}
        if not counts:
            fail(f"{path}: the profiling database has no measurements")
        device = max(counts, key=lambda i: counts[i])
        noise = noise_from_profile(db.measurements(device_id=device))
    except ProfileError as exc:
        fail(str(exc))
    if not noise:
        fail(f"{path}: device {devices[device]!r} has no compute or collective rows with 3 or more repeats")
    if not quiet:
        found = ", ".join(f"{k} {v:.1%}" for k, v in noise.items())
        console.print(f"noise from {path} (device {devices[device]!r}, repeats of each configuration): {found}")
    return noise


#: time to train's and slow GPUs' defaults (the options' values when not given)
MTBF_HOURS, CHECKPOINT_S, RESTART_S, SLOW_FACTOR = 50_000.0, 300.0, 900.0, 1.5


def changed(options: Mapping[str, tuple[float, float]]) -> dict[str, bool]:
    """flag -> whether it was given a value other than its default (the options a mode does not use)."""
    return {flag: given != default for flag, (given, default) in options.items()}


@app.command("variability")
def variability_cmd(
    job_file: JobFileArg = None,
    model: ModelOpt = None,
    system: SystemOpt = None,
    set_: SetOpt = None,
    example: ExampleOpt = False,
    samples: SamplesOpt = 10_000,
    seed: SeedOpt = 0,
    compute_cv: ComputeCvOpt = var.VariabilityModel.compute_cv,
    comm_cv: CommCvOpt = var.VariabilityModel.comm_cv,
    network_cv: NetworkCvOpt = var.VariabilityModel.network_cv,
    gpu_cv: GpuCvOpt = var.VariabilityModel.gpu_cv,
    moe_imbalance_cv: MoeImbalanceCvOpt = var.VariabilityModel.moe_imbalance_cv,
    step_cv: StepCvOpt = var.VariabilityModel.step_cv,
    noise_from_db: NoiseFromDbOpt = None,
    run_cv: RunCvOpt = var.VariabilityModel.run_cv,
    step_autocorrelation: Annotated[
        float,
        typer.Option(callback=finite(-0.99, 0.99), help="Lag-1 correlation of consecutive steps (time to train)."),
    ] = var.VariabilityModel.step_autocorrelation,
    across_runs: AcrossRunsOpt = False,
    within_s: Annotated[
        float | None, typer.Option(callback=finite(0, above=True), help="Report P(step ≤ this many seconds).")
    ] = None,
    steps: Annotated[
        int | None, typer.Option(min=1, max=10**12, help="Time to train this many steps, with failures.")
    ] = None,
    mtbf_hours: Annotated[
        float, typer.Option(callback=finite(0, above=True), help="Mean time between failures of one GPU (hours).")
    ] = MTBF_HOURS,
    checkpoint_s: Annotated[
        float, typer.Option(callback=finite(0, above=True), help="Time to write a checkpoint (s).")
    ] = CHECKPOINT_S,
    restart_s: Annotated[
        float, typer.Option(callback=finite(0), help="Time from a failure to training again (s).")
    ] = RESTART_S,
    deadline_hours: Annotated[
        float | None,
        typer.Option(callback=finite(0, above=True), help="Report P(training ends within this); needs --steps."),
    ] = None,
    slow_gpus: Annotated[
        int | None, typer.Option(min=1, help="Place this many slow GPUs (best vs worst stages).")
    ] = None,
    slow_factor: Annotated[
        float | None,
        typer.Option(callback=finite(1, 1000), help=f"How much slower each slow GPU is [default: {SLOW_FACTOR}]."),
    ] = None,
    speed_map: Annotated[
        Path | None,
        typer.Option(
            metavar="CSV", help="Measured speed per GPU (gpu,speed) or node (node,speed): the best mapping of ranks."
        ),
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(metavar="FILE", help="Write the step-time CDF as PNG (needs matplotlib).")
    ] = None,
    trace: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="FILE",
            help="Kineto trace (file or directory; repeat for ranks): fit the spread on its repeated steps.",
        ),
    ] = None,
    as_json: JsonOpt = False,
    calibration: CalibrationOpt = None,
) -> None:
    """Step-time distribution (Monte Carlo), what drives its spread, slow-GPU placement, time to train,
    of any job: a transformer's graph has one GPU per pipeline stage, a DLRM's every GPU. --calibration
    prices the step (and any re-slicing for a speed map) with that file's curves, as `predict` does."""
    model_options = {  # the job's variability model: flag -> (given, default)
        "--compute-cv": (compute_cv, var.VariabilityModel.compute_cv),
        "--comm-cv": (comm_cv, var.VariabilityModel.comm_cv),
        "--network-cv": (network_cv, var.VariabilityModel.network_cv),
        "--gpu-cv": (gpu_cv, var.VariabilityModel.gpu_cv),
        "--moe-imbalance-cv": (moe_imbalance_cv, var.VariabilityModel.moe_imbalance_cv),
        "--step-cv": (step_cv, var.VariabilityModel.step_cv),
        "--run-cv": (run_cv, var.VariabilityModel.run_cv),
    }
    training_options = {  # time to train
        "--mtbf-hours": (mtbf_hours, MTBF_HOURS),
        "--checkpoint-s": (checkpoint_s, CHECKPOINT_S),
        "--restart-s": (restart_s, RESTART_S),
        "--step-autocorrelation": (step_autocorrelation, var.VariabilityModel.step_autocorrelation),
    }
    if trace:
        job_only: dict[str, object] = {
            "JOB.yaml": job_file,
            "--model": model,
            "--system": system,
            "--set": set_,
            "--example": example,
            "--noise-from-db": noise_from_db,
            "--across-runs": across_runs,
            "--steps": steps,
            "--slow-gpus": slow_gpus,
            "--speed-map": speed_map,
            "--plot": plot,
            "--calibration": calibration,
            "--deadline-hours": deadline_hours,
            **changed(model_options),
            **changed(training_options),
            "--slow-factor": slow_factor is not None,
        }
        refuse_options(job_only, "for a job's spread, not --trace's measured steps (give one or the other)")
        _trace_variability(trace, samples, seed, within_s, as_json)
        return
    if deadline_hours is not None and steps is None:
        fail("--deadline-hours needs --steps: the deadline is for training that many steps")
    if steps is None:
        refuse_options(changed(training_options), "for time to train, which needs --steps")
    if slow_gpus is None:
        refuse_options({"--slow-factor": slow_factor is not None}, "the slow GPUs' speed, which needs --slow-gpus")
    w = load_job(job_file, example, model, system, set_)
    cal = calibration_curves(calibration, w.job.system)
    # a transformer plan that does not fit is said, as predict says it (a DLRM's planned sharding fits)
    mem = estimate_memory(w.job) if isinstance(w, TransformerWorkload) else None
    if mem is not None and mem.oom:
        warn(oom_note(mem))
    if slow_gpus is not None and slow_gpus > w.num_gpus:
        fail(f"--slow-gpus {slow_gpus}: the job has {w.num_gpus} GPUs")
    speeds = None
    if speed_map is not None:  # read before any sampling: a bad map fails at once
        try:
            speeds = read_speed_map(speed_map, w.num_gpus, w.gpus_per_node)
        except ConfigError as exc:
            fail(str(exc))
    vm = variability_model(compute_cv, comm_cv, network_cv, gpu_cv, moe_imbalance_cv, step_cv, noise_from_db, as_json)
    vm = replace(vm, run_cv=run_cv, step_autocorrelation=step_autocorrelation)
    per_source = min(samples, var.ATTRIBUTION_SAMPLES)  # the attribution's, sensitivity's and speed map's
    try:
        with working("building the step graph…", as_json) as phase:
            step = w.step_graph(cal)
            phase(f"1 of 4: sampling {samples:,} steps of {step.graph.num_tasks:,} tasks…")
            dist = var.graph_distribution(step, vm, samples, seed)  # one run: what time to train sums
            phase("2 of 4: across runs…" if across_runs else "2 of 4: done (one run)")
            shown = var.graph_distribution(step, vm, samples, seed, across_runs=True) if across_runs else dist
            phase(f"3 of 4: attribution ({per_source:,} steps per source)…")
            attribution = var.graph_attribution(step, vm, per_source, seed, across_runs)
            phase("4 of 4: sensitivity per kernel family…")
            sensitivity = var.graph_sensitivity(step, vm, samples=per_source, seed=seed, across_runs=across_runs)
    except (ConfigError, DeadlockError, ValueError) as exc:  # ValueError: no DLRM sharding fits
        fail(str(exc).replace("\n", "\n  "))
    out: dict[str, Any] = {
        **shown.quantiles(),
        "across_runs": across_runs,
        "deterministic_s": dist.deterministic_s,
        "mean_s": float(dist.samples_s.mean()),
        "slowdown": dist.slowdown,
        "samples": samples,
        "seed": seed,
        "model": vm.__dict__,
        "attribution": attribution,
        "sensitivity": sensitivity,
        "notes": [  # what the priced step rests on (predict's notes), then what the sampling leaves out
            *w.notes(cal),
            *(w.predict(cal).extrapolated if cal is not None else ()),  # a calibration's curves beyond their fit
            *run_level_notes(
                vm, across_runs, "the step quantiles, attribution, sensitivity or speed-map p95 (time to train has it)"
            ),
            *var.uncovered_note(sensitivity),
        ],
    }
    if mem is not None:
        out["fits_in_memory"] = not mem.oom
    if within_s is not None:
        out["p_within"] = {"t_s": within_s, "probability": shown.probability_within(within_s)}
    if plot is not None:
        inputs = [resolve_job_file(job_file, example, model, system), noise_from_db, calibration, speed_map]
        _plot(shown, plot, f"{w.name} on {w.num_gpus} GPUs", inputs)
    if slow_gpus is not None:
        out["placement"] = _placement(step, slow_gpus, slow_factor or SLOW_FACTOR)
    if speeds is not None:
        job = w.job if isinstance(w, TransformerWorkload) else None
        out["speed_map"] = _speed_mapping(step, job, speeds, vm, per_source, seed, across_runs, cal)
    if steps is not None:
        failures = FailureModel(mtbf_hours * HOUR_S, checkpoint_s, restart_s)
        deadline_s = deadline_hours * HOUR_S if deadline_hours else None
        step_cv = float(dist.samples_s.std() / dist.samples_s.mean())
        try:
            out["time_to_train"] = _time_to_train(
                out["mean_s"], steps, w.num_gpus, failures, deadline_s, seed, vm, step_cv
            )
        except ValueError as exc:  # a job that would never finish at this failure rate
            fail(str(exc))
    if as_json:
        echo_json(out)
        return
    _print(out, w.num_gpus)


def _plot(dist: var.StepDistribution, path: Path, title: str, inputs: list[Path | None]) -> None:
    """The step-time CDF as a PNG (report/plots.py; needs matplotlib)."""
    from itercast.report.plots import step_cdf_png

    try:
        step_cdf_png(dist.samples_s, dist.deterministic_s, path, title, inputs)
    except ConfigError as exc:
        fail(str(exc))


def _placement(step: var.StepGraph, slow_gpus: int, slow_factor: float) -> dict[str, Any]:
    """The best and worst graph ranks for the slow GPUs (stochastic/placement.py)."""
    pl = place_slow_on_graph(step.graph, step.gpus_per_rank, slow_gpus, slow_factor)
    return {
        "slow_gpus": slow_gpus,
        "slowdown": slow_factor,
        "baseline_s": pl.baseline_s,
        "best_stages": list(pl.best_stages),
        "best_s": pl.best_s,
        "worst_stages": list(pl.worst_stages),
        "worst_s": pl.worst_s,
        "worth": pl.worth,
    }


def run_level_notes(vm: var.VariabilityModel, across_runs: bool, figures: str) -> list[str]:
    """What `figures` (a command's sampled step figures) leave out: with --run-cv but not --across-runs
    they are of one run at the mean speed (variability.run_steps_of), so the run's factor is in none."""
    if vm.run_cv == 0 or across_runs:
        return []
    return [
        f"run level (--run-cv {vm.run_cv:g}) not in {figures}: they are of one run at the mean speed; "
        "--across-runs pools them over runs"
    ]


def _speed_mapping(
    step: var.StepGraph,
    job: Job | None,
    speeds: Any,
    vm: var.VariabilityModel,
    samples: int,
    seed: int,
    across_runs: bool,
    calibration: dict[str, Any] | None,
) -> dict[str, Any]:
    """The best mapping of the measured speeds onto the graph's ranks (stochastic/placement.py),
    re-ranked by the p95 under the noise model `vm` (one seed for all: common random numbers), of one
    run or pooled `across_runs`; then the plan change, `job`'s layers re-sliced for its stages' speeds
    (None: a DLRM, no pipeline), under the rank order and under the best mapping (_plan_change)."""

    def p95_of(s: var.StepGraph) -> float:
        dist = var.graph_distribution(s, vm, samples, seed, across_runs)
        return float(np.percentile(dist.samples_s, 95))

    m = map_speeds(step.graph, step.gpus_per_rank, speeds, lambda graph: p95_of(replace(step, graph=graph)))
    slowest = [r for r, gpus in enumerate(m.best_gpus) if min(speeds[list(gpus)]) == speeds.min()]
    return {
        "baseline_s": m.baseline_s,
        "naive_s": m.naive_s,
        "best_s": m.best_s,
        "gain": m.gain,
        "naive_p95_s": m.naive_p95_s,
        "best_p95_s": m.best_p95_s,
        "p95_gain": m.p95_gain,
        "method": m.method,
        "slowest_gpus_on_ranks": slowest,
        "best_gpus_per_rank": [list(g) for g in m.best_gpus],
        "plan_change": _plan_change(job, m, p95_of, calibration),
    }


def _plan_change(
    job: Job | None,
    m: SpeedMapping,
    p95_of: Callable[[var.StepGraph], float],
    calibration: dict[str, Any] | None,
) -> dict[str, Any] | str:
    """The layers re-sliced over the pipeline stages at their speeds (search/job_slicing.py
    slice_job_at_speeds), every other plan field kept: under the rank order (the plan change alone) and
    under the best mapping (both), each step simulated and its p95 priced as the mappings' (same seed;
    a re-sliced graph has other tasks, so its draws are not the same ones); gains over the rank order.
    A string where there is nothing to re-slice."""
    if job is None:
        return "no pipeline to re-slice: a DLRM's graph ranks are GPUs, not pipeline stages"
    if job.plan.pipeline_parallel == 1:
        return "no pipeline to re-slice: pipeline_parallel is 1"
    if job.system.device_groups:
        return (
            "not computed: a mixed cluster's stages are priced per device group (`slice` re-slices it on the groups' "
            "GPUs, at their nominal speeds)"
        )
    try:
        alone = slice_job_at_speeds(job, np.array(m.naive_speeds), calibration)
        both = slice_job_at_speeds(job, np.array(m.best_speeds), calibration)
    except ValueError as exc:  # no re-slicing fits the GPUs' memory
        return f"not computed: {exc}"
    alone_p95, both_p95 = p95_of(alone.step), p95_of(both.step)
    assert m.naive_p95_s is not None and m.best_p95_s is not None
    return {
        "stage_layers_before": list(job.plan.virtual_stage_layers(job.model.num_layers)),
        "stage_layers": list(alone.stage_layers),
        "plan_change_s": alone.step_s,
        "plan_change_p95_s": alone_p95,
        "gain": m.naive_s / alone.step_s,
        "p95_gain": m.naive_p95_s / alone_p95,
        "combined_stage_layers": list(both.stage_layers),
        "combined_s": both.step_s,
        "combined_p95_s": both_p95,
        "combined_gain": m.naive_s / both.step_s,
        "combined_p95_gain": m.naive_p95_s / both_p95,
        "helps_more_by_p95": "the plan change" if alone_p95 < m.best_p95_s else "the mapping",
        "slicings_simulated": alone.candidates + both.candidates,
    }


def _time_to_train(
    mean_s: float,
    steps: int,
    gpus: int,
    failures: FailureModel,
    deadline_s: float | None,
    seed: int,
    vm: var.VariabilityModel,
    step_cv: float,
) -> dict[str, Any]:
    """Time to train `steps` steps of `mean_s` (CV `step_cv` within a run) on `gpus` GPUs with failures,
    the run's factor and the steps' correlation of `vm` (stochastic/time_to_train.py)."""
    ttt = time_to_train(
        mean_s,
        steps,
        gpus,
        failures,
        deadline_s=deadline_s,
        seed=seed,
        step_cv=step_cv,
        step_autocorrelation=vm.step_autocorrelation,
        run_cv=vm.run_cv,
    )
    return {
        "work_s": ttt.work_s,
        "expected_s": ttt.expected_s,
        "goodput": ttt.goodput,
        "expected_interruptions": ttt.expected_interruptions,
        "checkpoint_interval_s": ttt.interval_s,
        "young_interval_s": ttt.young_interval_s,
        **ttt.quantiles_s,
        "deadline_probability": ttt.deadline_probability,
        "deadline_interval_s": ttt.deadline_interval_s,
        "best_deadline_probability": ttt.best_deadline_probability,
    }


def _deadline_interval(t: dict[str, Any]) -> str:
    """The interval that best meets the deadline, where it meets it more often than the least expected one."""
    best = t["best_deadline_probability"]
    if best is None or best <= t["deadline_probability"]:
        return ""
    return f" ({best:.1%} checkpointing every {t['deadline_interval_s'] / 60:.0f} min, the best for the deadline)"


def _print(out: dict[str, Any], gpus: int) -> None:
    """The summary lines, then what drives the spread."""
    head = Table(show_header=False, box=None)
    for name, value in _summary_rows(out, gpus):
        head.add_row(name, value)
    console.print(head)
    table = Table(title="what drives the spread: the source's CV halved", caption=_NOISE_CAPTION)
    for col in ("source", "p95 change", "p50→p99 spread change"):
        table.add_column(col, justify="right" if col != "source" else "left")
    for r in out["attribution"]:
        p95_se, spread_se = r["p95_change_se"], r["spread_change_se"]
        p95 = _with_error(f"{r['p95_change']:+.2%}", f"{100 * p95_se:.1g}%", r["p95_change"], p95_se)
        spread = "no spread to change (p99 − p50 < 0.1% of p50)"
        if r["spread_change"] is not None:
            change = r["spread_change"]
            spread = _with_error(f"{change:+.1%}", f"{100 * spread_se:.1g}%", change, spread_se)
        table.add_row(r["source"], p95, spread)
    console.print(table)
    _print_sensitivity(out["sensitivity"], "share of step", "in graph")


_NOISE_CAPTION = "± one Monte Carlo standard error (paired bootstrap); 'noise': within two of zero"


def _with_error(value: str, error: str, x: float, se: float) -> str:
    """`value ± error`, marked as sampling noise where `x` is within two standard errors `se` of zero."""
    return f"{value} ± {error}" + (" (noise)" if se > 0 and abs(x) <= 2 * se else "")


def _print_sensitivity(rows: list[dict[str, Any]], share: str, total: str) -> None:
    """The top 10 classes by dp95 per unit of CV added (graph_sensitivity, trace_sensitivity), each ± its
    Monte Carlo standard error; one within two standard errors of zero is marked as sampling noise."""
    table = Table(
        title="which kernels and collectives to steady: p95 per unit of CV added to each (top 10)",
        caption=_NOISE_CAPTION,
    )
    for col in ("class", "dp95 s per CV", "on critical path", share, total):
        table.add_column(col, justify="right" if col != "class" else "left")
    for r in rows[:10]:
        shift_s, se_s = r["dp95_per_cv_s"], r["dp95_per_cv_se_s"]
        table.add_row(
            r["class"],
            _with_error(f"{shift_s:.3g}", f"{se_s:.1g}", shift_s, se_s),
            seconds(r["critical_path_s"]),
            f"{r['critical_path_share']:.1%}",
            seconds(r["total_s"]),
        )
    console.print(table)


def _count(expected: float) -> str:
    """An expected count as read: whole from 10 up (`419`), two significant digits below (`0.17`, `2.3`): a rare
    interruption is not none."""
    return f"{expected:,.0f}" if expected >= 10 else f"{expected:.2g}"


def _summary_rows(out: dict[str, Any], gpus: int) -> list[tuple[str, str]]:
    det = out["deterministic_s"]
    rows = [
        ("step (deterministic)", seconds(det)),
        (
            "step quantiles" + (" across runs" if out["across_runs"] else ""),
            "  ".join(f"{k[:3]} {seconds(out[k])}" for k in ("p50_s", "p90_s", "p95_s", "p99_s")),
        ),
        ("slowdown from variability", f"{out['slowdown']:.3f}× (mean over deterministic)"),
    ]
    rows += [("note", note) for note in out["notes"]]
    if out["p50_s"] > det * (1 + P50_ABOVE_REL):
        rows.append(
            (
                "why p50 > `predict`",
                "`predict` times every task at its mean; here each rendezvous waits for the slowest draw of the "
                "GPUs it joins (a tensor-parallel group, a pipeline stage's GPUs), and the maximum of many draws "
                "lies above their mean",
            )
        )
    if "p_within" in out:
        rows.append((f"P(step ≤ {seconds(out['p_within']['t_s'])})", f"{out['p_within']['probability']:.1%}"))
    if "time_to_train" in out:
        t = out["time_to_train"]
        deadline = t["deadline_probability"]
        rows.append(
            (
                "time to train",
                f"{t['expected_s'] / 86400:.2f} days expected, goodput {t['goodput']:.1%}, "
                f"{_count(t['expected_interruptions'])} interruptions expected, "
                f"checkpoint every {t['checkpoint_interval_s'] / 60:.0f} min"
                + (f", P(deadline) {deadline:.1%}" if deadline is not None else "")
                + _deadline_interval(t),
            )
        )
    if "speed_map" in out:
        sm = out["speed_map"]
        rows.append(
            (
                "speed map",
                f"rank order {seconds(sm['naive_s'])} (p95 {seconds(sm['naive_p95_s'])}), best mapping "
                f"{seconds(sm['best_s'])} (p95 {seconds(sm['best_p95_s'])}): {sm['gain']:.3f}× faster, p95 "
                f"{sm['p95_gain']:.3f}× ({sm['method']}; all at speed 1: {seconds(sm['baseline_s'])}); the slowest "
                f"GPUs go to rank(s) {sm['slowest_gpus_on_ranks']}",
            )
        )
        rows.append(("plan change", _plan_change_line(sm["plan_change"])))
    if "placement" in out:
        pl = out["placement"]
        rows.append(
            (
                f"{pl['slow_gpus']} GPUs {pl['slowdown']}× slower",
                f"best on ranks {pl['best_stages']}: {seconds(pl['best_s'])}; worst on {pl['worst_stages']}: "
                f"{seconds(pl['worst_s'])} (placement worth {pl['worth']:.3f}×)",
            )
        )
    return rows


def _plan_change_line(pc: dict[str, Any] | str) -> str:
    """The speed map's plan change as one line (or why there is none)."""
    if isinstance(pc, str):
        return pc
    before, after = pc["stage_layers_before"], pc["stage_layers"]
    sliced = f"layers re-sliced {before} → {after}" if after != before else f"re-slicing keeps the layers {before}"
    return (
        f"{sliced} (rank order): "
        f"{seconds(pc['plan_change_s'])} (p95 {seconds(pc['plan_change_p95_s'])}), {pc['gain']:.3f}× faster, p95 "
        f"{pc['p95_gain']:.3f}×; with the best mapping, re-sliced {pc['combined_stage_layers']}: "
        f"{seconds(pc['combined_s'])} (p95 {seconds(pc['combined_p95_s'])}), {pc['combined_gain']:.3f}×, p95 "
        f"{pc['combined_p95_gain']:.3f}×; {pc['helps_more_by_p95']} helps more (p95)"
    )


#: profiled steps per rank below which `variability --trace` says its quantiles rest on few draws (1 / (1 − 0.95))
FEW_STEPS = 20


def _trace_variability(paths: list[Path], samples: int, seed: int, within_s: float | None, as_json: bool) -> None:
    """Variability fitted on the traces' repeated steps (stochastic/trace_variability.py)."""
    import numpy as np

    from itercast.stochastic.trace_variability import (
        fit_trace_variability,
        trace_attribution,
        trace_sensitivity,
        trace_step_distribution,
    )
    from itercast.traces.kineto import TraceError, read_traces
    from itercast.traces.replay_graph import build_replay_graph

    try:
        with working("reading the traces…", as_json):
            rg = build_replay_graph(read_traces(list(paths)))
    except TraceError as exc:
        fail(str(exc))
    per_rank = Counter(m.rank for m in rg.steps)
    if not per_rank or max(per_rank.values()) < 2:
        fail(
            f"{', '.join(map(str, paths))}: {max(per_rank.values(), default=0)} profiled step per rank; "
            "variability needs repeated steps (ranks are not steps)"
        )
    if (steps := min(per_rank.values())) < FEW_STEPS:
        warn(
            f"{steps} profiled steps per rank: each task's spread is fitted on {steps} draws, and the p95 and p99 "
            f"sampled from it rest on them (a p95 is seen once in {FEW_STEPS} steps)"
        )
    with working(f"fitting the spread and sampling {samples:,} steps…", as_json):
        model = fit_trace_variability(rg)
        sampled = trace_step_distribution(rg, model, samples, seed).pooled()
        attribution = trace_attribution(rg, model, min(samples, 2_000), seed)
        sensitivity = trace_sensitivity(rg, model, samples=min(samples, 2_000), seed=seed)
    measured = np.array([m.measured_s for m in rg.steps])
    qs = np.percentile(sampled, [50, 90, 95, 99])
    out: dict = {
        **{f"p{p}_s": float(q) for p, q in zip((50, 90, 95, 99), qs, strict=True)},
        "mean_s": float(sampled.mean()),
        "measured_steps_s": measured.tolist(),
        "samples": samples,
        "seed": seed,
        "classes": model.summary(),
        "attribution_p95_change_with_half_spread": attribution,
        "sensitivity": sensitivity,
        "notes": model.notes,  # counts of what the fit did
        "uncovered": var.uncovered_note(sensitivity),
    }
    if within_s is not None:
        out["p_within"] = {"t_s": within_s, "probability": float(np.mean(sampled <= within_s))}
    if as_json:
        echo_json(out)
    else:
        _print_trace(out, measured)


def _print_trace(out: dict[str, Any], measured: Any) -> None:
    """The traces' steps and sampled quantiles, then each class's spread and its share of the p95."""
    import numpy as np

    head = Table(show_header=False, box=None)
    head.add_row("steps in the traces", f"{measured.size} (measured median {np.median(measured) * 1e3:.2f} ms)")
    head.add_row(
        "step quantiles", "  ".join(f"{k[:3]} {out[k] * 1e3:.2f} ms" for k in ("p50_s", "p90_s", "p95_s", "p99_s"))
    )
    if "p_within" in out:
        head.add_row(f"P(step ≤ {seconds(out['p_within']['t_s'])})", f"{out['p_within']['probability']:.1%}")
    console.print(head)
    table = Table(title="per class: spread fitted on the repeated steps, and p95 with half of it")
    for col in ("class", "tasks", "residual CV", "step-factor CV", "p95 change"):
        table.add_column(col, justify="right" if col != "class" else "left")
    for c, row in out["classes"].items():
        change = out["attribution_p95_change_with_half_spread"].get(c, 0.0)
        table.add_row(
            c, str(row["tasks"]), f"{row['residual_cv']:.1%}", f"{row['step_factor_cv']:.1%}", f"{change:+.2%}"
        )
    console.print(table)
    _print_sensitivity(out["sensitivity"], "share of the trace's path", "in the trace")
    for note in out["uncovered"]:
        console.print(f"note: {note}", highlight=False)
