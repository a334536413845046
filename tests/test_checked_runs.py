"""itercast/checked_runs.py: the checking table's configurations kept with their measured and predicted steps, and
the note that says how a job's model fared on its GPU family. The kept file must be what the checking table and
the current models give: a model change that moves a configuration fails here until the file is written again
(`python validation/checking_step_times.py --write-checked itercast/checked_runs.json`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
import checking_step_times as chk

from itercast.checked_runs import checked_note, checked_runs, model_signature, runs_like
from itercast.cli import app
from itercast.config.job import Job


def test_the_kept_file_is_what_the_checking_table_and_the_models_give_now():
    rows = chk.load_rows()
    chk.run(rows, workers=2)  # both cores: the rows' predictions are independent
    now = {r.label: r for r in chk.checked(rows)}
    kept = {r.label: r for r in checked_runs()}
    again = "write it again: python validation/checking_step_times.py --write-checked itercast/checked_runs.json"
    assert set(kept) == set(now), again
    for label, run in kept.items():
        assert run.predicted_s == pytest.approx(now[label].predicted_s, rel=1e-9), f"{label}: {again}"
        assert run.measured_s == pytest.approx(now[label].measured_s, rel=1e-12), f"{label}: {again}"
        assert run.model == now[label].model and run.gpu_family == now[label].gpu_family, f"{label}: {again}"


def _write(path: Path, job: Job, runs: list[tuple[str, str, float, float]], seqs: tuple[int, ...] = ()) -> Path:
    """A kept file of `runs` (label, GPU family, measured s, predicted s), all of the job's model, at sequence
    lengths `seqs` (one a run; 4,096 each without them)."""
    doc = {
        "models": [model_signature(job.model)],
        "runs": [
            {
                "label": label,
                "source": "hand",
                "gpu_family": family,
                "gpus": 8,
                "seq_length": seq,
                "measured_s": measured,
                "predicted_s": predicted,
                "model": 0,
            }
            for (label, family, measured, predicted), seq in zip(runs, seqs or [4096] * len(runs), strict=True)
        ],
    }
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_the_note_by_hand(tmp_path):
    job = Job.from_dicts({"preset": "llama3-8b"}, {}, {"preset": "dgx-h100"})
    path = _write(
        tmp_path / "kept.json",
        job,
        [("a", "H100", 12.0, 10.0), ("b", "H100", 5.0, 10.0), ("c", "H100", 26.0, 20.0), ("d", "A100", 50.0, 10.0)],
    )
    # H100's three: 12/10 = 1.20, 5/10 = 0.50 (the farthest from 1, though not the largest), 26/20 = 1.30; A100's
    # 5.00 is another family
    note = checked_note(job, path) or ""
    assert (
        "on H100 GPUs in 3 configurations" in note
        and "(plans and sizes of their own; the checking table, hand)" in note
    )
    assert note.endswith("measured / predicted 0.50x to 1.30x, median 1.20x; farthest: b, 0.50x")
    one = _write(tmp_path / "one.json", job, [("a", "H100", 12.0, 10.0)])
    assert (checked_note(job, one) or "").endswith(
        "in 1 configuration (plans and sizes of their own; the checking table, hand): measured / predicted 1.20x"
    )


def test_runs_of_several_sequence_lengths_are_also_said_at_the_jobs_own_or_the_nearest(tmp_path):
    job = Job.from_dicts({"preset": "llama3-8b", "seq_length": 8192}, {}, {"preset": "dgx-h100"})
    runs = [("a", "H100", 11.0, 10.0), ("b", "H100", 12.0, 10.0), ("c", "H100", 15.0, 10.0)]
    path = _write(tmp_path / "kept.json", job, runs, (8192, 8192, 1048576))
    # all three: 1.10x, 1.20x, 1.50x (median 1.20x, farthest c); at 8,192 tokens a and b alone: 1.10x to 1.20x,
    # median (1.10 + 1.20) / 2 = 1.15x, farthest b
    assert (checked_note(job, path) or "").endswith(
        "measured / predicted 1.10x to 1.50x, median 1.20x; farthest: c, 1.50x; at this job's 8,192 tokens a "
        "sequence: measured / predicted 1.10x to 1.20x, median 1.15x; farthest: b, 1.20x"
    )
    longer = Job.from_dicts({"preset": "llama3-8b", "seq_length": 524288}, {}, {"preset": "dgx-h100"})
    # 524,288 is 516,096 from 8,192 and 524,288 from 1,048,576: the nearest is 8,192
    assert (checked_note(longer, path) or "").endswith(
        "; none at 524,288 tokens; at 8,192: measured / predicted 1.10x to 1.20x, median 1.15x; farthest: b, 1.20x"
    )
    same = _write(tmp_path / "same.json", job, runs, (4096, 4096, 4096))
    assert "tokens" not in (checked_note(job, same) or "")  # one length: nothing more to say


def test_a_run_counts_for_the_same_model_at_any_sequence_length_on_the_same_gpu_family_only(tmp_path):
    job = Job.from_dicts({"preset": "llama3-8b"}, {}, {"preset": "dgx-h100"})
    path = _write(tmp_path / "kept.json", job, [("a", "H100", 12.0, 10.0)])
    longer = Job.from_dicts({"preset": "llama3-8b", "seq_length": 32768}, {}, {"preset": "dgx-h100"})
    assert [r.label for r in runs_like(longer, path)] == ["a"]
    wider = Job.from_dicts({"preset": "llama3-8b", "hidden_size": 4224}, {}, {"preset": "dgx-h100"})
    assert runs_like(wider, path) == [] and checked_note(wider, path) is None
    a100 = Job.from_dicts({"preset": "llama3-8b"}, {}, {"preset": "dgx-a100"})
    assert runs_like(a100, path) == []
    assert checked_runs(tmp_path / "absent.json") == ()


def test_predict_says_how_the_models_published_runs_compared():
    args = ["predict", "--model", "gpt-oss-120b", "--system", "dgx-h100", "--set", "system.num_nodes=8"]
    args += [
        "--set",
        "plan.expert_parallel=8",
        "--set",
        "plan.pipeline_parallel=4",
        "--set",
        "plan.global_batch_size=64",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0 and "checked: published runs of this model on H100 GPUs in 2 configurations" in res.output
    plain = CliRunner().invoke(app, ["predict", "--example"])  # GPT-3 175B's checking runs are custom models
    assert plain.exit_code == 0 and "checked:" not in plain.output


def test_predict_json_lists_those_runs_with_their_ratio():
    args = ["predict", "--model", "gpt-oss-120b", "--system", "dgx-h100", "--set", "system.num_nodes=8", "--json"]
    args += ["--set", "plan.expert_parallel=8", "--set", "plan.pipeline_parallel=4"]
    args += ["--set", "plan.global_batch_size=64"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    kept = {r.label: r for r in checked_runs()}
    assert len(doc["checked_runs"]) == 2 and "model" not in doc["checked_runs"][0]
    for run in doc["checked_runs"]:
        assert run["measured_s"] == kept[run["label"]].measured_s and run["gpu_family"] == "H100"
        assert run["ratio"] == pytest.approx(run["measured_s"] / run["predicted_s"])


def test_a_job_report_tables_those_runs_and_a_model_without_any_gets_none(tmp_path):
    out = tmp_path / "oss.html"
    args = ["report", "--model", "gpt-oss-120b", "--system", "dgx-h100", "--set", "system.num_nodes=8"]
    args += ["--set", "plan.expert_parallel=8", "--set", "plan.pipeline_parallel=4", "--samples", "100"]
    res = CliRunner().invoke(app, [*args, "--set", "plan.global_batch_size=64", "-o", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    section = page[page.index("Published runs of this model on H100 GPUs (the checking table)") :]
    for run in checked_runs():
        if run.model["num_experts"] == 128 and run.model["hidden_size"] == 2880:  # GPT-OSS 120B's two
            assert f"<td>{run.label}</td>" in section and f"<td>{run.measured_s / run.predicted_s:.2f}x</td>" in section
    assert section.count("<tr>") == 1 + 2  # the header and the two configurations
    plain = tmp_path / "tiny.html"
    res = CliRunner().invoke(
        app,
        [
            "report",
            "--model",
            "moe-tiny",
            "--system",
            "dgx-h100",
            "--samples",
            "100",
            "--set",
            "plan.global_batch_size=32",
            "-o",
            str(plain),
        ],
    )
    assert res.exit_code == 0 and "Published runs of this model" not in plain.read_text()


def test_search_json_lists_them_too():
    args = ["search", "--model", "gpt-oss-120b", "--system", "dgx-h100", "--set", "system.num_nodes=8"]
    # a small space (its sizes fixed): the runs listed depend on the model and the GPU, not on the plans
    for fixed in ("tensor_parallel=1", "pipeline_parallel=4", "micro_batch_size=1", "expert_parallel=8"):
        args += ["--set", f"plan.{fixed}"]
    res = CliRunner().invoke(app, [*args, "--set", "plan.global_batch_size=64", "--top", "2", "--json"])
    assert res.exit_code == 0
    listed = json.loads(res.stdout)["checked_runs"]
    assert sorted(run["label"] for run in listed) == sorted(
        run.label for run in checked_runs() if run.model["hidden_size"] == 2880 and run.gpu_family == "H100"
    )
