"""Time to train with failures: closed form by hand, Monte Carlo against it, best interval, deadlines."""

from __future__ import annotations

import math

import pytest

from itercast.stochastic.time_to_train import (
    HOUR_S,
    FailureModel,
    best_interval_s,
    effective_training_time,
    expected_time_s,
    longest_restart_s,
    sample_time_s,
    time_to_train,
)

FM = FailureModel(mtbf_per_gpu_s=1000 * HOUR_S, checkpoint_s=0.1 * HOUR_S, restart_s=0.2 * HOUR_S)


def test_closed_form_by_hand():
    # 10 h of work, 1 h segments, 0.1 h checkpoints, 0.2 h restarts, 100 GPUs of 1000 h MTBF (λ = 0.1/h),
    # failures during restarts too (Daly 2006): 10 × (e^{0.1·1.1} − 1) / 0.1 × e^{0.1·0.2} h
    # = 10 × 0.116278 × 10 × 1.020201 h = 11.863 h
    rate = FM.job_failure_rate(100)
    assert rate == pytest.approx(0.1 / HOUR_S)
    hand_h = 10 * math.expm1(0.11) / 0.1 * math.exp(0.02)
    assert expected_time_s(10 * HOUR_S, HOUR_S, rate, FM) / HOUR_S == pytest.approx(hand_h)
    assert hand_h == pytest.approx(11.863, abs=5e-4)


def test_effective_training_time_by_hand():
    # one 1 h segment takes (e^{0.11} − 1) / 0.1 × e^{0.02} h = 1.162781 × 1.020201 h = 1.186270 h: 84.30% useful
    rate = FM.job_failure_rate(100)
    assert effective_training_time(HOUR_S, rate, FM) == pytest.approx(1 / (math.expm1(0.11) / 0.1 * math.exp(0.02)))
    assert effective_training_time(HOUR_S, rate, FM) == pytest.approx(0.8430, abs=5e-5)


def test_best_interval_reproduces_daly_2006_figures():
    # Daly (FGCS 2006) Figs. 3-5: δ = 5 min, R = 10 min; M = 24 h -> τ_opt 117 min, 6 h -> 57 min, 15 min -> 9.1 min
    for mtbf_min, daly_min in ((24 * 60, 117), (6 * 60, 57), (15, 9.1)):
        fm = FailureModel(mtbf_per_gpu_s=mtbf_min * 60, checkpoint_s=5 * 60, restart_s=10 * 60)
        best_min = best_interval_s(500 * HOUR_S, fm.job_failure_rate(1), fm) / 60
        assert best_min == pytest.approx(daly_min, rel=0.01)


def test_llama3_interruptions_give_the_per_gpu_mtbf_and_the_count_back():
    # 419 unexpected interruptions in 54 days on 16,384 GPUs (arXiv 2407.21783 §3.3.4):
    # per-GPU MTBF = 16,384 × 54 × 24 h / 419 = 50,676.5 h; the job's MTBF 54 × 24 h / 419 = 3.093 h
    fm = FailureModel.from_interruptions(419, 54 * 24 * HOUR_S, 16_384, checkpoint_s=10.0, restart_s=600.0)
    assert fm.mtbf_per_gpu_s / HOUR_S == pytest.approx(16_384 * 54 * 24 / 419)
    assert 1 / fm.job_failure_rate(16_384) / HOUR_S == pytest.approx(3.0931, abs=1e-4)
    # a run whose expected wall time is 54 days expects 419 interruptions, restarts included
    rate = fm.job_failure_rate(16_384)
    tau = best_interval_s(math.inf, rate, fm)
    work_s = 54 * 24 * HOUR_S * effective_training_time(tau, rate, fm)
    r = time_to_train(work_s / 1000, 1000, 16_384, fm, interval_s=tau)
    assert r.expected_s / HOUR_S == pytest.approx(54 * 24)
    assert r.expected_interruptions == pytest.approx(419)


def test_longest_restart_keeps_the_target():
    # checkpoints alone at the best interval cost 1 − e_0; a restart of R scales E[segment] by e^{λR}:
    # at R = ln(e_0 / 0.9) / λ the effective training time is exactly 0.9
    rate = 1 / (3 * HOUR_S)
    r_max = longest_restart_s(0.9, rate, checkpoint_s=10.0)
    fm = FailureModel(1.0, 10.0, r_max)
    assert effective_training_time(best_interval_s(math.inf, rate, fm), rate, fm) == pytest.approx(0.9, rel=1e-6)
    no_restart = FailureModel(1.0, 10.0, 0.0)
    e0 = effective_training_time(best_interval_s(math.inf, rate, no_restart), rate, no_restart)
    assert r_max == pytest.approx(math.log(e0 / 0.9) * 3 * HOUR_S)


def test_without_failures_only_checkpoints_cost_time():
    assert expected_time_s(10 * HOUR_S, HOUR_S, 0.0, FM) == pytest.approx(11 * HOUR_S)


def test_a_last_segment_shorter_than_the_interval_by_hand():
    # 4.5 h of work in 1 h segments: four of 1 h + 0.1 h checkpoint and a last of 0.5 h + 0.1 h = 5.0 h
    # without failures (rounding to 4 or 5 whole segments made 4.4 or 5.5 h); every sample the same
    assert expected_time_s(4.5 * HOUR_S, HOUR_S, 0.0, FM) == pytest.approx(5.0 * HOUR_S)
    draws, _ = sample_time_s(4.5 * HOUR_S, HOUR_S, 0.0, FM, 10, seed=1)
    assert draws == pytest.approx([5.0 * HOUR_S] * 10)
    # at λ = 0.1/h: 4 × (e^{0.11} − 1)/0.1 × e^{0.02} h + (e^{0.06} − 1)/0.1 × e^{0.02} h = 4.745082 + 0.630857
    rate = FM.job_failure_rate(100)
    hand_h = 4 * math.expm1(0.11) / 0.1 * math.exp(0.02) + math.expm1(0.06) / 0.1 * math.exp(0.02)
    assert expected_time_s(4.5 * HOUR_S, HOUR_S, rate, FM) / HOUR_S == pytest.approx(hand_h)
    assert hand_h == pytest.approx(5.375939, abs=5e-6)
    # the Monte Carlo mean agrees where the interval leaves 0.64 of a segment over (200.32 h in 0.5 h)
    draws, _ = sample_time_s(200.32 * HOUR_S, 0.5 * HOUR_S, FM.job_failure_rate(2000), FM, 40_000, seed=2)
    assert draws.mean() == pytest.approx(
        expected_time_s(200.32 * HOUR_S, 0.5 * HOUR_S, FM.job_failure_rate(2000), FM), rel=0.005
    )


def test_monte_carlo_mean_matches_the_closed_form():
    rate = FM.job_failure_rate(2000)  # 2 failures per hour
    work, tau = 200 * HOUR_S, 0.5 * HOUR_S
    draws, interruptions = sample_time_s(work, tau, rate, FM, 40_000, seed=1)
    expected = expected_time_s(work, tau, rate, FM)
    assert draws.mean() == pytest.approx(expected, rel=0.005)
    # interruptions (failed segments and failed restarts) arrive at λ through all wall time
    assert interruptions.mean() == pytest.approx(rate * expected, rel=0.01)


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
    assert r.quantiles_s["p50_s"] <= r.quantiles_s["p99_s"]
    loose = time_to_train(10.0, 100_000, 16_384, FailureModel(50_000 * HOUR_S, 300, 900), deadline_s=1e12)
    assert loose.deadline_probability == 1.0


def test_a_run_shorter_than_an_interval_checkpoints_once():
    rate = FM.job_failure_rate(8)
    assert best_interval_s(3600.0, rate, FM) == 3600.0


def test_a_failure_free_run_ending_exactly_at_its_deadline_meets_it():
    # MTBF infinite: λ = 1,000 / ∞ = 0, no failures. 100 steps of 2 s = 200 s of work; Young's √(2δ/λ) is
    # infinite, so one segment: 200 s + one 10 s checkpoint = 210 s in every sample. P(wall ≤ deadline)
    # counts a run that ends at the deadline: 1 at 210 s, 0 a tenth of a second before
    fm = FailureModel(mtbf_per_gpu_s=math.inf, checkpoint_s=10.0, restart_s=60.0)
    on_time = time_to_train(2.0, 100, 1000, fm, deadline_s=210.0, samples=100)
    assert on_time.expected_s == 210.0
    assert on_time.deadline_probability == 1.0
    assert time_to_train(2.0, 100, 1000, fm, deadline_s=209.9, samples=100).deadline_probability == 0.0


def test_youngs_interval_is_the_root_of_twice_the_checkpoint_over_the_failure_rate():
    # Young (CACM 1974): τ ≈ √(2δM), M = 1/λ the job's MTBF. 1,000 GPUs of 10⁷ s each: λ = 1,000 / 10⁷
    # = 10⁻⁴ /s; δ = 50 s: √(2 × 50 / 10⁻⁴) = √10⁶ = 1,000 s
    fm = FailureModel(mtbf_per_gpu_s=1e7, checkpoint_s=50.0, restart_s=600.0)
    assert time_to_train(1.0, 100_000, 1000, fm, samples=100).young_interval_s == pytest.approx(1000.0)


def test_a_deadline_met_only_without_failures_has_the_probability_of_none():
    # 512 GPUs of MTBF 5·10⁷ s: λ = 512 / 5·10⁷ = 1.024·10⁻⁵ /s. 20,000 steps of 5 s and their checkpoints run
    # 106,000 s without failures; any failure costs its restart (3,600 s) and the work it interrupts (> 0), so
    # a deadline of 106,000 + 3,600 s is met exactly when none strikes: e^(−λ·106,000) = e^(−1.08544) = 0.33775.
    # 20,000 samples: standard error √(0.338·0.662 / 20,000) = 0.0033; within 4 of them (the normal
    # approximation of the lost time, clipped at 0, had put a lump at no loss: 0.354)
    fm = FailureModel(mtbf_per_gpu_s=5e7, checkpoint_s=600.0, restart_s=3600.0)
    got = time_to_train(5.0, 20_000, 512, fm, deadline_s=109_600.0, samples=20_000).deadline_probability
    assert got == pytest.approx(0.33775, abs=4 * 0.0033)


def test_a_job_that_would_never_finish_is_refused_and_bad_arguments_named():
    # 1,000 GPUs of 10 h MTBF fail every 36 s (λ = 100/h); a 0.1 h checkpoint and a 0.2 h restart alone are
    # λ · 0.3 h = 30 > 13.8 (e^13.8 ≈ a million attempts a segment): refused before any interval is searched
    fm = FailureModel(mtbf_per_gpu_s=10 * HOUR_S, checkpoint_s=0.1 * HOUR_S, restart_s=0.2 * HOUR_S)
    with pytest.raises(ValueError, match=r"would not finish: its 1000 GPUs fail every 36 s on average, and a 360 s "):
        time_to_train(1.0, 1000, 1000, fm)
    # 100 GPUs of 1000 h (λ = 0.1/h) with a 200 h interval: λ · (200 + 0.3) h = 20.03 > 13.8
    with pytest.raises(ValueError, match=r"7\.2e\+05 s of work with its 360 s checkpoint and a 720 s restart needs"):
        time_to_train(1.0, 720_000, 100, FM, interval_s=200 * HOUR_S)
    # 100 h (λ · 100.3 h = 10.03): it runs
    assert time_to_train(1.0, 360_000, 100, FM, interval_s=100 * HOUR_S, samples=100).expected_s > 100 * HOUR_S
    with pytest.raises(ValueError, match=r"expected step_s > 0, steps ≥ 1, num_gpus ≥ 1 and interval_s > 0; got"):
        time_to_train(1.0, 0, 16, FM)
    with pytest.raises(ValueError, match=r"interval_s -5"):
        time_to_train(1.0, 10, 16, FM, interval_s=-5)


def test_a_short_run_checkpoints_in_equal_segments_when_that_is_shorter():
    """λ = 3 failures/h = 1/1200 s, δ = 300 s, R = 600 s: Young's interval √(2δ/λ) = √720,000 = 848.5 s; a run of
    2.5 of them (2,121.3 s of work) in 3 equal segments of 707.1 s: each (e^(λ·1007.1) − 1)/λ · e^(λR)
    = (e^0.83927 − 1) · 1200 · e^0.5 = 1.31474 · 1200 · 1.64872 = 2,601.2 s, 7,803.5 s in all, less than cutting
    it at the long-run interval and paying a whole checkpoint on the last half (Daly's E[segment]/τ alone)."""
    fm = FailureModel(mtbf_per_gpu_s=HOUR_S / 3, checkpoint_s=300.0, restart_s=600.0)
    rate = fm.job_failure_rate(1)
    work = 2.5 * math.sqrt(2 * 300.0 / rate)
    best = best_interval_s(work, rate, fm)
    assert best == pytest.approx(work / 3)
    assert expected_time_s(work, best, rate, fm) == pytest.approx(7803.5, rel=1e-4)
    long_run = best_interval_s(math.inf, rate, fm)
    assert expected_time_s(work, long_run, rate, fm) > expected_time_s(work, best, rate, fm) * 1.04


def test_the_interval_that_best_meets_a_deadline_is_not_the_least_expected_one():
    """One GPU of MTBF 10,000 s (λ = 10⁻⁴ /s), 10,000 s of work, checkpoints of 10 s, restarts of 160 s, deadline
    10,300 s. In k equal segments (s = 10,000/k + 10 s each) a run is in time with no failure, or with one whose
    restart and lost work t fit the slack, t ≤ x_k = 300 − 10k − 160 (two restarts, 320 s, never fit):
    P_k = e^(−λ(10,000 + 10k)) · [1 + k (1 − e^(−λ x_k)) e^(−λ·160)]: k 1: 0.37218, k 6: 0.38288 (the most),
    k 14 and beyond (x ≤ 0): e^(−λ(10,000 + 10k)), k 23: 0.35951. The least expected interval is 10,000/23 s
    (Young's √(2 · 10 / 10⁻⁴) = 447 s), which meets the deadline 2.3 points less often than the best.
    100,000 samples: standard error √(0.38 · 0.62 / 10⁵) = 0.0015; k 3 to 10 are all within 0.0044 of k 6."""
    fm = FailureModel(mtbf_per_gpu_s=1e4, checkpoint_s=10.0, restart_s=160.0)
    r = time_to_train(1.0, 10_000, 1, fm, deadline_s=10_300.0, samples=100_000)
    assert r.interval_s == pytest.approx(10_000 / 23)
    assert r.deadline_probability == pytest.approx(math.exp(-1e-4 * 10_230), abs=4 * 0.0015)
    assert r.best_deadline_probability == pytest.approx(0.38288, abs=4 * 0.0015)
    assert 10_000 / 10 <= r.deadline_interval_s <= 10_000 / 3
    # with the interval given, its own probability is the best there is
    fixed = time_to_train(1.0, 10_000, 1, fm, interval_s=5000.0, deadline_s=10_300.0, samples=100_000)
    assert fixed.deadline_interval_s == 5000.0 and fixed.best_deadline_probability == fixed.deadline_probability


def test_the_best_chance_of_a_deadline_falls_as_failures_grow_more_frequent():
    # 2,000 steps of 10 s on 1,024 GPUs, checkpoints 120 s, restarts 600 s, deadline 30,000 s: at the least
    # expected interval (10,000 s at 100,000 h, 6,667 s at 50,000 h) the shorter interval of the more frequent
    # failures meets the deadline more often; the best interval's chance cannot rise with the failures
    def at(mtbf_h: float):
        return time_to_train(10.0, 2000, 1024, FailureModel(mtbf_h * HOUR_S, 120.0, 600.0), deadline_s=30_000.0)

    rare, frequent = at(100_000), at(50_000)
    assert (rare.interval_s, frequent.interval_s) == (pytest.approx(10_000), pytest.approx(20_000 / 3))
    assert rare.deadline_probability < frequent.deadline_probability
    assert rare.best_deadline_probability >= frequent.best_deadline_probability >= frequent.deadline_probability
    assert rare.deadline_interval_s < rare.interval_s
