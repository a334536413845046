"""data/published/kernels/moe_grouped_gemm_h100.csv, which validation/kernel_tables.py's MoE check reads: its rows
transcribe the grouped_gemm fork's run.log (the expected values typed here from Knarf04/grouped_gemm@514ad86 run.log
by hand)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
from kernel_tables import KERNELS

from itercast.data_paths import read_csv_rows


def rows() -> list[dict[str, str]]:
    return read_csv_rows(KERNELS / "moe_grouped_gemm_h100.csv")


def test_the_uniform_rows_transcribe_the_log():
    # run.log, "Workload mode: uniform": "Time per step:  3.184 ms" (cuBLAS (Base)), 4.838 (Batched), 3.526 (sm80),
    # 2.568 (sm90 cooperative), 3.078 (sm90 pingpong)
    uniform = {r["implementation"]: float(r["ms_per_step"]) for r in rows() if r["distribution"] == "uniform"}
    assert uniform == {
        "cublas_loop": 3.184,
        "cublas_batched": 4.838,
        "cutlass_sm80": 3.526,
        "cutlass_sm90_cooperative": 2.568,
        "cutlass_sm90_pingpong": 3.078,
    }


@pytest.mark.parametrize(("distribution", "cooperative_ms"), [("mild_skew", 2.721), ("extreme_skew", 2.672)])
def test_every_row_is_the_same_work_over_128_experts(distribution, cooperative_ms):
    # "Config: up_proj | Tokens: 65536 | Experts: 128 | Shape: K=2048, N=1536"
    for r in rows():
        assert (r["experts"], r["rows_total"], r["k"], r["n"]) == ("128", "65536", "2048", "1536")
    (coop,) = (
        r for r in rows() if (r["distribution"], r["implementation"]) == (distribution, "cutlass_sm90_cooperative")
    )
    assert float(coop["ms_per_step"]) == cooperative_ms
