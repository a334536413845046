"""Pipeline stages merged or split on a trace (`replay --pp-stages N`; DESIGN.md §3, §7; issue 30 item 3).

From the traces of every stage of a pipeline run (p ranks, rank = stage; a CPU run over gloo: the
stage's compute is on the thread that sends and receives, pipeline_stages.py), the step of the same
model and micro-batches on N stages:

- merge (N < p, N divides p): stages s = j·p/N … (j+1)·p/N − 1 join on new stage j; its forward
  and backward work per micro-batch and its other work are the sums of theirs (their compute
  serialised on one rank), the sends between them are removed;
- split (N > p, p divides N): stage s's forward and backward work per micro-batch and its other work
  divided evenly into N/p parts (its layers assumed alike), with a send between the parts of the
  size of the stage's activation (forward) and of its gradient (backward: the same size);
- the schedule kept: each stage runs w_s forwards, then alternates a backward and a forward, then
  the remaining backwards (the trace's order is checked against that rule). GPipe (Huang et al.
  2019, Fig. 2c) has w_s = M on every stage; 1F1B (Narayanan et al. 2021, PipeDream-Flush) has
  w_s = min(M, p − s); the new stages keep the rule: w'_j = M, or min(M, N − j + c) where the
  trace shows w_s = p − s + c;
- sends re-timed, kept and new alike, by the point-to-point model of the trace's system
  (AnalyticCostModel.p2p_s; cpu-host for a gloo trace; a calibration's p2p curves replace the
  built-in ones), across nodes where the two ranks' nodes differ (rank r on node r // GPUs per
  node). A transfer starts when the sender has finished its unit and the receiver waits for it:
  gloo sends only once the peer has posted its receive (facebookincubator/gloo
  gloo/transport/tcp/pair.cc: a send waits for the peer's NOTIFY_RECV_READY); the stage's other
  work after its last unit (the optimizer) waits for its sends, as `work.wait()` does.

Each measured step is re-staged from the stages' work in that step; steps follow one another on
each stage. With the host's cores given (`--host-cores`), the stages' measured work is read as
the work done alone (their sharing of the cores divided out) and the new stages share them in
the simulation (sim/sharing.py): at 4 stages on 2 cores each stage's work runs slower than at 2.
Not modelled: memory, and what else the new stage count changes in the work itself.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from itercast.config.job import load_system
from itercast.costs.analytic import AnalyticCostModel
from itercast.errors import ConfigError
from itercast.graph.execgraph import Category, GraphBuilder
from itercast.sim.sharing import shared_work_s
from itercast.traces.kineto import RankTrace
from itercast.traces.parallel_whatifs import CPU_SYSTEM, check_pipeline_stages
from itercast.traces.pipeline_stages import BACKWARD, FORWARD, AloneUs, StageStep, stage_steps, work_stretches_us
from itercast.traces.replay_graph import ReplayGraph, StepMark


def schedule_order(warmup: int, micro_batches: int) -> list[tuple[str, int]]:
    """`warmup` forwards, then a backward and a forward in turn, then the remaining backwards."""
    order = [(FORWARD, k) for k in range(warmup)]
    for k in range(micro_batches):
        order.append((BACKWARD, k))
        if warmup + k < micro_batches:
            order.append((FORWARD, warmup + k))
    return order


def new_warmups(stages: list[StageStep], new_stages: int) -> tuple[list[int], str]:
    """The warm-up forwards of each new stage, and the schedule's name (module docstring)."""
    m, p = stages[0].micro_batches, len(stages)
    warm = []
    for s, st in enumerate(stages):
        w = next((i for i, (d, _) in enumerate(st.order) if d == BACKWARD), m)
        if list(st.order) != schedule_order(w, m):
            raise ConfigError(
                f"--pp-stages: stage {s} ran {' '.join(f'{d}{k}' for d, k in st.order)}: not a schedule of w "
                "forwards, then backward and forward in turn (GPipe, 1F1B)"
            )
        warm.append(w)
    if all(w == m for w in warm):
        return [m] * new_stages, "GPipe"
    offsets = {w - (p - s) for s, w in enumerate(warm) if w < m}
    if len(offsets) != 1:
        raise ConfigError(f"--pp-stages: warm-up forwards per stage {warm}: neither GPipe (all {m}) nor p − s + c")
    c = offsets.pop()
    return [min(m, max(1, new_stages - j + c)) for j in range(new_stages)], "1F1B" if c == 0 else f"1F1B{c:+d}"


def restage_steps(stages: list[StageStep], new_stages: int) -> tuple[list[StageStep], list[float]]:
    """One measured step's stages as `new_stages` stages (merge or split, module docstring), and the
    activation bytes sent from each new stage to the next."""
    p = len(stages)
    if new_stages < p:
        g = p // new_stages
        out = []
        for j in range(new_stages):
            group = stages[j * g : (j + 1) * g]
            out.append(
                StageStep(
                    j,
                    stages[0].step,
                    np.sum([st.forward_s for st in group], axis=0),
                    np.sum([st.backward_s for st in group], axis=0),
                    float(sum(st.rest_s for st in group)),
                    (),
                    group[-1].activation_bytes,
                )
            )
        return out, [float(out[j].activation_bytes or 0.0) for j in range(new_stages - 1)]
    r = new_stages // p
    out = [
        StageStep(s * r + i, st.step, st.forward_s / r, st.backward_s / r, st.rest_s / r, (), st.activation_bytes)
        for s, st in enumerate(stages)
        for i in range(r)
    ]
    return out, [float(out[j].activation_bytes or 0.0) for j in range(new_stages - 1)]


def restage(
    rg: ReplayGraph,
    traces: list[RankTrace],
    new_stages: int,
    curves: dict[str, Any] | None = None,
    host_cores: int | None = None,
) -> tuple[ReplayGraph, Counter]:
    """The step graph of the traces' pipeline on `new_stages` stages (module docstring), one rank a
    stage, with a StepMark per stage and measured step (measured_s NaN: not measured), and counts of
    what changed. `rg`: the traces' replay graph (it holds their pipeline sends, or the run had none).
    `host_cores`: the stages' work is read as done alone, their measured sharing of that many cores
    divided out (sim/sharing.py; the new graph's simulation applies the new stages' sharing)."""
    check_pipeline_stages(rg, traces, new_stages)
    _refuse(traces, new_stages)
    p = len(traces)
    ranks = [t.rank if t.rank is not None else i for i, t in enumerate(traces)]
    alone_us = _alone_us(traces, host_cores) if host_cores is not None else None
    per_rank = [{st.step: st for st in stage_steps(t, rank, alone_us)} for rank, t in zip(ranks, traces, strict=True)]
    numbers = sorted(set.intersection(*(set(steps) for steps in per_rank)))
    if not numbers:
        raise ConfigError("--pp-stages: the traces share no ProfilerStep number: profile the stages' steps together")
    first = [per_rank[s][numbers[0]] for s in range(p)]
    if len({st.micro_batches for st in first}) != 1:
        raise ConfigError(f"--pp-stages: micro-batches per stage differ: {[st.micro_batches for st in first]}")
    warmups, schedule = new_warmups(first, new_stages)
    model = AnalyticCostModel(load_system(CPU_SYSTEM), "bf16", curves)
    per_node = model.system.node.gpus_per_node
    b = GraphBuilder()
    steps: list[StepMark] = []
    last: list[int] = [-1] * new_stages  # the last task of each new stage
    for number in numbers:
        stages, nbytes = restage_steps([per_rank[s][number] for s in range(p)], new_stages)
        hop_s = [model.p2p_s(n, (j + 1) % per_node == 0, 1) for j, n in enumerate(nbytes)]  # stage j on rank j
        marks = [
            b.task("step", b.resource(j, "stage"), 0.0, Category.HOST, "step", [x for x in (last[j],) if x >= 0])
            for j in range(new_stages)
        ]
        last = _schedule(b, stages, warmups, hop_s, marks)
        steps += [StepMark(j, number, float("nan"), marks[j], False, last[j], True) for j in range(new_stages)]
    for k, m in enumerate(steps[:-new_stages]):  # a step ends where the stage's next one starts
        steps[k] = StepMark(m.rank, m.step, m.measured_s, m.start_task, False, steps[k + new_stages].start_task, False)
    counts: Counter = Counter()
    how = "merged" if new_stages < p else "split" if new_stages > p else "kept"
    counts[
        f"pipeline stages {p} -> {new_stages} ({how}); schedule {schedule}, {first[0].micro_batches} micro-batches"
    ] = 1
    counts[f"sends per step re-timed on {CPU_SYSTEM}'s point-to-point model"] = (
        2 * (new_stages - 1) * first[0].micro_batches
    )
    return ReplayGraph(b.build(), steps, {}, {}, Counter()), counts


def _alone_us(traces: list[RankTrace], cores: int) -> AloneUs:
    """The work done alone in a stretch of measured time, the stages' work stretches sharing `cores`
    (every stage one process on the host: weight 1)."""
    stretches = [work_stretches_us(t) for t in traces]
    starts, ends = np.concatenate([s_ for s_, _ in stretches]), np.concatenate([e for _, e in stretches])
    weight = np.ones(starts.shape[0])
    return lambda from_us, to_us: shared_work_s(starts, ends, weight, cores, from_us, to_us)


def _refuse(traces: list[RankTrace], new_stages: int) -> None:
    """One ConfigError where the traces are not every stage of a CPU pipeline run, or `new_stages`
    neither divides nor is a multiple of their stage count."""
    p = len(traces)
    ranks = [t.rank if t.rank is not None else i for i, t in enumerate(traces)]
    world = next((t.world_size for t in traces if t.world_size is not None), p)
    if ranks != list(range(world)):
        raise ConfigError(
            f"--pp-stages: expected the trace of every stage of a pipeline-only run (ranks 0..{world - 1}); "
            f"got ranks {ranks}"
        )
    if gpu := next((t for t in traces if t.num_ops), None):
        raise ConfigError(
            f"--pp-stages: {gpu.path} runs {gpu.num_ops} GPU ops: re-staging reads each stage's work from the "
            "thread that sends and receives (a CPU run over gloo); GPU traces are not supported yet"
        )
    if new_stages != p and (new_stages % p if new_stages > p else p % new_stages):
        raise ConfigError(
            f"--pp-stages: {p} stages merge or split evenly: expected a divisor or multiple of {p}; got {new_stages}"
        )


def _schedule(
    b: GraphBuilder, stages: list[StageStep], warmups: list[int], hop_s: list[float], marks: list[int]
) -> list[int]:
    """One step's units on each stage in its schedule order, the transfers between stages (each
    after the sender's unit and the receiver's previous task), the other work after the stage's
    last unit and its sends. Returns each stage's last task."""
    n, m = len(stages), stages[0].micro_batches
    orders = [schedule_order(w, m) for w in warmups]
    done: dict[tuple[int, str, int], int] = {}
    sent: list[list[int]] = [[] for _ in range(n)]
    prev, pos = list(marks), [0] * n
    while any(pos[j] < len(orders[j]) for j in range(n)):
        progressed = False
        for j in range(n):
            if pos[j] == len(orders[j]):
                continue
            d, k = orders[j][pos[j]]
            src = j - 1 if d == FORWARD else j + 1
            deps = [prev[j]]
            if 0 <= src < n:
                if (src, d, k) not in done:
                    continue
                hop = min(j, src)
                link = b.resource(j, f"p2p from {src}")
                transfer = b.task(
                    f"send {d}{k}", link, hop_s[hop], Category.COMMUNICATION, "p2p", [done[(src, d, k)], prev[j]]
                )
                sent[src].append(transfer)
                deps = [transfer]
            work = stages[j].forward_s[k] if d == FORWARD else stages[j].backward_s[k]
            done[(j, d, k)] = prev[j] = b.task(
                f"{d}{k}", b.resource(j, "stage"), float(work), Category.COMPUTE, "compute", deps
            )
            pos[j] += 1
            progressed = True
        if not progressed:
            raise ConfigError("--pp-stages: the new stages' schedule deadlocks (each stage waits for another)")
    return [
        b.task("other work", b.resource(j, "stage"), stages[j].rest_s, Category.COMPUTE, "compute", [prev[j], *sent[j]])
        for j in range(n)
    ]
