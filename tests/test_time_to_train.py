"""Time to train with failures: closed form by hand, Monte Carlo against it, best interval, deadlines."""

from __future__ import annotations

import math

import pytest

from itercast.stochastic.time_to_train import (
    HOUR_S,
    FailureModel,
    best_interval_s,
    expected_time_s,
    sample_time_s,
    time_to_train,
)

FM = FailureModel(mtbf_per_gpu_s=1000 * HOUR_S, checkpoint_s=0.1 * HOUR_S, restart_s=0.2 * HOUR_S)


def test_closed_form_by_hand():
    # 10 h of work, 1 h segments, 0.1 h checkpoints, 0.2 h restarts, 100 GPUs of 1000 h MTBF (λ = 0.1/h):
    # 10 × (e^{0.1·1.1} − 1) × (1/0.1 + 0.2) h = 10 × 0.116278 × 10.2 h = 11.860 h
    rate = FM.job_failure_rate(100)
    assert rate == pytest.approx(0.1 / HOUR_S)
    assert expected_time_s(10 * HOUR_S, HOUR_S, rate, FM) / HOUR_S == pytest.approx(10 * math.expm1(0.11) * 10.2)


def test_without_failures_only_checkpoints_cost_time():
    assert expected_time_s(10 * HOUR_S, HOUR_S, 0.0, FM) == pytest.approx(11 * HOUR_S)


def test_monte_carlo_mean_matches_the_closed_form():
    rate = FM.job_failure_rate(2000)  # 2 failures per hour
    work, tau = 200 * HOUR_S, 0.5 * HOUR_S
    draws = sample_time_s(work, tau, rate, FM, 40_000, seed=1)
    assert draws.mean() == pytest.approx(expected_time_s(work, tau, rate, FM), rel=0.005)


def test_best_interval_minimises_and_is_near_young():
    rate = FM.job_failure_rate(100)
    best = best_interval_s(1000 * HOUR_S, rate, FM)
    e = lambda t: expected_time_s(1000 * HOUR_S, t, rate, FM)  # noqa: E731
    assert e(best) <= min(e(best * 0.7), e(best * 1.4))
    assert best == pytest.approx(math.sqrt(2 * FM.checkpoint_s / rate), rel=0.15)


def test_deadline_probability_and_goodput():
    r = time_to_train(
        step_s=10.0,
        steps=100_000,
        num_gpus=16_384,
        fm=FailureModel(50_000 * HOUR_S, 300, 900),
        deadline_s=14 * 24 * HOUR_S,
    )
    assert 0 < r.goodput < 1 and r.expected_s > r.work_s
    assert r.quantiles_s["p50"] <= r.quantiles_s["p99"]
    loose = time_to_train(10.0, 100_000, 16_384, FailureModel(50_000 * HOUR_S, 300, 900), deadline_s=1e12)
    assert loose.deadline_probability == 1.0


def test_a_run_shorter_than_an_interval_checkpoints_once():
    rate = FM.job_failure_rate(8)
    assert best_interval_s(3600.0, rate, FM) == 3600.0
