"""One calibration prices a job the same in every command: `search` (its fast path and the graph's re-score),
`variability` (its step graph) and `report` price with --calibration's curves as `predict` does.

The calibration here slows every bf16 GEMM (its efficiency curve's plateau e_max 0.35 instead of the
preset's), so a command that ignored it would answer a step about half as long."""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import Job
from itercast.predict import predict
from itercast.profile.calibrate import FORMAT, VERSION, load_calibration

SLOW_GEMMS = {"gemm": {"bf16": {"alpha_s": 6e-6, "e_max": 0.35, "log_half": 19.6, "gamma": 0.5}}}
SMALL = ["--model", "gpt3-1.3b", "--system", "dgx-a100", "--set", "model.num_layers=4"]


@pytest.fixture
def slow_gemms(tmp_path: Path) -> Path:
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"format": FORMAT, "version": VERSION, "system": "dgx-a100", **SLOW_GEMMS}))
    return path


def _json(args: list[str]) -> dict:
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_search_prices_every_plan_with_the_calibration(slow_gemms: Path) -> None:
    args = ["search", *SMALL, "--set", "plan.global_batch_size=32", "--json", "--top", "1", "--workers", "1"]
    plain = _json(args)["plans"][0]
    calibrated = _json([*args, "--calibration", str(slow_gemms)])
    slow = calibrated["plans"][0]
    assert calibrated["priced_with"] == "a calibration fitted for dgx-a100"
    assert _json(args)["priced_with"] == "the built-in curves"
    job = Job.from_dicts({"preset": "gpt3-1.3b", "num_layers": 4}, slow["plan"], {"preset": "dgx-a100", "num_nodes": 1})
    # the graph's re-score is predict's with the calibration, and the fast path agrees with it
    assert slow["step_time_s"] == pytest.approx(predict(job, load_calibration(slow_gemms)).step_time_s, rel=1e-9)
    assert slow["fast_step_time_s"] == pytest.approx(slow["step_time_s"], rel=0.02)
    assert slow["step_time_s"] > 1.5 * plain["step_time_s"]


def test_variability_samples_the_calibrated_step(slow_gemms: Path) -> None:
    args = ["variability", *SMALL, "--json", "--samples", "200"]
    plain = _json(args)["deterministic_s"]
    slow = _json([*args, "--calibration", str(slow_gemms)])["deterministic_s"]
    job = Job.load(model="gpt3-1.3b", system="dgx-a100", overrides=["model.num_layers=4"])
    # the sampled graph is predict's, its compute stretched by the communication beside it (0.64 ms of this
    # step: before, variability's deterministic step left that stretch out, 1.9% below predict's)
    assert plain == pytest.approx(predict(job).step_time_s, rel=1e-12)
    assert slow == pytest.approx(predict(job, load_calibration(slow_gemms)).step_time_s, rel=1e-12)
    assert slow > 1.5 * plain


def test_report_of_a_job_with_its_calibration(slow_gemms: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["report", *SMALL, "--out", str(out), "--calibration", str(slow_gemms)])
    assert res.exit_code == 0, res.output
    job = Job.load(model="gpt3-1.3b", system="dgx-a100", overrides=["model.num_layers=4"])
    step_s = predict(job, load_calibration(slow_gemms)).step_time_s  # 0.054 s; 0.034 s on the built-in curves
    assert f"step time</td><td>{step_s:.3f} s<" in out.read_text()
    both = CliRunner().invoke(app, ["report", "--result", str(out), "--calibration", str(slow_gemms)])
    assert both.exit_code == 2 and "--result, not both" in both.output


def test_a_dlrm_search_prices_its_shardings_with_the_calibration(tmp_path: Path) -> None:
    """dlrm-small (fp32: TF32 GEMMs) with its TF32 GEMMs and elementwise kernels slowed: the search's best at
    4,096 samples per GPU is `shard`'s best at that batch with the same file."""
    slow = {name: {"alpha_s": 6e-6, "e_max": 0.05, "log_half": 19.6, "gamma": 0.5} for name in ("tf32", "elementwise")}
    path = tmp_path / "cal.json"
    fields = {"gemm": {"tf32": slow["tf32"]}, "memory": {"elementwise": slow["elementwise"]}}
    path.write_text(json.dumps({"format": FORMAT, "version": VERSION, "system": "dgx-a100", **fields}))
    job = ["--model", "dlrm-small", "--system", "dgx-a100", "--json"]
    search = ["search", *job, "--top", "1", "--batches", "4096"]
    plain = _json(search)["plans"][0]["step_time_s"]
    found = _json([*search, "--calibration", str(path)])["plans"][0]["step_time_s"]
    sharded = _json(["shard", *job, "--batch-per-rank", "4096", "--calibration", str(path)])
    shard = sharded["plans"][0]["step_time_s"]
    assert found == pytest.approx(shard, rel=1e-12)
    assert (sharded["model"], sharded["system"]) == ("dlrm-small", "dgx-a100")  # what compare checks
    assert found > 3 * plain


#: a host calibration (`itercast calibrate --host-trace`): T1 20 µs, T2 10, the launch call (T4) 8, T3 2, no
#: operator that launches nothing: one launching operator 20 + 10 + 8 + 2 = 40 µs of host time
HOST = {
    "version": 1,
    "t1_us": 20.0,
    "t4_us": {"cudaLaunchKernel": 8.0},
    "per_op": {},
    "pooled": {"t2_us": 10.0, "t3_us": 2.0, "t5_us": 0.0, "no_call_us": 0.0},
}
TINY = [*SMALL, "--set", "model.seq_length=64", "--set", "plan.global_batch_size=8"]


def test_a_host_calibration_prices_a_transformers_launches(tmp_path: Path) -> None:
    """A transformer step's host cost per kernel is the calibration's 40 µs per launching operator (the
    DLRM step's figure for one operator), in predict and in search's fast path and re-score alike: the
    same step as the preset with kernel_launch_overhead_s 40 µs, which this small, host-bound step feels."""
    path = tmp_path / "host.json"
    path.write_text(json.dumps({"format": FORMAT, "version": VERSION, "system": "dgx-a100", "host_overheads": HOST}))
    calibrated = _json(["predict", *TINY, "--json", "--calibration", str(path)])["step_time_s"]
    by_hand = _json(["predict", *TINY, "--json", "--set", "system.gpu.kernel_launch_overhead_s=4e-05"])
    default = _json(["predict", *TINY, "--json"])["step_time_s"]
    assert calibrated == pytest.approx(by_hand["step_time_s"], rel=1e-12)
    assert calibrated > 1.05 * default  # 9% slower: the launches are much of this small step
    said = CliRunner().invoke(app, ["predict", *TINY, "--calibration", str(path)]).output
    assert f"host per kernel: 40.0 µs from {path}'s host overheads" in said and "the preset's 11.3 µs" in said
    search = ["search", *TINY, "--json", "--top", "1", "--workers", "1", "--calibration", str(path)]
    found = _json(search)["plans"][0]
    model = {"preset": "gpt3-1.3b", "num_layers": 4, "seq_length": 64}
    job = Job.from_dicts(model, found["plan"], {"preset": "dgx-a100", "num_nodes": 1})
    assert found["step_time_s"] == pytest.approx(predict(job, load_calibration(path)).step_time_s, rel=1e-9)
    # the fast path with the same 40 µs: within 3% of the graph (2.4% under it on this ZeRO-3 plan, dp 2 × tp 4);
    # at the preset's 5 µs per kernel it prices these plans about a third lower
    assert found["fast_step_time_s"] == pytest.approx(found["step_time_s"], rel=0.03)


def test_compare_prices_both_jobs_with_the_calibration(slow_gemms: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("model: {preset: gpt3-1.3b, num_layers: 4}\nsystem: dgx-a100\nplan: {tensor_parallel: 2}\n")
    b.write_text("model: {preset: gpt3-1.3b, num_layers: 4}\nsystem: dgx-a100\nplan: {tensor_parallel: 4}\n")
    data = _json(["compare", str(a), str(b), "--json", "--calibration", str(slow_gemms)])
    cal = load_calibration(slow_gemms)
    pa, pb = (predict(Job.load(path), cal).step_time_s for path in (a, b))
    assert data["step_time_s"] == {"a": pa, "b": pb, "b_minus_a": pb - pa}
    saved = CliRunner().invoke(
        app, ["compare", str(tmp_path / "x.json"), str(tmp_path / "y.json"), "--calibration", str(slow_gemms)]
    )
    assert saved.exit_code == 2 and "saved results carry the plans and prices" in saved.output


@pytest.mark.parametrize("command", ["predict", "slice"])
def test_a_calibration_of_another_system_is_said_by_every_command(slow_gemms: Path, command: str) -> None:
    # fitted for dgx-a100, the job on dgx-h100: the curves describe the other machine, and each command says so
    args = [command, "--model", "gpt3-1.3b", "--system", "dgx-h100", "--set", "model.num_layers=4"]
    if command == "slice":
        args += ["--set", "plan.pipeline_parallel=2", "--set", "system.node.gpus_per_node=2"]
    res = CliRunner().invoke(app, [*args, "--calibration", str(slow_gemms)])
    assert res.exit_code == 0, res.output
    assert "was fitted for system 'dgx-a100'; this job runs on 'dgx-h100'" in res.output


@pytest.mark.parametrize("command", ["predict", "search", "slice", "variability", "report", "compare"])
def test_a_calibration_without_the_jobs_gemm_dtype_is_said_by_every_command(
    slow_gemms: Path, tmp_path: Path, command: str
) -> None:
    # the calibration fitted bf16 GEMMs only; an fp32 job's GEMMs keep the built-in tf32 curve, and each command
    # that prices the job says so (before: in silence, the calibration's GEMM section simply unused)
    args = {
        "search": ["search", *SMALL, "--set", "plan.global_batch_size=32", "--top", "1", "--workers", "1"],
        "slice": ["slice", *SMALL, "--set", "plan.pipeline_parallel=2", "--set", "system.node.gpus_per_node=2"],
        "variability": ["variability", *SMALL, "--samples", "100"],
        "report": ["report", *SMALL, "--samples", "100", "-o", str(tmp_path / "r.html")],
    }.get(command, [command, *SMALL])
    if command == "compare":
        job = tmp_path / "a.yaml"
        job.write_text("model: {preset: gpt3-1.3b, num_layers: 4}\nsystem: dgx-a100\nplan: {dtype: fp32}\n")
        args = ["compare", str(job), str(job)]
    else:
        args += ["--set", "plan.dtype=fp32"]
    res = CliRunner().invoke(app, [*args, "--calibration", str(slow_gemms)])
    assert res.exit_code == 0, res.output
    said = "the calibration fitted GEMM curves for bf16 only: this job's tf32 GEMMs are priced on the built-in tf32"
    shown = html.unescape((tmp_path / "r.html").read_text()) if command == "report" else " ".join(res.output.split())
    assert said in shown


def test_a_step_priced_at_infinity_is_an_error_not_a_forecast():
    """A curve whose efficiency underflows to 0 (log_half 1000, past what a calibration file may hold: the
    hostile corpus) prices every GEMM at inf: predict said `step time inf s`, and search ranked such plans."""
    from itercast.config.job import Job
    from itercast.errors import ConfigError
    from itercast.predict import predict
    from itercast.profile.calibrate import merge_calibration

    job = Job.from_dicts({"preset": "gpt3-1.3b"}, {"global_batch_size": 8}, {"preset": "dgx-a100"})
    curve = {"alpha_s": 0, "e_max": 1, "log_half": 1000, "gamma": 1}
    cal = merge_calibration({"system": "dgx-a100", "gemm": {"bf16": curve}})
    with np.errstate(all="ignore"), pytest.raises(ConfigError, match="the step prices at inf s: a task of it is"):
        predict(job, cal)
