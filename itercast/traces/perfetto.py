"""Export a simulated step as Chrome/Perfetto trace JSON (opens in ui.perfetto.dev).

pid = rank, tid = resource (stream), complete events ('X') in µs, 'M' metadata naming processes
and threads, and flow events ('s'/'f') for dependencies that cross resources (launches, p2p, waits) and
between the members of each collective (rendezvous).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from itercast.sim.engine import SimResult, compile_graph
from itercast.user_files import write_output

CATEGORY_NAMES = ("compute", "communication", "host")


def to_chrome_trace(sim: SimResult, max_flows: int = 20_000) -> dict[str, Any]:
    g = sim.graph
    events: list[dict[str, Any]] = []
    for r in sorted(set(g.resource_rank.tolist())):
        events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}})
    for res, (rank, kind) in enumerate(zip(g.resource_rank.tolist(), g.resource_kind.tolist(), strict=False)):
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": res, "args": {"name": g.kinds[kind]}})
    ranks, start, end = g.resource_rank[g.resource], sim.start_s * 1e6, sim.end_s * 1e6
    for t in range(g.num_tasks):
        events.append(
            {
                "ph": "X",
                "name": g.names[g.name[t]],
                "cat": CATEGORY_NAMES[g.category[t]],
                "pid": int(ranks[t]),
                "tid": int(g.resource[t]),
                "ts": float(start[t]),
                "dur": float(end[t] - start[t]),
                "args": {"family": g.families[g.family[t]]},
            }
        )
    compiled = compile_graph(g)
    members: dict[int, list[int]] = {}
    for t, c in enumerate(g.collective.tolist()):
        if c >= 0:
            members.setdefault(c, []).append(t)
    links = (
        itertools.chain(  # (name, category, from, at µs, to, at µs), lazily, rendezvous first: only max_flows are kept
            (
                ("rendezvous", "collective", a, float(start[a]), b, float(start[b]))  # members of a collective, chained
                for group in members.values()
                for a, b in itertools.pairwise(group)
            ),
            (
                ("dep", "dependency", s, float(end[s]), t, float(start[t]))
                for t in range(g.num_tasks)
                for s, _ in compiled.predecessors(t)
                if g.resource[s] != g.resource[t]
            ),
        )
    )
    for flow_id, (name, cat, a, ts_a, b, ts_b) in enumerate(itertools.islice(links, max_flows)):
        common = {"name": name, "cat": cat, "id": flow_id}
        events.append({**common, "ph": "s", "pid": int(ranks[a]), "tid": int(g.resource[a]), "ts": ts_a})
        events.append({**common, "ph": "f", "bp": "e", "pid": int(ranks[b]), "tid": int(g.resource[b]), "ts": ts_b})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "itercast", "step_time_s": sim.step_time_s},
    }


def write_chrome_trace(sim: SimResult, path: str | Path, inputs: Iterable[str | Path | None] = ()) -> Path:
    """The timeline as Chrome/Perfetto JSON (user_files.write_output: atomic, never onto an input)."""
    return write_output(path, json.dumps(to_chrome_trace(sim)), inputs)
