"""validation/variability_series.py: parsing the MLPerf result-log lines it reads (real line formats of
mlcommons/training_results_v4.0, NVIDIA/results/eos_n64_ngc24.04_nemo/gpt3/result_0.txt and
eos_n128_ngc24.04_nemo/llama2_70b_lora/result_0.txt, shortened), the training-block rule, and the KS of
two tiny samples, and the run-level estimators (an AR(1)'s block correlation, a two-run fit), all by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
from variability_cpu import compare
from variability_series import (
    RunFit,
    block_lag1_of_steps,
    fit_runs,
    parse_blocks,
    pooled_run_var,
    step_rho,
    training_blocks,
)


def line(time_ms: int, event: str, key: str, value: object, **meta: object) -> str:
    """One `:::MLLOG` line as mllog writes it (json.dumps's default separators; the logs' metadata also
    names the source file and line, left out here)."""
    record = {"namespace": "", "time_ms": time_ms, "event_type": event, "key": key, "value": value, "metadata": meta}
    return ":::MLLOG " + json.dumps(record)


GPT3_LOG = "\n".join(
    [
        ':::SYSJSON {"submitter":"NVIDIA"}',
        line(1715043586542, "POINT_IN_TIME", "global_batch_size", 2304),
        line(1715043586542, "POINT_IN_TIME", "max_sequence_length", 2048),
        line(1715043830078, "INTERVAL_START", "block_start", None, first_epoch_num=0, epoch_count=51904512),
        line(1715043949934, "INTERVAL_END", "block_stop", None, first_epoch_num=0, epoch_count=51904512),
        line(1715043949935, "INTERVAL_START", "eval_start", None, epoch_num=51904512),
        line(1715043961194, "INTERVAL_END", "eval_stop", None, epoch_num=51904512),
        line(1715043961195, "INTERVAL_START", "block_start", None, first_epoch_num=51904512, epoch_count=51904512),
        line(1715044081144, "INTERVAL_END", "block_stop", None, first_epoch_num=51904512, epoch_count=51904512),
    ]
)

LORA_LOG = "\n".join(
    [
        line(1714905514036, "POINT_IN_TIME", "global_batch_size", 128),
        line(1714905569479, "INTERVAL_START", "block_start", None, samples_count=0),
        line(1714905625252, "INTERVAL_END", "block_stop", None, samples_count=7296),
        line(1714905626493, "INTERVAL_START", "block_start", None, samples_count=7296),
        line(1714905628773, "INTERVAL_END", "block_stop", None, samples_count=7680),
    ]
)


def test_line_format_is_the_logs():
    # the first block_start of NVIDIA/results/eos_n128_ngc24.04_nemo/llama2_70b_lora/result_0.txt, metadata shortened
    assert line(1714905569479, "INTERVAL_START", "block_start", None, samples_count=0) == (
        ':::MLLOG {"namespace": "", "time_ms": 1714905569479, "event_type": "INTERVAL_START", "key": "block_start", '
        '"value": null, "metadata": {"samples_count": 0}}'
    )


def test_gpt3_blocks_by_hand():
    # 51,904,512 tokens / (2048 × 2304) = 11 steps; 1715043949934 − 1715043830078 = 119,856 ms;
    # the second block: 1715044081144 − 1715043961195 = 119,949 ms (the eval between them is not counted)
    assert parse_blocks(GPT3_LOG) == [
        (pytest.approx(11.0), pytest.approx(119.856)),
        (pytest.approx(11.0), pytest.approx(119.949)),
    ]


def test_lora_blocks_by_hand():
    # samples 0 → 7296 = 57 steps of 128 in 55.773 s; 7296 → 7680 = 3 steps in 2.280 s
    assert parse_blocks(LORA_LOG) == [
        (pytest.approx(57.0), pytest.approx(55.773)),
        (pytest.approx(3.0), pytest.approx(2.280)),
    ]


def test_training_block_rule_by_hand():
    # (run, block, steps, seconds): each run's block 0 goes, and the 2-step block (not the common 3)
    rows = np.array(
        [[0, 0, 57, 55.0], [0, 1, 3, 2.1], [0, 2, 3, 2.4], [0, 3, 2, 1.0], [1, 0, 57, 56.0], [1, 1, 3, 1.8]]
    )
    kept = training_blocks(rows)
    assert kept[0] == pytest.approx([2.1 / 3, 2.4 / 3])  # 0.7 and 0.8 s per step
    assert kept[1] == pytest.approx([1.8 / 3])


def test_ks_of_tiny_samples_by_hand():
    # empirical CDFs of [1, 2, 3] and [2.5, 3.5, 4.5]: at 2 (before 2.5) they are 2/3 and 0, the largest gap
    # p95 (linear interpolation at index 0.95 × 2 = 1.9): 2 + 0.9 = 2.9 and 3.5 + 0.9 = 4.4
    ks, p95_err, _ = compare(np.array([1.0, 2.0, 3.0]), np.array([2.5, 3.5, 4.5]))
    assert ks == pytest.approx(2 / 3)
    assert p95_err == pytest.approx(2.9 / 4.4 - 1)


def test_block_lag1_of_an_ar1_by_hand():
    # blocks of n = 2 steps, ρ = 0.5: Cov((x1 + x2)/2, (x3 + x4)/2) = (ρ² + ρ³ + ρ + ρ²)σ²/4
    # = (0.25 + 0.125 + 0.5 + 0.25)/4 σ² = 0.28125 σ²; Var = (2 + 2ρ)σ²/4 = 0.75 σ²: r = 0.28125/0.75 = 0.375
    assert block_lag1_of_steps(0.5, 2) == pytest.approx(0.375)
    assert step_rho(0.375, 2) == pytest.approx(0.5)
    assert block_lag1_of_steps(0.3, 1) == pytest.approx(0.3)  # blocks of one step are the steps
    assert step_rho(-0.2, 11) == 0.0  # a negative block correlation: independent steps


def test_two_run_fit_by_hand():
    # blocks of 4 steps; logs of run A: 0, 0.02; run B: 0.1, 0.12 (deviations from each run's mean ∓0.01)
    # blocks' lag-1: (−0.01·0.01) × 2 / (4 × 0.0001) = −0.5 → steps' ρ = 0
    # within-run variance s_w² = 0.0004 / (1 + 1) = 0.0002; step σ² = 4 × 0.0002 / g(4, 0) = 0.0008,
    # step_cv = √(e^0.0008 − 1) = 0.028290
    # run medians' logs 0.01 and 0.11: variance (ddof 1) 0.1²/2 = 0.005; a median's sampling variance
    # π/2 × 0.0002 × g(2, −0.5) / 2, g(2, −0.5) = 1 + 2 × (1 − 1/2) × (−0.5) = 0.5: 7.854e-5;
    # σ_run² = 0.005 − 0.00007854 = 0.00492146
    fit = fit_runs([np.exp([0.0, 0.02]), np.exp([0.1, 0.12])], steps=4)
    assert fit.block_lag1 == pytest.approx(-0.5)
    assert fit.rho == 0.0
    assert fit.step_cv == pytest.approx(0.028290, rel=1e-4)
    assert fit.run_var == pytest.approx(0.00492146, rel=1e-5)
    assert fit_runs([np.exp([0.0, 0.02, 0.01])], steps=4).run_var is None  # one run: no between-run spread


def test_pooled_run_variance_weighted_by_runs_by_hand():
    # 5 fit runs (4 degrees of freedom) at 0.0004 and 3 runs (2) at 0.0001: (4 × 0.0004 + 2 × 0.0001) / 6 = 0.0003
    fits = [
        RunFit(3, 5, 0.0, 0.0, 0.01, 0.0004),
        RunFit(3, 3, 0.0, 0.0, 0.01, 0.0001),
        RunFit(9, 1, 0.0, 0.0, 0.01, None),
    ]
    assert pooled_run_var(fits) == pytest.approx(0.0003)
