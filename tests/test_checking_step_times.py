"""The checking table's parsing (validation/checking_step_times.py): typed cells, nested fields, the frozen
header, and every row either builds a job or names why it cannot (no prediction is made here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
import checking_step_times as chk

from itercast.config.job import Job


def test_typed_reads_bools_ints_floats_and_text():
    assert chk.typed("true") is True and chk.typed("False") is False
    assert chk.typed("8") == 8 and isinstance(chk.typed("8"), int)
    assert chk.typed("1.555e12") == 1.555e12
    assert chk.typed("V100-SXM3-32GB") == "V100-SXM3-32GB"
    assert chk.typed("null") is None  # a preset's field unset (node.nvlink_links=null: a switch)
    # a list in brackets, space-separated (a comma would split the CSV cell)
    assert chk.typed("[layernorm moe_act]") == ["layernorm", "moe_act"] and chk.typed("[1 true]") == [1, True]


def test_parse_fields_nests_dotted_names():
    got = chk.parse_fields("gpu.hbm_bytes=42949672960;gpu.name=A100;node.gpus_per_node=2; num_layers=24")
    assert got == {"gpu": {"hbm_bytes": 42949672960, "name": "A100"}, "node": {"gpus_per_node": 2}, "num_layers": 24}
    assert chk.parse_fields("") == {}


def test_parse_fields_rejects_a_field_without_a_value():
    with pytest.raises(ValueError, match="NAME=VALUE"):
        chk.parse_fields("num_layers")


def test_read_table_requires_the_frozen_header(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("# SOURCE: somewhere\nlabel\nrow\n")
    with pytest.raises(ValueError, match="frozen-set header"):
        chk.read_table(path)
    frozen = "# CHECKING SET, frozen 2026-11-30: itercast's models were not tuned on these rows"
    path.write_text(frozen + "\n# SOURCE: somewhere\nlabel\nrow\n")
    assert chk.read_table(path) == [{"label": "row"}]
    path.write_text("\ufeff" + frozen + "\n# SOURCE: somewhere\nlabel\nrow\n", encoding="utf-8")  # a spreadsheet's BOM
    assert chk.read_table(path) == [{"label": "row"}]
    for bad in ("last week", "2026-13-01", "2999-01-01"):  # not a date, no such month, not frozen yet
        path.write_text(frozen.replace("2026-11-30", bad) + "\n# SOURCE: somewhere\nlabel\nrow\n")
        with pytest.raises(ValueError, match=f"frozen YYYY-MM-DD.*got .*{bad}"):
            chk.read_table(path)
    path.write_text(frozen + "\n# SOURCE: somewhere\nlabel\n")
    with pytest.raises(ValueError, match="no rows after its header"):
        chk.read_table(path)
    with pytest.raises(ValueError, match="no checking tables"):
        chk.load_rows(tmp_path / "empty")


def test_sections_fold_gpus_into_nodes_of_the_system():
    r = {
        "model": "custom",
        "model_fields": "family=gpt;num_layers=30;hidden_size=2304;num_attention_heads=18;vocab_size=51200",
        "seq_length": "1024",
        "system": "v100-p3.16xlarge",
        "system_fields": "node.gpus_per_node=2",
        "gpus": "2",
        "stage_layers": "",
        **{k: "" for k in chk.PLAN_COLUMNS},
        "tensor_parallel": "2",
        "dtype": "fp16",
    }
    model, plan, system = chk.sections(r)
    assert model["seq_length"] == 1024 and "preset" not in model
    assert plan == {"tensor_parallel": 2, "dtype": "fp16"}
    assert system["num_nodes"] == 1 and system["node"] == {"gpus_per_node": 2}
    assert Job.from_dicts(model, plan, system).system.num_gpus == 2


def test_every_checking_row_builds_a_job_or_says_why_not():
    rows = chk.load_rows()
    assert len({r.source for r in rows}) >= 6
    for row in rows:
        if row.skipped:
            assert len(row.skipped) > 10, row.label
            continue
        job = Job.from_dicts(row.model, row.plan, row.system, source=row.label)
        assert job.system.num_gpus == row.gpus, row.label
        assert row.measured_s > 0


def test_plan_fields_add_plan_settings_without_a_column():
    r = {
        "model": "llama3-8b",
        "model_fields": "",
        "seq_length": "8192",
        "system": "dgx-h100",
        "system_fields": "",
        "gpus": "8",
        "stage_layers": "",
        **{k: "" for k in chk.PLAN_COLUMNS},
        "recompute": "full",
        "plan_fields": "recompute_method=block;recompute_num_layers=5",
    }
    _, plan, _ = chk.sections(r)
    assert plan == {"recompute": "full", "recompute_method": "block", "recompute_num_layers": 5}
