"""Jean Zay's network between nodes as BigScience measured it, against the 4 × 100 Gb/s Omni-Path assumed.

    python validation/jean_zay_network.py

data/published/collectives/jean_zay_all_reduce.csv holds the only published measurements of that network: fp32
all-reduces of 4e9 bytes on 4 nodes of 8 A100 (January 2022) and on 4 and 16 nodes of 4 V100.
Each is priced on the system the Jean Zay rows of data/published/ use (dgx-a100, or the V100 rows' p3.16xlarge with
4 GPUs a node; 4 NICs a node, as every node's NCCL log names 4 hfi1 interfaces), first at the nominal 12.5e9 bytes/s
a NIC, then the per-NIC bandwidth that prices the measured time is solved for (scipy.optimize.brentq): an effective
bandwidth of NCCL's InfiniBand-verbs transport over Omni-Path, not a port speed. The V100 value solved on 4 nodes is
checked on the 16-node run (another NCCL, 2021). A derivation from collective measurements, not from step times: the
Jean Zay A100 rows carry the A100 value (rounded).
"""

from __future__ import annotations

import sys
from pathlib import Path

from scipy.optimize import brentq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.config.job import load_system
from itercast.config.system import SystemConfig
from itercast.costs.analytic import AnalyticCostModel
from itercast.data_paths import read_csv_rows
from itercast.hardware.topology import GroupPlacement

MEASURED = Path(__file__).resolve().parents[1] / "data" / "published" / "collectives" / "jean_zay_all_reduce.csv"
#: Omni-Path 100 series: 100 Gb/s a port, one direction
OPA_NIC_BYTES_PER_S = 12.5e9


def jean_zay_system(gpu: str, nodes: int, nic_bytes_per_s: float) -> SystemConfig:
    """The system the Jean Zay rows price: dgx-a100 for A100; for V100 the V100 rows' p3.16xlarge with 4 GPUs a node and
    a 5 µs hop; 4 NICs a node of `nic_bytes_per_s` each."""
    network: dict[str, float | int] = {"nics_per_node": 4, "nic_bandwidth_bytes_per_s": nic_bytes_per_s}
    if gpu.startswith("A100"):
        return load_system("dgx-a100", num_nodes=nodes, network=network)
    v100_network = network | {"latency_s": 5e-6}
    return load_system(
        "v100-p3.16xlarge", num_nodes=nodes, node={"gpus_per_node": 4, "nvlink_links": None}, network=v100_network
    )


def all_reduce_s(row: dict[str, str], nic_bytes_per_s: float) -> float:
    """itercast's time for the row's all-reduce on its Jean Zay system (seconds)."""
    nodes, per_node = int(row["nodes"]), int(row["gpus_per_node"])
    system = jean_zay_system(row["gpu"], nodes, nic_bytes_per_s)
    group = GroupPlacement(nodes * per_node, nodes, per_node)
    return AnalyticCostModel(system, row["dtype"]).collective_s("all_reduce", float(row["bytes"]), group)


def solved_nic_bytes_per_s(row: dict[str, str]) -> float:
    """The per-NIC bandwidth (bytes/s) at which itercast prices the row's measured time."""
    measured = float(row["seconds"])
    return float(brentq(lambda b: all_reduce_s(row, b) - measured, 1e7, 1e12, rtol=1e-6))


def main() -> None:
    rows = read_csv_rows(MEASURED)
    print(f"{'run':48} {'measured_s':>10} {'nominal_s':>9} {'ratio':>6} {'solved GB/s a NIC':>17}")
    for row in rows:
        nominal = all_reduce_s(row, OPA_NIC_BYTES_PER_S)
        solved = solved_nic_bytes_per_s(row)
        label = f"{row['gpu']} {row['nodes']}x{row['gpus_per_node']} ({row['date']}, NCCL {row['nccl'].split('+')[0]})"
        measured = float(row["seconds"])
        print(f"{label:48} {measured:10.4f} {nominal:9.4f} {measured / nominal:6.2f} {solved / 1e9:17.3f}")
    v100_4, v100_16 = (r for r in rows if r["gpu"].startswith("V100"))
    fitted = solved_nic_bytes_per_s(v100_4)
    held_out = all_reduce_s(v100_16, fitted)
    print(
        f"V100 held out: the 4-node value ({fitted / 1e9:.3f} GB/s) prices the 16-node run at {held_out:.4f} s, "
        f"measured {float(v100_16['seconds']):.4f} s ({held_out / float(v100_16['seconds']) - 1:+.1%})"
    )


if __name__ == "__main__":
    main()
