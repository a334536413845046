"""Events per second for trace import and replay: the largest shared trace and a synthetic 1M-event one.

    python benchmarks/trace_speed.py

"Replay" is building, compiling (topological order) and simulating the graph; "simulate" alone is
the max-plus pass on a compiled graph (what a what-if re-runs). Target (issue #3): ≥ 1M events/s
for replay. The one-time load of numba's compiled kernels is reported separately.
"""

from __future__ import annotations

import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.data_paths import shared_data_dir
from itercast.sim.engine import compile_graph, simulate
from itercast.traces.kineto import read_kineto
from itercast.traces.replay_graph import build_replay_graph


def synthetic(path: Path, launches: int = 500_000) -> int:
    """A host thread launching kernels on two streams (1M events), 1000 launches per step."""
    with gzip.open(path, "wt") as fh:
        fh.write('{"schemaVersion": 1, "traceEvents": [')
        ts = 0.0
        for i in range(launches):
            if i % 1000 == 0:
                fh.write(
                    json.dumps(
                        {
                            "ph": "X",
                            "cat": "user_annotation",
                            "name": f"ProfilerStep#{i // 1000}",
                            "pid": 1,
                            "tid": 1,
                            "ts": ts,
                            "dur": 1000 * 7.0,
                        }
                    )
                    + ","
                )
            fh.write(
                json.dumps(
                    {
                        "ph": "X",
                        "cat": "cuda_runtime",
                        "name": "cudaLaunchKernel",
                        "pid": 1,
                        "tid": 1,
                        "ts": ts + 1,
                        "dur": 4,
                        "args": {"correlation": i},
                    }
                )
                + ","
            )
            fh.write(
                json.dumps(
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": "gemm",
                        "pid": 0,
                        "tid": 7 + i % 2,
                        "ts": ts + 8,
                        "dur": 5,
                        "args": {"correlation": i, "stream": 7 + i % 2},
                    }
                )
            )
            fh.write("," if i + 1 < launches else "")
            ts += 7.0
        fh.write("]}")
    return 2 * launches + launches // 1000


def warm_up() -> None:
    """Load the compiled simulator kernels once (numba's cache), so the figures below are per-trace costs."""
    from itercast.graph.execgraph import Category, GraphBuilder

    b = GraphBuilder()
    b.task("x", b.resource(0, "compute"), 1.0, Category.COMPUTE, "gemm")
    t0 = time.perf_counter()
    simulate(b.build())
    print(f"one-time load of the compiled kernels: {time.perf_counter() - t0:.2f} s (numba; 0 without it)")


def measure(label: str, path: Path) -> None:
    t0 = time.perf_counter()
    trace = read_kineto(path)
    t1 = time.perf_counter()
    rg = build_replay_graph([trace])
    compile_graph(rg.graph)
    t2 = time.perf_counter()
    simulate(rg.graph)
    t3 = time.perf_counter()
    n = trace.num_events
    print(
        f"{label}: {n:,} events, {rg.graph.num_tasks:,} tasks | import {n / (t1 - t0):,.0f} events/s | "
        f"build {n / (t2 - t1):,.0f} events/s | simulate {n / (t3 - t2):,.0f} events/s | "
        f"replay (build + simulate) {n / (t3 - t1):,.0f} events/s"
    )


def main() -> None:
    warm_up()
    data = shared_data_dir()
    if data is not None:
        measure("hta_v100_ws2_rank1 (largest shared trace)", data / "traces" / "hta_v100_ws2_rank1_allreduce.json.gz")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "synthetic.json.gz"
        synthetic(path)
        measure("synthetic 1M events", path)


if __name__ == "__main__":
    main()
