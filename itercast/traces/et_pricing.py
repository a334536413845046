"""Which cost model prices each operator of a GPU execution trace, and at how many seconds.

One pricer serves every rank of a distributed step (traces/et_step.py). Operators, by what they are:
- `aten::` operators: their features (costs/aten_ops.py) on the operator models of a profiling
  database where it has one for the operator (`db:<family>`), else on the system preset's analytic
  model (`analytic:<family>`): GEMMs and convolutions on the GEMM curve in the training dtype,
  attention on its (guessed) curve, norms and every other data-moving operator as memory traffic;
- TBE lookups (costs/dist_ops.py) on the DLRM workload's embedding model (workloads/dlrm.py
  embedding_seconds: the operator models of a database where it has them, else memory traffic
  with distinct rows from the index statistics), each of the call's tables as one shard
  (`embedding:tbe_fwd`, and `embedding:tbe_bwd` for the autograd node that runs the backward with
  its fused optimizer);
- FBGEMM's sparse-data helpers as memory traffic of their tensors (`analytic:memory`);
- c10d collectives on the analytic collective model (`collective:<kind>`; traces/et_step.py
  prices them at the rendezvous, where every member's bytes are known);
- anything else that touches a GPU tensor is unpriced (reported with its share of the time);
- `aten::` operators on host tensors only are CPU work: host time, no launch (`on_host`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from itercast.costs.analytic import AnalyticCostModel
from itercast.costs.aten_ops import EMBEDDING_UPDATE, OpFeatures, features, tensor_bytes
from itercast.costs.dist_ops import COLLECTIVES, FBGEMM_MEMORY_OPS, TBECall, is_tbe, tbe_call
from itercast.costs.index_stats import IndexStats
from itercast.costs.op_model import OperatorCostModel, OpModelError
from itercast.traces.execution_trace import ETNode
from itercast.workloads.dlrm import EmbeddingTable, ShardWork, embedding_seconds
from itercast.workloads.dlrm.embedding import LOOKUP_OP

#: the autograd node that runs a TBE's backward (and its fused optimizer): FBGEMM's
#: Split{nobag}LookupFunction_{optimizer}_Op, and the dense lookup's SplitLookupFunction_Dense_Op
TBE_BACKWARD = re.compile(r"torch::autograd::CppNode<Split\w*LookupFunction_(\w+?)_Op(_pt2)?>$")
ANALYTIC_MEMORY_KIND = {"norm": "norm", "memory": "elementwise"}
#: operators that return their input itself when there is nothing to convert (aten::to of the same dtype and
#: device: its output tensor is its input's, and no _to_copy runs under it)
RETURNS_SELF_WHEN_NOTHING_TO_DO = {"aten::to", "aten::contiguous", "aten::type_as"}


@dataclass(frozen=True)
class Priced:
    """One operator's GPU work: `family` (per-family totals), `model` (which model priced it) and
    seconds on its stream; `whole`: its children are part of what was priced."""

    family: str
    model: str
    seconds: float
    whole: bool = True


def on_host(node: ETNode) -> bool:
    """An operator whose tensor inputs are all in host memory runs on the CPU and launches nothing
    (the data loader's cat, cumsum and add_ of the PARAM DLRM step: 0 runtime calls in its Kineto trace);
    an operator without tensor inputs (empty, ones) is decided by its children."""
    return bool(node.input_devices) and not any(d.startswith("cuda") for d in node.input_devices)


class ETPricer:
    """Prices the operators of one trace (`price`), remembering each TBE forward for its backward."""

    def __init__(
        self,
        costs: AnalyticCostModel,
        ops: OperatorCostModel | None = None,
        index_sample: np.ndarray | None = None,
        zipf_alpha: float = 0.0,
    ) -> None:
        """`index_sample`: a real sample of indices in their order (--indices), priced by its reuse
        (IndexStats.from_sequence), else the named distribution `zipf_alpha` (0: uniform)."""
        self.costs, self.ops, self.alpha = costs, ops, zipf_alpha
        self.index_sample = index_sample
        self._forwards: dict[str, list[TBECall]] = {}
        #: whether the indices asked for (a sample, or Zipf) moved any embedding price from uniform indices' (False
        #: where every lookup and update is priced as memory traffic, which no distribution changes)
        self.moved_by_indices = False

    def price(self, node: ETNode, has_children: bool) -> Priced | None:
        """The node's GPU work, or None when it has none of its own (a view, a scope, a composite
        operator whose children do the work). Raises DistOpError on a malformed TBE call."""
        name = node.name
        if is_tbe(name):
            call = tbe_call(name, node.input_shapes, node.input_types, node.input_scalars)
            self._forwards.setdefault(call.optimizer.lower(), []).append(call)
            return Priced("embedding:tbe_fwd", self._embedding_model(LOOKUP_OP), self._tbe_s(call, 0))
        backward = TBE_BACKWARD.match(name)
        if backward:
            pending = self._forwards.get(backward.group(1).lower(), [])
            if not pending:
                return None  # a backward whose forward is not in this trace: nothing known of it
            return Priced("embedding:tbe_bwd", self._embedding_model(EMBEDDING_UPDATE), self._tbe_s(pending.pop(0), 1))
        if name in FBGEMM_MEMORY_OPS:
            moved = tensor_bytes(node.input_shapes, node.input_types) + tensor_bytes(
                node.output_shapes, node.output_types
            )
            return Priced("memory", "analytic:memory", float(self.costs.memory_s("elementwise", moved)))
        if name in COLLECTIVES or not name.startswith("aten::") or on_host(node):
            return None
        f = features(node)
        if f.family == "free" or (f.family == "memory" and has_children and not self._db_has(name)):
            return None
        if (
            name in RETURNS_SELF_WHEN_NOTHING_TO_DO
            and not has_children
            and node.output_tensors == node.input_tensors[:1]
        ):
            return None  # returned its input (same dtype and device): no kernel, no bytes
        seconds, model = self._aten_s(node, f)
        return Priced(f.family, model, seconds, whole=f.family != "gemm")

    def _db_has(self, name: str) -> bool:
        return self.ops is not None and self.ops.has_model(name)

    def _aten_s(self, node: ETNode, f: OpFeatures) -> tuple[float, str]:
        if self.ops is not None:
            try:
                return self.ops.measured_s(node, f), f"db:{f.family}"
            except OpModelError:
                pass  # the database has no model of it: the analytic model below
        c = self.costs
        if f.family in ("gemm", "conv_fwd", "conv_bwd"):
            return float(c.gemm_s(f.size, te=False)), f"analytic:{f.family}"
        if f.family.startswith("attention"):
            return float(c.attention_s(f.size)), f"analytic:{f.family}"
        if f.family.startswith("embedding_bag"):
            return float(c.memory_s("elementwise", f.size)), f"analytic:{f.family}"
        return float(c.memory_s(ANALYTIC_MEMORY_KIND.get(f.family, "elementwise"), f.size)), f"analytic:{f.family}"

    def _embedding_model(self, op: str) -> str:
        """What prices a TBE pass: the database's model of `op` (the lookup, the update) where it has one, else the
        analytic model (embedding_seconds)."""
        return "db:embedding" if self.ops is not None and self.ops.has_model(op) else "analytic:embedding"

    def _tbe_s(self, call: TBECall, part: int) -> float:
        """Seconds of the call's tables' forward (`part` 0) or backward with the fused optimizer (1), each table a
        shard of the DLRM model (module docstring); notes whether the indices asked for moved it (moved_by_indices)."""
        rows, dim = max(1, round(call.rows)), max(1, round(call.dim))
        per_table = call.lookups / call.tables
        table = EmbeddingTable(
            name="tbe",
            num_rows=rows,
            embedding_dim=dim,
            pooling_factor=max(per_table / max(call.bags, 1), 1e-6),
            zipf_alpha=self.alpha,
        )
        work = ShardWork(per_table, rows, dim, call.bags, replica=call.optimizer == "dense")
        index = None
        if self.index_sample is not None:
            index = IndexStats.from_sequence(self.index_sample, max(1, round(per_table)), dim * call.item_bytes)
        seconds = embedding_seconds(self.costs, table, work, self.ops, index)[part]
        if (index is not None or self.alpha) and not self.moved_by_indices:
            uniform = table.model_copy(update={"zipf_alpha": 0.0})
            self.moved_by_indices = embedding_seconds(self.costs, uniform, work, self.ops)[part] != seconds
        return call.tables * seconds
