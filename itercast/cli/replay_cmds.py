"""`itercast replay`: measured vs replayed steps of profiler traces, and what-ifs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from itercast.cli import JsonOpt, app, console, echo_json, fail, working
from itercast.cli.app import warn, warn_other_system
from itercast.config.job import load_system
from itercast.errors import ConfigError, DeadlockError, non_negative
from itercast.profile.calibrate import CalibrationError, load_calibration
from itercast.replay import GPU_BOUND_BUSY, ReplayResult, replay_whatif
from itercast.traces.host_overheads import HostOverheads
from itercast.traces.kineto import TraceError
from itercast.traces.perfetto import write_chrome_trace
from itercast.traces.whatif import WhatIf


@app.command("replay")
def replay_cmd(
    traces: Annotated[
        list[Path],
        typer.Argument(metavar="FILE", help="Kineto trace files (.json/.json.gz), one per rank, or directories."),
    ],
    scale: Annotated[list[str] | None, typer.Option(help="What-if: CLASS=FACTOR, e.g. gemm=0.5 (repeatable).")] = None,
    drop: Annotated[list[str] | None, typer.Option(help="What-if: remove a kernel class (repeatable).")] = None,
    system: Annotated[str | None, typer.Option(help="What-if: re-time NCCL collectives on this system preset.")] = None,
    world_size: Annotated[
        int | None, typer.Option(help="What-if: data-parallel group size for re-timed collectives.")
    ] = None,
    dp: Annotated[
        int | None,
        typer.Option(
            help="What-if: data-parallel size: gradient reductions re-timed by the collective model's "
            "ratio for the new group (buckets kept)."
        ),
    ] = None,
    pp_stages: Annotated[
        int | None,
        typer.Option(
            help="What-if: pipeline stages, a divisor or multiple of the trace's (every stage's trace of a CPU "
            "gloo pipeline run): stages merged or split, the schedule kept, sends re-timed."
        ),
    ] = None,
    tp: Annotated[
        int | None,
        typer.Option(
            help="What-if: tensor-parallel size, from a CPU (gloo) trace whose distributedInfo names a TP group "
            "over every rank: sharded operators (GEMMs and elementwise work on the sharded dimension) × old/new, "
            "TP all-reduces re-timed by the collective model for the new group."
        ),
    ] = None,
    host_cores: Annotated[
        int | None,
        typer.Option(
            help="Cores of the host that ran every rank (Kineto records none): the ranks' CPU work shares "
            "them, the trace's sharing divided out and the what-if's (--dp or --tp processes, --pp-stages stages) "
            "applied. Default: no sharing."
        ),
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option(
            help="What-if: re-time GEMMs (shapes from --et) on this system's GPU: each measured kernel × the GEMM "
            "model's time on it / on the traces' own GPU (absolute model time where no preset has that GPU)."
        ),
    ] = None,
    et: Annotated[
        list[Path] | None, typer.Option(metavar="FILE", help="PyTorch execution trace per trace file, same order.")
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="What-if: host overheads T1–T5 (`calibrate --host-trace`) and collective curves from this "
            "calibration file.",
        ),
    ] = None,
    as_json: JsonOpt = False,
    trace: Annotated[
        Path | None, typer.Option(metavar="FILE", help="Write the replayed (what-if) timeline as Chrome/Perfetto JSON.")
    ] = None,
) -> None:
    """Replay profiler traces: measured vs replayed time per step, and what-if changes."""
    try:
        factors = _factors(scale or [], drop or [])
        curves = load_calibration(calibration) if calibration is not None else None
        retimes_collectives = any(x is not None for x in (system, world_size, dp, tp))
        host = (
            _host_overheads(calibration, curves, retimes_collectives)
            if calibration is not None and curves is not None
            else None
        )
        whatif = WhatIf(factors, system, world_size, gpu, host, dp, pp_stages, curves, host_cores, tp)
        if curves is not None and system is not None and calibration is not None:  # the what-if's system
            warn_other_system(calibration, curves, load_system(system))
        with working("replaying the traces…", as_json):
            base, changed, counts = replay_whatif(list(traces), whatif, et or [])
    except (ConfigError, TraceError, DeadlockError, CalibrationError) as exc:
        fail(str(exc).replace("\n", "\n  "))
    traced = len({s.rank for s in base.steps})  # the traced stages (a directory argument holds several)
    if pp_stages is not None and pp_stages > traced:  # said once the what-if stands
        warn(
            f"--pp-stages {pp_stages}: each traced stage's work is split into {pp_stages // traced} equal "
            "stages; the traces do not say how its layers divide, and a stage holds at least one layer"
        )
    result = changed
    if trace is not None:
        try:
            write_chrome_trace(result.sim, trace, [*traces, *(et or []), calibration])
        except ConfigError as exc:
            fail(str(exc))
    restaged = pp_stages is not None  # new ranks: the what-if's steps are not the trace's
    if as_json:
        out = base.to_dict()
        if restaged:
            out["whatif_steps"] = [{"rank": s.rank, "step": s.step, "whatif_s": s.replayed_s} for s in changed.steps]
        else:
            for row, new in zip(out["steps"], changed.steps, strict=True):
                row["whatif_s"] = new.replayed_s
        out["whatif_changes"] = dict(counts)
        out["whatif_span_s"] = changed.sim.step_time_s  # the whole replayed what-if, steps marked or not
        out["whatif_breakdown"] = changed.breakdown.as_dict()  # its parts, as "breakdown" holds the replay's
        echo_json(out)
    else:
        _print_replay(base, None if restaged else changed, counts)
        if restaged:
            _print_restaged(changed)


def _print_restaged(changed: ReplayResult) -> None:
    """The re-staged pipeline's steps: one row per new stage and measured step, and their mean."""
    table = Table(title=f"what-if: {len({s.rank for s in changed.steps})} pipeline stages (not measured)")
    for col in ("stage", "step", "what-if ms"):
        table.add_column(col, justify="right")
    for s in changed.steps:
        table.add_row(str(s.rank), str(s.step), f"{s.replayed_s * 1e3:.3f}")
    console.print(table)
    mean_ms = sum(s.replayed_s for s in changed.steps) / len(changed.steps) * 1e3
    console.print(f"what-if step, mean over stages and steps: {mean_ms:.3f} ms", highlight=False)


def _print_collectives(counts: dict, total: int) -> None:
    """With --system/--world-size/--dp: how many collectives were re-timed, and a warning for those kept."""
    retimed = {k: n for k, n in counts.items() if k.startswith(("re-timed ", "gradient ", "TP ")) and "GEMM" not in k}
    kept = {k: n for k, n in counts.items() if "kept at measured time" in k}
    if not retimed and not kept:
        return
    inferred = sum(n for k, n in retimed.items() if k.endswith("(size inferred)"))
    console.print(
        f"re-timed {sum(retimed.values())} of {total} collectives ({inferred} with sizes inferred from their "
        "measured time on the trace's system)",
        highlight=False,
    )
    if kept:
        console.print(
            f"[yellow]warning:[/] {sum(kept.values())} of {total} collectives keep their measured time: "
            + "; ".join(f"{n} {k.replace(' kept at measured time', '')}" for k, n in kept.items()),
            highlight=False,
        )


def _ranks_line(ranks: list[int], matched: list[int], collectives: dict) -> str:
    """Which ranks were loaded and whose collectives were matched into rendezvous."""
    line = f"ranks loaded: {_ranks(ranks)}; "
    if matched:
        return line + f"collectives matched across ranks {_ranks(matched)} (replayed as transfers)"
    if collectives:
        return line + "no collective matched across ranks: collectives keep their measured time (waits included)"
    return line + "no collectives"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def _host_overheads(path: Path, doc: dict, retimes_collectives: bool) -> HostOverheads | None:
    """The calibration's host overheads; None where it has none but serves a collective what-if."""
    if "host_overheads" not in doc:
        if retimes_collectives:
            return None
        raise CalibrationError(f"{path}: no host_overheads section (write one with `itercast calibrate --host-trace`)")
    return HostOverheads.from_dict(doc["host_overheads"], f"{path}: host_overheads")


def _factors(scale: list[str], drop: list[str]) -> dict[str, float]:
    """Kernel class → factor from --scale CLASS=FACTOR and --drop CLASS (factor 0); a class given twice is
    refused rather than the last one silently kept."""
    factors: dict[str, float] = {}
    for item, (name, factor) in [*((i, _factor(i)) for i in scale), *((c, (c.strip(), 0.0)) for c in drop)]:
        if name in factors:
            raise ConfigError(
                f"--scale/--drop {item!r}: expected one factor per kernel class; got {name!r} twice, "
                f"factors {factors[name]:g} and {factor:g}"
            )
        factors[name] = factor
    return factors


def _factor(item: str) -> tuple[str, float]:
    name, _, value = item.partition("=")
    return name.strip(), non_negative(value, f"--scale {item!r} (CLASS=FACTOR, e.g. gemm=0.5)", "factor")


def _print_replay(base: ReplayResult, changed: ReplayResult | None, counts: dict) -> None:
    """The measured and replayed steps, with the what-if's beside them where it kept the ranks (`changed`)."""
    d = base.to_dict()
    console.print(f"{len(base.traces)} trace(s), {d['events']:,} events → {d['tasks']:,} tasks", highlight=False)
    table = Table(title="steps: measured (ProfilerStep) vs replayed")
    beside = counts and changed is not None
    for col in ("rank", "step", "measured ms", "replayed ms", "error", "GPU busy") + (
        ("what-if ms",) if beside else ()
    ):
        table.add_column(col, justify="right")
    whatif_steps = changed.steps if changed is not None else base.steps
    for s, w in zip(base.steps, whatif_steps, strict=True):
        row = [str(s.rank), str(s.step), f"{s.measured_s * 1e3:.3f}", f"{s.replayed_s * 1e3:.3f}", f"{s.error:+.2%}"]
        table.add_row(*row, f"{s.gpu_busy:.0%}", *((f"{w.replayed_s * 1e3:.3f}",) if beside else ()))
    if base.steps:
        console.print(table)
    else:  # no ProfilerStep marks: the whole trace is the one span to compare
        whatif = f"; what-if {changed.sim.step_time_s * 1e3:.3f} ms" if beside and changed is not None else ""
        console.print(
            f"no ProfilerStep marks: the whole trace, measured {base.measured_span_s * 1e3:.3f} ms (first to last "
            f"event), replayed {base.sim.step_time_s * 1e3:.3f} ms{whatif}",
            highlight=False,
        )
    rg = base.replay_graph
    console.print(_ranks_line(d["ranks"], d["matched_ranks"], rg.nccl_meta or rg.cpu_comm), highlight=False)
    busy = [s.gpu_busy for s in base.steps] or [base.span_gpu_busy]
    if rg.gpu_task and max(busy) < GPU_BOUND_BUSY:  # a CPU-only trace has no GPU to be bound by
        console.print(
            f"host-bound: the GPU is busy at most {max(busy):.0%} of a step, so what-ifs on GPU kernels move the "
            "step little or not at all; host what-ifs (--calibration) and synchronisations decide it",
            highlight=False,
        )
    _print_collectives(counts, len(base.replay_graph.nccl_meta) + len(base.replay_graph.cpu_comm))
    for title, items in (("what-if", counts), ("inferred", d["inferences"]), ("events not used", d["ignored_events"])):
        if items:
            console.print(f"[bold]{title}:[/] " + "; ".join(f"{k}: {v}" for k, v in items.items()), highlight=False)
