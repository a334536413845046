"""`itercast predict --et`: execution traces priced, one rank (a profiled device) or every rank of a
distributed step (TorchRec / FBGEMM / c10d) on a system preset's cost models, a database refining them.

Which model: a single trace of `aten::` operators with --db and no --system is the operator model of
traces/iteration_model.py (CPU, or --gpu two clocks); anything with --system, several ranks, or a
trace holding FBGEMM or c10d operators is the distributed step of traces/et_step.py (--gpu implied).
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from itercast.cli.app import console, echo_json, fail, warn
from itercast.costs.aten_ops import OpFeatures
from itercast.errors import ConfigError
from itercast.traces.execution_trace import ExecutionTrace


def trace_files(paths: list[Path], option: str) -> list[Path]:
    """Files of the paths given (a directory: its *.json and *.json.gz), in natural order of name
    (rank 2 before rank 10)."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = [f for f in p.iterdir() if f.name.endswith((".json", ".json.gz"))]
            if not found:
                fail(f"{option} {p}: a directory without *.json or *.json.gz traces")
            out += sorted(found, key=_natural)
        else:
            out.append(p)
    return out


def _natural(p: Path) -> list[Any]:
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", p.name)]


def index_distribution_alpha(distribution: str) -> float:
    """`uniform` → 0, `zipf:ALPHA` → ALPHA (0 ≤ ALPHA ≤ 10); fails on anything else."""
    kind, _, value = distribution.partition(":")
    try:
        alpha = float(value) if kind == "zipf" else 0.0
    except ValueError:
        alpha = math.nan
    if (
        kind not in ("uniform", "zipf")
        or not math.isfinite(alpha)
        or not 0 <= alpha <= 10
        or (kind == "zipf") != bool(value)
    ):
        fail(f"--index-distribution: expected uniform or zipf:ALPHA with 0 ≤ ALPHA ≤ 10; got {distribution!r}")
    return alpha


def load_index_sequence(path: Path) -> np.ndarray:
    """--indices: a sample of real embedding indices in their order (workloads/dlrm.read_index_sequence),
    none negative."""
    from itercast.workloads.dlrm import read_index_sequence

    idx = read_index_sequence(path, f"--indices {path}")
    if int(idx.min()) < 0:
        raise ConfigError(f"--indices {path}: negative indices; expected rows ≥ 0")
    return idx


def predict_et(
    ets: list[Path],
    db: Path | None,
    device_id: int | None,
    gpu: bool,
    distribution: str,
    kinetos: list[Path],
    as_json: bool,
    system: str | None = None,
    calibration: Path | None = None,
    indices: Path | None = None,
    measured_starts: bool = False,
) -> None:
    """`predict --et` (module docstring)."""
    from itercast.costs.dist_ops import COLLECTIVES, is_tbe
    from itercast.traces.execution_trace import read_execution_trace
    from itercast.traces.kineto import TraceError

    alpha = index_distribution_alpha(distribution)
    files, kfiles = trace_files(ets, "--et"), trace_files(kinetos, "--kineto")
    try:
        traces = [read_execution_trace(f) for f in files]
        sample = load_index_sequence(indices) if indices else None
    except (TraceError, ConfigError) as exc:
        fail(str(exc))
    distributed = any(n.name in COLLECTIVES or is_tbe(n.name) for et in traces for n in et.nodes)
    if system is None and len(traces) == 1 and not distributed and calibration is None:
        if db is None:
            fail("--et needs --db (the profiled device) or --system (a preset whose cost models price it)")
        if measured_starts:
            fail("--measured-starts: starts the ranks of a distributed step; give --system NAME to price one")
        kineto = kfiles[0] if kfiles else None
        predict_single(files[0], traces[0], db, device_id, gpu, (distribution, alpha), sample, kineto, as_json)
        return
    if system is None:
        fail(f"--et {files[0]}: a distributed or TorchRec trace needs --system NAME (see `itercast presets`)")
    if kfiles and len(kfiles) != len(files):
        fail(f"--kineto: {len(kfiles)} traces for {len(files)} execution traces; expected one per rank")
    from itercast.cli.et_ranks import predict_ranks

    if gpu:  # user probe 12: it changed nothing here, without a word
        warn("--gpu changes nothing here: a distributed or --system step prices its host and GPU on two clocks always")
    predict_ranks(files, traces, kfiles, db, device_id, system, calibration, alpha, sample, as_json, measured_starts)


def unmoved_indices_note(sample: np.ndarray | None, why: str) -> str:
    """The warning where the indices asked for (--indices' sample, else --index-distribution) move no price: `why`."""
    return f"{'--indices' if sample is not None else '--index-distribution'} moves no price here: {why}"


def predict_single(
    path: Path,
    et: ExecutionTrace,
    db: Path,
    device_id: int | None,
    gpu: bool,
    distribution: tuple[str, float],
    sample: np.ndarray | None,
    kineto: Path | None,
    as_json: bool,
) -> None:
    """One trace on the operator models fitted on a profiling database (traces/iteration_model.py);
    embedding bags priced for the index distribution asked for, or a real sample in its order.
    With `kineto`, the same run's Kineto trace is what the prediction is checked against: its GPU
    busy time (kernels, copies, memsets) against the predicted kernel time when it holds GPU
    activity (a profiler slows the host, not the kernels), else its median ProfilerStep against
    the predicted iteration."""
    from itercast.costs.index_stats import IndexStats
    from itercast.costs.op_model import OperatorCostModel, fit_operator_models
    from itercast.measurements import ProfileError
    from itercast.profile.db import ProfileDB
    from itercast.traces.execution_trace import matched_link
    from itercast.traces.iteration_model import predict_iteration
    from itercast.traces.kineto import TraceError, read_kineto

    named, alpha = distribution
    asked: list[int] = []  # the embedding operators priced at the indices asked for

    def index(node: object, f: OpFeatures) -> IndexStats:
        asked.append(1)
        rows, lookups = int(f.dims["rows"]), int(f.dims["lookups"])
        row_bytes = f.dims["table_bytes"] / max(rows, 1)
        if sample is not None:
            return IndexStats.from_sequence(sample, lookups, row_bytes)
        return IndexStats.zipf(rows, lookups, alpha, row_bytes)

    try:
        profile = ProfileDB(db, readonly=True)
        dev = profile.choose_device(device_id, "--device-id")
        fingerprint = next((fp for i, _, fp in profile.devices() if i == dev), {})
        if not gpu and isinstance(fingerprint, dict) and fingerprint.get("device") == "cuda":
            warn(
                f"{db} profiled a GPU: without --gpu the host's and the kernels' times add up on one clock, as on a "
                "CPU; --gpu prices them on two clocks, the host launching ahead of the GPU"
            )
        model = OperatorCostModel(fit_operator_models(list(profile.measurements(device_id=dev))))
        pred = predict_iteration(et, model, index, gpu=gpu)
        check: dict[str, float | str] = {}
        if kineto is not None:
            measured = read_kineto(kineto)
            matched_link(et, measured)  # the same run's trace, or no check against it
            if measured.num_ops:
                seen, priced = float(measured.op_dur_us.sum()) * 1e-6, sum(pred.kernel_s_by_family.values())
                check["what"] = "GPU busy"
            elif measured.steps:
                seen, priced = statistics.median(s[3] for s in measured.steps) * 1e-6, pred.total_s
                check["what"] = "step"
            else:
                raise TraceError(
                    f"{kineto}: neither GPU activity nor ProfilerStep marks to check the prediction against"
                )
            check |= {"measured_s": seen, "predicted_s": priced, "error": priced / seen - 1}
    except (ProfileError, TraceError, ConfigError, ValueError) as exc:
        fail(str(exc))
    # operator models priced beyond the sizes their profile's rows spanned
    extrapolated = model.extrapolations()
    for note in extrapolated:
        warn(note)
    if (sample is not None or alpha) and not asked:
        why = f"{db.name} has no model of the trace's embedding operators that reads the indices"
        warn(unmoved_indices_note(sample, f"{why} (or the trace has none)"))
    out = {
        "iteration_s": pred.total_s,
        "host_s": pred.host_s,
        "kernel_s_by_family": pred.kernel_s_by_family,
        "calls_by_category": dict(pred.calls_by_category),
        "index_distribution": "sample" if sample is not None else named,
        "device_id": dev,
        "extrapolated": extrapolated,
    }
    if check:
        out["kineto_check"] = check
    if as_json:
        echo_json(out)
        return
    console.print(
        f"{path.name} on device {dev} of {db.name}: {pred.total_s * 1e3:.3f} ms per iteration", highlight=False
    )
    if check:
        console.print(
            f"{check['what']} in {kineto}: measured {seen * 1e3:.3f} ms, predicted {priced * 1e3:.3f} ms "
            f"({priced / seen - 1:+.1%})",
            highlight=False,
        )
    print_family_table({"host": pred.host_s, **pred.kernel_s_by_family})


def print_family_table(seconds: dict[str, float]) -> None:
    """Seconds per part, largest first, in ms."""
    table = Table(show_header=False, box=None)
    for part, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        table.add_row(part, f"{s * 1e3:.3f} ms")
    console.print(table)
