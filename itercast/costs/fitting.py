"""Fitting cost-model curves to measurements (least squares on log time: relative errors count alike).

Shared by tools/fit_efficiency_curves.py (the analytic model's curves) and calibration from a
profiling database. Curve forms:
  latency curve     t = alpha + x / (rate · eff(x))                    (GEMM: x FLOPs; memory: x bytes)
  attention         eff(FLOPs per head, head dim, causal)            (costs/attention.py)
  collective curve  t = alpha0 + alpha1 · log2(nodes) + alpha2 · log2(ranks) + alpha3 · (ranks − 1)
                        + bus / (min(B, f · N) · eff(r))
                    (bus bytes per rank; r = bus, or bus / (ranks − 1), the bytes of one ring step;
                    one of alpha2, alpha3 is fitted, the other 0; N the node's NICs × NIC bandwidth,
                    f = node_nic_fraction, fitted only where N is given, else no cap)
with eff(x) = e_max / (1 + exp(gamma · (log_half − ln x))) (costs/curves.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares, nnls

from itercast.costs.attention import time_s as attention_time_s
from itercast.costs.curves import Curve


def eff(x: np.ndarray, e_max: float, log_half: float, gamma: float) -> np.ndarray:
    return Curve(e_max, log_half, gamma)(x)


def geomean_abs_err(pred: np.ndarray, meas: np.ndarray) -> float:
    """Geometric mean of |predicted/measured − 1| (predictions floored at 1e-12 s, errors at 1e-12)."""
    e = np.abs(np.maximum(pred, 1e-12) / meas - 1)
    return float(np.exp(np.mean(np.log(e + 1e-12))))


def mean_abs_err(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.mean(np.abs(pred / meas - 1)))


def fit_latency_curve(
    x: np.ndarray,
    t: np.ndarray,
    rate: np.ndarray | float,
    alpha_s: float | None = None,
    weights: np.ndarray | None = None,
    e_max: float | None = None,
) -> dict:
    """time = alpha + x / (rate · eff(x)), fitted on log time; x in FLOPs or bytes, rate the peak in
    the same unit per second (a scalar, or one per point when the points come from several GPUs).
    `alpha_s` pins the latency when the points are too few to identify it; `e_max` pins the
    asymptotic efficiency when another source measures it better; `weights` (one per point) weigh
    the squared log errors, e.g. so that two sources count alike whatever their sizes."""
    w = np.ones_like(t) if weights is None else np.asarray(weights, float)
    pinned: list[float] = [] if e_max is None else [e_max]

    def curve_params(p: np.ndarray) -> list[float]:
        """(e_max, log_half, gamma): the pinned ones, then the fitted ones at the end of `p`."""
        return [*pinned, *(float(v) for v in p[len(p) - 3 + len(pinned) :])]

    def model(p):
        a = alpha_s if alpha_s is not None else p[0] * 1e-6
        e, log_half, gamma = curve_params(p)
        return a + x / (rate * eff(x, e, log_half, gamma))

    lo, hi, x0 = [0.05, 5, 0.1], [1.2, 40, 4], [0.8, math.log(np.median(x)), 1.0]
    lo, hi, x0 = lo[len(pinned) :], hi[len(pinned) :], x0[len(pinned) :]
    if alpha_s is None:
        lo, hi, x0 = [0, *lo], [50, *hi], [3.0, *x0]
    start = np.clip(x0, lo, hi)  # rows of sizes beyond e^40 start the half-size at its bound
    fit = least_squares(lambda p: (np.log(model(p)) - np.log(t)) * np.sqrt(w), x0=start, bounds=(lo, hi))
    e_fit, log_half, gamma = curve_params(fit.x)
    return {
        "alpha_s": alpha_s if alpha_s is not None else fit.x[0] * 1e-6,
        "e_max": e_fit,
        "log_half": log_half,
        "gamma": gamma,
        "points": len(x),
        "fit_mean_abs_err": mean_abs_err(model(fit.x), t),
    }


#: parameters of the collective curve: (starting value, lower bound, upper bound)
COLLECTIVE_PARAMS = {
    "alpha0_s": (10e-6, 0.0, 500e-6),
    "alpha_per_log2_nodes_s": (1e-6, 0.0, 300e-6),
    "alpha_per_log2_ranks_s": (1e-6, 0.0, 1e-3),
    "alpha_per_peer_s": (1e-6, 0.0, 1e-3),
    "e_max": (0.8, 0.05, 1.5),
    "log_half": (math.log(1e7), 5.0, 30.0),
    "gamma": (1.0, 0.2, 4.0),
    # at most 1: per_node × NIC bandwidth per GPU never exceeds the node's total, so f = 1 is no cap
    "node_nic_fraction": (0.9, 0.2, 1.0),
}


def collective_time_s(
    fit: dict,
    bus_bytes: np.ndarray | float,
    nodes: np.ndarray | float,
    ranks: np.ndarray | float,
    bw: np.ndarray | float,
    node_nic_bw: np.ndarray | float | None = None,
    ramp_scale: np.ndarray | float = 1.0,
) -> np.ndarray:
    """The collective curve in seconds: bus bytes per rank over a group of `ranks` on `nodes` nodes,
    `bw` the placement's bandwidth per rank (bytes/s). Across nodes, `node_nic_bw` (bytes/s: NICs
    per node × NIC bandwidth) caps `bw` at the fit's `node_nic_fraction` of it: the bus bandwidth a
    ring reaches when every GPU of the node drives its NIC at once (tools/fit_efficiency_curves.py
    _h100_400g). `ramp_scale` multiplies the bytes the efficiency ramps on: a group on a 1/r share of a mesh
    node's links (NodeSpec.group_bandwidth_bytes_per_s) passes r, as its ramp is the time a ring takes to fill,
    r times as long a byte there (Alpa's p3.16xlarge groups of 2 and 4: validation/kernel_tables.py). Fits
    without `alpha_per_log2_ranks_s`, `alpha_per_peer_s`, `ramp_of` or `node_nic_fraction` (every file before
    them) read as 0, 0, "bus" and 1 (no cap)."""
    x = np.asarray(bus_bytes, dtype=np.float64)
    if node_nic_bw is not None:
        bw = np.minimum(bw, fit.get("node_nic_fraction", 1.0) * np.asarray(node_nic_bw, dtype=np.float64))
    k = np.maximum(np.asarray(ranks, dtype=np.float64), 2.0)
    ramp_per_byte = (1.0 / (k - 1) if fit.get("ramp_of", "bus") == "step" else 1.0) * np.asarray(ramp_scale, float)
    ramp = Curve(fit["e_max"], fit["log_half"], fit["gamma"])
    # below the ramp's least-time size (a ramp whose exponent exceeds 1, where x / eff(x) grows as x shrinks) a
    # message takes the time one of that size takes, not more: NCCL can always run a smaller message as it would a
    # larger one (as memory-bound kernels, AnalyticCostModel.memory_s)
    ramp_x = np.maximum(x * ramp_per_byte, ramp.least_time_size())
    return (
        fit["alpha0_s"]
        + fit.get("alpha_per_log2_nodes_s", 0.0) * np.log2(np.maximum(nodes, 1))
        + fit.get("alpha_per_log2_ranks_s", 0.0) * np.log2(k)
        + fit.get("alpha_per_peer_s", 0.0) * (k - 1)
        + ramp_x / ramp_per_byte / (bw * ramp(ramp_x))
    )


def fit_collective(
    sizes: np.ndarray | list,
    times_s: np.ndarray | list,
    nodes: np.ndarray | list,
    bw: np.ndarray | float,
    fixed: dict | None = None,
    ranks: np.ndarray | list | None = None,
    starts: int = 1,
    node_nic_bw: np.ndarray | list | None = None,
    e_max_at_most: float = COLLECTIVE_PARAMS["e_max"][2],
    ramp_scale: np.ndarray | list | float = 1.0,
) -> dict:
    """Fit the collective curve (collective_time_s); `fixed` pins some parameters, `e_max_at_most` bounds
    the asymptotic efficiency (1: no faster than the bandwidth each point is priced against); `ramp_scale`
    per point as collective_time_s takes it.

    Without `ranks`: alpha0, alpha per log2(nodes) and the eff curve of the bus bytes. With `ranks`
    (groups of several sizes, as across nodes): also a latency that grows with the group, and the
    ramp runs on the bytes of one ring step, bus/(ranks − 1). On Alpa's V100 database this ramp won a
    leave-one-layout-out cross-validation on the ≤ 8-GPU groups against the ramp on bus bytes
    and on NIC bytes, for all four collectives (validation/alpa_collectives.py).

    The group's latency grows with log2(ranks) (tree-like) or with the ranks − 1 peers (NCCL's
    all-to-all is ranks − 1 point-to-point exchanges). With three or more group sizes and neither
    pinned in `fixed`, each form is fitted on the smaller groups and the one that better predicts
    the largest group is refitted on all rows (`latency_of`: "log2_ranks" or "peers", and the
    deciding geomean |error| `latency_choice_err`): the choice is made by the extrapolation that
    calibration will be asked for. Otherwise log2(ranks). `starts` > 1 adds seeded random starting
    points and keeps the least-squares best (the fit has local minima where the ramp mimics the
    latency). With `node_nic_bw` (per point, bytes/s) `node_nic_fraction` is fitted too; it is
    identified only when some points fill their nodes (per_node × NIC per GPU above the cap) and
    others do not."""
    x, t, m = np.array(sizes, float), np.array(times_s), np.array(nodes, float)
    k = np.array(ranks, float) if ranks is not None else np.full_like(x, 2.0)
    cap = None if node_nic_bw is None else np.array(node_nic_bw, float)
    r = np.broadcast_to(np.asarray(ramp_scale, float), x.shape)
    fixed = {"ramp_of": "step" if ranks is not None else "bus", **(fixed or {})}
    if np.all(m == 1):
        fixed.setdefault("alpha_per_log2_nodes_s", 0.0)
    if ranks is None:
        fixed.setdefault("alpha_per_log2_ranks_s", 0.0)
        fixed.setdefault("alpha_per_peer_s", 0.0)
    if {"alpha_per_log2_ranks_s", "alpha_per_peer_s"} & set(fixed):
        return _fit_collective_form(x, t, m, k, bw, cap, fixed, starts, e_max_at_most, r)
    forms = {"log2_ranks": {"alpha_per_peer_s": 0.0}, "peers": {"alpha_per_log2_ranks_s": 0.0}}
    choice_err = {}
    if np.unique(k).shape[0] >= 3:
        small, largest = k < k.max(), k == k.max()
        bw_arr = np.broadcast_to(np.asarray(bw, float), x.shape)
        for name, pins in forms.items():
            cap_small, cap_largest = (None, None) if cap is None else (cap[small], cap[largest])
            f = _fit_collective_form(
                x[small],
                t[small],
                m[small],
                k[small],
                bw_arr[small],
                cap_small,
                {**fixed, **pins},
                starts,
                e_max_at_most,
                r[small],
            )
            pred = collective_time_s(f, x[largest], m[largest], k[largest], bw_arr[largest], cap_largest, r[largest])
            choice_err[name] = geomean_abs_err(pred, t[largest])
    form = min(choice_err, key=lambda name: choice_err[name]) if choice_err else "log2_ranks"
    fit = _fit_collective_form(x, t, m, k, bw, cap, {**fixed, **forms[form]}, starts, e_max_at_most, r)
    return {**fit, "latency_of": form} | ({"latency_choice_err": choice_err[form]} if choice_err else {})


def _fit_collective_form(
    x: np.ndarray,
    t: np.ndarray,
    m: np.ndarray,
    k: np.ndarray,
    bw,
    cap: np.ndarray | None,
    fixed: dict,
    starts: int,
    e_max_at_most: float,
    ramp_scale: np.ndarray,
) -> dict:
    """Least squares on log time of the collective curve's parameters not in `fixed`; the node NIC
    fraction only where `cap` (the node's NIC bandwidth per point) is given."""
    free = [n for n in COLLECTIVE_PARAMS if n not in fixed and (cap is not None or n != "node_nic_fraction")]
    scale = {n: 1e-6 if n.startswith("alpha") else 1.0 for n in free}  # latencies solved in µs
    first, lo_v, hi_v = ([COLLECTIVE_PARAMS[n][j] / scale[n] for n in free] for j in range(3))
    if "e_max" in free:
        i = free.index("e_max")
        hi_v[i] = min(hi_v[i], e_max_at_most)
        first[i] = min(first[i], hi_v[i])

    def params(v):
        out = dict(fixed)
        out.update({n: v[i] * scale[n] for i, n in enumerate(free)})
        return out

    def residual(v):
        return np.log(collective_time_s(params(v), x, m, k, bw, cap, ramp_scale)) - np.log(t)

    rng = np.random.default_rng(0)
    tries = [first] + [list(rng.uniform(lo_v, hi_v)) for _ in range(starts - 1)]
    fit = min((least_squares(residual, x0=v, bounds=(lo_v, hi_v)) for v in tries), key=lambda f: f.cost)
    q = params(fit.x)
    return {
        **q,
        "points": len(x),
        "size_range_bytes": [float(x.min()), float(x.max())],
        "fit_mean_abs_err": mean_abs_err(collective_time_s(q, x, m, k, bw, cap, ramp_scale), t),
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


#: parameters of the attention efficiency (costs/attention.py): (starting value, lower bound, upper bound)
ATTENTION_PARAMS = {
    "e_max": (0.8, 0.05, 1.5),
    "d_half": (32.0, 0.0, 512.0),
    "causal_factor": (0.9, 0.3, 1.2),
    "log_half": (math.log(1e8), 5.0, 40.0),
    "gamma": (1.0, 0.1, 4.0),
}


def fit_attention(points: AttentionPoints, peak_flops: float, alpha_s: float, fixed: dict | None = None) -> dict:
    """costs/attention.time_s fitted by least squares on log time, the latency pinned to `alpha_s`;
    `fixed` pins other parameters (the causal factor where a direction was measured without a mask)."""
    fixed = {**(fixed or {}), "alpha_s": alpha_s}
    free = [n for n in ATTENTION_PARAMS if n not in fixed]
    first, lo, hi = ([ATTENTION_PARAMS[n][j] for n in free] for j in range(3))

    def params(v: np.ndarray) -> dict:
        return {**fixed, **dict(zip(free, map(float, v), strict=True))}

    fit = least_squares(
        lambda v: np.log(attention_times_s(params(v), points, peak_flops)) - np.log(points.seconds),
        x0=first,
        bounds=(lo, hi),
    )
    p = params(fit.x)
    return {**p, "points": len(points.seconds), "fit_mean_abs_err": attention_err(p, points, peak_flops)}


@dataclass(frozen=True)
class AttentionPoints:
    """Attention benchmark rows as arrays: FLOPs and (batch · head) problems of one call, head dim,
    causal mask, measured seconds."""

    flops: np.ndarray
    problems: np.ndarray
    head_dim: np.ndarray
    causal: np.ndarray
    seconds: np.ndarray


def attention_points(rows: list[dict[str, str]]) -> AttentionPoints:
    """Rows of data/published/kernels/attention_*.csv. FLOPs as the FlashAttention papers count them:
    forward 4 · seqlen² · head_dim per (batch · head), half of it under a causal mask, backward 2.5×
    the forward; seconds = FLOPs / the reported TFLOP/s."""
    s, d, b, h = (np.array([float(r[k]) for r in rows]) for k in ("seqlen", "head_dim", "batch", "heads"))
    causal = np.array([r["causal"] == "true" for r in rows])
    backward = np.array([r["direction"] == "bwd" for r in rows])
    flops = 4.0 * s * s * d * b * h * np.where(causal, 0.5, 1.0) * np.where(backward, 2.5, 1.0)
    return AttentionPoints(flops, b * h, d, causal, flops / np.array([float(r["tflops"]) * 1e12 for r in rows]))


def attention_times_s(fit: dict, points: AttentionPoints, peak_flops: float) -> np.ndarray:
    """costs/attention.time_s at every point."""
    return np.array(
        [
            float(attention_time_s(fit, f, n, d, c, peak_flops))
            for f, n, d, c in zip(points.flops, points.problems, points.head_dim, points.causal, strict=True)
        ]
    )


def attention_err(fit: dict, points: AttentionPoints, peak_flops: float) -> float:
    """Mean |predicted / measured − 1| of the kernel times."""
    return mean_abs_err(attention_times_s(fit, points, peak_flops), points.seconds)
