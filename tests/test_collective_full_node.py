"""Inter-node collectives capped at a fraction of the node's NICs when all its GPUs drive them
(costs/fitting.collective_time_s `node_nic_fraction`; tools/fit_efficiency_curves.py _h100_400g)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_golden import SYSTEM, flat, linear_calibration

from itercast.config.job import Job
from itercast.costs.analytic import AnalyticCostModel
from itercast.costs.fitting import collective_time_s, fit_collective
from itercast.hardware.topology import GroupPlacement

#: an H100-like node, no hop latency (so no latency floor): NVLink 450 GB/s per GPU, 8 NICs of 50 GB/s
NODE = {"gpus_per_node": 8, "intra_node_bandwidth_bytes_per_s": 450e9, "intra_node_latency_s": 0.0}
NETWORK = {"nics_per_node": 8, "nic_bandwidth_bytes_per_s": 50e9, "latency_s": 0.0}


def _all_reduce_s(inter: dict, group: GroupPlacement) -> float:
    """A 1 GB all-reduce over `group` on 2 nodes, priced with the inter-node curve `inter`."""
    system = {**SYSTEM, "node": NODE, "network": NETWORK, "num_nodes": 2}
    job = Job.from_dicts({"preset": "gpt3-175b"}, {"data_parallel": 16}, system)
    cal = linear_calibration()
    cal["collectives"]["inter_node"] = {"all_reduce": inter}
    return AnalyticCostModel(job.system, "bf16", cal).collective_s("all_reduce", 1e9, group)


def test_full_nodes_are_capped_at_the_fraction_of_their_nics_partial_nodes_are_not():
    """Flat curve (efficiency 2 / (1 + e^0) = 1, no latency), node_nic_fraction 0.8.
    8 GPUs per node × 2 nodes: bus 2 · 15/16 · 1e9 = 1.875e9 B per rank over
    min(450e9, 8 · 50e9, 0.8 · 8 · 50e9) = 320e9 B/s: 5.859375 ms (uncapped 400e9: 4.6875 ms).
    4 GPUs per node × 2 nodes: bus 2 · 7/8 · 1e9 = 1.75e9 B over min(450e9, 4 · 50e9, 320e9) =
    200e9 B/s: 8.75 ms, with or without the cap."""
    full, half = GroupPlacement(16, 2, 8), GroupPlacement(8, 2, 4)
    capped = flat(node_nic_fraction=0.8)
    assert _all_reduce_s(capped, full) == pytest.approx(1.875e9 / 320e9)
    assert _all_reduce_s(flat(), full) == pytest.approx(1.875e9 / 400e9)
    assert _all_reduce_s(capped, half) == pytest.approx(1.75e9 / 200e9)
    assert _all_reduce_s(flat(), half) == pytest.approx(1.75e9 / 200e9)


def test_the_cap_sits_under_the_ramp_and_the_latency():
    """alpha 10 µs per log2(nodes), e_max 0.8, half at 1e6 B, gamma 1, fraction 0.75; 1e9 bus bytes on
    4 nodes: eff = 0.8 / (1 + 1e6 / 1e9) = 0.8 / 1.001. Node of 8 × 50e9 B/s: the full node's 400e9
    capped at 0.75 · 400e9 = 300e9: 2 · 10 µs + 1e9 · 1.001 / (300e9 · 0.8) = 20 µs + 1.001 / 240 s;
    a half node's 200e9 is under the cap: 20 µs + 1.001 / 160 s."""
    fit = {"alpha0_s": 0.0, "alpha_per_log2_nodes_s": 10e-6, "e_max": 0.8, "log_half": math.log(1e6)}
    fit |= {"gamma": 1.0, "node_nic_fraction": 0.75}
    got = collective_time_s(fit, 1e9, 4, np.array([32.0, 16.0]), np.array([400e9, 200e9]), 400e9)
    assert got == pytest.approx([20e-6 + 1.001 / 240, 20e-6 + 1.001 / 160])
    assert float(collective_time_s(fit, 1e9, 4, 32, 400e9)) == pytest.approx(20e-6 + 1.001 / 320)  # no node given


def test_fit_recovers_the_node_fraction_from_full_and_partial_nodes():
    """Times drawn from the curve with fraction 0.8 at 1, 2, 4 and 8 GPUs per node of 8 × 50e9 B/s
    (10 nodes, 32 MiB to 16 GiB of bus bytes) give back 0.8; without the node's NIC bandwidth the
    fraction is neither fitted nor written."""
    law = {"alpha0_s": 0.0, "alpha_per_log2_nodes_s": 100e-6, "e_max": 0.98, "log_half": math.log(5e7)}
    law |= {"gamma": 1.5, "node_nic_fraction": 0.8}
    per_node = np.repeat([1.0, 2.0, 4.0, 8.0], 10)
    bus = np.tile(2.0 ** np.arange(25, 35), 4)
    bw, node = np.minimum(450e9, per_node * 50e9), np.full(40, 400e9)
    t = collective_time_s(law, bus, 10, 10 * per_node, bw, node)
    fit = fit_collective(bus, t, np.full(40, 10.0), bw, fixed={"alpha0_s": 0.0}, node_nic_bw=node)
    assert fit["node_nic_fraction"] == pytest.approx(0.8, rel=1e-3)
    assert "node_nic_fraction" not in fit_collective(bus, t, np.full(40, 10.0), bw, fixed={"alpha0_s": 0.0})
