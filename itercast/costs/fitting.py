"""Fitting cost-model curves to measurements (least squares on log time: relative errors count alike).

Shared by tools/fit_efficiency_curves.py (the analytic model's curves) and calibration from a
profiling database. Curve forms:
  latency curve     t = alpha + x / (rate · eff(x))                    (GEMM: x FLOPs; memory: x bytes)
  collective curve  t = alpha0 + alpha1 · log2(nodes) + bus / (B · eff(bus))   (bus bytes per rank)
with eff(x) = e_max / (1 + exp(gamma · (log_half − ln x))) (costs/curves.py).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import least_squares, nnls

from itercast.costs.curves import Curve


def eff(x: np.ndarray, e_max: float, log_half: float, gamma: float) -> np.ndarray:
    return Curve(e_max, log_half, gamma)(x)


def geomean_abs_err(pred: np.ndarray, meas: np.ndarray) -> float:
    """Geometric mean of |predicted/measured − 1| (predictions floored at 1e-12 s, errors at 1e-12)."""
    e = np.abs(np.maximum(pred, 1e-12) / meas - 1)
    return float(np.exp(np.mean(np.log(e + 1e-12))))


def mean_abs_err(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.mean(np.abs(pred / meas - 1)))


def fit_latency_curve(x: np.ndarray, t: np.ndarray, rate: np.ndarray | float, alpha_s: float | None = None) -> dict:
    """time = alpha + x / (rate · eff(x)), fitted on log time; x in FLOPs or bytes, rate the peak in
    the same unit per second (a scalar, or one per point when the points come from several GPUs).
    `alpha_s` pins the latency when the points are too few to identify it."""

    def model(p):
        a = alpha_s if alpha_s is not None else p[0] * 1e-6
        return a + x / (rate * eff(x, *p[-3:]))

    lo, hi, x0 = [0.05, 5, 0.1], [1.2, 40, 4], [0.8, math.log(np.median(x)), 1.0]
    if alpha_s is None:
        lo, hi, x0 = [0, *lo], [50, *hi], [3.0, *x0]
    fit = least_squares(lambda p: np.log(model(p)) - np.log(t), x0=x0, bounds=(lo, hi))
    e_max, log_half, gamma = fit.x[-3:]
    return {
        "alpha_s": alpha_s if alpha_s is not None else fit.x[0] * 1e-6,
        "e_max": e_max,
        "log_half": log_half,
        "gamma": gamma,
        "points": len(x),
        "fit_mean_abs_err": mean_abs_err(model(fit.x), t),
    }


def fit_collective(
    sizes: np.ndarray | list,
    times_s: np.ndarray | list,
    nodes: np.ndarray | list,
    bw: np.ndarray | float,
    fixed: dict | None = None,
) -> dict:
    """Fit alpha0, alpha per log2(nodes) and the eff curve; `fixed` pins some of them."""
    x, t, m = np.array(sizes, float), np.array(times_s), np.array(nodes, float)
    names = ["alpha0_s", "alpha_per_log2_nodes_s", "e_max", "log_half", "gamma"]
    x0 = {"alpha0_s": 10e-6, "alpha_per_log2_nodes_s": 1e-6, "e_max": 0.8, "log_half": math.log(1e7), "gamma": 1.0}
    lo = {"alpha0_s": 0, "alpha_per_log2_nodes_s": 0, "e_max": 0.05, "log_half": 5, "gamma": 0.2}
    hi = {"alpha0_s": 500e-6, "alpha_per_log2_nodes_s": 200e-6, "e_max": 1.5, "log_half": 30, "gamma": 4}
    fixed = dict(fixed or {})
    if np.all(m == 1):
        fixed.setdefault("alpha_per_log2_nodes_s", 0.0)
    free = [k for k in names if k not in fixed]
    scale = {"alpha0_s": 1e-6, "alpha_per_log2_nodes_s": 1e-6}

    def params(v):
        out = dict(fixed)
        out.update({k: v[i] * scale.get(k, 1.0) for i, k in enumerate(free)})
        return out

    def model(q):
        return (
            q["alpha0_s"]
            + q["alpha_per_log2_nodes_s"] * np.log2(np.maximum(m, 1))
            + x / (bw * eff(x, q["e_max"], q["log_half"], q["gamma"]))
        )

    fit = least_squares(
        lambda v: np.log(model(params(v))) - np.log(t),
        x0=[x0[k] / scale.get(k, 1.0) for k in free],
        bounds=([lo[k] / scale.get(k, 1.0) for k in free], [hi[k] / scale.get(k, 1.0) for k in free]),
    )
    q = params(fit.x)
    return {
        **q,
        "points": len(x),
        "size_range_bytes": [float(x.min()), float(x.max())],
        "fit_mean_abs_err": mean_abs_err(model(q), t),
    }


def fit_nonneg_linear(columns: dict[str, np.ndarray], t: np.ndarray) -> dict:
    """t = alpha + Σ c_i · column_i with non-negative coefficients, fitted for relative error (rows
    scaled by 1/t). Returns alpha_s and s_per_<name> for every column (seconds per unit)."""
    design = np.column_stack([np.ones_like(t), *columns.values()])
    coef, _ = nnls(design / t[:, None], np.ones(t.shape[0]))
    return {
        "alpha_s": float(coef[0]),
        **{f"s_per_{name}": float(c) for name, c in zip(columns, coef[1:], strict=True)},
        "points": int(t.shape[0]),
        "fit_mean_abs_err": mean_abs_err(design @ coef, t),
    }


def fit_lookup_linear(gathered_bytes: np.ndarray, missed_bytes: np.ndarray, t: np.ndarray) -> dict:
    """Embedding lookups: t = alpha + a · gathered bytes + b · missed bytes (non-negative). Gathered
    bytes are every looked-up row; missed bytes the distinct rows of a table larger than the cache
    (they come from memory, repeated ones from cache). Coefficients are absolute (seconds per byte)
    for the measured device."""
    return fit_nonneg_linear({"gathered_byte": gathered_bytes, "missed_byte": missed_bytes}, t)
