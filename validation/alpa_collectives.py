"""Alpa's V100 profiling database: collective models fitted on groups of ≤ 8 GPUs predict 16 and 32.

    python validation/alpa_collectives.py            # reads $ITERCAST_DATA or ../shared/data

The importer drops the rows Alpa did not measure: empty messages, per-rank shards or all-to-all
per-peer chunks, and the points its make_monotonic() wrote (the data's SOURCES.txt caveat; see
import_alpa); it stores an all-to-all's per-rank buffer (Alpa's x/n). Per collective, on the
same held-out rows (groups of 16 and 32 GPUs over 2 and 4 p3.16xlarge hosts), as geomean and median
|predicted/measured − 1|, overall and for messages below 1 MiB:
- analytic: the uncalibrated model of the v100-p3.16xlarge preset (curves fitted on H100/Polaris);
- calibrated: the inter-node curve refitted on this database's groups of ≤ 8 GPUs that span hosts
  (itercast.costs.fitting.fit_collective with ranks: latency in log2 nodes and in log2 ranks or
  per peer, and the bandwidth ramp);
- straight line: t = a + b · bus_bytes / B on the same training rows, the form pipeDejavu used
  (R² = 1.00 on its training curves, yet 24% median error on small messages).
bus_bytes is itercast.costs.analytic.bus_bytes (an all-to-all across hosts: the bytes through the
NIC). B is the per-rank bandwidth of the group's placement: NVLink within a host; across hosts the
host's one 25 Gb/s NIC shared by its 8 GPUs, all of which Alpa ran at once (its n_groups concurrent
groups). Printed first, the choices made on the training rows only: the ramp's argument by
leave-one-layout-out geomean |error| over the ≤ 8-GPU layouts (bus bytes, NIC bytes = bus × groups
sharing a NIC, one ring step's bytes), the lower kept; then the latency's growth with the group,
log2(ranks) or per peer, by predicting the groups of 8 from those of 2 and 4 (fit_collective).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.config.job import load_system
from itercast.costs.analytic import AnalyticCostModel, bus_bytes
from itercast.costs.fitting import collective_time_s, fit_collective, geomean_abs_err
from itercast.data_paths import shared_data_dir
from itercast.hardware.topology import GroupPlacement
from itercast.profile.db import ProfileDB
from itercast.profile.importers import import_alpa

SMALL_BYTES = 1 << 20


def errors(pred: np.ndarray, meas: np.ndarray) -> tuple[float, float]:
    return geomean_abs_err(pred, meas), float(np.median(np.abs(pred / meas - 1)))


def leave_one_layout_out(bus, t, nodes, ranks, bw, layout, ramp_of: str) -> float:
    """Geomean |error| of each layout's rows predicted by the fit on the other layouts."""
    pred = np.empty_like(t)
    for lay in np.unique(layout):
        out = layout == lay
        fit = fit_collective(bus[~out], t[~out], nodes[~out], bw[~out], {"ramp_of": ramp_of}, ranks[~out], starts=8)
        pred[out] = collective_time_s(fit, bus[out], nodes[out], ranks[out], bw[out])
    return geomean_abs_err(pred, t)


def main() -> None:
    data = shared_data_dir()
    if data is None:
        print("no shared data (set ITERCAST_DATA or place ../shared/data beside the repo): nothing to validate")
        return
    system = load_system("v100-p3.16xlarge")
    analytic = AnalyticCostModel(system, "fp16")
    intra, nic_per_gpu = system.node.intra_node_bandwidth_bytes_per_s, system.nic_bandwidth_per_gpu_bytes_per_s()
    per_host = system.node.gpus_per_node
    with tempfile.TemporaryDirectory() as tmp:
        db = ProfileDB(Path(tmp) / "alpa.db")
        counts = import_alpa(db, data / "profiling" / "alpa_v100_p3.16xlarge_prof_db.csv")
        rows = list(db.measurements(family="collective"))
    print(f"Alpa database: {dict(counts)}")
    print(f"{'collective':15} {'model':14} {'held-out geomean':>17} {'median':>8} {'<1 MiB geomean':>15} {'median':>8}")
    for op in ("all_reduce", "all_gather", "reduce_scatter", "alltoall"):
        sel = [r for r in rows if r.op == op and r.group_size > 1]
        n = np.array([r.group_size for r in sel], dtype=float)
        nodes = np.array([r.nodes for r in sel], dtype=float)
        size = np.array([r.size for r in sel])
        t = np.array([r.time_s for r in sel])
        bus = np.array([bus_bytes(op, s, int(k), int(m)) for s, k, m in zip(size, n, nodes, strict=True)])
        bw = np.where(nodes == 1, intra, np.minimum(intra, n / nodes * nic_per_gpu))
        # the held-out groups all span hosts: fit the inter-node curve on the training groups that do
        # (the analytic model also keeps intra- and inter-node curves apart)
        train, test = (n <= 8) & (nodes > 1), n >= 16
        layout = n * 100 + nodes
        cv = {
            ramp: leave_one_layout_out(bus[train], t[train], nodes[train], n[train], bw[train], layout[train], ramp)
            for ramp in ("bus", "step")
        }
        # NIC bytes: bus × the groups sharing a host's NIC (per_host / ranks per host) = bus × NIC / bw;
        # as the ramp's argument that is the bus ramp with bw folded in, fitted on scaled bytes
        nic_scale = per_host * nic_per_gpu / bw
        cv["nic"] = leave_one_layout_out(
            bus[train] * nic_scale[train],
            t[train],
            nodes[train],
            n[train],
            bw[train] * nic_scale[train],
            layout[train],
            "bus",
        )
        ramp = min(cv, key=lambda name: cv[name])
        # the NIC ramp is the bus ramp on bytes and bandwidth scaled by nic_scale
        scale = nic_scale if ramp == "nic" else np.ones_like(bus)
        fit = fit_collective(
            bus[train] * scale[train],
            t[train],
            nodes[train],
            bw[train] * scale[train],
            {"ramp_of": "step" if ramp == "step" else "bus"},
            ranks=n[train],
            starts=8,
        )
        print(
            f"{op:15} ramp chosen on training layouts: "
            + ", ".join(f"{k} {v:.1%}" for k, v in cv.items())
            + f" → {ramp}; "
            f"latency in {fit['latency_of']} (predicting groups of 8 from 2 and 4: {fit['latency_choice_err']:.1%})"
        )
        calibrated = collective_time_s(fit, bus * scale, nodes, n, bw * scale)
        a, b = np.polynomial.polynomial.polyfit((bus / bw)[train], t[train], 1)
        line = a + b * bus / bw
        plain = np.array(
            [
                analytic.collective_s(op, s, GroupPlacement(int(k), int(m), int(k // m)))
                for s, k, m in zip(size, n, nodes, strict=True)
            ]
        )
        small = test & (size < SMALL_BYTES)
        for name, pred in (("analytic", plain), ("calibrated", calibrated), ("straight line", line)):
            g, med = errors(pred[test], t[test])
            gs, meds = errors(pred[small], t[small])
            print(f"{op:15} {name:14} {g:17.1%} {med:8.1%} {gs:15.1%} {meds:8.1%}")
        print(
            f"{'':15} (training rows {int(train.sum())}, held-out rows {int(test.sum())}, "
            f"calibrated in-sample mean |error| {fit['fit_mean_abs_err']:.1%})"
        )


if __name__ == "__main__":
    main()
