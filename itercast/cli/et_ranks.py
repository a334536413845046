"""`itercast predict --et` over every rank of a distributed step (traces/et_step.py): per-rank and
slowest-rank iteration, seconds per family, the unpriced operators with their share of the host and
GPU time, and with --kineto each rank's measured step beside its prediction, under host overheads
from another trace (a calibration's, or the defaults) and from the run's own Kineto traces.

Runtime calls per operator (HostOverheads.calls_per_op): the host source's; with --kineto of several
ranks, rank r's are counted on the OTHER ranks' Kineto traces (leave one rank out: the same software,
never rank r's own calls) where they saw the operator, and every rank is predicted under rank r's
model to give rank r's figure (et_step.predict_each_rank), as validation/dlrm_traces.py does for its
"other wl, calls LOO" column. --measured-starts starts each rank at its measured start
(rendezvous.measured_starts_s, from the --kineto traces): the "+starts" columns there."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np

from itercast.cli.app import console, echo_json, fail, same_gpu_kind, warn, warn_other_system
from itercast.cli.et_cmds import print_family_table, unmoved_indices_note
from itercast.config.system import SystemConfig
from itercast.errors import ConfigError
from itercast.profile.calibrate import HOST_DEVICE_CPU
from itercast.traces.et_step import RankStep
from itercast.traces.execution_trace import ExecutionTrace, matched_link, other_process_note
from itercast.traces.host_overheads import HostOverheads
from itercast.traces.kineto import RankTrace
from itercast.workloads.dlrm import unmeasured_lookups

UNPRICED_WARN_SHARE = 0.01  # more than 1% of a rank's GPU time unpriced: the prediction misses it


def world_of(traces: list[ExecutionTrace]) -> int:
    """The ranks of the step: the traces given, checked against the all-to-all split lists in each
    (one split per rank); a single trace takes its splits' count (1 without any). ConfigError when
    a trace names another rank count than its peers."""
    from itercast.costs.dist_ops import COLLECTIVES

    seen = {}
    for et in traces:
        sizes = {
            len(v) for n in et.nodes if n.name in COLLECTIVES for v in n.input_lists[3:5] if isinstance(v, list) and v
        }
        if len(sizes) > 1:
            raise ConfigError(f"{et.path}: all-to-all splits name {sorted(sizes)} ranks; expected one rank count")
        seen[et.path] = sizes.pop() if sizes else None
    world = len(traces) if len(traces) > 1 else (seen[traces[0].path] or 1)
    for path, n in seen.items():
        if n is not None and n != world:
            raise ConfigError(f"{path}: its all-to-all splits name {n} ranks; expected {world} (the traces given)")
    return world


def other_device_note(db: Path, fingerprint: Any, system: SystemConfig) -> str | None:
    """A warning when the profiling database's device (its fingerprint: `device` cuda or cpu, `gpu` the CUDA name; an
    imported table's `device` the table's own name of it)
    is not the system's GPU, whose family name (H100 of H100-SXM5-80GB) its CUDA name does not hold: the operators
    its models cover keep the profiled device's times while the rest is priced on the system; None when they agree."""
    fp = fingerprint if isinstance(fingerprint, dict) else {}
    kind = fp.get("device")
    if kind == "cpu":
        device, profiled = HOST_DEVICE_CPU, f"a CPU ({fp.get('cpu', 'unnamed')})"
    else:  # a CUDA device by its name; an imported table's device as the table names it (OpenXLA's sm_90)
        device = str(fp.get("gpu") or (kind if kind != "cuda" else "") or "")
        profiled = device or "an unnamed device"
    if same_gpu_kind(device, system):
        return None
    return (
        f"{db} profiled {profiled}; the system here is {system.name!r} ({system.gpu.name}): the operators its models "
        "cover keep that device's times, the rest is priced on the system"
    )


def predict_ranks(
    files: list[Path],
    traces: list[ExecutionTrace],
    kinetos: list[Path],
    db: Path | None,
    device_id: int | None,
    system: str,
    calibration: Path | None,
    alpha: float,
    sample: np.ndarray | None,
    as_json: bool,
    measured_starts: bool = False,
) -> None:
    """`predict --et` over every rank (module docstring)."""
    from itercast.cli.calibration_cmds import measured_elsewhere_note
    from itercast.config.job import load_system
    from itercast.costs.analytic import AnalyticCostModel
    from itercast.costs.dist_ops import DistOpError
    from itercast.costs.fitting import geomean_abs_err
    from itercast.costs.op_model import OperatorCostModel, fit_operator_models
    from itercast.hardware.topology import place_group
    from itercast.measurements import ProfileError
    from itercast.profile.calibrate import CalibrationError, has_curves, load_calibration
    from itercast.profile.db import ProfileDB
    from itercast.traces.et_pricing import ETPricer
    from itercast.traces.et_step import predict_each_rank
    from itercast.traces.host_overheads import (
        DEFAULT_HOST_OVERHEADS,
        HostOverheadError,
        left_out,
        measure,
        with_calls_of,
    )
    from itercast.traces.kineto import TraceError, read_kineto
    from itercast.traces.rendezvous import measured_starts_s

    if measured_starts and not kinetos:
        fail("--measured-starts: each rank's start is read from its Kineto trace; give --kineto (one per rank)")
    try:
        sys_cfg = load_system(system)
        cal = load_calibration(calibration) if calibration else None
        host, host_source = DEFAULT_HOST_OVERHEADS, "defaults (three other traces, host_overheads.py)"
        if cal is not None and "host_overheads" in cal:
            host, host_source = HostOverheads.from_dict(cal["host_overheads"]), f"{calibration}"
        costs = AnalyticCostModel(sys_cfg, "fp32", cal)  # TorchRec DLRMs train in fp32 (workloads/dlrm.py)
        ops, elsewhere = None, None
        if db is not None:
            profile = ProfileDB(db, readonly=True)
            dev = profile.choose_device(device_id, "--device-id")
            ops = OperatorCostModel(fit_operator_models(list(profile.measurements(device_id=dev))))
            elsewhere = measured_elsewhere_note(db, profile, dev, sys_cfg)
        group = place_group(world_of(traces), 1, sys_cfg.node.gpus_per_node)
        runs = [read_kineto(k) for k in kinetos]
        starts = measured_starts_s(runs) if measured_starts else None
        hosts, calls_source = [host] * len(traces), host_source if host.calls_per_op else "none counted"
        if len(runs) > 1:
            hosts = [with_calls_of(host, m) for m in left_out(runs)]
            calls_source = "the other ranks' Kineto traces (leave one rank out)"

        made: list[ETPricer] = []

        def pricers() -> list[ETPricer]:
            made.extend(ETPricer(costs, ops, sample, alpha) for _ in traces)
            return made[-len(traces) :]

        def run(models: list[HostOverheads]) -> list[RankStep]:
            return predict_each_rank(traces, pricers, models, group, starts)

        steps = run(hosts)
        measured = [kineto_step_s(k) for k in runs]
        own = run([measure(runs)] * len(traces)) if runs else None
        gpu_us = [_gpu_us_by_node(et, k) for et, k in zip(traces, runs, strict=True)] if runs else None
    except (ConfigError, DistOpError, TraceError, ProfileError, CalibrationError, HostOverheadError, ValueError) as exc:
        fail(" ".join(str(exc).split()))
    if cal is not None and calibration is not None:
        warn_other_system(calibration, cal, sys_cfg)
    if elsewhere is not None:
        warn(elsewhere)
    for et, k in zip(traces, runs, strict=True) if runs else ():
        if note := other_process_note(et, k):
            warn(note)
    streamed = any(m == "analytic:embedding" for s in steps for m in s.calls_by_model)
    if streamed and (note := unmeasured_lookups(sys_cfg.gpu.name, None)):  # as shard and predict say it (probe 12)
        warn(note)
    if db is not None and not any(m.startswith("db:") for s in steps for m in s.calls_by_model):
        warn(f"{db}: none of its operator models prices an operator of these traces: every price is {system}'s")
    if (sample is not None or alpha) and not any(p.moved_by_indices for p in made):
        why = (
            f"the traces' embedding lookups and updates are priced as memory traffic on {sys_cfg.gpu.name} (no lookup "
            "model for it: a --db with `itercast profile` embedding microbenchmarks prices the indices' reuse), or "
            "have none"
        )
        warn(unmoved_indices_note(sample, why))
    # calibrated curves and profiled operator models priced beyond the sizes they were fitted on
    extrapolated = costs.extrapolations() + (ops.extrapolations() if ops is not None else [])
    for note in extrapolated:
        warn(note)
    ranks = [
        _rank_doc(s, measured[r] if measured else None, own[r] if own else None, gpu_us[r] if gpu_us else None)
        for r, s in enumerate(steps)
    ]
    doc = {
        "system": system,
        "ranks": ranks,
        "slowest_rank_iteration_s": max(s.iteration_s for s in steps),
        "host_overheads": host_source,
        "runtime_calls": calls_source,
        "measured_starts_s": starts,
        "costs": ("analytic" if not has_curves(cal) else f"{calibration}'s curves")
        + (f" refined by {db}" if db else ""),
        "extrapolated": extrapolated,
    }
    if measured:
        pred, meas = np.array([s.iteration_s for s in steps]), np.array([m[0] for m in measured])
        doc["kineto_geomean_abs_error"] = geomean_abs_err(pred, meas)
    for r, rank in enumerate(ranks):
        share = rank["unpriced_gpu_share"]
        if share is None and rank["unpriced"]:
            warn(f"{files[r]}: {len(rank['unpriced'])} operators unpriced; their GPU time is unknown without --kineto")
        elif share is not None and share > UNPRICED_WARN_SHARE:
            warn(f"{files[r]}: {share:.1%} of the measured GPU time is in operators no model prices")
    if as_json:
        echo_json(doc)
        return
    _print(doc, steps)


def kineto_step_s(t: RankTrace) -> tuple[float, float]:
    """(median ProfilerStep seconds, GPU busy seconds) of a Kineto trace; TraceError without steps."""
    from itercast.traces.kineto import TraceError

    if not t.steps:
        raise TraceError(f"{t.path}: no ProfilerStep marks to check the prediction against")
    return statistics.median(s[3] for s in t.steps) * 1e-6, float(t.op_dur_us.sum()) * 1e-6


def _gpu_us_by_node(et: ExecutionTrace, k: RankTrace) -> dict[int, float]:
    """Measured GPU µs per ET node, through the Kineto link of the pair (matched_link)."""
    tl = matched_link(et, k)
    out: dict[int, float] = {}
    for op in range(k.num_ops):
        node = tl.node_of_gpu_op(et, op)
        if node is not None:
            out[node.id] = out.get(node.id, 0.0) + float(k.op_dur_us[op])
    return out


def _rank_doc(
    s: RankStep, measured: tuple[float, float] | None, own: RankStep | None, gpu_us: dict[int, float] | None
) -> dict[str, Any]:
    gpu_total_us = sum(gpu_us.values()) if gpu_us else 0.0
    unpriced = []
    for name, e in sorted(s.unpriced.items()):
        gpu = sum(gpu_us.get(i, 0.0) for i in e["node_ids"]) * 1e-6 if gpu_us is not None else None
        unpriced.append(
            {
                "name": name,
                "calls": e["calls"],
                "cpu_s": e["cpu_s"],
                "cpu_share": e["cpu_s"] / s.host_s if s.host_s else 0.0,
                "gpu_s": gpu,
                "gpu_share": gpu / (gpu_total_us * 1e-6) if gpu is not None and gpu_total_us else None,
            }
        )
    known = [u["gpu_share"] for u in unpriced if u["gpu_share"] is not None]
    doc: dict[str, Any] = {
        "path": s.path,
        "iteration_s": s.iteration_s,
        "host_s": s.host_s,
        "seconds_by_family": s.seconds_by_family,
        "calls_by_model": dict(s.calls_by_model),
        "unpriced": unpriced,
        "unpriced_gpu_share": sum(known) if gpu_us is not None else None,
        "default_call_ops": dict(s.default_calls),
    }
    if measured is not None:
        step_s, busy_s = measured
        doc["kineto"] = {"step_s": step_s, "gpu_busy_s": busy_s, "error": s.iteration_s / step_s - 1}
    if own is not None and measured is not None:
        doc["own_trace_overheads"] = {"iteration_s": own.iteration_s, "error": own.iteration_s / measured[0] - 1}
    return doc


def _print(doc: dict[str, Any], steps: list[RankStep]) -> None:
    console.print(
        f"{len(steps)} rank(s) on {doc['system']} ({doc['costs']}; host overheads: {doc['host_overheads']}): "
        f"slowest rank {doc['slowest_rank_iteration_s'] * 1e3:.3f} ms per iteration",
        highlight=False,
    )
    starts = doc["measured_starts_s"]
    when = "measured starts (ms): " + " ".join(f"{x * 1e3:.3f}" for x in starts) if starts else "every rank starts at 0"
    console.print(
        f"runtime calls per operator: {doc['runtime_calls']}; "
        f"{sum(doc['ranks'][0]['default_call_ops'].values())} operators of rank 0 at the default 1 call per launch; "
        + when,
        highlight=False,
    )
    for r, rank in enumerate(doc["ranks"]):
        line = f"rank {r} ({Path(rank['path']).name}): {rank['iteration_s'] * 1e3:.3f} ms"
        if "kineto" in rank:
            k, gpu_s = rank["kineto"], sum(rank["seconds_by_family"].values())
            line += f", measured step {k['step_s'] * 1e3:.3f} ms ({k['error']:+.1%}); GPU busy {gpu_s * 1e3:.3f} ms"
            line += f" predicted, {k['gpu_busy_s'] * 1e3:.3f} ms measured"
        if "own_trace_overheads" in rank:
            o = rank["own_trace_overheads"]
            line += f"; overheads measured on these traces, the ranks pooled: {o['iteration_s'] * 1e3:.3f} ms"
            line += f" ({o['error']:+.1%})"
        console.print(line, highlight=False)
    if "kineto_geomean_abs_error" in doc:
        console.print(f"per rank geomean |error| {doc['kineto_geomean_abs_error']:.1%}", highlight=False)
    print_family_table({"host": steps[0].host_s, **steps[0].seconds_by_family})
    for u in doc["ranks"][0]["unpriced"]:
        console.print(f"unpriced: {u['name']} × {u['calls']} (host {u['cpu_share']:.1%})", highlight=False)
