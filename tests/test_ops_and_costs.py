"""Op FLOPs of a layer, group placement and the analytic cost model's algebra."""

from __future__ import annotations

import pytest

from itercast.config.job import Job
from itercast.costs.analytic import BUS_FACTOR, AnalyticCostModel, bus_bytes
from itercast.hardware.topology import place_group
from itercast.workloads.transformer_ops import layer_backward, layer_forward


def test_gpt_layer_gemm_flops_are_24_t_h_squared():
    job = Job.from_presets("gpt3-175b", "dgx-a100", 1)
    gemm = sum(o.amount for o in layer_forward(job.model, job.plan) if o.family == "gemm")
    assert gemm == 24 * 2048 * 12288**2  # Narayanan et al. SC'21: 24·B·s·h² per layer forward


def test_tensor_parallel_divides_gemm_flops_and_adds_two_all_reduces():
    job = Job.from_presets("gpt3-175b", "dgx-a100", 1, {"tensor_parallel": 8})
    fwd = layer_forward(job.model, job.plan)
    assert sum(o.amount for o in fwd if o.family == "gemm") == 3 * 2048 * 12288**2
    assert [o.comm_kind for o in fwd if o.family == "tp_comm"] == ["all_reduce", "all_reduce"]


def test_sequence_parallel_turns_all_reduce_into_gather_and_scatter():
    job = Job.from_presets("gpt3-175b", "dgx-a100", 1, {"tensor_parallel": 8, "sequence_parallel": True})
    kinds = [o.comm_kind for o in layer_forward(job.model, job.plan) if o.family == "tp_comm"]
    assert kinds == ["all_gather", "reduce_scatter", "all_gather", "reduce_scatter"]


def test_backward_doubles_gemms_and_full_recompute_adds_a_forward():
    job = Job.from_presets("gpt3-175b", "dgx-a100", 1)
    fwd = sum(o.amount for o in layer_forward(job.model, job.plan) if o.family == "gemm")
    bwd = sum(o.amount for o in layer_backward(job.model, job.plan) if o.family == "gemm")
    full = Job.from_presets("gpt3-175b", "dgx-a100", 1, {"recompute": "full"})
    bwd_full = sum(o.amount for o in layer_backward(full.model, full.plan) if o.family == "gemm")
    assert (bwd, bwd_full) == (2 * fwd, 3 * fwd)


def test_group_placement():
    assert place_group(8, 1, 8) == place_group(8, 1, 8) and place_group(8, 1, 8).intra_node
    dp = place_group(16, 8, 8)  # data parallel with tp 8: one rank per node
    assert (dp.nodes, dp.per_node) == (16, 1)
    mixed = place_group(8, 2, 8)  # stride 2: 4 per node over 2 nodes
    assert (mixed.nodes, mixed.per_node) == (2, 4)


def test_bus_factors_follow_nccl_tests():
    assert BUS_FACTOR["all_reduce"](8) == 2 * 7 / 8
    assert BUS_FACTOR["all_gather"](8) == BUS_FACTOR["reduce_scatter"](8) == 7 / 8


def test_an_all_to_all_across_nodes_is_priced_by_the_bytes_through_the_nic():
    """16 ranks on 2 nodes, 1 MB buffer each: every rank sends the 8/16 of it meant for the other
    node off its node, so the node's 8 ranks push 4 MB through the NIC share that the cost model
    divides by (per_node × NIC per GPU). Within a node: nccl-tests' (n − 1)/n."""
    assert bus_bytes("alltoall", 1e6, 16, 2) == pytest.approx(4e6)
    assert bus_bytes("alltoall", 1e6, 8, 1) == pytest.approx(7 / 8 * 1e6)
    assert bus_bytes("all_gather", 1e6, 16, 2) == pytest.approx(15 / 16 * 1e6)


def test_collectives_grow_with_size_and_slow_down_across_nodes():
    costs = AnalyticCostModel(Job.from_presets("gpt3-175b", "dgx-h100", 2).system, "bf16")
    one_node, two_nodes = place_group(8, 1, 8), place_group(16, 1, 8)
    sizes = [1e3, 1e6, 1e8, 1e9]
    times = [costs.collective_s("all_reduce", s, one_node) for s in sizes]
    assert times == sorted(times)
    assert all(costs.collective_s("all_reduce", s, two_nodes) > t for s, t in zip(sizes, times, strict=False))
    assert costs.collective_s("all_reduce", 1e9, place_group(1, 1, 8)) == 0.0


def test_gemm_time_is_flops_over_efficient_peak():
    costs = AnalyticCostModel(Job.from_presets("gpt3-175b", "dgx-h100").system, "bf16")
    flops = 2.0 * 8192**3
    expected = costs.gemm_alpha_s + flops / (989.4e12 * float(costs.gemm_curve(flops)))
    assert float(costs.gemm_s(flops)) == pytest.approx(expected)
    assert 0.6 < float(costs.gemm_curve(flops)) <= 0.83  # large GEMMs: ~80% of peak on H100


def test_fp8_gemms_use_their_measured_curve_and_peak():
    from itercast.costs.curves import curves

    system = Job.from_presets("gpt3-175b", "dgx-h100").system
    fp8, bf16 = AnalyticCostModel(system, "fp8"), AnalyticCostModel(system, "bf16")
    assert fp8.gemm_curve.e_max == curves()["gemm"]["fp8"]["e_max"] and fp8.peak_flops == 1978.9e12
    big = 2.0 * 16384**3
    assert 1.2 < float(bf16.gemm_s(big) / fp8.gemm_s(big)) < 2.0  # faster than bf16, well short of 2×
    assert fp8.attention_peak_flops == 989.4e12  # attention stays bf16 under FP8 training
