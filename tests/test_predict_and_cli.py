"""End-to-end prediction, the JSON and Perfetto outputs, and the CLI's errors."""

from __future__ import annotations

import json

import pytest
from helpers import gpt3_on_1024_a100
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import Job
from itercast.predict import predict
from itercast.traces.perfetto import to_chrome_trace

runner = CliRunner()


@pytest.fixture(scope="module")
def gpt3():
    job = gpt3_on_1024_a100()
    return predict(job)


def test_breakdown_sums_to_step_time(gpt3):
    assert gpt3.breakdown.total_s == pytest.approx(gpt3.step_time_s, rel=1e-12)


def test_mfu_is_model_flops_over_time_and_peak(gpt3):
    flops = gpt3.job.model.flops_per_token() * 1536 * 2048
    assert gpt3.mfu == pytest.approx(flops / gpt3.step_time_s / 1024 / 312e12)


def test_critical_path_is_contiguous_and_ends_at_the_step_end(gpt3):
    path = gpt3.critical_path
    assert path[0]["start_s"] <= 1e-3 and path[-1]["end_s"] == pytest.approx(gpt3.step_time_s)


def test_single_gpu_step_is_the_sum_of_its_parts():
    job = Job.from_dicts(
        {"preset": "gpt3-1.3b"}, {"global_batch_size": 2}, {"preset": "dgx-h100", "node": {"gpus_per_node": 1}}
    )
    r = predict(job)
    g, sim = r.sim.graph, r.sim
    compute = [t for t in range(g.num_tasks) if g.kinds[g.resource_kind[g.resource[t]]] == "compute"]
    first_launch = sim.start_s[compute[0]]
    assert r.step_time_s == pytest.approx(first_launch + g.duration_s[compute].sum())


def test_trace_has_one_slice_per_task_in_microseconds(gpt3):
    trace = to_chrome_trace(gpt3.sim)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == gpt3.sim.graph.num_tasks
    last = max(slices, key=lambda e: e["ts"] + e["dur"])
    assert (last["ts"] + last["dur"]) / 1e6 == pytest.approx(gpt3.step_time_s)


def test_cli_json_has_the_promised_fields(tmp_path):
    out = tmp_path / "t.json"
    res = runner.invoke(
        app,
        [
            "predict",
            "--model",
            "llama3-8b",
            "--system",
            "dgx-h100",
            "--set",
            "plan.tensor_parallel=2",
            "--set",
            "plan.global_batch_size=8",
            "--json",
            "--trace",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert {"step_time_s", "model_tflops_per_gpu", "mfu", "memory_per_gpu_bytes", "oom", "breakdown"} <= set(data)
    assert json.loads(out.read_text())["traceEvents"]


def test_cli_bad_input_is_one_line_exit_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    for args in (
        ["predict", str(bad)],
        ["predict", "--model", "gpt3-175b", "--system", "dgx-a100", "--set", "model.num_layers=-1"],
        ["predict", "--model", "gpt3-175b", "--system", "dgx-a100", "--set", "plan.tensor_parallel=5"],
        ["predict", str(tmp_path / "missing.yaml")],
    ):
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        assert "Traceback" not in res.output and "error:" in res.output


def test_cli_habits_version_fields_presets_show_and_strict():
    from importlib import metadata

    runner = CliRunner()
    assert runner.invoke(app, ["--version"]).stdout.strip() == f"itercast {metadata.version('itercast')}"
    fields = runner.invoke(app, ["fields"], terminal_width=200).stdout
    assert "plan.stage_layers" in fields and "system.gpu.hbm_bandwidth_bytes_per_s" in fields
    assert "plan.batch_per_rank" in fields and "plan.sharding" in fields  # a DLRM job's plan too
    assert "PydanticUndefined" not in fields  # a default made by a factory is shown as its value
    assert "'gpt' | 'llama' | 'bert'" in fields and "model.num_experts                        int | None " in fields
    shown = runner.invoke(app, ["presets", "show", "dgx-h100"]).stdout
    assert "hbm_bandwidth_bytes_per_s: 3350.0e+9  # datasheet (SXM): 3.35 TB/s" in shown
    missing = runner.invoke(app, ["presets", "show", "dgx-h10"])
    assert missing.exit_code == 2 and "did you mean `dgx-h100`" in missing.output
    oom = ["predict", "--model", "gpt3-175b", "--system", "dgx-a100", "--set", "plan.tensor_parallel=8"]
    assert runner.invoke(app, oom).exit_code == 0  # said, not failed
    out = runner.invoke(app, [*oom, "--strict"])
    assert out.exit_code == 3 and "the plan does not fit" in out.output


def test_compare_gives_the_difference_per_breakdown_part(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("model: gpt3-1.3b\nsystem: dgx-h100\nplan: {tensor_parallel: 2}\n")
    b.write_text("model: gpt3-1.3b\nsystem: dgx-h100\nplan: {tensor_parallel: 2, recompute: full}\n")
    out = CliRunner().invoke(app, ["compare", str(a), str(b), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    pa = predict(Job.load(a)).step_time_s
    pb = predict(Job.load(b)).step_time_s
    assert data["step_time_s"] == {"a": pa, "b": pb, "b_minus_a": pb - pa}
    assert data["breakdown.compute_s"]["b_minus_a"] > 0  # full recompute runs the forward again
    assert "different" not in out.output  # one model on one system: two plans of one job
    c = tmp_path / "c.yaml"
    c.write_text("model: gpt3-2.7b\nsystem: dgx-a100\nplan: {tensor_parallel: 2}\n")
    said = " ".join(CliRunner().invoke(app, ["compare", str(a), str(c)]).output.split())
    assert "A and B are different models gpt3-1.3b and gpt3-2.7b and systems dgx-h100 and dgx-a100" in said


def test_a_gpu_renamed_without_its_specs_is_said_to_be_priced_as_the_presets():
    """User probe 11: `gpu: {name: B200}` over dgx-h100 prices H100 numbers under the B200 label; it is said."""
    from itercast.config.job import parse_section
    from itercast.config.system import renamed_gpu_note

    renamed = parse_section("system", {"preset": "dgx-h100", "gpu": {"name": "B200"}})
    assert renamed_gpu_note(renamed) == (
        "system.gpu.name 'B200': a name only; every spec priced (peak FLOP/s, HBM, bandwidths, the fitted curves) is "
        "still dgx-h100's H100-SXM5-80GB: set them (itercast fields system.gpu) for another GPU"
    )
    assert renamed_gpu_note(parse_section("system", {"preset": "dgx-h100"})) is None
    # a GPU whose specs were changed too is the user's own: nothing to say
    own = parse_section("system", {"preset": "dgx-h100", "gpu": {"name": "B200", "hbm_bytes": 192e9}})
    assert renamed_gpu_note(own) is None


def test_the_critical_path_line_sums_its_tasks_by_family():
    """User probe 11: predict's text promised a critical path only --json had. gemm 0-2 s on rank 0, an all-reduce
    2-3 s and gemm 3-4 s on rank 1: gemm 3 s, all_reduce 1 s, through ranks 0 then 1."""
    from types import SimpleNamespace

    from itercast.cli.predict_cmds import critical_path_line

    runs = [
        {"rank": 0, "family": "gemm", "start_s": 0.0, "end_s": 2.0},
        {"rank": 1, "family": "all_reduce", "start_s": 2.0, "end_s": 3.0},
        {"rank": 1, "family": "gemm", "start_s": 3.0, "end_s": 4.0},
    ]
    line = critical_path_line(SimpleNamespace(critical_path=runs), 1.0, "seconds")  # type: ignore[arg-type]
    assert (
        line
        == "critical path (seconds of its tasks by family, longest first): gemm 3, all_reduce 1; through rank 0 → 1"
    )
