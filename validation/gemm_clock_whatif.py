"""Do GEMMs in a whole training step run faster than the sustained ceiling? A what-if, not a model.

    python validation/gemm_clock_whatif.py

itercast holds every bf16 GEMM on an H100 or H200 to the rate it sustains at the 700 W limit
(`gpu.sustained_gemm_flops`, measured in GEMM-only windows of data/measured/h200_campaign at a median
SM clock of ~1,456 MHz). In the campaign's one-GPU eager step the GEMMs took 14-17% less time than that prices
(validation/gpu_campaign_check.py, "the traced steps by kernel family") while NVML read a median
clock of ~1,770 MHz under the same power cap: the memory-bound kernels between them draw less power.

A power-capped clock linear in the step's GEMM share g, f(g) = f_max - g (f_max - f_sustained), with
f_max the GPU's 1,980 MHz, gives the eager step (its traced GEMM share) the clock printed below
against the measured median. Applied to the fitting table (GEMM time x f_sustained / f(g), to first
order: the step less its GEMM time's saving), it makes the multi-GPU runs far too fast: rejected there
(2026-11-30, session 20). What the at-scale steps spend power on besides GEMMs (NVLink and network
traffic, communication kernels beside them) is not measured here.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "validation"))
from gpu_campaign_check import step_family_ms  # noqa: E402
from step_times import all_rows, distinct_configs  # noqa: E402

from itercast.config.job import Job  # noqa: E402
from itercast.data_paths import read_csv_rows, shared_data_dir  # noqa: E402
from itercast.errors import ConfigError  # noqa: E402
from itercast.predict import predict  # noqa: E402

CAMPAIGN = ROOT / "data" / "measured" / "h200_campaign"
F_MAX_MHZ = 1980.0  # H100 SXM and H200 maximum SM clock (the campaign's nvidia-smi clocks.max.sm)


def median_column(path: Path, column: str) -> float:
    return statistics.median(float(r[column]) for r in read_csv_rows(path) if r.get(column))


def clock_mhz(gemm_share: float, sustained_mhz: float) -> float:
    """The power-capped clock at a step's GEMM share (0: no GEMM, f_max; 1: GEMMs only, sustained)."""
    return F_MAX_MHZ - gemm_share * (F_MAX_MHZ - sustained_mhz)


def summary(errors: list[float]) -> str:
    geo = math.exp(statistics.fmean(math.log(max(abs(e), 1e-9)) for e in errors))
    mean = statistics.fmean(abs(e) for e in errors)
    signed, worst = statistics.fmean(errors), max(errors, key=abs)
    return f"geomean {geo:.1%}, mean {mean:.1%}, signed {signed:+.1%}, worst {worst:+.1%}"


def main() -> None:
    sustained = median_column(CAMPAIGN / "gemm_sustained.csv", "sm_mhz_mean")
    step_clock = median_column(CAMPAIGN / "step_times_clocks.csv", "sm_mhz")
    base = next(r for r in read_csv_rows(CAMPAIGN / "training_steps.csv") if r["config"] == "base")
    fam = step_family_ms(CAMPAIGN / base["trace"])
    share = fam["gemm"] / sum(fam.values())
    print(f"H200 GEMM-only windows: {sustained:.0f} MHz; the eager base step: GEMM share {share:.2f} of its kernels")
    print(f"  f(g) = {clock_mhz(share, sustained):.0f} MHz against the measured median {step_clock:.0f} MHz")
    data = shared_data_dir()
    if data is None:
        print("no shared data (set ITERCAST_DATA or place ../shared/data beside the repo): no fitting table")
        return
    rows = [r for r in all_rows(data) if not r.skipped]
    shares, what_if_s = [], {}
    for row in rows:
        try:
            p = predict(Job.from_dicts(row.model, row.plan, {"preset": "dgx-h100", "num_nodes": row.gpus // 8}))
        except ConfigError:
            continue
        gemm_s = p.family_time_s.get("gemm", 0.0)
        g = min(1.0, gemm_s / p.step_time_s)
        shares.append(g)
        row.predicted_s = p.step_time_s
        what_if_s[id(row)] = p.step_time_s - gemm_s * (1 - sustained / clock_mhz(g, sustained))
    now = list(distinct_configs(rows).values())
    for row in rows:
        if id(row) in what_if_s:
            row.predicted_s = what_if_s[id(row)]
    what_if = list(distinct_configs(rows).values())
    print(f"fitting table, {len(now)} configurations (GEMM share of the step: median {statistics.median(shares):.2f})")
    print(f"  as priced:              {summary(now)}")
    print(f"  GEMMs at f(g):          {summary(what_if)}")


if __name__ == "__main__":
    main()
