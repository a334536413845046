"""The vocabulary as Megatron-LM pads it (tokenizer.py _vocab_size_with_padding: up to a multiple of
make_vocab_size_divisible_by × tensor_parallel, 128 × tp by default), split over the tensor-parallel ranks;
frameworks that do not pad (torchtitan) run the tokenizer's size; an unaligned logits GEMM is said, not priced."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from itercast.cli.app import app
from itercast.config.job import Job
from itercast.config.plan import PlanConfig, local_vocab_rows
from itercast.memory import estimate_memory
from itercast.search.frameworks import FRAMEWORKS
from itercast.search.launch_settings import megatron_core_args


@pytest.mark.parametrize(
    ("vocab", "tp", "divisible_by", "rows"),
    [
        (50257, 1, 128, 50304),  # 393 × 128 = 50,304 (GPT-2 in Megatron-LM at tp 1)
        (50257, 8, 128, 6400),  # 1,024 × 50 = 51,200 over 8 ranks
        (128256, 8, 128, 16128),  # 1,024 × 126 = 129,024 over 8 (Llama 3's 128,256 = 1,002 × 128 is not enough)
        (256000, 8, 128, 32000),  # Nemotron-4: 250 × 1,024 already
        (50257, 8, 1, 6283),  # unpadded: 50,264 / 8, the largest shard (multiple of tp only)
        (50257, 1, 1, 50257),
    ],
)
def test_rows_per_rank_by_hand(vocab, tp, divisible_by, rows):
    plan = PlanConfig(tensor_parallel=tp, make_vocab_size_divisible_by=divisible_by)
    assert plan.local_vocab(vocab) == rows
    assert local_vocab_rows(vocab, np.array([tp, tp]), divisible_by).tolist() == [rows, rows]


def test_gpt3_embedding_weights_hold_the_padded_rows():
    # GPT-3 175B at tp 8 (pp 8: the first stage holds the embedding): 6,400 rows × 12,288 per rank in bf16
    fields = {"plan.tensor_parallel": 8, "plan.pipeline_parallel": 8, "plan.data_parallel": 1, "system.num_nodes": 8}
    overrides = [f"{k}={v}" for k, v in fields.items()]
    padded = Job.load(model="gpt3-175b", system="dgx-a100", overrides=overrides)
    unpadded = [*overrides, "plan.make_vocab_size_divisible_by=1"]
    exact = Job.load(model="gpt3-175b", system="dgx-a100", overrides=unpadded)
    diff = estimate_memory(padded).weights_bytes - estimate_memory(exact).weights_bytes
    # unpadded at tp 8 still rounds up to a multiple of 8 rows: 50,264 / 8 = 6,283
    assert diff == pytest.approx(2 * (6400 - 6283) * 12288)


def test_torchtitan_runs_the_tokenizers_vocabulary_and_megatron_names_a_non_default_padding():
    assert FRAMEWORKS["torchtitan"].plan_fields["make_vocab_size_divisible_by"] == 1
    assert "make_vocab_size_divisible_by" not in FRAMEWORKS["megatron-core"].plan_fields  # its default, 128
    job = Job.load(model="gpt3-1.3b", system="dgx-a100")
    default = megatron_core_args(job.plan.model_dump(), job.model)
    assert "--make-vocab-size-divisible-by" not in default
    plan = job.plan.model_copy(update={"make_vocab_size_divisible_by": 64}).model_dump()
    assert "--make-vocab-size-divisible-by 64" in megatron_core_args(plan, job.model)


def test_an_unaligned_logits_gemm_is_said_and_an_aligned_one_is_not():
    runner = CliRunner()
    base = ["predict", "--model", "gpt3-1.3b", "--system", "dgx-h100", "--json"]
    unpadded = runner.invoke(app, [*base, "--set", "plan.make_vocab_size_divisible_by=1"])
    padded = runner.invoke(app, base)
    assert unpadded.exit_code == 0 and padded.exit_code == 0
    # 50,257 rows × 2 bytes is not a multiple of 16: the warning names the rows and the measured rates
    assert "50,257 vocabulary rows per rank, not a multiple of 8" in unpadded.stderr
    assert "99 TFLOP/s" in unpadded.stderr
    assert "vocabulary rows" not in padded.stderr
    # the padded run prices 50,304 rows: more logits FLOPs, a slower step than the unpadded one
    assert json.loads(padded.stdout)["step_time_s"] > json.loads(unpadded.stdout)["step_time_s"]


def test_alignment_is_judged_in_bytes():
    from itercast.workloads.transformer_ops import unaligned_logits_note

    model = Job.load(model="gpt3-1.3b", system="dgx-h100").model
    # 50,257 padded to a multiple of 8: 50,264 rows × 2 bytes = 100,528, a multiple of 16: aligned
    assert unaligned_logits_note(model, PlanConfig(make_vocab_size_divisible_by=8)) is None
    # to a multiple of 4: 50,260 × 2 = 100,520 bytes, 8 short of one: said, with the 8-element rule of 16-bit
    note = unaligned_logits_note(model, PlanConfig(make_vocab_size_divisible_by=4))
    assert note is not None and "50,260 vocabulary rows per rank, not a multiple of 8" in note
    # fp32 (4 bytes an element): 50,260 × 4 = 201,040 = 16 × 12,565, aligned
    assert unaligned_logits_note(model, PlanConfig(make_vocab_size_divisible_by=4, dtype="fp32")) is None
