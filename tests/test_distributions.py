"""Fitting a distribution family by KS distance."""

from __future__ import annotations

import numpy as np
import pytest

from itercast.stochastic.distributions import fit_best


@pytest.mark.parametrize(
    "family,draw",
    [
        ("gamma", lambda rng: rng.gamma(2.0, 1.5, 5000)),
        ("normal", lambda rng: rng.normal(10.0, 1.0, 5000)),
        ("lognormal", lambda rng: rng.lognormal(0.0, 0.8, 5000)),
    ],
)
def test_the_generating_family_fits_best_or_nearly(family, draw):
    fitted = fit_best(draw(np.random.default_rng(0)))
    assert fitted.ks < 0.02
    assert fitted.family == family or fitted.ks < 0.015  # gamma and lognormal can tie on a sample


def test_fitted_gamma_recovers_its_mean_and_quantiles():
    rng = np.random.default_rng(1)
    x = rng.gamma(4.0, 0.25, 20_000)
    fitted = fit_best(x)
    assert fitted.sample(rng, 200_000).mean() == pytest.approx(1.0, rel=0.01)
    assert float(fitted.ppf(0.95)) == pytest.approx(np.percentile(x, 95), rel=0.02)


def test_too_few_samples_is_an_error():
    with pytest.raises(ValueError, match="at least 8"):
        fit_best(np.ones(3))
