"""validation/variability_series.py: parsing the MLPerf result-log lines it reads (real line formats of
mlcommons/training_results_v4.0, NVIDIA/results/eos_n64_ngc24.04_nemo/gpt3/result_0.txt and
eos_n128_ngc24.04_nemo/llama2_70b_lora/result_0.txt, shortened), the training-block rule, and the KS of
two tiny samples, all by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
from variability_cpu import compare
from variability_series import parse_blocks, training_blocks


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
