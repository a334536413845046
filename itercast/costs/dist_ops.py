"""What TorchRec / FBGEMM and c10d operators of an execution trace do, from their recorded arguments.

Table-batched embeddings (TBE): FBGEMM's `fbgemm::split_embedding_codegen_lookup_{optimizer}_function`
(a forward lookup whose backward runs the optimizer fused: `SplitLookupFunction_{optimizer}_Op`) and
`fbgemm::dense_embedding_codegen_lookup_function` (dense gradient, no fused optimizer). Their schema
(pytorch/FBGEMM fbgemm_gpu/codegen/embedding_backward_split_host_template.cpp, and the `op_schema`
every execution trace records) starts, after the split lookup's `placeholder_autograd_tensor`, with
  dev_weights, uvm_weights, lxu_cache_weights, weights_placements, weights_offsets, D_offsets,
  total_D, max_D, hash_size_cumsum, total_hash_size_bits, indices, offsets, pooling_mode, …
(the dense lookup: dev_weights, weights_offsets, D_offsets, total_D, max_D, hash_size_cumsum,
total_hash_size_bits, indices, offsets, pooling_mode, …). A trace records the shapes of tensors,
not their values, so: T tables = len(weights_offsets); B bags per table = (len(offsets) − 1) / T;
L lookups = len(indices); the tables' mean width total_D / T and, from the weights' Σ rowsₜ·Dₜ
elements, rows per table numel / total_D. APPROXIMATION: the T tables of one call are priced as T
equal tables of that mean width and row count (their own D_offsets are values the trace lacks).

Collectives (c10d): `c10d::allreduce_` (a list of tensors: DDP's gradient buckets, one call per
bucket), `c10d::alltoall_base_` (output, input, group, output_split_sizes, input_split_sizes: the
splits count rows of the first dimension; empty splits are even), `c10d::allgather_`,
`c10d::_allgather_base_`, `c10d::reduce_scatter_`, `c10d::_reduce_scatter_base_`, `c10d::broadcast_`
(torch/csrc/distributed/c10d/Ops.cpp). A member's bytes are what it sends and receives.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from itercast.costs.aten_ops import itemsize, tensor_bytes

TBE_SPLIT = re.compile(r"fbgemm::split_embedding_codegen_lookup_(\w+?)_function(_pt2)?$")
TBE_DENSE = "fbgemm::dense_embedding_codegen_lookup_function"
#: argument positions (in the recorded inputs) of weights_offsets, total_D, indices and offsets
_TBE_ARGS = {"split": (5, 7, 11, 12), "dense": (1, 3, 7, 8)}
#: c10d operator → (collective kind of the cost model, index of its argument that holds the full buffer: an
#: all-gather's output, a reduce-scatter's input; Ops.cpp: allgather_(Tensor[][] output_tensors, Tensor[]
#: input_tensors, …), _allgather_base_(output, input), reduce_scatter_(Tensor[] output_tensors, Tensor[][]
#: input_tensors, …), _reduce_scatter_base_(output, input))
COLLECTIVES = {
    "c10d::allreduce_": ("all_reduce", 0),
    "c10d::alltoall_base_": ("alltoall", 1),
    "c10d::allgather_": ("all_gather", 0),
    "c10d::_allgather_base_": ("all_gather", 0),
    "c10d::reduce_scatter_": ("reduce_scatter", 1),
    "c10d::_reduce_scatter_base_": ("reduce_scatter", 1),
    "c10d::broadcast_": ("broadcast", 0),
}
#: FBGEMM's sparse-data helpers around a TBE lookup: memory-bound, priced by the bytes they touch
FBGEMM_MEMORY_OPS = {
    "fbgemm::permute_2D_sparse_data",
    "fbgemm::asynchronous_complete_cumsum",
    "fbgemm::bounds_check_indices",
}


class DistOpError(ValueError):
    """An FBGEMM or c10d call whose recorded arguments are not what its schema says."""


@dataclass(frozen=True)
class TBECall:
    """One table-batched lookup: `tables` tables of `rows` rows and `dim` columns each (mean),
    `bags` bags per table, `lookups` indices over all tables; `optimizer` fused into the backward
    ("dense": none, the gradient is written dense)."""

    optimizer: str
    tables: int
    rows: float
    dim: float
    bags: int
    lookups: int
    item_bytes: int


@dataclass(frozen=True)
class CollectiveCall:
    """One collective as one member sees it: `kind`, the full buffer's bytes (`nbytes`, what the
    cost model's bus factors apply to), and for an all-to-all the bytes sent to and received from
    each peer (empty: even)."""

    kind: str
    nbytes: float
    send_bytes: tuple[float, ...] = ()
    recv_bytes: tuple[float, ...] = ()

    @property
    def member_bytes(self) -> float:
        """What this member moves: the larger of what it sends and what it receives (its link's
        busier direction), or the buffer when the splits are even."""
        if not self.send_bytes and not self.recv_bytes:
            return self.nbytes
        return max(sum(self.send_bytes), sum(self.recv_bytes))


def is_tbe(name: str) -> bool:
    return name == TBE_DENSE or TBE_SPLIT.match(name) is not None


def tbe_call(name: str, shapes: list[Any], types: list[str], scalars: tuple[Any, ...]) -> TBECall:
    """A TBE lookup's tables and indices from its recorded arguments; DistOpError when they do not
    follow the schema (module docstring)."""
    split = TBE_SPLIT.match(name)
    w_off, total_d_at, idx_at, off_at = _TBE_ARGS["split" if split else "dense"]
    weights_at = 1 if split else 0
    if len(shapes) <= off_at or len(scalars) <= total_d_at:
        raise DistOpError(f"{name}: expected at least {off_at + 1} arguments (FBGEMM's schema); got {len(shapes)}")
    total_d = scalars[total_d_at]
    parts = [shapes[i] for i in (weights_at, w_off, idx_at, off_at)]
    if not isinstance(total_d, int) or isinstance(total_d, bool) or total_d < 1 or not all(_is_1d(s) for s in parts):
        raise DistOpError(
            f"{name}: expected 1-D tensors dev_weights, weights_offsets, indices, offsets and an int total_D "
            f"at arguments {weights_at + 1}, {w_off + 1}, {idx_at + 1}, {off_at + 1}, {total_d_at + 1}; "
            f"got shapes {parts} and total_D {total_d!r}"
        )
    numel, tables, lookups, offsets = (int(p[0]) for p in parts)
    if tables < 1 or (offsets - 1) % tables or offsets < 1:
        raise DistOpError(f"{name}: {offsets} offsets for {tables} tables; expected tables × bags + 1")
    return TBECall(
        split.group(1) if split else "dense",
        tables,
        numel / total_d,
        total_d / tables,
        (offsets - 1) // tables,
        lookups,
        itemsize(types[weights_at]),
    )


def collective_call(name: str, shapes: list[Any], types: list[str], values: list[Any]) -> CollectiveCall:
    """A c10d collective's kind and bytes from its recorded arguments (`values`: the raw inputs, for
    an all-to-all's split sizes); DistOpError when they do not follow its schema."""
    kind, main = COLLECTIVES[name]
    if len(shapes) <= main or len(types) <= main:
        raise DistOpError(f"{name}: expected a tensor at argument {main + 1}; got {len(shapes)} arguments")
    nbytes = tensor_bytes([shapes[main]], [types[main]])
    if kind != "alltoall":
        return CollectiveCall(kind, nbytes)
    if len(values) < 5 or not all(isinstance(v, list) for v in values[3:5]):
        raise DistOpError(f"{name}: expected output_split_sizes and input_split_sizes at arguments 4 and 5")
    out_shape, in_shape = shapes[0], shapes[1]
    if not _is_shape(out_shape) or not _is_shape(in_shape) or not out_shape or not in_shape:
        raise DistOpError(f"{name}: expected output and input tensors at arguments 1 and 2; got {shapes[:2]}")
    out_splits, in_splits = values[3], values[4]
    row = itemsize(types[1]) * math.prod(in_shape[1:])
    if out_splits or in_splits:
        if (
            len(out_splits) != len(in_splits)
            or not all(isinstance(s, int) and s >= 0 for s in out_splits + in_splits)
            or sum(in_splits) != in_shape[0]
            or sum(out_splits) != out_shape[0]
        ):
            raise DistOpError(
                f"{name}: split sizes {in_splits} (in) and {out_splits} (out) must be one per rank and sum to "
                f"the tensors' first dimensions {in_shape[0]} and {out_shape[0]}"
            )
        return CollectiveCall(kind, nbytes, tuple(s * row for s in in_splits), tuple(s * row for s in out_splits))
    return CollectiveCall(kind, nbytes)


def _is_shape(s: Any) -> bool:
    return isinstance(s, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in s)


def _is_1d(s: Any) -> bool:
    return _is_shape(s) and len(s) == 1
