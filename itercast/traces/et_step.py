"""One distributed training step on GPUs from the execution traces of its ranks.

Each rank's trace is walked in call order (ids follow it) on three clocks, as in the trace-driven
model of Lin et al. (DLRM performance model, HiPC 2022) and DESIGN.md §3:
- host: every top-level operator (one no other operator encloses) costs T1 before it, T2 before its
  first launch, T4 per launch and T5 between launches, T3 after its last, or its no-call time when
  it launches nothing (traces/host_overheads.py; the names of the operators it measured). The walk
  launches once per priced operator, but an operator makes as many runtime calls as its code does
  (FBGEMM's TBE backward 32-47: launches, memsets, attribute and event queries): where the overheads
  counted the calls of the top-level operator's name (HostOverheads.calls_per_op, measured on other
  traces), its calls cost those calls' time (HostOverheads.calls_us), its walked launches issued
  within it; an operator whose calls were never counted keeps one call per launch walked (counted in
  RankStep.default_calls);
- compute stream: an operator priced by traces/et_pricing.py is launched once (its children are part
  of it) and starts at the later of its launch, the stream's previous work and the collectives whose
  output storage it reads (a wait on their work);
- communication stream (NCCL's own): a c10d collective is ready at the later of its launch, the
  compute stream's work so far (ProcessGroupNCCL makes its stream wait for the caller's) and the
  stream's previous collective; it starts at the rendezvous, when the last member is ready, and lasts
  the collective model's time for the busiest member's bytes (an uneven all-to-all's is the most any
  member sends or receives). Collectives are matched across ranks in order of issue.
An operator that copies a GPU value to the host (SYNC_OPS, a device-to-host copy_) holds the host until
the work it reads is done. The threads' top nodes are walked in id order, which is call order: the
autograd thread's operators (ids after `## backward ##`'s) before the optimizer's, as they ran (the
main thread waits in backward() meanwhile). A rank's clocks start at its start time (0, or a measured
start: a rank's trace cannot show that it began late, e.g. because the previous step's last collective
released it later than its peers) and its iteration ends when its three clocks are done, counted from
its start; the step ends when the slowest rank's does. APPROXIMATIONS: the two threads' host work is
one clock; one compute stream.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from itercast.costs.analytic import AnalyticCostModel
from itercast.costs.dist_ops import COLLECTIVES, CollectiveCall, collective_call
from itercast.costs.host_overheads import LAUNCH
from itercast.hardware.topology import GroupPlacement
from itercast.traces.et_pricing import ETPricer
from itercast.traces.execution_trace import ETNode, ExecutionTrace
from itercast.traces.host_overheads import HostOverheads
from itercast.traces.iteration_model import SYNC_OPS, roots
from itercast.traces.kineto import TraceError

COPY = "cudaMemcpyAsync"
MARKER = "[pytorch|profiler|execution_graph|"  # the ET's process and thread nodes (ExecutionTraceObserver)
#: a collective's pending member: what it moves and when it is ready (s); answered with its start and end (s)
Walk = Generator[tuple[CollectiveCall, float], tuple[float, float], None]


@dataclass
class RankStep:
    """One rank's predicted iteration (s): its host's busy time, the end of its last work, GPU
    seconds per family, calls per pricing model, the operators no model priced (name → calls,
    host seconds, GPU node ids), and the top-level operators that launch but whose runtime calls the
    overheads never counted, charged one call per launch walked (name → operators)."""

    path: str
    host_s: float = 0.0
    iteration_s: float = 0.0
    seconds_by_family: dict[str, float] = field(default_factory=dict)
    calls_by_model: Counter = field(default_factory=Counter)
    unpriced: dict[str, dict[str, Any]] = field(default_factory=dict)
    default_calls: Counter = field(default_factory=Counter)


def is_operator(name: str) -> bool:
    """An operator (dispatched, timed by the host model), as opposed to a user scope (`## forward ##`,
    `Optimizer.step#…`) or the thread root."""
    return ("::" in name and not name.startswith("[pytorch|profiler")) or name.rstrip("0123456789").endswith("Backward")


def predict_step(
    traces: list[ExecutionTrace],
    pricers: list[ETPricer],
    host: HostOverheads,
    group: GroupPlacement,
    starts_s: list[float] | None = None,
) -> list[RankStep]:
    """Every rank's iteration, collectives matched across ranks (module docstring). `pricers`: one a
    rank (each remembers its own TBE forwards); `group`: the placement of the collectives' ranks;
    `starts_s`: each rank's start (s) on a common clock, 0 for all when None."""
    costs = pricers[0].costs
    starts = starts_s if starts_s is not None else [0.0] * len(traces)
    if len(starts) != len(traces):
        raise ValueError(f"starts_s: expected one start per trace ({len(traces)}), got {len(starts)}")
    steps = [RankStep(et.path) for et in traces]
    walks = [_walk(et, p, host, s, t0) for et, p, s, t0 in zip(traces, pricers, steps, starts, strict=True)]
    pending: list[tuple[CollectiveCall, float] | None] = [_advance(w, None) for w in walks]
    issued = 0
    while any(p is not None for p in pending):
        live = [p for p in pending if p is not None]
        kinds = {p[0].kind for p in live}
        if len(live) != len(pending) or len(kinds) != 1:
            found = ", ".join(f"rank {r}: {p[0].kind if p else 'none'}" for r, p in enumerate(pending))
            raise TraceError(f"collective #{issued + 1} does not match across the ranks' traces ({found})")
        start_s = max(p[1] for p in live)
        span = (start_s, start_s + _collective_s(costs, [p[0] for p in live], group))
        pending = [_advance(w, span) for w in walks]
        issued += 1
    return steps


def predict_each_rank(
    traces: list[ExecutionTrace],
    pricers: Callable[[], list[ETPricer]],
    hosts: list[HostOverheads],
    group: GroupPlacement,
    starts_s: list[float] | None = None,
) -> list[RankStep]:
    """Rank r's step from a prediction of every rank under `hosts[r]` (predict_step; one prediction per
    distinct model, `pricers` making fresh ones for each): with hosts[r] measured without rank r (leave
    one rank out), rank r's own trace reaches its figure neither directly nor through a peer's
    rendezvous."""
    if len(hosts) != len(traces):
        raise ValueError(f"hosts: expected one model per trace ({len(traces)}), got {len(hosts)}")
    runs: dict[int, list[RankStep]] = {}
    for h in hosts:
        if id(h) not in runs:
            runs[id(h)] = predict_step(traces, pricers(), h, group, starts_s)
    return [runs[id(h)][r] for r, h in enumerate(hosts)]


def _collective_s(costs: AnalyticCostModel, members: list[CollectiveCall], group: GroupPlacement) -> float:
    kind = members[0].kind
    return costs.collective_s(kind, max(m.member_bytes for m in members), group)


def _advance(walk: Walk, answer: tuple[float, float] | None) -> tuple[CollectiveCall, float] | None:
    try:
        return walk.send(answer) if answer is not None else next(walk)
    except StopIteration:
        return None


def _walk(et: ExecutionTrace, pricer: ETPricer, host: HostOverheads, out: RankStep, start_s: float) -> Walk:
    """One rank's clocks through its trace from `start_s`, pausing at each collective for its rendezvous."""
    children: dict[int, list[ETNode]] = {}
    for n in sorted(et.nodes, key=lambda n: n.id):
        if n.parent != n.id:
            children.setdefault(n.parent, []).append(n)
    t4 = {LAUNCH: host.t4_us.get(LAUNCH, 0.0) * 1e-6, COPY: host.t4_us.get(COPY, host.t4_us.get(LAUNCH, 0.0)) * 1e-6}
    clock = {"host": start_s, "compute": start_s, "comm": start_s}
    ready_of: dict[int, float] = {}  # storage id → end of the collective that writes it
    top: dict[str, Any] = {}

    def spend(seconds: float) -> None:
        clock["host"] += seconds
        out.host_s += seconds

    def launch(call: str) -> float:
        cost_s = t4[call]
        if top:
            cost_s += host.op_us("t5_us" if top["launches"] else "t2_us", top["name"]) * 1e-6
            top["launches"] += 1
            if top["calls_s"] is not None:  # the launch is one of the operator's counted calls
                cost_s = min(cost_s, top["calls_s"])
                top["calls_s"] -= cost_s
        spend(cost_s)
        return clock["host"]

    def inputs_ready(node: ETNode) -> float:
        return max((ready_of.get(s, 0.0) for s in node.input_storages), default=0.0)

    def visit(node: ETNode, covered: bool) -> Walk:
        is_top = is_operator(node.name) and not top
        if is_top:
            counted_us = host.calls_us(node.name)
            top.update(name=node.name, launches=0, calls_s=None if counted_us is None else counted_us * 1e-6)
            spend(host.t1_us * 1e-6)
        before = clock["host"]
        kids = children.get(node.id, [])
        whole = covered
        if not covered and node.name in COLLECTIVES:
            call = collective_call(node.name, node.input_shapes, node.input_types, list(node.input_lists))
            issued = launch(LAUNCH)
            ready = max(issued, clock["compute"], clock["comm"], inputs_ready(node))
            start, end = yield call, ready
            clock["comm"] = end
            ready_of.update(dict.fromkeys(node.input_storages, end))
            family = f"collective:{call.kind}"
            out.seconds_by_family[family] = out.seconds_by_family.get(family, 0.0) + end - start
            out.calls_by_model[f"collective:{call.kind}"] += 1
            whole = True
        elif not covered:
            priced = pricer.price(node, bool(kids))
            if priced is not None:
                copy = node.name == "aten::copy_" and len(set(node.input_devices)) > 1
                issued = launch(COPY if copy else LAUNCH)
                start = max(issued, clock["compute"], inputs_ready(node))
                clock["compute"] = start + priced.seconds
                fam = out.seconds_by_family
                fam[priced.family] = fam.get(priced.family, 0.0) + priced.seconds
                out.calls_by_model[priced.model] += 1
                whole = priced.whole
            elif _unpriced(node, bool(kids)) or _own_kernel_unpriced(node, kids):
                launch(LAUNCH)
                entry = out.unpriced.setdefault(node.name, {"calls": 0, "cpu_s": 0.0, "node_ids": []})
                entry["calls"] += 1
                entry["node_ids"].append(node.id)
        if _syncs(node):
            clock["compute"] = max(clock["compute"], inputs_ready(node))
            clock["host"] = max(clock["host"], clock["compute"])
        for child in kids:
            yield from visit(child, whole)
        if is_top:
            name = node.name
            if top["launches"] and top["calls_s"] is None:
                out.default_calls[name] += 1
            elif top["launches"]:
                spend(top["calls_s"])  # its counted calls beyond those walked
            spend(host.op_us("t3_us" if top["launches"] else "no_call_us", name) * 1e-6)
            top.clear()
        if node.name in out.unpriced and node.id in out.unpriced[node.name]["node_ids"]:
            out.unpriced[node.name]["cpu_s"] += clock["host"] - before

    for node in thread_tops(et, children):
        yield from visit(node, False)
    out.iteration_s = max(clock.values()) - start_s


def thread_tops(et: ExecutionTrace, children: dict[int, list[ETNode]]) -> list[ETNode]:
    """The nodes under the trace's process and thread markers (`[pytorch|profiler|execution_graph|…]`),
    every thread's merged in id order: the order in which they were called."""
    out: list[ETNode] = []
    stack, seen = list(roots(et)), set()
    while stack:
        node = stack.pop()
        if node.id in seen:  # a parent cycle in a malformed trace
            continue
        seen.add(node.id)
        if node.name.startswith(MARKER):
            stack.extend(children.get(node.id, []))
        else:
            out.append(node)
    return sorted(out, key=lambda n: n.id)


def _unpriced(node: ETNode, has_children: bool) -> bool:
    """An operator outside aten and c10d with GPU tensors that no model prices (its children, if
    any, are not operators that would be priced on their own)."""
    name = node.name
    return (
        "::" in name
        and not name.startswith(("aten::", "c10d::", "autograd::", "torch::autograd::"))
        and not has_children
        and any(d.startswith("cuda") for d in node.input_devices)
    )


#: memory-bound aten operators that launch a kernel of their own beside what their children do (their children
#: copy or convert the indices or input, or allocate the output): left unpriced by the rule that a composite's
#: children do its work (ETPricer.price), so reported (a helper's audit of the PARAM DLRM ET found these)
OWN_KERNEL_OPS = {"aten::index", "aten::_index_put_impl_", "aten::sum", "aten::mean", "aten::arange"}


def _own_kernel_unpriced(node: ETNode, kids: list[ETNode]) -> bool:
    """One of OWN_KERNEL_OPS with children, none of its own name (that one would run the kernel)."""
    return node.name in OWN_KERNEL_OPS and bool(kids) and all(k.name != node.name for k in kids)


def _syncs(node: ETNode) -> bool:
    """A call that copies GPU data to the host: .item() of a GPU tensor, a copy_ into a host tensor."""
    cuda = [d.startswith("cuda") for d in node.input_devices]
    if node.name in SYNC_OPS:
        return any(cuda)
    return node.name == "aten::copy_" and len(cuda) >= 2 and not cuda[0] and cuda[1]
