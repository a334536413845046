"""An all-gather or reduce-scatter across nodes pays one latency per ring step, ranks − 1 of them, as NCCL's tuning
model prices a ring (tools/fit_efficiency_curves.py _h100_400g, _ring_fit): every ring measured at scale does so
(Polaris's small all-gathers 7.5–7.9 µs a step at 512–2,160 ranks, EFA's all-gather 8.75 µs, NVIDIA/nccl-tests#322's
forced ring ~9.5 µs at 1,024). Until session 41 InfiniBand's took a latency by log2(nodes) and a ramp of exponent 3.9,
whose least-time size priced every all-gather of 1 MB to 256 MB over 128 nodes of 8 at 2.43 ms and over 280 at 5.32."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from itercast.config.job import load_system
from itercast.costs.analytic import AnalyticCostModel
from itercast.costs.fitting import collective_time_s
from itercast.hardware.topology import GroupPlacement

ROOT = Path(__file__).resolve().parents[1]


def _dgx_h100_s(kind: str, nodes: int, size_bytes: float) -> float:
    costs = AnalyticCostModel(load_system("dgx-h100"), "bf16")
    return float(costs.collective_s(kind, size_bytes, GroupPlacement(nodes * 8, nodes, 8)))


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("nodes", [32, 128, 280])
def test_a_small_ring_across_nodes_costs_what_rings_measured_at_scale_pay_a_step(kind: str, nodes: int) -> None:
    # a 1 MB buffer over nodes x 8 H100: its bytes take ~3 µs at 320 GB/s, the rest is the ring's k − 1 steps,
    # each priced within the 5–10 µs that rings measured at 128–2,160 ranks on three fabrics take
    steps = nodes * 8 - 1
    per_step_s = _dgx_h100_s(kind, nodes, 1e6) / steps
    assert 5e-6 < per_step_s < 10e-6


def test_a_ring_over_more_nodes_takes_longer_by_its_added_steps() -> None:
    # 280 nodes of 8 add 2,239 − 1,023 = 1,216 steps to 128 nodes': at 5–10 µs a step, 6.1–12.2 ms more
    # (the latency by log2(nodes) added 2.9 ms)
    added_s = _dgx_h100_s("all_gather", 280, 1e6) - _dgx_h100_s("all_gather", 128, 1e6)
    assert 1216 * 5e-6 < added_s < 1216 * 10e-6


def test_the_ring_fit_recovers_a_per_step_latency_and_keeps_its_ramp_at_most_linear() -> None:
    """Times of a Hockney ring at 10 nodes of 1, 2, 4 and 8 GPUs (k = 10, 20, 40, 80), 8 µs a step, bus bytes
    32 MiB to 16 GiB at min(per_node × 50 GB/s, 0.8 × 400 GB/s): t = 8e-6 · (k − 1) + bus / bw. The 8-GPU rows
    (bw 320 GB/s, not 400) give the node fraction 0.8; a flat ramp is the exponent's bound, 1, at its least half
    size, and e_max 1: each point back within 0.1%."""
    sys.path.insert(0, str(ROOT / "tools"))
    from fit_efficiency_curves import _ring_fit

    per_node = np.repeat([1, 2, 4, 8], 10)
    ranks = 10 * per_node
    bus = np.tile(2.0 ** np.arange(25, 35), 4)
    bw = np.minimum(per_node * 50e9, 0.8 * 400e9)
    t = 8e-6 * (ranks - 1) + bus / bw
    assert t[-1] == pytest.approx(79 * 8e-6 + 2.0**34 / 320e9)  # 0.632 ms + 53.69 ms
    per_step = {"alpha0_s": 0.0, "alpha_per_log2_nodes_s": 0.0, "alpha_per_log2_ranks_s": 0.0}
    fit = _ring_fit(list(bus), list(t), [10] * 40, list(per_node * 50e9), per_step, list(ranks), [400e9] * 40)
    assert fit["alpha_per_peer_s"] == pytest.approx(8e-6, rel=0.02)
    assert fit["node_nic_fraction"] == pytest.approx(0.8, rel=0.01)
    assert fit["gamma"] <= 1.0
    priced = collective_time_s(fit, bus, 10, ranks, per_node * 50e9, 400e9)
    assert np.max(np.abs(priced / t - 1)) < 1e-3
    assert math.isclose(fit["e_max"], 1.0, rel_tol=2e-3)
