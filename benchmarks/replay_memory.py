"""Peak memory of trace replay per event: synthetic traces of 0.5M, 1M and 2M events, and the largest
shared trace (216k events with CPU ops, when ../shared/data is present).

    python benchmarks/replay_memory.py

Each size runs in a fresh process: read the trace, build the replay graph, simulate it. Printed: the
process's peak resident memory (ru_maxrss) above what importing itercast and numba's kernels took,
in bytes per event kept. Target (issue #19): ≤ 300 bytes per event.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.trace_speed import synthetic
from itercast.data_paths import shared_data_dir

CHILD = """
import resource, sys
from itercast.graph.execgraph import Category, GraphBuilder
from itercast.sim.engine import simulate
from itercast.replay import replay
b = GraphBuilder(); b.task("x", b.resource(0, "compute"), 1.0, Category.COMPUTE, "gemm"); simulate(b.build())
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
r = replay([sys.argv[1]])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(base * 1024, peak * 1024, sum(t.num_events for t in r.traces), r.sim.graph.num_tasks)
"""


def measure(label: str, path: Path) -> None:
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, check=True, cwd=root
    ).stdout.split()
    base, peak, events, tasks = (int(x) for x in out)
    print(
        f"{label:24} {events:>9,} events, {tasks:>9,} tasks: peak {peak / 2**20:6.0f} MiB, "
        f"{(peak - base) / 2**20:6.0f} MiB above the imports = {(peak - base) / events:4.0f} bytes per event"
    )


def main() -> None:
    data = shared_data_dir()
    if data is not None:
        measure("hta_v100_ws2_rank1", data / "traces" / "hta_v100_ws2_rank1_allreduce.json.gz")
    with tempfile.TemporaryDirectory() as tmp:
        for launches in (250_000, 500_000, 1_000_000):
            path = Path(tmp) / f"synthetic_{launches}.json.gz"
            synthetic(path, launches)
            measure("synthetic", path)


if __name__ == "__main__":
    main()
