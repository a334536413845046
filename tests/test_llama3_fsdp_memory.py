"""validation/step_times.py's Llama 3 405B rows (arXiv 2407.21783 Table 4) shard their gradients, as §3.3.2
says Meta's FSDP does ("shards the optimizer states and gradients"), so runs that ran fit in 80 GB: each
GPU keeps 1/DP of the fp32 sums, not a whole fp32 copy beside 68-75 GB of activations."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
import step_times as st

from itercast.data_paths import shared_data_dir
from itercast.predict import predict
from itercast.workload import Job

GIB = 2**30


def _layer_params_per_tp_rank() -> int:
    """One Llama 3 405B layer's parameters on one of 8 tensor-parallel ranks, by hand: q and o 16384 × 16384,
    k and v 16384 × 1024 (8 KV heads of 128), gate, up and down 16384 × 53248, split 8 ways; two RMSNorm
    weights of 16384, whole on every rank."""
    h, kv, ffn, tp = 16384, 1024, 53248, 8
    return (2 * h * h + 2 * h * kv + 3 * h * ffn) // tp + 2 * h


@pytest.mark.skipif(shared_data_dir() is None, reason="needs the shared data (step_times/llama3_405b_table4_mfu.csv)")
def test_llama3_rows_shard_fp32_gradients_and_fit():
    data = shared_data_dir()
    assert data is not None
    rows = {r.label: r for r in st.llama3_rows(data)}
    row = rows["Llama 3 405B ×8192 seq 8192"]
    assert row.plan["zero_stage"] == 2
    job = Job.from_dicts(row.model, row.plan, {"preset": "dgx-h100", "num_nodes": row.gpus // 8})
    mem = predict(job).memory
    # stage 1 holds 8 one-layer chunks; data parallel 64; fp32 sums (grad_reduce_dtype's default)
    local = 8 * _layer_params_per_tp_rank()
    assert local == 3_187_933_184
    assert mem.gradients_bytes == pytest.approx(local * 4 / 64)
    assert mem.weights_bytes == pytest.approx(local * 2)  # bf16, held whole: no reshard after forward
    for label, r in rows.items():
        j = Job.from_dicts(r.model, r.plan, {"preset": "dgx-h100", "num_nodes": r.gpus // 8})
        assert predict(j).memory.total_bytes < 80 * GIB, label  # the three runs ran on 80 GB H100s
