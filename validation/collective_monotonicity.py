"""Does a larger collective ever cost less? Every system preset's price of each collective, swept over message sizes.

    python validation/collective_monotonicity.py

NCCL's tuner can always run a smaller message as it would a larger one, so a measured collective's time does not
fall as its message grows. Each preset's AnalyticCostModel.collective_s is swept over SIZES_BYTES (1 KB to 16 GB, a
buffer's bytes) on groups of 1 and of every GPU a node over NODE_COUNTS nodes (one node: the node's GPUs); printed:
every (preset, collective, group) whose price falls somewhere, the largest fall (the size before it, the prices on
both sides) and how many times it falls. A check of the model's form, no measurement: where a price falls, one side
of the fall is wrong, and which one is for measurements to say. On 2026-12-03 (session 39, after the EFA all-gather's
exponent was bounded) the falls left were: at the bound between an inter-node curve's small-message regime
(Polaris's, on every preset) and its large one (at 128 nodes x 8, InfiniBand's all-gather 4.33 -> 2.43 ms and
all-to-all 5.14 -> 0.47 ms); and on v100-p3.16xlarge, whose 25 Gb/s a node is 1/16 of Polaris's, inside Polaris's
curves, whose efficiency ramps carry latency as lost bandwidth (an all-reduce of 1 MB across 2 nodes 45.8 ms, of a
little more 4.5 ms; an all-to-all on 64 x 8 V100 of 137 KB 93 ms). Since session 40 a ramp runs on bytes scaled by the
network's bandwidth against its fit's (costs/analytic.network_ramp_scale): v100-p3.16xlarge's falls are now those of
every preset, at the small regime's bound (an all-reduce across 2 nodes x 1 GPU of 30 KB 1.42 -> 0.32 ms), its 64 x 8
all-to-all of 137 KB 2.6 ms; and below a ramp's least-time size a message takes that size's time
(costs/fitting.collective_time_s), which ended the falls within the p3.16xlarge's mesh all-to-all (exponent 1.33, 57
falls below 1 MB on one node) and Polaris's large all-to-all (refitted so); and a message below a regime's bound
costs at most what the next regime's smallest costs (AnalyticCostModel._inter_node_s), which ended the falls at the
bound: all 180 groups never fall.

Does a faster NIC ever cost more? Each preset with each network's curves (CURVE_SETS) at NIC_BANDWIDTHS a GPU: every
(preset, curves, collective, group, size) whose price rises with the NIC. On 2026-12-07 (session 58, a user probe:
on dgx-h100 x 4 with Polaris's curves a reduce-scatter of 1 MB took 0.216 ms at 50 GB/s a GPU and 0.931 ms at 400)
the inter-node ramp was scaled by the NIC's nominal bandwidth even where the ring could not use it; since, by the
bandwidth the ring reaches (AnalyticCostModel._inter_node_s): 1,794 of 2,880 rose before, none now.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.config.job import load_system
from itercast.config.presets import preset_names
from itercast.costs.analytic import AnalyticCostModel
from itercast.hardware.topology import GroupPlacement

SIZES_BYTES = np.geomspace(1e3, 16e9, 200)
NODE_COUNTS = (1, 2, 8, 64, 128)
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "alltoall")
CURVE_SETS = ("polaris-slingshot11", "h100-400g", "h100-efa")
NIC_BANDWIDTHS = (3e9, 6e9, 12.5e9, 25e9, 50e9, 100e9, 200e9, 400e9, 800e9)
NIC_SIZES_BYTES = np.geomspace(1e3, 1e10, 8)


def falls(costs: AnalyticCostModel, kind: str, group: GroupPlacement) -> tuple[int, int, np.ndarray]:
    """How many times the price falls between neighbouring sizes, the index of the largest relative fall and the
    prices (seconds)."""
    prices = np.array([costs.collective_s(kind, float(s), group) for s in SIZES_BYTES])
    step = np.diff(prices) / prices[:-1]
    return int(np.sum(step < -1e-9)), int(np.argmin(step)), prices


def main() -> None:
    print("price falls as the message grows (preset, collective, nodes x GPUs a node): size before -> after")
    clean = 0
    for name in preset_names("system"):
        system = load_system(name)
        if system.node.gpus_per_node < 2 or name == "cpu-host":
            continue
        costs = AnalyticCostModel(system, "bf16")
        for kind in KINDS:
            for nodes in NODE_COUNTS:
                for per_node in sorted({1, system.node.gpus_per_node} if nodes > 1 else {system.node.gpus_per_node}):
                    count, worst, prices = falls(costs, kind, GroupPlacement(nodes * per_node, nodes, per_node))
                    if not count:
                        clean += 1
                        continue
                    print(
                        f"  {name:17s} {kind:14s} {nodes:3d} x {per_node}: at {SIZES_BYTES[worst]:9.3g} B "
                        f"{prices[worst] * 1e3:8.3f} -> {prices[worst + 1] * 1e3:8.3f} ms ({count} falls)"
                    )
    print(f"groups whose price never falls: {clean}")
    rises()


def rises() -> None:
    """Every (preset, curves, collective, group, size) priced more on a faster NIC, and how many were swept."""
    print("prices that rise with the NIC (preset, curves, collective, nodes x GPUs a node, size): NIC GB/s a GPU")
    swept = risen = 0
    for name in preset_names("system"):
        base = load_system(name)
        gpn = base.node.gpus_per_node
        if gpn < 2 or name == "cpu-host":
            continue
        for curves in CURVE_SETS:
            models = []
            for nic in NIC_BANDWIDTHS:
                network = base.network.model_copy(
                    update={"collective_curves": curves, "nic_bandwidth_bytes_per_s": nic}
                )
                models.append(AnalyticCostModel(base.model_copy(update={"num_nodes": 128, "network": network}), "bf16"))
            for kind in KINDS:
                for nodes in (2, 8, 64):
                    for per_node in sorted({1, gpn}):
                        group = GroupPlacement(nodes * per_node, nodes, per_node)
                        for size in NIC_SIZES_BYTES:
                            prices = [m.collective_s(kind, float(size), group) for m in models]
                            swept += 1
                            up = [i for i in range(len(prices) - 1) if prices[i + 1] > prices[i] * (1 + 1e-9)]
                            risen += bool(up)
                            if up and risen <= 10:
                                i = up[0]
                                print(
                                    f"  {name:17s} {curves:19s} {kind:14s} {nodes:3d} x {per_node} {size:8.2g} B: "
                                    f"{NIC_BANDWIDTHS[i] / 1e9:g} -> {NIC_BANDWIDTHS[i + 1] / 1e9:g} GB/s "
                                    f"{prices[i] * 1e3:.3f} -> {prices[i + 1] * 1e3:.3f} ms"
                                )
    print(f"priced collectives that rise with the NIC: {risen} of {swept} (the first 10 shown)")


if __name__ == "__main__":
    main()
