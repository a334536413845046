"""`itercast predict --et`: an execution trace priced on a profiled device, with the embedding indices'
reuse from a named distribution (DLRM's data-dependent lookups)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from itercast.cli import app
from itercast.costs.index_stats import (
    IndexStats,
    unique_fraction_uniform,
    unique_fraction_zipf,
    zipf_classes,
    zipf_hot_fraction,
)

MEASURED = Path(__file__).resolve().parents[1] / "data" / "measured"
ET = MEASURED / "h100_traces" / "dlrm_16384.et.json.gz"
DB = MEASURED / "h100_profile.db"


def test_zipf_distinct_rows_by_hand():
    # one lookup is always one distinct row; alpha 0 is uniform
    assert unique_fraction_zipf(1000, 1, 1.2) == pytest.approx(1.0)
    assert unique_fraction_zipf(2, 2, 0.0) == pytest.approx(0.75) == pytest.approx(unique_fraction_uniform(2, 2))
    # 3 rows, alpha 1: p = (6, 3, 2) / 11; two draws: Σ (1 − (1 − p)²) / 2
    p = [6 / 11, 3 / 11, 2 / 11]
    expected = sum(1 - (1 - q) ** 2 for q in p) / 2
    assert unique_fraction_zipf(3, 2, 1.0) == pytest.approx(expected)
    # beyond the exact rows, geometric blocks at their mean: as exact to 1e-4 on 4M rows
    exact = zipf_classes(4 << 20, 1.05, exact=4 << 20)
    blocked = zipf_classes(4 << 20, 1.05, exact=1 << 16)
    assert blocked[0].shape[0] < 70_000 and blocked[1].sum() == exact[1].sum() == 4 << 20
    for lookups in (10**3, 10**5, 10**7):
        distinct = [float(np.sum(w * -np.expm1(lookups * np.log1p(-p)))) / lookups for p, w in (exact, blocked)]
        assert distinct[1] == pytest.approx(distinct[0], rel=1e-4)
    # a table of 10^10 rows is priced at once (its rows are not enumerated)
    assert zipf_hot_fraction(10**10, 0.0) == pytest.approx(1e-10)
    # skew means reuse: fewer distinct rows than uniform draws
    assert unique_fraction_zipf(10**6, 10**5, 1.05) < 0.5 * unique_fraction_uniform(10**6, 10**5)


def test_zipf_tail_blocks_by_hand():
    # 10 rows, 4 exact: rows 5..10 are blocks of one row each, priced at the mean of x^-alpha over
    # [r - 1/2, r + 1/2]: for alpha 1, ln((r + 1/2) / (r - 1/2)); for alpha 2, 1/(r - 1/2) - 1/(r + 1/2)
    p, rows = zipf_classes(10, 1.0, exact=4)
    assert rows.tolist() == [1.0] * 10
    assert p[4] / p[0] == pytest.approx(np.log(5.5 / 4.5))  # 0.2007, where row 5 exactly is 1/5
    assert p[9] / p[0] == pytest.approx(np.log(10.5 / 9.5))
    p, _ = zipf_classes(10, 2.0, exact=4)
    assert p[4] / p[0] == pytest.approx(1 / 4.5 - 1 / 5.5)  # 0.0404


def test_a_sequence_of_indices_by_hand():
    # rows 1, 2, 3, 1: 3 distinct of 4; row 1 is half the lookups; its repeat has 2 other rows
    # (2 and 3) between: 2 x 30,000 bytes stays within 64 KiB, 2 x 40,000 does not
    near = IndexStats.from_sequence(np.array([1, 2, 3, 1]), 4, 30_000.0)
    far = IndexStats.from_sequence(np.array([1, 2, 3, 1]), 4, 40_000.0)
    assert (near.unique_fraction, near.hot_fraction, near.reuse_beyond) == (0.75, 0.5, (0.0, 0.0, 0.0))
    assert (far.unique_fraction, far.hot_fraction, far.reuse_beyond) == (0.75, 0.5, (0.25, 0.0, 0.0))


def run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["predict", *args])
    return res.exit_code, res.output


@pytest.mark.skipif(not ET.is_file() or not DB.is_file(), reason="measured H100 data not in this checkout")
def test_predict_an_execution_trace_and_its_index_reuse():
    code, text = run("--et", str(ET), "--db", str(DB), "--gpu", "--json")
    assert code == 0, text
    uniform = json.loads(text)
    code, text = run("--et", str(ET), "--db", str(DB), "--gpu", "--index-distribution", "zipf:1.05", "--json")
    skewed = json.loads(text)
    # the lookups reuse rows: the forward gets cheaper; on a GPU the backward dearer (its most
    # frequent row's lookups are summed one after another, as the H100 measured); nothing else moves
    fwd, bwd = "embedding_bag_fwd", "embedding_bag_bwd"
    assert skewed["kernel_s_by_family"][fwd] < uniform["kernel_s_by_family"][fwd]
    assert skewed["kernel_s_by_family"][bwd] > uniform["kernel_s_by_family"][bwd]
    assert skewed["kernel_s_by_family"]["gemm"] == uniform["kernel_s_by_family"]["gemm"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--et", str(ET)], "--et needs --db"),
        (["--et", str(ET), "--db", str(DB), "--index-distribution", "zipf:abc"], "expected uniform or zipf:ALPHA"),
        (["--et", str(ET), "--db", str(DB), "--index-distribution", "pareto"], "expected uniform or zipf:ALPHA"),
        (["--et", str(ET), "--db", "/nonexistent.db"], "no such profiling database"),
        (["--et", str(ET), "--db", str(DB), "--model", "gpt3-1.3b"], "--et prices a trace"),
    ],
)
def test_bad_execution_trace_requests_are_one_line(args, message):
    code, text = run(*args)
    assert code == 2 and message in text


def test_backend_names_map_both_ways():
    from itercast.costs.op_model import OTHER_BACKEND

    assert all(OTHER_BACKEND[OTHER_BACKEND[name]] == name for name in OTHER_BACKEND)
    assert OTHER_BACKEND["aten::cudnn_batch_norm"] == "aten::native_batch_norm"


@pytest.mark.skipif(not (MEASURED / "cpu_profile.db").is_file(), reason="measured CPU data not in this checkout")
def test_a_gpu_trace_prices_on_the_cpu_database():
    # recorded on an H100 (efficient attention, cuDNN names); priced with this CPU's operator models
    code, text = run(
        "--et", str(MEASURED / "h100_traces" / "gpt_8.et.json.gz"), "--db", str(MEASURED / "cpu_profile.db"), "--json"
    )
    assert code == 0, text
    out = json.loads(text)
    assert out["kernel_s_by_family"]["attention_fwd"] > 0 and out["kernel_s_by_family"]["attention_bwd"] > 0


@pytest.mark.skipif(not ET.is_file() or not DB.is_file(), reason="measured H100 data not in this checkout")
def test_a_kineto_trace_of_the_same_run_checks_the_prediction(tmp_path):
    from itercast.traces.kineto import read_kineto

    kineto = MEASURED / "h100_traces" / "dlrm_16384.kineto.json.gz"
    code, text = run("--et", str(ET), "--db", str(DB), "--gpu", "--kineto", str(kineto), "--json")
    assert code == 0, text
    out = json.loads(text)
    check = out["kineto_check"]
    busy = float(read_kineto(kineto).op_dur_us.sum()) * 1e-6  # kernels, copies and memsets of the run
    assert check["what"] == "GPU busy" and check["measured_s"] == pytest.approx(busy)
    assert check["predicted_s"] == pytest.approx(sum(out["kernel_s_by_family"].values()))
    assert check["error"] == pytest.approx(check["predicted_s"] / busy - 1)
    # user probe 9: the Kineto trace of another workload was "checked" against (a CNN's ET against this DLRM run:
    # +7.7%); none of its 663 operators' record-function ids names an ET operator of its name: refused
    cnn = MEASURED / "h100_traces" / "cnn_512.et.json.gz"
    code, text = run("--et", str(cnn), "--db", str(DB), "--gpu", "--kineto", str(kineto))
    line = " ".join(text.split())
    assert code == 2 and "0 of 0 linked operators differ in input shapes, 663 Kineto operators have no ET node" in line
    empty = tmp_path / "empty.json"
    empty.write_text('{"traceEvents": [{"ph": "X", "name": "aten::add", "ts": 0, "dur": 5, "pid": 1, "tid": 1}]}')
    code, text = run("--et", str(ET), "--db", str(DB), "--kineto", str(empty))
    assert code == 2 and "neither GPU activity nor ProfilerStep marks" in text


def test_a_gpu_database_without_gpu_says_its_one_clock_adds_host_and_kernels():
    # the H100 database profiled a GPU (fingerprint device cuda): on one clock host and kernels add up,
    # which a GPU does not do, so it warns; with --gpu (two clocks) it does not
    one = CliRunner().invoke(
        app, ["predict", "--et", str(MEASURED / "h100_traces" / "gpt_64.et.json.gz"), "--db", str(DB)]
    )
    assert one.exit_code == 0 and "profiled a GPU: without --gpu the host's and the kernels' times add up" in one.output
    two = CliRunner().invoke(
        app, ["predict", "--et", str(MEASURED / "h100_traces" / "gpt_64.et.json.gz"), "--db", str(DB), "--gpu"]
    )
    assert two.exit_code == 0 and "profiled a GPU" not in two.output


def test_a_trace_priced_beyond_its_profile_says_so(tmp_path):
    """One aten::mm of 4096 × 8192 by 8192 × 16384: 2 · 4096 · 8192 · 16384 = 1.0995e12 FLOPs, priced on the
    committed CPU profile, whose aten::mm rows stop far below (at most 1.72e10 FLOPs): said on the console
    and listed under `extrapolated` in --json; a tiny add below that profile's least row is not."""
    f = "Tensor(float)"
    nodes = [
        {"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 1},
        {"id": 2, "name": "[pytorch|profiler|execution_trace|thread]", "ctrl_deps": 1},
    ]
    for nid, name, shapes, out in (
        (3, "aten::mm", [[4096, 8192], [8192, 16384]], [[4096, 16384]]),
        (4, "aten::add", [[2], [2]], [[2]]),
    ):
        inputs = {"values": [], "shapes": shapes, "types": [f] * len(shapes), "strides": []}
        outputs = {"values": [], "shapes": out, "types": [f], "strides": []}
        nodes.append({"id": nid, "name": name, "ctrl_deps": 2, "inputs": inputs, "outputs": outputs})
    et = tmp_path / "et.json"
    et.write_text(json.dumps({"schema": "1.1.1-chakra.0.0.4", "nodes": nodes}))
    res = CliRunner().invoke(app, ["predict", "--et", str(et), "--db", str(MEASURED / "cpu_profile.db"), "--json"])
    assert res.exit_code == 0, res.output
    (line,) = json.loads(res.stdout)["extrapolated"]
    assert line.startswith("profiled operator model aten::mm was fitted on ")
    assert " FLOPs; this job prices 1.1e+12–1.1e+12 on it: beyond that range the model is extrapolated" in line
    said = CliRunner().invoke(app, ["predict", "--et", str(et), "--db", str(MEASURED / "cpu_profile.db")])
    assert said.exit_code == 0 and "profiled operator model aten::mm" in said.output
