"""`itercast report`: a self-contained HTML report of a job (predicted step, memory, variability), or of
a saved `itercast search --json` / `itercast replay --json` result."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

from itercast.cli.app import (
    CalibrationOpt,
    ExampleOpt,
    JobFileArg,
    ModelOpt,
    SetOpt,
    SystemOpt,
    app,
    calibration_curves,
    console,
    fail,
    finite,
    load_job,
    refuse_options,
    resolve_job_file,
    working,
)
from itercast.errors import ConfigError, DeadlockError
from itercast.report import html_report as rep
from itercast.search.objectives import ranked_as
from itercast.user_files import read_json_file, write_output
from itercast.workload import DLRMWorkload, TransformerWorkload, report_sections

MAX_RESULT_BYTES = 256 << 20  # a search or replay result is a few MB at most
SAMPLES = 2_000  # Monte Carlo samples of a job's step (--samples)


@app.command("report")
def report_cmd(
    job_file: JobFileArg = None,
    model: ModelOpt = None,
    system: SystemOpt = None,
    set_: SetOpt = None,
    example: ExampleOpt = False,
    out: Annotated[Path, typer.Option("--out", "-o", metavar="FILE", help="The HTML file to write.")] = Path(
        "itercast-report.html"
    ),
    result: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="Report a saved `itercast search --json`, `shard --json` or `replay --json` result instead.",
        ),
    ] = None,
    samples: Annotated[int, typer.Option(min=100, max=1_000_000, help="Monte Carlo samples of the step.")] = SAMPLES,
    within_s: Annotated[
        float | None, typer.Option(callback=finite(0, above=True), help="Draw this deadline on the step-time CDF.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Random seed of the Monte Carlo.")] = 0,
    calibration: CalibrationOpt = None,
) -> None:
    """Write one self-contained HTML report (no network needed to open it): for a job, the step by
    cause per stage, the timeline, memory against HBM, the step-time CDF and the critical path; for a
    saved search, its time × memory front and top plans; for a saved replay, measured vs replayed
    steps and the critical path by kernel class. --calibration prices a job with that file's curves, as
    `predict` does."""
    try:
        if result is not None:
            if job_file is not None or example or model or system or calibration or set_:
                fail("give a job (with its --set and --calibration) or --result, not both")
            sampled = {"--samples": samples != SAMPLES, "--within-s": within_s is not None, "--seed": seed != 0}
            refuse_options(sampled, "a job's step-time CDF; a saved result is reported as it was saved")
            title, subtitle, sections = _result_sections(result)
            inputs: list[Path | None] = [result]
        else:
            w = load_job(job_file, example, model, system, set_)
            cal = calibration_curves(calibration, w.job.system)
            with working("predicting the step and sampling its variability…"):
                title, subtitle, sections = _job_sections(w, samples, within_s, seed, cal)
            inputs = [resolve_job_file(job_file, example, model, system), calibration]
        with working("drawing the report…"):
            written = write_output(out, rep.render_html(title, subtitle, sections), inputs, (".html", ".htm"))
    except (ConfigError, DeadlockError, ValueError) as exc:  # ValueError: no DLRM sharding fits
        fail(str(exc).replace("\n", "\n  "))
    console.print(f"report written to {written}", highlight=False)


def _job_sections(
    w: TransformerWorkload | DLRMWorkload,
    samples: int,
    within_s: float | None,
    seed: int,
    calibration: dict[str, Any] | None,
) -> tuple[str, str, list[rep.Section]]:
    """A job's title, subtitle (its headline) and sections (workload.report_sections), priced by
    `calibration`'s curves (None: the built-in ones)."""
    from itercast.stochastic.variability import VariabilityModel, graph_distribution

    r = w.predict(calibration)
    dist = graph_distribution(w.step_graph(calibration), VariabilityModel(), samples, seed)
    notes = [*w.notes(calibration, r), *r.extrapolated]  # and where a calibration's curves were not what priced it
    sections = report_sections(w, r, dist.samples_s, dist.deterministic_s, within_s, notes)
    return f"{w.name}: predicted training step", w.headline(), sections


def read_result(path: Path) -> tuple[str, dict[str, Any]]:
    """A saved `search --json` of a transformer ("search") or a DLRM, or `shard --json` ("sharding": plans
    of `tables`), or `replay --json` ("replay") result."""
    doc = read_json_file(path, "result file", MAX_RESULT_BYTES)
    if isinstance(doc, dict) and "plans" in doc:
        if not isinstance(doc["plans"], list) or not doc["plans"]:
            raise ConfigError(f"{path}: `plans`: expected a non-empty list of plans; got {doc['plans']!r:.80}")
        first = doc["plans"][0]
        return ("sharding" if isinstance(first, dict) and "tables" in first else "search"), doc
    if isinstance(doc, dict) and "steps" in doc:
        return "replay", doc
    raise ConfigError(
        f"{path}: expected the JSON of `itercast search --json` (field `plans`) or `itercast replay --json` "
        f"(field `steps`); got {type(doc).__name__}"
        + (f" with fields {', '.join(map(str, list(doc)[:8]))}" if isinstance(doc, dict) and doc else "")
    )


def result_figures(path: Path) -> tuple[str, dict[str, float], dict[str, str]]:
    """The figures `itercast compare` sets side by side for a saved result: a search's fastest plan,
    a replay's span, its what-if's span and breakdown (where it ran one) and mean step; and what the result
    names of its job ({"model": …, "system": …}, those it names: predict_cmds.different_jobs_note reads them)."""
    kind, doc = read_result(path)
    identity = {k: v for k, v in doc.items() if k in ("model", "system") and isinstance(v, str)}
    if kind == "search":
        need = ("step_time_s", "tokens_per_s", "mfu", "memory_per_gpu_bytes", "breakdown")
        best = _fields(path, "plans[0]", doc["plans"][0], need)
        figures = {k: best[k] for k in need[:-1]}
        breakdown_doc = best["breakdown"]
    elif kind == "sharding":  # a DLRM's fastest sharding; `shard` gives its breakdown, `search` its throughput
        best = _fields(path, "plans[0]", doc["plans"][0], ("step_time_s", "memory_per_gpu_bytes"))
        figures = {k: best[k] for k in ("step_time_s", "samples_per_s", "memory_per_gpu_bytes") if k in best}
        if isinstance(doc.get("world_size"), int) and isinstance(doc.get("batch_per_rank"), int):
            figures["samples_per_step"] = doc["world_size"] * doc["batch_per_rank"]
        breakdown_doc = best.get("breakdown")
        if breakdown_doc is None:
            return kind, _numbers(path, figures), identity
    else:
        steps = [_fields(path, f"steps[{i}]", s, ("measured_s", "replayed_s")) for i, s in enumerate(doc["steps"])]
        row = _fields(path, "the result", doc, ("replayed_span_s", "breakdown"))
        figures = {"replayed_span_s": row["replayed_span_s"]}
        if "whatif_span_s" in doc:  # a replay with a what-if: its span is the figure that moved
            figures["whatif_span_s"] = doc["whatif_span_s"]
        if steps:
            figures["mean_step_measured_s"] = sum(s["measured_s"] for s in steps) / len(steps)
            figures["mean_step_replayed_s"] = sum(s["replayed_s"] for s in steps) / len(steps)
        breakdown_doc = row["breakdown"]
        if "whatif_breakdown" in doc:  # and the what-if's parts, which moved with its span
            moved = _fields(path, "whatif_breakdown", doc["whatif_breakdown"], tuple(rep.PARTS))
            figures |= {f"whatif_breakdown.{k}": moved[k] for k in rep.PARTS}
    parts = _fields(path, "breakdown", breakdown_doc, tuple(rep.PARTS))
    figures |= {f"breakdown.{k}": parts[k] for k in rep.PARTS}
    return kind, _numbers(path, figures), identity


def work_per_step(figures: dict[str, float]) -> tuple[float, str] | None:
    """What one step of a saved result trains (result_figures): a sharding's samples, else a search's tokens or
    samples (its throughput × its step); None where the result does not say (a replay)."""
    if "samples_per_step" in figures:
        return figures["samples_per_step"], "samples"
    for rate, unit in (("tokens_per_s", "tokens"), ("samples_per_s", "samples")):
        if rate in figures and "step_time_s" in figures:
            return figures[rate] * figures["step_time_s"], unit
    return None


def _numbers(path: Path, figures: dict[str, Any]) -> dict[str, float]:
    """A saved result's figures (times, rates, bytes, shares: none below 0 or infinite) as floats; one error
    naming every field that is not such a number."""
    bad = [
        f"{k} ({v!r:.20})"
        for k, v in figures.items()
        if not isinstance(v, int | float) or isinstance(v, bool) or not 0 <= v < math.inf
    ]
    if bad:
        raise ConfigError(f"{path}: expected finite numbers ≥ 0 in {', '.join(bad)}")
    return {k: float(v) for k, v in figures.items()}


def _result_sections(path: Path) -> tuple[str, str, list[rep.Section]]:
    """Sections of a saved search or replay JSON; every missing field is named."""
    kind, doc = read_result(path)
    sections = {"search": _search_sections, "sharding": _sharding_sections, "replay": _replay_sections}
    return sections[kind](path, doc)


def _fields(path: Path, where: str, item: Any, names: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise ConfigError(f"{path}: {where}: expected an object; got {type(item).__name__}")
    missing = [n for n in names if n not in item]
    if missing:
        raise ConfigError(f"{path}: {where}: missing field {', '.join(missing)}")
    return item


def _search_sections(path: Path, doc: dict[str, Any]) -> tuple[str, str, list[rep.Section]]:
    """A transformer's saved `search --json`: its plans in the terminal's columns (search_cmds.plan_rows),
    every field they need named where missing, and its time × memory front."""
    from itercast.cli.search_cmds import plan_rows

    moe = doc.get("model_is_moe") is True
    numbers = ("step_time_s", "fast_step_time_s", "memory_per_gpu_bytes", "tokens_per_s", "gpu_hours_per_token", "mfu")
    need = ("plan", "num_gpus", *numbers, "fits")
    need_plan: tuple[str, ...] = ("data_parallel", "tensor_parallel", "pipeline_parallel", "context_parallel")
    need_plan += ("virtual_pipeline", "global_batch_size", "micro_batch_size", "schedule", "zero_stage", "recompute")
    need_plan += ("sequence_parallel", "overlap_grad_reduce", "overlap_param_gather")
    need_plan += ("expert_parallel", "expert_tensor_parallel") * moe
    plans = [_fields(path, f"plans[{i}]", p, need) for i, p in enumerate(doc["plans"])]
    sampled = "distribution" in plans[0]
    for i, r in enumerate(plans):
        _fields(path, f"plans[{i}].plan", r["plan"], need_plan)
        _numbers(path, {f"plans[{i}].{k}": r[k] for k in numbers})
        if sampled:
            _fields(path, f"plans[{i}]", r, ("distribution", "deterministic_rank"))
            if r["distribution"]:
                d = _fields(path, f"plans[{i}].distribution", r["distribution"], ("p50_s", "p95_s", "p99_s", "mean_s"))
                _numbers(path, {f"plans[{i}].distribution.{k}": v for k, v in d.items()})
    front = [
        _fields(path, f"pareto_time_memory[{i}]", p, ("fast_step_time_s", "memory_per_gpu_bytes"))
        for i, p in enumerate(doc.get("pareto_time_memory", []))
    ]
    headers, rows = plan_rows(plans, moe)
    counts = ", ".join(
        f"{doc[k]:,} {label}"
        for k, label in (("evaluated", "plans generated"), ("valid", "valid"), ("fitting", "fit"))
        if isinstance(doc.get(k), int)
    )
    ranked = ranked_as(str(doc.get("objective") or "step"))
    if doc.get("token_budget") is not None:
        counts += f"; token budget {doc['token_budget']:,.0f}"
    sections = [
        rep.Section(f"{ranked.capitalize()} plans (graph simulation)", rep.table_html(headers, rows)),
        rep.Section("Step time against memory per GPU", rep.pareto_svg(plans, front or plans[:1])),
    ]
    return f"itercast search: the {ranked} plans", f"{path.name}: {_job_named(doc)}{counts}", sections


def _job_named(doc: dict[str, Any]) -> str:
    """The 'MODEL on SYSTEM: ' of a saved result that names them; '' for results saved before they did."""
    model, system = doc.get("model"), doc.get("system")
    return f"{model} on {system}: " if isinstance(model, str) and isinstance(system, str) else ""


def _sharding_sections(path: Path, doc: dict[str, Any]) -> tuple[str, str, list[rep.Section]]:
    """A DLRM's saved `search --json` or `shard --json`: its shardings, fastest first."""
    need = ("tables", "step_time_s", "memory_per_gpu_bytes", "fits")
    plans = [_fields(path, f"plans[{i}]", p, need) for i, p in enumerate(doc["plans"])]
    rows = []
    for i, r in enumerate(plans, 1):
        tables = [
            _fields(path, f"plans[{i - 1}].tables[{j}]", t, ("name", "strategy", "ranks"))
            for j, t in enumerate(r["tables"])
        ]
        placed = "; ".join(f"{t['name']} {t['strategy']} {','.join(map(str, t['ranks']))}" for t in tables)
        rows.append(
            (
                i,
                r.get("batch_per_rank", doc.get("batch_per_rank", "")),
                _ms(r["step_time_s"]),
                f"{r['samples_per_s']:,.0f}" if "samples_per_s" in r else "",
                f"{r['memory_per_gpu_bytes'] / 2**30:.2f}" + ("" if r["fits"] else " OOM"),
                placed,
            )
        )
    headers = ["#", "batch per GPU", "ms/step", "samples/s", "GiB", "tables: strategy, ranks"]
    subtitle = f"{path.name}: {doc.get('model', 'DLRM')} on {doc.get('world_size', '?')} GPUs"
    subtitle += f" ({doc['system']})" if isinstance(doc.get("system"), str) else ""
    if isinstance(doc.get("evaluated"), int):
        subtitle += f", {doc['evaluated']:,} shardings priced"
    return (
        "itercast: the fastest embedding shardings",
        subtitle,
        [rep.Section("Fastest shardings (each rank's step simulated)", rep.table_html(headers, rows))],
    )


def _replay_sections(path: Path, doc: dict[str, Any]) -> tuple[str, str, list[rep.Section]]:
    steps = [
        _fields(path, f"steps[{i}]", s, ("rank", "step", "measured_s", "replayed_s"))
        for i, s in enumerate(doc["steps"])
    ]
    runs = [
        _fields(path, f"critical_path[{i}]", r, ("family", "start_s", "end_s"))
        for i, r in enumerate(doc.get("critical_path", []))
    ]
    whatif = any("whatif_s" in s for s in steps)  # a what-if that kept the ranks: its step beside each
    rows = [
        (
            s["rank"],
            s["step"],
            _ms(s["measured_s"]),
            _ms(s["replayed_s"]),
            f"{s.get('error', 0.0):+.2%}",
            s.get("bound", ""),
            *((_ms(s.get("whatif_s")),) if whatif else ()),
        )
        for s in steps
    ]
    headers = ["rank", "step", "measured ms", "replayed ms", "error", "bound", *(["what-if ms"] if whatif else [])]
    sections = [
        rep.Section(
            "Measured vs replayed, per step",
            (rep.replay_steps_svg(steps) if steps else "<p>No step marks in the trace.</p>")
            + rep.table_html(headers, rows),
        ),
    ]
    if "whatif_changes" in doc or "whatif_steps" in doc:
        sections.append(_whatif_section(path, doc))
    if runs:
        sections.append(
            rep.Section(
                "Critical path by kernel class", rep.seconds_by_family_svg(runs, "seconds on the critical path")
            )
        )
    files = ", ".join(Path(str(f)).name for f in doc.get("files", [])) or path.name
    return "itercast replay: measured vs replayed", f"{files}: {doc.get('events', '?')} events", sections


def _ms(seconds: Any) -> str:
    """Seconds as milliseconds to the microsecond, as `replay` prints them; "" where not a number."""
    return f"{seconds * 1e3:.3f}" if isinstance(seconds, int | float) and not isinstance(seconds, bool) else ""


def _whatif_section(path: Path, doc: dict[str, Any]) -> rep.Section:
    """A replay's what-if: what it changed (`whatif_changes`), its span against the replay's, and the new
    stages' steps where it re-staged the pipeline (`whatif_steps`)."""
    changes = doc.get("whatif_changes") or {}
    if not isinstance(changes, dict):
        raise ConfigError(f"{path}: whatif_changes: expected an object; got {type(changes).__name__}")
    span = (
        f"<p>What-if span {_ms(doc['whatif_span_s'])} ms; replayed {_ms(doc.get('replayed_span_s'))} ms.</p>"
        if "whatif_span_s" in doc
        else ""
    )
    body = span + rep.table_html(["what the what-if changed", "count"], sorted(changes.items()))
    restaged = [
        _fields(path, f"whatif_steps[{i}]", s, ("rank", "step", "whatif_s"))
        for i, s in enumerate(doc.get("whatif_steps") or [])
    ]
    if restaged:
        rows = [(s["rank"], s["step"], _ms(s["whatif_s"])) for s in restaged]
        body += rep.table_html(["new stage", "step", "what-if ms"], rows)
    return rep.Section("What-if (not measured)", body)
