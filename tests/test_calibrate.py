"""Calibration: a known law is recovered, files round-trip and refuse other versions, the CLI wires it in."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import Job, load_system
from itercast.costs.analytic import AnalyticCostModel
from itercast.costs.fitting import collective_time_s, eff, fit_collective
from itercast.hardware.topology import GroupPlacement
from itercast.measurements import Measurement
from itercast.predict import predict
from itercast.profile.calibrate import CalibrationError, calibrate, load_calibration, report, write_calibration
from itercast.profile.db import ProfileDB

LAW = {"alpha_s": 4e-6, "e_max": 0.7, "log_half": 16.0, "gamma": 1.3}  # a GEMM law in the curve form
SYSTEM = "cpu-host"


def law_time(flops: np.ndarray, peak: float) -> np.ndarray:
    return LAW["alpha_s"] + flops / (peak * eff(flops, LAW["e_max"], LAW["log_half"], LAW["gamma"]))


def law_db(path, flops: np.ndarray, dtype: str = "bf16") -> tuple[ProfileDB, int]:
    """GEMMs of `flops` on cpu-host in `dtype` that follow LAW exactly (at the bf16 peak), in a database at `path`."""
    db = ProfileDB(path)
    dev = db.device("synthetic", {"synthetic": True})
    peak = load_system(SYSTEM).gpu.peak_flops["bf16"]
    db.add(
        dev,
        [
            Measurement("gemm", "mm", float(f), float(t), dtype)
            for f, t in zip(flops, law_time(flops, peak), strict=True)
        ],
    )
    return db, dev


@pytest.fixture
def synthetic_db(tmp_path):
    """bf16 GEMMs on cpu-host that follow LAW exactly."""
    db, dev = law_db(tmp_path / "p.db", np.logspace(5, 12, 40))
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
    old.write_text(json.dumps({"format": "itercast-calibration", "version": "2"}))  # priced norms by bytes alone
    with pytest.raises(CalibrationError, match=r"calibration version '2'; this itercast reads version 3 — re-run"):
        load_calibration(old)
    other = tmp_path / "other.json"
    other.write_text("{}")
    with pytest.raises(CalibrationError, match="not an itercast calibration file"):
        load_calibration(other)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"format": "itercast-calibration", "version": "3", "gemm": {"bf16": {"e_max": 1}}}))
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


def test_inter_node_collectives_recover_a_layout_aware_law_through_the_cost_model(tmp_path):
    """All-gathers over 2–8 ranks on 2–4 nodes that follow collective_time_s exactly (latency in
    log2 nodes and log2 ranks, ramp on one ring step): calibrate recovers the law, and the cost
    model prices a 16-rank group it never saw as the law does."""
    law = {"alpha0_s": 30e-6, "alpha_per_log2_nodes_s": 60e-6, "alpha_per_log2_ranks_s": 20e-6}
    law.update({"e_max": 0.8, "log_half": 11.0, "gamma": 0.9, "ramp_of": "step"})
    system = load_system("v100-p3.16xlarge")
    nic = system.nic_bandwidth_per_gpu_bytes_per_s()
    db = ProfileDB(tmp_path / "p.db")
    rows = []
    for ranks, nodes in ((2, 2), (4, 2), (4, 4), (8, 2), (8, 4)):
        for size in np.logspace(3, 9, 13):
            bus = (ranks - 1) / ranks * size
            t = collective_time_s(law, bus, nodes, ranks, ranks / nodes * nic)
            rows.append(Measurement("collective", "all_gather", float(size), float(t), "f16", ranks, nodes))
    db.add(db.device("synthetic", {}), rows)
    doc = calibrate(db, 1, system)
    fit = doc["collectives"]["inter_node"]["all_gather"]
    assert fit["ramp_of"] == "step" and fit["latency_of"] == "log2_ranks" and fit["fit_mean_abs_err"] < 1e-3
    model = AnalyticCostModel(system, "fp16", load_calibration(write_calibration(doc, tmp_path / "cal.json")))
    want = collective_time_s(law, 15 / 16 * 2**24, 2, 16, 8 * nic)
    assert model.collective_s("all_gather", 2**24, GroupPlacement(16, 2, 8)) == pytest.approx(float(want), rel=1e-3)


def test_a_latency_per_peer_is_told_from_one_in_log2_ranks_and_recovered():
    """All-to-alls over 2–8 ranks whose latency is 40 µs + 90 µs per peer (as NCCL's ranks − 1
    point-to-point exchanges): the log2(ranks) form fitted on 2 and 4 ranks misses 8 ranks, the
    per-peer form does not, so fit_collective keeps it and recovers the law. (γ ≠ 1: at γ = 1 the
    ramp on one ring step's bytes adds a per-peer term of its own, and the two trade off.)"""
    law = {"alpha0_s": 40e-6, "alpha_per_peer_s": 90e-6, "e_max": 0.8, "log_half": 10.0, "gamma": 1.4}
    law["ramp_of"] = "step"
    ranks = np.repeat([2.0, 4.0, 8.0], 13)
    size = np.tile(np.logspace(3, 9, 13), 3)
    t = collective_time_s(law, size, 2, ranks, 1e9)
    fit = fit_collective(size, t, np.full_like(size, 2.0), 1e9, ranks=ranks, starts=8)
    assert fit["latency_of"] == "peers" and fit["alpha_per_log2_ranks_s"] == 0.0
    assert fit["latency_choice_err"] < 1e-3
    assert fit["alpha_per_peer_s"] == pytest.approx(90e-6, rel=0.02)


def test_intra_node_groups_of_several_sizes_get_their_rank_latency(tmp_path):
    """All-reduces within one node over 2, 4 and 8 GPUs (as OpenXLA's tables hold) whose latency grows
    with log2(ranks): calibration fits that term, so each group size is priced as the law does."""
    law = {"alpha0_s": 8e-6, "alpha_per_log2_nodes_s": 0.0, "alpha_per_log2_ranks_s": 6e-6}
    law.update({"e_max": 0.7, "log_half": 14.0, "gamma": 1.1, "ramp_of": "step"})
    system = load_system("dgx-h100")
    bw = system.node.intra_node_bandwidth_bytes_per_s
    db = ProfileDB(tmp_path / "p.db")
    rows = []
    for ranks in (2, 4, 8):
        for size in np.logspace(3, 9, 13):
            t = collective_time_s(law, 2 * (ranks - 1) / ranks * size, 1, ranks, bw)
            rows.append(Measurement("collective", "all_reduce", float(size), float(t), "bf16", ranks, 1))
    db.add(db.device("synthetic", {}), rows)
    fit = calibrate(db, 1, system)["collectives"]["intra_node"]["all_reduce"]
    assert fit["fit_mean_abs_err"] < 1e-3
    assert fit["alpha_per_log2_ranks_s"] == pytest.approx(6e-6, rel=0.05)


def test_a_damaged_or_impossible_database_is_one_error_naming_it(tmp_path):
    import sqlite3

    from itercast.profile.db import ProfileDB, ProfileError

    path = tmp_path / "neg.db"
    db = ProfileDB(path)
    dev = db.device("synthetic", {"synthetic": True})
    db.add(dev, [Measurement("gemm", "mm", 1e9, 1e-3, "bf16"), Measurement("gemm", "mm", 2e9, 2e-3, "bf16")])
    db.close()
    with sqlite3.connect(path) as conn:  # a row written by something else: a negative time
        conn.execute("UPDATE measurements SET time_s = -1e-3 WHERE size = 2e9")
    with pytest.raises(ProfileError, match=r"neg\.db: measurement gemm/mm: expected 0 < time_s ≤ 3600 s and a finite"):
        list(ProfileDB(path, readonly=True).measurements())
    with sqlite3.connect(path) as conn:  # an hour and more: no kernel a profile times (1e300 s once priced a step)
        conn.execute("UPDATE measurements SET time_s = 3600.5 WHERE size = 2e9")
    with pytest.raises(ProfileError, match=r"got time_s=3600\.5"):
        list(ProfileDB(path, readonly=True).measurements())
    with pytest.raises(ProfileError, match=r"expected 0 < time_s ≤ 3600 s"):
        Measurement("gemm", "mm", 1e9, 3600.5, "bf16").check()
    with sqlite3.connect(path) as conn:  # params that are no JSON object: one line, not a traceback
        conn.execute("UPDATE measurements SET time_s = 2e-3, params = '{not json' WHERE size = 2e9")
    with pytest.raises(
        ProfileError, match=r"neg\.db: a measurement's params: expected a JSON object; got '\{not json'"
    ):
        list(ProfileDB(path, readonly=True).measurements())


def test_a_profile_no_curve_can_fit_is_refused_and_one_faster_than_the_peak_is_said(tmp_path):
    """LAW's rows with every other time 1,000× longer: the curve misses them by hundreds of times their time on
    average, so nothing is written. LAW's rows at 0.7 / 1.1 of their time: an efficiency of about 1.1, faster
    than the bf16 peak, written and said. A dtype no profile names is refused where it was taken as bf16."""
    flops = np.logspace(5, 10, 40)
    peak = load_system(SYSTEM).gpu.peak_flops["bf16"]
    t = law_time(flops, peak)

    def calibrated(name, times, dtype="bf16"):
        db = ProfileDB(tmp_path / f"{name}.db")
        dev = db.device("synthetic", {"synthetic": True})
        db.add(dev, [Measurement("gemm", "mm", float(f), float(x), dtype) for f, x in zip(flops, times, strict=True)])
        out = tmp_path / f"{name}.json"
        res = CliRunner().invoke(
            app, ["calibrate", str(tmp_path / f"{name}.db"), "--system", SYSTEM, "--out", str(out)]
        )
        return res, out

    res, out = calibrated("scattered", np.where(np.arange(40) % 2, t * 1000, t))
    assert res.exit_code == 2 and not out.exists()
    assert "gemm.bf16 misses its own rows by" in res.output and "nothing written" in res.output
    res, out = calibrated("fast", t * 0.7 / 1.1)
    assert res.exit_code == 0 and out.exists()
    assert 1.05 < json.loads(out.read_text())["gemm"]["bf16"]["e_max"] < 1.15
    assert "gemm.bf16: its rows run faster than the GPU's peak (fitted efficiency 1.1" in " ".join(res.output.split())
    res, out = calibrated("q7", t, dtype="q7")
    assert res.exit_code == 2 and "a GEMM row's dtype 'q7': expected one of fp32, f32, bf16" in res.output


def test_a_curve_of_sizes_beyond_its_half_size_bound_is_fitted_not_a_traceback():
    """Rows of 1e290 FLOPs (a corrupt size) once started the half-size at log(1e290) = 668, beyond its bound of 40,
    which scipy refuses with a traceback; the fit now starts at the bound."""
    from itercast.costs.fitting import fit_latency_curve

    x = np.logspace(288, 292, 10)
    fit = fit_latency_curve(x, x / 1e15, 1e15)
    assert fit["log_half"] <= 40 and fit["points"] == 10


def test_calibrate_says_what_it_leaves_built_in_and_which_fits_miss(tmp_path):
    """3 GEMM rows are too few (8 needed): nothing is calibrated, which family stays built-in is said, and no file
    is written (user probe 9: an empty file that changes nothing, exit 0, read as a calibration)."""
    db = ProfileDB(tmp_path / "few.db")
    dev = db.device("synthetic", {"synthetic": True})
    flops = np.logspace(6, 10, 3)
    db.add(dev, [Measurement("gemm", "mm", float(f), 1e-3, "bf16") for f in flops])  # no law: a flat 1 ms
    res = CliRunner().invoke(
        app, ["calibrate", str(tmp_path / "few.db"), "--system", SYSTEM, "--out", str(tmp_path / "c.json")]
    )
    assert res.exit_code == 2 and not (tmp_path / "c.json").exists(), res.output
    said = " ".join(res.output.split())
    assert "gemm.bf16: 3 rows (< 8): not fitted, the built-in curve stays" in said
    assert "nothing to calibrate (no family with 8 rows or more, no operator model); nothing written" in said


def test_an_operator_model_of_few_rows_is_said(tmp_path):
    """User probe 9: 4 aten::mm rows gave a multi-parameter operator model through them exactly, written without a
    word, where a family's curve needs 8 rows. The committed CPU profile's first 4 mm rows: the model is written
    (op_model fits one from 4) and said to rest on 4 rows."""
    measured = ProfileDB(Path(__file__).resolve().parents[1] / "data" / "measured" / "cpu_profile_1thread.db", True)
    rows = [m for m in measured.measurements(device_id=1) if m.op == "mm" and "call" in m.params][:4]
    db = ProfileDB(tmp_path / "four.db")
    dev = db.device("synthetic", {"synthetic": True})
    db.add(dev, rows)
    out = tmp_path / "four.json"
    res = CliRunner().invoke(app, ["calibrate", str(tmp_path / "four.db"), "--system", "cpu-host", "--out", str(out)])
    assert res.exit_code == 0 and json.loads(out.read_text())["operators"]["models"]["aten::mm:gemm"]["points"] == 4
    said = " ".join(res.output.split())
    assert "operators.aten::mm:gemm: its model is fitted on 4 rows (< 8): it runs through them" in said


def test_a_calibrated_curve_priced_beyond_the_sizes_it_was_fitted_on_is_said(tmp_path):
    """GEMMs of 1e5–1e9 FLOPs (LAW, 20 rows): the file keeps that range; a model priced within 2× of it says
    nothing, one priced at 3e9 names the curve and both ranges; a job whose GEMMs reach ~1e11 warns."""
    db, dev = law_db(tmp_path / "small.db", np.logspace(5, 9, 20))
    doc = calibrate(db, dev, load_system(SYSTEM))
    assert doc["gemm"]["bf16"]["measured_range"] == [pytest.approx(1e5), pytest.approx(1e9)]
    cal = load_calibration(write_calibration(doc, tmp_path / "cal.json"))
    model = AnalyticCostModel(load_system(SYSTEM), "bf16", cal)
    model.gemm_s(np.array([0.0, 1e6, 2e9]))  # 2e9: twice the largest row, not beyond
    model.memory_s("elementwise", 1e12)  # a built-in curve: no measured range, nothing to say
    assert model.extrapolations() == []
    model.gemm_s(3e9)
    assert model.extrapolations() == [
        "calibrated gemm.bf16 was fitted on 1e+05–1e+09 FLOPs; this job prices 1e+06–3e+09 on it: beyond that "
        "range the curve is extrapolated (profile larger or smaller sizes to measure them)"
    ]
    small = AnalyticCostModel(load_system(SYSTEM), "bf16", cal)
    small.gemm_s(5e4)  # half the smallest row: within 2×
    assert small.extrapolations() == []
    small.gemm_s(4e4)
    assert small.extrapolations()[0].startswith(
        "calibrated gemm.bf16 was fitted on 1e+05–1e+09 FLOPs; this job prices 4e+04–5e+04"
    )
    # gpt3-1.3b's GEMMs (h 2048, 2048 tokens a micro-batch): 2 · 2048 · 2048 · 8192 ≈ 6.9e10 FLOPs, 69× the rows
    args = ["predict", "--model", "gpt3-1.3b", "--system", SYSTEM, "--set", "model.num_layers=2"]
    said_and_listed(
        args, tmp_path / "cal.json", "calibrated gemm.bf16 was fitted on 1e+05–1e+09 FLOPs; this job prices"
    )
    # search says it of the plans it shows, each priced by predict's graph
    found = CliRunner().invoke(
        app,
        [
            "search",
            *args[1:],
            "--set",
            "plan.global_batch_size=8",
            "--top",
            "1",
            "--calibration",
            str(tmp_path / "cal.json"),
        ],
    )
    assert found.exit_code == 0, found.output
    assert (
        "calibrated gemm.bf16 was fitted on 1e+05–1e+09 FLOPs" in found.output and "(the plans shown)" in found.output
    )
    # slice says it of the slicing it chose (predict's graph of it)
    sliced = CliRunner().invoke(app, ["slice", *args[1:], "--calibration", str(tmp_path / "cal.json")])
    assert sliced.exit_code == 0, sliced.output
    assert "calibrated gemm.bf16 was fitted on 1e+05–1e+09 FLOPs" in sliced.output
    # a range that is no [least, most] is refused where the file is read
    bad = {**json.loads((tmp_path / "cal.json").read_text())}
    bad["gemm"]["bf16"]["measured_range"] = [1e9, 1e5]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(CalibrationError, match=r"`gemm\.bf16\.measured_range`: expected \[least, most\] size"):
        load_calibration(tmp_path / "bad.json")


def test_a_collectives_asymptote_is_held_to_the_bandwidth_it_is_priced_against_when_asked():
    """Rows of a law whose bus bandwidth tends to 1.2 × bw (log_half 20, gamma 1; no latency): free, the fit
    recovers e_max 1.2; bounded at 1 (tools/fit_efficiency_curves.py _h100_400g: a ring moves no more than its
    links), e_max sits at the bound and every other parameter stays inside its own bounds."""
    law = {"alpha0_s": 0.0, "e_max": 1.2, "log_half": 20.0, "gamma": 1.0}
    size = np.logspace(6, 11, 20)
    t = collective_time_s(law, size, 2, 2, 1e9)
    free = fit_collective(size, t, np.full_like(size, 2.0), 1e9)
    assert free["e_max"] == pytest.approx(1.2, rel=1e-3)
    held = fit_collective(size, t, np.full_like(size, 2.0), 1e9, e_max_at_most=1.0)
    assert held["e_max"] == pytest.approx(1.0, abs=1e-6)
    # the largest rows, at 1e11 bytes: 1e11 / (1e9 · 1.2 / (1 + e^(20 − 25.33))) = 83.73 s measured; the bounded
    # curve cannot go below 1e11 / 1e9 = 100 s there
    assert float(t[-1]) == pytest.approx(1e11 / (1e9 * 1.2 / (1 + np.exp(20 - np.log(1e11)))), rel=1e-9)
    assert float(collective_time_s(held, size[-1], 2, 2, 1e9)) >= 100.0


def test_a_dlrm_step_says_which_calibrated_curve_it_priced_beyond_its_rows(tmp_path):
    """fp32 GEMMs of 1e5–1e7 FLOPs (20 rows): dlrm-small's MLPs at 65,536 samples a rank run GEMMs up to
    2 · 65,536 · 64 · 42 = 3.5e8 FLOPs (its (42, 64) layer), 35× the largest row: predict warns, and --json lists it."""
    db, dev = law_db(tmp_path / "small.db", np.logspace(5, 7, 20), "fp32")
    write_calibration(calibrate(db, dev, load_system(SYSTEM)), tmp_path / "cal.json")
    args = ["predict", "--model", "dlrm-small", "--system", SYSTEM, "--set", "plan.batch_per_rank=65536"]
    said = "calibrated gemm.tf32 was fitted on 1e+05–1e+07 FLOPs; this job prices"
    said_and_listed(args, tmp_path / "cal.json", said)
    # shard says it of the sharding it chose
    shard = ["shard", "--model", "dlrm-small", "--system", SYSTEM, "--batch-per-rank", "65536"]
    sharded = CliRunner().invoke(app, [*shard, "--calibration", str(tmp_path / "cal.json")])
    assert sharded.exit_code == 0, sharded.output
    assert said in sharded.output


def said_and_listed(args: list[str], calibration, said: str) -> None:
    """`args` with `calibration` warn `said`, and with --json list exactly one extrapolated curve, that one."""
    res = CliRunner().invoke(app, [*args, "--calibration", str(calibration)])
    assert res.exit_code == 0, res.output
    assert said in res.output
    doc = json.loads(CliRunner().invoke(app, [*args, "--calibration", str(calibration), "--json"]).stdout)
    assert len(doc["extrapolated"]) == 1 and doc["extrapolated"][0].startswith(said.split(" was ")[0])


def test_calibrating_an_imported_device_of_another_gpu_says_so(tmp_path):
    # nccl-tests rows imported under 'ALCF Polaris' (A100s) fitted to dgx-h100's model: said, as a profile of this
    # machine on another GPU is; a device whose name says H100 is not
    db = ProfileDB(tmp_path / "n.db")
    for name in ("ALCF Polaris", "H100 cluster01"):
        dev = db.device(name, {"source": "nccl_tests_tidy.csv", "system": name})
        db.add(dev, [Measurement("collective", "all_reduce", float(s), 1e-4 + s / 1e11, "bf16") for s in (1e6, 1e8)])
    db.close()
    said = "does not name H100-SXM5-80GB, the GPU of 'dgx-h100'"
    for device, warned in (("1", True), ("2", False)):
        res = CliRunner().invoke(
            app, ["calibrate", str(tmp_path / "n.db"), "--system", "dgx-h100", "--device", device, "--report"]
        )
        assert res.exit_code == 0, res.output
        assert (said in " ".join(res.output.split())) is warned


def test_an_nccl_tests_log_is_judged_by_the_gpu_its_ranks_name(tmp_path):
    """nccl-tests prints each rank's GPU; an imported log of H100s fitted to dgx-h100 is not 'a CPU (unnamed)'
    (a probe's finding: the import's fingerprint looked like a profile of this machine's), and to dgx-a100 it is
    said to be another GPU's."""
    log = tmp_path / "ar.txt"
    rows = "".join(
        f"  {s}  {s // 4}  float  sum  -1  {10 + s / 1e5:.1f}  1  1  0  10.0  1  1  0\n" for s in (2**20, 2**24)
    )
    log.write_text("#  Rank  0 Group  0 Pid 7 on node1 device  0 [0x18] NVIDIA H100 80GB HBM3\n" + rows)
    db = tmp_path / "n.db"
    assert CliRunner().invoke(app, ["profile", "import", "nccl-log", str(log), "--db", str(db)]).exit_code == 0
    for system, said in (("dgx-h100", None), ("dgx-a100", "does not name A100-SXM4-80GB")):
        res = CliRunner().invoke(app, ["calibrate", str(db), "--system", system, "--report"])
        assert res.exit_code == 0 and "a CPU" not in res.output
        assert (said is not None and said in " ".join(res.output.split())) or (
            said is None and "warning" not in res.output
        )
