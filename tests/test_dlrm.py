"""DLRM sharding: the work of each shard by hand, embedding traffic on a linear cost model, the
step's exchange bound by the busiest rank, memory per rank, the planner, `itercast shard`."""

from __future__ import annotations

import json

import pytest
from test_golden import HBM, SYSTEM, linear_calibration
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import parse_section
from itercast.costs.analytic import AnalyticCostModel
from itercast.costs.op_model import unique_fraction_uniform
from itercast.workloads.dlrm import (
    DLRMConfig,
    EmbeddingTable,
    Shard,
    candidate_shards,
    dlrm_step,
    embedding_seconds,
    memory_per_rank,
    plan_sharding,
    shard_work,
)

TABLE = EmbeddingTable(name="t", num_rows=1000, embedding_dim=16, pooling_factor=4)


def model(tables: int = 2, rows: int = 1000) -> DLRMConfig:
    return DLRMConfig(
        dense_features=8,
        bottom_mlp=(16,),
        top_mlp=(8, 1),
        tables=tuple(
            EmbeddingTable(name=f"t{i}", num_rows=rows, embedding_dim=16, pooling_factor=4) for i in range(tables)
        ),
    )


def system(gpus: int):
    return parse_section("system", {**SYSTEM, "node": {**SYSTEM["node"], "gpus_per_node": gpus}, "num_nodes": 1})


def test_shard_work_by_hand():
    # 4 ranks × 8 samples: B = 32; 4 lookups a sample, 16 columns, fp32 pooled vectors
    tw = shard_work(TABLE, Shard("table_wise", (0,)), 0, 4, 8)
    assert (tw.lookups, tw.rows, tw.dim, tw.pooled_out_bytes) == (128, 1000, 16, 32 * 16 * 4)
    assert shard_work(TABLE, Shard("table_wise", (0,)), 1, 4, 8) is None
    rw = shard_work(TABLE, Shard("row_wise", (0, 1, 2, 3)), 2, 4, 8)
    assert (rw.lookups, rw.rows, rw.dim, rw.pooled_out_bytes) == (32, 250, 16, 32 * 16 * 4)  # partial sums of all B
    cw = shard_work(TABLE, Shard("column_wise", (0, 1)), 1, 4, 8)
    assert (cw.lookups, cw.dim, cw.pooled_out_bytes) == (128, 8, 32 * 8 * 4)
    dp = shard_work(TABLE, Shard("data_parallel", (0, 1, 2, 3)), 3, 4, 8)
    assert (dp.lookups, dp.rows, dp.pooled_out_bytes) == (32, 1000, 0)  # the local batch only


def test_embedding_traffic_on_a_linear_cost_model():
    costs = AnalyticCostModel(system(1), "fp32", linear_calibration())
    work = shard_work(TABLE, Shard("table_wise", (0,)), 0, 1, 8)  # 32 lookups, 8 pooled vectors
    fwd, bwd = embedding_seconds(costs, TABLE, work)
    assert fwd == pytest.approx((32 * 16 * 4 + 8 * 16 * 4) / HBM)
    distinct = unique_fraction_uniform(1000, 32) * 32
    assert bwd == pytest.approx((8 * 16 * 4 + 32 * 16 * 4 + distinct * 2 * (16 * 4 + 4)) / HBM)
    skewed = TABLE.model_copy(update={"zipf_alpha": 1.2})
    assert embedding_seconds(costs, skewed, work)[1] < bwd  # reused rows: fewer distinct rows to update


def test_memory_per_rank_by_hand():
    m = model(2)
    plan = {"t0": Shard("table_wise", (0,)), "t1": Shard("row_wise", (0, 1))}
    assert m.interaction_width() == 3 + 16  # F = 3 vectors: 3 pairs, and the dense vector's 16
    mlp = ((8 * 16 + 16) + (19 * 8 + 8) + (8 * 1 + 1)) * 16  # weights and biases, 16 bytes each with Adam
    row = 16 * 4 + 4  # fp32 row + its Adagrad state
    assert memory_per_rank(m, plan, 2) == pytest.approx([mlp + 1000 * row + 500 * row, mlp + 500 * row])


def test_the_exchange_waits_for_the_busiest_rank():
    m, sys2 = model(2), system(2)
    stacked = {"t0": Shard("table_wise", (0,)), "t1": Shard("table_wise", (0,))}
    spread = {"t0": Shard("table_wise", (0,)), "t1": Shard("table_wise", (1,))}
    a, b = dlrm_step(m, sys2, stacked, 64), dlrm_step(m, sys2, spread, 64)
    assert b.step_time_s < a.step_time_s  # rank 0 holding both tables sets everyone's pace

    def lookups_s(step):  # each rank's embedding forward
        g = step.graph
        return [float(g.duration_s[t]) for t in range(g.num_tasks) if g.names[g.name[t]] == "embedding_fwd"]

    assert lookups_s(b)[0] == lookups_s(b)[1] > 0 and lookups_s(a)[1] == 0
    assert lookups_s(a)[0] == pytest.approx(2 * lookups_s(b)[0])


def test_exhaustive_planning_on_a_small_case_puts_equal_tables_apart():
    result = plan_sharding(model(2), system(2), 64)
    assert result.method == "exhaustive"
    assert result.evaluated == len(candidate_shards(TABLE, 2)) ** 2
    best, step = result.plans[0]
    assert step.fits and step.step_time_s == min(s.step_time_s for _, s in result.plans)
    # the stacked table-wise plans are never the best
    assert not (best["t0"].strategy == best["t1"].strategy == "table_wise" and best["t0"].ranks == best["t1"].ranks)


def test_tables_must_match_the_bottom_mlp():
    with pytest.raises(ValueError, match="embedding_dim must equal the bottom MLP's output"):
        DLRMConfig(dense_features=8, bottom_mlp=(32,), top_mlp=(1,), tables=(TABLE,))


def test_shard_command_json_and_errors():
    res = CliRunner().invoke(app, ["shard", "--model", "dlrm-small", "--system", "dgx-h100", "--top", "2", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["world_size"] == 8 and len(out["plans"]) == 2
    first = out["plans"][0]
    assert {t["name"] for t in first["tables"]} == {"t0", "t1", "t2", "t3"}
    assert first["step_time_s"] <= out["plans"][1]["step_time_s"] and first["fits"] is True
    assert all(t["strategy"] in ("table_wise", "column_wise", "row_wise", "data_parallel") for t in first["tables"])
    bad = CliRunner().invoke(app, ["shard", "--model", "no-such-dlrm"])
    assert bad.exit_code == 2 and "neither a DLRM preset" in bad.output


def test_a_given_sharding_is_priced_and_checked(tmp_path):
    from itercast.workloads.dlrm import check_sharding

    good = tmp_path / "s.yaml"
    good.write_text(
        "t0: {strategy: table_wise, ranks: [0]}\nt1: {strategy: row_wise, ranks: [0, 1, 2, 3, 4, 5, 6, 7]}\n"
        "t2: {strategy: column_wise, ranks: [2, 3]}\nt3: {strategy: data_parallel, ranks: [0, 1, 2, 3, 4, 5, 6, 7]}\n"
    )
    res = CliRunner().invoke(app, ["shard", "--model", "dlrm-small", "--sharding", str(good), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["method"] == "given" and [t["strategy"] for t in out["plans"][0]["tables"]] == [
        "table_wise", "row_wise", "column_wise", "data_parallel"
    ]  # fmt: skip
    m = model(1)
    assert check_sharding(m, {"t0": Shard("column_wise", (0, 1, 2))}, 4) == [
        "table 't0': embedding_dim 16 not divisible by its 3 column-wise ranks"
    ]
    assert check_sharding(m, {"t0": Shard("row_wise", (0, 1))}, 4) == ["table 't0': row_wise spans every rank 0..3"]
