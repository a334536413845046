"""The warning that an MoE plan's experts are priced with their tokens drawn evenly: said only where the routing
could move the step, and its published figures are the checking table's own rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
import checking_step_times as chk
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import Job
from itercast.workloads.transformer_ops import dropped_tokens_note, moe_routing_note, unused_fields_note

SOURCE = "megatron_bridge_skills_cards_h100"
JOB = ["--model", "qwen3-30b-a3b", "--system", "dgx-h100", "--set", "system.num_nodes=2"]
JOB += ["--set", "plan.global_batch_size=64"]
SAID = "model.moe_token_imbalance 1: every expert-parallel rank priced with an even share"


def _job(**model: object) -> Job:
    plan = {"global_batch_size": 64, "expert_parallel": 8, "data_parallel": 8}
    return Job.from_dicts({"preset": "qwen3-30b-a3b", **model}, plan, {"preset": "dgx-h100"})


def test_the_note_is_said_only_where_uneven_routing_would_move_the_step():
    job = _job()
    assert SAID in (moe_routing_note(job.model, job.plan) or "")
    assert moe_routing_note(job.model, job.plan.model_copy(update={"expert_parallel": 1})) is None
    uneven = _job(moe_token_imbalance=1.3)
    assert moe_routing_note(uneven.model, uneven.plan) is None
    padded = _job(moe_capacity_factor=1.0, moe_pad_to_capacity=True)  # rows fixed at the capacity
    assert moe_routing_note(padded.model, padded.plan) is None
    dropping = _job(moe_capacity_factor=1.25)  # up to the capacity the routing still moves the busiest rank
    assert SAID in (moe_routing_note(dropping.model, dropping.plan) or "")
    dense = Job.from_dicts({"preset": "llama3-8b"}, {"global_batch_size": 64}, {"preset": "dgx-h100"})
    assert moe_routing_note(dense.model, dense.plan) is None


def test_its_published_pair_is_the_checking_tables_natural_and_forced_runs():
    rows = {r.label: r for r in chk.load_rows() if r.source == SOURCE}
    natural = rows["Qwen3_30B_a3B BF16 EP16 x16 HybridEP natural routing (card pretrain)"]
    forced = rows["Qwen3_30B_a3B BF16 EP16 x16 HybridEP no EP overlap (skill B)"]
    job = _job()
    note = moe_routing_note(job.model, job.plan) or ""
    assert f"ran {natural.measured_s:.2f} s a step with natural routing" in note
    assert f"and {forced.measured_s:.2f} s forced even" in note
    assert f"checking/{SOURCE}.csv" in note


def test_predict_and_search_say_it_where_the_experts_are_spread():
    spread = CliRunner().invoke(app, ["predict", *JOB, "--set", "plan.expert_parallel=8"])
    assert spread.exit_code == 0 and SAID in spread.output
    measured = CliRunner().invoke(
        app, ["predict", *JOB, "--set", "plan.expert_parallel=8", "--set", "model.moe_token_imbalance=1.2"]
    )
    assert measured.exit_code == 0 and SAID not in measured.output
    as_json = CliRunner().invoke(app, ["predict", *JOB, "--set", "plan.expert_parallel=8", "--json"])
    assert as_json.exit_code == 0
    notes = json.loads(as_json.stdout)["notes"]  # listed for scripts, not only warned
    assert any(note.startswith(SAID) for note in notes)
    found = CliRunner().invoke(app, ["search", *JOB, "--top", "4", "--json"])
    assert found.exit_code == 0
    plans = json.loads(found.stdout)["plans"]  # each shown plan lists its own notes, as predict's JSON does
    spread_out = [any(n.startswith(SAID) for n in row["notes"]) for row in plans]
    assert spread_out == [row["plan"]["expert_parallel"] > 1 for row in plans] and any(spread_out)


def test_a_capacity_below_the_load_says_the_tokens_it_drops_and_that_the_model_flops_still_count_them():
    # padded at cf 0.1: every expert keeps 0.1 of an even share, 10%; dropping at cf 1.2 under an imbalance of 1.5:
    # the busiest rank keeps 1.2 / 1.5 = 80%; cf 1.25 at even routing, or padded at 1.0, drops none
    padded = _job(moe_capacity_factor=0.1, moe_pad_to_capacity=True)
    assert (
        "moe_capacity_factor 0.1 below the busiest expert-parallel rank's load (1 of an even share): it keeps 10%"
        in (dropped_tokens_note(padded.model) or "")
    )
    uneven = _job(moe_capacity_factor=1.2, moe_token_imbalance=1.5)
    assert "load (1.5 of an even share): it keeps 80% of its routed tokens" in (dropped_tokens_note(uneven.model) or "")
    assert dropped_tokens_note(_job(moe_capacity_factor=1.25).model) is None
    assert dropped_tokens_note(_job(moe_capacity_factor=1.0, moe_pad_to_capacity=True).model) is None
    # padded to 2: the experts run twice the routed rows, which the FLOPs do not count (probe 10)
    assert "every expert runs its capacity, 2 × an even share" in (
        dropped_tokens_note(_job(moe_capacity_factor=2.0, moe_pad_to_capacity=True).model) or ""
    )
    assert dropped_tokens_note(_job().model) is None
    out = CliRunner().invoke(
        app,
        ["predict", *JOB, "--set", "plan.expert_parallel=8", "--set", "model.moe_capacity_factor=0.5"],
    )
    assert out.exit_code == 0 and "it keeps 50% of its routed tokens" in " ".join(out.output.split())


def test_switches_a_model_has_nothing_for_are_said_to_change_nothing():
    # user probe 10: the shared-expert overlap on Qwen3 30B-A3B (no shared experts), the grouped GEMM on a dense model
    qwen = _job()
    assert unused_fields_note(qwen.model, qwen.plan) is None
    plan = qwen.plan.model_copy(update={"moe_shared_expert_overlap": True})
    assert unused_fields_note(qwen.model, plan) == (
        "plan.moe_shared_expert_overlap (no shared experts): qwen3-30b-a3b has nothing it acts on; the forecast is "
        "the same without it"
    )
    dense = Job.from_dicts({"preset": "llama3-8b"}, {"moe_grouped_gemm": True}, {"preset": "dgx-h100"})
    assert "plan.moe_grouped_gemm (no routed experts): llama3-8b" in (unused_fields_note(dense.model, dense.plan) or "")
    assert unused_fields_note(qwen.model, qwen.plan.model_copy(update={"moe_grouped_gemm": True})) is None
    shared = Job.from_dicts(
        {"preset": "qwen2-57b-a14b"}, {"expert_parallel": 8, "moe_shared_expert_overlap": True}, {"preset": "dgx-h100"}
    )
    assert unused_fields_note(shared.model, shared.plan) is None  # its shared experts: the overlap acts
