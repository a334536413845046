"""Calibrate the cost model's curves on a profiling database, and check them on held-out rows.

A calibration file is JSON in the schema of the built-in costs/curves.json plus a header
({"format": "itercast-calibration", "version": "3", "system": ..., "device": ...}), and optionally
a "host_overheads" section (T1–T5 measured from Kineto traces, traces/host_overheads.py); the cost model
merges it over the built-in curves (`AnalyticCostModel(system, dtype, curves=...)`). Only the
families the database covers are written. The curves are relative to the peaks of `system`, so
calibrate with the system the measurements were taken on (e.g. cpu-host for this machine).

`report` runs K-fold cross-validation per family: each fold is predicted by (a) the curve refitted
on the other folds, (b) the uncalibrated analytic model, (c) a straight line t = a + b·size fitted
on the other folds (the predictive model of pipeDejavu), as geomean |predicted/measured − 1|.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from itercast.config.system import SystemConfig
from itercast.costs.analytic import BUS_FACTOR, AnalyticCostModel, bus_bytes
from itercast.costs.curves import curve, curves
from itercast.costs.fitted_ranges import MEASURED_RANGE
from itercast.costs.fitting import (
    collective_time_s,
    eff,
    fit_collective,
    fit_latency_curve,
    fit_lookup_linear,
    geomean_abs_err,
)
from itercast.costs.op_model import fit_operator_models
from itercast.errors import ConfigError
from itercast.hardware.topology import GroupPlacement
from itercast.measurements import Measurement
from itercast.profile.db import ProfileDB
from itercast.traces.host_overheads import HostOverheadError, HostOverheads
from itercast.user_files import read_json_file, write_output

#: version 3: norms are shape models (operator family "norm"), embedding-bag backward has a term per
#: byte of distinct rows, operators may carry host issue times (host_issue_s) and host costs a launch
#: term. Version 2: memory-bound operators and embedding-bag backward price every byte of a call at
#: or beyond their break at the higher rate (version 1: only the bytes past it); collectives may
#: carry alpha_per_peer_s. An older file is refused with the advice to re-run calibrate.
FORMAT, VERSION = "itercast-calibration", "3"
MAX_CALIBRATION_BYTES = 64 << 20  # a calibration is curves and host overheads: kilobytes
#: a measured dtype (ours, Alpa's, OpenXLA's "bf16xbf16->bf16") → the plan dtype whose peak and curve apply
PLAN_DTYPES = {
    "fp32": "fp32",
    "f32": "fp32",
    "bf16": "bf16",
    "fp16": "fp16",
    "f16": "fp16",
    "fp8": "fp8",
    "f8e4m3fn": "fp8",
    "f8e5m2": "fp8",
}
CURVE_KEYS = {"fp32": "tf32", "fp8": "fp8"}  # the cost model's choice of GEMM curve per plan dtype (bf16 otherwise)


class CalibrationError(ValueError):
    """A calibration file or request is unusable; the message says why."""


def _plan_dtype(dtype: str, where: object = "a profile") -> str:
    """The plan dtype of a GEMM row's `dtype` (bf16 where it names none); CalibrationError for a name it does not
    know, which had been taken as bf16 in silence."""
    name = dtype.split("x")[0].lower()
    if name and name not in PLAN_DTYPES:
        raise CalibrationError(f"{where}: a GEMM row's dtype {dtype!r}: expected one of {', '.join(PLAN_DTYPES)}")
    return PLAN_DTYPES.get(name, "bf16")


def _groups(db: ProfileDB, device_id: int) -> dict[tuple[str, str], list[Measurement]]:
    """Rows by (section, key): ('gemm', 'tf32'), ('memory', 'elementwise'), ('embedding', 'lookup'),
    ('intra_node', 'all_reduce'), ('inter_node', 'all_reduce')."""
    out: dict[tuple[str, str], list[Measurement]] = {}
    for m in db.measurements(device_id=device_id):
        if m.family == "gemm":
            key = ("gemm", CURVE_KEYS.get(_plan_dtype(m.dtype, db.path), "bf16"))
        elif m.family in ("elementwise", "norm"):
            key = ("memory", m.family)
        elif m.family == "embedding" and m.op == "embedding_bag_fwd":
            key = ("embedding", "lookup")  # distributions pooled: their effect enters through the reuse feature
        elif m.family == "collective" and m.op in BUS_FACTOR:
            key = ("intra_node" if m.nodes == 1 else "inter_node", m.op)
        else:
            continue
        out.setdefault(key, []).append(m)
    return out


def _rate(section: str, key: str, rows: list[Measurement], system: SystemConfig) -> np.ndarray:
    """The peak each row's curve is relative to (the same the cost model divides by)."""
    if section == "gemm":  # each row against the peak of its own dtype, as the cost model divides
        return np.array([AnalyticCostModel(system, _plan_dtype(m.dtype)).peak_flops for m in rows])
    if section in ("memory", "embedding"):
        return np.full(len(rows), system.gpu.hbm_bandwidth_bytes_per_s)
    nic = system.nic_bandwidth_per_gpu_bytes_per_s()
    in_node = [(m, _in_node_bw(m, system)) for m in rows]
    return np.array([bw if m.nodes == 1 else min(bw, m.group_size / m.nodes * nic) for m, bw in in_node])


def _placement(m: Measurement) -> GroupPlacement:
    """The group a collective was measured on: its ranks per node and, where the measurement names its ranks
    (Alpa's replica_groups), how far apart they sit in a node (what a mesh node's links depend on)."""
    per_node = max(1, m.group_size // m.nodes)
    ranks = m.params.get("replica_groups") or []
    stride = ranks[1] - ranks[0] if per_node > 1 and len(ranks) > 1 and isinstance(ranks[0], int) else 1
    return GroupPlacement(m.group_size, m.nodes, per_node, max(1, stride))


def _in_node_bw(m: Measurement, system: SystemConfig) -> float:
    """The bandwidth the measured group's GPUs in one node have for its op, as the cost model prices it
    (NodeSpec.in_node_bandwidth_bytes_per_s)."""
    group = _placement(m)
    return system.node.in_node_bandwidth_bytes_per_s(m.op, group.per_node, group.stride)


def _x(section: str, key: str, rows: list[Measurement]) -> np.ndarray:
    if section == "embedding":
        return np.array([_gathered(m) for m in rows])
    size = np.array([m.size for m in rows])
    if section in ("intra_node", "inter_node"):
        return np.array([bus_bytes(key, m.size, m.group_size, m.nodes) for m in rows])
    return size


def _aux(section: str, rows: list[Measurement], system: SystemConfig) -> np.ndarray:
    """The other features of a row: (nodes, ranks, ramp scale: collective_time_s's, as the cost model prices the
    group) for collectives, or for lookups the bytes of distinct rows of tables larger than the cache
    (system.gpu.l2_bytes), which must come from memory."""
    if section == "embedding":
        return np.array(
            [
                _gathered(m)
                * float(m.params.get("features", {}).get("unique_fraction", 1.0))
                * (m.params.get("rows", 0) * m.params.get("dim", 0) * 4 > system.gpu.l2_bytes)
                for m in rows
            ]
        )
    full = system.node.intra_node_bandwidth_bytes_per_s
    return np.array(
        [(m.nodes, m.group_size, full / _in_node_bw(m, system) if m.nodes == 1 else 1.0) for m in rows], dtype=float
    )


def _gathered(m: Measurement) -> float:
    """Bytes of every looked-up row (fp32), or the row's size when the shape is not recorded."""
    p = m.params
    return float(p["batch"] * p["pooling"] * p["dim"] * 4) if {"batch", "pooling", "dim"} <= set(p) else m.size


def _fit(section: str, x: np.ndarray, t: np.ndarray, rate: np.ndarray, aux: np.ndarray) -> dict[str, Any]:
    if section == "embedding":
        return fit_lookup_linear(x, aux, t)
    if section == "inter_node" or np.unique(aux[:, 1]).shape[0] > 1:  # groups of several sizes: their latency
        return fit_collective(x, t, aux[:, 0], rate, ranks=aux[:, 1], starts=8, ramp_scale=aux[:, 2])
    if section == "intra_node":
        return fit_collective(x, t, aux[:, 0], rate, ramp_scale=aux[:, 2])
    return fit_latency_curve(x, t, rate)


def _predict(section: str, fit: dict[str, Any], x: np.ndarray, rate: np.ndarray, aux: np.ndarray) -> np.ndarray:
    if section == "embedding":
        return fit["alpha_s"] + fit["s_per_gathered_byte"] * x + fit["s_per_missed_byte"] * aux
    if section in ("intra_node", "inter_node"):
        return collective_time_s(fit, x, aux[:, 0], aux[:, 1], rate, ramp_scale=aux[:, 2])
    return fit["alpha_s"] + x / (rate * eff(x, fit["e_max"], fit["log_half"], fit["gamma"]))


#: `host_device` of host overheads measured on traces that ran no GPU (a CPU run's, gloo's)
HOST_DEVICE_CPU = "cpu"


def host_overheads_only(overheads: HostOverheads, device: str | None = None) -> dict[str, Any]:
    """A calibration document holding only host overheads (no profiling database), with `host_device` where
    `device` says it: the GPU their traces ran (the Kineto trace's deviceProperties name), HOST_DEVICE_CPU where
    they ran none (None: not said, and no command can warn of another machine's)."""
    doc = {"format": FORMAT, "version": VERSION, "host_overheads": overheads.to_dict()}
    return doc | ({"host_device": device} if device is not None else {})


#: rows of a (family, key) a curve is refitted on at least (calibrate)
MIN_ROWS = 8


def calibrate(db: ProfileDB, device_id: int, system: SystemConfig, min_rows: int = MIN_ROWS) -> dict[str, Any]:
    """Refit every (family, key) with at least `min_rows` rows; returns the calibration document."""
    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "system": system.name,
        "device": dict(next((d for i, _, d in db.devices() if i == device_id), {})),
    }
    for (section, key), rows in sorted(_groups(db, device_id).items()):
        # lookups are priced by their operator model (`operators`, fitted below from the same rows); the
        # size-only curve is --report's comparison, which no command reads: not written
        if len(rows) < min_rows or section == "embedding":
            continue
        t, x = np.array([m.time_s for m in rows]), _x(section, key, rows)
        fit = _fit(section, x, t, _rate(section, key, rows, system), _aux(section, rows, system))
        fit[MEASURED_RANGE] = [float(x.min()), float(x.max())]  # what AnalyticCostModel.extrapolations reads
        if section in ("intra_node", "inter_node"):
            doc.setdefault("collectives", {}).setdefault(section, {})[key] = fit
        else:
            doc.setdefault(section, {})[key] = fit
    operators = fit_operator_models(list(db.measurements(device_id=device_id)))
    if operators["models"] or "host_s" in operators:
        doc["operators"] = operators
    return doc


#: an in-sample fit this far off its own rows is said when the calibration is written (its --report holds out)
POOR_FIT = 0.25
#: a curve that misses its own rows by more than this on average (100%) is refused, not written: no one kernel's
#: times scatter so (the V100's intra-node all-to-all, the worst fit of the shared data, misses by 51%)
UNUSABLE_FIT = 1.0


def _fits(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, fit) of every fitted curve of a calibration document: gemm, memory and collective curves."""
    fits = [(f"{s}.{k}", f) for s in ("gemm", "memory") for k, f in doc.get(s, {}).items()]
    fits += [(f"{p}.{k}", f) for p, group in doc.get("collectives", {}).items() for k, f in group.items()]
    return [(name, fit) for name, fit in fits if isinstance(fit, dict)]


def unusable_fits(doc: dict[str, Any]) -> list[str]:
    """The curves of `doc` that miss their own rows by more than UNUSABLE_FIT on average, one line each."""
    return [
        f"{name} misses its own rows by {fit['fit_mean_abs_err']:.3g}× their time on average"
        for name, fit in _fits(doc)
        if fit.get("fit_mean_abs_err", 0.0) > UNUSABLE_FIT
    ]


def fit_notes(db: ProfileDB, device_id: int, doc: dict[str, Any], min_rows: int = 8) -> list[str]:
    """What the written calibration leaves to the built-in curves, and fits that miss their own rows: one
    line each (a family with fewer than `min_rows` rows is not fitted; calibrate())."""
    groups = _groups(db, device_id)
    notes = [
        f"{section}.{key}: {len(rows)} rows (< {min_rows}): not fitted, the built-in curve stays"
        for (section, key), rows in sorted(groups.items())
        if len(rows) < min_rows and section != "embedding"  # lookups: their operator model's (calibrate)
    ]
    left: dict[str, int] = {}  # exchanges no curve is fitted to (other families: operator models, calibrate)
    for m in db.measurements(device_id=device_id):
        if m.family in ("collective", "p2p") and m.op not in BUS_FACTOR:
            left[f"{m.family} {m.op}"] = left.get(f"{m.family} {m.op}", 0) + 1
    notes += [f"{kind}: {n} rows, no curve fitted to them (the built-in stays)" for kind, n in sorted(left.items())]
    if doc.get("memory"):  # what no profiled family fits (a calibration's memory curves keep the built-in ones)
        notes.append(
            "memory.activation and memory.optimizer: not fitted (the activation functions' rows fit "
            "memory.elementwise): the built-in curves, at this system's bandwidth, price activations and Adam"
        )
    for key, model in sorted(doc.get("operators", {}).get("models", {}).items()):
        if (points := int(model.get("points", min_rows))) < min_rows:  # op_model fits one from 4 rows
            notes.append(
                f"operators.{key}: its model is fitted on {points} rows (< {min_rows}): it runs through them, "
                "untested between and beyond (held out: --report, from 7 rows)"
            )
    for name, fit in _fits(doc):
        if (err := fit.get("fit_mean_abs_err", 0.0)) > POOR_FIT:
            notes.append(f"{name}: its curve misses its own rows by {err:.0%} on average (held out: --report)")
        if name.startswith(("gemm.", "memory.")) and (e := fit.get("e_max", 0.0)) > 1:
            notes.append(
                f"{name}: its rows run faster than the GPU's peak (fitted efficiency {e:.2f} > 1): profiled on "
                "another GPU or clock, or times too short?"
            )
    return notes


def report(db: ProfileDB, device_id: int, system: SystemConfig, folds: int = 5, seed: int = 0) -> list[dict[str, Any]]:
    """Held-out geomean |error| per (family, key): calibrated curve, analytic model, straight line."""
    out = []
    rng = np.random.default_rng(seed)
    for (section, key), rows in sorted(_groups(db, device_id).items()):
        if len(rows) < 2 * folds:
            continue
        x, t = _x(section, key, rows), np.array([m.time_s for m in rows])
        rate, aux = _rate(section, key, rows, system), _aux(section, rows, system)
        fold = rng.permutation(len(rows)) % folds
        calibrated, line = np.empty(len(rows)), np.empty(len(rows))
        for f in range(folds):
            train, test = fold != f, fold == f
            fit = _fit(section, x[train], t[train], rate[train], aux[train])
            calibrated[test] = _predict(section, fit, x[test], rate[test], aux[test])
            a, b = np.polynomial.polynomial.polyfit(x[train], t[train], 1)
            line[test] = a + b * x[test]
        analytic = _analytic(section, key, rows, system)
        small = x <= np.quantile(x, 0.25)
        out.append(
            {
                "family": section,
                "key": key,
                "rows": len(rows),
                **{
                    name: geomean_abs_err(pred, t)
                    for name, pred in (("calibrated", calibrated), ("analytic", analytic), ("straight_line", line))
                },
                **{
                    f"{name}_smallest_quarter": geomean_abs_err(pred[small], t[small])
                    for name, pred in (("calibrated", calibrated), ("analytic", analytic), ("straight_line", line))
                },
            }
        )
    return out


def _analytic(section: str, key: str, rows: list[Measurement], system: SystemConfig) -> np.ndarray:
    model = AnalyticCostModel(system, "bf16")
    one: Callable[[Measurement], float]
    if section == "gemm":

        def one(m: Measurement) -> float:
            return float(AnalyticCostModel(system, _plan_dtype(m.dtype)).gemm_s(m.size))
    elif section in ("memory", "embedding"):

        def one(m: Measurement) -> float:
            return float(model.memory_s(key if key in model.memory else "elementwise", m.size))
    else:

        def one(m: Measurement) -> float:
            return model.collective_s(key, m.size, _placement(m))

    return np.array([one(m) for m in rows])


def write_calibration(doc: dict[str, Any], path: str | Path, inputs: Iterable[str | Path | None] = ()) -> Path:
    """The calibration as JSON (user_files.write_output: atomic, never onto an input)."""
    return write_output(path, json.dumps(doc, indent=1, sort_keys=True) + "\n", inputs)


def load_calibration(path: str | Path) -> dict[str, Any]:
    """The built-in curves with a calibration file merged over them (checked: format and version)."""
    path = Path(path)
    try:
        doc = read_json_file(path, "calibration file", MAX_CALIBRATION_BYTES)
    except (OSError, ConfigError) as exc:
        raise CalibrationError(f"{path}: not readable as a calibration file ({exc})") from None
    found = doc.get("format") if isinstance(doc, dict) else None
    if found != FORMAT:
        raise CalibrationError(f"{path}: not an itercast calibration file (format {found!r}, expected {FORMAT!r})")
    if str(doc.get("version", "")).split(".")[0] != VERSION:
        raise CalibrationError(
            f"{path}: calibration version {doc.get('version')!r}; this itercast reads "
            f"version {VERSION} — re-run `itercast calibrate` on the profiling database"
        )
    _check_curves(doc, path)
    return merge_calibration(doc, str(path))


#: a curve's ceiling, a fraction of the peak it is relative to (the built-in fits reach 1.5, a flat
#: test curve 2): more than this is no efficiency, and 0 would price every kernel at infinity
MAX_E_MAX = 4.0
#: the ranges a curve's parameters may take in a calibration file beyond finite (e_max: MAX_E_MAX above): the
#: fits span e_max 0.05–1.5, log_half 5–40 (the natural log of FLOPs or bytes at half the ceiling) and gamma
#: 0.1–4 (costs/fitting.py's bounds; a flat curve has gamma 0); beyond these the curve prices a kernel at a
#: thousand times its peak's time or more, or exp(gamma · (log_half − ln x)) overflows to an infinite step
CURVE_RANGES = {"e_max": (1e-3, MAX_E_MAX), "log_half": (-50.0, 50.0), "gamma": (0.0, 10.0)}
#: a curve's fixed latencies (alpha_s, a collective's alpha0_s and alpha_per_*_s): the fits' reach 1 ms
#: (costs/fitting.py COLLECTIVE_PARAMS); a second or more is no latency of one kernel or collective
MAX_ALPHA_S = 1.0
#: curve parameters (costs/curves.py, costs/collectives.py, the embedding's linear fit): finite numbers;
#: all but log_half (a log2 of bytes) also ≥ 0, as times, rates and efficiencies are
_PARAMETER = re.compile(r"e_max|gamma|log_half|alpha\w*|s_per_\w+|\w+_s")


#: what a calibration file may hold: its fields, and the curves of the sections whose keys the cost model reads
#: by name (a GEMM's by CURVE_KEYS' dtype, bf16 otherwise; a memory-bound kernel's by kind); a field or curve of
#: another name would be read by nothing, silently
CALIBRATION_FIELDS: tuple[str, ...] = ("format", "version", "system", "device", "gemm", "memory", "embedding")
CALIBRATION_FIELDS += ("collectives", "operators", "host_overheads", "host_device", "source")
CURVE_NAMES = {"gemm": ("bf16", "tf32", "fp8"), "memory": ("elementwise", "norm", "activation", "optimizer")}


def has_curves(merged: dict[str, Any] | None) -> bool:
    """Whether a loaded calibration (load_calibration's, merged over the built-in curves) prices anything of its
    own beyond host overheads: a system's fits (calibrate names it), GEMM or intra-node curves, operator models.
    A `calibrate --host-trace` file holds only host overheads: the built-in curves price the rest."""
    if merged is None:
        return False
    own = merged.get("gemm_calibrated") or merged.get("intra_node_calibrated") or "operators" in merged
    return merged.get("system") is not None or bool(own)


def _check_curves(doc: dict[str, Any], path: Path) -> None:
    """Every field one a calibration holds, every curve section a mapping, each curve of a name the cost model
    reads, and every curve parameter a finite number in its range: one CalibrationError naming the file, the
    field, what was expected and what it holds."""
    if unknown := [k for k in doc if k not in CALIBRATION_FIELDS]:
        raise CalibrationError(
            f"{path}: unknown field {', '.join(map(str, unknown))}: a calibration holds {', '.join(CALIBRATION_FIELDS)}"
        )
    for section in ("gemm", "memory", "embedding", "collectives", "operators"):
        if section in doc and not isinstance(doc[section], dict):
            got = type(doc[section]).__name__
            raise CalibrationError(f"{path}: `{section}`: expected a mapping of fits; got {got}")
    for section, names in CURVE_NAMES.items():
        if unread := [k for k in doc.get(section, {}) if k not in (*names, "source")]:
            raise CalibrationError(
                f"{path}: `{section}.{unread[0]}`: no such curve; itercast reads {section} curves {', '.join(names)}"
            )
    stack: list[tuple[str, Any]] = [(s, doc[s]) for s in ("gemm", "memory", "embedding", "collectives") if s in doc]
    while stack:
        where, node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            field = f"{where}.{key}" if isinstance(key, str) else f"{where}[{key}]"
            if isinstance(key, str) and _PARAMETER.fullmatch(key):
                _check_parameter(path, field, value, negative=key == "log_half")
                lo, hi = CURVE_RANGES.get(key, (0.0, MAX_ALPHA_S if key.startswith("alpha") else math.inf))
                if not lo <= value <= hi:
                    raise CalibrationError(
                        f"{path}: `{field}`: expected a curve's {key}, {lo:g} ≤ {key} ≤ {hi:g}; got {value!r}"
                    )
            elif key == MEASURED_RANGE:
                _check_range(path, field, value)
            elif isinstance(value, dict | list):
                stack.append((field, value))
    _check_collective_fits(doc.get("collectives", {}), "collectives", path)
    models = doc.get("operators", {}).get("models", {})
    if not isinstance(models, dict) or not all(isinstance(m, dict) for m in models.values()):
        raise CalibrationError(f"{path}: `operators.models`: expected a mapping of operator fits; got {models!r:.60}")
    for name, fit in models.items():
        if MEASURED_RANGE in fit:
            _check_range(path, f"operators.models.{name}.{MEASURED_RANGE}", fit[MEASURED_RANGE])


def _check_range(path: Path, field: str, value: Any) -> None:
    """A fit's MEASURED_RANGE: [least, most] finite sizes, 0 ≤ least ≤ most."""
    if not (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < math.inf for v in value)
        and value[0] <= value[1]
    ):
        raise CalibrationError(
            f"{path}: `{field}`: expected [least, most] size fitted on, 0 ≤ least ≤ most; got {value!r:.60}"
        )


#: what every collective curve (or each of its regimes) needs (costs/fitting.collective_time_s)
COLLECTIVE_PARAMETERS = ("alpha0_s", "e_max", "log_half", "gamma")


def _check_collective_fits(node: Any, where: str, path: Path) -> None:
    """A collectives section: mappings down to curves, each with its parameters or a list of regimes
    that have them (a section's `source` is text)."""
    if not isinstance(node, dict):
        raise CalibrationError(f"{path}: `{where}`: expected a mapping of collective fits; got {node!r:.60}")
    regimes = node.get("regimes")
    if regimes is not None or any(k in node for k in COLLECTIVE_PARAMETERS):
        if regimes is not None and (not isinstance(regimes, list) or not regimes):
            raise CalibrationError(f"{path}: `{where}.regimes`: expected a list of curves; got {regimes!r:.60}")
        for i, curve_ in enumerate(regimes if regimes is not None else [node]):
            at = f"{where}.regimes[{i}]" if regimes is not None else where
            missing = [k for k in COLLECTIVE_PARAMETERS if not isinstance(curve_, dict) or k not in curve_]
            if missing:
                needs = ", ".join(missing)
                raise CalibrationError(f"{path}: `{at}`: expected a curve with {needs}; got {curve_!r:.60}")
        return
    for key, value in node.items():
        if key != "source":
            _check_collective_fits(value, f"{where}.{key}", path)


def _check_parameter(path: Path, field: str, value: Any, negative: bool) -> None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or (value < 0 and not negative):
        expected = "a finite number" if negative else "a finite number ≥ 0"
        raise CalibrationError(f"{path}: `{field}`: expected {expected}; got {value!r:.60}")


def merge_calibration(doc: dict[str, Any], where: str = "<calibration>") -> dict[str, Any]:
    """The built-in curves with the calibration document `doc` (calibrate()'s, or a file's) merged
    over them; `where` names it in errors."""
    path = where
    merged = json.loads(json.dumps(curves()))
    merged["system"] = doc.get("system")  # the system the curves were fitted for (None: host overheads only)
    merged["host_device"] = doc.get("host_device")  # the GPU its host overheads' traces ran (None: not said)
    # the dtypes whose GEMM curves the calibration fitted: the others keep the built-in ones, a GPU's own
    # (curves.json gemm_by_gpu) where it has them (AnalyticCostModel)
    merged["gemm_calibrated"] = sorted(k for k in doc.get("gemm", {}) if k != "source")
    # likewise the intra-node collectives it measured (curves.json collectives.intra_node_by_gpu for the others)
    measured = doc.get("collectives", {}).get("intra_node", {})
    merged["intra_node_calibrated"] = sorted(k for k in measured if k != "source")
    for section in ("gemm", "memory", "embedding"):
        merged.setdefault(section, {}).update(doc.get(section, {}))
    for placement, fits in doc.get("collectives", {}).items():
        merged["collectives"].setdefault(placement, {}).update(fits)
    if "operators" in doc:
        merged["operators"] = doc["operators"]
    if "host_overheads" in doc:
        try:
            HostOverheads.from_dict(doc["host_overheads"])
        except HostOverheadError as exc:
            raise CalibrationError(f"{path}: {exc}") from None
        merged["host_overheads"] = doc["host_overheads"]
    try:  # every entry must be a usable curve
        for section in ("gemm", "memory"):
            for key, entry in merged[section].items():
                if key == "source":  # where the fits came from, text
                    continue
                if not isinstance(entry, dict):
                    got = type(entry).__name__
                    raise CalibrationError(f"{path}: `{section}.{key}`: expected a curve (its parameters); got {got}")
                curve(entry)
    except (KeyError, TypeError) as exc:
        raise CalibrationError(f"{path}: a curve lacks its parameters ({exc})") from None
    return merged
