"""Each microbenchmark configuration as a live operator call on the device: seeded input tensors, a
closure that runs the operator, its OpCall (costs/aten_ops.py: name, shapes, types, strides, scalars,
so a calibration prices a trace's operators from the same description), and what was measured of the
inputs (an embedding's distinct and most frequent rows; a host program's node counts, from an
execution trace of it). Families and their parameters: profile/microbench.py's grids.

Operators as PyTorch 2.13 runs them in training: aten::mm / bmm, aten::convolution(_backward), the
CPU flash and CUDA memory-efficient SDPA kernels, native layer norm, native (CPU) or cuDNN (GPU)
batch norm, softmax, elementwise operators, aten::_embedding_bag(_backward) and the fused row-wise
Adagrad update (rowwise_adagrad_update).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from itercast.costs.aten_ops import EMBEDDING_UPDATE, OpCall
from itercast.costs.op_model import ZIPF_ALPHA

TYPE_NAMES = {"float32": "float", "float64": "double", "float16": "c10::Half", "bfloat16": "c10::BFloat16"}
TYPE_NAMES |= {"int64": "long int", "int32": "int", "bool": "bool"}


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


def prepare(family: str, op: str, params: dict[str, Any], device: str) -> Prepared:
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
