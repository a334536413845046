"""DLRM sharding: the work of each shard by hand, embedding traffic on a linear cost model, the
step's exchange bound by the busiest rank, memory per rank, the planner, `itercast shard`."""

from __future__ import annotations

import json

import pytest
from test_golden import HBM, PEAK, SYSTEM, linear_calibration
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import parse_section
from itercast.costs.analytic import AnalyticCostModel
from itercast.costs.op_model import OperatorCostModel, unique_fraction_uniform
from itercast.hardware.topology import place_group
from itercast.workloads.dlrm import (
    DLRMConfig,
    EmbeddingTable,
    Shard,
    candidate_shards,
    dense_activation_bytes,
    distinct_candidates,
    dlrm_step,
    embedding_seconds,
    index_stats,
    memory_parts_per_rank,
    memory_per_rank,
    mlp_seconds,
    no_overheads,
    plan_sharding,
    replica_update_bytes,
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


def test_a_row_wise_shard_of_skewed_indices_serves_its_hot_row():
    # 4 rows at Zipf 1: weights 1, 1/2, 1/3, 1/4, sum 25/12, the hottest row 12/25 = 0.48 of the lookups. Row-wise
    # over 2 ranks (2 rows each, popularity hashed over the blocks): the first shard holds that row and one of the
    # 3 others, 0.48 + 0.52 · 1/3 = 0.65333 of the lookups; the second 0.52 · 2/3 = 0.34667 (B = 16 samples × 2
    # lookups = 32: 20.907 and 11.093); uniform draws give 16 each
    table = EmbeddingTable(name="t", num_rows=4, embedding_dim=16, pooling_factor=2, zipf_alpha=1.0)
    rw = Shard("row_wise", (0, 1))
    first, second = shard_work(table, rw, 0, 2, 8), shard_work(table, rw, 1, 2, 8)
    assert (first.lookups, second.lookups) == (
        pytest.approx(32 * 0.65333, rel=1e-4),
        pytest.approx(32 * 0.34667, rel=1e-4),
    )
    assert shard_work(table.model_copy(update={"zipf_alpha": 0.0}), rw, 0, 2, 8).lookups == pytest.approx(16)
    # the first shard's lookups: its hot row 0.48 / 0.65333 = 0.73469 of them
    assert index_stats(table, first).hot_fraction == pytest.approx(0.73469, rel=1e-4)


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
    """64 samples a rank. Activations per sample, fp32: the 8 dense features, every MLP layer's output
    (16 bottom, 8 and 1 top), the interaction's input (3 vectors × 16) and output (19): 100 floats, 400
    bytes, 25,600 for 64 samples; each shard's indices (int64) and bag lengths (int32): a table-wise
    shard of 2 ranks × 64 samples × 4 lookups: 512 × 8 + 128 × 4 = 4,608; a row-wise half 256 × 8 + 128
    × 4 = 2,560; a replica its own 64 samples: 256 × 8 + 64 × 4 = 2,304."""
    m = model(2)
    plan = {"t0": Shard("table_wise", (0,)), "t1": Shard("row_wise", (0, 1))}
    assert m.interaction_width() == 3 + 16  # F = 3 vectors: 3 pairs, and the dense vector's 16
    # weights and biases, 16 bytes each with Adam (weight, gradient, m, v); TorchRec's DDP views its buckets
    # as the gradients (gradient_as_bucket_view=True): no second copy
    params = (8 * 16 + 16) + (19 * 8 + 8) + (8 * 1 + 1)
    mlp = params * 16
    row = 16 * 4 + 4  # fp32 row + its Adagrad state
    dense = 100 * 4 * 64
    assert [p["activations"] for p in memory_parts_per_rank(m, plan, 2, 64)] == [dense + 4608 + 2560, dense + 2560]
    assert memory_per_rank(m, plan, 2, 64) == pytest.approx(
        [mlp + 1000 * row + 500 * row + dense + 4608 + 2560, mlp + 500 * row + dense + 2560]
    )
    replica = {"t0": Shard("data_parallel", (0, 1)), "t1": Shard("column_wise", (0, 1))}
    # a replica keeps its dense fp32 gradient; a column-wise half holds 8 of the 16 columns
    assert memory_per_rank(m, replica, 2, 64) == pytest.approx(
        [mlp + 1000 * (row + 16 * 4) + 1000 * (8 * 4 + 4) + dense + 2304 + 4608] * 2
    )
    # the point-to-point emulation copies every dense gradient into one flat buffer: 4 bytes more each
    p2p = m.model_copy(update={"exchange": "point_to_point"})
    assert memory_per_rank(p2p, replica, 2, 64) == pytest.approx(
        [(params * 20) + 1000 * (row + 2 * 16 * 4) + 1000 * (8 * 4 + 4) + dense + 2304 + 4608] * 2
    )
    alone = {"t0": Shard("data_parallel", (0,)), "t1": Shard("table_wise", (0,))}
    assert memory_per_rank(m, alone, 1, 64) == pytest.approx(
        [mlp + 1000 * (row + 16 * 4) + 1000 * row + dense + 2304 + 2304]
    )


def test_the_cross_net_keeps_its_layers_inputs_and_both_factors_outputs():
    """DCNv2 with 2 cross layers of rank 4 over F = 3 vectors of 16 (width 48): per sample the dense 8,
    bottom 16, x0 = 48, each layer's low-rank 4 and full-width 48 outputs (104), x1 = 48 (the second
    layer's input), the top's input x2 = 48 and outputs 8 + 1: 329 floats."""
    m = model(2).model_copy(update={"interaction": "dcnv2", "dcn_layers": 2, "dcn_low_rank": 4})
    assert dense_activation_bytes(m) == 4 * (8 + 16 + 48 + 2 * (4 + 48) + 48 + 48 + 8 + 1)


def test_the_exchange_waits_for_the_busiest_rank():
    m, sys2 = model(2), system(2)
    stacked = {"t0": Shard("table_wise", (0,)), "t1": Shard("table_wise", (0,))}
    spread = {"t0": Shard("table_wise", (0,)), "t1": Shard("table_wise", (1,))}
    none = no_overheads()  # host time would split the lookups at their launches
    a, b = dlrm_step(m, sys2, stacked, 64, host_overheads=none), dlrm_step(m, sys2, spread, 64, host_overheads=none)
    assert b.step_time_s < a.step_time_s  # rank 0 holding both tables sets everyone's pace

    def lookups_s(step):  # each rank's embedding forward
        g = step.graph
        return [float(g.duration_s[t]) for t in range(g.num_tasks) if g.names[g.name[t]] == "embedding_fwd"]

    assert lookups_s(b)[0] == lookups_s(b)[1] > 0 and lookups_s(a)[1] == 0
    assert lookups_s(a)[0] == pytest.approx(2 * lookups_s(b)[0])


def test_the_indices_go_to_their_owners_first():
    """TorchRec's input distribution: an owner receives its shards' int64 indices and an int32 length
    per bag, the busiest rank sets the all-to-all. 2 ranks × 64 samples, 4 lookups a sample."""
    m, sys2 = model(2), system(2)
    costs = AnalyticCostModel(sys2, "fp32")
    group = place_group(2, 1, 2)

    def index_exchange_s(step):
        g = step.graph
        return {float(g.duration_s[t]) for t in range(g.num_tasks) if g.names[g.name[t]] == "index_exchange"}

    stacked = {"t0": Shard("table_wise", (0,)), "t1": Shard("table_wise", (0,))}
    # rank 0 owns both tables: 2 × (512 indices × 8 + 128 bags × 4) bytes; rank 1 nothing
    assert index_exchange_s(dlrm_step(m, sys2, stacked, 64)) == {costs.collective_s("alltoall", 9216.0, group)}
    # row-wise over both ranks: each holds half of each table's lookups, for all 128 bags
    rows = {"t0": Shard("row_wise", (0, 1)), "t1": Shard("row_wise", (0, 1))}
    half = 2 * (256 * 8 + 128 * 4)
    assert index_exchange_s(dlrm_step(m, sys2, rows, 64)) == {costs.collective_s("alltoall", float(half), group)}
    # replicas read their own indices; and an owner that already holds them receives nothing
    replicas = {"t0": Shard("data_parallel", (0, 1)), "t1": Shard("data_parallel", (0, 1))}
    assert index_exchange_s(dlrm_step(m, sys2, replicas, 64)) == {0.0}
    local = m.model_copy(update={"input_distribution": False})
    assert index_exchange_s(dlrm_step(local, sys2, stacked, 64)) == {0.0}


def test_exhaustive_planning_on_a_small_case_puts_equal_tables_apart():
    result = plan_sharding(model(2), system(2), 64)
    assert result.method == "exhaustive"
    # 5 candidates a table (table-wise on 0, on 1, row-wise, data-parallel, column-wise over both), 25 pairs; swapping
    # the ranks fixes the 3 × 3 pairs without a table-wise shard and pairs the other 16: 9 + 16 / 2 = 17 distinct
    assert len(candidate_shards(TABLE, 2)) == 5 and result.evaluated == len(result.plans) == 17
    placed = [tuple((s.strategy, s.ranks) for s in plan.values()) for plan, _ in result.plans]
    assert (("table_wise", (0,)), ("table_wise", (1,))) in placed
    assert (("table_wise", (1,)), ("table_wise", (0,))) not in placed  # the same step, ranks swapped
    best, step = result.plans[0]
    assert step.fits and step.step_time_s == min(s.step_time_s for _, s in result.plans)
    # the stacked table-wise plans are never the best
    assert not (best["t0"].strategy == best["t1"].strategy == "table_wise" and best["t0"].ranks == best["t1"].ranks)


def test_candidates_equal_under_a_rank_permutation_are_priced_once():
    """4 ranks, table `a` table-wise on rank 0, a 16-wide table: table-wise on rank 1 = on 2 = on 3
    (empty ranks), so rank 1 stands for them; column-wise over (0, 1) differs from over (2, 3), which
    holds no load; row-wise, data-parallel and the 4-rank column block stay (7 of 10)."""
    chosen = {"a": Shard("table_wise", (0,))}
    kept = distinct_candidates(candidate_shards(TABLE, 4), chosen, 4)
    assert [(s.strategy, s.ranks) for s in kept] == [
        ("table_wise", (0,)),
        ("table_wise", (1,)),
        ("row_wise", (0, 1, 2, 3)),
        ("data_parallel", (0, 1, 2, 3)),
        ("column_wise", (0, 1)),
        ("column_wise", (2, 3)),
        ("column_wise", (0, 1, 2, 3)),
    ]
    # two tables on ranks 0 and 1 load them differently (the tables may differ): neither stands for the other
    two = {"a": Shard("table_wise", (0,)), "b": Shard("table_wise", (1,))}
    kept = distinct_candidates(candidate_shards(TABLE, 4), two, 4)
    assert [s.ranks for s in kept if s.strategy == "table_wise"] == [(0,), (1,), (2,)]
    # a table split over all 4 ranks loads them alike: one table-wise rank and one 2-rank block stand for all
    kept = distinct_candidates(candidate_shards(TABLE, 4), {"a": Shard("column_wise", (0, 1, 2, 3))}, 4)
    assert [(s.strategy, s.ranks) for s in kept] == [
        ("table_wise", (0,)),
        ("row_wise", (0, 1, 2, 3)),
        ("data_parallel", (0, 1, 2, 3)),
        ("column_wise", (0, 1)),
        ("column_wise", (0, 1, 2, 3)),
    ]


def test_the_greedy_planner_prices_one_rank_of_equals_and_chooses_as_if_it_priced_all(monkeypatch):
    """Six tables on 8 ranks (greedy: 11 candidates a table): the plan and its step are those of the
    planner that prices every candidate, with fewer plans priced."""
    fast = plan_sharding(model(6), system(8), 64, exhaustive_limit=1)
    monkeypatch.setattr("itercast.workloads.dlrm.sharding.distinct_candidates", lambda shards, chosen, world: shards)
    full = plan_sharding(model(6), system(8), 64, exhaustive_limit=1)
    assert fast.method == full.method == "greedy"
    assert fast.plans[0][0] == full.plans[0][0]
    assert fast.plans[0][1].step_time_s == full.plans[0][1].step_time_s
    # the full planner prices 17 candidates for each of the 6 tables, screens its 5 × 3 tail plans (the first 1 … 5
    # tables as chosen, the rest table-wise round-robin, row-wise or data-parallel), then prices its choice, the
    # fastest tail plan and the uniform plans it is not: here the choice is one table per rank (t0 on 0 … t5 on 5),
    # the round-robin plan itself, so the row-wise and data-parallel plans are the 2 others: 6 × 17 + 15 + 1 + 1 + 2
    assert fast.plans[0][0] == {f"t{i}": Shard("table_wise", (i,)) for i in range(6)}
    assert len(full.plans) == 4
    assert fast.evaluated < full.evaluated == 6 * len(candidate_shards(TABLE, 8)) + 15 + 4


def test_the_greedy_planner_tries_the_small_tables_together():
    """User probe 12: one 200M-row table and ten of 100 rows on 8 ranks. Placed one at a time, each small table is
    cheaper row-wise than as the first table-wise one (a whole new pooled all-to-all); together table-wise they share
    the exchange and the table-batched lookups. tail_plans keeps the huge table's choice and tries the ten together."""
    from itercast.workloads.dlrm.sharding import tail_plans

    tables = [EmbeddingTable(name="huge", num_rows=200_000_000, embedding_dim=128, pooling_factor=20)]
    tables += [EmbeddingTable(name=f"s{i}", num_rows=100, embedding_dim=128, pooling_factor=1) for i in range(10)]
    order = [tables[0], *tables[1:]]
    chosen = {t.name: Shard("row_wise", tuple(range(8))) for t in tables}
    tails = tail_plans(order, chosen, 8)
    assert len(tails) == 10 * 3  # the first 1 … 10 tables kept, the rest three ways
    assert {n: s.strategy for n, s in tails[0].items()} == {"huge": "row_wise"} | {
        f"s{i}": "table_wise" for i in range(10)
    }
    assert [tails[0][f"s{i}"].ranks for i in range(10)] == [(i % 8,) for i in range(10)]
    m = DLRMConfig(dense_features=13, bottom_mlp=(256, 128), top_mlp=(64, 1), tables=tuple(tables))
    h100 = parse_section("system", {"preset": "dgx-h100"})
    best = plan_sharding(m, h100, 4096).plans[0][0]
    assert best["huge"].strategy == "row_wise" and all(best[f"s{i}"].strategy == "table_wise" for i in range(10))


def test_the_planners_step_holds_one_rank_of_each_load_and_prices_the_same_step():
    """4 ranks on 2 nodes of 2: t0 table-wise on rank 0, t1 column-wise over ranks 2 and 3, t2 row-wise:
    ranks 0, 1 and 2 carry distinct loads, rank 3 the load of rank 2. The planner's graph holds ranks 0,
    1 and 2 and prices the step of the graph of all four, as it does for plans of other loads."""
    two_nodes = parse_section("system", {**SYSTEM, "node": {**SYSTEM["node"], "gpus_per_node": 2}, "num_nodes": 2})
    m = model(3)
    plans = [
        {"t0": Shard("table_wise", (0,)), "t1": Shard("column_wise", (2, 3)), "t2": Shard("row_wise", (0, 1, 2, 3))},
        {"t0": Shard("table_wise", (3,)), "t1": Shard("table_wise", (3,)), "t2": Shard("data_parallel", (0, 1, 2, 3))},
    ]
    for plan, held in zip(plans, [{0, 1, 2}, {0, 3}], strict=True):
        full = dlrm_step(m, two_nodes, plan, 64)
        some = dlrm_step(m, two_nodes, plan, 64, every_rank=False)
        assert set(some.graph.resource_rank.tolist()) == held and set(full.graph.resource_rank.tolist()) == {0, 1, 2, 3}
        assert some.step_time_s == pytest.approx(full.step_time_s, rel=1e-12)
        assert some.memory_per_rank_bytes == full.memory_per_rank_bytes


def test_tables_must_match_the_bottom_mlp():
    with pytest.raises(ValueError, match="embedding_dim must equal the bottom MLP's output"):
        DLRMConfig(dense_features=8, bottom_mlp=(32,), top_mlp=(1,), tables=(TABLE,))


def test_shard_command_json_and_errors():
    res = CliRunner().invoke(app, ["shard", "--model", "dlrm-small", "--system", "dgx-h100", "--top", "2", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)  # stderr: what the prices rest on (unmeasured_embedding_ops)
    assert out["world_size"] == 8 and len(out["plans"]) == 2
    # the throughput `search` gives, which reports and compare read: 8 GPUs × 4,096 samples a step over its time
    assert out["batch_per_rank"] == 4096
    assert all(p["samples_per_s"] == pytest.approx(8 * 4096 / p["step_time_s"], rel=1e-12) for p in out["plans"])
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
    out = json.loads(res.stdout)
    assert out["method"] == "given" and [t["strategy"] for t in out["plans"][0]["tables"]] == [
        "table_wise", "row_wise", "column_wise", "data_parallel"
    ]  # fmt: skip
    m = model(1)
    assert check_sharding(m, {"t0": Shard("column_wise", (0, 1, 2))}, 4) == [
        "table 't0': embedding_dim 16 not divisible by its 3 column-wise ranks"
    ]
    assert check_sharding(m, {"t0": Shard("row_wise", (0, 1))}, 4) == ["table 't0': row_wise spans every rank 0..3"]
    # TorchRec's column_wise(ranks) may reuse a rank; priced one shard a rank, it is refused (user probe 12)
    assert check_sharding(m, {"t0": Shard("column_wise", (0, 0, 1, 1))}, 4) == [
        "table 't0': column_wise on ranks [0, 0, 1, 1] puts several shards on rank(s) [0, 1], which itercast does not "
        "price (one column shard a rank): give each shard its own rank"
    ]


def linear_operators() -> OperatorCostModel:
    """Operator models with round coefficients: a lookup costs 1 µs + 1 ns per gathered byte + 2 ns
    per distinct byte beyond the cache (tables ≥ 1 MB); the update 3 ns per distinct byte and 4 ns
    more for tables of ≥ 1 MB; GEMMs FLOPs / 1e9, 2× for layout nt, 3× for tn, bmm 5×."""
    shape = {
        "alpha_s": 0.0,
        "rate_flops_per_s": 1e9,
        "gamma": 1.0,
        **dict.fromkeys(("half_m", "half_n", "half_k"), 0.0),
    }
    lookup = {"form": "lookup", "cache_bytes": 1 << 20, "alpha_s": 1e-6, "s_per_lookup": 0.0}
    return OperatorCostModel(
        {
            "models": {
                "aten::_embedding_bag:embedding_bag_fwd": lookup
                | {"s_per_gathered_byte": 1e-9, "s_per_missed_byte": 2e-9},
                "itercast::rowwise_adagrad_update:embedding_bag_update": lookup
                | {
                    "alpha_s": 0.0,
                    "s_per_gathered_byte": 0.0,
                    "s_per_distinct_byte": 3e-9,
                    "s_per_distinct_byte_if_large": 4e-9,
                },
                "aten::mm:gemm": shape | {"layout_factor": {"nt": 2.0, "tn": 3.0}},
                "aten::bmm:gemm": shape | {"rate_flops_per_s": 2e8, "layout_factor": {}},
            }
        }
    )


def test_calibrated_lookup_and_update_use_the_operator_models():
    costs, ops = AnalyticCostModel(system(1), "fp32", linear_calibration()), linear_operators()
    big = TABLE.model_copy(update={"num_rows": 100_000})  # 6.4 MB: beyond the 1 MB cache
    work = shard_work(big, Shard("table_wise", (0,)), 0, 1, 8)  # 32 lookups of 16 floats, 8 bags
    fwd, bwd = embedding_seconds(costs, big, work, ops)
    distinct = unique_fraction_uniform(100_000, 32) * 32
    gathered = 32 * 16 * 4
    assert fwd == pytest.approx(1e-6 + gathered * 1e-9 + distinct * 16 * 4 * 2e-9)
    # backward: pooled gradients read, each lookup's gradient row written (memory), then the update
    assert bwd == pytest.approx((8 * 16 * 4 + gathered) / HBM + distinct * 16 * 4 * (3e-9 + 4e-9))
    small_fwd, small_bwd = embedding_seconds(costs, TABLE, shard_work(TABLE, Shard("table_wise", (0,)), 0, 1, 8), ops)
    small_distinct = unique_fraction_uniform(1000, 32) * 32
    assert small_fwd == pytest.approx(1e-6 + gathered * 1e-9)  # 64 kB: in cache, no missed bytes
    assert small_bwd == pytest.approx((8 * 16 * 4 + gathered) / HBM + small_distinct * 16 * 4 * 3e-9)


def test_a_lookup_is_priced_by_its_bags_pooling():
    """Only the bag terms: 0.1 µs per lookup of a bag (a GPU's chain of dependent loads) and 0.5 ns
    per byte of pooled output."""
    fit = {"form": "lookup", "cache_bytes": 1 << 20, "alpha_s": 0.0, "s_per_pooling": 1e-7, "s_per_pooled_byte": 5e-10}
    ops = OperatorCostModel({"models": {"aten::_embedding_bag:embedding_bag_fwd": fit}})
    costs = AnalyticCostModel(system(1), "fp32", linear_calibration())
    whole = shard_work(TABLE, Shard("table_wise", (0,)), 0, 4, 2)  # 8 bags of 4 lookups
    assert embedding_seconds(costs, TABLE, whole, ops)[0] == pytest.approx(4e-7 + 8 * 16 * 4 * 5e-10)
    # a row-wise shard of 4: the same 8 bags (partial sums), 1 lookup each
    rows = shard_work(TABLE, Shard("row_wise", (0, 1, 2, 3)), 0, 4, 2)
    assert embedding_seconds(costs, TABLE, rows, ops)[0] == pytest.approx(1e-7 + 8 * 16 * 4 * 5e-10)


def test_a_replica_zeroes_its_dense_gradient_and_is_updated_whole():
    costs = AnalyticCostModel(system(1), "fp32", linear_calibration())
    work = shard_work(TABLE, Shard("data_parallel", (0, 1)), 0, 2, 8)  # the local 8 samples: 32 lookups
    _, bwd = embedding_seconds(costs, TABLE, work)
    distinct = unique_fraction_uniform(1000, 32) * 32
    # the 8 pooled gradients read, the 32 lookups' gradient rows written (index) and read back
    # (index_add_), the 1,000-row gradient zeroed, the distinct rows read and written
    assert bwd == pytest.approx((8 * 16 * 4 + 2 * 32 * 16 * 4 + (1000 + 2 * distinct) * 16 * 4) / HBM)
    # per row: the gradient read twice (norm, addcmul_), the row read and written (4 × 16 × 4 bytes);
    # the per-row chain's fp32 accesses: norm out 1, pow_ 2, div_ 2, state += 3, sqrt 2, + ε 2,
    # reciprocal 2, mul 2, the scale read 1 = 17 (× 4 bytes)
    assert replica_update_bytes(TABLE) == 1000 * (4 * 16 * 4 + 17 * 4)


def test_mlp_gemms_on_the_operator_models():
    costs = AnalyticCostModel(system(1), "fp32", linear_calibration())
    act = 2 * 8 * 32 * 4 / HBM  # ReLU output of 8 rows × 32 written and read
    flops = 2 * 8 * 16 * 32
    assert mlp_seconds(costs, None, 8, [(16, 32)]) == pytest.approx((flops / PEAK + act, 2 * (flops / PEAK + act)))
    fwd, bwd = mlp_seconds(costs, linear_operators(), 8, [(16, 32)])
    assert fwd == pytest.approx(flops / 1e9 * 2 + act)  # x·Wᵀ: layout nt
    assert bwd == pytest.approx(flops / 1e9 * (1 + 3) + act)  # g·W (nn) and gᵀ·x (tn)
    # the layer as the bottom MLP's first (its input needs no gradient: no g·W) and as the top MLP's
    # last (the logit: no ReLU, no activation written or read)
    fwd, bwd = mlp_seconds(costs, linear_operators(), 8, [(16, 32)], input_grad=False, last_relu=False)
    assert (fwd, bwd) == pytest.approx((flops / 1e9 * 2, flops / 1e9 * 3))  # x·Wᵀ (nt); gᵀ·x (tn) alone


def test_rowwise_adagrad_update_by_hand():
    torch = pytest.importorskip("torch")
    from itercast.profile.microbench import rowwise_adagrad_update

    weight, state = torch.zeros(4, 2), torch.zeros(4)
    idx = torch.tensor([1, 3, 1])
    grads = torch.tensor([[1.0, 1.0], [2.0, 0.0], [1.0, 1.0]])
    rowwise_adagrad_update(weight, state, idx, grads, lr=0.5)
    # row 1: gradient (2, 2), state 4, step 0.5 · 2 / 2; row 3: (2, 0), state 2, step 0.5 · 2 / √2
    assert state.tolist() == pytest.approx([0, 4, 0, 2])
    assert weight.flatten().tolist() == pytest.approx([0, 0, -0.5, -0.5, 0, 0, -0.5 * 2 / 2**0.5, 0], abs=1e-6)


def test_shard_takes_system_overrides_and_a_calibration(tmp_path):
    args = ["shard", "--model", "dlrm-small", "--system", "cpu-host", "--batch-per-rank", "64", "--json"]
    one = json.loads(CliRunner().invoke(app, args).stdout)  # stderr: the streamed-lookups warning
    two = CliRunner().invoke(app, [*args, "--set", "system.node.gpus_per_node=2"])
    assert two.exit_code == 0, two.output
    assert (one["world_size"], json.loads(two.stdout)["world_size"]) == (1, 2)
    bad = CliRunner().invoke(app, [*args, "--set", "plan.tensor_parallel=2"])
    assert bad.exit_code == 2 and "shard takes the plan's batch as --batch-per-rank" in bad.output
    # a model field: 2 ranks whose indices need no distribution are as fast or faster
    two_args = [*args, "--set", "system.node.gpus_per_node=2"]
    local = CliRunner().invoke(app, [*two_args, "--set", "model.input_distribution=false"])
    assert local.exit_code == 0, local.output
    best = json.loads(two.stdout)["plans"][0]["step_time_s"]
    assert json.loads(local.stdout)["plans"][0]["step_time_s"] <= best
    wrong = CliRunner().invoke(app, [*args, "--set", "model.input_distribution=maybe"])
    assert wrong.exit_code == 2 and "--set model.input_distribution" in wrong.output
    missing = CliRunner().invoke(app, [*args, "--calibration", str(tmp_path / "none.json")])
    assert missing.exit_code == 2 and "none.json" in missing.output


def test_an_index_sample_sets_the_distinct_rows(tmp_path):
    import numpy as np

    from itercast.workloads.dlrm import load_index_sample

    costs = AnalyticCostModel(system(1), "fp32", linear_calibration())
    sample = tmp_path / "t.txt"
    sample.write_text("7, 7, 7, 7\n9\n")  # one row drawn 4 times in 5, another once
    counts = load_index_sample(sample, TABLE)
    assert (counts.rows.tolist(), counts.counts.tolist()) == ([7, 9], [4, 1])
    work = shard_work(TABLE, Shard("table_wise", (0,)), 0, 1, 8)  # 32 lookups
    distinct = 2 - 0.2**32 - 0.8**32  # each row's chance of being drawn at least once
    _, bwd = embedding_seconds(costs, TABLE, work, counts=counts)
    assert bwd == pytest.approx((8 * 16 * 4 + 32 * 16 * 4 + distinct * 2 * (16 * 4 + 4)) / HBM)
    # row-wise over 4 ranks, blocks of 250 rows: rows 7 and 9 are both rank 0's (TorchRec sends each index to its
    # row's block), so rank 0 serves all 32 lookups of 8 samples, with the same distinct rows (user probe 12)
    rw = shard_work(TABLE, Shard("row_wise", (0, 1, 2, 3)), 0, 4, 2, counts)
    assert rw is not None and rw.lookups == 32
    _, rw_bwd = embedding_seconds(costs, TABLE, rw, counts=counts)
    assert rw_bwd == pytest.approx((8 * 16 * 4 + 32 * 16 * 4 + distinct * 2 * (16 * 4 + 4)) / HBM)
    # rows 600 and 700 both in the third block (500-749): that rank serves all 32
    third = tmp_path / "third.txt"
    third.write_text("600 600 700")
    late = shard_work(TABLE, Shard("row_wise", (0, 1, 2, 3)), 0, 4, 2, load_index_sample(third, TABLE))
    assert late is not None and late.lookups == 32
    # rows 7, 7, 7 and 300: the first block serves 3/4 (24 lookups), all of them to row 7: its own rows alone
    mixed_file = tmp_path / "mixed.txt"
    mixed_file.write_text("7 7 7 300")
    mixed = load_index_sample(mixed_file, TABLE)
    busy = shard_work(TABLE, Shard("row_wise", (0, 1, 2, 3)), 0, 4, 2, mixed)
    assert busy is not None and busy.lookups == 24
    assert index_stats(TABLE, busy, mixed).hot_fraction == 1.0
    # and the busiest rank holds its 24 lookups' int64 indices, where uniform draws give it 8: 16 × 8 bytes more
    rw_plan = {"t0": Shard("row_wise", (0, 1, 2, 3))}
    one = model(1)
    with_sample = memory_parts_per_rank(one, rw_plan, 4, 2, {"t0": mixed})[0]["activations"]
    assert with_sample - memory_parts_per_rank(one, rw_plan, 4, 2)[0]["activations"] == 16 * 8
    # rows 0, 250, 500 and 750 fall one in each block: 8 of the 32 lookups on each rank
    spread = tmp_path / "s.txt"
    spread.write_text("0 250 500 750")
    one_each = shard_work(TABLE, Shard("row_wise", (0, 1, 2, 3)), 0, 4, 2, load_index_sample(spread, TABLE))
    assert one_each is not None and one_each.lookups == 8
    # the most frequent row takes 4/5 of the lookups, on the table and on rank 0's block alike; with Zipf α = 1
    # over 1000 rows, p_1 = 1 / H_1000
    assert index_stats(TABLE, work, counts).hot_fraction == pytest.approx(0.8)
    assert index_stats(TABLE, rw, counts).hot_fraction == pytest.approx(0.8)
    zipf = TABLE.model_copy(update={"zipf_alpha": 1.0})
    rw_named = shard_work(TABLE, Shard("row_wise", (0, 1, 2, 3)), 0, 4, 2)  # uniform: 8 of the 32 lookups
    assert rw_named is not None
    harmonic = sum(1 / r for r in range(1, 1001))
    assert index_stats(zipf, rw_named).hot_fraction == pytest.approx(4 / harmonic)
    assert index_stats(zipf, work).hot_fraction == pytest.approx(1 / harmonic)
    # and its distinct rows are 1/4 of the table's among all 32 lookups, the rows spread at random over
    # the shards: each row i drawn at least once with 1 - (1 - p_i)^32, p_i = (1/i) / H_1000
    p_i = np.array([1 / r for r in range(1, 1001)]) / harmonic
    table_distinct = float(np.sum(1 - (1 - p_i) ** 32))
    assert index_stats(zipf, rw_named).unique_fraction * rw_named.lookups == pytest.approx(table_distinct / 4, rel=0.01)
    np.save(tmp_path / "big.npy", np.array([0, 999, 1000]))
    with pytest.raises(
        ValueError, match=r"indices 0\.\.1000; the table has rows 0\.\.999 \(the file of another table\?\)"
    ):
        load_index_sample(tmp_path / "big.npy", TABLE)
    np.save(tmp_path / "f.npy", np.array([0.5]))
    with pytest.raises(ValueError, match="expected integer indices; got dtype float64"):
        load_index_sample(tmp_path / "f.npy", TABLE)
    (tmp_path / "w.txt").write_text("1 two 3")
    with pytest.raises(ValueError, match="expected integers"):
        load_index_sample(tmp_path / "w.txt", TABLE)
    (tmp_path / "huge.txt").write_text("1 99999999999999999999")  # once an OverflowError traceback
    with pytest.raises(ValueError, match=r"expected integer indices within int64 \(< 2\*\*63\); got a larger one"):
        load_index_sample(tmp_path / "huge.txt", TABLE)


def test_a_text_index_file_is_read_block_by_block_in_bounded_memory(tmp_path, monkeypatch):
    import tracemalloc

    from itercast.workloads.dlrm import embedding

    # blocks of 7 bytes cut "1 22,333\n4444 55555, 6 7" inside 333, 55555 and after ", ": carried whole
    monkeypatch.setattr(embedding, "TEXT_BLOCK_BYTES", 7)
    (tmp_path / "a.txt").write_text("1 22,333\n4444 55555, 6 7\n")
    assert embedding.read_index_sequence(tmp_path / "a.txt", "a").tolist() == [1, 22, 333, 4444, 55555, 6, 7]
    (tmp_path / "long.txt").write_text("1 " + "9" * 100)
    with pytest.raises(ValueError, match="characters without a separator, not an integer"):  # carried: 68
        embedding.read_index_sequence(tmp_path / "long.txt", "long")
    # 262,144 indices of 8 bytes each ("1234567 "): 2 MiB of text, 2 MiB as int64. Split whole (the text,
    # its copy and a Python string a token) the peak was 18.2 MiB under tracemalloc; by 64 KiB blocks it
    # is the blocks' arrays and their concatenation (2 + 2 MiB) and one block's tokens: 4.0 MiB
    monkeypatch.setattr(embedding, "TEXT_BLOCK_BYTES", 1 << 16)
    (tmp_path / "big.txt").write_text("1234567 " * (1 << 18))
    tracemalloc.start()
    idx = embedding.read_index_sequence(tmp_path / "big.txt", "big")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert idx.shape == (1 << 18,) and int(idx.sum()) == 1234567 * (1 << 18)
    assert peak < 3 * (2 << 20)


def test_shard_reads_index_samples_and_names_bad_ones(tmp_path):
    (tmp_path / "t0.txt").write_text("1 2 3 4\n")
    args = ["shard", "--model", "dlrm-small", "--system", "dgx-h100", "--top", "1", "--json"]
    ok = CliRunner().invoke(app, [*args, "--indices", f"t0={tmp_path / 't0.txt'}"])
    assert ok.exit_code == 0, ok.output
    (tmp_path / "wrong.txt").write_text("5 999999\n")  # t3 has 1,000 rows
    wrong = CliRunner().invoke(app, [*args, "--indices", f"t3={tmp_path / 'wrong.txt'}"])
    assert wrong.exit_code == 2 and "the file of another table?" in wrong.output
    unknown = CliRunner().invoke(app, [*args, "--indices", f"t9={tmp_path / 't0.txt'}"])
    assert unknown.exit_code == 2 and "has no table 't9'" in unknown.output


def test_predict_prices_a_dlrm_step_with_its_breakdown(tmp_path):
    given = tmp_path / "s.yaml"
    given.write_text("".join(f"t{i}: {{strategy: table_wise, ranks: [{i % 2}]}}\n" for i in range(4)))
    job = tmp_path / "job.yaml"  # the same sharding as the job's plan
    sharding = ", ".join(f"t{i}: {{strategy: table_wise, ranks: [{i % 2}]}}" for i in range(4))
    job.write_text(
        "model: dlrm-small\nsystem: {preset: cpu-host, node: {gpus_per_node: 2}}\n"
        f"plan: {{batch_per_rank: 64, sharding: {{{sharding}}}}}\n"
    )
    res = CliRunner().invoke(app, ["predict", str(job), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["sharding_from"] == "plan" and out["job"]["system"]["node"]["gpus_per_node"] == 2
    parts = {k: v for k, v in out["breakdown"].items() if k != "rank"}
    assert sum(parts.values()) == pytest.approx(out["step_time_s"])  # the step by cause adds up
    assert out["critical_path"][-1]["family"] == "optimizer"
    args = ["--model", "dlrm-small", "--system", "cpu-host", "--set", "system.node.gpus_per_node=2"]
    rest = ["--sharding", str(given), "--batch-per-rank", "64", "--json"]
    shard = CliRunner().invoke(app, ["shard", *args, *rest])
    assert json.loads(shard.stdout)["plans"][0]["step_time_s"] == out["step_time_s"]  # one model for both


@pytest.mark.parametrize(("exchange", "p2p"), [("torchrec", 0), ("point_to_point", 1)])
def test_dense_gradients_pass_through_ddp_buckets_or_one_buffer(exchange: str, p2p: int):
    """Both tables data-parallel on 2 ranks: the MLPs' and tables' gradients, (8·16 + 16 + 19·8 + 8 +
    8 + 1 = 313 parameters (the top MLP reads 3 pairwise dots and the 16-wide dense vector) + 2 ×
    1000 × 16) × 4 bytes, read and written into DDP's buckets, divided as they are copied (2× the
    bytes), nothing copied back (TorchRec's DDP, gradient_as_bucket_view=True: the gradients are the
    buckets); or, as tools/measure_dlrm_sharding.py ShardedDLRM.step runs them (exchange
    point_to_point), into one buffer (2×), the buffer divided in place after the all-reduce (2×) and
    the MLPs' 313 gradients copied back (2 × 313 × 4); on the linear memory curve; one rank exchanges
    none."""
    m = model(2).model_copy(update={"exchange": exchange})
    replicas = {"t0": Shard("data_parallel", (0, 1)), "t1": Shard("data_parallel", (0, 1))}
    dense = (m.mlp_params() + 2 * 1000 * 16) * 4
    assert m.mlp_params() == 8 * 16 + 16 + (3 + 16) * 8 + 8 + 8 * 1 + 1

    def seconds(step, name):
        g = step.graph
        return [float(g.duration_s[t]) for t in range(g.num_tasks) if g.names[g.name[t]] == name]

    step = dlrm_step(m, system(2), replicas, 64, linear_calibration(), host_overheads=no_overheads())
    assert seconds(step, "ddp_to_buckets") == pytest.approx([2 * dense / HBM] * 2)
    assert seconds(step, "ddp_from_buckets") == pytest.approx([p2p * (2 * dense + 2 * 313 * 4) / HBM] * 2)
    one = {"t0": Shard("data_parallel", (0,)), "t1": Shard("data_parallel", (0,))}
    alone = dlrm_step(m, system(1), one, 64, host_overheads=no_overheads())
    assert seconds(alone, "ddp_to_buckets") == seconds(alone, "ddp_from_buckets") == [0.0]


def test_a_shard_beyond_the_profiled_lookups_is_reported():
    """dlrm-style tables of pooling 4 on 2 ranks: a table-wise owner looks up 4 × 64 × 2 = 512 rows
    per call at 64 samples a rank, 4,096 at 512. Profiled up to 1,000: the first is within 2×, the
    second 4.1× beyond; a calibration without the record is not checked."""
    from itercast.workloads.dlrm import beyond_profile

    cal = {"operators": {"models": {"itercast::rowwise_adagrad_update:embedding_bag_update": {"max_lookups": 1000.0}}}}
    assert beyond_profile(model(2), 2, 64, cal) == ""
    note = beyond_profile(model(2), 2, 512, cal)
    assert "a table-wise owner of t0 looks up 4,096 rows per call, 4.1× the largest call" in note and "(1,000)" in note
    # under a plan, its busiest shard's call: t0 row-wise over the 2 ranks serves half of them (uniform rows):
    # 4 × 256 × 2 / 2 = 1,024 within 2 × 1,000; at 2,048 samples 8,192
    rows = {t.name: Shard("row_wise", (0, 1)) for t in model(2).tables}
    assert beyond_profile(model(2), 2, 256, cal, plan=rows) == ""
    assert "t0's row-wise shard looks up 8,192 rows per call" in beyond_profile(model(2), 2, 2048, cal, plan=rows)
    assert beyond_profile(model(2), 2, 512, {"operators": {"models": {"aten::mm:gemm": {}}}}) == ""
    assert beyond_profile(model(2), 2, 512, None) == ""


def test_predict_says_what_shard_says_of_lookups_beyond_the_profile():
    """dlrm-dcnv2-criteo on one DGX H100 at 8,192 samples a rank: the planner's t20 (100 lookups a bag), split
    column-wise, looks up 100 × 8,192 × 8 = 6,553,600 rows a call on each of its ranks, beyond twice the built-in H100
    lookup model's largest call: the plan priced is named, in predict as in shard (user probe 12)."""
    args = ["--model", "dlrm-dcnv2-criteo", "--system", "dgx-h100"]
    said = "t20's column-wise shard looks up 6,553,600 rows per call"
    shard = CliRunner().invoke(app, ["shard", *args, "--batch-per-rank", "8192"])
    predict = CliRunner().invoke(app, ["predict", *args, "--set", "plan.batch_per_rank=8192"])
    assert shard.exit_code == predict.exit_code == 0, predict.output
    assert said in shard.stderr and said in predict.stderr


def test_shard_refuses_two_node_counts_that_disagree():
    res = CliRunner().invoke(app, ["shard", "--model", "dlrm-small", "--nodes", "2", "--set", "system.num_nodes=4"])
    assert res.exit_code == 2 and "--nodes 2 and --set system.num_nodes=4 disagree" in res.output


def test_a_dlrm_search_refuses_a_transformer_searchs_options_and_names_its_batches():
    args = ["search", "--model", "dlrm-small", "--system", "dgx-h100", "--batches", "1024"]
    res = CliRunner().invoke(app, [*args, "--num-nodes-range", "2:3", "--objective", "tokens-per-s"])
    assert res.exit_code == 2
    assert "--num-nodes-range, --objective tokens-per-s/gpu-hours-per-token: a transformer search" in res.output
    # a sampled step's objective is a DLRM's too: its plans with their p99 and deterministic rank
    res = CliRunner().invoke(app, [*args, "--top", "2", "--objective", "p99", "--samples", "200", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["distribution"]["objective"] == "p99" and {p["deterministic_rank"] for p in doc["plans"]} <= {1, 2, 3, 4}
    assert all(p["distribution"]["p99_s"] >= p["distribution"]["p50_s"] for p in doc["plans"])
    res = CliRunner().invoke(app, [*args, "--top", "1"])
    assert res.exit_code == 0 and "dlrm-small on 8 GPUs, 1024 samples per GPU:" in res.output


def test_the_greedy_planner_prices_and_lists_each_plan_once():
    # dlrm-small on 8 A100: the greedy choice is the uniform table-wise round robin (t0..t3 on ranks
    # 0..3); it used to be priced and listed twice
    out = CliRunner().invoke(app, ["shard", "--model", "dlrm-small", "--system", "dgx-a100", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    shardings = [json.dumps(p["tables"], sort_keys=True) for p in doc["plans"]]
    assert doc["method"] == "greedy" and len(shardings) == len(set(shardings)) == 3
