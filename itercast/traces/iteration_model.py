"""Predict one training iteration on a CPU device from its execution trace and an operator calibration.

The execution trace (torch.profiler.ExecutionTraceObserver) gives every operator call of the
iteration, its parent and its argument shapes, and no times. On a CPU device operators run one
after another on the host, so the iteration takes the sum of
- every call's host overhead, by how it was called (aten_ops.host_category: from Python, nested in
  another operator, or an autograd function), and
- the kernel time of every operator that computes or moves data, priced by the calibrated model of
  its name (costs/op_model.py) less the host overhead its microbenchmark call carried.
Operators measured whole (convolutions, attention, norms, lookups: everything but GEMMs, whose
children such as a bias copy are priced on their own) stop the descent; composite operators
(aten::linear, aten::layer_norm, ...) contribute only their host overhead and their children.
This is the CPU case of the trace-driven model: on a GPU the same per-call costs become the host
chain and the kernels go to streams (traces/replay_graph.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from itercast.costs.aten_ops import ROOT_NODE, OpFeatures, features, host_category
from itercast.costs.op_model import OperatorCostModel
from itercast.traces.execution_trace import ETNode, ExecutionTrace


@dataclass
class IterationPrediction:
    """Predicted seconds of one iteration, split into host overheads and kernels per family."""

    host_s: float
    kernel_s_by_family: dict[str, float]
    calls_by_category: Counter = field(default_factory=Counter)

    @property
    def total_s(self) -> float:
        return self.host_s + sum(self.kernel_s_by_family.values())


def host_counts(et: ExecutionTrace) -> dict[str, int]:
    """Calls of the trace by host category (python, nested, autograd)."""
    names = {n.id: n.name for n in et.nodes}
    out: Counter = Counter()
    for n in et.nodes:
        cat = host_category(n.name, names.get(n.parent, ROOT_NODE))
        if cat:
            out[cat] += 1
    return dict(out)


def predict_iteration(
    et: ExecutionTrace,
    model: OperatorCostModel,
    unique_fraction: Callable[[ETNode, OpFeatures], float | None] | None = None,
) -> IterationPrediction:
    """`unique_fraction(node, features)`: the distinct-row fraction of an embedding bag's indices
    (the data's reuse; None or no function: uniform draws)."""
    children: dict[int, list[ETNode]] = {}
    by_id = {n.id: n for n in et.nodes}
    for n in et.nodes:
        if n.parent != n.id:  # the process node is its own parent
            children.setdefault(n.parent, []).append(n)
    host = model.host_s
    kernels: dict[str, float] = {}
    calls: Counter = Counter()

    def subtree_size(node: ETNode) -> int:
        return sum(1 + subtree_size(c) for c in children.get(node.id, []))

    def visit(node: ETNode, priced_above: bool) -> None:
        parent = by_id.get(node.parent)
        cat = host_category(node.name, parent.name if parent else ROOT_NODE)
        if cat:
            calls[cat] += 1
        whole = priced_above
        if not priced_above and node.name != ROOT_NODE:
            f = features(node)
            composite = f.family == "memory" and node.id in children and not model.has_model(node.name)
            if f.family != "free" and not composite:
                u = unique_fraction(node, f) if unique_fraction and f.family == "embedding_bag_fwd" else None
                own_host = host["python"] + subtree_size(node) * host["nested"]
                kernels[f.family] = kernels.get(f.family, 0.0) + max(model.measured_s(node, f, u) - own_host, 0.0)
                whole = f.family != "gemm"
        for child in children.get(node.id, []):
            visit(child, whole)

    for root in _roots(et):
        visit(root, False)
    host_total = sum(host[c] * k for c, k in calls.items())
    return IterationPrediction(host_total, kernels, calls)


def _roots(et: ExecutionTrace) -> list[ETNode]:
    ids = {n.id for n in et.nodes}
    return [n for n in et.nodes if n.parent not in ids or n.parent == n.id]
