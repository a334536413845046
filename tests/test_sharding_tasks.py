"""tools/measure_sharding_tasks.py: the seeded task draw (deterministic, within the Criteo statistics)
and the baseline sharders on cases worked by hand (nothing is measured, no torch process)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from measure_sharding_tasks import (
    Task,
    all_row_wise,
    decode,
    dp_small,
    draw_tasks,
    encode,
    greedy_lookups,
    greedy_size,
    proposals,
)

from itercast.workloads.dlrm import DLRMConfig, EmbeddingTable, Shard

TW0, TW1 = Shard("table_wise", (0,)), Shard("table_wise", (1,))
RW, DP = Shard("row_wise", (0, 1)), Shard("data_parallel", (0, 1))


def test_the_draw_is_deterministic_and_pinned():
    # random.Random(29): randint(4, 6) = 6 tables, sample → features 2, 9, 11, 19, 23, 25 (sorted),
    # then choice(16, 32, 64) = 64, choice(256, 1024) = 1024, choice(0, 1.05) = 1.05; the measured
    # CSV's task 0 (data/measured/cpu_sharding_tasks.csv), so a change of the draw order shows here
    assert draw_tasks(1, 29) == [Task((2, 9, 11, 19, 23, 25), 64, 1024, 1.05)]
    assert draw_tasks(20, 29) == draw_tasks(20, 29)
    assert draw_tasks(3, 29)[0] == draw_tasks(1, 29)[0]  # a longer draw starts with the same tasks


def test_drawn_tasks_stay_within_the_statistics():
    for task in draw_tasks(200, 7):
        assert 4 <= len(task.features) <= 6
        assert len(set(task.features)) == len(task.features)
        assert all(0 <= f <= 25 for f in task.features)
        assert task.dim in (16, 32, 64) and task.batch_per_rank in (256, 1024) and task.zipf_alpha in (0.0, 1.05)


def test_a_tasks_tables_cap_rows_and_keep_pooling():
    # Criteo feature 0: 40,000,000 rows → capped at 1,000,000; feature 2: 17,295 rows kept;
    # feature 20: multi-hot size 100 (MLPerf DLRM v2's largest), kept as the pooling factor
    model = Task((0, 2, 20, 25), 32, 256, 1.05).model()
    assert [t.num_rows for t in model.tables] == [1_000_000, 17_295, 1_000_000, 36]
    assert [t.pooling_factor for t in model.tables] == [3, 1, 100, 1]
    assert {t.embedding_dim for t in model.tables} == {32} and model.bottom_mlp[-1] == 32
    assert {t.zipf_alpha for t in model.tables} == {1.05} and not model.input_distribution


def _three_tables() -> DLRMConfig:
    dims = {"a": (1_000, 1), "b": (100_000, 10), "c": (50_000, 30)}  # rows, pooling; dim 16
    tables = [EmbeddingTable(name=n, num_rows=r, embedding_dim=16, pooling_factor=p) for n, (r, p) in dims.items()]
    return DLRMConfig(dense_features=13, bottom_mlp=(64, 16), top_mlp=(64, 1), tables=tuple(tables))


def test_greedy_by_size_places_the_largest_table_first():
    # rows × dim: a 16,000, b 1,600,000, c 800,000 → b to rank 0 (both empty: the lower), c to rank 1
    # (0 < 1.6M), a to rank 1 (0.8M < 1.6M)
    assert greedy_size(_three_tables(), 256) == {"a": TW1, "b": TW0, "c": TW1}


def test_greedy_by_lookups_places_the_most_looked_up_table_first():
    # pooling × global batch (2 × 256): a 512, b 5,120, c 15,360 → c to rank 0, b to rank 1,
    # a to rank 1 (5,120 < 15,360)
    assert greedy_lookups(_three_tables(), 256) == {"a": TW1, "b": TW1, "c": TW0}


def test_row_wise_and_data_parallel_for_small_tables():
    assert all_row_wise(_three_tables(), 256) == {"a": RW, "b": RW, "c": RW}
    # rows × dim × 4 bytes: a 64,000 ≤ 1 MiB → data-parallel; b 6.4 MB, c 3.2 MB by size: b 0, c 1
    assert dp_small(_three_tables(), 256) == {"a": DP, "b": TW0, "c": TW1}


def test_identical_proposals_are_measured_once_and_credited_to_each_sharder():
    # features 13 (2,209 rows, pooling 6), 18 (14, 1), 21 (40M → 1M, 27), 25 (36, 1), dim 64: by size
    # and by lookups alike f21 to rank 0, then f13, f18, f25 to rank 1 (the lighter one each time);
    # dp_small: f13 2,209 × 64 × 4 = 565,504 B ≤ 1 MiB, f18 and f25 too, data-parallel; f21 on rank 0
    made = proposals(Task((13, 18, 21, 25), 64, 256, 1.05), None)
    tw = encode({"f13": TW1, "f18": TW1, "f21": TW0, "f25": TW1})
    dp = encode({"f13": DP, "f18": DP, "f21": TW0, "f25": DP})
    rw = encode({"f13": RW, "f18": RW, "f21": RW, "f25": RW})
    assert made == {tw: ["greedy_size", "greedy_lookups"], rw: ["row_wise"], dp: ["dp_small"]}


def test_a_plan_survives_its_text_form():
    plan = {"f3": TW1, "f20": RW, "f7": DP, "f9": Shard("column_wise", (0, 1))}
    assert encode(plan) == "f3:table_wise:1 f20:row_wise:0-1 f7:data_parallel:0-1 f9:column_wise:0-1"
    assert decode(encode(plan)) == plan


def test_warm_intercepts_replace_only_the_embedding_operators_intercepts():
    from measure_sharding_tasks import PLANNER_DB, ROOT, WARM_DB, planner_calibration, planner_system

    from itercast.profile.calibrate import calibrate
    from itercast.profile.db import ProfileDB

    cold = planner_calibration(in_step=None)["operators"]["models"]
    mixed = planner_calibration(warm=WARM_DB, in_step=None)["operators"]["models"]
    warm_db = ProfileDB(ROOT / "data" / "measured" / WARM_DB, readonly=True)
    warm = calibrate(warm_db, warm_db.devices()[-1][0], planner_system())["operators"]["models"]
    assert PLANNER_DB != WARM_DB and cold.keys() == mixed.keys()
    for key, fit in mixed.items():
        if key.rsplit(":", 1)[-1] in ("embedding_bag_fwd", "embedding_bag_bwd", "embedding_bag_update"):
            assert fit["alpha_s"] == warm[key]["alpha_s"] != cold[key]["alpha_s"]
            assert {k: v for k, v in fit.items() if k != "alpha_s"} == {
                k: v for k, v in cold[key].items() if k != "alpha_s"
            }
        else:
            assert fit == cold[key]  # the GEMMs and the rest: the planner's own
