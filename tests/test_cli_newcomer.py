"""What a newcomer trips on (issue 31): tables cut to `…` when piped, install hints without the extra,
`presets show` output that is no YAML, `--set` numbers YAML 1.1 leaves strings, `<bool>` in help,
`slice --stages auto` beyond what fits, README examples out of memory."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from itercast.cli import app
from itercast.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
SEARCH = ["search", "--model", "gpt3-1.3b", "--system", "dgx-h100", "--set", "plan.global_batch_size=64"]
SEARCH += ["--top", "3", "--workers", "1"]


def invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.output


def test_a_piped_search_table_keeps_every_column_whole() -> None:
    code, text = invoke(*SEARCH)  # CliRunner's stdout is no terminal, as `| cat`
    assert code == 0, text
    assert "…" not in text
    header = next(line for line in text.splitlines() if "s/step" in line)
    assert header.split() == [
        "#", "GPUs", "dp×tp×pp×cp", "vp", "gbs", "mbs", "sched", "ZeRO", "recomp", "SP", "ovl",
        "s/step", "tok/s", "GPU-h/Mtok", "MFU", "GiB",
    ]  # fmt: skip


def test_search_as_csv_has_a_header_and_one_row_per_plan_without_thousands_separators() -> None:
    code, text = invoke(*SEARCH, "--format", "csv")
    assert code == 0, text
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0][:3] == ["#", "GPUs", "dp×tp×pp×cp"] and [r[0] for r in rows[1:]] == ["1", "2", "3"]
    tokens = rows[1][rows[0].index("tok/s")]
    assert float(tokens) > 0 and "," not in tokens
    code, text = invoke(*SEARCH, "--format", "xml")
    assert code == 2 and "expected table, csv or json" in text


def test_every_install_hint_names_an_extra_pyproject_declares() -> None:
    table = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1].split("\n[")[0]
    extras = set(re.findall(r"(?m)^(\w+) = \[", table))
    hints = [
        m.group(1)
        for path in (ROOT / "itercast").rglob("*.py")
        for m in re.finditer(r"pip install '?itercast\[(\w+)\]", path.read_text())
    ]
    assert len(hints) >= 3 and set(hints) <= extras and "plot" in hints and "ray" in hints


def test_presets_show_writes_a_job_file_section(tmp_path: Path) -> None:
    code, text = invoke("presets", "show", "dgx-h100")
    assert code == 0, text
    section = yaml.safe_load(text)["system"]
    assert section["gpu"]["hbm_bandwidth_bytes_per_s"] == 3350.0e9 and section["node"]["gpus_per_node"] == 8
    job = tmp_path / "job.yaml"
    job.write_text("model: gpt3-1.3b\nplan: {global_batch_size: 8}\n" + text)  # the section pasted as written
    pasted, named = load_workload(job), load_workload(None, ["plan.global_batch_size=8"], "gpt3-1.3b", "dgx-h100")
    assert pasted.job.system == named.job.system
    code, text = invoke("presets", "show", "dlrm-small")
    assert code == 0 and "--dlrm" not in text and yaml.safe_load(text)["model"]["name"] == "dlrm-small"


@pytest.mark.parametrize("name", ["llama3-8b", "deepseek-v3", "gpt-oss-20b"])
def test_presets_show_writes_every_field_of_a_one_line_model_preset(tmp_path: Path, name: str) -> None:
    # models.yaml writes each model on one line (`NAME: {field: value, …}  # source`): every field shown
    code, text = invoke("presets", "show", name)
    assert code == 0, text
    job = tmp_path / "job.yaml"
    job.write_text(text + "\nplan: {global_batch_size: 8}\nsystem: dgx-h100\n")
    pasted, named = load_workload(job), load_workload(None, ["plan.global_batch_size=8"], name, "dgx-h100")
    assert pasted.job.model == named.job.model
    assert yaml.safe_load(text)["model"]["num_layers"] == named.job.model.num_layers


def test_set_takes_any_float_literal_and_blames_itself_for_a_bad_value() -> None:
    job = load_workload(
        None, ["system.gpu.hbm_bandwidth_bytes_per_s=2e12", "model.hidden_size=2.048e3"], "gpt3-1.3b", "dgx-h100"
    )
    assert job.job.system.gpu.hbm_bandwidth_bytes_per_s == 2 * 10**12 and job.job.model.hidden_size == 2048
    code, text = invoke("predict", "--example", "--set", "plan.tensor_parallel=two")
    assert code == 2 and text.startswith("error: --set plan.tensor_parallel=two: `plan.tensor_parallel`")
    assert "gpt3-175b-a100.yaml" not in text
    # a rule across fields, or an unknown field, names the --set that gave the value beside the file
    code, text = invoke("predict", "--example", "--set", "plan.tensor_parallel=3")
    # the example's 1,024 GPUs over tp 3 × pp 8: data_parallel ⌊1024 / 24⌋ = 42, and 42 × 24 = 1008 ≠ 1024
    assert code == 2 and "= 1008 ≠ 1024 GPUs (num_nodes(128) × gpus_per_node(8)) (given by --set plan.tensor" in text
    assert "data_parallel(42: left out, 1024 GPUs ÷ 24 rounded down) × tensor_parallel(3)" in text
    code, text = invoke("predict", "--example", "--set", "plan.nonexistent=1")
    assert code == 2 and "unknown field `plan.nonexistent` (given by --set plan.nonexistent=1)" in text


@pytest.mark.parametrize("command", ["", "predict", "search", "slice", "variability", "presets", "profile run"])
def test_help_shows_no_type_on_flags(command: str) -> None:
    code, text = invoke(*command.split(), "-h")
    assert code == 0 and "-h" in text and "<bool>" not in text and "BOOLEAN" not in text


def test_slice_auto_tries_only_stage_counts_the_gpus_allow_and_prints_stage_layers_to_paste() -> None:
    # 8 GPUs at tp 2: 4 sets of GPUs, so 1, 2 or 4 stages (3 leaves a set idle); the batch of 16 splits
    # into the 4 / k replicas of each
    job = ["--model", "gpt3-1.3b", "--system", "dgx-h100", "--set", "plan.tensor_parallel=2"]
    job += ["--set", "plan.global_batch_size=16"]
    code, text = invoke("slice", *job, "--stages", "auto")
    assert code == 0, text
    lines = text[text.index("paste under `plan:`") :].splitlines()[1:]
    pasted = yaml.safe_load("plan:\n" + "\n".join(lines))["plan"]  # indented as under `plan:`
    assert pasted["pipeline_parallel"] in (1, 2, 4) and len(pasted["stage_layers"]) == pasted["pipeline_parallel"]
    assert sum(pasted["stage_layers"]) == 24  # gpt3-1.3b's layers
    code, text = invoke("slice", *job, "--stages", "3")
    assert code == 2 and text.startswith("error:")


def test_slice_of_an_interleaved_job_prints_a_plan_predict_prices_as_slice_does() -> None:
    # 8 GPUs at tp 2 × pp 2 × 2 chunks a stage: 4 virtual stages of gpt3-1.3b's 24 layers; the paste is
    # the plan (data 2 × pipeline 2, 2 chunks a stage), not the 4 chunks as pipeline stages
    job = ["--model", "gpt3-1.3b", "--system", "dgx-h100", "--set", "plan.tensor_parallel=2"]
    job += ["--set", "plan.pipeline_parallel=2", "--set", "plan.virtual_pipeline=2"]
    job += ["--set", "plan.schedule=interleaved-1f1b", "--set", "plan.global_batch_size=16"]
    code, text = invoke("slice", *job)
    assert code == 0, text
    lines = text[text.index("paste under `plan:`") :].splitlines()[1:]
    pasted = yaml.safe_load("plan:\n" + "\n".join(lines))["plan"]
    assert {k: v for k, v in pasted.items() if k != "stage_layers"} == {
        "data_parallel": 2,
        "pipeline_parallel": 2,
        "virtual_pipeline": 2,
    }
    assert len(pasted["stage_layers"]) == 4 and sum(pasted["stage_layers"]) == 24
    step = json.loads(invoke("slice", *job, "--json")[1])["step_time_s"]
    code, text = invoke("predict", *job, "--set", f"plan.stage_layers={pasted['stage_layers']}", "--json")
    assert code == 0, text
    assert json.loads(text)["step_time_s"] == pytest.approx(step, rel=1e-9)


def test_the_readme_job_file_fits_in_memory(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```yaml\n(model: llama3-70b.*?)```", readme, re.S)
    assert block is not None
    job = tmp_path / "job.yaml"
    job.write_text(block.group(1))
    assert not load_workload(job).predict().memory.oom


def test_predict_and_search_on_v100_need_no_precision_or_attention_set() -> None:
    # V100 has no bf16 and runs no FlashAttention: left out, both commands take fp16 and unfused attention
    res = CliRunner().invoke(app, ["predict", "--model", "gpt3-1.3b", "--system", "v100-p3.16xlarge", "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)["job"]["plan"]  # stderr warns that this plan does not fit: stdout alone
    assert (plan["dtype"], plan["flash_attention"]) == ("fp16", False)
    v100 = ["search", "--model", "gpt3-1.3b", "--system", "v100-p3.16xlarge", "--set", "plan.global_batch_size=64"]
    res = CliRunner().invoke(app, [*v100, "--top", "1", "--workers", "1", "--json"])
    assert res.exit_code == 0, res.output
    best = json.loads(res.stdout)["plans"][0]["plan"]
    assert (best["dtype"], best["flash_attention"]) == ("fp16", False)
