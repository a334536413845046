"""validation/variability_cpu.py's pure functions: the KS and p95 comparison, the calibration of an
un-slowed run and the prediction of a slowed one, on values computed by hand (no process is run)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
from variability_cpu import Calibration, calibrate, compare, noise_model, predict_steps


def test_compare_by_hand():
    # empirical CDFs of [1, 2, 3, 4] and [2.5, 3.5, 5, 6]: at 2, 3 and 4 they differ by 0.5 - 0 = 0.75 - 0.25 = 1 - 0.5
    # p95 (linear interpolation at index 0.95 × 3 = 2.85): 3 + 0.85 = 3.85 and 5 + 0.85 = 5.85
    # centred (÷ medians 2.5 and 4.25): [.4, .8, 1.2, 1.6] against [.588, .824, 1.176, 1.412]: largest gap 0.25
    ks, p95_err, ks_centred = compare(np.array([1.0, 2.0, 3.0, 4.0]), np.array([2.5, 3.5, 5.0, 6.0]))
    assert ks == pytest.approx(0.5)
    assert p95_err == pytest.approx(3.85 / 5.85 - 1)
    assert ks_centred == pytest.approx(0.25)


def test_calibrate_by_hand():
    # (start, compute end, all-reduce end) per rank and step
    times = np.array(
        [
            [[0.0, 1.0, 1.5], [1.5, 2.3, 3.0]],  # rank 0: compute 1.0 and 0.8 (mean 0.9)
            [[0.0, 1.2, 1.5], [1.5, 2.6, 3.0]],  # rank 1: compute 1.2 and 1.1 (mean 1.15)
        ]
    )
    cal = calibrate(times)
    assert cal.compute_s == pytest.approx((0.9, 1.15))
    # compute / its rank's mean: 1.1111, 0.8889, 1.0435, 0.9565; population std sqrt((2 × 0.1111² + 2 × 0.04348²) / 4)
    assert cal.compute_cv == pytest.approx(math.sqrt((2 * (0.1 / 0.9) ** 2 + 2 * (0.05 / 1.15) ** 2) / 4))
    # transfer: end of the all-reduce minus the last compute end: 1.5 - 1.2 = 0.3, 3.0 - 2.6 = 0.4; CV 0.05 / 0.35
    assert cal.comm_s == pytest.approx(0.35)
    assert cal.comm_cv == pytest.approx(0.05 / 0.35)


def test_prediction_without_noise_is_the_slowest_rank_plus_the_collective():
    cal = Calibration(compute_s=(1e-3, 2e-3), compute_cv=0.0, comm_s=0.5e-3, comm_cv=0.0)
    # rank 0 slowed by 1.5 ms: max(1 + 1.5, 2) + 0.5 = 3.0 ms; rank 1 by 1 ms: max(1, 2 + 1) + 0.5 = 3.5 ms
    assert predict_steps(cal, 0, 1.5e-3, 100) == pytest.approx(np.full(100, 3.0e-3))
    assert predict_steps(cal, 1, 1e-3, 100) == pytest.approx(np.full(100, 3.5e-3))
    # nobody slowed: max(1, 2) + 0.5 = 2.5 ms
    assert predict_steps(cal, -1, 0.0, 100) == pytest.approx(np.full(100, 2.5e-3))


def test_prediction_of_one_noisy_rank_is_its_log_normal():
    # one rank, 1 ms at CV 20%, no collective time: a log-normal of mean 1 ms, median exp(-σ²/2) ms, σ² = ln(1.04)
    cal = Calibration(compute_s=(1e-3,), compute_cv=0.2, comm_s=0.0, comm_cv=0.0)
    steps = predict_steps(cal, -1, 0.0, 40_000, seed=1)
    assert steps.mean() == pytest.approx(1e-3, rel=0.01)
    assert np.median(steps) == pytest.approx(1e-3 * math.exp(-math.log(1.04) / 2), rel=0.01)


def test_calibration_measures_the_ranks_correlation():
    # log compute of rank 0 (1.0 → 0.8) and rank 1 (1.2 → 1.1) both fall: two points correlate +1
    times = np.array([[[0.0, 1.0, 1.5], [1.5, 2.3, 3.0]], [[0.0, 1.2, 1.5], [1.5, 2.6, 3.0]]])
    assert calibrate(times).rank_correlation == pytest.approx(1.0)


def test_shared_noise_splits_the_log_variance_by_the_correlation():
    # compute CV 0.3, comm CV 0.4, ρ 0.5: σc² = ln 1.09, σt² = ln 1.16, σs² = 0.5 ln 1.09;
    # step_cv = sqrt(e^σs² − 1) = sqrt(1.09^0.5 − 1); compute keeps sqrt(e^(σc² − σs²) − 1) = the same;
    # comm keeps sqrt(1.16 / 1.09^0.5 − 1)
    cal = Calibration(compute_s=(1e-3, 1e-3), compute_cv=0.3, comm_s=1e-3, comm_cv=0.4, rank_correlation=0.5)
    model = noise_model(cal, shared=True)
    assert model.step_cv == pytest.approx(math.sqrt(1.09**0.5 - 1))
    assert model.compute_cv == pytest.approx(math.sqrt(1.09**0.5 - 1))
    assert model.comm_cv == pytest.approx(math.sqrt(1.16 / 1.09**0.5 - 1))
    independent = noise_model(cal, shared=False)
    assert (independent.compute_cv, independent.comm_cv, independent.step_cv) == (0.3, 0.4, 0.0)


def test_fully_shared_noise_has_no_max_of_two_inflation():
    # two ranks of 1 ms whose only noise is one shared factor (CV 20%): the step is 1 ms × that factor,
    # a log-normal of σ² = ln 1.04, p95 = exp(1.6449 σ − σ²/2) ms (not the larger p95 of a maximum of two)
    cal = Calibration(compute_s=(1e-3, 1e-3), compute_cv=0.2, comm_s=0.0, comm_cv=0.2, rank_correlation=1.0)
    steps = predict_steps(cal, -1, 0.0, 40_000, seed=2, shared=True)
    sigma = math.sqrt(math.log(1.04))
    assert np.percentile(steps, 95) == pytest.approx(1e-3 * math.exp(1.6449 * sigma - sigma**2 / 2), rel=0.01)


def test_the_shared_step_factor_scales_the_collective_too():
    # 1 ms of compute on each of two ranks, then a 1 ms all-reduce, the only noise one shared factor
    # (CV 20%, σ² = ln 1.04): the step is 2 ms × that factor, p95 = 2 ms × exp(1.6449 σ − σ²/2) =
    # 2.716 ms; were the collective spared, 1 ms × factor + 1 ms would give 2.358 ms
    cal = Calibration(compute_s=(1e-3, 1e-3), compute_cv=0.2, comm_s=1e-3, comm_cv=0.2, rank_correlation=1.0)
    steps = predict_steps(cal, -1, 0.0, 40_000, seed=3, shared=True)
    sigma = math.sqrt(math.log(1.04))
    assert np.percentile(steps, 95) == pytest.approx(2e-3 * math.exp(1.6449 * sigma - sigma**2 / 2), rel=0.01)
