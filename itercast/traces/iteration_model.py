"""Predict one training iteration on a CPU or a GPU from its execution trace and an operator calibration.

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
Every operator that launches work (`launches`: an operator measured whole, or a leaf that moves
data) also costs one host "launch" (fitted where the host programs measured one: on a GPU, the launch call).

On a GPU (`gpu=True`; the calibration's kernel times are device times, profile/microbench._time)
a priced operator whose host issue time was measured costs the host that time (less one Python call
plus one nested call when another operator or autograd called it) in place of the generic costs of
it and its subtree; the host and the device are two clocks, as in the trace-driven model of Lin et al. (DLRM
performance model, 2022): in call order, host costs advance the host clock; a priced operator's
kernels start at the later of the host clock after its calls and the end of the device's previous
work (one stream), and end its model time later; an operator that reads a device value back
(SYNC_OPS) holds the host until the device's work so far is done. The iteration ends when both are
done (its timing synchronises). One stream only: these traces launch everything on the default one.
A distributed step (c10d collectives, FBGEMM table-batched lookups, every rank at once, a system
preset's cost models) is traces/et_step.py's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from itercast.costs.aten_ops import ROOT_NODE, WHOLE_MEMORY_OPS, OpFeatures, features, host_category
from itercast.costs.index_stats import IndexStats
from itercast.costs.op_model import OperatorCostModel
from itercast.traces.execution_trace import ETNode, ExecutionTrace

#: operators whose call copies a value to the host: with a tensor on a GPU, they wait for its queued work
SYNC_OPS = {"aten::_local_scalar_dense"}


@dataclass
class IterationPrediction:
    """Predicted seconds of one iteration: host overheads, kernels per family, and on a GPU the span
    of the two timelines (`span_s`; None on a CPU, where the two add up)."""

    host_s: float
    kernel_s_by_family: dict[str, float]
    calls_by_category: Counter = field(default_factory=Counter)
    span_s: float | None = None

    @property
    def total_s(self) -> float:
        return self.span_s if self.span_s is not None else self.host_s + sum(self.kernel_s_by_family.values())


def launches(node: ETNode, has_children: bool) -> bool:
    """Whether the call launches work of its own: an operator that moves data or computes and is
    either a leaf or measured whole (GEMMs, convolutions, attention, lookups, norms)."""
    f = features(node).family if node.name.startswith("aten::") else "free"
    return f != "free" and (not has_children or f != "memory" or node.name in WHOLE_MEMORY_OPS)


def host_counts(et: ExecutionTrace) -> dict[str, int]:
    """Calls of the trace by host category (python, nested, autograd) and its launches."""
    names = {n.id: n.name for n in et.nodes}
    parents = {n.parent for n in et.nodes if n.parent != n.id}
    out: Counter = Counter()
    for n in et.nodes:
        cat = host_category(n.name, names.get(n.parent, ROOT_NODE))
        if cat:
            out[cat] += 1
        if n.name != ROOT_NODE and launches(n, n.id in parents):
            out["launch"] += 1
    return dict(out)


def predict_iteration(
    et: ExecutionTrace,
    model: OperatorCostModel,
    index_stats: Callable[[ETNode, OpFeatures], IndexStats | None] | None = None,
    gpu: bool = False,
) -> IterationPrediction:
    """`index_stats(node, features)`: what an embedding bag's indices are (the data's reuse and
    its most frequent row; None or no function: uniform draws). `gpu`: price on two timelines (module
    docstring); else host and kernel times add up."""
    children: dict[int, list[ETNode]] = {}
    by_id = {n.id: n for n in et.nodes}
    for n in sorted(et.nodes, key=lambda n: n.id):  # ids follow call order
        if n.parent != n.id:  # the process node is its own parent
            children.setdefault(n.parent, []).append(n)
    host = {c: model.host_s.get(c, 0.0) for c in ("python", "nested", "autograd", "launch")}
    kernels: dict[str, float] = {}
    calls: Counter = Counter()
    clock = {"host": 0.0, "device": 0.0}
    busy = {"host": 0.0}

    def spend_host(seconds: float) -> None:
        clock["host"] += seconds
        busy["host"] += seconds

    def own_host_s(node: ETNode) -> float:
        """Host time of a call and its subtree as its microbenchmark (a call from Python) paid it."""
        below = [node]
        n_nested, n_launch = -1, 0
        while below:
            x = below.pop()
            n_nested += 1
            n_launch += launches(x, x.id in children)
            below += children.get(x.id, [])
        return host["python"] + n_nested * host["nested"] + n_launch * host["launch"]

    def visit(node: ETNode, priced_above: bool, host_priced: bool) -> bool:
        """Prices the node and its subtree; True when a call in it waited for the device.
        `host_priced`: an ancestor's measured issue time covers this node's host costs."""
        parent = by_id.get(node.parent)
        cat = host_category(node.name, parent.name if parent else ROOT_NODE)
        f = features(node) if not priced_above and node.name != ROOT_NODE else None
        composite = f is not None and f.family == "memory" and node.id in children and not model.has_model(node.name)
        priced = f is not None and f.family != "free" and not composite
        issue_s = model.issue_s(node.name) if gpu and priced and not host_priced else None
        if issue_s is not None:
            spend_host(max(issue_s + (host["nested"] - host["python"] if cat != "python" else 0.0), 0.0))
        for c in (cat, "launch" if node.name != ROOT_NODE and launches(node, node.id in children) else None):
            if c:
                calls[c] += 1
                if issue_s is None and not host_priced:
                    spend_host(host[c])
        whole, kernel_s, family = priced_above, 0.0, ""
        if priced and f is not None:
            index = index_stats(node, f) if index_stats and f.family.startswith("embedding_bag") else None
            measured_s = model.measured_s(node, f, index)
            kernel_s, family = (measured_s, f.family) if gpu else (max(measured_s - own_host_s(node), 0.0), f.family)
            kernels[family] = kernels.get(family, 0.0) + kernel_s
            whole = f.family != "gemm"
        synced = node.name in SYNC_OPS and any(d.startswith("cuda") for d in node.input_devices)
        for child in children.get(node.id, []):
            synced |= visit(child, whole, host_priced or issue_s is not None)
        if family:
            clock["device"] = max(clock["device"], clock["host"]) + kernel_s
        if synced:
            clock["host"] = max(clock["host"], clock["device"])
        return synced

    for root in roots(et):
        visit(root, False, False)
    return IterationPrediction(busy["host"], kernels, calls, max(clock.values()) if gpu else None)


def roots(et: ExecutionTrace) -> list[ETNode]:
    """The trace's top nodes (whose parent is not in it, or itself), in call order."""
    ids = {n.id for n in et.nodes}
    return sorted((n for n in et.nodes if n.parent not in ids or n.parent == n.id), key=lambda n: n.id)
