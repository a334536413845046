"""Polaris's measured all-gathers and all-to-alls (the fitting data of the A100 presets' inter-node
all-gather, reduce-scatter and all-to-all curves) against their price: how the ring's and the peers'
latency is followed from 2 to 540 nodes.

    python validation/collectives_polaris.py       # needs ../shared/data (or $ITERCAST_DATA)

An in-sample check, not a held-out one: tools/fit_efficiency_curves.py _polaris_regimes fits these rows
(its docstring gives the held-out figures: 2,160 ranks predicted from ≤ 1,024). Rows: alcf-nccl-tests'
all_gather and alltoall (4 A100 and 2 Slingshot-11 NICs a node), the fit's own points
(fit_efficiency_curves.polaris_points: the fastest of the runs with the Slingshot plugin per (nodes, size));
the all-to-alls of fewer than A2A_MIN_PEER_BYTES a peer, which the fit leaves out, in a band of their own
("tiny"). Priced by
the dgx-a100 preset with 4 GPUs and 2 NICs of 25 GB/s a node (Polaris's node) on Polaris's curves. Error = predicted /
measured − 1, summarised per collective, group size and message band (< 1 MiB, ≥ 1 MiB) as geomean
|error|, mean and worst.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "tools")]
from fit_efficiency_curves import A2A_MIN_PEER_BYTES, polaris_points  # noqa: E402

from itercast.config.job import Job  # noqa: E402
from itercast.costs.analytic import AnalyticCostModel  # noqa: E402
from itercast.data_paths import read_csv_rows, shared_data_dir  # noqa: E402
from itercast.hardware.topology import GroupPlacement  # noqa: E402

GPUS_PER_NODE = 4  # Polaris: 4 A100 a node (docs.alcf.anl.gov/polaris/hardware-overview)


def main() -> None:
    data = shared_data_dir()
    if data is None:
        print("no shared data (set ITERCAST_DATA or place ../shared/data beside the repo): nothing to validate")
        return
    rows = read_csv_rows(data / "collectives" / "nccl_tests_tidy.csv")
    job = Job.from_dicts(
        {"preset": "gpt3-175b"},
        {"data_parallel": GPUS_PER_NODE},
        {
            "preset": "dgx-a100",
            "node": {"gpus_per_node": GPUS_PER_NODE},
            "network": {"nics_per_node": 2, "collective_curves": "polaris-slingshot11"},
        },
    )
    costs = AnalyticCostModel(job.system, "fp16")
    errors: dict[tuple[str, int, str], list[float]] = defaultdict(list)
    for coll in ("all_gather", "alltoall"):
        for (nodes, ranks, size), measured_s in sorted(polaris_points(rows, coll).items()):
            priced = costs.collective_s(coll, size, GroupPlacement(ranks, nodes, ranks // nodes))
            band = "< 1 MiB" if size < 1 << 20 else ">= 1 MiB"
            if coll == "alltoall" and size / ranks < A2A_MIN_PEER_BYTES:
                band = "tiny"
            errors[coll, ranks, band].append(priced / measured_s - 1)
    print(f"{'collective':>10} {'ranks':>6} {'messages':>9} {'n':>3} {'geomean |error|':>16} {'mean':>8} {'worst':>8}")
    for (coll, ranks, band), e in sorted(errors.items()):
        x = np.asarray(e)
        worst = x[np.argmax(np.abs(x))]
        print(
            f"{coll:>10} {ranks:6d} {band:>9} {len(x):3d} {np.exp(np.mean(np.log(np.abs(x) + 1e-12))):16.1%}"
            f" {x.mean():+8.1%} {worst:+8.1%}"
        )


if __name__ == "__main__":
    main()
