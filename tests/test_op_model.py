"""Operator features, operator cost models and the CPU iteration model, against hand-computed values."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from itercast.costs.aten_ops import OpCall, OpFeatures, features, host_category, tensor_bytes
from itercast.costs.op_model import (
    BOOST_MIN_ROWS,
    IndexStats,
    OperatorCostModel,
    fit_operator_models,
    fit_shape_model,
    row_features,
    row_index_stats,
    shape_model_s,
    unique_fraction_uniform,
)
from itercast.measurements import Measurement
from itercast.profile.calibrate import CalibrationError, load_calibration
from itercast.traces.execution_trace import read_execution_trace
from itercast.traces.iteration_model import host_counts, predict_iteration

F = "Tensor(float)"


def test_gemm_layout_comes_from_strides():
    # x·Wᵀ as nn.Linear runs it: mat2 is W [256, 64] viewed transposed, strides (1, 64)
    call = OpCall("aten::addmm", [[256], [32, 64], [64, 256]], [F] * 3, [[1], [64, 1], [1, 64]])
    f = features(call)
    assert f.family == "gemm" and f.size == 2 * 32 * 256 * 64
    assert f.dims == {"batch": 1, "m": 32, "n": 256, "k": 64, "layout": "nt"}
    bmm = features(OpCall("aten::bmm", [[8, 16, 32], [8, 32, 4]], [F] * 2, [[512, 32, 1], [128, 4, 1]]))
    assert bmm.size == 2 * 8 * 16 * 4 * 32 and bmm.dims["layout"] == "nn"


def test_convolution_is_an_implicit_gemm():
    # 8×16×32×32 input, 32 filters 3×3, same padding: m = 8·32·32, n = 32, k = 16·9
    fwd = features(OpCall("aten::convolution", [[8, 16, 32, 32], [32, 16, 3, 3]], [F] * 2, [], [[8, 32, 32, 32]]))
    assert fwd.family == "conv_fwd" and fwd.size == 2 * (8 * 32 * 32) * 32 * (16 * 9)
    # backward with only the weight gradient asked for (a first layer): one product, not two
    shapes = [[8, 32, 32, 32], [8, 16, 32, 32], [32, 16, 3, 3]]
    only_w = features(OpCall("aten::convolution_backward", shapes, [F] * 3, [], [[], [32, 16, 3, 3], []]))
    both = features(OpCall("aten::convolution_backward", shapes, [F] * 3, [], [[8, 16, 32, 32], [32, 16, 3, 3], []]))
    assert both.size == 2 * only_w.size == 2 * fwd.size


def test_attention_lookup_and_memory_features():
    q = [2, 4, 128, 64]
    att = features(
        OpCall(
            "aten::_scaled_dot_product_flash_attention_for_cpu", [q, q, q], [F] * 3, [], [], [], (0, 0, 0, 0.0, True)
        )
    )
    assert att.size == 4 * 2 * 4 * 128 * 128 * 64 and att.dims["layout"] == "causal"
    args = [[512, 64], [10240], [512], [0], [512], [512]] + [[]] * 4
    types = [F] + ["Tensor(long int)"] * 5 + ["Int", "Bool", "Int", "Bool"]
    bwd = features(OpCall("aten::_embedding_bag_backward", args, types, [], [], [], (None,) * 6 + (300_000, False)))
    assert bwd.dims == {"rows": 300_000, "dim": 64, "lookups": 10240, "bags": 512, "table_bytes": 300_000 * 64 * 4}
    # lists of tensors count whole; scalars and int lists do not
    assert (
        tensor_bytes(
            [[[4, 4], [8]], [[], []], []], ["GenericList[Tensor(float),Tensor(float)]", "GenericList[Int,Int]", "Int"]
        )
        == 24 * 4
    )
    add = features(OpCall("aten::add", [[1024], [1024], []], [F, "Tensor(double)", "Int"], [], [[1024]], [F]))
    assert add.family == "memory" and add.size == 1024 * (4 + 8 + 4)
    assert features(OpCall("aten::view", [[4, 4], [[]]], [F, "GenericList[Int]"])).family == "free"


def test_norms_are_priced_by_rows_and_reduction_length():
    """A batch norm's rows are its channels (one block each), reducing over N·H·W; a layer norm's are
    every position, reducing over the last dimension."""
    x = [512, 32, 32, 32]
    bn = features(OpCall("aten::cudnn_batch_norm", [x, [32]] + [[32]] * 3, [F] * 5, [], [x, [32], [32], [0]], [F] * 4))
    assert bn.family == "norm" and bn.dims == {"m": 32, "n": 512 * 32 * 32, "k": 1}
    assert bn.size == 4 * (2 * 512 * 32 * 32 * 32 + 6 * 32)  # x and y; weight, bias, running stats, saved stats
    g = [8, 128, 256]
    ln = features(OpCall("aten::native_layer_norm_backward", [g, g, [[]]], [F, F, "GenericList[Int]"], [], [g], [F]))
    assert ln.dims == {"m": 8 * 128, "n": 256, "k": 1} and ln.size == 3 * 8 * 128 * 256 * 4


def test_gpu_iteration_runs_host_and_device_on_two_clocks(tmp_path):
    """Two Python calls whose issue times were measured (10 µs each): an mm of 100 µs, then an add of
    5 µs; then .item() on a GPU tensor, which waits for the device; then an add issued after it.
    Host: 10 → mm runs 10-110; 20 → add runs 110-115; the item (a 1 µs Python call, launching
    nothing) waits from 21 until 115; the last add is issued at 125 and runs 125-130."""
    mm_in = [[64, 64], [64, 64]]
    et = _et(
        tmp_path,
        [
            (3, 2, "aten::mm", mm_in, [F, F], [[64, 1], [64, 1]], [[64, 64]]),
            (4, 2, "aten::add", [[64], [64]], [F, F], [], [[64]]),
            (5, 2, "aten::_local_scalar_dense", [[]], [F], [], [[]]),
            (6, 2, "aten::add", [[64], [64]], [F, F], [], [[64]]),
        ],
        devices={5: "cuda:0"},
    )
    gemm = {"alpha_s": 100e-6, "rate_flops_per_s": 1e30, "half_m": 1.0, "half_n": 1.0, "half_k": 1.0, "gamma": 1.0}
    gemm["layout_factor"] = {"nn": 1.0}
    mem = {"alpha_s": 5e-6, "s_per_byte": 0.0, "s_per_byte_if_large": 0.0, "break_bytes": 1 << 30}
    doc = {
        "models": {"aten::mm:gemm": gemm, "aten::add:memory": mem},
        "host_s": {"python": 1e-6, "nested": 0.5e-6, "autograd": 0.0, "launch": 2e-6},
        "host_issue_s": {"aten::mm": 10e-6, "aten::add": 10e-6},
    }
    pred = predict_iteration(et, OperatorCostModel(doc), gpu=True)
    assert pred.total_s == pytest.approx(130e-6)
    assert pred.host_s == pytest.approx(10e-6 + 10e-6 + 1e-6 + 10e-6)
    assert pred.kernel_s_by_family == pytest.approx({"gemm": 100e-6, "memory": 10e-6})
    # with 2 µs kernels the host leads: mm 10-12, add 20-22, the item waits from 21 to 22, the last
    # add is issued at 32 and runs 32-34
    fast = doc | {"models": {"aten::mm:gemm": gemm | {"alpha_s": 2e-6}, "aten::add:memory": mem | {"alpha_s": 2e-6}}}
    assert predict_iteration(et, OperatorCostModel(fast), gpu=True).total_s == pytest.approx(34e-6)
    # the same trace on a CPU: host costs (1 µs Python + 2 µs launch a call) and kernels add up, each
    # priced call less the host cost its microbenchmark carried
    cpu = predict_iteration(et, OperatorCostModel(doc))
    assert cpu.host_s == pytest.approx(3 * 3e-6 + 1e-6)
    assert cpu.total_s == pytest.approx(cpu.host_s + (100e-6 - 3e-6) + 2 * (5e-6 - 3e-6))


def test_host_categories():
    assert host_category("aten::linear", "[pytorch|profiler|execution_trace|thread]") == "python"
    assert host_category("aten::addmm", "aten::linear") == "nested"
    assert host_category("aten::mm", "MmBackward0") == "nested"
    assert host_category("autograd::engine::evaluate_function: MmBackward0", "x") == "autograd"
    assert host_category("aten::add_", "Optimizer.step#SGD.step") == "python"
    assert host_category("Optimizer.step#SGD.step", "[pytorch|profiler|execution_trace|thread]") is None


def test_shape_model_recovers_a_known_law():
    rng = np.random.default_rng(0)
    law = {
        "alpha_s": 4e-6,
        "rate_flops_per_s": 2e11,
        "half_m": 40.0,
        "half_n": 20.0,
        "half_k": 80.0,
        "gamma": 1.3,
        "layout_factor": {"nn": 1.0, "nt": 1.2},
    }
    dims = [
        {"m": int(m), "n": int(n), "k": int(k), "layout": lay}
        for m, n, k, lay in zip(
            *(2 ** rng.integers(4, 12, 60) for _ in range(3)), rng.choice(["nn", "nt"], 60), strict=True
        )
    ]
    flops = np.array([2.0 * d["m"] * d["n"] * d["k"] for d in dims])
    from itercast.costs.aten_ops import OpFeatures

    t = np.array([shape_model_s(law, OpFeatures("gemm", fl, d)) for fl, d in zip(flops, dims, strict=True)])
    fit = fit_shape_model(dims, flops, t)
    assert fit["fit_mean_abs_err"] < 1e-3
    assert fit["layout_factor"]["nt"] == pytest.approx(1.2, rel=1e-2)
    assert fit["rate_flops_per_s"] == pytest.approx(2e11, rel=2e-2)


def test_boosted_trees_learn_what_the_curve_misses():
    """A law the curve cannot express (a 1.5× slow-down for every n < 64, e.g. another kernel path):
    with ≥ BOOST_MIN_ROWS rows the trees, evaluated from their JSON arrays, put it back."""
    from itercast.costs.aten_ops import OpFeatures

    rng = np.random.default_rng(1)
    law = {"alpha_s": 1e-6, "rate_flops_per_s": 1e11, "half_m": 30.0, "half_n": 30.0, "half_k": 30.0, "gamma": 1.0}
    law |= {"layout_factor": {"nn": 1.0}}
    dims = [{"m": int(m), "n": int(n), "k": int(k)} for m, n, k in 2 ** rng.integers(3, 11, (BOOST_MIN_ROWS + 50, 3))]
    flops = np.array([2.0 * d["m"] * d["n"] * d["k"] for d in dims])
    bump = np.array([1.5 if d["n"] < 64 else 1.0 for d in dims])
    t = np.array([shape_model_s(law, OpFeatures("gemm", f, d)) for f, d in zip(flops, dims, strict=True)]) * bump
    boosted = fit_shape_model(dims, flops, t)
    plain = fit_shape_model(dims[: BOOST_MIN_ROWS - 1], flops[: BOOST_MIN_ROWS - 1], t[: BOOST_MIN_ROWS - 1])
    assert "boost" in boosted and "boost" not in plain
    errs = [
        abs(shape_model_s(boosted, OpFeatures("gemm", f, d)) / y - 1) for f, d, y in zip(flops, dims, t, strict=True)
    ]
    assert float(np.median(errs)) < 0.02  # the curve alone cannot place a step in n
    for n, slow in ((32, 1.5), (512, 1.0)):
        d = {"m": 256, "n": n, "k": 256}
        f = OpFeatures("gemm", 2.0 * 256 * n * 256, d)
        assert shape_model_s(boosted, f) == pytest.approx(shape_model_s(law, f) * slow, rel=0.05)


def test_unique_fraction_of_uniform_draws():
    assert unique_fraction_uniform(1, 10) == pytest.approx(0.1)  # one row: 1 distinct in 10
    assert unique_fraction_uniform(1000, 1) == pytest.approx(1.0)
    # 2 draws from 2 rows: expected distinct = 2·(1 − 1/4) = 1.5 of 2
    assert unique_fraction_uniform(2, 2) == pytest.approx(0.75)


def test_index_stats_of_named_distributions_and_samples():
    # Zipf α = 1 over 3 rows: p_1 = 1 / (1 + 1/2 + 1/3) = 6/11
    assert IndexStats.zipf(3, 2, 1.0, 4).hot_fraction == pytest.approx(6 / 11)
    uniform = IndexStats.uniform(4, 8, 4)
    assert IndexStats.zipf(4, 8, 0.0, 4) == uniform and uniform.unique_fraction == unique_fraction_uniform(4, 8)
    assert uniform.hot_fraction == 0.25
    # a sample where row 7 appears 3 times and row 9 once: 3/4 of the lookups go to row 7
    assert IndexStats.sampled(np.array([3, 1]), 1, 4).hot_fraction == pytest.approx(0.75)
    # a sample of every row once is uniform draws, reuse distances included
    once, drawn = IndexStats.sampled(np.ones(1000, dtype=int), 4000, 256), IndexStats.uniform(1000, 4000, 256)
    assert once.unique_fraction == pytest.approx(drawn.unique_fraction) and once.reuse_beyond == drawn.reuse_beyond


def test_reuse_distances_match_an_lru_stack_on_drawn_indices():
    """Shares of lookups whose row was last touched more than 256 distinct rows earlier (64 KiB of
    256-byte rows), against the exact LRU stack distances of 4,000 drawn indices."""
    rng = np.random.default_rng(0)
    for p, model in (
        (np.full(1000, 1e-3), IndexStats.uniform(1000, 4000, 256)),
        ((zipf := np.arange(1, 1001) ** -1.05) / zipf.sum(), IndexStats.zipf(1000, 4000, 1.05, 256)),
    ):
        seq, last, far = rng.choice(1000, size=4000, p=p).tolist(), {}, 0
        for i, row in enumerate(seq):
            if row in last and len(set(seq[last[row] + 1 : i])) > 256:
                far += 1
            last[row] = i
        assert model.reuse_beyond[0] == pytest.approx(far / 4000, abs=0.01)  # measured 0.507 / 0.082
        assert model.reuse_beyond[1:] == (0.0, 0.0)  # 1 MiB is 4,096 rows: more than the table holds


def test_a_lookup_pays_for_its_far_repeats():
    """Only the reuse terms: 1 ns per byte of repeats beyond 64 KiB, 3 ns more beyond 16 MiB."""
    fit = {"form": "lookup", "cache_bytes": 1 << 20, "alpha_s": 0.0}
    fit |= {"s_per_reuse_beyond_64KiB_byte": 1e-9, "s_per_reuse_beyond_16384KiB_byte": 3e-9}
    model = OperatorCostModel({"models": {"aten::_embedding_bag:embedding_bag_fwd": fit}})
    call = OpCall("aten::_embedding_bag", [[1000, 32], [4096], [512]], [F, "Tensor(long int)", "Tensor(long int)"])
    gathered = 4096 * 32 * 4
    priced = model.measured_s(call, index=IndexStats(0.5, 0.01, (0.3, 0.2, 0.1)))
    assert priced == pytest.approx(gathered * (0.3 * 1e-9 + 0.1 * 3e-9))


def test_a_lookup_misses_and_a_backward_maps_afresh_only_beyond_the_cache():
    """Only the terms of tables beyond the 1 MiB cache: 1 ns per byte of distinct rows missed (forward), 2 ns
    per byte of the dense gradient (backward); 4,096 lookups of 128-byte rows, half distinct."""
    fwd = {"form": "lookup", "cache_bytes": 1 << 20, "alpha_s": 0.0, "s_per_missed_byte": 1e-9}
    bwd = {"form": "lookup", "cache_bytes": 1 << 20, "alpha_s": 0.0, "s_per_table_byte_if_large": 2e-9}
    model = OperatorCostModel({"models": {"f:embedding_bag_fwd": fwd, "b:embedding_bag_bwd": bwd}})
    half = IndexStats(0.5, 0.01)

    def priced(op: str, family: str, table_bytes: float) -> float:
        dims = {"lookups": 4096, "bags": 512, "table_bytes": table_bytes, "rows": table_bytes // 128}
        return model.price(op, OpFeatures(family, 4096 * 128.0, dims), half)

    assert priced("f", "embedding_bag_fwd", 128_000) == 0.0  # 1,000 rows: in cache
    assert priced("f", "embedding_bag_fwd", 12_800_000) == pytest.approx(4096 * 128 * 0.5 * 1e-9)
    assert priced("b", "embedding_bag_bwd", 128_000) == 0.0
    assert priced("b", "embedding_bag_bwd", 12_800_000) == pytest.approx(12_800_000 * 2e-9)


def test_a_gemm_below_the_smallest_profiled_size_holds_its_ramp_there():
    """Halves at 64 in each dimension, gamma 1, profiled from 128: a 16^3 product is priced at the ramp of
    128 ((1 + 64/128)^3 = 3.375 times its FLOPs at 1 TFLOP/s), not at 16's ((1 + 4)^3 = 125)."""
    fit = {"alpha_s": 0.0, "rate_flops_per_s": 1e12, "gamma": 1.0, "layout_factor": {"nn": 1.0}}
    fit |= {f"half_{d}": 64.0 for d in "mnk"} | {f"min_{d}": 128.0 for d in "mnk"}
    small = OpFeatures("gemm", 2.0 * 16**3, {"m": 16, "n": 16, "k": 16, "layout": "nn"})
    assert shape_model_s(fit, small) == pytest.approx(2.0 * 16**3 / 1e12 * 3.375)


def test_profile_rows_carry_their_index_stats():
    recorded = Measurement("embedding", "embedding_bag_bwd", 1, 1e-4, params={"rows": 10, "distribution": "zipf"})
    recorded.params["features"] = {"unique_fraction": 0.5, "hot_fraction": 0.2}
    assert row_index_stats(recorded) == IndexStats(0.5, 0.2)
    # recorded before hot_fraction was: the expectation for the distribution (microbench.ZIPF_ALPHA = 1.05)
    old = Measurement("embedding", "embedding_bag_bwd", 1, 1e-4, params={"rows": 2, "distribution": "zipf"})
    assert row_index_stats(old).hot_fraction == pytest.approx(1 / (1 + 2**-1.05))
    old.params["distribution"] = "uniform"
    assert row_index_stats(old) == IndexStats(1.0, 0.5)  # no shape recorded: no reuse distances


def test_the_update_pays_per_distinct_row_of_a_large_table_and_for_an_accumulator_beyond_cache():
    """Only the update's two newer terms: 0.1 µs per distinct row of a table of ≥ 1 MiB, 1 ns per
    gathered byte once the distinct rows' accumulator reaches 1 MiB."""
    fit = {"form": "lookup", "cache_bytes": 1 << 20, "accumulator_bytes": 1 << 20, "alpha_s": 0.0}
    fit |= {"s_per_distinct_row_if_large": 1e-7, "s_per_gathered_byte_if_accumulator_large": 1e-9}
    model = OperatorCostModel({"models": {"itercast::rowwise_adagrad_update:embedding_bag_update": fit}})
    types = [F, F, "Tensor(long int)", F]

    def update(rows: int, lookups: int, unique: float) -> float:
        call = OpCall("itercast::rowwise_adagrad_update", [[rows, 16], [rows], [lookups], [lookups, 16]], types)
        return model.measured_s(call, index=IndexStats(unique, 0.0))

    # 100,000 × 16 floats (6.4 MB); 65,536 lookups, half distinct: 32,768 rows, an accumulator of
    # 32,768 × 64 B = 2 MiB: 3.2768 ms for the rows + 65,536 × 64 B × 1 ns = 4.194304 ms
    assert update(100_000, 65_536, 0.5) == pytest.approx(3.2768e-3 + 4.194304e-3)
    # 16,384 lookups, half distinct: an accumulator of 512 KiB, in cache: the rows alone, 0.8192 ms
    assert update(100_000, 16_384, 0.5) == pytest.approx(0.8192e-3)
    # a table of 1,000 × 16 floats (64 kB) stays in cache: neither term
    assert update(1_000, 16_384, 0.5) == 0.0


def test_the_update_learns_its_accumulator_break():
    """Update rows t = 0.5 ms + 2 ns per distinct byte + 3 ns per gathered byte once the distinct
    rows (their gradient accumulator) reach 4 MiB: the fit finds the break and both rates."""
    types = [F, F, "Tensor(long int)", F]
    rows = []
    for lookups, unique, dim in itertools.product((4096, 32768, 131072, 524288), (0.1, 0.5, 0.9), (16, 64)):
        gathered, distinct = lookups * dim * 4, lookups * dim * 4 * unique
        t = 5e-4 + 2e-9 * distinct + 3e-9 * gathered * (distinct >= 4 << 20)
        shapes = [[10_000, dim], [10_000], [lookups], [lookups, dim]]
        row = _row("itercast::rowwise_adagrad_update", shapes, types, t, family="embedding", rows=10_000)
        row.params["features"] = {"unique_fraction": unique, "hot_fraction": 0.0}
        rows.append(row)
    fit = fit_operator_models(rows)["models"]["itercast::rowwise_adagrad_update:embedding_bag_update"]
    assert fit["accumulator_bytes"] == 4 << 20
    assert fit["s_per_gathered_byte_if_accumulator_large"] == pytest.approx(3e-9, rel=1e-4)
    assert fit["s_per_distinct_byte"] == pytest.approx(2e-9, rel=1e-4)


def test_embedding_backward_learns_the_hot_row_chain_and_the_sort_step():
    """A GPU-like backward: t = 20 µs + 1 ns per lookup + 10 ns per lookup of the most frequent row
    + 60 µs from 2048 lookups on (the sort's device-wide path); uniform and skewed indices alike."""
    args_types = ["Tensor(float)"] + ["Tensor(long int)"] * 5 + ["Int", "Bool", "Int", "Bool"]
    rows = []
    for lookups, hot in itertools.product((512, 1024, 4096, 16384, 65536, 262144), (1e-5, 0.01, 0.1)):
        args = [[lookups // 4, 32], [lookups], [lookups // 4], [0], [lookups // 4], [lookups // 4]] + [[]] * 4
        t = 20e-6 + 1e-9 * lookups + 10e-9 * lookups * hot + 60e-6 * (lookups >= 2048)
        row = _row("aten::_embedding_bag_backward", args, args_types, t, scalars=(None,) * 6 + (1000, False))
        row.params.update(rows=1000, features={"unique_fraction": 0.5, "hot_fraction": hot})
        rows.append(row)
    fit = fit_operator_models(rows)["models"]["aten::_embedding_bag_backward:embedding_bag_bwd"]
    assert fit["many_lookups"] == 2048
    assert fit["s_per_hot_lookup"] == pytest.approx(10e-9, rel=1e-4)
    assert fit["s_per_call_if_many"] == pytest.approx(60e-6, rel=1e-4)
    model = OperatorCostModel({"models": {"aten::_embedding_bag_backward:embedding_bag_bwd": fit}})
    f = row_features(rows[-1])[1]
    # 262,144 lookups, a third of them to one row: 20 + 262 + 874 + 60 µs
    skewed = model.price("aten::_embedding_bag_backward", f, IndexStats(0.5, 1 / 3))
    assert skewed == pytest.approx(20e-6 + 262144e-9 + 262144 / 3 * 10e-9 + 60e-6, rel=1e-4)
    # uniform draws from the call's 1,000 rows when no stats are given: 262 lookups of the hottest row
    assert model.price("aten::_embedding_bag_backward", f) == pytest.approx(
        20e-6 + 262144e-9 + 262.144 * 10e-9 + 60e-6, rel=1e-3
    )


def test_embedding_forward_learns_its_bags():
    """A GPU-like lookup: t = 5 µs + 0.2 µs per lookup of a bag (one chain of loads per bag) +
    1 ns per byte of pooled output (bags × 32 floats), tables in cache."""
    types = ["Tensor(float)", "Tensor(long int)", "Tensor(long int)"]
    rows = []
    for bags, pooling in itertools.product((256, 1024, 4096), (1, 8, 64)):
        t = 5e-6 + 0.2e-6 * pooling + 1e-9 * bags * 32 * 4
        call = [[1000, 32], [bags * pooling], [bags]]
        rows.append(_row("aten::_embedding_bag", call, types, t, out=[[bags, 32]], rows=1000, distribution="uniform"))
    fit = fit_operator_models(rows)["models"]["aten::_embedding_bag:embedding_bag_fwd"]
    assert fit["s_per_pooling"] == pytest.approx(0.2e-6, rel=1e-4)
    assert fit["s_per_pooled_byte"] == pytest.approx(1e-9, rel=1e-4)
    f = row_features(rows[0])[1]
    assert (f.dims["bags"], f.dims["lookups"]) == (256, 256)


def _row(name, shapes, types, t, strides=(), out=(), scalars=(), family="elementwise", **params):
    call = OpCall(name, list(shapes), list(types), list(strides), list(out), [F] * len(out), tuple(scalars))
    return Measurement(family, name, features(call).size, t, "fp32", params={**params, "call": call.__dict__})


def test_memory_and_host_models_recover_their_laws():
    # t = 2 µs + bytes / 10 GB/s for calls below 1 MiB, 2 GB/s from 1 MiB on (every byte of the call)
    rows = []
    for k in range(10, 24):
        n = 1 << k
        nbytes = 3 * 4 * n
        t = 2e-6 + nbytes * (1e-10 if nbytes < 1 << 20 else 5e-10)
        rows.append(_row("aten::add", [[n], [n]], [F, F], t, out=[[n]], elements=n, host_issue_s=k * 1e-6))
    # host programs: 0.7 µs per Python call, 0.2 µs nested, 8 µs per autograd function
    for counts in ({"python": 100}, {"python": 100, "nested": 200}, {"python": 13, "nested": 31, "autograd": 12}):
        t = 0.7e-6 * counts.get("python", 0) + 0.2e-6 * counts.get("nested", 0) + 8e-6 * counts.get("autograd", 0)
        rows.append(Measurement("host", "p", 1, t, params={"counts": counts}))
    doc = fit_operator_models(rows)
    fit = doc["models"]["aten::add:memory"]
    assert doc["host_issue_s"] == pytest.approx({"aten::add": 16.5e-6})  # the median of 10 … 23 µs
    assert fit["break_bytes"] == 1 << 20 and fit["s_per_byte_if_large"] == pytest.approx(4e-10, rel=1e-6)
    # no program counted a launch: no launch cost is fitted
    assert doc["host_s"] == pytest.approx(
        {"python": 0.7e-6, "nested": 0.2e-6, "autograd": 8e-6, "launch": 0.0}, rel=1e-6
    )
    model = OperatorCostModel(doc)
    # an in-place op without its own model falls back to aten::add_, absent here: a clear error
    with pytest.raises(ValueError, match=r"aten::mul_: no model for it nor for aten::add_"):
        model.measured_s(OpCall("aten::mul_", [[8], [8]], [F, F]))
    sub = OpCall("aten::sub", [[1 << 20], [1 << 20]], [F, F], [], [[1 << 20]], [F])  # priced as aten::add
    # 12 MiB moved (3 tensors of 4 MiB): a call beyond the 1 MiB break, every byte at 2 GB/s
    assert model.measured_s(sub) == pytest.approx(2e-6 + 12 * 2**20 * 5e-10)
    # 12 KiB moved: below the break, at 10 GB/s
    small = OpCall("aten::sub", [[1024], [1024]], [F, F], [], [[1024]], [F])
    assert model.measured_s(small) == pytest.approx(2e-6 + 12 * 1024 * 1e-10)


def test_operator_models_say_when_priced_beyond_the_most_their_rows_spanned(tmp_path):
    """aten::add fitted on 1,024 … 2^23 elements (12 bytes each, two inputs and an output): 12,288 …
    100,663,296 bytes. A call up to twice the most is not reported, nor one far below the least (a linear
    model tends to its constant there); one of 2^25 elements, 402,653,184 bytes, 4× the most, is."""
    rows = []
    for k in range(10, 24):
        n = 1 << k
        rows.append(_row("aten::add", [[n], [n]], [F, F], 2e-6 + 12 * n * 1e-10, out=[[n]], elements=n))
    doc = fit_operator_models(rows)
    assert doc["models"]["aten::add:memory"]["measured_range"] == [12288.0, 100663296.0]
    model = OperatorCostModel(doc)

    def sub(n):  # priced on aten::add's model (FALLBACK_MEMORY_OPS)
        return OpCall("aten::sub", [[n], [n]], [F, F], [], [[n]], [F])

    model.measured_s(sub(8))  # 96 bytes, far below the least
    model.measured_s(sub(1 << 24))  # 201,326,592 bytes: exactly twice the most
    assert model.extrapolations() == []
    model.measured_s(sub(1 << 25))
    assert model.extrapolations() == [
        "profiled operator model aten::add was fitted on 1.23e+04–1.01e+08 bytes; this job prices 96–4.03e+08 on "
        "it: beyond that range the model is extrapolated (profile larger or smaller sizes to measure them)"
    ]
    # a calibration file's operator range is checked where it is read, like the curves'
    doc["models"]["aten::add:memory"]["measured_range"] = [5.0, 1.0]
    bad = tmp_path / "cal.json"
    bad.write_text(json.dumps({"format": "itercast-calibration", "version": "3", "operators": doc}))
    with pytest.raises(CalibrationError, match=r"operators\.models\.aten::add:memory\.measured_range`: expected"):
        load_calibration(bad)


def _et(tmp_path, nodes, devices=None):
    """An execution trace of `nodes` (id, parent, name, input shapes, types, strides, output shapes);
    `devices`: node id → the device of its tensor inputs (else none recorded)."""
    path = tmp_path / "et.json"
    root = [{"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 1}]
    root.append({"id": 2, "name": "[pytorch|profiler|execution_trace|thread]", "ctrl_deps": 1})
    out = []
    for nid, parent, name, shapes, types, strides, out_shapes in nodes:
        out.append(
            {
                "id": nid,
                "name": name,
                "ctrl_deps": parent,
                "inputs": {
                    "values": [[nid * 10 + i, 0, 0, 1, 4, devices[nid]] for i in range(len(shapes))]
                    if devices and nid in devices
                    else [],
                    "shapes": shapes,
                    "types": types,
                    "strides": strides,
                },
                "outputs": {"values": [], "shapes": out_shapes, "types": [F] * len(out_shapes), "strides": []},
            }
        )
    path.write_text(json.dumps({"schema": "1.1.1-chakra.0.0.4", "nodes": root + out}))
    return read_execution_trace(path)


def test_iteration_is_host_plus_kernels_by_hand(tmp_path):
    """linear → addmm (→ copy_ of the bias, as_strided) and a relu → clamp_min, then an autograd function."""
    x, w, b = [32, 64], [64, 256], [256]
    et = _et(
        tmp_path,
        [
            (3, 2, "aten::linear", [x, [256, 64], b], [F] * 3, [], [[32, 256]]),
            (4, 3, "aten::t", [[256, 64]], [F], [], [w]),
            (5, 3, "aten::addmm", [b, x, w], [F] * 3, [[1], [64, 1], [1, 64]], [[32, 256]]),
            (6, 5, "aten::copy_", [[32, 256], [32, 256]], [F, F], [], [[32, 256]]),
            (7, 2, "aten::relu", [[32, 256]], [F], [], [[32, 256]]),
            (8, 7, "aten::clamp_min", [[32, 256], []], [F, "Int"], [], [[32, 256]]),
            (9, 2, "autograd::engine::evaluate_function: ReluBackward0", [], [], [], []),
        ],
    )
    gemm = {
        "alpha_s": 5e-6,
        "rate_flops_per_s": 1e11,
        "half_m": 1.0,
        "half_n": 1.0,
        "half_k": 1.0,
        "gamma": 1.0,
        "layout_factor": {"nn": 1.0, "nt": 2.0},
    }
    mem = {"alpha_s": 1e-6, "s_per_byte": 1e-10, "s_per_byte_if_large": 0.0, "break_bytes": 1 << 30}
    host = {"python": 1e-6, "nested": 0.25e-6, "autograd": 10e-6}
    models = {"aten::mm:gemm": gemm, "aten::add:memory": mem, "aten::add_:memory": mem}
    model = OperatorCostModel({"models": models, "host_s": host})
    pred = predict_iteration(et, model)
    # launches: addmm (a GEMM), its bias copy_ and clamp_min (leaves that move data); not linear,
    # relu (composites) nor t (a view)
    assert pred.calls_by_category == {"python": 2, "nested": 4, "autograd": 1, "launch": 3}
    assert host_counts(et) == {"python": 2, "nested": 4, "autograd": 1, "launch": 3}
    assert pred.host_s == pytest.approx(2e-6 + 4 * 0.25e-6 + 10e-6)
    # addmm: its model less the host its microbenchmark carried (one Python call + 1 nested child)
    flops = 2 * 32 * 256 * 64
    slow = (1 + 1 / 32) * (1 + 1 / 256) * (1 + 1 / 64)
    addmm = 5e-6 + flops / 1e11 * slow * 2.0 - (1e-6 + 0.25e-6)
    # leaf: its bytes (src read and self written: copy_ overwrites self without reading it, counted so in the
    # microbenchmark rows too), less one Python call
    copy = 1e-6 + 2 * 32 * 256 * 4 * 1e-10 - 1e-6
    clamp = 1e-6 + 2 * 32 * 256 * 4 * 1e-10 - 1e-6
    assert pred.kernel_s_by_family == pytest.approx({"gemm": addmm, "memory": copy + clamp})
    assert pred.total_s == pytest.approx(pred.host_s + addmm + copy + clamp)


def test_real_iteration_trace_counts_every_call(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    observer = torch.profiler.ExecutionTraceObserver()
    observer.register_callback(str(tmp_path / "et.json"))
    observer.start()
    model(x).sum().backward()
    opt.step()
    observer.stop()
    observer.unregister_callback()
    et = read_execution_trace(tmp_path / "et.json")
    gemm = {"alpha_s": 1e-6, "rate_flops_per_s": 1e10, "half_m": 1.0, "half_n": 1.0, "half_k": 1.0, "gamma": 1.0}
    mem = {"alpha_s": 0.0, "s_per_byte": 1e-10, "s_per_byte_if_large": 0.0, "break_bytes": 1 << 30}
    doc = {"models": {"aten::mm:gemm": gemm | {"layout_factor": {}}, "aten::add:memory": mem, "aten::add_:memory": mem}}
    pred = predict_iteration(et, OperatorCostModel(doc | {"host_s": {"python": 0, "nested": 0, "autograd": 0}}))
    assert dict(pred.calls_by_category) == host_counts(et)
    # two forward addmm and, backward, mm for two weight gradients and one input gradient
    gemms = [n for n in et.nodes if n.name in ("aten::addmm", "aten::mm")]
    expected = sum(shape_model_s(doc["models"]["aten::mm:gemm"], features(n)) for n in gemms)
    assert len(gemms) == 5 and pred.kernel_s_by_family["gemm"] == pytest.approx(expected)
    assert math.isfinite(pred.total_s)
