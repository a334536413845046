"""Calibration: a known law is recovered, files round-trip and refuse other versions, the CLI wires it in."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import Job, load_system
from itercast.costs.analytic import AnalyticCostModel
from itercast.costs.calibrate import CalibrationError, calibrate, load_calibration, report, write_calibration
from itercast.costs.fitting import eff
from itercast.predict import predict
from itercast.profile.db import Measurement, ProfileDB

LAW = {"alpha_s": 4e-6, "e_max": 0.7, "log_half": 16.0, "gamma": 1.3}  # a GEMM law in the curve form
SYSTEM = "cpu-host"


def law_time(flops: np.ndarray, peak: float) -> np.ndarray:
    return LAW["alpha_s"] + flops / (peak * eff(flops, LAW["e_max"], LAW["log_half"], LAW["gamma"]))


@pytest.fixture
def synthetic_db(tmp_path):
    """bf16 GEMMs on cpu-host that follow LAW exactly."""
    db = ProfileDB(tmp_path / "p.db")
    dev = db.device("synthetic", {"synthetic": True})
    peak = load_system(SYSTEM).gpu.peak_flops["bf16"]
    flops = np.logspace(5, 12, 40)
    db.add(
        dev,
        [
            Measurement("gemm", "mm", float(f), float(t), "bf16")
            for f, t in zip(flops, law_time(flops, peak), strict=True)
        ],
    )
    return db, dev, tmp_path


def test_fitting_recovers_a_known_law(synthetic_db):
    db, dev, _ = synthetic_db
    fit = calibrate(db, dev, load_system(SYSTEM))["gemm"]["bf16"]
    for key, value in LAW.items():
        assert fit[key] == pytest.approx(value, rel=1e-3), key


def test_report_puts_the_calibrated_curve_far_ahead_of_a_straight_line_on_small_sizes(synthetic_db):
    db, dev, _ = synthetic_db
    (row,) = report(db, dev, load_system(SYSTEM))
    # measured on this synthetic law: calibrated ~1e-11, straight line 48% on the smallest quarter of sizes
    assert row["calibrated"] < 1e-3 and row["straight_line_smallest_quarter"] > 0.3


def test_calibration_file_round_trips_into_the_cost_model(synthetic_db):
    db, dev, tmp = synthetic_db
    path = write_calibration(calibrate(db, dev, load_system(SYSTEM)), tmp / "cal.json")
    model = AnalyticCostModel(load_system(SYSTEM), "bf16", load_calibration(path))
    peak = load_system(SYSTEM).gpu.peak_flops["bf16"]
    assert float(model.gemm_s(3e9)) == pytest.approx(float(law_time(np.array(3e9), peak)), rel=1e-3)
    assert model.memory == AnalyticCostModel(load_system(SYSTEM), "bf16").memory  # uncovered families: built-in


def test_other_versions_and_other_files_are_refused_with_the_reason(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"format": "itercast-calibration", "version": "0"}))
    with pytest.raises(CalibrationError, match=r"calibration version '0'; this itercast reads version 1 — re-run"):
        load_calibration(old)
    other = tmp_path / "other.json"
    other.write_text("{}")
    with pytest.raises(CalibrationError, match="not an itercast calibration file"):
        load_calibration(other)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"format": "itercast-calibration", "version": "1", "gemm": {"bf16": {"e_max": 1}}}))
    with pytest.raises(CalibrationError, match="a curve lacks its parameters"):
        load_calibration(broken)


def test_cli_calibrate_then_predict_with_it(synthetic_db):
    db, _, tmp = synthetic_db
    runner = CliRunner()
    res = runner.invoke(
        app, ["calibrate", str(db.path), "--system", SYSTEM, "--out", str(tmp / "cal.json"), "--report"]
    )
    assert res.exit_code == 0, res.output
    args = ["predict", "--model", "gpt3-1.3b", "--system", SYSTEM, "--set", "model.num_layers=2", "--json"]
    base = json.loads(runner.invoke(app, args).stdout)["step_time_s"]
    calibrated = json.loads(runner.invoke(app, [*args, "--calibration", str(tmp / "cal.json")]).stdout)["step_time_s"]
    job = Job.load(model="gpt3-1.3b", system=SYSTEM, overrides=["model.num_layers=2"])
    assert calibrated == pytest.approx(predict(job, load_calibration(tmp / "cal.json")).step_time_s)
    assert calibrated != pytest.approx(base, rel=0.01)
