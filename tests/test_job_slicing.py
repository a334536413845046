"""Slicing a job: the step reported is predict's for the slicing chosen, and a stage's memory is the
one memory model's (the in-flight cap at the micro-batch count, ZeRO-3's gathered layers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from itercast.config.job import Job, raw_sections
from itercast.memory import estimate_memory
from itercast.predict import predict
from itercast.search.job_slicing import (
    job_with_stages,
    slice_job,
    slice_job_on_groups,
    stage_bytes_of,
    stage_layers_of,
    unit_kinds_of,
)
from itercast.search.stage_slicing import Slicing

EXAMPLE = Path(__file__).resolve().parents[1] / "itercast" / "examples" / "gpt3-175b-a100.yaml"
SMALL = {"family": "llama", "num_layers": 6, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 1024}
SMALL |= {"ffn_hidden_size": 4096, "vocab_size": 32000}


def test_the_step_sliced_is_the_step_predict_reports() -> None:
    raw = raw_sections(EXAMPLE)
    job = job_with_stages(raw["model"], raw["plan"], raw["system"], 8)
    got = slice_job(job)
    assert sum(got.stage_layers) == 96 and len(got.stage_layers) == 8
    again = predict(got.job)
    assert got.prediction.step_time_s == again.step_time_s  # the same simulation, not a closed form beside it
    assert got.job.plan.stage_layers == got.stage_layers
    assert not got.prediction.memory.oom
    # the lumped objective it searched leaves out what a step adds once (DP reduction, optimizer)
    assert got.slicing.step_time_s < got.prediction.step_time_s


def test_uneven_layers_take_the_remainder_on_the_first_stages() -> None:
    job = job_with_stages(SMALL, {"global_batch_size": 8}, {"preset": "dgx-h100"}, 4)
    assert job.plan.stage_layers == (2, 2, 1, 1) and job.plan.pipeline_parallel == 4 and job.plan.dp == 2
    assert job_with_stages(SMALL, {"global_batch_size": 8}, {"preset": "dgx-h100"}, 2).plan.stage_layers is None


def test_stage_layers_count_transformer_units_only() -> None:
    kinds = ["embed", "layer", "layer", "moe", "layer", "head"]
    # stages [embed, layer], [layer, moe], [layer, head]
    assert stage_layers_of(Slicing([0, 2, 4], [1.0, 1.0, 1.0], 3.0), kinds) == (1, 2, 1)


def _span(kinds: list[str], counts: tuple[int, ...], stage: int) -> tuple[int, int]:
    """Unit indices [i, j) of stage `stage` when stages hold `counts` transformer layers."""
    starts = np.cumsum((0, *counts))
    i = 0 if stage == 0 else 1 + int(starts[stage])
    j = len(kinds) if stage == len(counts) - 1 else 1 + int(starts[stage + 1])
    return i, j


def test_a_stage_table_holds_what_predict_reports_for_that_stage() -> None:
    plan = {"pipeline_parallel": 4, "stage_layers": [1, 2, 2, 1], "global_batch_size": 16, "zero_stage": 3}
    job = Job.from_dicts(SMALL, plan, {"preset": "dgx-h100"})
    table = stage_bytes_of(job)
    assert table is not None
    kinds = unit_kinds_of(job)
    worst = estimate_memory(job)
    i, j = _span(kinds, (1, 2, 2, 1), worst.stage)
    assert table(worst.stage, 4)[i, j] == pytest.approx(worst.total_bytes)
    for s in range(4):  # every other stage holds no more than the one predict reports
        i, j = _span(kinds, (1, 2, 2, 1), s)
        assert table(s, 4)[i, j] <= worst.total_bytes * (1 + 1e-12)


def test_in_flight_activations_are_capped_at_the_micro_batches() -> None:
    # 1F1B on 4 stages: stage 0 holds the activations of min(4, M) micro-batches, the last stage of 1
    def tables(gbs: int) -> tuple[float, float]:
        plan = {"pipeline_parallel": 4, "tensor_parallel": 2, "global_batch_size": gbs}
        job = Job.from_dicts({**SMALL, "num_layers": 8}, plan, {"preset": "dgx-h100", "num_nodes": 1})
        t = stage_bytes_of(job)
        assert t is not None
        return t(0, 4)[1, 3], t(3, 4)[7, 9]  # stage 0: layers 0-1 (no embedding); stage 3: layers 6-7

    first_m2, last_m2 = tables(2)
    first_m8, last_m8 = tables(8)
    first_m1, _ = tables(1)
    assert last_m2 == pytest.approx(last_m8)  # one micro-batch in flight either way
    # M = 8 holds 4, M = 2 holds 2, M = 1 holds 1: the activation steps are equal
    assert first_m8 - first_m2 == pytest.approx(2 * (first_m2 - first_m1))


def test_a_mixed_cluster_slicing_is_what_predict_simulates_on_those_groups() -> None:
    plan = {"pipeline_parallel": 4, "tensor_parallel": 4, "global_batch_size": 64}
    got = slice_job_on_groups({"preset": "gpt3-13b"}, plan, {"preset": "dgx-h100"}, [("dgx-h100", 1), ("dgx-a100", 1)])
    groups = [g.gpu.name for g in got.job.system.device_groups]
    assert sorted(groups) == ["A100-SXM4-80GB", "H100-SXM5-80GB"]
    assert got.prediction.step_time_s == predict(got.job).step_time_s
    h100 = groups.index("H100-SXM5-80GB")
    per_stage = got.stage_layers
    h100_layers = sum(per_stage[2 * h100 : 2 * h100 + 2])
    assert h100_layers > sum(per_stage) - h100_layers  # the faster GPUs take more of the 40 layers
