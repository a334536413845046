"""What a PyTorch (aten) operator computes, from its argument shapes: the features cost models price.

One description serves both sides, so that what a microbenchmark measured and what a trace asks for
are described alike: `itercast profile` builds an `OpCall` from the tensors it times, and an
execution-trace node (traces/execution_trace.ETNode) carries the same fields.

Families (`features(call).family`):
- gemm: aten::mm/addmm (one matrix product), aten::bmm/baddbmm (a batch of them); FLOPs 2·b·m·n·k
  and the layout of each operand (transposed when its last dimension is not the contiguous one);
- conv_fwd / conv_bwd: aten::convolution and aten::convolution_backward as implicit GEMMs,
  m = N·H_out·W_out, n = C_out, k = C_in/groups·∏kernel; the backward does two such products
  (input and weight gradients) when both are asked for;
- attention_fwd / attention_bwd: fused scaled-dot-product attention, 4·b·h·s_q·s_kv·d FLOPs of the
  full forward, with causal masking as a "layout" (whether masked blocks are skipped is the device's
  business: the CPU kernel measured here is as slow causal as not); the backward is keyed by the same;
- embedding_bag_fwd / embedding_bag_bwd: bytes of every looked-up row, and the table's bytes;
- embedding_bag_update: the fused sparse row-wise Adagrad update of a table (itercast::rowwise_adagrad_update,
  profile/microbench.rowwise_adagrad_update; what TorchRec fuses into the backward): bytes of every
  looked-up row's gradient, and the table's bytes;
- norm: layer norm, batch norm (native and cuDNN) and (log-)softmax, forward and backward: the
  bytes of their tensors, with the number of independent rows (channels, for a batch norm) as m
  and the length each one reduces over as n; a GPU runs one block per row or channel, so a batch
  norm of 32 channels streams at a third of the rate of one of 128 channels (H100: 260 vs 900 GB/s
  for the backward of 100 MB);
- memory: everything else that moves data, by the bytes of its tensor inputs and outputs;
- free: views and allocations, which move no data (only the host overhead of the call remains).
Operators whose work is all in their children (aten::linear, aten::layer_norm, ...) are "composite".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

#: bytes per element of the type names execution traces write ("Tensor(float)" → "float")
ITEMSIZE = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
}
GEMM_OPS = {"aten::mm": 0, "aten::addmm": 1, "aten::bmm": 0, "aten::baddbmm": 1}  # name → index of mat1
#: fused attention operators → index of is_causal among their arguments (schemas of torch 2.11-2.13)
ATTENTION_FWD = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": 4,
    "aten::_scaled_dot_product_flash_attention": 4,
    "aten::_scaled_dot_product_efficient_attention": 6,
}
ATTENTION_BWD = {
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": 7,
    "aten::_scaled_dot_product_flash_attention_backward": 11,
    "aten::_scaled_dot_product_efficient_attention_backward": 11,
}
EMBEDDING_BAG_FWD = {"aten::_embedding_bag", "aten::_embedding_bag_forward_only"}
EMBEDDING_BAG_BWD = {"aten::_embedding_bag_backward"}
EMBEDDING_UPDATE = "itercast::rowwise_adagrad_update"  # inputs: weight [rows, d], state [rows], indices, gradients
#: memory-bound operators priced whole (their children are part of what was measured)
WHOLE_MEMORY_OPS = {
    "aten::native_layer_norm",
    "aten::native_layer_norm_backward",
    "aten::native_batch_norm",
    "aten::native_batch_norm_backward",
    "aten::cudnn_batch_norm",
    "aten::cudnn_batch_norm_backward",
    "aten::_softmax",
    "aten::_softmax_backward_data",
    "aten::_log_softmax",
    "aten::_log_softmax_backward_data",
    "aten::embedding_dense_backward",
}
#: normalisations → index of their main input among the arguments, and whether it is channels-first
#: (a batch norm reduces over every dimension but the second; the others over the last)
NORM_OPS = {
    "aten::native_layer_norm": (0, False),
    "aten::native_layer_norm_backward": (1, False),
    "aten::native_batch_norm": (0, True),
    "aten::native_batch_norm_backward": (1, True),
    "aten::cudnn_batch_norm": (0, True),
    "aten::cudnn_batch_norm_backward": (0, True),
    "aten::_softmax": (0, False),
    "aten::_softmax_backward_data": (1, False),
    "aten::_log_softmax": (0, False),
    "aten::_log_softmax_backward_data": (1, False),
}
#: operators that only make views or allocate (no data moved)
#: in-place operators that overwrite self without reading it (copy_ reads its source, fill_ and zero_ nothing)
OVERWRITES_SELF = {"aten::copy_", "aten::fill_", "aten::zero_"}
FREE_OPS = {
    "aten::view",
    "aten::_unsafe_view",
    "aten::reshape",
    "aten::_reshape_alias",
    "aten::as_strided",
    "aten::t",
    "aten::transpose",
    "aten::permute",
    "aten::expand",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::slice",
    "aten::select",
    "aten::split",
    "aten::split_with_sizes",
    "aten::unbind",
    "aten::chunk",
    "aten::narrow",
    "aten::alias",
    "aten::detach",
    "aten::detach_",
    "aten::resolve_conj",
    "aten::resolve_neg",
    "aten::empty",
    "aten::empty_strided",
    "aten::empty_like",
    "aten::resize_",
    "aten::set_",
    "aten::lift_fresh",
    "aten::record_stream",  # marks the block for the caching allocator; launches nothing (0 runtime calls measured)
    "aten::_local_scalar_dense",
    "aten::item",
    "aten::is_nonzero",
    "aten::size",
    "aten::stride",
    "aten::numel",
}
ROOT_NODE = "[pytorch|profiler|execution_trace|thread]"


class OpArgs(Protocol):
    """The fields of an operator call that pricing reads (ETNode and OpCall have them)."""

    @property
    def name(self) -> str: ...
    @property
    def input_shapes(self) -> list[Any]: ...
    @property
    def input_types(self) -> list[str]: ...
    @property
    def input_strides(self) -> list[Any]: ...
    @property
    def output_shapes(self) -> list[Any]: ...
    @property
    def output_types(self) -> list[str]: ...
    @property
    def input_scalars(self) -> tuple[Any, ...]: ...


@dataclass(frozen=True)
class OpCall:
    """An operator call described from live tensors (what `itercast profile` times)."""

    name: str
    input_shapes: list[Any]
    input_types: list[str]
    input_strides: list[Any] = field(default_factory=list)
    output_shapes: list[Any] = field(default_factory=list)
    output_types: list[str] = field(default_factory=list)
    input_scalars: tuple[Any, ...] = ()


@dataclass(frozen=True)
class OpFeatures:
    """family (see the module docstring); size: FLOPs or bytes; dims: what the family's model reads."""

    family: str
    size: float = 0.0
    dims: dict[str, Any] = field(default_factory=dict)


def itemsize(type_name: str) -> int:
    """Bytes per element of "Tensor(float)"-style names (4 when the element type is not known)."""
    inner = type_name[type_name.find("(") + 1 : type_name.rfind(")")] if "(" in type_name else type_name
    return ITEMSIZE.get(inner, 4)


def tensor_bytes(shapes: list[Any], types: list[str]) -> float:
    """Bytes of every tensor among the arguments, lists of tensors included, and lists of lists (c10d's
    Tensor[][], recorded as "GenericList[GenericList[Tensor(float),…],…]" over nested shapes); a list's
    tensors at its first tensor's element type."""
    total = 0.0
    for shape, kind in zip(shapes, types, strict=False):
        if kind.startswith("Tensor(") and _is_shape(shape):
            total += math.prod(shape) * itemsize(kind)
        elif kind.startswith("GenericList[") and "Tensor(" in kind and isinstance(shape, list):
            first = kind[kind.index("Tensor(") :]
            size = itemsize(first[: first.index(")") + 1])
            total += sum(math.prod(s) * size for s in _leaf_shapes(shape))
    return total


def _leaf_shapes(items: list[Any]) -> list[list[int]]:
    """The tensor shapes in a list of them, or of lists of them ([] is a 0-dim tensor's shape)."""
    return [leaf for s in items if isinstance(s, list) for leaf in ([s] if _is_shape(s) else _leaf_shapes(s))]


def features(call: OpArgs) -> OpFeatures:
    name, shapes = call.name, call.input_shapes
    if name in GEMM_OPS:
        return _gemm(call)
    if name == "aten::convolution":
        return _conv(shapes[0], shapes[1], call.output_shapes[0], "conv_fwd", 1)
    if name == "aten::convolution_backward":
        wanted = sum(1 for s in call.output_shapes[:2] if _is_shape(s) and s)  # grads asked for (input, weight)
        return _conv(shapes[1], shapes[2], shapes[0], "conv_bwd", max(wanted, 1))
    if name in ATTENTION_FWD or name in ATTENTION_BWD:
        q, k = (shapes[0], shapes[1]) if name in ATTENTION_FWD else (shapes[1], shapes[2])
        causal_at = ATTENTION_FWD.get(name) or ATTENTION_BWD[name]
        causal = bool(call.input_scalars[causal_at]) if len(call.input_scalars) > causal_at else False
        flops = 4.0 * math.prod(q[:-1]) * k[-2] * q[-1]
        family = "attention_fwd" if name in ATTENTION_FWD else "attention_bwd"
        dims = {"batch": math.prod(q[:-2]), "m": q[-2], "n": k[-2], "k": q[-1], "layout": "causal" if causal else "nn"}
        return OpFeatures(family, flops, dims)
    if name in EMBEDDING_BAG_FWD:
        (rows, dim), lookups, bags = shapes[0], math.prod(shapes[1]), math.prod(shapes[2])  # one offset per bag
        return lookup_features("embedding_bag_fwd", rows, dim, lookups, bags, itemsize(call.input_types[0]))
    if name in EMBEDDING_BAG_BWD:
        grad, lookups = shapes[0], math.prod(shapes[1])
        rows = call.input_scalars[6] if len(call.input_scalars) > 6 else None
        if not isinstance(rows, int):
            raise ValueError(f"{name}: expected the table's row count (num_weights) as argument 7")
        bags = math.prod(grad[:-1])  # the pooled gradient: one row per bag
        return lookup_features("embedding_bag_bwd", rows, grad[-1], lookups, bags, itemsize(call.input_types[0]))
    if name == EMBEDDING_UPDATE:
        (rows, dim), lookups = shapes[0], math.prod(shapes[2])  # the gradient of each lookup's row: no bags
        return lookup_features("embedding_bag_update", rows, dim, lookups, lookups, itemsize(call.input_types[0]))
    if name in FREE_OPS or not name.startswith("aten::"):
        return OpFeatures("free")
    moved = tensor_bytes(shapes, call.input_types) + tensor_bytes(call.output_shapes, call.output_types)
    if name in OVERWRITES_SELF:  # self is written, not read: its bytes once, as the output
        moved -= tensor_bytes(shapes[:1], call.input_types[:1])
    if name in NORM_OPS and _is_shape(shapes[NORM_OPS[name][0]]) and len(shapes[NORM_OPS[name][0]]) >= 2:
        x, channels_first = shapes[NORM_OPS[name][0]], NORM_OPS[name][1]
        rows, length = (x[1], math.prod(x) // max(x[1], 1)) if channels_first else (math.prod(x[:-1]), x[-1])
        return OpFeatures("norm", moved, {"m": max(rows, 1), "n": max(length, 1), "k": 1})
    return OpFeatures("memory", moved)


def lookup_features(family: str, rows: float, dim: int, lookups: float, bags: float, item_bytes: int = 4) -> OpFeatures:
    """An embedding table's operator (lookup, its backward or update): bytes of every looked-up row,
    the table's shape, and the bags (pooled outputs) its lookups are summed into."""
    dims = {"rows": rows, "dim": dim, "lookups": lookups, "bags": bags, "table_bytes": rows * dim * item_bytes}
    return OpFeatures(family, lookups * dim * item_bytes, dims)


def _gemm(call: OpArgs) -> OpFeatures:
    i = GEMM_OPS[call.name]
    a, b = call.input_shapes[i], call.input_shapes[i + 1]
    strides = call.input_strides[i : i + 2] if len(call.input_strides) >= i + 2 else [[], []]
    layout = "".join(_transposed(s) for s in strides)
    batch = a[0] if len(a) == 3 else 1
    m, k, n = a[-2], a[-1], b[-1]
    return OpFeatures("gemm", 2.0 * batch * m * n * k, {"batch": batch, "m": m, "n": n, "k": k, "layout": layout})


def _transposed(stride: Any) -> str:
    """'t' when the last two dimensions are stored column-major (stride of the last one is not 1)."""
    return "t" if _is_shape(stride) and len(stride) >= 2 and stride[-1] != 1 and stride[-2] == 1 else "n"


def _conv(x: list[int], w: list[int], out: list[int], family: str, products: int) -> OpFeatures:
    groups = max(1, x[1] // w[1]) if w[1] else 1
    m, n, k = out[0] * math.prod(out[2:]), w[0], w[1] * math.prod(w[2:])
    return OpFeatures(family, 2.0 * m * n * k * products, {"m": m, "n": n, "k": k, "groups": groups})


def _is_shape(s: Any) -> bool:
    return isinstance(s, list) and all(isinstance(v, int) for v in s)


def host_category(name: str, parent_name: str) -> str | None:
    """How a trace node costs host time: 'python' (an operator called from Python), 'nested' (one
    called by another operator or by autograd in C++), 'autograd' (one backward function run by the
    engine), or None (the trace's thread root and user record-function scopes, which add nothing)."""
    if name == ROOT_NODE:
        return None
    if name.startswith("autograd::engine::evaluate_function"):
        return "autograd"
    if not name.startswith("aten::"):
        return "nested" if parent_name.startswith(("aten::", "autograd::")) or _is_backward(parent_name) else None
    if parent_name.startswith("aten::") or parent_name.startswith("autograd::") or _is_backward(parent_name):
        return "nested"
    return "python"


def _is_backward(name: str) -> bool:
    return name.rstrip("0123456789").endswith("Backward")
