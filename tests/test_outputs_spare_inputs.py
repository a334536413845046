"""What a command writes never replaces what it reads: an output path that is an input file (a job's
calibration, a speed map, the built-in example), a file inside an input directory, or a symbolic link
is one line, exit 2, and the input keeps its bytes; a command with nothing to write says so; a trace
without ProfilerStep marks still shows its replayed span."""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
from importlib import resources
from pathlib import Path

import pytest
from kineto_fixtures import call, cpu_op, write
from typer.testing import CliRunner

from itercast.cli import app, predict_cmds

ROOT = Path(__file__).resolve().parents[1]
app_module = importlib.import_module("itercast.cli.app")  # the module (the package's `app` is the command)
JOB = ["--model", "gpt3-1.3b", "--system", "dgx-h100", "--set", "plan.global_batch_size=8"]
CALIBRATION = {"format": "itercast-calibration", "version": "3"}  # no curves: the built-in ones
GLOO = ROOT / "data" / "measured" / "gloo_parallelism"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refused(args: list[str], kept: Path, message: str) -> None:
    before = digest(kept)
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 2, out.output
    assert out.output.startswith("error:") and message in out.output and len(out.output.strip().splitlines()) == 1
    assert digest(kept) == before


def test_report_refuses_to_write_over_its_calibration(tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(CALIBRATION))
    refused(["report", *JOB, "--calibration", str(cal), "-o", str(cal)], cal, "is an input of this command")


def test_variability_refuses_to_plot_over_its_speed_map(tmp_path):
    speeds = tmp_path / "speeds.csv"
    speeds.write_text("gpu,speed\n" + "".join(f"{i},1.0\n" for i in range(8)))
    args = ["variability", *JOB, "--samples", "200", "--speed-map", str(speeds), "--plot", str(speeds)]
    refused(args, speeds, "is an input of this command")


def test_predict_refuses_to_write_its_trace_over_the_built_in_example(tmp_path, monkeypatch):
    # the example resolved to a copy, so that a regression overwrites the copy, not the package's file
    example = tmp_path / "gpt3-175b-a100.yaml"
    shutil.copy(Path(str(resources.files("itercast").joinpath("examples", example.name))), example)
    real = app_module.resolve_job_file

    def to_copy(job_file, is_example, model, system):
        return example if is_example else real(job_file, is_example, model, system)

    monkeypatch.setattr(app_module, "resolve_job_file", to_copy)
    monkeypatch.setattr(predict_cmds, "resolve_job_file", to_copy)
    refused(["predict", "--example", "--trace", str(example)], example, "is an input of this command")


@pytest.mark.skipif(not GLOO.is_dir(), reason="data/measured/gloo_parallelism absent")
def test_replay_refuses_to_write_over_a_trace_of_its_input_directory(tmp_path):
    for rank in (0, 1):
        shutil.copy(GLOO / f"ws2.rank{rank}.trace.json.gz", tmp_path)
    trace = tmp_path / "ws2.rank0.trace.json.gz"
    refused(["replay", str(tmp_path), "--trace", str(trace)], trace, f"is a file of {tmp_path}")


def test_profile_import_checks_its_database_path(tmp_path):
    log = tmp_path / "empty.log"
    log.write_text("")
    args = ["profile", "import", "nccl-log", str(log), "--db"]
    refused([*args, str(log)], log, "is an input of this command")  # the database onto the imported file
    link = tmp_path / "link.db"
    link.symlink_to(tmp_path / "target.db")
    refused([*args, str(link)], log, "is a symbolic link")
    assert not (tmp_path / "target.db").exists()


def test_calibrate_with_a_database_and_nothing_to_write_or_show_says_so(tmp_path):
    out = CliRunner().invoke(
        app, ["calibrate", str(ROOT / "data" / "measured" / "cpu_profile.db"), "--system", "cpu-host"]
    )
    assert out.exit_code == 2 and "nothing to do; give --out FILE" in out.output


def test_a_trace_without_profiler_steps_shows_its_measured_and_replayed_span(tmp_path):
    # two runtime calls, 0–400 and 500–1,000 µs, no ProfilerStep: the span is 1,000 µs, replayed as measured
    path = write(tmp_path / "t.json", [call("cudaMemsetAsync", 0, 400), call("cudaMemsetAsync", 500, 500)])
    out = CliRunner().invoke(app, ["replay", str(path)])
    assert out.exit_code == 0, out.output
    assert "no ProfilerStep marks: the whole trace, measured 1.000 ms (first to last event), replayed 1.000 ms" in (
        out.output
    )
    # the JSON carries the spans, the what-if's too (GEMMs halved: this trace has none, so 1 ms again)
    doc = json.loads(CliRunner().invoke(app, ["replay", str(path), "--json", "--scale", "gemm=0.5"]).stdout)
    assert doc["measured_span_s"] == pytest.approx(1e-3) and doc["replayed_span_s"] == pytest.approx(1e-3)
    assert doc["whatif_span_s"] == pytest.approx(1e-3)
    # CPU ops alone become no task: nothing to replay, said in one line
    only_ops = write(tmp_path / "o.json", [cpu_op("aten::mm", 0, 400), cpu_op("aten::add", 500, 500)])
    out = CliRunner().invoke(app, ["replay", str(only_ops)])
    assert out.exit_code == 2 and "nothing to replay: no CUDA runtime call, GPU op or collective" in out.output
