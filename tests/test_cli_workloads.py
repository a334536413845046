"""Every job-taking command takes a DLRM job file (`model: dlrm-small`) and reports what the Python API
(`load_workload(...).predict()`) gives; slicing says in one line that it is for pipelined transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from itercast.cli import app
from itercast.cli.shard_cmds import load_dlrm
from itercast.errors import ConfigError
from itercast.workload import load_workload, parse_sharding_line, sharding_summary
from itercast.workloads.dlrm import Shard

SHARDING = "{t0: {strategy: table_wise, ranks: [0]}, t1: {strategy: table_wise, ranks: [1]}, " + (
    "t2: {strategy: table_wise, ranks: [1]}, t3: {strategy: data_parallel, ranks: [0, 1]}}"
)


def dlrm_job(tmp_path: Path, name: str = "dlrm.yaml", batch: int = 256) -> Path:
    """dlrm-small on 2 H100s of one node under a given sharding."""
    path = tmp_path / name
    system = "{preset: dgx-h100, num_nodes: 1, node: {gpus_per_node: 2}}"
    path.write_text(f"model: dlrm-small\nsystem: {system}\nplan: {{batch_per_rank: {batch}, sharding: {SHARDING}}}\n")
    return path


def invoke(*args: str) -> tuple[int, str]:
    """The exit code and what was printed; with --json the JSON on stdout alone (stderr may carry warnings)."""
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.stdout if "--json" in args and res.exit_code == 0 else res.output


def test_predict_of_a_dlrm_job_file_is_the_python_api(tmp_path: Path) -> None:
    job = dlrm_job(tmp_path)
    code, text = invoke("predict", str(job), "--json")
    assert code == 0, text
    out, api = json.loads(text), load_workload(job).predict()
    assert out["step_time_s"] == api.step_time_s and out["memory_per_gpu_bytes"] == api.memory.total_bytes
    assert out["samples_per_s"] == pytest.approx(256 * 2 / api.step_time_s)  # 256 samples on each of 2 GPUs
    code, text = invoke("predict", str(job))
    assert code == 0 and f"{api.step_time_s * 1e3:.3f} ms" in text and "t3 DP" in text


def test_predict_prints_a_dlrms_small_memory_parts_in_mib() -> None:
    """User probe 8: a DLRM's gradients (0.15 MB), optimizer and activations read 0.00 GiB; in MiB they show as
    the JSON has them, each part / 2**20 to two decimals (a transformer's table stays in GiB)."""
    code, text = invoke("predict", "--model", "dlrm-small", "--system", "dgx-a100", "--json")
    assert code == 0, text
    memory = json.loads(text)["memory"]
    code, table = invoke("predict", "--model", "dlrm-small", "--system", "dgx-a100")
    assert code == 0 and "memory per GPU (MiB)" in table
    cells = [cell.strip() for line in table.splitlines() if line.startswith("│") for cell in line.split("│")]
    for part in ("weights", "gradients", "optimizer", "activations"):
        assert f"{memory[part + '_bytes'] / 2**20:,.2f}" in cells  # gradients: 0.02
    code, gpt = invoke("predict", "--example")
    assert code == 0 and "memory per GPU (GiB)" in gpt


def test_predict_says_when_its_bubble_holds_waits_for_a_slower_stage(tmp_path: Path) -> None:
    """User probe 8: a pp 2 GPT whose last stage also runs a 32,768-word head showed a 111.7 ms bubble on stage 0
    where (p − 1)/m of its compute is 16 ms; the stages' compute is now printed beside the breakdown when they
    differ by more than 5% (and in the JSON always), the head's stage the slower; a 256-word head keeps them within
    5%, and nothing is said."""
    job = tmp_path / "pp2.yaml"
    model = "{family: gpt, num_layers: 8, hidden_size: 2048, num_attention_heads: 16, seq_length: 2048, vocab_size: V}"
    plan = "{pipeline_parallel: 2, global_batch_size: 64, micro_batch_size: 1, zero_stage: 1}"
    for vocab, said in ((32768, True), (256, False)):
        job.write_text(f"model: {model.replace('V', str(vocab))}\nsystem: {{preset: dgx-a100}}\nplan: {plan}\n")
        code, text = invoke("predict", str(job), "--json")
        assert code == 0, text
        first, last = json.loads(text)["stage_compute_s"]
        assert (last > 1.05 * first) is said and last > first
        code, text = invoke("predict", str(job))
        line = " ".join(text.split())
        ratio = f"{last / first:.2f}× apart: the bubble above holds the waits for the slowest stage"
        assert (f"stage compute (ms): 0: {first * 1e3:.4g}, 1: {last * 1e3:.4g}, {ratio}" in line) is said


def test_predict_takes_a_dlrm_preset_with_set_overrides() -> None:
    args = ["--model", "dlrm-small", "--system", "dgx-h100", "--set", "system.node.gpus_per_node=2"]
    code, text = invoke("predict", *args, "--set", "plan.batch_per_rank=128", "--json")
    assert code == 0, text
    api = load_workload(None, ["system.node.gpus_per_node=2", "plan.batch_per_rank=128"], "dlrm-small", "dgx-h100")
    assert json.loads(text)["step_time_s"] == api.predict().step_time_s


def test_compare_sets_two_dlrm_jobs_side_by_side(tmp_path: Path) -> None:
    a, b = dlrm_job(tmp_path, "a.yaml", 256), dlrm_job(tmp_path, "b.yaml", 512)
    code, text = invoke("compare", str(a), str(b), "--json")
    assert code == 0, text
    out = json.loads(text)
    sa, sb = load_workload(a).predict().step_time_s, load_workload(b).predict().step_time_s
    assert out["step_time_s"] == {"a": sa, "b": sb, "b_minus_a": sb - sa}
    assert out["samples_per_s"]["a"] == pytest.approx(512 / sa) and "mfu" not in out
    transformer = tmp_path / "t.yaml"
    transformer.write_text("model: gpt3-1.3b\nsystem: dgx-h100\nplan: {tensor_parallel: 2}\n")
    code, text = invoke("compare", str(a), str(transformer))
    assert code == 2 and "a dlrm and a transformer job" in text


def test_compare_and_variability_say_when_a_plan_does_not_fit(tmp_path: Path) -> None:
    """gpt3-1.3b on one 80 GiB H100 fits; on a 1 GiB one it cannot (its bf16 weights alone are 2.6 GB)."""
    fits, tight = tmp_path / "fits.yaml", tmp_path / "tight.yaml"
    system = "{preset: dgx-h100, num_nodes: 1, node: {gpus_per_node: 1}}"
    fits.write_text(f"model: {{preset: gpt3-1.3b, num_layers: 2}}\nsystem: {system}\n")
    tight.write_text(fits.read_text().replace("gpus_per_node: 1}", "gpus_per_node: 1}, gpu: {hbm_bytes: 1073741824}"))
    res = CliRunner().invoke(app, ["compare", str(fits), str(tight), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["fits_in_memory"] == {"a": True, "b": False}
    assert "B (" in res.stderr and "does not fit" in res.stderr
    res = CliRunner().invoke(app, ["variability", str(tight), "--samples", "100", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["fits_in_memory"] is False and "does not fit" in res.stderr


def test_variability_of_a_dlrm_samples_its_every_gpu_graph(tmp_path: Path) -> None:
    # on 2 H100s dlrm-small's step is host-bound (workloads/dlrm/host.py): its GPU spread would not
    # show; on the CPU host the operators run on the compute thread
    job = tmp_path / "cpu.yaml"
    job.write_text(dlrm_job(tmp_path).read_text().replace("preset: dgx-h100", "preset: cpu-host"))
    step_s = load_workload(job).predict().step_time_s
    quiet = ["--compute-cv", "0", "--comm-cv", "0", "--network-cv", "0", "--gpu-cv", "0"]
    code, text = invoke("variability", str(job), *quiet, "--samples", "100", "--slow-gpus", "2", "--json")
    assert code == 0, text
    out = json.loads(text)
    assert out["deterministic_s"] == step_s and out["p50_s"] == out["p99_s"] == pytest.approx(step_s, rel=1e-12)
    # each rank is one GPU: 2 slow GPUs take ⌈2 / 1⌉ = 2 ranks at best, min(2, 2 ranks) = 2 at worst
    assert out["placement"]["best_stages"] == out["placement"]["worst_stages"] == [0, 1]
    code, text = invoke("variability", str(job), "--samples", "200", "--json")
    assert code == 0 and json.loads(text)["p50_s"] > step_s  # each rendezvous waits for the slower GPU
    code, text = invoke("variability", str(job), "--slow-gpus", "3")
    assert code == 2 and "the job has 2 GPUs" in text


def test_report_of_a_dlrm_job_holds_its_step_per_rank(tmp_path: Path) -> None:
    job, out = dlrm_job(tmp_path), tmp_path / "r.html"
    code, text = invoke("report", str(job), "--samples", "200", "-o", str(out))
    assert code == 0, text
    page, api = out.read_text(), load_workload(job).predict()
    assert f"<td>{api.step_time_s * 1e3:.3f} ms</td>" in page and "Where the step goes, per rank" in page


def test_search_of_a_dlrm_ranks_shardings_times_batches(tmp_path: Path) -> None:
    job = dlrm_job(tmp_path)
    code, text = invoke("search", str(job), "--batches", "128,256", "--top", "3", "--json")
    assert code == 0, text
    best = json.loads(text)["plans"][0]
    assert best["batch_per_rank"] in (128, 256)
    assert best["samples_per_s"] == pytest.approx(best["batch_per_rank"] * 2 / best["step_time_s"])
    tables = ", ".join(f"{t['name']}: {{strategy: {t['strategy']}, ranks: {t['ranks']}}}" for t in best["tables"])
    again = tmp_path / "best.yaml"
    again.write_text(
        job.read_text().split("plan:")[0]
        + f"plan: {{batch_per_rank: {best['batch_per_rank']}, sharding: {{{tables}}}}}\n"
    )
    assert load_workload(again).predict().step_time_s == best["step_time_s"]  # the plan predicts as searched


def test_search_of_a_dlrm_says_what_its_plans_prices_rest_on_as_predict_does(tmp_path: Path) -> None:
    # dgx-h100 has no measured row-wise Adagrad update: predict and shard say so, and search of the same job too
    job = dlrm_job(tmp_path)
    code, text = invoke("search", str(job), "--batches", "256", "--top", "2", "--json")
    assert code == 0, text
    notes = json.loads(text)["notes"]
    assert len(notes) == 1 and notes[0].startswith("the row-wise Adagrad update of sharded tables on H100-SXM5-80GB")
    code, text = invoke("predict", str(job), "--json")
    assert code == 0, text
    assert json.loads(text)["notes"] == notes


def test_slice_says_in_one_line_that_it_is_for_pipelined_transformers(tmp_path: Path) -> None:
    code, text = invoke("slice", str(dlrm_job(tmp_path)))
    assert code == 2 and "for pipelined transformers" in text and text.count("\n") == 1


def test_the_transformer_keeps_its_variability_numbers() -> None:
    from itercast.config.job import Job
    from itercast.stochastic.variability import VariabilityModel, step_distribution

    code, text = invoke("variability", "--model", "gpt3-1.3b", "--system", "dgx-h100", "--samples", "300", "--json")
    assert code == 0, text
    dist = step_distribution(Job.from_presets("gpt3-1.3b", "dgx-h100"), VariabilityModel(), 300, 0)
    assert json.loads(text)["p95_s"] == dist.quantiles()["p95_s"]


def test_a_searched_transformer_plan_predicts_to_the_searched_step(tmp_path: Path) -> None:
    # one model behind both commands: the search's top plan, written as a job with every plan field the search
    # priced (its framework's own pipeline_p2p among them, which the search names), predicts the same step
    code, text = invoke(
        "search", "--model", "gpt3-1.3b", "--system", "dgx-h100", "--set", "plan.global_batch_size=64", "--top", "1",
        "--workers", "1", "--json",
    )  # fmt: skip
    assert code == 0, text
    doc = json.loads(text)
    assert doc["framework_settings"] == {"pipeline_p2p": {"search": "megatron", "predict": "overlapped"}}
    best = doc["plans"][0]
    plan = {k: v for k, v in best["plan"].items() if v is not None}
    job = tmp_path / "best.yaml"
    system = {"preset": "dgx-h100", "num_nodes": best["num_nodes"]}
    job.write_text(json.dumps({"model": "gpt3-1.3b", "system": system, "plan": plan}))  # JSON is YAML
    assert load_workload(job).predict().step_time_s == pytest.approx(best["step_time_s"], rel=1e-12)


def test_a_set_reaches_one_item_of_a_presets_list():
    """`--set model.tables.0.pooling_factor=50` changes table t0 of dlrm-small alone; it once replaced the
    whole list with a mapping ("Input should be a valid tuple"). An index beyond the 4 tables names them."""
    w = load_workload(None, ["model.tables.0.pooling_factor=50", "model.tables.2.name=big"], "dlrm-small", "dgx-h100")
    tables = [(t.name, t.num_rows, t.pooling_factor) for t in w.job.model.tables]  # type: ignore[union-attr]
    assert tables == [("t0", 1_000_000, 50), ("t1", 500_000, 10), ("big", 100_000, 5), ("t3", 1_000, 1)]
    code, out = invoke("predict", "--model", "dlrm-small", "--system", "dgx-h100", "--set", "model.tables.4.dim=8")
    said = "--set model.tables.4.dim=8: `model.tables.4`: expected an index below 4 (the list's items); got 4"
    assert (code, out) == (2, f"error: {said}\n")


def test_a_set_reaches_one_item_of_a_job_files_own_list(tmp_path):
    """The same on a job file's own tables, a list where the preset's merge took a mapping of indices: it once said
    "`model.tables` is a value, not a section with fields"."""
    path = tmp_path / "own.yaml"
    table = "embedding_dim: 32, pooling_factor: 1"
    tables = f"[{{name: a, num_rows: 1000, {table}}}, {{name: b, num_rows: 2000, {table}}}]"
    path.write_text(f"model: {{preset: dlrm-small, tables: {tables}}}\nsystem: dgx-h100\nplan: {{}}\n")
    w = load_workload(path, ["model.tables.1.zipf_alpha=3", "model.tables.0.num_rows=10"])
    got = [(t.name, t.num_rows, t.zipf_alpha) for t in w.job.model.tables]  # type: ignore[union-attr]
    assert got == [("a", 10, 0.0), ("b", 2000, 3.0)]
    code, out = invoke("predict", str(path), "--set", "model.tables.2.dim=8")
    said = "--set model.tables.2.dim=8: `model.tables.2`: expected an index below 2 (the list's items); got 2"
    assert (code, out) == (2, f"error: {said}\n")


@pytest.mark.parametrize(
    ("given", "said"),
    [
        # a field of one table: its option named, the expected value and what it gave
        (
            "model.tables.0.pooling_factor=-5",
            "--set model.tables.0.pooling_factor=-5: `model.tables.0.pooling_factor`: Input should be greater than 0; "
            "got -5",
        ),
        # an unknown field of a table: the nearest field of a table (EmbeddingTable), not of the model
        (
            "model.tables.0.rows=9",
            "<command line>: unknown field `model.tables.0.rows` — did you mean `num_rows`? "
            "(given by --set model.tables.0.rows=9)",
        ),
        # a check across tables: its own message, what it got, no "Value error" nor the whole section's input
        (
            "model.tables.0.name=t1",
            "<command line>: `model`: table names must be unique; got t1 more than once (`model.tables.0.name`, "
            "`model.tables.1.name`) (given by --set model.tables.0.name=t1)",
        ),
        (
            "model.tables.1.embedding_dim=16",
            "<command line>: `model`: embedding_dim must equal the bottom MLP's output (32): the interaction combines "
            "them; got tables t1(16) (`model.tables.1.embedding_dim`) (given by --set model.tables.1.embedding_dim=16)",
        ),
        ("plan.sharding=3", "--set plan.sharding=3: `plan.sharding`: Input should be a valid dictionary; got 3"),
    ],
)
def test_a_dlrm_field_error_reads_as_a_transformers(given: str, said: str):
    """A DLRM's model and plan errors take the transformer's form (config/job.py format_validation): they once
    read `<command line>: model.tables.0.pooling_factor: Input should be greater than 0`, with no value and the
    option that gave it unnamed, and `model.: Value error, table names must be unique`."""
    code, out = invoke("predict", "--model", "dlrm-small", "--system", "dgx-h100", "--set", given)
    assert (code, out) == (2, f"error: {said}\n")


def test_an_unknown_model_names_the_dlrm_presets_too():
    code, out = invoke("predict", "--model", "dlrm-smal", "--system", "dgx-h100")
    assert code == 2 and "did you mean `dlrm-small`?" in out and "; DLRM: dlrm-dcnv2-criteo, dlrm-small)" in out
    code, out = invoke("predict", "--model", "job.yaml", "--system", "dgx-h100")
    assert code == 2 and "(a file's fields go in a job file's section, not a preset name)" in out


def test_shard_sets_one_table_of_a_preset_as_predict_does():
    """`itercast shard --set model.tables.0.pooling_factor=50` merges into table t0 alone (it once replaced the
    whole list: "`tables`: Input should be a valid tuple"), and a bad value names the --set that gave it."""
    dlrm = load_dlrm("dlrm-small", {"tables": {"0": {"pooling_factor": 50}}})
    assert [(t.name, t.pooling_factor) for t in dlrm.tables] == [("t0", 50), ("t1", 10), ("t2", 5), ("t3", 1)]
    code, out = invoke("shard", "--model", "dlrm-small", "--set", "model.tables.0.pooling_factor=-5")
    said = "--set model.tables.0.pooling_factor=-5: `model.tables.0.pooling_factor`: Input should be greater than 0"
    assert (code, out) == (2, f"error: {said}; got -5\n")
    # a check across tables names the --set that broke it too (it once blamed the preset alone)
    code, out = invoke("shard", "--model", "dlrm-small", "--set", "model.tables.1.name=t0")
    assert code == 2 and out.endswith(
        "more than once (`model.tables.0.name`, `model.tables.1.name`) (given by --set model.tables.1.name=t0)\n"
    ), out


def test_shard_takes_a_dlrm_job_file_and_prices_its_sharding(tmp_path: Path) -> None:
    """`shard JOB.yaml` once said "Missing option '--model'": the job's model, system, samples per GPU and
    plan.sharding (priced as given, as predict prices it); its presets' search finds the same plans."""
    job = dlrm_job(tmp_path)
    code, text = invoke("shard", str(job), "--json")
    assert code == 0, text
    out, api = json.loads(text), load_workload(job).predict()
    assert out["method"] == "given" and out["batch_per_rank"] == 256 and out["world_size"] == 2
    assert out["plans"][0]["step_time_s"] == api.step_time_s
    assert [(t["name"], t["strategy"]) for t in out["plans"][0]["tables"]][-1] == ("t3", "data_parallel")
    free = tmp_path / "free.yaml"
    free.write_text(job.read_text().split("sharding:")[0].rstrip(", ") + "}\n")  # no plan.sharding: searched
    presets = ["--model", "dlrm-small", "--set", "system.node.gpus_per_node=2", "--batch-per-rank", "256", "--json"]
    (c1, searched), (c2, by_presets) = invoke("shard", str(free), "--json"), invoke("shard", *presets)
    assert c1 == c2 == 0 and json.loads(searched)["plans"] == json.loads(by_presets)["plans"]
    code, text = invoke("shard", str(job), "--model", "dlrm-small", "--batch-per-rank", "8")
    assert code == 2 and "--model, --batch-per-rank: " in text and "dlrm.yaml gives them (--set changes them)" in text


def test_a_saved_sharding_is_priced_again_by_shard_sharding(tmp_path: Path) -> None:
    """`shard --json`'s output once was refused by `--sharding` ("table 'model': expected {strategy: …}"):
    its first plan's tables, priced again, give its step."""
    presets = ["--model", "dlrm-small", "--set", "system.node.gpus_per_node=2", "--batch-per-rank", "256"]
    code, text = invoke("shard", *presets, "--json")
    assert code == 0, text
    saved = tmp_path / "saved.json"
    saved.write_text(text)
    code, again = invoke("shard", *presets, "--sharding", str(saved), "--json")
    assert code == 0, again
    first, priced = json.loads(text)["plans"][0], json.loads(again)
    assert priced["method"] == "given" and priced["plans"][0]["step_time_s"] == first["step_time_s"]
    assert priced["plans"][0]["tables"] == first["tables"]


def test_the_sharding_line_shard_prints_is_read_back() -> None:
    """parse_sharding_line reads what sharding_summary writes: table- and column-wise ranks as named (runs
    `first-last` and commas), row-wise and data-parallel over all 8 ranks, written by hand here."""
    plan = parse_sharding_line("t0 TW@3, t1 CW@0-2,5, t2 RW,t3 DP", world=8)
    assert plan == {
        "t0": Shard("table_wise", (3,)),
        "t1": Shard("column_wise", (0, 1, 2, 5)),
        "t2": Shard("row_wise", (0, 1, 2, 3, 4, 5, 6, 7)),
        "t3": Shard("data_parallel", (0, 1, 2, 3, 4, 5, 6, 7)),
    }
    assert sharding_summary(plan) == "t0 TW@3, t1 CW@0-2,5, t2 RW, t3 DP"


@pytest.mark.parametrize(
    "line, message",
    [
        ("t0 XX, t1 RW", "--sharding 't0 XX': expected `TABLE CODE[@RANKS]`, CODE one of TW, CW, RW, DP"),
        ("t0 TW, t1 RW", "--sharding 't0 TW': table_wise names its ranks (@0, @0-3)"),
        ("t0 RW@1, t1 RW", "--sharding 't0 RW@1': row_wise spans every rank (no @)"),
        ("t0 TW@a, t1 RW", "--sharding 't0 TW@a': ranks 'a': expected ranks like 0 or 0-7"),
        ("t0 TW@0, t0 RW", "--sharding: table 't0' is given twice"),
    ],
)
def test_a_malformed_sharding_line_is_named(line: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_sharding_line(line, world=8)
    assert str(err.value) == message


def test_shard_prices_the_line_it_printed() -> None:
    """The table's sharding column, given back as --sharding, prices the same step as the plan it came from; a
    rank that does not exist is one error line naming it."""
    presets = ["--model", "dlrm-small", "--set", "system.node.gpus_per_node=2", "--batch-per-rank", "256"]
    code, text = invoke("shard", *presets, "--json")
    assert code == 0, text
    first = json.loads(text)["plans"][0]
    line = sharding_summary({t["name"]: Shard(t["strategy"], tuple(t["ranks"])) for t in first["tables"]})
    code, again = invoke("shard", *presets, "--sharding", line, "--json")
    assert code == 0, again
    assert json.loads(again)["plans"][0]["step_time_s"] == first["step_time_s"]
    code, text = invoke("shard", *presets, "--sharding", "t0 TW@9, t1 RW, t2 RW, t3 RW")
    assert code == 2 and "--sharding: table 't0': ranks [9] do not exist (ranks 0..1)" in text
    code, text = invoke("shard", *presets, "--sharding", "t0 XX, t1 RW")  # printed as written, no markup
    assert code == 2 and "expected `TABLE CODE[@RANKS]`" in text
