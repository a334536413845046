"""Per-operator cost models of one device, fitted on its profiling database (`itercast profile run`).

They price the operators of a PyTorch execution trace (traces/iteration_model.py) from the
features of costs/aten_ops.py. Forms (all fitted on log time, so relative errors count alike):
- compute (gemm, conv_fwd/bwd, attention_fwd/bwd) and norms (the same form with bytes for FLOPs:
  costs/aten_ops.py), shape-aware, per operator:
      t = α + FLOPs / (R · s(m) · s(n) · s(k)) · f_layout,   s(d) = 1 / (1 + (h_d / d)^g)
  R is the saturated rate, h_d the size of dimension d at which it reaches half of it, and f_layout
  the cost of a transposed operand layout relative to "nn". Below the smallest size measured in a
  dimension the ramp is held at that size (no extrapolation: (h/d)^g would explode for d = 1).
  Why shapes: a model of FLOPs alone cannot tell a 64×4096×4096 product from a 1024³ one, and
  skinny shapes run far below peak.
  With at least BOOST_MIN_ROWS rows, gradient-boosted trees (scikit-learn) on log m, log n, log k
  and the layout learn what the curve misses (the seed's learned GEMM model, here as a correction:
  t = curve · exp(trees)); the trees are stored as arrays in the calibration's JSON. Why a
  correction: the curve extrapolates sensibly beyond the grid, trees alone do not; why the row
  floor: 30 rows of a convolution would teach the trees their noise.
- memory-bound operators, per operator name (else aten::add_ for in-place operators, aten::add for
  the others), linear in bytes with a higher rate for calls of at least C bytes (C chosen by fit
  among MEMORY_BREAKS_BYTES): t = α + a · bytes + b · bytes · [bytes ≥ C], a, b ≥ 0. Why not a
  saturating curve: on a CPU the rate falls again once the data leave the caches, and a fresh
  output of 32 MiB or more (glibc's largest mmap threshold) is mapped afresh page by page on every
  call, which a curve that only rises cannot follow. Why a step and not a hinge b · (bytes − C):
  then every byte of the call streams from memory or is faulted in, not only those past C (on this
  CPU, aten::add runs at 21 ps/B up to a 16 MiB output and 98 ps/B from 32 MiB on);
- embedding bags, linear with non-negative coefficients in: lookups (indices), gathered bytes
  (every looked-up row) and, forward, the bytes of distinct rows of tables larger than a cache (the
  cache size chosen by fit among CACHE_CANDIDATES_BYTES), the lookups per bag (a GPU sums a bag in
  one chain of dependent loads: 512 bags of 128 lookups take 26–39 µs on the H100 at any table
  size), the pooled output's bytes (H100 held-out 10.9% → 4.7%; this CPU 9.7% → 10.2%, one
  thread 13.4% → 12.4%) and the bytes of repeats beyond each of REUSE_BREAKS_BYTES (IndexStats:
  the binned reuse distances; H100 4.7% → 3.8%, this CPU 10.2% → 10.4%, one thread 12.4% →
  12.8%; tried on the backward and the update, where no held-out error fell: H100 backward 4.9% →
  5.4%, CPU update 7.6% → 8.0%, so they are not used there); backward, the bytes of distinct rows (the
  indices are sorted into one segment per distinct row, each accumulated and written once: held-out
  9.2% → 6.7% on this CPU, 30.9% → 27.2% on the H100) and the table's bytes, at a higher rate for
  tables of at least a break (the dense gradient is zeroed and written whole, and a large one is
  mapped afresh page by page, as above; the sort gives the per-lookup term); the lookups of the most
  frequent row (IndexStats: a GPU sums them one after another); and a constant from a number of
  lookups on (chosen by fit among SORT_BREAKS_LOOKUPS: the H100's backward jumps from 50 µs at 512
  lookups to 120 µs at 4,096, where the sort leaves its single-block path). H100 held-out 27.2% →
  4.5% with both (the most frequent row alone: 15.6%, the step alone: 9.3%); this CPU 6.7% → 7.5%
  (two threads; one thread 4.5% either way): a CPU thread sums a row's lookups as it sums any.
  The fused row-wise Adagrad update (embedding_bag_update): the bytes of distinct rows, at a higher
  rate for tables of at least a break (rows scattered over a table that does not stay in cache), with
  a cost per distinct row there too (a random access and its page walk cost as much for a 64-byte
  row as for a 128-byte one: on this CPU's 1M-row tables a 16-wide update costs about what a 32-wide
  one does, 44 against 52 ms at 131k lookups, where bytes alone priced it 30% low), and the gathered
  bytes again once the distinct rows' gradient accumulator reaches a second break (chosen by fit
  among MEMORY_BREAKS_BYTES): index_add_ scatters every lookup's gradient row into it in the
  lookups' order, so an accumulator larger than the last-level cache misses on every row (this CPU,
  32 MB L3: the fit chooses 32 MiB). Held-out (5-fold) on cpu_profile_1thread_corun.db's 192 update
  configurations (widths 16–128): 8.3% → 7.0%, the slowest quarter's mean signed error −15.7% →
  −11.2%; fitted on widths 32 and 128 only, widths 16 and 64: 9.0% → 7.9%; on cpu_profile_1thread.db's
  96 (widths 32 and 128): 11.2% → 11.0%. No
  term for the most frequent row, which its index_add_ may serialise on a GPU too: never measured
  there (the H100 database predates the operator);
- host: seconds per operator called from Python, per nested operator call, per autograd function
  and per launch of an operator's work (non-negative least squares over the `host` programs, whose
  counts come from their traces; a database whose programs counted no launches fits none).
A measured call includes its own host overhead (one Python call and its nested calls): pricing
subtracts it, and the iteration model adds the host cost of every call it really makes. On a GPU the
measured times are the device's alone, and each operator's host issue time (its rows' host_issue_s,
profile/microbench._time) is kept as the median over its rows: launching a cuDNN convolution or a
lookup's several kernels costs the host far more than a generic call.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
from scipy.optimize import least_squares, nnls

from itercast.costs.aten_ops import OpArgs, OpCall, OpFeatures, features
from itercast.costs.fitted_ranges import MEASURED_RANGE, FittedRanges
from itercast.costs.fitting import eff, fit_latency_curve, fit_nonneg_linear, mean_abs_err
from itercast.costs.index_stats import REUSE_BREAKS_BYTES, IndexStats, zipf_hot_fraction
from itercast.costs.index_stats import unique_fraction_uniform as unique_fraction_uniform  # re-exported for importers
from itercast.measurements import Measurement

#: the skew of the profiled embedding benchmarks' Zipf indices, the row of rank r drawn with probability
#: ∝ r^−ZIPF_ALPHA (DLRM-like reuse; `itercast profile` draws them, the models here read their features)
ZIPF_ALPHA = 1.05
COMPUTE = ("gemm", "conv_fwd", "conv_bwd", "attention_fwd", "attention_bwd", "norm")
LAYOUTS = ("nt", "tn", "tt", "causal")  # operand layouts of GEMMs; causal masking of attention
CACHE_CANDIDATES_BYTES = (1 << 20, 4 << 20, 16 << 20, 64 << 20)
HOST = ("python", "nested", "autograd", "launch")
FALLBACK_MEMORY_OPS = ("aten::add", "aten::add_")  # for new outputs, in place
#: operators priced with the model of another that runs the same kernel (the bias copy of addmm is a child)
SAME_KERNEL = {
    "aten::addmm": "aten::mm",
    "aten::baddbmm": "aten::bmm",
    "aten::_embedding_bag_forward_only": "aten::_embedding_bag",
}
#: the same computation under another backend's operator name (a trace recorded on a GPU priced on
#: a CPU's database, or the reverse): PyTorch dispatches fused attention and batch norm to
#: backend-specific operators with the same arguments
_BACKEND_PAIRS = (
    ("aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"),
    (
        "aten::_scaled_dot_product_efficient_attention_backward",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    ),
    ("aten::cudnn_batch_norm", "aten::native_batch_norm"),
    ("aten::cudnn_batch_norm_backward", "aten::native_batch_norm_backward"),
)
OTHER_BACKEND = {a: b for a, b in _BACKEND_PAIRS} | {b: a for a, b in _BACKEND_PAIRS}
MEMORY_BREAKS_BYTES = tuple(1 << k for k in range(18, 28))  # 256 KiB … 128 MiB
#: lookups from which an embedding backward's sort takes its device-wide path (module docstring)
SORT_BREAKS_LOOKUPS = (1 << 10, 1 << 11, 1 << 12)
#: an embedding family's second break (lookup_columns' argument), chosen by fit among these candidates
SECOND_BREAKS = {
    "embedding_bag_bwd": ("many_lookups", SORT_BREAKS_LOOKUPS),
    "embedding_bag_update": ("accumulator_bytes", MEMORY_BREAKS_BYTES),
}
BOOST_MIN_ROWS = 100
#: scikit-learn GradientBoostingRegressor settings, fixed (not searched per database). Four settings
#: were compared on the CPU database's mm rows (200-300 trees, depth 3-4, rate 0.05-0.1): 3.3-3.9%.
BOOST = {"n_estimators": 200, "max_depth": 3, "learning_rate": 0.05, "min_samples_leaf": 10, "random_state": 0}


class OpModelError(ValueError):
    """The calibration cannot price an operator; the message says which and why."""


def row_features(m: Measurement) -> tuple[str, OpFeatures]:
    """(operator name, features) of a microbenchmark row that stored its call."""
    call = _call_of(m)
    return call.name, features(call)


def fit_shape_model(dims: list[dict[str, Any]], flops: np.ndarray, t: np.ndarray) -> dict[str, Any]:
    """Fit t = α + F / (R·s(m)s(n)s(k)) · f_layout (module docstring) on log time."""
    m, n, k = (np.array([float(d[x]) for d in dims]) for x in "mnk")
    layout = [d.get("layout", "nn") for d in dims]
    seen = [lay for lay in LAYOUTS if lay in layout]
    onehot = np.array([[lay == s for s in seen] for lay in layout], dtype=float).reshape(len(dims), len(seen))

    def model(p: np.ndarray) -> np.ndarray:
        la, lr, lm, ln, lk, g = p[:6]
        s = (1 + np.exp(g * (lm - np.log(m)))) * (1 + np.exp(g * (ln - np.log(n)))) * (1 + np.exp(g * (lk - np.log(k))))
        return np.exp(la) + flops / np.exp(lr) * s * np.exp(onehot @ p[6:])

    rate0 = float(np.max(flops / t))
    x0 = [math.log(np.min(t) / 2), math.log(rate0), 3.0, 3.0, 3.0, 1.0] + [0.0] * len(seen)
    lo = [math.log(1e-8), math.log(rate0 / 10), 0.0, 0.0, 0.0, 0.2] + [-1.6] * len(seen)
    hi = [math.log(1e-2), math.log(rate0 * 20), 12.0, 12.0, 12.0, 4.0] + [1.6] * len(seen)
    fit = least_squares(lambda p: np.log(model(p)) - np.log(t), x0=np.clip(x0, lo, hi), bounds=(lo, hi))
    p = fit.x
    boost = _fit_boost(dims, np.log(t) - np.log(model(p))) if len(t) >= BOOST_MIN_ROWS else {}
    return {
        "form": "shape",
        **boost,
        "alpha_s": float(math.exp(p[0])),
        "rate_flops_per_s": float(math.exp(p[1])),
        "half_m": float(math.exp(p[2])),
        "half_n": float(math.exp(p[3])),
        "half_k": float(math.exp(p[4])),
        "gamma": float(p[5]),
        "layout_factor": {"nn": 1.0, **{lay: float(math.exp(v)) for lay, v in zip(seen, p[6:], strict=True)}},
        **{f"min_{name}": float(np.min(v)) for name, v in (("m", m), ("n", n), ("k", k))},
        "points": len(t),
        "fit_mean_abs_err": mean_abs_err(model(p), t),
    }


def shape_model_s(fit: dict[str, Any], f: OpFeatures) -> float:
    d = f.dims
    slow = 1.0
    for dim in "mnk":
        slow *= 1 + (fit[f"half_{dim}"] / max(float(d[dim]), fit.get(f"min_{dim}", 1.0))) ** fit["gamma"]
    factor = fit["layout_factor"].get(d.get("layout", "nn"), 1.0)
    curve_s = fit["alpha_s"] + f.size / fit["rate_flops_per_s"] * slow * factor
    return float(curve_s * math.exp(_boost_log(fit["boost"], _shape_features(d)))) if "boost" in fit else float(curve_s)


def _shape_features(d: dict[str, Any]) -> list[float]:
    """log m, log n, log k and one column per layout in LAYOUTS."""
    return [math.log(float(d[x])) for x in "mnk"] + [float(d.get("layout", "nn") == lay) for lay in LAYOUTS]


def _fit_boost(dims: list[dict[str, Any]], log_residual: np.ndarray) -> dict[str, Any]:
    """Boosted trees on the curve's log residuals, as arrays: per tree the split feature (−2: leaf),
    threshold, children (−1: none) and leaf value; prediction = init + rate · Σ tree values."""
    from sklearn.ensemble import GradientBoostingRegressor

    g = GradientBoostingRegressor(**BOOST).fit(np.array([_shape_features(d) for d in dims]), log_residual)
    trees = []
    for est in g.estimators_[:, 0]:
        tr = est.tree_
        trees.append(
            {
                "feature": tr.feature.tolist(),
                "threshold": tr.threshold.tolist(),
                "left": tr.children_left.tolist(),
                "right": tr.children_right.tolist(),
                "value": tr.value[:, 0, 0].tolist(),
            }
        )
    init = float(g.init_.constant_[0][0])  # the default initial estimator: the residuals' mean
    return {"boost": {"init": init, "learning_rate": BOOST["learning_rate"], "trees": trees}}


def _boost_log(boost: dict[str, Any], x: list[float]) -> float:
    """The trees' log correction at feature vector x (scikit-learn's rule: x[f] ≤ threshold goes left)."""
    total = 0.0
    for tree in boost["trees"]:
        node = 0
        while tree["left"][node] != -1:
            node = tree["left"][node] if x[tree["feature"][node]] <= tree["threshold"][node] else tree["right"][node]
        total += tree["value"][node]
    return float(boost["init"] + boost["learning_rate"] * total)


def lookup_columns(
    feats: list[OpFeatures],
    stats: list[IndexStats],
    cache_bytes: float,
    many_lookups: float = math.inf,
    accumulator_bytes: float = math.inf,
) -> dict[str, np.ndarray]:
    """The linear model's columns for embedding-bag rows; `stats`: what each call's indices are;
    `cache_bytes` and, backward, `many_lookups`, update, `accumulator_bytes`: the breaks (module docstring)."""
    unique = np.array([s.unique_fraction for s in stats])
    cols = {
        "lookup": np.array([float(f.dims["lookups"]) for f in feats]),
        "gathered_byte": np.array([f.size for f in feats]),
    }
    table = np.array([float(f.dims["table_bytes"]) for f in feats])
    if feats[0].family == "embedding_bag_update":  # each distinct row's gradient summed, row and state updated
        distinct = cols["gathered_byte"] * unique  # also the bytes of the distinct rows' gradient accumulator
        large = table >= cache_bytes
        return cols | {
            "distinct_byte": distinct,
            "distinct_byte_if_large": distinct * large,
            "distinct_row_if_large": cols["lookup"] * unique * large,  # a random access, however narrow the row
            # every lookup's gradient row scattered into the accumulator in the lookups' order
            "gathered_byte_if_accumulator_large": cols["gathered_byte"] * (distinct >= accumulator_bytes),
        }
    if feats[0].family == "embedding_bag_bwd":  # from `cache_bytes` on, the zeroed gradient is mapped afresh
        distinct = cols["gathered_byte"] * unique  # one gradient row accumulated and written per distinct row
        return cols | {
            "distinct_byte": distinct,
            "hot_lookup": cols["lookup"] * np.array([s.hot_fraction for s in stats]),  # IndexStats: a serial chain
            "call_if_many": (cols["lookup"] >= many_lookups).astype(np.float64),
            "table_byte": table,
            "table_byte_if_large": table * (table >= cache_bytes),
        }
    bags = np.array([float(f.dims["bags"]) for f in feats])
    far = {  # repeats of rows a cache of that size no longer holds
        f"reuse_beyond_{brk >> 10}KiB_byte": cols["gathered_byte"] * np.array([s.reuse_beyond[j] for s in stats])
        for j, brk in enumerate(REUSE_BREAKS_BYTES)
    }
    return (
        cols
        | far
        | {
            "missed_byte": cols["gathered_byte"] * unique * (table > cache_bytes),
            # a GPU sums each bag's rows in one chain of dependent loads, and writes one row per bag
            "pooling": cols["lookup"] / np.maximum(bags, 1.0),
            "pooled_byte": cols["gathered_byte"] / np.maximum(cols["lookup"], 1.0) * bags,
        }
    )


def fit_operator_models(rows: list[Measurement]) -> dict[str, Any]:
    """The `operators` section of a calibration: one model per measured operator, and host costs."""
    by_op: dict[str, list[tuple[Measurement, OpFeatures]]] = {}
    host_rows = []
    for m in rows:
        if m.family == "host" and "counts" in m.params:
            host_rows.append(m)
        elif "call" in m.params:
            name, f = row_features(m)
            key = f"{name}:{f.family}"
            by_op.setdefault(key, []).append((m, f))
    doc: dict[str, Any] = {"models": {}}
    for key, pairs in sorted(by_op.items()):
        if len(pairs) < 4:
            continue
        ms, feats = [p[0] for p in pairs], [p[1] for p in pairs]
        doc["models"][key] = fit_one(ms, feats)
    issue: dict[str, list[float]] = {}
    for pairs in by_op.values():
        for m, _ in pairs:
            if "host_issue_s" in m.params:
                issue.setdefault(_call_of(m).name, []).append(float(m.params["host_issue_s"]))
    if issue:
        doc["host_issue_s"] = {name: float(np.median(v)) for name, v in sorted(issue.items())}
    if host_rows:
        counts = np.array([[float(m.params["counts"].get(c, 0)) for c in HOST] for m in host_rows])
        t = np.array([m.time_s for m in host_rows])
        coef, _ = nnls(counts / t[:, None], np.ones(len(t)))
        doc["host_s"] = {c: float(v) for c, v in zip(HOST, coef, strict=True)}
        doc["host_fit_mean_abs_err"] = mean_abs_err(counts @ coef, t)
    return doc


def fit_one(rows: list[Measurement], feats: list[OpFeatures]) -> dict[str, Any]:
    """The model of one operator from its rows (form by family: module docstring)."""
    t = np.array([m.time_s for m in rows])
    family = feats[0].family
    sizes = np.array([f.size for f in feats])
    # the FLOPs or bytes the rows spanned (OperatorCostModel.extrapolations); lookups keep max_lookups
    fitted = {MEASURED_RANGE: [float(sizes.min()), float(sizes.max())]}
    if family in COMPUTE:
        return fit_shape_model([f.dims for f in feats], sizes, t) | fitted
    if family.startswith("embedding_bag"):
        best: dict[str, Any] = {}
        stats = [row_index_stats(m) for m in rows]
        caches = CACHE_CANDIDATES_BYTES if family == "embedding_bag_fwd" else MEMORY_BREAKS_BYTES
        second, breaks = SECOND_BREAKS.get(family, ("", (math.inf,)))
        for cache, n in itertools.product(caches, breaks):
            fit = fit_nonneg_linear(lookup_columns(feats, stats, cache, **({second: n} if second else {})), t)
            if not best or fit["fit_mean_abs_err"] < best["fit_mean_abs_err"]:
                best = {"form": "lookup", "cache_bytes": cache, **fit} | ({second: n} if n < math.inf else {})
        # how far the profile went: a linear model's price beyond it is an extrapolation
        return best | {"max_lookups": max(float(f.dims["lookups"]) for f in feats)}
    best = {}
    for brk in MEMORY_BREAKS_BYTES:
        fit = fit_nonneg_linear({"byte": sizes, "byte_if_large": sizes * (sizes >= brk)}, t)
        if not best or fit["fit_mean_abs_err"] < best["fit_mean_abs_err"]:
            best = {"form": "cache_linear", "break_bytes": brk, **fit}
    return best | fitted


class OperatorCostModel:
    """Seconds of an operator call on the device the `operators` section was fitted on."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.models: dict[str, dict[str, Any]] = doc.get("models", {})
        self.host_s: dict[str, float] = doc.get("host_s", dict.fromkeys(HOST, 0.0))
        self._by_name: dict[str, dict[str, Any]] = {k.rsplit(":", 1)[0]: v for k, v in self.models.items()}
        self._issue_s: dict[str, float] = doc.get("host_issue_s", {})
        # the FLOPs (a norm's, a memory-bound operator's: bytes) each model was fitted on (a calibration fitted
        # before they were recorded: none, nothing checked), and those priced on it since; only the most is
        # checked: below the least a shape model holds its ramp at the least size measured and a memory-bound
        # one tends to its constant, as small kernels measure flat (AnalyticCostModel.memory_s)
        fitted, units = {}, {}
        for key, fit in self.models.items():
            name, family = key.rsplit(":", 1)
            if MEASURED_RANGE in fit:
                fitted[name] = (float(fit[MEASURED_RANGE][0]), float(fit[MEASURED_RANGE][1]))
                units[name] = "FLOPs" if family in COMPUTE and family != "norm" else "bytes"
        self._ranges = FittedRanges(fitted, "profiled operator model", "model", units.__getitem__, below=False)

    def extrapolations(self) -> list[str]:
        """One line per operator model priced on FLOPs or bytes more than EXTRAPOLATION_FACTOR times the most
        its profile's rows spanned (embedding bags: dlrm/embedding.beyond_profile checks their lookups)."""
        return self._ranges.lines()

    def issue_s(self, name: str) -> float | None:
        """Host seconds to issue one call of `name` from Python on a GPU, where measured."""
        return self._issue_s.get(name, self._issue_s.get(SAME_KERNEL.get(name, "")))

    def measured_s(self, call: OpArgs, f: OpFeatures | None = None, index: IndexStats | None = None) -> float:
        """What a microbenchmark of this call alone would measure (its own host overhead included).
        `index`: what an embedding bag's indices are (uniform draws when None)."""
        return self.price(call.name, f or features(call), index)

    def price(self, op: str, f: OpFeatures, index: IndexStats | None = None) -> float:
        """What a microbenchmark of a call of operator `op` with features `f` would measure."""
        if f.family == "free":
            return 0.0
        name = next((n for n in (op, SAME_KERNEL.get(op, ""), OTHER_BACKEND.get(op, "")) if n in self._by_name), "")
        fit = self._by_name.get(name)
        if f.family in COMPUTE:
            if fit is None:
                raise OpModelError(f"{op}: no model for this operator (profile family {f.family!r} first)")
            self._ranges.note(name, f.size)
            return shape_model_s(fit, f)
        if f.family.startswith("embedding_bag"):
            if fit is None:
                raise OpModelError(f"{op}: no model for this operator (profile family 'embedding' first)")
            index = index or IndexStats.uniform(*_rows_lookups(f), f.dims["table_bytes"] / max(f.dims["rows"], 1))
            breaks = {name: fit[name] for name, _ in SECOND_BREAKS.values() if name in fit}
            cols = lookup_columns([f], [index], fit["cache_bytes"], **breaks)
            # a calibration fitted before a column existed prices it at zero
            return float(fit["alpha_s"] + sum(fit.get(f"s_per_{name}", 0.0) * col[0] for name, col in cols.items()))
        fallback = FALLBACK_MEMORY_OPS[op.endswith("_")]
        if fit is None:
            name, fit = fallback, self._by_name.get(fallback)
        if fit is None:
            raise OpModelError(f"{op}: no model for it nor for {fallback} (profile 'elementwise' first)")
        self._ranges.note(name, f.size)
        rate_s_per_byte = fit["s_per_byte"] + fit["s_per_byte_if_large"] * (f.size >= fit["break_bytes"])
        return float(fit["alpha_s"] + rate_s_per_byte * f.size)

    def has_model(self, name: str) -> bool:
        return name in self._by_name


def _rows_lookups(f: OpFeatures) -> tuple[int, int]:
    return int(f.dims["rows"]), int(f.dims["lookups"])


def operator_report(rows: list[Measurement], folds: int = 5, seed: int = 0) -> list[dict[str, Any]]:
    """Held-out geomean |error| per operator model (K-fold), next to a curve of size alone
    (t = α + size / (rate · eff(size)), the form of the analytic model) and a straight line
    t = a + b · size (pipeDejavu's predictive model), each refitted on the other folds."""
    from itercast.costs.fitting import geomean_abs_err

    by_op: dict[str, list[tuple[Measurement, OpFeatures]]] = {}
    for m in rows:
        if "call" in m.params:
            name, f = row_features(m)
            by_op.setdefault(f"{name}:{f.family}", []).append((m, f))
    rng = np.random.default_rng(seed)
    out = []
    for key, pairs in sorted(by_op.items()):
        if len(pairs) < 6:
            continue
        k_folds = min(folds, len(pairs) // 2)
        ms, feats = [p[0] for p in pairs], [p[1] for p in pairs]
        t = np.array([m.time_s for m in ms])
        size = np.array([max(f.size, 1.0) for f in feats])
        fold = rng.permutation(len(ms)) % k_folds
        pred = {name: np.empty(len(ms)) for name in ("model", "size_curve", "straight_line")}
        for k in range(k_folds):
            train, test = np.flatnonzero(fold != k), np.flatnonzero(fold == k)
            fit = fit_one([ms[i] for i in train], [feats[i] for i in train])
            model = OperatorCostModel({"models": {key: fit}})
            for i in test:
                pred["model"][i] = model.measured_s(_call_of(ms[i]), feats[i], row_index_stats(ms[i]))
            rate = float(np.max(size[train] / t[train]))
            c = fit_latency_curve(size[train], t[train], rate)
            pred["size_curve"][test] = c["alpha_s"] + size[test] / (
                rate * eff(size[test], c["e_max"], c["log_half"], c["gamma"])
            )
            a, b = np.polynomial.polynomial.polyfit(size[train], t[train], 1)
            pred["straight_line"][test] = a + b * size[test]
        small = size <= np.quantile(size, 0.25)
        out.append(
            {
                "operator": key,
                "rows": len(ms),
                **{name: geomean_abs_err(p, t) for name, p in pred.items()},
                **{f"{name}_smallest_quarter": geomean_abs_err(p[small], t[small]) for name, p in pred.items()},
            }
        )
    return out


def row_index_stats(m: Measurement) -> IndexStats:
    """What an embedding microbenchmark row's indices were: as recorded (profile/microbench), else,
    for a database recorded before hot_fraction was, the expectation for the distribution drawn from."""
    recorded = m.params.get("features", {})
    hot = recorded.get("hot_fraction")
    if hot is None:
        rows = max(int(m.params.get("rows", 1)), 1)
        hot = zipf_hot_fraction(rows, ZIPF_ALPHA) if m.params.get("distribution") == "zipf" else 1.0 / rows
    return IndexStats(float(recorded.get("unique_fraction", 1.0)), float(hot), _row_reuse(m))


def _row_reuse(m: Measurement) -> tuple[float, ...]:
    """The expected reuse distances of a microbenchmark row's indices (IndexStats.reuse_beyond)."""
    p = m.params
    if not {"rows", "dim", "pooling", "batch"} <= set(p):
        return IndexStats(1.0, 0.0).reuse_beyond
    alpha = ZIPF_ALPHA if p.get("distribution") == "zipf" else 0.0
    return IndexStats.zipf(int(p["rows"]), int(p["pooling"] * p["batch"]), alpha, 4.0 * p["dim"]).reuse_beyond


def _call_of(m: Measurement) -> OpCall:
    c = m.params["call"]
    return OpCall(
        str(c["name"]),
        list(c["input_shapes"]),
        [str(x) for x in c["input_types"]],
        list(c.get("input_strides", [])),
        list(c.get("output_shapes", [])),
        [str(x) for x in c.get("output_types", [])],
        tuple(c.get("input_scalars", ())),
    )
