"""The dgx-h100 and dgx-a100 presets' inter-node collectives against public nccl-tests results beyond one node.

    python validation/collectives_at_scale.py       # the shared data's 10-node rows too, if present

A check, not a fit: the curve `h100-400g` (costs/curves.json, tools/fit_efficiency_curves.py) was
fitted on one 10-node cluster (xxrjun/nccl-tests-cluster); here it prices the points transcribed in
data/published/collectives/h100_multinode_nccl_tests.csv (GitHub issues of NVIDIA/nccl and
NVIDIA/nccl-tests, 2 to 248 nodes). Error = predicted / measured time − 1 (negative: too fast).
A row's measured time is its nccl-tests out-of-place time where the source prints the log line,
else size × bus factor / busbw (nccl-tests doc/PERFORMANCE.md: busbw = algbw × factor, algbw = S/t).
Rows that leave the GPUs per node empty are priced at 8, the HGX/DGX H100 node (DGX H100 user
guide), and marked '*'. Rows without a message size (NVIDIA/nccl#1229) are priced at 1 GiB and
8 GiB and kept out of the band summaries. Bands: nodes 2–10 / 11–32 / 33–128 / > 128; message
< 1 MiB / 1–64 MiB / ≥ 64 MiB (DP and FSDP buckets).

H100 on AWS EFA (data/published/collectives/h100_aws_efa_nccl_tests.csv): one p5.48xlarge cluster measured at 2 to 32
nodes, all-gather and all-reduce of 32 MiB to 8 GiB, priced on dgx-h100 as it is: the same 3.2 Tb/s a node, but over EFA
(SRD, aws-ofi-nccl), whose per-step latency is its own (its all-gather's fits 8.75 µs a ring step, InfiniBand's 6.2
since session 41); what it shows is how the measured time grows with the nodes at each size against how the priced
one does.

A100 (data/published/collectives/a100_multinode_nccl_tests.csv, InfiniBand HDR clusters): each row priced on
dgx-a100 with the NICs the row states ("4x HDR 200Gb": 4 NICs of 25 GB/s a node; unstated: DGX A100's 8), under
both measured clusters' curves (SystemConfig network.collective_curves): polaris-slingshot11 (Slingshot 11, the
preset's until 2026-12-01) and h100-400g (InfiniBand NDR, the same NCCL IB transport as HDR). Rows the source
calls misconfigured ('stated misconfigured' in their note) and 0-byte lines are printed and kept out of the summaries.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.config.job import load_system
from itercast.costs.analytic import BUS_FACTOR, AnalyticCostModel
from itercast.costs.curves import curves
from itercast.data_paths import read_csv_rows, shared_data_dir
from itercast.hardware.topology import GroupPlacement

PUBLISHED = Path(__file__).resolve().parents[1] / "data" / "published" / "collectives"
POINTS = PUBLISHED / "h100_multinode_nccl_tests.csv"
A100_POINTS = PUBLISHED / "a100_multinode_nccl_tests.csv"
EFA_POINTS = PUBLISHED / "h100_aws_efa_nccl_tests.csv"
ASSUMED_GPUS_PER_NODE = 8  # HGX/DGX H100 and DGX A100: 8 GPUs a node (their user guides)
HDR_NIC_BYTES_PER_S = 25e9  # InfiniBand HDR: 200 Gb/s a port
UNSTATED_SIZES_B = (1 << 30, 8 << 30)  # a message size the source does not give: priced at both
NODE_BANDS = ((2, 11, "2-10"), (11, 33, "11-32"), (33, 129, "33-128"), (129, float("inf"), ">128"))
SIZE_BANDS = ((0, 1 << 20, "<1MiB"), (1 << 20, 64 << 20, "1-64MiB"), (64 << 20, float("inf"), ">=64MiB"))


def measured_time_s(kind: str, size_bytes: float, ranks: int, oop_time_us: str, busbw_gbps: str) -> float:
    """The row's time: its printed out-of-place time, else size × bus factor / busbw (GB/s = 1e9 B/s)."""
    if oop_time_us:
        return float(oop_time_us) * 1e-6
    return size_bytes * BUS_FACTOR[kind](ranks) / (float(busbw_gbps) * 1e9)


def band(value: float, bands: tuple) -> str:
    """The label of the band [low, high) that holds `value`."""
    for low, high, label in bands:
        if low <= value < high:
            return label
    raise ValueError(f"no band holds {value}")


def summary(errors: list[float]) -> str:
    """Geomean |error|, mean |error|, mean signed error, the worst (%) and count of a band's errors."""
    e = np.asarray(errors)
    geomean = np.exp(np.mean(np.log(np.abs(e) + 1e-12)))
    worst = e[np.argmax(np.abs(e))]
    return (
        f"geomean |err| {geomean:6.1%}  mean |err| {np.mean(np.abs(e)):6.1%}  mean {np.mean(e):+6.1%}  "
        f"worst {worst:+7.1%}  n={len(e)}"
    )


def row_group(r: dict[str, str]) -> GroupPlacement:
    """The row's group: its nodes of its GPUs a node (ASSUMED_GPUS_PER_NODE where the source leaves it out)."""
    per_node, nodes = int(r["gpus_per_node"] or ASSUMED_GPUS_PER_NODE), int(r["nodes"])
    return GroupPlacement(nodes * per_node, nodes, per_node)


def row_error(model: AnalyticCostModel, r: dict[str, str], size: float) -> tuple[float, float]:
    """The row's measured time at `size` bytes (seconds) and the model's error against it (predicted / measured − 1)."""
    group = row_group(r)
    meas = measured_time_s(r["collective"], size, group.size, r["oop_time_us"], r["busbw_GBs"])
    return meas, model.collective_s(r["collective"], size, group) / meas - 1


def check(points: Path, model_of: Callable[[dict[str, str]], AnalyticCostModel]) -> None:
    """Every row of `points` priced by the cost model `model_of` gives for it, and the summaries by band."""
    by_nodes, by_size, by_both = defaultdict(list), defaultdict(list), defaultdict(list)
    print(f"{'source':22s} {'coll':14s} {'nodes':>5s} {'g/n':>4s} {'size':>11s} {'meas us':>9s} {'pred us':>9s} err")
    for r in read_csv_rows(points):
        group = row_group(r)
        nodes, per_node = group.nodes, group.per_node
        mark = "" if r["gpus_per_node"] else "*"
        kept = "stated misconfigured" not in r["note"]
        model = model_of(r)
        for size in (float(r["size_B"]),) if r["size_B"] else UNSTATED_SIZES_B:
            meas, err = row_error(model, r, size)
            label = f"{int(size)}" if r["size_B"] else f"{int(size)}?"
            print(
                f"{r['source']:22s} {r['collective']:14s} {nodes:5d} {per_node:3d}{mark:1s} {label:>11s} "
                f"{meas * 1e6:9.1f} {(err + 1) * meas * 1e6:9.1f} {err:+6.1%}{'' if kept else ' (misconfigured)'}"
            )
            if r["size_B"] and size > 0 and kept:  # an empty collective (nccl-tests' 0 B line) is no message
                nb, sb = band(nodes, NODE_BANDS), band(size, SIZE_BANDS)
                by_nodes[nb].append(err)
                by_size[sb].append(err)
                by_both[(nb, sb)].append(err)
    print("\nRows with a message size, by node band, size band, and both:")
    for _, _, nb in NODE_BANDS:
        if by_nodes[nb]:
            print(f"  nodes {nb:7s}            {summary(by_nodes[nb])}")
    for _, _, sb in SIZE_BANDS:
        if by_size[sb]:
            print(f"  size  {sb:8s}           {summary(by_size[sb])}")
    for (nb, sb), errs in sorted(by_both.items()):
        print(f"  nodes {nb:7s} size {sb:8s} {summary(errs)}")


def efa_split(models: dict[str, AnalyticCostModel]) -> None:
    """The EFA rows by collective, on the nodes the h100-efa curves were fitted on and on those held out of the fit
    (each fit's `fitted_nodes`, tools/fit_efficiency_curves.py _h100_efa), priced by each of `models`."""
    fits = curves()["collectives"]["inter_node_networks"]["h100-efa"]
    rows = read_csv_rows(EFA_POINTS)
    print("\nEFA rows by collective, on the nodes h100-efa was fitted on and on those held out:")
    for name, model in models.items():
        for coll in sorted({r["collective"] for r in rows}):
            fitted = set(fits[coll]["regimes"][-1]["fitted_nodes"])
            for part, keep in (("fitted", True), ("held out", False)):
                chosen = [r for r in rows if r["collective"] == coll and (int(r["nodes"]) in fitted) == keep]
                errs = [row_error(model, r, float(r["size_B"]))[1] for r in chosen]
                print(f"  {name:17s} {coll:11s} {part:9s} {summary(errs)}")


def a100_model(curves: str) -> Callable[[dict[str, str]], AnalyticCostModel]:
    """dgx-a100 priced on the `curves` cluster's inter-node fits, with the NICs a row states."""

    def model_of(r: dict[str, str]) -> AnalyticCostModel:
        nics = int(r["nic"].split("x")[0]) if r["nic"][:1].isdigit() else None
        network: dict[str, object] = {"collective_curves": curves}
        if nics is not None:
            network |= {"nics_per_node": nics, "nic_bandwidth_bytes_per_s": HDR_NIC_BYTES_PER_S}
        return AnalyticCostModel(load_system("dgx-a100", network=network), "bf16")

    return model_of


def main() -> None:
    model = AnalyticCostModel(load_system("dgx-h100"), "bf16")
    print("H100 (dgx-h100):")
    check(POINTS, lambda r: model)
    _fitting_reference(model)
    print("\nH100 on AWS EFA (p5.48xlarge, priced on dgx-h100: the same bytes a node, not its InfiniBand latency):")
    check(EFA_POINTS, lambda r: model)
    efa_split({"dgx-h100": model, "h100-p5.48xlarge": AnalyticCostModel(load_system("h100-p5.48xlarge"), "bf16")})
    if A100_POINTS.exists():
        for curves in ("polaris-slingshot11", "h100-400g"):
            print(f"\nA100 (dgx-a100, collective_curves {curves}):")
            check(A100_POINTS, a100_model(curves))


def _fitting_reference(model: AnalyticCostModel) -> None:
    """The curve's own fitting data (xxrjun, 10 nodes), messages ≥ 64 MiB, by GPUs per node: the
    in-sample residual the points above are read against. Skipped without the shared data."""
    data = shared_data_dir()
    if data is None:
        print("\n(shared data absent: the 10-node fitting rows are not shown)")
        return
    errs: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in read_csv_rows(data / "collectives" / "nccl_tests_tidy.csv"):
        size = float(r["size_B"])
        if not r["system"].startswith("H100 cluster01") or r["nodes"] != "10" or size < (64 << 20):
            continue
        if r["collective"] not in BUS_FACTOR:
            continue
        group = GroupPlacement(int(r["ranks"]), 10, int(r["gpus_per_node"]))
        pred = model.collective_s(r["collective"], size, group)
        errs[(r["collective"], r["gpus_per_node"])].append(pred / (float(r["oop_time_us"]) * 1e-6) - 1)
    print("\nFitting data (xxrjun/nccl-tests-cluster, 10 nodes, >= 64 MiB), by collective and GPUs per node:")
    for (coll, g), e in sorted(errs.items()):
        print(f"  {coll:14s} {g} GPU/node  {summary(e)}")


if __name__ == "__main__":
    main()
