"""The elementwise curve's asymptote: what HBM moves, measured, by hand.

This project's H100 profile (data/measured/h100_profile.db, caches flushed before every run) times
pointwise kernels up to 2^28 fp32 elements. Beyond 1 GiB they move (median of 3 passes, bytes read
plus written / time; the rows as the database holds them):
  add      1,610,612,736 B in 0.533 ms → 3.02 TB/s;  3,221,225,472 B in 1.059 ms → 3.04 TB/s
  add_     1,610,612,736 B in 0.531 ms → 3.03 TB/s;  3,221,225,472 B in 1.059 ms → 3.04 TB/s
  gelu     1,073,741,824 B in 0.360 ms → 2.99 TB/s;  2,147,483,648 B in 0.714 ms → 3.01 TB/s
  gelu_backward  1.61e9 B in 0.531 ms → 3.03 TB/s;         3.22e9 B in 1.060 ms → 3.04 TB/s
and mul and relu alike: about 3.03 TB/s of the datasheet's 3.35, so 0.90. Vidur's adds, timed back
to back on tensors the 50 MB L2 held, had put the asymptote at 1.04 (3.8 TB/s at 38 MB).
"""

from __future__ import annotations

import math
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest

from itercast.costs.curves import curves
from itercast.costs.fitting import fit_latency_curve

ROOT = Path(__file__).resolve().parents[1]


def test_the_h100_profile_moves_0_90_of_the_datasheet_bandwidth_beyond_1_gib():
    db = sqlite3.connect(ROOT / "data" / "measured" / "h100_profile.db")
    # every pass of the 1 GiB-and-larger add: 3 passes each of 1.61e9 and 3.22e9 bytes
    rows = db.execute(
        "SELECT size, time_s FROM measurements WHERE family='elementwise' AND op='add' AND size >= 1073741824"
    ).fetchall()
    db.close()
    assert len(rows) == 6
    # each pass between 2.9 and 3.1 TB/s: 0.87–0.93 of 3.35 TB/s, never above it
    assert all(2.9e12 < size / t < 3.1e12 for size, t in rows)


def test_the_committed_elementwise_curve_levels_off_at_0_904_of_hbm():
    fit = curves()["memory"]["elementwise"]
    assert fit["e_max"] == pytest.approx(0.904, abs=0.002)
    # at 10 GB the ramp is 1 to within 3e-5: 1e10 B / (3.35e12 B/s · 0.904) = 3.302 ms on an H100
    ramp = 1 / (1 + math.exp(fit["gamma"] * (fit["log_half"] - math.log(1e10))))
    assert ramp == pytest.approx(1.0, abs=1e-4)
    assert fit["alpha_s"] + 1e10 / (3.35e12 * fit["e_max"] * ramp) == pytest.approx(3.302e-3, rel=1e-3)


def test_fit_latency_curve_keeps_a_pinned_e_max_and_recovers_the_rest():
    # exact data of alpha 2 µs, e_max 0.9, log_half 15, gamma 1.2 at a rate of 1e12 B/s
    x = np.logspace(4, 10, 40)
    e = 0.9 / (1 + np.exp(1.2 * (15 - np.log(x))))
    t = 2e-6 + x / (1e12 * e)
    fit = fit_latency_curve(x, t, 1e12, e_max=0.9)
    assert fit["e_max"] == 0.9
    assert fit["alpha_s"] == pytest.approx(2e-6, rel=1e-3)
    assert fit["log_half"] == pytest.approx(15.0, rel=1e-3)
    assert fit["gamma"] == pytest.approx(1.2, rel=1e-3)
    # pinned at another value the fit cannot match the data exactly: its error is above zero
    assert fit_latency_curve(x, t, 1e12, e_max=1.04)["fit_mean_abs_err"] > 0.01


def test_the_fitting_tool_pins_the_curve_from_the_profile():
    sys.path.insert(0, str(ROOT / "tools"))
    from fit_efficiency_curves import h100_pointwise_efficiency

    assert h100_pointwise_efficiency() == pytest.approx(0.904, abs=0.002)


def test_the_fitting_tool_measures_the_softmax_shares_from_the_profile():
    """Rows of 512 and 4,096 elements from 64 MiB on: forward 0.71-0.89 of HBM, backward 0.40-0.46; over the
    elementwise curve (0.89-0.90 there) medians 0.805 and 0.493 (transformer_ops.SOFTMAX_BANDWIDTH_SHARE)."""
    sys.path.insert(0, str(ROOT / "tools"))
    from fit_efficiency_curves import h100_softmax_shares

    assert h100_softmax_shares() == pytest.approx({"fwd": 0.805, "bwd": 0.493}, abs=5e-4)


def test_the_fitting_tool_measures_the_cross_entropy_share_from_the_campaign():
    """The lent H200's 12 fp32 cross-entropies (32,000-256,000 vocab, 4,096 and 8,192 tokens): the elementwise
    curve prices their bytes at 0.84-0.87 of the time measured, median 0.853
    (transformer_ops.CROSS_ENTROPY_BANDWIDTH_SHARE)."""
    sys.path.insert(0, str(ROOT / "tools"))
    from fit_efficiency_curves import h200_cross_entropy_share

    assert h200_cross_entropy_share() == pytest.approx(0.853, abs=5e-4)


def test_a_memory_bound_kernel_below_the_curves_least_time_size_takes_the_time_it_takes_there():
    """gamma 1.25, log_half ln 1e6, e_max 1 on HBM = 1e11 B/s: x / eff(x) = x + 1e7.5 · x^−0.25 is least where
    x^1.25 = 0.25 · 1e7.5, x* = 1e6 · 0.25^0.8 = 1e6 · e^(0.8 · −1.386294) = 329,877 B; there
    eff = 1 / (1 + 1 / 0.25) = 0.2, so t* = 329,877 / (0.2 · 1e11) = 16.494 µs. One byte was 1e6^1.25 / 1e11
    = 316 µs before; a kernel does not take longer for moving less (test_golden: the linear curves)."""
    from test_golden import SYSTEM, linear_calibration

    from itercast.config.system import SystemConfig
    from itercast.costs.analytic import AnalyticCostModel
    from itercast.costs.curves import Curve

    rising = Curve(1.0, math.log(1e6), 1.25)
    assert rising.least_time_size() == pytest.approx(329_877, rel=1e-5)
    assert Curve(1.0, math.log(1e6), 1.0).least_time_size() == 0.0  # gamma 1: x / eff(x) = x + 1e6 never falls
    calibration = linear_calibration()
    calibration["memory"]["elementwise"] = {"alpha_s": 0.0, "e_max": 1.0, "log_half": math.log(1e6), "gamma": 1.25}
    costs = AnalyticCostModel(SystemConfig.model_validate(SYSTEM), "bf16", calibration)
    for nbytes in (1, 1_000, 329_000):
        assert float(costs.memory_s("elementwise", nbytes)) == pytest.approx(16.494e-6, rel=1e-4)
    # above x* the curve as fitted: 1e7 B, eff = 1 / (1 + (1e6 / 1e7)^1.25) = 1 / 1.056234, 1e7 · 1.056234 / 1e11
    assert float(costs.memory_s("elementwise", 1e7)) == pytest.approx(105.6234e-6, rel=1e-5)
    assert float(costs.memory_s("elementwise", 0)) == 0.0
    # the linear norm curve (gamma 0) is untouched: 1 byte in 1e-11 s
    assert float(costs.memory_s("norm", 1)) == pytest.approx(1e-11)
