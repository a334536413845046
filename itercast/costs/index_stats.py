"""What the indices of an embedding operator call are, as its cost model reads them (IndexStats):
distinct rows, the most frequent row's share, and binned reuse (LRU stack) distances; from a named
distribution (uniform, Zipf), a sample's row frequencies, or a real sample in its order.

Split from costs/op_model.py (the operator models that read these statistics).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np


def unique_fraction_uniform(rows: int, lookups: int) -> float:
    """Expected fraction of distinct rows among `lookups` uniform draws from `rows` rows:
    rows·(1 − (1 − 1/rows)^lookups) / lookups."""
    if lookups <= 0 or rows <= 0:
        return 1.0
    return rows * -math.expm1(lookups * math.log1p(-1.0 / rows)) / lookups if rows > 1 else 1.0 / lookups


def unique_fraction_zipf(rows: int, lookups: int, alpha: float) -> float:
    """Expected fraction of distinct rows among `lookups` draws from `rows` rows with Zipf
    probabilities p_r ∝ r^−alpha (r = 1..rows): Σ_r (1 − (1 − p_r)^lookups) / lookups over the
    table's row classes (zipf_classes: exact up to 2^20 rows, bounded for tables of 10^10).
    alpha = 0 is uniform."""
    if lookups <= 0 or rows <= 0:
        return 1.0
    p, weight = zipf_classes(rows, alpha)
    return min(1.0, expected_distinct(p, weight, lookups) / lookups)


def zipf_hot_fraction(rows: int, alpha: float) -> float:
    """The most frequent row's probability among `rows` Zipf rows: 1 / Σ_r r^−alpha."""
    return IndexStats.zipf(rows, 1, alpha, 1.0).hot_fraction


def zipf_classes(rows: int, alpha: float, exact: int = 1 << 20) -> tuple[np.ndarray, np.ndarray]:
    """A Zipf table's rows as classes: (probability of each row of the class, rows in it). Rows
    1..exact one class each; beyond, 1024 geometric blocks of rows a … b − 1, each row at the
    block's mean, ∫ x^−alpha dx over [a − ½, b − ½] / (b − a) (the midpoint rule: a 2.7% spread of
    r^−alpha within a block of 10^10 rows). Memory and time stay bounded for any table."""
    rows = max(rows, 1)
    head = np.arange(1, min(rows, exact) + 1, dtype=np.float64)
    values, weights = [head**-alpha], [np.ones_like(head)]
    if rows > exact:
        edges = np.unique(np.geomspace(exact + 1, rows + 1, 1025).astype(np.int64)).astype(np.float64)
        a, b = edges[:-1] - 0.5, edges[1:] - 0.5
        mass = np.log(b / a) if alpha == 1 else (b ** (1 - alpha) - a ** (1 - alpha)) / (1 - alpha)
        values.append(mass / (b - a))
        weights.append(b - a)
    p, weight = np.concatenate(values), np.concatenate(weights)
    return p / float(np.sum(p * weight)), weight


def sample_classes(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A sample's rows as classes: (probability of each row of a class, rows in it), rows that
    appear equally often together, in ascending probability (the most frequent last)."""
    values, rows = np.unique(counts[counts > 0], return_counts=True)
    return values / float(counts.sum()), rows.astype(np.float64)


def expected_distinct(p: np.ndarray, weight: np.ndarray, draws: float) -> float:
    """Expected distinct rows among `draws` independent draws, rows in classes of `weight` rows of
    probability `p` each: Σ_r weight_r (1 − (1 − p_r)^draws)."""
    return float(np.sum(weight * -np.expm1(draws * np.log1p(-np.minimum(p, 1 - 1e-16)))))


#: stack-distance breaks of a lookup's previous access to its row, in bytes of the distinct rows
#: touched in between (IndexStats.reuse_beyond): a GPU SM's L1, an L2 slice, a large cache
REUSE_BREAKS_BYTES = (1 << 16, 1 << 20, 1 << 24)


@dataclass(frozen=True)
class IndexStats:
    """What the indices of one embedding-operator call do to its cost, per call of L lookups.

    unique_fraction: distinct rows / L (each distinct row is a segment of the sorted indices, a
    cache miss, a row written); hot_fraction: the share of the L lookups that go to the most
    frequent row. A GPU's embedding backward sums each distinct row's lookups in partial segments
    of a few rows and then, per row, those partial sums one after another (PyTorch's
    embedding_backward_cuda_kernel): the most frequent row's L·hot_fraction lookups are a serial
    chain. It is why Zipf indices make the H100's backward 5× slower at a million lookups
    (data/measured/h100_profile.db: 10k × 32 table, 8192 × 128 lookups: 0.35 ms uniform, 1.66 ms
    Zipf 1.05). reuse_beyond: the binned reuse distances, the shares of the L lookups that repeat
    a row last looked up more than each of REUSE_BREAKS_BYTES of other distinct rows earlier
    (function reuse_beyond; zeros when unknown: every repeat near)."""

    unique_fraction: float
    hot_fraction: float
    reuse_beyond: tuple[float, ...] = (0.0,) * len(REUSE_BREAKS_BYTES)

    @classmethod
    def uniform(cls, rows: int, lookups: int, row_bytes: float) -> IndexStats:
        """Uniform draws: each row is drawn with probability 1/rows."""
        return _named_index_stats(max(rows, 1), lookups, 0.0, row_bytes)

    @classmethod
    def zipf(cls, rows: int, lookups: int, alpha: float, row_bytes: float) -> IndexStats:
        """Zipf draws p_r ∝ r^−alpha: the most frequent row has p_1 = 1 / Σ_r r^−alpha."""
        return _named_index_stats(max(rows, 1), lookups, alpha, row_bytes)

    @classmethod
    def sampled(cls, counts: np.ndarray, lookups: int, row_bytes: float) -> IndexStats:
        """Draws from a sample's row frequencies (`counts[i]`: how often row i appears; rows absent
        from the sample are never drawn)."""
        p, weight = sample_classes(counts)
        reuse = reuse_beyond(p, weight, lookups, row_bytes)
        unique = min(1.0, expected_distinct(p, weight, max(lookups, 1)) / max(lookups, 1))
        return cls(unique, float(p[-1]), reuse)

    @classmethod
    def from_sequence(cls, indices: np.ndarray, lookups: int, row_bytes: float) -> IndexStats:
        """A real sample of indices in its order, cut into consecutive calls of `lookups` (the whole
        sample when shorter), each call measured as it runs: distinct rows / lookups, the most
        frequent row's share, and the shares of lookups whose LRU stack distance (distinct other
        rows since the row's previous lookup in the call, × row_bytes) exceeds each
        REUSE_BREAKS_BYTES; means over the calls. Unlike `sampled`, order counts: a sorted sample
        repeats each row at once, a shuffled one far apart."""
        seq = np.asarray(indices, dtype=np.int64).ravel()
        size = max(1, min(int(lookups), seq.size))
        calls = [seq[i : i + size] for i in range(0, seq.size - size + 1, size)]
        unique, hot, beyond = [], [], []
        for call in calls:
            counts = np.unique(call, return_counts=True)[1]
            unique.append(counts.size / size)
            hot.append(counts.max() / size)
            distance = stack_distances(call) * row_bytes
            beyond.append([np.count_nonzero(distance > brk) / size for brk in REUSE_BREAKS_BYTES])
        return cls(float(np.mean(unique)), float(np.mean(hot)), tuple(float(x) for x in np.mean(beyond, axis=0)))


def stack_distances(seq: np.ndarray) -> np.ndarray:
    """LRU stack distance of each repeated lookup: the distinct other rows looked up since the
    row's previous lookup (Mattson et al. 1970); first lookups are left out. A Fenwick tree over
    positions holding 1 at each row's latest lookup counts them in O(n log n)."""
    n = seq.size
    tree = np.zeros(n + 1, dtype=np.int64)

    def add(i: int, v: int) -> None:
        i += 1
        while i <= n:
            tree[i] += v
            i += i & -i

    def prefix(i: int) -> int:  # ones at positions < i
        total = 0
        while i > 0:
            total += int(tree[i])
            i -= i & -i
        return total

    last: dict[int, int] = {}
    out = []
    for i, row in enumerate(seq.tolist()):
        p = last.get(row)
        if p is not None:
            out.append(prefix(i) - prefix(p + 1))
            add(p, -1)
        add(i, 1)
        last[row] = i
    return np.array(out, dtype=np.float64)


@functools.lru_cache(maxsize=4096)
def _named_index_stats(rows: int, lookups: int, alpha: float, row_bytes: float) -> IndexStats:
    """IndexStats of uniform (alpha 0) or Zipf draws; remembered, as a trace or a planner asks for
    the same tables again and again. Reuse distances over coarse row classes (zipf_classes with 2^12
    exact rows: as exact to 1e-4 as the distinct rows, tests/test_et_predict.py)."""
    if alpha == 0:
        reuse = reuse_beyond(np.array([1.0 / rows]), np.array([float(rows)]), lookups, row_bytes)
        return IndexStats(unique_fraction_uniform(rows, lookups), 1.0 / rows, reuse)
    p, weight = zipf_classes(rows, alpha, exact=1 << 12)
    reuse = reuse_beyond(p, weight, lookups, row_bytes)
    return IndexStats(unique_fraction_zipf(rows, lookups, alpha), float(p[0]), reuse)


def reuse_beyond(p: np.ndarray, weight: np.ndarray, lookups: int, row_bytes: float) -> tuple[float, ...]:
    """Shares of a call's `lookups` independent draws (row probabilities `p`, each of `weight` rows)
    that repeat a row whose previous draw lies more than each REUSE_BREAKS_BYTES earlier, counted in
    bytes of the distinct rows drawn in between: the LRU stack distance, beyond which a cache of
    that size has lost the row (Mattson et al. 1970; the reference DLRM model's binned reuse
    distances). A repeat k draws after the row's previous draw is at stack distance D(k − 1), the
    expected distinct rows among k − 1 draws, D(n) = Σ_r (1 − (1 − p_r)^n) (time to stack distance,
    Shen et al. 2007). The draw at position i repeats a row last drawn at least g draws earlier
    with probability Σ_r p_r (q_r^min(g−1, i) − q_r^i), q_r = 1 − p_r, averaged over i < L."""
    draws = max(int(lookups), 1)
    log_q = np.log1p(-np.minimum(p, 1 - 1e-16))
    n = np.unique(np.round(np.geomspace(1, draws, 48)))
    distinct = np.array([expected_distinct(p, weight, k) for k in n])

    def mean_power(c: float) -> np.ndarray:
        """Mean over i = 0 … L − 1 of q^min(c, i), per row class."""
        c = min(c, draws)
        return (-np.expm1(c * log_q) / np.maximum(p, 1e-300) + (draws - c) * np.exp(c * log_q)) / draws

    whole = mean_power(draws)
    out = []
    for brk in REUSE_BREAKS_BYTES:
        rows = brk / row_bytes
        if rows >= distinct[-1]:
            out.append(0.0)
            continue
        gap = 1.0 + float(np.interp(rows, distinct, n))  # the draws between at that stack distance, + 1
        out.append(float(np.sum(weight * p * (mean_power(gap - 1.0) - whole))))
    return tuple(max(x, 0.0) for x in out)
