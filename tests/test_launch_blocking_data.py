"""data/published/launch_blocking/ and validation/launch_blocking.py: the CSV parses, one row's transcription
checked by hand against the prequel's table, TFLOPs turned into seconds by hand, and a row read into a Job with
plan.cuda_launch_blocking set (no prediction is made here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
import launch_blocking as lb
from plan_ranking import _plan_job


def test_every_row_parses_and_its_gpus_are_tp_times_pp_times_dp():
    rows = lb.rows()
    # The prequel's table: 80 GPUs GBS 512, 160 GPUs GBS 512 and 2048, 320 GPUs GBS 2048.
    assert [(r["gpus"], r["global_batch_size"]) for r in rows] == [
        ("80", "512"),
        ("160", "512"),
        ("160", "2048"),
        ("320", "2048"),
    ]
    for r in rows:
        gpus = int(r["tensor_parallel"]) * int(r["pipeline_parallel"]) * int(r["data_parallel"])
        assert int(r["gpus"]) == gpus, r["label"]
        assert r["assumed"] and r["source"].startswith("bigscience-workshop/bigscience@9e64edec")


def test_the_80_gpu_row_transcribes_the_prequel_by_hand():
    r = lb.rows()[0]
    # "| 80 | no | 512 | 91.04 |" and "| 80 | yes | 512 | 97.20 |"; 80 GPUs = 8 (TP) × 10 (PP) × 1 (DP),
    # one replica of 10 nodes ("10 nodes, 1 replica"), MBS 1 as the 02-17 slurm.
    assert (r["tflops_blocking"], r["tflops_async"]) == ("91.04", "97.20")
    assert (r["tensor_parallel"], r["pipeline_parallel"], r["data_parallel"]) == ("8", "10", "1")
    assert (r["micro_batch_size"], r["zero_stage"], r["recompute"], r["dtype"]) == ("1", "1", "full", "fp16")
    # The 320-GPU async run hung: no TFLOPs, the note says so.
    last = lb.rows()[-1]
    assert last["tflops_async"] == "" and "hangs" in last["measured_note"]


def test_measured_step_seconds_from_tflops_by_hand():
    # s × GPUs × TFLOPs of the four log lines: 844.81 × 80 × 98.87 = 6,682,109.176; 430.21 × 160 × 97.07
    # = 6,681,677.552; 853.81 × 80 × 97.82 = 6,681,575.536; 434.14 × 160 × 96.19 = 6,681,588.256 TFLOP;
    # mean 26,726,950.52 / 4 = 6,681,737.63 TFLOP at GBS 2048, so 1,670,434.41 TFLOP at GBS 512.
    assert lb.flop_per_iteration(2048) == pytest.approx(6_681_737.63e12)
    # 80 GPUs at 97.20 TFLOPs: 1,670,434.41 / (97.20 × 80 = 7,776) = 214.82 s; at 91.04: / 7,283.2 = 229.35 s.
    assert lb.measured_step_s(97.20, 80, 512) == pytest.approx(214.819, abs=1e-3)
    assert lb.measured_step_s(91.04, 80, 512) == pytest.approx(229.354, abs=1e-3)


def test_a_row_reads_into_a_job_with_launch_blocking_set():
    r = lb.rows()[0]
    job = _plan_job(r | {"overrides": f"{r['overrides']} plan.cuda_launch_blocking=true"})
    assert job.plan.cuda_launch_blocking
    assert (job.model.num_layers, job.model.hidden_size, job.model.num_attention_heads) == (80, 14400, 96)
    assert (job.model.vocab_size, job.plan.pipeline_p2p, job.plan.flash_attention) == (250880, "deepspeed", False)
    # fp16 with ZeRO 1: DeepSpeed reduces the fp16 bucket as it is, 2 bytes a gradient
    assert (job.plan.dtype, job.plan.grad_bytes, job.plan.zero_grad_reduce) == ("fp16", 2, "reduce_per_rank")
    assert not _plan_job(r).plan.cuda_launch_blocking
