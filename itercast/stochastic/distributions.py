"""Distributions fitted to measured durations, the family chosen by Kolmogorov–Smirnov distance."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

#: candidate families (scipy.stats), all fitted by maximum likelihood
FAMILIES = {"normal": stats.norm, "gamma": stats.gamma, "lognormal": stats.lognorm}


@dataclass(frozen=True)
class Fitted:
    """A fitted distribution: its family, scipy parameters and the KS distance to the data it was fitted on."""

    family: str
    params: tuple[float, ...]
    ks: float

    @property
    def dist(self) -> stats.rv_continuous:
        return FAMILIES[self.family](*self.params)

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        return self.dist.rvs(size=size, random_state=rng)

    def ppf(self, q: np.ndarray | float) -> np.ndarray:
        return self.dist.ppf(q)


def fit_best(samples: np.ndarray) -> Fitted:
    """The family with the smallest KS distance to `samples` (at least 8 finite values)."""
    x = np.asarray(samples, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size < 8:
        raise ValueError(f"fit_best needs at least 8 finite samples; got {x.size}")
    best: Fitted | None = None
    for name, family in FAMILIES.items():
        params = tuple(float(p) for p in family.fit(x))
        ks = float(stats.kstest(x, family(*params).cdf).statistic)
        if best is None or ks < best.ks:
            best = Fitted(name, params, ks)
    assert best is not None
    return best
