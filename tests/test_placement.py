"""Placement of slow GPUs on pipeline stages, against step times computed by hand."""

from __future__ import annotations

import pytest
from helpers import pipeline_builder, tiny_job

from itercast.stochastic import placement
from itercast.stochastic.placement import place_slow_gpus


def test_two_slow_gpus_cost_least_in_one_stage_and_most_in_two(monkeypatch):
    # 2 stages × 4 GPUs, GPipe, 4 micro-batches; per stage forward 1 s, backward 2 s; slow GPUs 2× slower.
    # One slow stage (by hand): Σ(tf + tb) + (M − 1)(max tf + max tb) = (6 + 3) + 3 × (2 + 4) = 27 s;
    # both stages slow: (M + p − 1) × 6 = 30 s.
    job = tiny_job(tensor_parallel=4, pipeline_parallel=2, schedule="gpipe", global_batch_size=4)
    monkeypatch.setattr(placement, "TransformerStepBuilder", lambda j: pipeline_builder(j, 1.0, 2.0))
    result = place_slow_gpus(job, slow_gpus=2, slowdown=2.0)
    assert (result.baseline_s, result.best_s, result.worst_s) == pytest.approx((15.0, 27.0, 30.0))
    assert len(result.best_stages) == 1 and result.worst_stages == (0, 1)
    assert result.worth == pytest.approx(30 / 27)


def test_more_slow_gpus_than_a_stage_holds_must_span_stages(monkeypatch):
    job = tiny_job(tensor_parallel=4, pipeline_parallel=2, schedule="gpipe", global_batch_size=4)
    monkeypatch.setattr(placement, "TransformerStepBuilder", lambda j: pipeline_builder(j, 1.0, 2.0))
    result = place_slow_gpus(job, slow_gpus=5, slowdown=2.0)  # 4 GPUs per stage: 5 need both stages
    assert result.best_stages == (0, 1) and result.best_s == pytest.approx(30.0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="slow_gpus ≥ 1"):
        place_slow_gpus(tiny_job(), 0, 2.0)
