"""The analytic cost model's algebra by hand, on test_golden's linear calibration (every efficiency
1, every latency 0): fused attention against GEMMs, which link a collective or a send runs on.

The system here has one NIC of LINK / 8 per node, so a GPU's share of the scale-out bandwidth
(LINK / 64 with 8 GPUs a node) differs from NVLink (LINK).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from test_golden import LINK, MODEL, PEAK, SYSTEM, flat, linear_calibration

from itercast.config.job import Job
from itercast.config.system import SystemConfig
from itercast.costs.analytic import AnalyticCostModel
from itercast.costs.attention import AttentionShape
from itercast.costs.fitting import collective_time_s
from itercast.hardware.topology import GroupPlacement, pair_groups, place_group, same_node
from itercast.workloads.transformer import Groups

NIC = LINK / 8  # one per node
GPU = {**SYSTEM["gpu"], "peak_flops": {"fp32": PEAK, "bf16": PEAK, "fp8": 2 * PEAK}}
SLOW_NETWORK = {
    **SYSTEM,
    "gpu": GPU,
    "network": {**SYSTEM["network"], "nics_per_node": 1, "nic_bandwidth_bytes_per_s": NIC},
}


def costs(dtype: str = "bf16") -> AnalyticCostModel:
    system = SystemConfig.model_validate({**SLOW_NETWORK, "num_nodes": 2})
    return AnalyticCostModel(system, dtype, linear_calibration())


def test_fused_attention_runs_at_three_quarters_of_the_bf16_gemm_rate_even_under_fp8():
    # FlashAttention-2 reaches 50-73% of the A100's peak where large GEMMs reach ~80% (Dao 2023):
    # 0.75 of a GEMM; Transformer Engine keeps attention in bf16 unless fp8_dpa is set
    assert float(costs().attention_s(1e9)) == pytest.approx(1e9 / (0.75 * PEAK))
    assert float(costs("fp8").attention_s(1e9)) == pytest.approx(1e9 / (0.75 * PEAK))
    assert float(costs("fp8").gemm_s(1e9)) == pytest.approx(1e9 / (2 * PEAK))  # GEMMs do run in FP8


def test_a_collective_across_nodes_shares_each_nodes_nics_among_its_ranks():
    # 16 ranks, 8 on each of 2 nodes: the ring's slowest hop is a node's NIC, which its 8 ranks
    # drive together: min(NVLink, 8 × NIC / 8 GPUs) = LINK / 8 per rank. All-reduce bus bytes:
    # 2·15/16 of the buffer; an all-to-all's: the 8 ranks' halves bound for the other node, 8·1/2
    group = GroupPlacement(16, 2, 8)
    assert costs().collective_s("all_reduce", 1e6, group) == pytest.approx(2 * 15 / 16 * 1e6 / (LINK / 8))
    assert costs().collective_s("alltoall", 1e6, group) == pytest.approx(8 * 1 / 2 * 1e6 / (LINK / 8))


def test_a_pipeline_send_runs_on_nvlink_in_a_node_and_on_one_gpus_nic_share_across():
    assert costs().p2p_s(1e6, cross_node=False, stride=1) == pytest.approx(1e6 / LINK)
    assert costs().p2p_s(1e6, cross_node=True, stride=8) == pytest.approx(1e6 / (NIC / 8))


def test_one_node_all_to_all_reproduces_the_measured_h100_node():
    """Measured (xxrjun/nccl-tests-cluster@455de4f, 1 node × 8 H100, out-of-place): an all-to-all of
    1 GiB in 2,830 µs. The DGX H100 preset prices it on the curve fitted to that node's runs with
    nccl-tests' (n − 1)/n bus bytes; fitted with ten nodes' NIC bytes instead, it was 17% slow."""
    costs = AnalyticCostModel(Job.from_presets("llama3-8b", "dgx-h100").system, "bf16")
    assert 0.95 < costs.collective_s("alltoall", 2**30, place_group(8, 1, 8)) / 2830e-6 < 1.05


def latency_costs() -> AnalyticCostModel:
    """costs() with hop latencies: 1 µs a hop inside a node, 10 µs across the network."""
    node = {**SLOW_NETWORK["node"], "intra_node_latency_s": 1e-6}
    network = {**SLOW_NETWORK["network"], "latency_s": 1e-5}
    system = SystemConfig.model_validate({**SLOW_NETWORK, "node": node, "network": network, "num_nodes": 2})
    return AnalyticCostModel(system, "bf16", linear_calibration())


def test_a_broadcast_moves_its_whole_buffer_on_the_all_gathers_curve():
    # nccl-tests PERFORMANCE.md: broadcast's bus bandwidth is its algorithm bandwidth (factor 1, where
    # the all-gather's is (n − 1)/n); it runs the all-gather's ring pipeline, so its curve. Curves here:
    # the all-gather's efficiency 2 / (1 + 1) = 1, the all-reduce's 1 / (1 + 1) = 0.5. Over 4 GPUs of a
    # node: 1e6 B × 1 / (LINK 1e10 B/s × 1) = 1e-4 s (on the all-reduce's curve 2e-4 s; at (n − 1)/n 7.5e-5 s)
    cal = linear_calibration()
    cal["collectives"]["intra_node"]["all_reduce"] = {**cal["collectives"]["intra_node"]["all_reduce"], "e_max": 1.0}
    system = SystemConfig.model_validate({**SLOW_NETWORK, "num_nodes": 2})
    costs = AnalyticCostModel(system, "bf16", cal)
    assert costs.collective_s("broadcast", 1e6, GroupPlacement(4, 1, 4)) == pytest.approx(1e-4)


def test_an_all_to_alls_latency_floor_is_one_round_of_concurrent_exchanges():
    # 1 B, so the bandwidth terms (under 1e-8 s) leave the floor: every peer exchanges at once, so one
    # NVLink hop (1 µs) within a node, plus one network hop (10 µs) across nodes: 1.1e-5 s. A hop per
    # peer would be 7 µs in one node of 8 and 7 + 10 = 17 µs over 2 nodes of 8
    costs = latency_costs()
    assert costs.collective_s("alltoall", 1.0, GroupPlacement(8, 1, 8)) == pytest.approx(1e-6)
    assert costs.collective_s("alltoall", 1.0, GroupPlacement(16, 2, 8)) == pytest.approx(1.1e-5)


def test_an_all_reduces_latency_floor_is_a_trees_depth_up_and_down():
    # NCCL's tree: ⌈log2 6⌉ = 3 NVLink hops up and 3 down: 2 × 3 × 1 µs = 6e-6 s; over 2 nodes of 8:
    # 2 × (⌈log2 8⌉ × 1 µs + ⌈log2 2⌉ × 10 µs) = 2 × 13 µs = 2.6e-5 s
    costs = latency_costs()
    assert costs.collective_s("all_reduce", 1.0, GroupPlacement(6, 1, 6)) == pytest.approx(6e-6)
    assert costs.collective_s("all_reduce", 1.0, GroupPlacement(16, 2, 8)) == pytest.approx(2.6e-5)


def test_a_send_takes_at_least_the_hop_latency_of_the_link_it_crosses():
    # 1 B: 1 / LINK = 1e-10 s on NVLink, 1 / (LINK / 64) = 6.4e-9 s on a GPU's NIC share; the hop's
    # latency bounds it below: 1 µs within a node, 10 µs across the network
    costs = latency_costs()
    assert costs.p2p_s(1.0, cross_node=False, stride=1) == pytest.approx(1e-6)
    assert costs.p2p_s(1.0, cross_node=True, stride=8) == pytest.approx(1e-5)


def test_a_group_that_part_fills_its_last_node_spans_that_node_too():
    # consecutive ranks fill nodes in order: 3 ranks on nodes of 2 GPUs take 2 nodes (2 + 1);
    # 12 on nodes of 8 take 2 (8 + 4): ⌈size / per_node⌉
    assert place_group(3, 1, 2) == GroupPlacement(3, 2, 2)
    assert place_group(12, 1, 8) == GroupPlacement(12, 2, 8)
    assert not place_group(3, 1, 2).intra_node


def test_ranks_share_a_node_when_their_rank_divided_by_the_node_size_agrees():
    # ranks 0-7 on node 0, 8-15 on node 1 (8 GPUs a node): 0 and 8 share a local index, not a node
    assert not same_node(0, 8, 8)
    assert not same_node(3, 11, 8)
    assert same_node(8, 15, 8)


def test_a_curve_ramped_on_one_ring_step_divides_the_bus_bytes_by_n_minus_1():
    # NCCL's ring moves the bus bytes in n − 1 steps: 4e6 B over 5 ranks is 1e6 B a step, where
    # eff = 2 / (1 + exp(1 · (ln 1e6 − ln 1e6))) = 1: 4e6 B / 1e10 B/s = 4e-4 s
    # (1/n of it, 8e5 B, would give eff 2 / (1 + 1.25) and 4.5e-4 s)
    fit = {"alpha0_s": 0.0, "e_max": 2.0, "log_half": math.log(1e6), "gamma": 1.0, "ramp_of": "step"}
    assert float(collective_time_s(fit, 4e6, 1, 5, 1e10)) == pytest.approx(4e-4)


def test_an_all_to_alls_fitted_latency_grows_with_its_peers_not_its_ranks():
    # 5 ranks: 4 peers × 1 µs = 4e-6 s (1 B at eff 1 over 1e10 B/s adds 1e-10 s)
    fit = {"alpha0_s": 0.0, "alpha_per_peer_s": 1e-6, "e_max": 2.0, "log_half": 0.0, "gamma": 0.0}
    assert float(collective_time_s(fit, 1.0, 1, 5, 1e10)) == pytest.approx(4e-6 + 1e-10)


def test_context_parallel_calls_split_the_attention_flops_into_more_problems():
    # a fitted kernel: eff = 0.8 · d / (d + 64) · ramp, ramp = 1 / (1 + exp(ln 1e6 − ln x)), x the FLOPs
    # of one (batch · head) problem of one call. 16e6 FLOPs over 8 heads in 2 calls: 16 problems of
    # 1e6 FLOPs, ramp 1/2, eff 0.8 · 64/128 · 1/2 = 0.2: 2 calls × 1 µs + 16e6 / (1e12 · 0.2) = 8.2e-5 s
    # (8 problems of 2e6 would give ramp 2/3 and 6.2e-5 s)
    fit = {"alpha_s": 1e-6, "e_max": 0.8, "d_half": 64.0, "causal_factor": 0.9, "log_half": math.log(1e6)}
    fit["gamma"] = 1.0
    cal = {**linear_calibration(), "attention": {"k": {"gpu_name_prefixes": ["linear"], "fwd": fit, "bwd": fit}}}
    costs = AnalyticCostModel(SystemConfig.model_validate({**SLOW_NETWORK, "num_nodes": 2}), "bf16", cal)
    shape = AttentionShape(heads=8, head_dim=64, causal=False, calls=2)
    assert float(costs.attention_s(16e6, shape)) == pytest.approx(8.2e-5)


def test_embedding_pairs_share_a_node_unless_one_pair_crosses_it():
    # pp 4, a stage of 2 ranks, nodes of 8: pairs {0, 6} and {1, 7} on node 0, 6 apart (an all-reduce over NVLink)
    assert pair_groups(3 * 2, 2, 8) == GroupPlacement(2, 1, 2, 6)
    # pp 3, a stage of 3 ranks: {0, 6}, {1, 7} on node 0 but {2, 8} spans nodes 0 and 1: the slowest pair crosses
    assert pair_groups(2 * 3, 3, 8) == GroupPlacement(2, 2, 1)
    # pp 2 with a full node a stage: {r, r + 8} never share a node
    assert pair_groups(8, 8, 8) == GroupPlacement(2, 2, 1)
    assert pair_groups(0, 8, 8) == GroupPlacement(1, 1, 1)  # pp 1: no embedding group
    # a job's tied embedding: gpt, tp 1 × pp 4 × dp 2 on one node of 8
    node = {**SYSTEM["node"], "gpus_per_node": 8}
    j = Job.from_dicts(
        {**MODEL, "num_layers": 4}, {"pipeline_parallel": 4, "data_parallel": 2}, {**SYSTEM, "node": node}
    )
    assert Groups.of(j).embedding == GroupPlacement(2, 1, 2, 6)  # stage 0 {0,1}, stage 3 {6,7}: 6 apart


def test_v100_gemms_run_at_the_rates_measured_on_v100s_unless_a_calibration_says_otherwise():
    # Alpa's OSDI'22 profiling database, one V100-SXM2-16GB (p3.16xlarge): square dots measured at
    # fp16 4096^3 1.333 ms (103 TFLOP/s), 8064^3 9.178 ms (114 TFLOP/s, 0.91 of the 125 TFLOP/s
    # peak), fp32 4096^3 9.026 ms; the H100-fitted curve put 8064^3 at 0.72 of the peak (11.7 ms).
    # DeepBench's V100-SXM2 (data/published/kernels/deepbench_v100_gemm_fp16.csv): training GEMMs of
    # 6144 x 48000 x 2048 in 11.427 and 11.261 ms, 4096 x 7000 x 4096 in 2.147 and 2.092 ms (two transposes).
    # fp16 is one least-squares curve over both sources (squares run ~5% faster at equal FLOPs): within 10%
    # of each; fp32 over Alpa's 63 sizes alone: within 5%
    v100 = Job.from_dicts({"preset": "gpt3-175b"}, {"dtype": "fp16"}, {"preset": "v100-p3.16xlarge"}).system
    fp16, fp32 = AnalyticCostModel(v100, "fp16"), AnalyticCostModel(v100, "fp32")
    assert float(fp16.gemm_s(2 * 4096**3)) == pytest.approx(1.333e-3, rel=0.10)
    assert float(fp16.gemm_s(2 * 8064**3)) == pytest.approx(9.178e-3, rel=0.10)
    assert float(fp16.gemm_s(2 * 6144 * 48000 * 2048)) == pytest.approx((11.427e-3 + 11.261e-3) / 2, rel=0.10)
    assert float(fp16.gemm_s(2 * 4096 * 7000 * 4096)) == pytest.approx((2.147e-3 + 2.092e-3) / 2, rel=0.10)
    # between the two: slower than Alpa's largest square, faster than 0.80 of the peak (a curve on DeepBench's
    # 52 training shapes alone levels off at 0.82 of it)
    assert 9.178e-3 < float(fp16.gemm_s(2 * 8064**3)) < 2 * 8064**3 / (125e12 * 0.80)
    assert float(fp32.gemm_s(2 * 4096**3)) == pytest.approx(9.026e-3, rel=0.05)
    # a user's calibration of their own GEMMs replaces the built-in curves, V100's included
    calibrated = AnalyticCostModel(v100, "fp16", linear_calibration())
    assert float(calibrated.gemm_s(1e9)) == pytest.approx(1e9 / 125e12)
    # one that fitted no GEMM (host overheads, collectives only) keeps V100's own
    from itercast.profile.calibrate import merge_calibration

    no_gemms = AnalyticCostModel(v100, "fp16", merge_calibration({"system": "v100-p3.16xlarge"}))
    assert float(no_gemms.gemm_s(2 * 8064**3)) == float(fp16.gemm_s(2 * 8064**3))


def test_deepbench_rows_fitted_for_v100_are_the_training_shaped_ones():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from fit_efficiency_curves import GemmRows, deepbench_v100_gemms, training_shaped

    m, n, k = (
        np.array(d, dtype=float)
        for d in zip(
            *[
                (1024, 24000, 2048),
                (512, 48000, 2816),
                (1760, 16, 1760),  # an inference-sized batch of 16
                (5124, 9124, 2560),  # 5124 = 8 * 640 + 4: no tensor-core alignment
                (512, 8, 500000),  # speaker ID's k of 500,000 over 8 columns
            ],
            strict=True,
        )
    )
    assert training_shaped(GemmRows(np.ones(5), m, n, k, np.ones(5))).tolist() == [True, True, False, False, False]
    keep = training_shaped(deepbench_v100_gemms())
    assert (len(keep), int(keep.sum())) == (160, 52)  # counted in the file: 26 shapes, each in two transposes


def test_a_calibration_without_the_jobs_gemm_dtype_says_its_gemms_keep_the_built_in_curve():
    from itercast.profile.calibrate import merge_calibration

    h100 = Job.from_dicts({"preset": "gpt3-175b"}, {}, {"preset": "dgx-h100"}).system
    tf32_only = merge_calibration({"system": "dgx-h100", "gemm": {"tf32": flat()}})
    bf16 = AnalyticCostModel(h100, "bf16", tf32_only)
    assert bf16.extrapolations() == []  # nothing priced yet
    bf16.gemm_s(2 * 4096**3)
    assert bf16.extrapolations() == [
        "the calibration fitted GEMM curves for tf32 only: this job's bf16 GEMMs are priced on the built-in bf16 "
        "curve (profile bf16 GEMMs on the device, then calibrate)"
    ]
    # the built-in bf16 curve it kept: the same price as without a calibration
    assert float(bf16.gemm_s(2 * 4096**3)) == float(AnalyticCostModel(h100, "bf16").gemm_s(2 * 4096**3))
    # an fp32 job prices on the calibrated tf32 curve (efficiency 1, no latency, relative to the H100's FP32
    # peak, 67 TFLOP/s on the datasheet: PyTorch's matmuls leave TF32 off by default), and says nothing
    fp32 = AnalyticCostModel(h100, "fp32", tf32_only)
    assert float(fp32.gemm_s(1e12)) == pytest.approx(1e12 / 66.9e12)
    assert fp32.extrapolations() == []
    # no calibration, or one that fitted no GEMM: no line
    for cal in (None, merge_calibration({"system": "dgx-h100"})):
        model = AnalyticCostModel(h100, "bf16", cal)
        model.gemm_s(1e12)
        assert model.extrapolations() == []
