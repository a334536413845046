"""PyTorch Execution Trace (the JSON of `torch.profiler.ExecutionTraceObserver`): import, and link to Kineto.

An execution trace has what Kineto lacks: every operator's input/output tensors (ids, shapes,
types) and its parent, hence the data dependencies between operators; Kineto has the times and
the GPU kernels. The link goes through CPU operators:
- by record-function id (`rf_id` in the ET, "Record function id" in Kineto) when Kineto has distinct ids;
- otherwise by name and order of issue (k-th `aten::mm` ↔ k-th `aten::mm`), checked against
  Kineto's "Input Dims" where recorded; mismatches are counted, not hidden.
A GPU op belongs to the innermost CPU operator around its launch call; through the link it gets
the operator's shapes (e.g. the M, N, K of a GEMM).
Schemas 1.0.x (fields on the node) and 1.1.x (`attrs` list) are read. MLCommons Chakra's protobuf
form is not read here (its tools are not on PyPI): convert Chakra to this JSON first.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ijson
import numpy as np

from itercast.traces.kineto import RankTrace, TraceError, _HeadTailReader, _open, _top_level_value, integer_or_none


@dataclass(frozen=True)
class ETNode:
    id: int
    rf_id: int
    parent: int
    name: str
    tid: int
    input_shapes: list[Any]
    output_shapes: list[Any]
    input_types: list[str]
    input_tensors: tuple[int, ...]
    output_tensors: tuple[int, ...]
    input_strides: list[Any] = field(default_factory=list)
    output_types: list[str] = field(default_factory=list)
    #: scalar arguments (int, float, bool, str) by position; None where the argument is not a scalar
    input_scalars: tuple[Any, ...] = ()
    #: device of each tensor input ("cpu", "cuda:0", ...), in the order of input_tensors
    input_devices: tuple[str, ...] = ()
    #: storage id of each tensor input (views share their base's), in the order of input_tensors
    input_storages: tuple[int, ...] = ()
    #: the recorded argument values whose lists hold no tensor (a collective's split sizes), else None
    input_lists: tuple[Any, ...] = ()


@dataclass
class ExecutionTrace:
    path: str
    schema: str
    nodes: list[ETNode]
    pid: int | None = None  # the process that recorded it (top-level `pid`), None where absent

    def node(self, node_id: int) -> ETNode | None:
        if not hasattr(self, "_by_id"):
            self._by_id = {n.id: n for n in self.nodes}
        return self._by_id.get(node_id)

    def data_edges(self) -> list[tuple[int, int]]:
        """(producer, consumer) node ids: a node reads a tensor the other wrote last before it."""
        writer: dict[int, int] = {}
        edges = []
        for node in sorted(self.nodes, key=lambda n: n.id):
            for t in node.input_tensors:
                if t in writer and writer[t] != node.id:
                    edges.append((writer[t], node.id))
            for t in node.output_tensors:
                writer[t] = node.id
        return edges


def read_execution_trace(path: str | Path) -> ExecutionTrace:
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such execution trace")
    nodes: list[ETNode] = []
    try:
        with _open(path) as raw:
            tap = _HeadTailReader(raw, path)
            for n in ijson.items(tap, "nodes.item", use_float=True):
                nodes.append(_node(n))  # appended one by one: an error names the node it is in
    except (ijson.JSONError, EOFError, OSError, UnicodeDecodeError) as exc:
        detail = " ".join(str(exc).split())
        raise TraceError(
            f"{path}: malformed or truncated execution trace after {len(nodes)} nodes ({detail})"
        ) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceError(f"{path}: node {len(nodes)}: expected fields id, name and inputs/outputs ({exc})") from None
    edges = tap.edges()  # the file's head and tail, where its top-level fields are
    schema = _top_level_value(edges, "schema")
    if schema is None:
        raise TraceError(f"{path}: not a PyTorch execution trace (no `schema` and `nodes`)")
    if not nodes:
        raise TraceError(f"{path}: `nodes`: expected the operators of a traced step; got none")
    return ExecutionTrace(str(path), str(schema), nodes, integer_or_none(_top_level_value(edges, "pid")))


def other_process_note(et: ExecutionTrace, kineto: RankTrace) -> str | None:
    """Where the execution trace and the Kineto trace it is linked to were recorded by different processes (their
    `pid`s; PyTorch's ExecutionTraceObserver and Kineto record the same one in one run), the sentence that says so:
    another rank's trace links just as well where the ranks run the same operators, with its own shapes."""
    if et.pid is None or kineto.host_pid is None or et.pid == kineto.host_pid:
        return None
    return (
        f"{et.path} was recorded by process {et.pid} and {kineto.path} by process {kineto.host_pid}: "
        "not one process's pair (another rank's or another run's execution trace?), linked by operator all the same"
    )


def _shapes(value: Any, field: str) -> list[Any]:
    """An argument list's shapes as the trace gives them: per argument a tensor's dimensions (non-negative
    integers), a tensor list's (a list of such lists), or [] (no tensor)."""
    if not isinstance(value, list) or not all(_is_shape(s) for s in value):
        raise TypeError(
            f"{field}: expected per argument a list of non-negative integer dimensions (or a list of such lists); "
            f"got {str(value)[:60]!r}"
        )
    return value


def _is_shape(value: Any) -> bool:
    if not isinstance(value, list):
        return False
    dims = all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value)
    return dims or all(_is_shape(x) for x in value)


def _node(n: dict[str, Any]) -> ETNode:
    if not isinstance(n, dict):
        raise TypeError(f"a node is {type(n).__name__} {str(n)[:40]!r}, not an object")
    attrs = {a["name"]: a.get("value") for a in n.get("attrs", []) if isinstance(a, dict) and "name" in a}
    inputs: Any = n.get("inputs", [])
    outputs: Any = n.get("outputs", [])
    if not all(isinstance(x, list) for x in (inputs, outputs)) and not all(
        isinstance(x, dict) for x in (inputs, outputs)
    ):
        raise TypeError(f"inputs and outputs: expected two lists or two objects; got {str(inputs)[:40]!r}")
    if isinstance(inputs, dict):  # schema 1.1: {"values": [...], "shapes": [...], "types": [...], "strides"}
        in_shapes, out_shapes, in_types = inputs.get("shapes", []), outputs.get("shapes", []), inputs.get("types", [])
        in_strides, out_types = inputs.get("strides", []), outputs.get("types", [])
        inputs, outputs = inputs.get("values", []), outputs.get("values", [])
    else:
        in_shapes, out_shapes = n.get("input_shapes", []), n.get("output_shapes", [])
        in_types, out_types, in_strides = n.get("input_types", []), n.get("output_types", []), []
    parent: Any = n.get("parent", n.get("ctrl_deps", -1))  # 1.1.x calls the parent ctrl_deps
    if not isinstance(n["name"], str):
        raise TypeError(f"name: expected a string; got {n['name']!r}")
    return ETNode(
        int(n["id"]),
        int(n.get("rf_id", attrs.get("rf_id", -1)) or -1),
        int(parent),
        n["name"],
        int(n.get("tid", attrs.get("tid", 0)) or 0),
        _shapes(in_shapes, "input shapes"),
        _shapes(out_shapes, "output shapes"),
        [str(x) for x in in_types],
        _tensor_ids(inputs),
        _tensor_ids(outputs),
        list(in_strides),
        [str(x) for x in out_types],
        tuple(
            v if isinstance(v, int | float | bool | str) and not str(t).startswith("Tensor") else None
            for v, t in zip(inputs, in_types, strict=False)
        ),
        _tensor_ids(inputs, 5),
        _tensor_ids(inputs, 1),
        tuple(v if isinstance(v, list) and not _tensor_ids([v]) else None for v in inputs),
    )


def _tensor_ids(values: list[Any], field: int = 0) -> tuple[Any, ...]:
    """Tensor arguments are [tensor_id, storage_id, offset, numel, itemsize, device] (lists of them
    too): each one's `field` (0: the id, 1: the storage, as ints; 5: the device)."""
    out: list[Any] = []
    for v in values:
        if isinstance(v, list) and len(v) == 6 and isinstance(v[0], int | float) and isinstance(v[5], str):
            out.append(int(v[field]) if field < 2 else v[field])
        elif isinstance(v, list):
            out += _tensor_ids(v, field)
    return tuple(out)


@dataclass
class TraceLink:
    """ET node id ↔ Kineto CPU op index, and which CPU op launched each GPU op."""

    method: str
    node_of_cpu_op: dict[int, int]
    cpu_op_of_gpu_op: dict[int, int]
    stats: Counter = field(default_factory=Counter)

    def node_of_gpu_op(self, et: ExecutionTrace, op: int) -> ETNode | None:
        """The ET operator that launched GPU op `op`, if linked."""
        cpu = self.cpu_op_of_gpu_op.get(op)
        node = self.node_of_cpu_op.get(cpu) if cpu is not None else None
        return et.node(node) if node is not None else None


def link(et: ExecutionTrace, kineto: RankTrace) -> TraceLink:
    names = kineto.names
    rf = kineto.cpu_rf_id
    stats: Counter = Counter()
    distinct = rf.size and len(set(rf.tolist())) > 0.9 * rf.size and (rf >= 0).all()
    node_of: dict[int, int] = {}
    if distinct:
        method = "record function id"
        by_rf = {int(r): i for i, r in enumerate(rf.tolist())}
        for n in et.nodes:
            i = by_rf.get(n.rf_id)
            if i is not None and names[kineto.cpu_name[i]] == n.name:
                node_of[i] = n.id
        # a Kineto operator whose id names no ET operator of its name: the ET of another run or step
        stats["Kineto CPU ops without an ET node"] = int(rf.size) - len(node_of)
    else:
        method = "name and order of issue"
        et_by_name: dict[str, list[ETNode]] = defaultdict(list)
        for n in sorted(et.nodes, key=lambda n: n.id):
            et_by_name[n.name].append(n)
        k_by_name: dict[str, list[int]] = defaultdict(list)
        for i in np.argsort(kineto.cpu_ts_us, kind="stable").tolist():
            k_by_name[names[kineto.cpu_name[i]]].append(i)
        for name, ops in k_by_name.items():
            for i, n in zip(ops, et_by_name.get(name, []), strict=False):
                dims = _tensor_shapes(json.loads(kineto.cpu_input_dims[i] or "[]"))
                if dims and _tensor_shapes(n.input_shapes) and dims != _tensor_shapes(n.input_shapes):
                    stats["linked ops whose input shapes differ"] += 1
                node_of[i] = n.id
            stats["Kineto CPU ops without an ET node"] += max(0, len(ops) - len(et_by_name.get(name, [])))
    stats["linked CPU ops"] = len(node_of)
    stats["ET nodes"] = len(et.nodes)
    launcher = _launching_cpu_ops(kineto)
    stats["GPU ops with a linked CPU op"] = sum(1 for c in launcher.values() if c in node_of)
    stats["GPU ops"] = kineto.num_ops
    return TraceLink(method, node_of, launcher, stats)


def _tensor_shapes(shapes: list[Any]) -> list[list[int]]:
    """The tensor shapes among an op's argument shapes (non-empty int lists); the two formats write
    scalars and int lists differently ([] vs [[]]), tensors alike."""
    return [s for s in shapes if isinstance(s, list) and s and all(isinstance(x, int | float) for x in s)]


def _launching_cpu_ops(t: RankTrace) -> dict[int, int]:
    """GPU op index → the innermost CPU op (same thread) whose span holds its launch call."""
    call_of = {int(c): i for i, c in enumerate(t.call_corr.tolist()) if c >= 0}
    by_tid: dict[int, np.ndarray] = {}
    for tid in set(t.cpu_tid.tolist()):
        idx = np.flatnonzero(t.cpu_tid == tid)
        by_tid[tid] = idx[np.argsort(t.cpu_ts_us[idx], kind="stable")]
    out = {}
    for k, corr in enumerate(t.op_corr.tolist()):
        call = call_of.get(int(corr))
        if call is None or int(t.call_tid[call]) not in by_tid:
            continue
        ops, ts = by_tid[int(t.call_tid[call])], t.call_ts_us[call]
        j = int(np.searchsorted(t.cpu_ts_us[ops], ts, side="right")) - 1
        while j >= 0 and t.cpu_ts_us[ops[j]] + t.cpu_dur_us[ops[j]] < ts:
            j -= 1  # an earlier sibling that ended before the launch: keep looking for the enclosing op
        if j >= 0:
            out[k] = int(ops[j])
    return out


#: an ET and a Kineto trace of the same rank and step link every operator with equal shapes (the PARAM
#: DLRM's 8 pairs: 0 of 1,633 differ); rank 0's ET against rank 1's Kineto trace: 24 of 1,633 (1.5%)
MISMATCH_SHARE = 0.01


def matched_link(et: ExecutionTrace, k: RankTrace) -> TraceLink:
    """The Kineto link of an execution trace and its Kineto trace (traces/execution_trace.link). TraceError
    when the two do not record the same operators: more than MISMATCH_SHARE of the linked ones
    differ in input shapes, or of Kineto's find no ET node (the trace of another rank or step)."""
    tl = link(et, k)
    linked = max(tl.stats["linked CPU ops"], 1)
    differ, missing = tl.stats["linked ops whose input shapes differ"], tl.stats["Kineto CPU ops without an ET node"]
    if differ > MISMATCH_SHARE * linked or missing > MISMATCH_SHARE * linked:
        raise TraceError(
            f"{et.path} does not match {k.path}: {differ} of {tl.stats['linked CPU ops']} linked operators differ in "
            "input shapes, "
            f"{missing} Kineto operators have no ET node (the trace of another rank or step?)"
        )
    return tl
