"""Microbenchmarks on the local device (torch: CPU here, CUDA when present) into a profiling database.

Families (the grids are QUICK and FULL below):
- gemm: aten::mm over (M, N, K) and the three layouts training uses (nn: x·W, nt: x·Wᵀ in the
  forward, tn: gradient·x for the weight gradient); aten::bmm over (batch, M, N, K);
- conv: aten::convolution and aten::convolution_backward (2-D, 3×3 and 1×1);
- attention: fused scaled-dot-product attention forward and backward, causal and not;
- norm: layer norm, batch norm, softmax and log-softmax, forward and backward;
- elementwise: add (new output and in place), mul, gelu, relu, copy, sum and gelu backward over sizes;
- embedding: EmbeddingBag forward and backward, and the fused sparse row-wise Adagrad update
  (rowwise_adagrad_update), over rows × dim × pooling factor × index distribution (uniform,
  Zipf 1.05), with the fraction of distinct rows among the indices measured;
- host: small programs of tiny operators (Python calls, nested calls, autograd functions), whose
  counts of each come from an execution trace of the program, to fit the per-call host overheads;
- collective: all-reduce, all-gather, reduce-scatter and all-to-all through torch.distributed across
  local processes (profile/collective_bench.py: gloo on CPU, NCCL on CUDA).
Every row stores its operator call (name, shapes, types, strides, scalars; costs/aten_ops.OpCall),
so a calibration prices a trace's operators from the same description.

Each configuration runs `warmup` times, then between 3 and `repeats` timed runs (fewer once 0.5 s
of timed runs have passed), each after caches are flushed (FLUSH_BYTES); the median and the
standard deviation are kept. A configuration
already in the database for this device fingerprint is skipped, so an interrupted run resumes.
Timing: perf_counter on CPU; CUDA events with synchronisation on a GPU.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.progress import Progress, TaskID

from itercast.costs.aten_ops import EMBEDDING_UPDATE, OpCall, features
from itercast.costs.op_model import ZIPF_ALPHA
from itercast.measurements import Measurement, ProfileError
from itercast.profile import collective_bench
from itercast.profile.db import ProfileDB

#: written before every timed run so that caches start cold (twice the 32 MiB L3 of the machine here;
#: above the 50 MiB L2 of an H100): inside a training iteration an operator's inputs were written
#: many operators earlier, so timing them hot in cache under-prices memory-bound operators 4–8×
FLUSH_BYTES = 64 << 20
#: GPU clock cycles of the spin queued before each timed GPU run (~0.5 ms at 1.98 GHz)
GPU_HOLD_CYCLES = 1_000_000
FAMILIES = ("gemm", "conv", "attention", "norm", "elementwise", "embedding", "host", "collective")
QUICK: dict[str, Any] = {
    "gemm": [64, 256, 1024],
    "layouts": ["nn"],
    "bmm": [],
    "conv": [(8, 16, 16, 16, 3)],
    "attention": [(2, 64, 32)],
    "norm_rows": [256],
    "norm_cols": [256],
    "elementwise": [1 << 14, 1 << 18, 1 << 22],
    "embedding_rows": [10_000],
    "embedding_dims": [64],
    "pooling": [1, 16],
    "distributions": ["uniform", "zipf"],
    "host": ["view", "tiny_add"],
    "collective": collective_bench.QUICK,
}
FULL: dict[str, Any] = {
    "gemm": [64, 128, 256, 512, 1024, 2048],
    "layouts": ["nn", "nt", "tn"],
    # and a DLRM's interaction: b samples' F × d by d × F (F = tables + 1) products, and its backward's F × F by F × d
    "bmm": [(b, m, n, k) for b in (8, 32) for m, n, k in itertools.product((32, 128, 512), repeat=3)]
    + [(b, f, n, k) for b in (256, 2048) for f in (5, 27) for d in (32, 128) for n, k in ((f, d), (d, f))],
    # (batch, channels in, channels out, height = width, kernel)
    "conv": [
        (b, ci, co, hw, ks)
        for b, ci, co, hw, ks in itertools.product((8, 32), (16, 64), (16, 64), (8, 32), (1, 3))
        if not (b == 32 and hw == 32 and ci == co == 64)
    ],
    # (batch × heads, sequence, head dim)
    "attention": [(bh, s, d) for bh in (8, 32) for s in (64, 128, 256, 512) for d in (32, 64)],
    "norm_rows": [64, 256, 1024, 2048, 4096, 8192],
    "norm_cols": [64, 256, 1024],
    "elementwise": [1 << k for k in range(10, 27)],  # up to 256 MiB per tensor (a 1M × 64 table)
    "embedding_rows": [10_000, 100_000, 1_000_000],  # 100k × 32 / × 128: 12.8 / 51 MB, either side of 32 MiB
    "embedding_dims": [32, 128],
    # bags per call: a sharded table pools for every rank's samples (2 ranks × 2048 in the DLRM
    # measurement; MLPerf DLRM-DCNv2 runs 8,192+ per GPU): 4096 × pooling 128 reaches 524k lookups
    "embedding_batches": [512, 4096],
    "pooling": [1, 8, 32, 128],
    "distributions": ["uniform", "zipf"],
    "host": [
        "view",
        "transpose",
        "tiny_add",
        "tiny_chain_backward",
        "tiny_view_backward",
        "tiny_linear_backward",
        "tiny_mlp_step",
    ],
    "collective": collective_bench.FULL,
}
#: the full grid on a GPU: the same operators at sizes that fill one (an H100 runs an fp32 1024³
#: product in ~0.1 ms and a 16 MiB add in ~15 µs, so FULL's sizes mostly time launch latency), and
#: embedding bags also at a training batch of 8192 bags
GPU: dict[str, Any] = FULL | {
    "gemm": [64, 256, 1024, 2048, 4096, 8192],
    "bmm": [(b, m, n, k) for b in (8, 64) for m, n, k in itertools.product((32, 128, 512, 2048), repeat=3)],
    "conv": list(itertools.product((32, 512), (16, 64, 128), (16, 64, 128), (8, 16, 32), (1, 3))),
    "attention": [(bh, s, d) for bh in (8, 32, 128) for s in (64, 128, 256, 512, 1024) for d in (32, 64)],
    "norm_rows": [1 << k for k in range(6, 21, 2)],  # 64 … 1M rows
    "norm_cols": [32, 128, 512, 4096],
    "norm_max_elements": 1 << 28,
    "elementwise": [1 << k for k in range(10, 29)],
    "embedding_batches": [512, 8192],
}
NORM_OPS = ("layer_norm", "batch_norm", "softmax", "log_softmax")
ELEMENTWISE_OPS = ("add", "add_", "mul", "gelu", "relu", "copy", "sum", "gelu_backward")
TYPE_NAMES = {"float32": "float", "float64": "double", "float16": "c10::Half", "bfloat16": "c10::BFloat16"}
TYPE_NAMES |= {"int64": "long int", "int32": "int", "bool": "bool"}


def _config(params: dict[str, Any]) -> dict[str, Any]:
    """The configuration part of stored params (what a resumed run compares), without what was measured."""
    return {k: v for k, v in params.items() if k not in ("features", "call", "counts", "host_issue_s")}


def fingerprint(device: str) -> dict[str, Any]:
    """What identifies the machine that measured (so results are never mixed across machines)."""
    import torch

    fp: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": device,
    }
    try:
        with open("/proc/cpuinfo") as fh:
            fp["cpu"] = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        fp["cpu"] = platform.processor()
    if device.startswith("cuda"):
        fp["gpu"] = torch.cuda.get_device_name(0)
    return fp


def configs(grid: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(family, op, params) of every configuration of the grid."""
    for (m, n, k), layout in itertools.product(itertools.product(grid["gemm"], repeat=3), grid["layouts"]):
        yield "gemm", "mm", {"m": m, "n": n, "k": k, "layout": layout}
    for b, m, n, k in grid["bmm"]:
        yield "gemm", "bmm", {"batch": b, "m": m, "n": n, "k": k}
    for (b, ci, co, hw, ks), direction in itertools.product(grid["conv"], ("fwd", "bwd")):
        yield "conv", f"conv2d_{direction}", {"batch": b, "c_in": ci, "c_out": co, "hw": hw, "kernel": ks}
    for (bh, s, d), causal, direction in itertools.product(grid["attention"], (False, True), ("fwd", "bwd")):
        yield "attention", f"sdpa_{direction}", {"batch_heads": bh, "seq": s, "head_dim": d, "causal": causal}
    for op, rows, cols, direction in itertools.product(NORM_OPS, grid["norm_rows"], grid["norm_cols"], ("fwd", "bwd")):
        if rows * cols <= grid.get("norm_max_elements", rows * cols):
            yield "norm", f"{op}_{direction}", {"rows": rows, "cols": cols}
    for op, size in itertools.product(ELEMENTWISE_OPS, grid["elementwise"]):
        yield "elementwise", op, {"elements": size}
    for rows, dim, pool, dist, batch, direction in itertools.product(
        grid["embedding_rows"],
        grid["embedding_dims"],
        grid["pooling"],
        grid["distributions"],
        grid.get("embedding_batches", [512]),
        ("fwd", "bwd", "update"),
    ):
        params = {"rows": rows, "dim": dim, "pooling": pool, "distribution": dist, "batch": batch}
        yield "embedding", f"embedding_bag_{direction}", params
    for program in grid["host"]:
        yield "host", program, {"calls": 100}
    yield from collective_bench.configs(grid["collective"])


def _describe(name: str, inputs: list[Any], outputs: list[Any], scalars: tuple[Any, ...] = ()) -> OpCall:
    """The OpCall of an operator from its live input and output tensors (None for absent ones)."""
    import torch

    def kind(t: Any) -> str:
        return f"Tensor({TYPE_NAMES.get(str(t.dtype).removeprefix('torch.'), 'float')})" if t is not None else "None"

    def shape(t: Any) -> list[int]:
        return list(t.shape) if isinstance(t, torch.Tensor) else []

    return OpCall(
        name,
        [shape(t) for t in inputs],
        [kind(t) for t in inputs],
        [list(t.stride()) if isinstance(t, torch.Tensor) else [] for t in inputs],
        [shape(t) for t in outputs],
        [kind(t) for t in outputs],
        scalars,
    )


Prepared = tuple[Callable[[], Any], OpCall | None, dict[str, Any]]


def _prepare(family: str, op: str, params: dict[str, Any], device: str) -> Prepared:
    """A closure running one configuration, its operator call, and what was measured of its inputs."""
    import torch

    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device)

    if family == "gemm":
        return _prepare_gemm(op, params, randn)
    if family == "conv":
        return _prepare_conv(op, params, randn)
    if family == "attention":
        return _prepare_attention(op, params, randn)
    if family == "norm":
        return _prepare_norm(op, params, randn)
    if family == "elementwise":
        return _prepare_elementwise(op, params, randn)
    if family == "embedding":
        return _prepare_embedding(op, params, randn, device)
    return _prepare_host(op, params, randn)


def _prepare_gemm(op: str, p: dict[str, Any], randn: Callable[..., Any]) -> Prepared:
    import torch

    if op == "bmm":
        a, b = randn(p["batch"], p["m"], p["k"]), randn(p["batch"], p["k"], p["n"])
        return (lambda: torch.bmm(a, b)), _describe("aten::bmm", [a, b], [torch.bmm(a, b)]), {}
    a = randn(p["k"], p["m"]).t() if p["layout"][0] == "t" else randn(p["m"], p["k"])
    b = randn(p["n"], p["k"]).t() if p["layout"][1] == "t" else randn(p["k"], p["n"])
    return (lambda: torch.mm(a, b)), _describe("aten::mm", [a, b], [torch.mm(a, b)]), {}


def _prepare_conv(op: str, p: dict[str, Any], randn: Callable[..., Any]) -> Prepared:
    import torch

    x, w = randn(p["batch"], p["c_in"], p["hw"], p["hw"]), randn(p["c_out"], p["c_in"], p["kernel"], p["kernel"])
    pad = p["kernel"] // 2
    args = ([1, 1], [pad, pad], [1, 1], False, [0, 0], 1)
    y = torch.ops.aten.convolution(x, w, None, *args)
    if op == "conv2d_fwd":
        return (lambda: torch.ops.aten.convolution(x, w, None, *args)), _describe("aten::convolution", [x, w], [y]), {}
    g = torch.randn_like(y)

    def bwd() -> Any:
        return torch.ops.aten.convolution_backward(g, x, w, None, *args, [True, True, False])

    gi, gw, _ = bwd()
    return bwd, _describe("aten::convolution_backward", [g, x, w], [gi, gw, None]), {}


def _prepare_attention(op: str, p: dict[str, Any], randn: Callable[..., Any]) -> Prepared:
    import torch

    shape = (1, p["batch_heads"], p["seq"], p["head_dim"])
    q, k, v = randn(*shape), randn(*shape), randn(*shape)
    causal = p["causal"]
    if q.is_cuda:
        return _prepare_attention_cuda(op, q, k, v, causal)
    fwd_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out, lse = fwd_op(q, k, v, 0.0, causal)
    if op == "sdpa_fwd":
        name = "aten::_scaled_dot_product_flash_attention_for_cpu"
        return (
            (lambda: fwd_op(q, k, v, 0.0, causal)),
            _describe(name, [q, k, v], [out, lse], (None,) * 3 + (0.0, causal)),
            {},
        )
    g = torch.randn_like(out)
    bwd_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

    def bwd() -> Any:
        return bwd_op(g, q, k, v, out, lse, 0.0, causal)

    name = "aten::_scaled_dot_product_flash_attention_for_cpu_backward"
    return bwd, _describe(name, [g, q, k, v, out, lse], list(bwd()), (None,) * 6 + (0.0, causal)), {}


def _prepare_attention_cuda(op: str, q: Any, k: Any, v: Any, causal: bool) -> Prepared:
    """fp32 attention on a GPU: scaled_dot_product_attention runs the memory-efficient kernel (the
    flash and cuDNN kernels take only 16-bit inputs)."""
    import torch

    aten = torch.ops.aten
    name = "aten::_scaled_dot_product_efficient_attention"
    out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal)
    if op == "sdpa_fwd":
        call = _describe(name, [q, k, v, None], [out, lse, seed, offset], (None,) * 4 + (True, 0.0, causal))
        return (lambda: aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal)), call, {}
    g = torch.randn_like(out)
    mask = [True, True, True, False]

    def bwd() -> Any:
        return aten._scaled_dot_product_efficient_attention_backward(
            g, q, k, v, None, out, lse, seed, offset, 0.0, mask, causal
        )

    scalars = (None,) * 9 + (0.0, mask, causal)
    call = _describe(f"{name}_backward", [g, q, k, v, None, out, lse, seed, offset], list(bwd()), scalars)
    return bwd, call, {}


def _prepare_norm(op: str, p: dict[str, Any], randn: Callable[..., Any]) -> Prepared:
    import torch

    aten = torch.ops.aten
    kind, direction = op.rsplit("_", 1)
    rows, cols = p["rows"], p["cols"]
    if kind == "layer_norm":
        x, w, b = randn(rows, cols), randn(cols), randn(cols)
        y, mean, rstd = aten.native_layer_norm(x, [cols], w, b, 1e-5)
        if direction == "fwd":
            call = _describe("aten::native_layer_norm", [x, None, w, b], [y, mean, rstd])
            return (lambda: aten.native_layer_norm(x, [cols], w, b, 1e-5)), call, {}
        g = torch.randn_like(y)
        mask = [True, True, True]
        outs = list(aten.native_layer_norm_backward(g, x, [cols], mean, rstd, w, b, mask))
        call = _describe("aten::native_layer_norm_backward", [g, x, None, mean, rstd, w, b], outs)
        return (lambda: aten.native_layer_norm_backward(g, x, [cols], mean, rstd, w, b, mask)), call, {}
    if kind == "batch_norm":  # rows = batch·height·width, cols = channels (NCHW with H·W = rows/16)
        x = randn(16, cols, rows // 16, 1)
        w, b, rm, rv = randn(cols), randn(cols), torch.zeros(cols, device=x.device), torch.ones(cols, device=x.device)
        if x.is_cuda:
            return _prepare_cudnn_batch_norm(direction, x, w, b, rm, rv)
        y, sm, si = aten.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)
        if direction == "fwd":
            call = _describe("aten::native_batch_norm", [x, w, b, rm, rv], [y, sm, si])
            return (lambda: aten.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)), call, {}
        g = torch.randn_like(y)

        def bn_bwd() -> Any:
            return aten.native_batch_norm_backward(g, x, w, rm, rv, sm, si, True, 1e-5, [True, True, True])

        call = _describe("aten::native_batch_norm_backward", [g, x, w, rm, rv, sm, si], list(bn_bwd()))
        return bn_bwd, call, {}
    x = randn(rows, cols)
    fwd = aten._softmax if kind == "softmax" else aten._log_softmax
    y = fwd(x, -1, False)
    if direction == "fwd":
        return (lambda: fwd(x, -1, False)), _describe(f"aten::_{kind}", [x], [y]), {}
    g = torch.randn_like(y)
    bwd = aten._softmax_backward_data if kind == "softmax" else aten._log_softmax_backward_data
    call = _describe(f"aten::_{kind}_backward_data", [g, y], [bwd(g, y, -1, torch.float32)])
    return (lambda: bwd(g, y, -1, torch.float32)), call, {}


def _prepare_cudnn_batch_norm(direction: str, x: Any, w: Any, b: Any, rm: Any, rv: Any) -> Prepared:
    """Training batch norm on a GPU: nn.BatchNorm2d calls cuDNN's kernels there, not the native ones."""
    import torch

    aten = torch.ops.aten
    y, sm, si, reserve = aten.cudnn_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)
    if direction == "fwd":
        call = _describe("aten::cudnn_batch_norm", [x, w, b, rm, rv], [y, sm, si, reserve])
        return (lambda: aten.cudnn_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)), call, {}
    g = torch.randn_like(y)

    def bwd() -> Any:
        return aten.cudnn_batch_norm_backward(x, g, w, rm, rv, sm, si, 1e-5, reserve)

    call = _describe("aten::cudnn_batch_norm_backward", [x, g, w, rm, rv, sm, si, reserve], list(bwd()))
    return bwd, call, {}


def _prepare_elementwise(op: str, p: dict[str, Any], randn: Callable[..., Any]) -> Prepared:
    import torch

    aten = torch.ops.aten
    x, y = randn(p["elements"]), randn(p["elements"])
    out = torch.empty_like(x)
    fns: dict[str, tuple[str, Callable[[], Any], list[Any]]] = {
        "add": ("aten::add", lambda: torch.add(x, y), [x, y]),
        "add_": ("aten::add_", lambda: out.add_(y), [out, y]),
        "mul": ("aten::mul", lambda: torch.mul(x, y), [x, y]),
        "gelu": ("aten::gelu", lambda: torch.nn.functional.gelu(x), [x]),
        "relu": ("aten::clamp_min", lambda: torch.clamp_min(x, 0.0), [x]),
        "copy": ("aten::copy_", lambda: out.copy_(x), [out, x]),
        "sum": ("aten::sum", lambda: torch.sum(x), [x]),
        "gelu_backward": ("aten::gelu_backward", lambda: aten.gelu_backward(y, x), [y, x]),
    }
    name, fn, inputs = fns[op]
    return fn, _describe(name, inputs, [fn()]), {}


def rowwise_adagrad_update(weight: Any, state: Any, idx: Any, grad_rows: Any, lr: float = 0.01) -> None:
    """The sparse row-wise Adagrad step of a table, in eager PyTorch (what TorchRec fuses into the
    embedding backward, FBGEMM's rowwise_adagrad): the gradients of the lookups `idx` (`grad_rows`,
    one row each) summed per distinct row; each distinct row's state += mean(g²) and row −= lr·g /
    (√state + ε). `weight` [rows, d] and `state` [rows] (fp32) are updated in place. The DLRM
    measurement (tools/measure_dlrm_sharding.py) runs this same function."""
    import torch

    uniq, inv = torch.unique(idx, return_inverse=True)
    acc = torch.zeros(len(uniq), grad_rows.shape[1], device=grad_rows.device).index_add_(0, inv, grad_rows)
    rows_state = state[uniq] + acc.pow(2).mean(1)
    state[uniq] = rows_state
    weight.index_add_(0, uniq, acc * (-lr / (rows_state.sqrt() + 1e-8))[:, None])


def _prepare_embedding(op: str, p: dict[str, Any], randn: Callable[..., Any], device: str) -> Prepared:
    import torch

    rows, dim, pool, batch = p["rows"], p["dim"], p["pooling"], p["batch"]
    weight = randn(rows, dim)
    gen = torch.Generator(device="cpu").manual_seed(0)  # indices drawn on the host: the same on every device
    count = batch * pool
    if p["distribution"] == "zipf":  # skewed reuse: the row of rank r drawn with probability ∝ r^−ZIPF_ALPHA
        weights = 1.0 / torch.arange(1, rows + 1, dtype=torch.float64) ** ZIPF_ALPHA
        idx = torch.multinomial(weights, count, replacement=True, generator=gen)
    else:
        idx = torch.randint(0, rows, (count,), generator=gen)
    offsets = torch.arange(0, count, pool)
    _, per_row = idx.unique(return_counts=True)
    features = {"unique_fraction": per_row.numel() / count, "hot_fraction": int(per_row.max()) / count}
    idx, offsets = idx.to(device), offsets.to(device)
    aten = torch.ops.aten
    outs = aten._embedding_bag(weight, idx, offsets, False, 0)  # mode 0: sum
    if op == "embedding_bag_fwd":
        call = _describe("aten::_embedding_bag", [weight, idx, offsets], list(outs))
        return (lambda: aten._embedding_bag(weight, idx, offsets, False, 0)), call, features
    out, offset2bag, bag_size, max_idx = outs
    grad = torch.randn_like(out)
    if op == "embedding_bag_update":  # the pooled gradient of each lookup's bag, then the update
        state, grad_rows = torch.zeros(rows, device=device), grad.repeat_interleave(pool, 0)
        call = _describe(EMBEDDING_UPDATE, [weight, state, idx, grad_rows], [])
        return (lambda: rowwise_adagrad_update(weight, state, idx, grad_rows)), call, features

    def bwd() -> Any:
        return aten._embedding_bag_backward(
            grad, idx, offsets, offset2bag, bag_size, max_idx, rows, False, 0, False, None
        )

    tensors = [grad, idx, offsets, offset2bag, bag_size, max_idx]
    call = _describe("aten::_embedding_bag_backward", tensors, [bwd()], (None,) * 6 + (rows, False, 0, False))
    return bwd, call, features


def _prepare_host(op: str, p: dict[str, Any], randn: Callable[..., Any]) -> Prepared:
    """Programs of `calls` tiny operator calls; their host-node counts come from an execution trace."""
    import torch

    x, y, w = randn(4, 4), randn(4, 4), randn(4, 4).requires_grad_()
    lin = torch.nn.Linear(4, 4).to(x.device)
    calls = p["calls"]

    def chain() -> None:
        with torch.enable_grad():
            z = w
            for _ in range(calls // 10):
                z = z * y
            z.sum().backward()

    def view_chain() -> None:  # autograd functions that launch nothing (ViewBackward0 runs a view)
        with torch.enable_grad():
            z = w
            for _ in range(calls // 10):
                z = z.view(16).view(4, 4)
            z.sum().backward()

    def linear_chain() -> None:
        with torch.enable_grad():
            z = x
            for _ in range(calls // 10):
                z = lin(z)
            z.sum().backward()

    layers = [m for _ in range(calls // 25) for m in (torch.nn.Linear(4, 4), torch.nn.ReLU())]
    mlp = torch.nn.Sequential(*layers).to(x.device)
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01, momentum=0.9)

    def train_step() -> None:  # module calls, a loss, backward and an optimizer step: a training loop's Python
        with torch.enable_grad():
            opt.zero_grad(set_to_none=True)
            mlp(x).sum().backward()
            opt.step()

    programs: dict[str, Callable[[], Any]] = {
        "view": lambda: [x.view(16) for _ in range(calls)],
        "transpose": lambda: [x.t() for _ in range(calls)],
        "tiny_add": lambda: [x + y for _ in range(calls)],
        "tiny_chain_backward": chain,
        "tiny_view_backward": view_chain,
        "tiny_linear_backward": linear_chain,
        "tiny_mlp_step": train_step,
    }
    fn = programs[op]
    return fn, None, {"counts": _host_counts(fn)}


def _host_counts(fn: Callable[[], Any]) -> dict[str, int]:
    """Host nodes of one run of `fn` by category, from an execution trace of it."""
    from torch.profiler import ExecutionTraceObserver

    from itercast.traces.execution_trace import read_execution_trace
    from itercast.traces.iteration_model import host_counts

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "et.json"
        observer = ExecutionTraceObserver()
        observer.register_callback(str(path))
        observer.start()
        fn()
        observer.stop()
        observer.unregister_callback()
        return host_counts(read_execution_trace(path))


def _time(
    fn: Callable[[], Any], device: str, warmup: int, repeats: int, budget_s: float = 0.5, host: bool = False
) -> tuple[list[float], list[float]]:
    """Seconds of each timed run of `fn`, and on a GPU the host's issue time of each run that did not
    wait for the device. On a GPU the times are the device's (CUDA events), with the stream held
    busy by a GPU_HOLD_CYCLES spin while the host issues the call, so the host's issue time stays
    out of them and is timed on its own (perf_counter around the call: the iteration model puts it
    on the host's timeline); a call whose issue outlasted 90% of the spin waited for the device and
    gives no issue time. `host`: wall-clock time to the end of the device's work instead (the host
    programs, whose tiny kernels finish before the next is issued)."""
    import torch

    cuda = device.startswith("cuda")
    flush = torch.empty(FLUSH_BYTES // 4, device=device)
    issue: list[float] = []
    with torch.no_grad():
        for _ in range(warmup):
            fn()
        times: list[float] = []
        while len(times) < repeats and (len(times) < 3 or sum(times) < budget_s):
            flush.fill_(len(times))  # cold caches, as for an operator inside an iteration
            if cuda and not host:
                hold, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
                hold.record()
                torch.cuda._sleep(GPU_HOLD_CYCLES)
                start.record()
                t0 = time.perf_counter()
                fn()
                issue_s = time.perf_counter() - t0
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) * 1e-3)
                if issue_s < 0.9e-3 * hold.elapsed_time(start):
                    issue.append(issue_s)
            else:
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                if cuda:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
    return times, issue


def check_device(device: str) -> None:
    """torch is installed and the device exists here, else one clear error (not torch's AssertionError)."""
    try:
        import torch
    except ImportError:
        raise ProfileError("itercast profile needs torch: pip install 'itercast[torch]' (CPU build 2.13.0)") from None
    if device == "cpu":
        return
    if device.split(":")[0] != "cuda":
        raise ProfileError(f"--device {device}: expected cpu or cuda (cuda:N)")
    if not torch.cuda.is_available():
        why = "this torch has no CUDA (the CPU build)" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ProfileError(f"--device {device}: {why}; measure on a machine with a GPU, or use --device cpu")
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise ProfileError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def run(
    db: ProfileDB,
    device: str = "cpu",
    quick: bool = False,
    families: tuple[str, ...] = FAMILIES,
    warmup: int = 3,
    repeats: int = 10,
    passes: int = 1,
    threads: int | None = None,
    embedding_batches: tuple[int, ...] | None = None,
) -> dict[str, int]:
    """Measure every configuration not yet in the database for this device. Returns counts.

    `embedding_batches`: the bags per embedding call, instead of the grid's.

    `threads`: torch's intra-op threads (default: torch's, one per core); a CPU that runs one rank
    per core is profiled with 1. The count is part of the device's fingerprint.

    Each pass runs in its own seeded shuffled order. passes > 1: the whole grid `passes` times, each
    row stored as it is measured (params["pass"]), so that a host whose speed drifts over minutes
    (this project's 2-core VM: most families of the grid measured 1.2–2.3× slower in one 3-minute
    stretch than in another) is sampled across the whole run; the database reads each
    configuration as the median of its passes (ProfileDB.measurements)."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # quiets the trace observer's notices (read at import)
    check_device(device)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    unknown = set(families) - set(FAMILIES)
    if unknown:
        raise ProfileError(f"unknown families {sorted(unknown)}: expected some of {', '.join(FAMILIES)}")
    fp = fingerprint(device)
    dev = db.device(fp.get("gpu") or fp.get("cpu") or device, fp)
    if passes < 1:
        raise ProfileError(f"passes: expected 1 or more, got {passes}")
    done = {_pass_key(m.family, m.op, m.params) for m in db.measurements(device_id=dev, passes=True)}
    chosen = QUICK if quick else GPU if device.startswith("cuda") else FULL
    if embedding_batches:
        chosen = chosen | {"embedding_batches": list(embedding_batches)}
    grid = [c for c in configs(chosen) if c[0] in families]
    if passes > 1:
        grid = [(f, op, params | {"pass": k}) for k in range(1, passes + 1) for f, op, params in grid]
    todo = [c for c in grid if _pass_key(*c) not in done]
    with Progress(transient=True) as bar:
        task = bar.add_task("profiling", total=len(todo))
        for k in sorted({c[2].get("pass", 1) for c in todo}):
            this_pass = [c for c in todo if c[2].get("pass", 1) == k]
            _measure_pass(db, dev, k, this_pass, device, warmup, repeats, bar, task)
    return {"measured": len(todo), "already there": len(done)}


def _pass_key(family: str, op: str, params: dict[str, Any]) -> tuple[str, str, str]:
    """A configuration and its pass (a row of a single-pass run is pass 1), as resuming compares them."""
    return family, op, json.dumps(_config(params) | {"pass": params.get("pass", 1)}, sort_keys=True)


def _measure_pass(
    db: ProfileDB,
    dev: int,
    pass_number: int,
    todo: list[tuple[str, str, dict[str, Any]]],
    device: str,
    warmup: int,
    repeats: int,
    bar: Progress,
    task: TaskID,
) -> None:
    """One pass: its configurations in a shuffled order seeded by the pass, then its collectives."""
    random.Random(pass_number).shuffle(todo)
    collectives = [(op, params) for family, op, params in todo if family == "collective"]
    for family, op, params in (c for c in todo if c[0] != "collective"):
        fn, call, measured = _prepare(family, op, params, device)
        times, issue = _time(fn, device, warmup, repeats, host=family == "host")
        stored = {**params, **({"call": call.__dict__} if call else {})}
        stored |= {"host_issue_s": statistics.median(issue)} if issue else {}
        stored |= {"counts": measured["counts"]} if "counts" in measured else {}
        stored |= {"features": measured} if measured and "counts" not in measured else {}
        db.add(dev, [_row(family, op, _size(call, measured), times, stored)])
        bar.advance(task)
    if collectives:  # one group of processes per world size, stored at the end
        bar.update(task, description=f"{len(collectives)} collectives (spawned processes)")
        rows = collective_bench.measure(collectives, device, warmup, repeats)
        db.add(dev, [_row("collective", op, p["bytes"], times, p, group_size=p["ranks"]) for op, p, times in rows])
        bar.advance(task, len(collectives))


def _row(
    family: str, op: str, size: float, times: list[float], params: dict[str, Any], group_size: int = 1
) -> Measurement:
    """A measured configuration: median and standard deviation of its timed runs."""
    return Measurement(
        family,
        op,
        size,
        statistics.median(times),
        "fp32",
        group_size,
        time_std_s=statistics.pstdev(times),
        repeats=len(times),
        params=params,
        source="measured: itercast profile",
    )


def _size(call: OpCall | None, measured: dict[str, Any]) -> float:
    """The row's size: FLOPs or bytes of its operator; for host programs, the number of host nodes."""
    return features(call).size if call else float(sum(measured["counts"].values()))
