"""`itercast report`: the HTML holds every section, needs nothing from the network, its numbers are
the prediction's; saved search and replay results; bad input; and a real headless browser renders it
(skipped where Chromium, its driver or selenium is missing: `.ci/run` installs them)."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import tiny_job
from typer.testing import CliRunner

from itercast.cli import app
from itercast.predict import predict
from itercast.sim.analysis import breakdown

JOB = ["--model", "moe-tiny", "--system", "dgx-h100", "--set", "plan.pipeline_parallel=2"]
JOB += ["--set", "plan.global_batch_size=32", "--samples", "200"]


def run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.output


@pytest.fixture(scope="module")
def job_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "job.html"
    code, text = run("report", *JOB, "--within-s", "0.05", "-o", str(out))
    assert code == 0, text
    return out


def test_per_stage_breakdown_sums_to_the_step_on_every_stage():
    r = predict(tiny_job(pipeline_parallel=4, global_batch_size=16))
    bars = [breakdown(r.sim, rank) for rank in range(4)]
    for b in bars:
        assert b.total_s == pytest.approx(r.step_time_s, rel=1e-9)
    assert bars[r.breakdown.rank] == r.breakdown  # the default is the rank that finishes last
    assert max(b.idle_s for b in bars) > 0  # the others wait at the end of the step


def test_job_report_is_self_contained_and_holds_every_section(job_report: Path):
    page = job_report.read_text()
    for title in (
        "Summary",
        "Where the step goes, per pipeline stage",
        "Timeline of the simulated step",
        "Memory per GPU",
        "Step-time distribution",
        "Critical path by family",
    ):
        assert title in page
    assert page.count("<svg") == 5
    assert "<script" not in page and not re.search(r'(src|href)="https?:', page)  # nothing fetched
    assert "experts ep 1" in page  # an MoE model's expert plan in the subtitle
    assert "deadline 50.000 ms" in page  # the 0.05 s deadline in the unit of the step (ms)


def test_job_report_numbers_are_the_prediction(job_report: Path):
    from itercast.config.job import Job

    job = Job.from_dicts(
        {"preset": "moe-tiny"}, {"pipeline_parallel": 2, "global_batch_size": 32}, {"preset": "dgx-h100"}
    )
    r = predict(job)
    page = job_report.read_text()
    assert f"<td>{r.step_time_s:.3f} s</td>" in page
    assert f"<td>{r.memory.total_bytes / 2**30:.1f} GiB of 80 GiB (stage {r.memory.stage})</td>" in page


def test_search_and_replay_results_become_reports(tmp_path: Path):
    code, text = run(
        "search", "--model", "gpt3-1.3b", "--system", "dgx-h100", "--set", "plan.global_batch_size=64",
        "--top", "3", "--workers", "1", "--json",
    )  # fmt: skip
    assert code == 0
    (tmp_path / "search.json").write_text(text)
    code, text = run("report", "--result", str(tmp_path / "search.json"), "-o", str(tmp_path / "s.html"))
    assert code == 0, text
    page = (tmp_path / "s.html").read_text()
    plans = json.loads((tmp_path / "search.json").read_text())["plans"]
    assert page.count("<tr>") == 1 + len(plans) and f"{plans[0]['step_time_s']:.3f}" in page
    assert "search.json: gpt3-1.3b on dgx-h100: " in page  # the saved search names its job
    replayed = {
        "steps": [{"rank": 0, "step": 1, "measured_s": 0.2, "replayed_s": 0.21, "error": 0.05, "bound": "host"}],
        "critical_path": [{"rank": 0, "family": "gemm", "start_s": 0.0, "end_s": 0.1, "tasks": 3}],
        "events": 10,
        "files": ["rank0.json"],
    }
    (tmp_path / "replay.json").write_text(json.dumps(replayed))
    code, text = run("report", "--result", str(tmp_path / "replay.json"), "-o", str(tmp_path / "r.html"))
    assert code == 0, text
    page = (tmp_path / "r.html").read_text()
    assert "<td>+5.00%</td>" in page and "Critical path by kernel class" in page
    assert "what-if" not in page  # no what-if was run


def _saved_search(model: str, system: str, plan: dict, **row: object) -> dict:
    """A saved `search --json` of one plan, written by hand: a 4 × 2 × 1 × 1 plan of 8 GPUs."""
    sizes = {"data_parallel": 4, "tensor_parallel": 2, "pipeline_parallel": 1, "context_parallel": 1}
    base = sizes | {"virtual_pipeline": 1, "global_batch_size": 64, "micro_batch_size": 2, "schedule": "1f1b"}
    base |= {"recompute": "none", "sequence_parallel": True, "overlap_grad_reduce": True, "overlap_param_gather": False}
    plan = base | plan
    figures = {"step_time_s": 0.5, "fast_step_time_s": 0.49, "memory_per_gpu_bytes": 3 * 2**30}
    figures |= {"tokens_per_s": 262144.0, "gpu_hours_per_token": 8.5e-9, "mfu": 0.4, "fits": True}
    parts = {"compute_s": 0.4, "exposed_comm_s": 0.05, "bubble_s": 0.0, "host_overhead_s": 0.05, "idle_s": 0.0}
    one = {"plan": plan, "num_gpus": 8, "breakdown": parts} | figures | row
    return {"model": model, "system": system, "model_is_moe": "expert_parallel" in plan, "plans": [one]}


def test_a_saved_search_reports_the_columns_the_terminal_shows(tmp_path: Path):
    """The report of a saved search once showed 9 of the terminal's columns: plans that differ in their
    ZeRO shards or overlaps only looked alike. Its row is the terminal's (search_cmds.plan_rows), by hand."""
    doc = _saved_search("gpt3-1.3b", "dgx-h100", {"zero_stage": 1, "zero_shard_ranks": 2})
    (tmp_path / "s.json").write_text(json.dumps(doc))
    code, text = run("report", "--result", str(tmp_path / "s.json"), "-o", str(tmp_path / "s.html"))
    assert code == 0, text
    page = (tmp_path / "s.html").read_text()
    assert "s.json: gpt3-1.3b on dgx-h100: " in page
    row = "<td>1</td><td>8</td><td>4×2×1×1</td><td>1</td><td>64</td><td>2</td><td>1f1b</td><td>1 in 2</td><td>none</td>"
    row += "<td>y</td><td>g-</td><td>0.500</td><td>262,144</td><td>0.0085</td><td>40.0%</td><td>3.0</td>"
    assert row in page and "<th>ep×etp</th>" not in page
    experts = {"expert_parallel": 4, "expert_tensor_parallel": 1}
    moe = _saved_search("moe-tiny", "dgx-h100", {"zero_stage": 0, "overlap_param_gather": True} | experts)
    (tmp_path / "m.json").write_text(json.dumps(moe))
    code, text = run("report", "--result", str(tmp_path / "m.json"), "-o", str(tmp_path / "m.html"))
    page = (tmp_path / "m.html").read_text()
    assert code == 0 and "<th>ep×etp</th>" in page and "<td>4×2×1×1</td><td>4×1</td>" in page
    assert "<td>0</td><td>none</td><td>y</td><td>gp</td>" in page


def test_compare_of_saved_searches_says_when_their_models_differ(tmp_path: Path):
    """Saved searches named no model, so compare set a 1.3B model's plan against a 2.7B's without a word."""
    jobs = (("a", "gpt3-1.3b", "dgx-h100"), ("b", "gpt3-2.7b", "dgx-h100"), ("c", "gpt3-1.3b", "x"))
    for name, model, system in jobs:
        (tmp_path / f"{name}.json").write_text(json.dumps(_saved_search(model, system, {"zero_stage": 1})))
    code, text = run("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    said = " ".join(text.split())
    assert code == 0 and "A and B are different models gpt3-1.3b and gpt3-2.7b: B − A is two jobs'" in said
    code, text = run("compare", str(tmp_path / "a.json"), str(tmp_path / "c.json"))
    assert code == 0 and "different systems dgx-h100 and x" in " ".join(text.split()) and "models" not in text
    code, text = run("compare", str(tmp_path / "a.json"), str(tmp_path / "a.json"))
    assert code == 0 and "different" not in text


def test_a_replays_what_if_is_in_its_report(tmp_path: Path):
    """kineto_fixtures.gpu_bound_step with GEMMs twice as fast: the GEMM runs 20–45, the sync returns 5 µs
    after it (50) and the host's 25 µs after the sync end the step at 75 µs (measured 100). Before, the
    report of the replay's JSON showed measured and replayed steps only, the what-if dropped."""
    from kineto_fixtures import gpu_bound_step, write

    trace = write(tmp_path / "t.json", gpu_bound_step())
    code, text = run("replay", str(trace), "--scale", "gemm=0.5", "--json")
    assert code == 0, text
    (tmp_path / "replay.json").write_text(text)
    code, text = run("report", "--result", str(tmp_path / "replay.json"), "-o", str(tmp_path / "r.html"))
    assert code == 0, text
    page = (tmp_path / "r.html").read_text()
    assert "<th>what-if ms</th>" in page and "<td>0.100</td><td>0.100</td><td>+0.00%</td>" in page
    assert "<td>host</td><td>0.075</td></tr>" in page
    assert "What-if (not measured)" in page and "<td>scaled gemm</td><td>1</td>" in page


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json", "not JSON"),
        ('{"other": 1}', "expected the JSON of `itercast search --json`"),
        ('{"plans": [{"plan": {}}]}', "plans[0]: missing field num_gpus"),
        (json.dumps(_saved_search("m", "s", {"zero_stage": 1}, mfu=None)), "≥ 0 in plans[0].mfu (None)"),
        (json.dumps(_saved_search("m", "s", {"zero_stage": 1}, step_time_s=-1)), "≥ 0 in plans[0].step_time_s (-1)"),
        (
            json.dumps(_saved_search("m", "s", {"zero_stage": 1}, memory_per_gpu_bytes=math.inf)),
            "expected finite numbers ≥ 0 in plans[0].memory_per_gpu_bytes (inf)",
        ),
        (json.dumps(_saved_search("m", "s", {})), "plans[0].plan: missing field zero_stage"),
        ('{"steps": [{"rank": 0}]}', "steps[0]: missing field step, measured_s, replayed_s"),
    ],
)
def test_bad_result_files_are_one_clear_error(tmp_path: Path, content: str, needle: str):
    (tmp_path / "bad.json").write_text(content)
    code, text = run("report", "--result", str(tmp_path / "bad.json"), "-o", str(tmp_path / "x.html"))
    assert code == 2 and needle in text and "Traceback" not in text
    assert not (tmp_path / "x.html").exists()  # nothing half-written


def test_report_never_overwrites_its_input(tmp_path: Path):
    (tmp_path / "r.json").write_text('{"steps": []}')
    code, text = run("report", "--result", str(tmp_path / "r.json"), "-o", str(tmp_path / "r.json"))
    assert code == 2 and "is an input of this command" in text
    assert (tmp_path / "r.json").read_text() == '{"steps": []}'


def _browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver_path = shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.skip("no Chromium and chromedriver here (Debian: apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,2400"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver_path), options=options)


def test_a_real_browser_renders_the_report(job_report: Path, tmp_path: Path):
    browser = _browser()
    try:
        browser.get(job_report.as_uri())
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        sizes = browser.execute_script(
            "return Array.from(document.querySelectorAll('svg')).map(s => s.getBoundingClientRect().width)"
        )
        shot = tmp_path / "shot.png"
        browser.save_screenshot(str(shot))
    finally:
        browser.quit()
    assert errors == []
    assert len(sizes) == 5 and min(sizes) > 200  # every chart laid out at a visible size
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[0] > 500 and float(np.std(pixels[..., :3])) > 0.05  # not a blank page


def test_ctrl_c_says_what_was_kept_and_exits_130(capsys: pytest.CaptureFixture[str]):
    import signal

    from itercast.cli import _interrupted

    with pytest.raises(SystemExit) as exc:
        _interrupted(signal.SIGINT, None)
    assert exc.value.code == 130
    assert "run the same command again to resume" in capsys.readouterr().err


def _replay_doc(measured: float, replayed: float, comm: float) -> str:
    parts = {"compute_s": replayed - comm, "exposed_comm_s": comm, "bubble_s": 0.0, "host_overhead_s": 0.0}
    return json.dumps(
        {
            "steps": [{"rank": 0, "step": 1, "measured_s": measured, "replayed_s": replayed}],
            "replayed_span_s": replayed,
            "breakdown": {**parts, "idle_s": 0.0, "rank": 0},
        }
    )


def test_compare_two_saved_replays_per_breakdown_part(tmp_path: Path):
    (tmp_path / "a.json").write_text(_replay_doc(0.30, 0.25, 0.05))
    (tmp_path / "b.json").write_text(_replay_doc(0.30, 0.20, 0.01))
    code, text = run("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json")
    assert code == 0, text
    doc = json.loads(text)
    assert doc["mean_step_replayed_s"]["b_minus_a"] == pytest.approx(-0.05)
    assert doc["breakdown.exposed_comm_s"]["b_minus_a"] == pytest.approx(-0.04)
    assert doc["breakdown.compute_s"]["b_minus_a"] == pytest.approx(-0.01)
    (tmp_path / "s.json").write_text('{"plans": []}')
    code, text = run("compare", str(tmp_path / "a.json"), str(tmp_path / "s.json"))
    assert code == 2 and "`plans`: expected a non-empty list of plans; got []" in text
    # a what-if's span moves where the replay's own does not: compared too (absent from either: not shown)
    for name, whatif in (("w1.json", 0.325), ("w2.json", 0.227)):
        (tmp_path / name).write_text(json.dumps(json.loads(_replay_doc(0.30, 0.25, 0.05)) | {"whatif_span_s": whatif}))
    code, text = run("compare", str(tmp_path / "w1.json"), str(tmp_path / "w2.json"), "--json")
    assert code == 0, text
    assert json.loads(text)["whatif_span_s"] == {"a": 0.325, "b": 0.227, "b_minus_a": pytest.approx(-0.098)}
    assert "whatif_span_s" not in json.loads(
        run("compare", *(str(tmp_path / n) for n in ("a.json", "w2.json")), "--json")[1]
    )
    # and its breakdown's parts (a what-if that scaled the compute: 0.20 → 0.80 s), the replays' own unchanged
    for name, compute in (("p1.json", 0.20), ("p2.json", 0.80)):
        parts = {"compute_s": compute, "exposed_comm_s": 0.05, "bubble_s": 0.0, "host_overhead_s": 0.0, "idle_s": 0.0}
        doc = json.loads(_replay_doc(0.30, 0.25, 0.05)) | {"whatif_span_s": compute + 0.05, "whatif_breakdown": parts}
        (tmp_path / name).write_text(json.dumps(doc))
    code, text = run("compare", str(tmp_path / "p1.json"), str(tmp_path / "p2.json"), "--json")
    assert code == 0, text
    assert json.loads(text)["whatif_breakdown.compute_s"]["b_minus_a"] == pytest.approx(0.60)
    assert json.loads(text)["breakdown.compute_s"]["b_minus_a"] == 0.0


def test_a_dlrm_report_gives_its_millisecond_step_in_milliseconds(tmp_path: Path):
    # dlrm-small steps take ~1.6 ms: its parts and quantiles in ms, not "0.002 s"
    out = tmp_path / "dlrm.html"
    code, text = run("report", "--model", "dlrm-small", "--system", "dgx-a100", "--samples", "200", "-o", str(out))
    assert code == 0, text
    predicted = CliRunner().invoke(app, ["predict", "--model", "dlrm-small", "--system", "dgx-a100", "--json"])
    compute_s = json.loads(predicted.stdout)["breakdown"]["compute_s"]  # warnings go to stderr
    page = out.read_text()
    assert 0 < compute_s < 1 and f"<td>{compute_s * 1e3:.3f} ms</td>" in page
    assert re.search(r"p50 \d+\.\d{3} ms, p95 \d+\.\d{3} ms, p99 \d+\.\d{3} ms", page)


@pytest.mark.parametrize(
    ("step_s", "unit", "label"),
    [(2.5, "s", "deterministic 2.500 s"), (1.436e-3, "ms", "deterministic 1.436 ms"), (50e-6, "µs", "50.000 µs")],
)
def test_the_step_cdf_is_drawn_in_the_unit_of_its_step(step_s, unit, label):
    """A 1.436 ms DLRM step was labelled 0.001 s: the axis and the marks take the step's unit."""
    import numpy as np

    from itercast.report.plots import step_cdf_figure

    per_second = {"s": 1, "ms": 1e3, "µs": 1e6}[unit]
    fig = step_cdf_figure(np.full(100, step_s), step_s, within_s=2 * step_s)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert ax.get_xlabel() == f"step time ({unit})"
    assert texts[1] == label or texts[1].endswith(label)
    assert texts[-1] == f"deadline {2 * step_s * per_second:.3f} {unit}: P = 100.0%"
    assert ax.lines[0].get_xdata()[0] == pytest.approx(step_s * per_second)


def _sharding_doc(step_s: float, samples_per_s: float) -> dict:
    """A DLRM's `search --json`, by hand: two shardings of two tables on 2 GPUs, the fastest first."""
    tables = [
        {"name": "t0", "strategy": "table_wise", "ranks": [0]},
        {"name": "t1", "strategy": "row_wise", "ranks": [0, 1]},
    ]
    plan = {"batch_per_rank": 4096, "samples_per_s": samples_per_s, "step_time_s": step_s, "fits": True}
    second = plan | {"step_time_s": 2 * step_s, "fits": False, "memory_per_gpu_bytes": 90 * 2**30, "tables": tables[:1]}
    return {
        "model": "dlrm-small",
        "world_size": 2,
        "evaluated": 7,
        "plans": [plan | {"memory_per_gpu_bytes": 2**30, "tables": tables}, second],
    }


def test_a_dlrm_sharding_search_becomes_a_report_and_compares(tmp_path: Path):
    """Reports and compare once refused a DLRM's saved search ("a DLRM sharding search"): every command
    for every workload. Its shardings, fastest first: ms a step, samples/s, GiB, each table's placement."""
    (tmp_path / "a.json").write_text(json.dumps(_sharding_doc(0.0015, 5.4e6)))
    (tmp_path / "b.json").write_text(json.dumps(_sharding_doc(0.0012, 6.75e6)))  # 8,100 samples a step, as a's
    code, text = run("report", "--result", str(tmp_path / "a.json"), "-o", str(tmp_path / "d.html"))
    assert code == 0, text
    page = (tmp_path / "d.html").read_text()
    assert "dlrm-small on 2 GPUs, 7 shardings priced" in page
    row = (
        "<td>1</td><td>4096</td><td>1.500</td><td>5,400,000</td><td>1.00</td><td>t0 table_wise 0; t1 row_wise 0,1</td>"
    )
    assert row in page and "<td>3.000</td><td>5,400,000</td><td>90.00 OOM</td><td>t0 table_wise 0</td>" in page
    code, text = run("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json")
    assert code == 0, text
    doc = json.loads(text)
    assert set(doc) == {"step_time_s", "samples_per_s", "memory_per_gpu_bytes"}
    assert doc["step_time_s"]["b_minus_a"] == pytest.approx(-0.0003)
    assert doc["samples_per_s"]["b_minus_a"] == pytest.approx(1.35e6)
    # a sharding of twice the samples a step (13.5e6 samples/s × 1.2 ms = 16,200): said, its step is other work
    (tmp_path / "c.json").write_text(json.dumps(_sharding_doc(0.0012, 13.5e6)))
    code, text = run("compare", str(tmp_path / "a.json"), str(tmp_path / "c.json"))
    assert code == 0 and "A trains 8,100 samples a step and B 16,200: their steps are not the same work" in text
    code, text = run("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert code == 0 and "not the same work" not in text
