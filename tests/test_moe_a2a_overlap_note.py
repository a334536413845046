"""The warning that goes with plan.moe_a2a_overlap states what the checking table's runs of it measured against
the price: recomputed here from those rows, so the note fails this test once a model change moves the figures."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
import checking_step_times as chk
from typer.testing import CliRunner

from itercast.checked_runs import checked_runs
from itercast.cli import app
from itercast.config.job import Job
from itercast.workloads.transformer_ops import moe_a2a_overlap_note

ROWS = [r for r in chk.load_rows() if r.plan.get("moe_a2a_overlap")]


def test_the_note_is_said_only_where_the_overlap_is_priced():
    plan = Job.from_dicts(ROWS[0].model, ROWS[0].plan, ROWS[0].system).plan
    assert moe_a2a_overlap_note(plan.model_copy(update={"moe_a2a_overlap": False})) is None
    assert "combined_1f1b.py" in (moe_a2a_overlap_note(plan) or "")


def test_the_note_states_the_measured_over_predicted_ratios_of_the_checking_runs_of_it():
    # the kept configurations (itercast/checked_runs.json, which tests/test_checked_runs.py holds to the models)
    kept = {run.label: run for run in checked_runs()}
    ratios: dict[tuple[str, bool], list[float]] = {}
    for r in ROWS:  # a configuration measured several times is kept once, under its first row's label
        if r.label in kept:
            pipelined = r.plan["pipeline_parallel"] > 1
            ratios.setdefault((r.model["preset"], pipelined), []).append(kept[r.label].ratio)
    # the table's configurations of it: 2 of Qwen3 30B-A3B pipelined, 2 without (alltoall, flex), 3 of Qwen3
    # 235B-A22B (Megatron-Bridge's two, one measured in 4 releases, and Megatron-LM's recipe), 1 of DeepSeek-V3
    counts = {("qwen3-30b-a3b", True): 2, ("qwen3-30b-a3b", False): 2, ("qwen3-235b-a22b", True): 3}
    assert {k: len(v) for k, v in ratios.items()} == counts | {("deepseek-v3", True): 1}
    note = moe_a2a_overlap_note(Job.from_dicts(ROWS[0].model, ROWS[0].plan, ROWS[0].system).plan) or ""
    for preset, said in (("qwen3-30b-a3b", "pipelined (PP 2"), ("qwen3-235b-a22b", "Qwen3 235B-A22B (hidden")):
        lo, hi = min(ratios[(preset, True)]), max(ratios[(preset, True)])
        assert said in note and f") {lo:.2f}-{hi:.2f}x" in note
    assert f") {ratios[('deepseek-v3', True)][0]:.2f}x" in note
    # without pipelining: each overlapped run beside its A/B twin (the same source and plan, no overlap)
    said_ratio, said_twin, said_gain = [], [], []
    every = chk.load_rows()
    for r in ROWS:
        if r.label not in kept or r.plan["pipeline_parallel"] > 1:
            continue
        plan_off = {k: v for k, v in r.plan.items() if k != "moe_a2a_overlap"}  # its twin's row leaves it out
        twin = next(t for t in every if t.source == r.source and t.label in kept and t.plan == plan_off)
        on, off = kept[r.label], kept[twin.label]
        dispatcher = "HybridEP" if r.plan.get("moe_token_dispatcher") == "flex" else "Megatron-Core's alltoall"
        said_ratio.append(f"{on.ratio:.2f}x over {dispatcher}")
        said_twin.append(f"{off.ratio:.2f}x")
        said_gain.append((f"{off.measured_s / on.measured_s:.2f}x", f"{off.predicted_s / on.predicted_s:.2f}x"))
    assert len(said_ratio) == 2 and all(text in note for text in said_ratio)
    assert f"({said_twin[0]}, {said_twin[1]}: " in note
    measured, priced = zip(*said_gain, strict=True)
    assert f"measured gains {measured[0]} and {measured[1]}, priced {priced[0]} and {priced[1]}" in note


def test_predict_and_search_say_it_where_the_plan_overlaps_the_all_to_alls():
    args = ["--model", "qwen3-30b-a3b", "--system", "dgx-h100", "--set", "system.num_nodes=2"]
    args += ["--set", "plan.global_batch_size=64", "--set", "plan.moe_a2a_overlap=true"]
    pipelined = ["--set", "plan.pipeline_parallel=2", "--set", "plan.virtual_pipeline=12"]
    pipelined += ["--set", "plan.schedule=interleaved-1f1b", "--set", "plan.expert_parallel=8"]
    said = "not priced: the combined 1F1B schedule's own work"
    res = CliRunner().invoke(app, ["predict", *args, *pipelined])
    assert res.exit_code == 0 and said in res.output
    plain = CliRunner().invoke(app, ["predict", *args[:-2], *pipelined])
    assert plain.exit_code == 0 and said not in plain.output
    found = CliRunner().invoke(app, ["search", *args, "--top", "2"])
    assert found.exit_code == 0 and f"{said}" in found.output and "(every plan shown)" in found.output


def test_the_overlap_is_refused_where_megatron_core_refuses_it_one_line_each():
    # Megatron-Core's TransformerConfig.__post_init__ (transformer_config.py at b0cc2706): expert parallelism,
    # interleaving under pipelining, no full recompute, a 16-bit model, its own alltoall or flex dispatcher
    runner = CliRunner()
    base = ["predict", "--model", "mixtral-8x7b", "--system", "dgx-h100", "--set", "system.num_nodes=2"]
    base += ["--set", "plan.moe_a2a_overlap=true"]
    cases = [
        (["plan.expert_parallel=1"], "expected expert_parallel > 1; got 1"),
        (["plan.expert_parallel=8", "plan.pipeline_parallel=2"], "virtual_pipeline > 1 with pipeline_parallel 2"),
        (["plan.expert_parallel=8", "plan.recompute=full"], "expected recompute none or selective; got full"),
        (["plan.expert_parallel=8", "plan.dtype=fp32"], "expected dtype bf16, fp16 or fp8; got fp32"),
        (["plan.expert_parallel=8", "plan.moe_token_dispatcher=torchtitan"], "alltoall or flex; got torchtitan"),
    ]
    for fields, said in cases:
        result = runner.invoke(app, base + [a for f in fields for a in ("--set", f)])
        assert result.exit_code == 2, fields
        assert said in result.output and result.output.count("plan.moe_a2a_overlap") == 1, result.output
    # interleaved under pipelining, selective recompute, bf16 over Megatron-Core's dispatcher: priced
    ok = ["plan.expert_parallel=8", "plan.pipeline_parallel=2", "plan.virtual_pipeline=2", "plan.recompute=selective"]
    ok += ["plan.schedule=interleaved-1f1b", "plan.global_batch_size=32"]
    assert runner.invoke(app, base + [a for f in ok for a in ("--set", f)]).exit_code == 0


def test_configurations_megatron_refuses_are_refused_with_its_words():
    # Megatron-Core b0cc2706: transformer_config.py 'Bias in Moe is only supported when ETP==1' (GPT-OSS's experts
    # have biases; expert_tensor_parallel defaults to tensor_parallel), arguments.py 'When interleaved schedule is
    # used, pipeline-model-parallel size should be greater than 1' and 'Group query attention is mutually
    # exclusive with multi latent attention'
    runner = CliRunner()
    base = ["predict", "--system", "dgx-h100", "--set", "system.num_nodes=1"]
    cases = [
        (
            ["--model", "gpt-oss-20b", "--set", "plan.tensor_parallel=2", "--set", "plan.sequence_parallel=true"],
            "Bias in Moe is only supported when ETP==1')",
            "expected expert_tensor_parallel 1; got 2",
        ),
        (
            ["--model", "llama3-8b", "--set", "plan.virtual_pipeline=2", "--set", "plan.schedule=interleaved-1f1b"],
            "pipeline-model-parallel size should be greater than 1'",
            "plan.virtual_pipeline(2) > 1 needs pipeline_parallel > 1",
        ),
        (
            ["--model", "llama3-8b", "--set", "model.kv_lora_rank=512"],
            "mutually exclusive with multi latent attention'",
            "model.num_query_groups(8) with multi-latent attention",
        ),
    ]
    for args, rule, said in cases:
        result = runner.invoke(app, base + args)
        assert result.exit_code == 2 and rule in result.output and said in result.output, result.output
    # the same GPT-OSS layout with its experts unsplit, as Megatron-Bridge's configs set them: priced
    etp1 = cases[0][0] + ["--set", "plan.expert_tensor_parallel=1"]
    assert runner.invoke(app, base + etp1).exit_code == 0


def test_a_sequence_sequence_parallelism_cannot_split_evenly_is_refused():
    # Megatron-Core mappings.py: 'First dimension of the tensor should be divisible by tensor parallel size'
    # (each context-parallel rank's seq / cp tokens scattered over the tensor ranks); 8193 is odd
    runner = CliRunner()
    base = ["predict", "--model", "llama3-8b", "--system", "dgx-h100", "--set", "plan.tensor_parallel=2"]
    result = runner.invoke(app, [*base, "--set", "model.seq_length=8193", "--set", "plan.sequence_parallel=true"])
    assert result.exit_code == 2
    assert "model.seq_length(8193) not divisible by context_parallel(1) × tensor_parallel(2)" in result.output
    # 8196 splits over 2 context ranks (2 × 2 chunks: 2049 each), but their 4098 tokens over 4 tensor ranks do not
    four = ["--set", "plan.tensor_parallel=4", "--set", "plan.context_parallel=2", "--set", "model.seq_length=8196"]
    result = runner.invoke(app, base + four + ["--set", "plan.sequence_parallel=true"])
    assert result.exit_code == 2 and "context_parallel(2) × tensor_parallel(4)" in result.output
    # without sequence parallelism every tensor rank holds the whole sequence: priced
    odd = [*base, "--set", "model.seq_length=8193", "--set", "plan.sequence_parallel=false"]
    assert runner.invoke(app, odd).exit_code == 0
