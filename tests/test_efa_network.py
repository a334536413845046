"""The h100-p5.48xlarge preset's network (collective_curves h100-efa): its held-out measurements priced, and the
note that says what on it is not measured."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from click.testing import Result
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import Job, load_system
from itercast.costs.analytic import AnalyticCostModel, unmeasured_network_note
from itercast.data_paths import read_csv_rows
from itercast.hardware.topology import GroupPlacement
from itercast.workloads.dlrm import DLRMJob, dlrm_notes
from itercast.workloads.transformer_ops import priced_notes

EFA_ROWS = Path(__file__).resolve().parents[1] / "data" / "published" / "collectives" / "h100_aws_efa_nccl_tests.csv"


def _all_gather_s(system: str, nodes: int, size_bytes: float) -> float:
    costs = AnalyticCostModel(load_system(system), "bf16")
    return float(costs.collective_s("all_gather", size_bytes, GroupPlacement(nodes * 8, nodes, 8)))


def test_a_held_out_32_node_all_gather_of_32_mib_is_priced_near_its_measured_time() -> None:
    # crazyguitar's p5.48xlarge row at 32 nodes (held out of the fit), 33,554,432 B at 12.38 GB/s of busbw:
    # 33554432 x 255/256 = 33423360 bus bytes; / 12.38e9 B/s = 2.6998e-3 s
    measured_s = 33423360 / 12.38e9
    assert measured_s == pytest.approx(2.6998e-3, rel=1e-4)
    assert _all_gather_s("h100-p5.48xlarge", 32, 33554432) == pytest.approx(measured_s, rel=0.15)
    # the InfiniBand preset prices the same bytes a node with its own per-step latency, fitted on another cluster:
    # 1.70 ms, 255 ring steps at ~6.2 µs against EFA's 8.75; what differs is that latency, not the bytes
    assert 0.5 * measured_s < _all_gather_s("dgx-h100", 32, 33554432) < 0.75 * measured_s


def test_every_held_out_all_gather_is_priced_within_20_percent_and_10_on_average() -> None:
    rows = [r for r in read_csv_rows(EFA_ROWS) if r["nodes"] == "32" and r["collective"] == "all_gather"]
    assert len(rows) == 7  # 32 MiB to 2 GiB, doubling
    errors = []
    for r in rows:
        size = float(r["size_B"])
        measured_s = size * 255 / 256 / (float(r["busbw_GBs"]) * 1e9)  # nccl-tests: busbw = algbw x (n - 1) / n
        errors.append(_all_gather_s("h100-p5.48xlarge", 32, size) / measured_s - 1)
    assert max(abs(e) for e in errors) < 0.20
    assert sum(abs(e) for e in errors) / len(errors) < 0.10


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize(("nodes", "per_node"), [(2, 8), (8, 1), (8, 8), (64, 8), (128, 1), (128, 8)])
def test_a_ring_over_efa_never_takes_less_time_for_a_larger_message(kind: str, nodes: int, per_node: int) -> None:
    # NCCL's tuner can always run a smaller message as it would a larger one: priced time is non-decreasing in
    # size, 1 KB to 16 GB, within the fitted regime and across its bound with the small messages' regime
    costs = AnalyticCostModel(load_system("h100-p5.48xlarge"), "bf16")
    group = GroupPlacement(nodes * per_node, nodes, per_node)
    times = [costs.collective_s(kind, float(size), group) for size in np.geomspace(1e3, 16e9, 120)]
    assert all(b >= a for a, b in pairwise(times))


def test_the_time_of_a_fixed_all_gather_grows_with_the_nodes_as_measured() -> None:
    # the rows' own 32 MiB all-gathers: 2 nodes at 131.30 GB/s of busbw, 32 at 12.38: 33554432 x 15/16 / 131.30e9
    # = 0.2396 ms and 2.6998 ms, 11.3 times longer; priced within 15% of that ratio
    two, thirty_two = 33554432 * 15 / 16 / 131.30e9, 33554432 * 255 / 256 / 12.38e9
    priced = _all_gather_s("h100-p5.48xlarge", 32, 33554432) / _all_gather_s("h100-p5.48xlarge", 2, 33554432)
    assert priced == pytest.approx(thirty_two / two, rel=0.15)


def test_the_note_says_what_efa_does_not_measure_where_the_job_crosses_nodes() -> None:
    def job(system: str, nodes: int) -> Job:
        plan = {"global_batch_size": 8 * nodes, "data_parallel": 8 * nodes}
        return Job.from_dicts({"preset": "llama3-8b"}, plan, {"preset": system, "num_nodes": nodes})

    many = job("h100-p5.48xlarge", 4)
    note = unmeasured_network_note(many.system)
    assert note is not None and "reduce-scatters as those all-gathers" in note and "all-to-alls" in note
    assert note in priced_notes(many.model, many.plan, many.system)
    assert unmeasured_network_note(job("h100-p5.48xlarge", 1).system) is None  # nothing crosses a node
    assert unmeasured_network_note(job("dgx-h100", 4).system) is None  # InfiniBand's four collectives measured


def test_a_dlrm_across_efa_nodes_is_told_of_its_all_to_alls_priced_on_infiniband() -> None:
    # a DLRM's embedding all-to-alls cross nodes: on EFA they are priced on h100-400g's curve, and said so
    def notes(system: str, nodes: int) -> list[str]:
        job = DLRMJob.from_dicts(
            {"preset": "dlrm-small"}, {"batch_per_rank": 256}, {"preset": system, "num_nodes": nodes}
        )
        return dlrm_notes(job.model, job.system, 256, None)

    efa, ib = notes("h100-p5.48xlarge", 2), notes("dgx-h100", 2)
    assert [n for n in efa if n.startswith("network h100-efa:")] == [
        unmeasured_network_note(load_system("h100-p5.48xlarge", num_nodes=2))
    ]
    assert efa[: len(ib)] == ib and len(efa) == len(ib) + 1


def test_every_command_that_prices_a_job_says_what_efa_leaves_unmeasured(tmp_path: Path) -> None:
    # Workload.notes, said by predict, variability, slice, report and compare alike: a GPT-3 1.3B on 2 nodes of
    # p5.48xlarge (16 GPUs: pipeline 2 x data 8) against the same job on DGX H100s, whose four collectives were measured
    def job_file(system: str) -> Path:
        path = tmp_path / f"{system}.yaml"
        plan = "{global_batch_size: 16, data_parallel: 8, pipeline_parallel: 2}"
        path.write_text(f"model: gpt3-1.3b\nsystem: {{preset: {system}, num_nodes: 2}}\nplan: {plan}\n")
        return path

    efa, ib = job_file("h100-p5.48xlarge"), job_file("dgx-h100")
    said = "network h100-efa: all-gathers and all-reduces across nodes"

    def run(*args: str) -> Result:
        res = CliRunner().invoke(app, list(args))
        assert res.exit_code == 0, res.output
        return res

    for args in (("predict",), ("variability", "--samples", "200"), ("slice",)):
        res = run(*args, str(efa), "--json")
        assert sum(n.startswith(said) for n in json.loads(res.stdout)["notes"]) == 1, args
        if args[0] != "variability":  # variability says its notes in its table, not as warnings
            assert said in res.stderr, args
        assert not any(n.startswith(said) for n in json.loads(run(*args, str(ib), "--json").stdout)["notes"]), args
    run("report", str(efa), "--samples", "200", "--out", str(tmp_path / "r.html"))
    page = (tmp_path / "r.html").read_text()
    assert "What this forecast leaves out or rests on" in page and said in page
    compared = run("compare", str(efa), str(ib)).stderr
    assert said in compared and "on EFA (A)" in compared
