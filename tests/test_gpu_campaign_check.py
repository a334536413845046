"""validation/gpu_campaign_check.py's readings of a GPU campaign, by hand: FLOPs of the kernels it prices,
the optimizer step it finds in a trace, the system it prices on, and two rows of the committed H200
campaign (data/measured/h200_campaign) worked through."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from itercast.data_paths import read_csv_rows

ROOT = Path(__file__).resolve().parents[1]


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = load(ROOT / "validation" / "gpu_campaign_check.py", "gpu_campaign_check")

H200 = ROOT / "data" / "measured" / "h200_campaign"


def test_attention_flops_count_4_d_a_score_and_half_the_keys_under_a_causal_mask():
    row = {"batch": "8", "heads": "32", "seq": "4096", "head_dim": "128", "causal": "False"}
    # 8 · 32 heads · 4096 queries · 4096 keys · 4 · 128 = 256 · 16,777,216 · 512 = 2.199e12
    assert check.attention_forward_flops(row) == 2_199_023_255_552
    assert check.attention_forward_flops({**row, "causal": "True"}) == 1_099_511_627_776  # 2048 keys a query


def test_gemm_flops_are_two_m_n_k():
    assert check.gemm_flops({"m": "8192", "k": "4096", "n": "6144"}) == 2 * 8192 * 4096 * 6144 == 412_316_860_416


def test_the_optimizer_step_is_its_kernels_between_gaps(tmp_path):
    kernels = [(0, 100), (150, 100), (20_000, 300), (20_310, 50), (40_000, 80)]  # µs: start, duration
    events = [{"cat": "kernel", "name": "multi_tensor_apply_kernel<...>", "ts": ts, "dur": d} for ts, d in kernels]
    events += [{"cat": "kernel", "name": "nvjet_gemm", "ts": 5_000, "dur": 4_000}]  # not the optimizer's
    trace = tmp_path / "t.kineto.json.gz"
    with gzip.open(trace, "wt") as fh:
        json.dump({"traceEvents": events}, fh)
    # 100 + 100 µs, then 300 + 50 µs (10 µs apart), then 80 µs (> 5 ms after the previous)
    assert check.optimizer_kernel_s(trace) == pytest.approx([200e-6, 350e-6, 80e-6])


def test_traced_steps_by_kernel_family_by_hand(tmp_path):
    # µs: an optimizer step ends at 100; step 1: a GEMM, cuDNN attention, an elementwise kernel, its
    # optimizer ending at 20,300; step 2: a GEMM, an elementwise kernel, its optimizer ending at 40,050
    kernels = [
        ("multi_tensor_apply_kernel<...>", 0, 100),
        ("nvjet_sm90_tst_256x128", 6_000, 1_000),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", 8_000, 500),
        ("vectorized_elementwise_kernel<bfloat16_copy_kernel_cuda>", 9_000, 200),
        ("multi_tensor_apply_kernel<...>", 20_000, 300),
        ("nvjet_sm90_tst_192x192", 26_000, 800),
        ("elementwise_kernel<BinaryFunctor>", 27_000, 100),
        ("multi_tensor_apply_kernel<...>", 40_000, 50),
    ]
    events = [{"cat": "kernel", "name": n, "ts": ts, "dur": d} for n, ts, d in kernels]
    trace = tmp_path / "t.kineto.json.gz"
    with gzip.open(trace, "wt") as fh:
        json.dump({"traceEvents": events}, fh)
    # two whole steps; the median of two is their mean: gemm (1.0 + 0.8) / 2, attention (0.5 + 0) / 2,
    # optimizer (0.3 + 0.05) / 2, memory (0.2 + 0.1) / 2 ms
    assert check.step_family_ms(trace) == pytest.approx(
        {"gemm": 0.9, "attention": 0.25, "optimizer": 0.175, "memory": 0.15}
    )


def test_the_campaign_names_its_gpu_and_an_unknown_one_is_refused(tmp_path):
    assert check.campaign_preset(H200) == "h200"
    (tmp_path / "run_1.json").write_text(json.dumps({"machine": {"gpu": "NVIDIA B200"}}))
    with pytest.raises(SystemExit, match=r"machine\.gpu: expected one of .*got 'NVIDIA B200'"):
        check.campaign_preset(tmp_path)
    with pytest.raises(SystemExit, match="expected run_"):
        check.campaign_preset(tmp_path / "empty")


def test_the_h200_optimizer_step_by_hand():
    rows = read_csv_rows(H200 / "training_steps.csv")
    (_config, pred_ms, meas_ms) = check.optimizer_rows(H200, [r for r in rows if r["config"] == "base"], "h200")[0]
    # fused AdamW over 401,631,232 fp32 parameters: read weight, gradient, m, v and write weight, m, v,
    # 28 bytes each = 11,245,674,496 B at 4.8 TB/s × the optimizer curve's ceiling: the median fraction
    # of 4.8 TB/s the campaign's four traced steps reached (in sample): 11.246 GB in 3.377, 3.324 and
    # 3.346 ms, 22.153 GB (791,190,528 parameters) in 6.575 ms
    fractions = sorted(
        b / (ms * 1e-3) / 4.8e12
        for b, ms in ((11.246e9, 3.377), (11.246e9, 3.324), (11.246e9, 3.346), (22.153e9, 6.575))
    )
    ceiling = (fractions[1] + fractions[2]) / 2  # 0.7011
    assert pred_ms == pytest.approx(11_245_674_496 / (4.8e12 * ceiling) * 1e3, rel=3e-3)  # 3.342 ms
    # measured: 21 multi_tensor_apply kernels a step, 3.35–3.39 ms in each of the traced steps
    assert 3.3 < meas_ms < 3.4


def test_the_h200_memory_row_reads_the_device_as_measured():
    rows = [r for r in read_csv_rows(H200 / "memory.csv") if r["config"] == "base"]
    (_config, total, used, peak, act_pred, act_meas) = check.memory_rows(rows, "h200")[0]
    assert used == pytest.approx(14_672_527_360 / 2**30)  # total − free after the second step: 13.665 GiB
    assert peak == pytest.approx(13_124_880_896 / 2**30)
    assert act_meas == pytest.approx(6_003_530_752 / 2**30)
    # fp32 weights, gradients and AdamW's two moments of 401,631,232 parameters: 16 bytes each = 5.98 GiB
    assert total - act_pred == pytest.approx(16 * 401_631_232 / 2**30 + 0.75, rel=1e-3)  # + the 0.75 GiB reserve


def test_campaign_budgets_parse_and_refuse_what_is_not_a_part_or_a_positive_time():
    tool = load(ROOT / "tools" / "gpu_campaign.py", "gpu_campaign_tool")
    assert tool.parse_budgets(" gemm=110, attention=5.5 ,") == {"gemm": 110.0, "attention": 5.5}
    with pytest.raises(ValueError, match=r"PART one of .*got 'gemmm=1'"):
        tool.parse_budgets("gemmm=1")
    with pytest.raises(ValueError, match="seconds as a number in 'gemm=x'"):
        tool.parse_budgets("gemm=x")
    with pytest.raises(ValueError, match="seconds > 0 in 'gemm=0'"):
        tool.parse_budgets("gemm=0")


def test_launch_blocking_rows_by_hand():
    """The chain: 1,000 adds in 10 ms async, 30 ms blocking: 20 µs added a kernel; a configuration run in one
    mode only, or failed in one, is left out; the step's ratio is predict's of its job with and without
    plan.cuda_launch_blocking, above 1 (every launch's host time added to its kernel)."""
    step = dict(layers="2", hidden="256", heads="4", kv_heads="2", ffn="512", vocab="1024", seq="128", batch="1")
    blank = dict.fromkeys(step, "")
    rows = [
        {"config": "chain", "cuda_launch_blocking": "0", "ops": "1000", "status": "ok", "median_ms": "10"} | blank,
        {"config": "chain", "cuda_launch_blocking": "1", "ops": "1000", "status": "ok", "median_ms": "30"} | blank,
        {"config": "gemm", "cuda_launch_blocking": "0", "ops": "100", "status": "ok", "median_ms": "20"} | blank,
        {"config": "gemm", "cuda_launch_blocking": "1", "ops": "100", "status": "error: x", "median_ms": ""} | blank,
        {"config": "step", "cuda_launch_blocking": "0", "ops": "400", "status": "ok", "median_ms": "4.0"} | step,
        {"config": "step", "cuda_launch_blocking": "1", "ops": "", "status": "ok", "median_ms": "6.0"} | step,
    ]
    (chain, stepped) = check.launch_blocking_rows(rows, "dgx-h100")
    assert chain == ("chain", "10.000", "30.000", "20.00", "")
    assert stepped[:4] == ("step", "4.000", "6.000", "5.00")  # (6 − 4) ms / 400 kernels
    assert float(stepped[4]) > 1.0


def test_routing_bytes_are_the_moe_layers_by_hand():
    """Qwen3 30B-A3B's routing at 8,192 tokens (hidden 2048, 128 experts, 8 a token: 65,536 routed rows of 4 KiB):
    the fp32 scores' softmax read and write and top-k read 3 · 8192 · 128 · 4; the gather reads and writes each
    routed row, 2 · 65536 · 4096; its backward reads the routed rows and reads and writes the 8,192 token rows,
    (65536 + 2 · 8192) · 4096; the weighted scatter-add reads the rows and their copies' products and writes the
    tokens, (2 · 65536 + 8192) · 4096. The sort of the routed copies is not priced."""
    row = {"tokens": "8192", "hidden": "2048", "experts": "128", "top_k": "8"}
    got = {op: check.routing_bytes(row | {"op": op}, "h200") for op in ("softmax_topk", "permute_fwd", "sort")}
    assert got == {"softmax_topk": 12_582_912, "permute_fwd": 536_870_912, "sort": None}
    assert check.routing_bytes(row | {"op": "permute_bwd"}, "h200") == 335_544_320
    assert check.routing_bytes(row | {"op": "unpermute_fwd"}, "h200") == 570_425_344
