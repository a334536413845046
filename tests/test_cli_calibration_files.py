"""A bad calibration file (a section of the wrong type, a negative or non-numeric coefficient) is one
line naming the file, the field, what was expected and what it holds, exit 2, from every command that
takes --calibration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from itercast.cli import app
from itercast.profile.calibrate import FORMAT, VERSION

CURVE = {"alpha_s": 6e-6, "e_max": 0.7, "log_half": 19.6, "gamma": 0.5}
BAD = {
    "gemm": ([CURVE], "`gemm`: expected a mapping of fits; got list"),
    "negative": (
        {"gemm": {"bf16": {**CURVE, "alpha_s": -1e-6}}},
        "`gemm.bf16.alpha_s`: expected a finite number ≥ 0; got -1e-06",
    ),
    "text": (
        {"memory": {"elementwise": {**CURVE, "gamma": "steep"}}},
        "`memory.elementwise.gamma`: expected a finite number ≥ 0; got 'steep'",
    ),
    "nested": (
        {"collectives": {"intra_node": {"all_reduce": {"regimes": [{**CURVE, "e_max": True}]}}}},
        "`collectives.intra_node.all_reduce.regimes[0].e_max`: expected a finite number ≥ 0; got True",
    ),
    "collective": (
        {"collectives": {"intra_node": {"all_reduce": {"e_max": 0.5}}}},
        "`collectives.intra_node.all_reduce`: expected a curve with alpha0_s, log_half, gamma; got {'e_max': 0.5}",
    ),
    "operators": (
        {"operators": {"models": "x"}},
        "`operators.models`: expected a mapping of operator fits; got 'x'",
    ),
}
COMMANDS = {
    "predict": ["predict", "--example"],
    "slice": ["slice", "--example"],
    "shard": ["shard", "--model", "dlrm-small"],
    "search": ["search", "--example", "--top", "1", "--workers", "1"],
    "search-dlrm": ["search", "--model", "dlrm-small", "--system", "dgx-a100"],
    "variability": ["variability", "--example", "--samples", "100"],
    "report": ["report", "--example"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_calibration_is_one_line_exit_2(tmp_path: Path, command: str, case: str) -> None:
    fields, message = BAD[case]
    if case == "gemm":
        fields = {"gemm": fields}
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"format": FORMAT, "version": VERSION, "system": "dgx-a100", **fields}))
    res = CliRunner().invoke(app, [*COMMANDS[command], "--calibration", str(path)])
    assert res.exit_code == 2, res.output
    assert res.output == f"error: {path}: {message}\n"


def test_log_half_may_be_negative_but_must_be_a_number(tmp_path: Path) -> None:
    from itercast.profile.calibrate import CalibrationError, load_calibration

    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"format": FORMAT, "version": VERSION, "gemm": {"bf16": {**CURVE, "log_half": -2.0}}}))
    assert load_calibration(path)["gemm"]["bf16"]["log_half"] == -2.0  # below one byte at half efficiency: allowed
    path.write_text(json.dumps({"format": FORMAT, "version": VERSION, "gemm": {"bf16": {**CURVE, "log_half": None}}}))
    with pytest.raises(CalibrationError, match=r"`gemm.bf16.log_half`: expected a finite number; got None"):
        load_calibration(path)


@pytest.mark.parametrize(
    "command",
    [
        ["shard", "--model", "dlrm-small", "--system", "dgx-h100"],
        ["replay", "data/measured/gloo_tensor_parallel", "--system", "dgx-h100", "--tp", "2"],
    ],
)
def test_a_calibration_of_another_system_is_said_by_every_command(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"format": FORMAT, "version": VERSION, "system": "dgx-a100", "gemm": {"bf16": CURVE}}))
    res = CliRunner().invoke(app, [*command, "--calibration", str(path)])
    assert f"{path} was fitted for system 'dgx-a100'; this job runs on 'dgx-h100'" in res.output, res.output
