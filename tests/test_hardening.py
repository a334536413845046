"""Hostile and careless input: one clear line and exit 2, never a traceback, a silent wrong answer
or a clobbered file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import Job
from itercast.errors import ConfigError
from itercast.user_files import write_output

RUN = CliRunner()
EXAMPLE = ["--model", "gpt3-1.3b", "--system", "dgx-h100"]


@pytest.mark.parametrize(
    "model,plan,system,message",
    [
        ({"num_layers": True}, {}, {}, "`model.num_layers`: Input should be a valid integer"),
        ({"num_layers": 10**7}, {}, {}, "less than or equal to 100000"),
        ({}, {"tensor_parallel": "8"}, {}, "`plan.tensor_parallel`: Input should be a valid integer"),
        ({}, {}, {"num_nodes": 10**30}, "`system.num_nodes`"),
        ({}, {}, {"gpu": {"hbm_bandwidth_bytes_per_s": math.inf}}, "Input should be a finite number"),
        ({}, {}, {"network": {"latency_s": math.nan}}, "`system.network.latency_s`"),
        ({}, {"global_batch_size": 10**8}, {}, "forward passes to simulate; expected ≤ 1,000,000"),
    ],
)
def test_configs_refuse_wrong_types_non_finite_numbers_and_absurd_sizes(model, plan, system, message):
    with pytest.raises(ConfigError, match=None) as err:
        Job.from_dicts({"preset": "gpt3-1.3b", **model}, plan, {"preset": "dgx-h100", **system})
    assert message in str(err.value)


@pytest.mark.parametrize(
    "text,message",
    [
        ("a: &a [1, 1, 1]\nb: [*a, *a]\nmodel: gpt3-1.3b\n", "YAML aliases"),
        ("model: " + "[" * 100 + "]" * 100 + "\n", "nested deeper than 32"),
    ],
)
def test_job_files_refuse_aliases_and_deep_nesting(tmp_path, text, message):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    out = RUN.invoke(app, ["predict", str(path)])
    assert out.exit_code == 2 and message in out.output


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"model": "dlrm-small", "world_size": 8, "plans": []}, "got the saved result of `itercast search --json`"),
        ({"steps": [], "ranks": [0]}, "got the saved result of `itercast replay --json` (field `steps`)"),
        ({"model": "gpt3-1.3b", "sytem": "dgx-h100"}, "unknown section `sytem`"),
    ],
)
def test_a_saved_result_given_as_a_job_says_where_it_goes(tmp_path, doc, message):
    # a search's JSON as the job once read "unknown section `world_size`", its first field not a section
    path = tmp_path / "result.json"
    path.write_text(json.dumps(doc))
    out = RUN.invoke(app, ["report", str(path), "-o", str(tmp_path / "r.html")])
    assert out.exit_code == 2 and message in out.output and out.output.count("\n") == 1, out.output
    if "saved result" in message:
        assert "`itercast report --result FILE` and `itercast compare A B` read those" in out.output


def test_a_job_file_that_is_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_bytes(b"model: gpt3-1.3b\n\xff\xfe")
    out = RUN.invoke(app, ["predict", str(path)])
    assert out.exit_code == 2 and "not UTF-8 text" in out.output


@pytest.mark.parametrize(
    "args,message",
    [
        (["--comm-cv", "inf"], "expected a finite number"),
        (["--comm-cv", "nan"], "expected a finite number"),
        (["--within-s", "nan"], "expected a finite number > 0"),
        (["--steps", "10", "--mtbf-hours", "0"], "expected a finite number > 0"),
        (["--steps", "-5"], "--steps"),
        (["--samples", "1000000000"], "--samples"),
        (["--deadline-hours", "5"], "--deadline-hours needs --steps"),
        (["--slow-gpus", "100000"], "--slow-gpus 100000: the job has 8 GPUs"),
    ],
)
def test_variability_options_are_checked(args, message):
    out = RUN.invoke(app, ["variability", *EXAMPLE, "--samples", "200", *args])
    assert out.exit_code == 2 and message in out.output


def test_replay_scale_refuses_nan(tmp_path):
    out = RUN.invoke(app, ["replay", str(tmp_path), "--scale", "gemm=nan"])
    assert out.exit_code == 2 and "finite factor" in out.output


def test_outputs_never_land_on_an_input_a_directory_a_symlink_or_nowhere(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("model: gpt3-1.3b\nsystem: dgx-h100\n")
    before = job.read_text()
    cases = {
        str(job): "is an input of this command",
        str(tmp_path): "is a directory",
        str(tmp_path / "missing" / "t.json"): "does not exist",
    }
    link = tmp_path / "link.json"
    link.symlink_to(job)
    cases[str(link)] = "is a symbolic link"
    for target, message in cases.items():
        out = RUN.invoke(app, ["predict", str(job), "--trace", target])
        assert out.exit_code == 2 and message in out.output, target
    assert job.read_text() == before
    assert RUN.invoke(app, ["predict", str(job), "--trace", str(tmp_path / "t.json")]).exit_code == 0
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


def test_write_output_replaces_whole_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    write_output(target, "new")
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_calibrate_refuses_a_missing_database_instead_of_creating_one(tmp_path):
    missing = tmp_path / "typo.db"
    out = RUN.invoke(app, ["calibrate", str(missing), "--system", "cpu-host", "--out", str(tmp_path / "c.json")])
    assert out.exit_code == 2 and "no such profiling database" in out.output and not missing.exists()


def test_json_output_never_carries_nan(monkeypatch):
    from itercast.predict import Prediction

    monkeypatch.setattr(Prediction, "to_dict", lambda self: {"step_time_s": math.nan})
    out = RUN.invoke(app, ["predict", *EXAMPLE, "--json"])
    assert out.exit_code == 2 and "JSON cannot carry" in out.output


def test_a_calibration_for_another_system_is_named_in_a_warning(tmp_path):
    cal = tmp_path / "cal.json"
    db = Path(__file__).resolve().parents[1] / "data" / "measured" / "cpu_profile.db"
    out = RUN.invoke(app, ["calibrate", str(db), "--system", "cpu-host", "--out", str(cal)])
    assert out.exit_code == 0, out.output
    pred = RUN.invoke(app, ["predict", *EXAMPLE, "--calibration", str(cal), "--json"])
    assert pred.exit_code == 0 and "fitted for system 'cpu-host'; this job runs on 'dgx-h100'" in pred.output


def _finite(doc: object) -> bool:
    if isinstance(doc, float):
        return math.isfinite(doc)
    if isinstance(doc, dict):
        return all(_finite(v) for v in doc.values())
    if isinstance(doc, list):
        return all(_finite(v) for v in doc)
    return True


_VALUES = st.one_of(
    st.integers(-3, 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=6),
    st.none(),
    st.lists(st.integers(0, 64), max_size=4),
)
_FIELDS = st.sampled_from(
    [
        "plan.tensor_parallel",
        "plan.pipeline_parallel",
        "plan.context_parallel",
        "plan.virtual_pipeline",
        "plan.micro_batch_size",
        "plan.global_batch_size",
        "plan.zero_stage",
        "plan.recompute",
        "plan.schedule",
        "plan.stage_layers",
        "plan.sequence_parallel",
        "model.num_layers",
        "model.hidden_size",
        "model.seq_length",
        "system.num_nodes",
        "system.gpu.hbm_bytes",
        "system.network.latency_s",
    ]
)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.tuples(_FIELDS, _VALUES), max_size=4))
def test_random_jobs_answer_with_finite_numbers_or_one_clear_error(changes):
    # the answer is finite JSON with exit 0, or exit 2 with an error line; never a traceback
    args = ["predict", "--model", "gpt3-1.3b", "--system", "dgx-h100", "--json"]
    for field, value in changes:
        args += ["--set", f"{field}={json.dumps(value)}"]
    out = RUN.invoke(app, args)
    assert out.exit_code in (0, 2), (args, out.output, out.exception)
    if out.exit_code == 0:
        assert _finite(json.loads(out.stdout))
    else:
        assert out.output.startswith("error:") and "Traceback" not in out.output


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["variability", "--example", "--samples", "1"],
            "error: itercast variability: Invalid value for '--samples': Input should be greater than or equal "
            "to 100 (itercast variability -h for help)",
        ),
        (
            ["predict", "--example", "--zzz"],
            "error: itercast predict: No such option: --zzz (itercast predict -h for help)",
        ),
        (["bogus"], "error: itercast: No such command 'bogus'. (itercast -h for help)"),
    ],
)
def test_usage_errors_are_one_line_exit_2(args, line):
    """click's usage errors (a value out of range, an unknown option or command) are one line naming the
    command, as the commands' own errors, not typer's five-line box (issue 28: one line, exit 2)."""
    out = RUN.invoke(app, args, prog_name="itercast")
    assert out.exit_code == 2
    assert out.output == line + "\n"
