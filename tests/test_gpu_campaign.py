"""The GPU campaign (tools/gpu_campaign.py) at its dry-run sizes on this CPU: every part runs and writes
what a lent GPU's run will, and the quantities fixed by construction come out as computed by hand."""

from __future__ import annotations

import csv
import gzip
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from itercast import Job

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN = ROOT / "tools" / "gpu_campaign.py"


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("campaign") / "out"
    archive = out.parent / "campaign.tar.gz"
    cmd = [sys.executable, str(CAMPAIGN), "--dry-run", "--device", "cpu", "--out", str(out), "--archive", str(archive)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def test_every_part_writes_its_files_and_the_readme_describes_them(dry_run: Path) -> None:
    expected = {
        "attention.csv",
        "cross_entropy.csv",
        "gemm.csv",
        "gemm_sustained.csv",
        "grouped_gemm.csv",
        "moe_routing.csv",
        "training_steps.csv",
        "memory.csv",
        "step_times.csv",
        "step_times_clocks.csv",
        "launch_blocking.csv",
        "embedding_bag.csv",
        "dlrm_steps.csv",
    }
    assert expected <= {p.name for p in dry_run.iterdir()}
    readme = (dry_run / "README.md").read_text()
    for name in expected | {"traces/"}:
        assert f"| {name} |" in readme
    (record,) = [json.loads(p.read_text()) for p in dry_run.glob("run_*.json")]
    assert record["machine"]["torch"] and record["command"].startswith("python tools/gpu_campaign.py --dry-run")
    assert not [p for p, s in record["parts"].items() if s.startswith(("failed", "not run"))], record["parts"]
    with tarfile.open(dry_run.parent / "campaign.tar.gz") as tar:
        assert {"./README.md", "./memory.csv", "./traces/base.kineto.json.gz"} <= set(tar.getnames())


def test_memory_parts_of_the_dry_model_by_hand(dry_run: Path) -> None:
    # 2 layers, hidden 64, 4 heads of 16, 2 query groups, SwiGLU 128, vocab 256, untied head:
    # per layer QKV 64·(4+2·2)·16 + projection 64·64 + gate/up 64·256 + down 128·64 + two RMSNorms 2·64
    layer = 64 * 128 + 64 * 64 + 64 * 256 + 128 * 64 + 2 * 64
    params = 2 * layer + 256 * 64 + 256 * 64 + 64  # + embedding, output layer, final RMSNorm
    assert params == 106_816
    tensors = 2 * 6 + 3  # per layer qkv, proj, gate_up, down and two norms; embedding, final norm, head
    rows = {r["config"]: r for r in read_rows(dry_run / "memory.csv")}
    assert len(rows) >= 6 and all(r["status"] == "ok" for r in rows.values())
    base = rows["base"]
    assert int(base["params"]) == params
    assert int(base["param_bytes"]) == int(base["grad_bytes"]) == 4 * params  # fp32 parameters and gradients
    assert int(base["optimizer_bytes"]) == 8 * params + 4 * tensors  # AdamW m and v, one fp32 step per tensor
    # itercast counts the same model's parameters (the campaign's jobs are priced against it)
    model = {"family": "llama", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4}
    model |= {"num_query_groups": 2, "ffn_hidden_size": 128, "vocab_size": 256, "seq_length": 32}
    assert Job.from_dicts(model, {}, {"preset": "cpu-host"}).model.num_params() == params
    # the wide what-if: hidden 96, 6 heads, 3 query groups, ffn 186
    wide = rows["wide"]
    layer = 96 * (6 + 2 * 3) * 16 + 96 * 96 + 96 * 2 * 186 + 186 * 96 + 2 * 96
    assert int(wide["params"]) == 2 * layer + 2 * 256 * 96 + 96


def test_traces_hold_the_three_active_steps_and_the_what_ifs_their_shapes(dry_run: Path) -> None:
    rows = {r["config"]: r for r in read_rows(dry_run / "training_steps.csv")}
    assert set(rows) == {"base", "half_batch", "double_batch", "wide"}
    assert [int(rows[c]["batch"]) for c in ("half_batch", "base", "double_batch")] == [1, 2, 4]
    assert (rows["wide"]["hidden"], rows["wide"]["heads"], rows["wide"]["kv_heads"]) == ("96", "6", "3")
    for name, row in rows.items():
        assert row["status"] == "ok" and float(row["median_ms"]) > 0
        events = json.loads(gzip.decompress((dry_run / row["trace"]).read_bytes()))["traceEvents"]
        steps = sorted({e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")})
        assert len(steps) == 3, (name, steps)  # schedule(wait=1, warmup=2, active=3)


def test_launch_blocking_runs_each_configuration_in_both_modes(dry_run: Path) -> None:
    """Each (configuration, mode) a child process with CUDA_LAUNCH_BLOCKING set: the chain's 1,000 adds counted
    by construction, the step of the dry model (2 layers, hidden 64) at batch 1 with its kernels counted by the
    profiler, which a CPU has none of."""
    rows = read_rows(dry_run / "launch_blocking.csv")
    assert [(r["config"], r["cuda_launch_blocking"]) for r in rows] == [
        ("chain", "0"), ("chain", "1"), ("step_batch1", "0"), ("step_batch1", "1")
    ]  # fmt: skip
    assert all(r["status"] == "ok" and float(r["median_ms"]) > 0 and r["reps"] == "3" for r in rows)
    assert [r["ops"] for r in rows] == ["1000", "1000", "", ""]
    assert {(r["layers"], r["hidden"], r["batch"]) for r in rows[2:]} == {("2", "64", "1")}


def test_moe_routing_times_each_kernel_of_the_dry_case(dry_run: Path) -> None:
    rows = read_rows(dry_run / "moe_routing.csv")
    assert [r["op"] for r in rows] == ["softmax_topk", "sort", "permute_fwd", "unpermute_fwd", "permute_bwd"]
    assert {(r["tokens"], r["hidden"], r["experts"], r["top_k"]) for r in rows} == {("64", "32", "8", "2")}
    assert all(r["status"] == "ok" and float(r["median_ms"]) > 0 for r in rows)


def test_step_distribution_has_one_row_per_step(dry_run: Path) -> None:
    rows = read_rows(dry_run / "step_times.csv")
    assert [int(r["step"]) for r in rows] == list(range(20))
    assert all(float(r["step_ms"]) > 0 for r in rows)


def test_gemm_shapes_are_the_layers_linear_gemms_by_hand(dry_run: Path) -> None:
    rows = read_rows(dry_run / "gemm.csv")
    shapes = {(r["model"], r["tp"], r["linear"], r["pass"]): (int(r["m"]), int(r["k"]), int(r["n"])) for r in rows}
    # tiny: hidden 64, ffn 128, 4 heads + 2·2 kv heads of 16, gated; 64 tokens
    assert shapes[("tiny", "1", "qkv", "fprop")] == (64, 64, 128)  # Y = X·Wᵀ: tokens × hidden → 8·16
    assert shapes[("tiny", "1", "qkv", "dgrad")] == (64, 128, 64)  # dX = dY·W
    assert shapes[("tiny", "1", "qkv", "wgrad")] == (128, 64, 64)  # dW = dYᵀ·X: out × tokens × in
    assert shapes[("tiny", "2", "fc1", "fprop")] == (64, 64, 128)  # 2·128 split over 2 ranks
    assert shapes[("tiny", "2", "fc2", "fprop")] == (64, 64, 64)  # row-parallel: input 128 / 2
    assert {(int(r["m"]), int(r["k"]), int(r["n"])) for r in rows if r["model"] == "square"} == {(64,) * 3, (128,) * 3}
    assert {r["dtype"] for r in rows} == {"bf16", "fp8"}
    assert all(r["status"] == "ok" and float(r["median_ms"]) > 0 for r in rows if r["dtype"] == "bf16")


def test_expert_groups_equal_and_skewed_by_hand() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    from campaign.kernels import expert_token_counts

    assert expert_token_counts(4, 32, skewed=False) == [32, 32, 32, 32]
    # shares ∝ 1, 1/2, 1/3, 1/4 of 128 (61.4, 30.7, 20.5, 15.4) floored to multiples of 16, at least 16;
    # the 32 left over go to the first
    assert expert_token_counts(4, 32, skewed=True) == [80, 16, 16, 16]


def test_attention_rows_name_back_end_and_status(dry_run: Path) -> None:
    rows = read_rows(dry_run / "attention.csv")
    # 2 sequences × 1 head size × 2 query-group counts × causal or not × 3 back ends, each a fwd and a fwd_bwd
    # row, plus the expanded form where native GQA was refused
    assert len(rows) >= 2 * 2 * 2 * 3 * 2
    assert all(r["status"] == "ok" or r["status"].startswith("error: ") for r in rows)
    ok = [r for r in rows if r["backend"] == "math" and r["status"] == "ok"]
    assert {(r["gqa"], r["pass"]) for r in ok} == {("native", "fwd"), ("native", "fwd_bwd"), ("none", "fwd")} | {
        ("none", "fwd_bwd")
    }
    assert {int(r["batch"]) * int(r["seq"]) for r in rows} == {256}  # tokens per call fixed


def test_dlrm_and_embedding_rows(dry_run: Path) -> None:
    steps = read_rows(dry_run / "dlrm_steps.csv")
    assert [(int(r["batch"]), float(r["zipf_alpha"])) for r in steps] == [(16, 0.0), (16, 1.05), (32, 0.0), (32, 1.05)]
    assert all(r["status"] == "ok" and float(r["median_ms"]) > 0 for r in steps)
    bags = read_rows(dry_run / "embedding_bag.csv")
    assert {r["op"] for r in bags} == {"fwd", "bwd", "update"}
    for r in bags:
        assert int(r["lookups"]) == int(r["bags"]) * int(r["pooling"])
        assert 1 <= int(r["unique_rows"]) <= min(int(r["lookups"]), int(r["rows"]))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--parts", "attention,warp"], "--parts: expected names from attention"),
        (["--device", "cuda"], "sees no CUDA GPU here"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    import torch

    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    out = tmp_path / "never"
    done = subprocess.run(
        [sys.executable, str(CAMPAIGN), "--out", str(out), *args], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2 and message in done.stderr
    assert not out.exists()
