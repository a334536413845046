"""One interface over the workloads: a job file names a transformer or a DLRM, and each gives the same
Forecast, throughput and comparison figures; a DLRM's search is over shardings × batch per GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from itercast.errors import ConfigError
from itercast.search.dlrm_search import default_batches, search_dlrm
from itercast.workload import DLRMWorkload, TransformerWorkload, compare_figures, load_workload
from itercast.workloads.dlrm import Shard, dlrm_step

SHARDING = (
    "{t0: {strategy: table_wise, ranks: [0]}, t1: {strategy: table_wise, ranks: [1]}, "
    "t2: {strategy: table_wise, ranks: [1]}, t3: {strategy: data_parallel, ranks: [0, 1]}}"
)


def dlrm_job(tmp_path: Path, plan: str) -> Path:
    path = tmp_path / "dlrm.yaml"
    path.write_text(
        f"model: dlrm-small\nsystem: {{preset: dgx-h100, num_nodes: 1, node: {{gpus_per_node: 2}}}}\nplan: {plan}\n"
    )
    return path


def test_a_job_file_naming_a_dlrm_preset_is_a_dlrm_job(tmp_path: Path) -> None:
    w = load_workload(dlrm_job(tmp_path, "{batch_per_rank: 256}"))
    assert isinstance(w, DLRMWorkload) and w.job.plan.batch_per_rank == 256 and w.num_gpus == 2
    assert w.job.plan.sharding is None  # the planner chooses
    t = load_workload(None, [], model="gpt3-1.3b", system="dgx-h100")
    assert isinstance(t, TransformerWorkload) and t.kind == "transformer"


def test_a_dlrm_plan_refuses_transformer_fields_and_bad_shardings(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"plan\.tensor_parallel"):
        load_workload(dlrm_job(tmp_path, "{tensor_parallel: 2}"))
    with pytest.raises(ConfigError, match="table 't3' has no sharding"):
        load_workload(dlrm_job(tmp_path, "{sharding: {t0: {strategy: row_wise, ranks: [0, 1]}}}"))


def test_a_dlrm_forecast_holds_the_busiest_ranks_memory_by_hand(tmp_path: Path) -> None:
    w = load_workload(dlrm_job(tmp_path, f"{{batch_per_rank: 256, sharding: {SHARDING}}}"))
    r = w.predict()
    # dlrm-small: MLPs 13-64-32 and (5·4/2 + 32 = 42)-64-1
    mlp = (13 * 64 + 64) + (64 * 32 + 32) + (42 * 64 + 64) + (64 * 1 + 1)
    assert mlp == 5793
    # rank 0 holds t0 (1M × 32) and the replica of t3 (1000 × 32); fp32 rows, an fp32 Adagrad state per row;
    # MLPs: fp32 weights, gradients (TorchRec's DDP views its buckets as them: no copy), Adam m and v
    weights = mlp * 4 + 1_000_000 * 32 * 4 + 1000 * 32 * 4
    gradients = mlp * 4 + 1000 * 32 * 4  # and the replica's dense gradient
    optimizer = mlp * 8 + 1_000_000 * 4 + 1000 * 4
    assert (r.memory.stage, r.memory.weights_bytes) == (0, weights)
    # activations, fp32 per sample: 13 dense features, the MLPs' outputs 64 + 32 + 64 + 1, the interaction's
    # input 5 × 32 and output 42 (376 floats × 256 samples); t0's int64 indices and int32 lengths for the
    # global batch (512 × 20 lookups, 512 bags), t3's replica for its own 256 samples (256 lookups and bags)
    activations = 376 * 4 * 256 + (512 * 20 * 8 + 512 * 4) + (256 * 8 + 256 * 4)
    assert (r.memory.gradients_bytes, r.memory.optimizer_bytes) == (gradients, optimizer)
    assert r.memory.activations_bytes == activations == 472_064
    # `shard` and `search` print the step's memory per GPU: the same total, the reserve included: the CUDA
    # context 0.75 GiB and NCCL's 256 MiB for the one process group of 2 ranks
    shards = {"t0": Shard("table_wise", (0,)), "t1": Shard("table_wise", (1,)), "t2": Shard("table_wise", (1,))}
    step = dlrm_step(w.job.model, w.job.system, {**shards, "t3": Shard("data_parallel", (0, 1))}, 256)
    assert r.memory.reserved_bytes == 0.75 * 2**30 + 256 * 2**20
    total = weights + gradients + optimizer + activations + r.memory.reserved_bytes
    assert step.memory_per_gpu_bytes == r.memory.total_bytes == total
    name, value = w.throughput(r)
    assert name == "samples_per_s" and value == pytest.approx(256 * 2 / r.step_time_s)
    figures = compare_figures(w, r)
    assert set(figures) >= {"step_time_s", "samples_per_s", "memory_per_gpu_bytes", "breakdown.compute_s"}
    assert "mfu" not in figures
    assert sum(r.family_time_s.values()) > 0 and r.critical_path


def test_dlrm_search_ranks_shardings_by_samples_per_second(tmp_path: Path) -> None:
    assert default_batches(2048) == [512, 1024, 2048, 4096, 8192]
    assert default_batches(2) == [1, 2, 4, 8]
    w = load_workload(dlrm_job(tmp_path, "{batch_per_rank: 256}"))
    assert isinstance(w, DLRMWorkload)
    found, evaluated = search_dlrm(w.job, [128, 256])
    assert evaluated >= len(found) > 0 and {r.batch_per_rank for r in found} == {128, 256}
    rates = [r.batch_per_rank * 2 / r.step.step_time_s for r in found]
    assert rates == sorted(rates, reverse=True)
    assert [r.samples_per_s for r in found] == pytest.approx(rates)


def test_a_dlrm_search_ranks_its_shardings_by_samples_per_second_at_a_sampled_step(tmp_path: Path, monkeypatch) -> None:
    """`search --objective p95` of a DLRM (refused before): the first plans sampled and re-ranked by batch ×
    GPUs / p95. Without noise each p95 is the step itself, nothing moves; with given p95s, by hand."""
    import types

    import numpy as np

    from itercast.search import dlrm_search
    from itercast.search.distribution_rank import DistributionOptions
    from itercast.stochastic.variability import VariabilityModel

    w = load_workload(dlrm_job(tmp_path, "{batch_per_rank: 256}"))
    assert isinstance(w, DLRMWorkload)
    found, _ = search_dlrm(w.job, [128, 256])
    still = VariabilityModel(compute_cv=0, comm_cv=0, network_cv=0, gpu_cv=0, moe_imbalance_cv=0)
    ranked, note = dlrm_search.rank_by_distribution(found, "p95", DistributionOptions(still, samples=50, top=3))
    assert [rank for _, _, rank in ranked] == list(range(1, len(found) + 1))
    assert [d["p95_s"] for _, d, _ in ranked[:3]] == pytest.approx([r.step.step_time_s for r in found[:3]])  # type: ignore[index]
    assert [d for _, d, _ in ranked[3:]] == [None] * (len(found) - 3)
    assert note == "variability does not change the ranking: by p95 the 3 plans sampled keep their order"
    # p95s given: plan 1 (its batch b1) twice as slow as its step, plans 2 and 3 at theirs. Samples per
    # second at p95: b1·2 / (2 s1) against b2·2 / s2 and b3·2 / s3, so plan 1 drops below both
    step_s = {id(r.step.graph): r.step.step_time_s for r in found}
    step_s[id(found[0].step.graph)] *= 2

    def given(step, *_args):  # graph_distribution's figures, given: each graph's p95 as set above
        return types.SimpleNamespace(quantiles=lambda: {"p95_s": step_s[id(step.graph)]}, samples_s=np.zeros(1))

    monkeypatch.setattr(dlrm_search, "graph_distribution", given)
    ranked, note = dlrm_search.rank_by_distribution(found, "p95", DistributionOptions(still, top=3))
    rates = {rank: r.batch_per_rank * 2 / d["p95_s"] for r, d, rank in ranked[:3]}  # type: ignore[index]
    assert rates[1] == pytest.approx(found[0].samples_per_s / 2)
    assert [rank for _, _, rank in ranked[:3]] == sorted(rates, key=lambda k: -rates[k])
    assert [rank for _, _, rank in ranked[:3]][-1] == 1 and note.startswith("variability changes the ranking")


def test_the_memory_row_names_a_capacity_that_is_not_whole_gibibytes(tmp_path: Path) -> None:
    # 1.5e9 bytes of HBM are 1.397 GiB: "of 1.4 GiB", not a rounded-down "of 1 GiB" below the 1.9 GiB used
    path = tmp_path / "job.yaml"
    path.write_text("model: gpt3-1.3b\nsystem: {preset: dgx-h100, gpu: {hbm_bytes: 1500000000}}\nplan: {}\n")
    w = load_workload(path, [])
    assert isinstance(w, TransformerWorkload)
    rows = dict(w.summary_rows(w.predict()))
    memory = next(v for k, v in rows.items() if "GiB of" in v)
    assert "GiB of 1.4 GiB" in memory
