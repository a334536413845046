"""What the gloo measurement scripts share (tools/measure_gloo_parallelism.py, measure_gloo_pipeline.py):
one process per rank on this host, a profiled stretch of steps written as a gzipped Kineto trace, then
timed unprofiled steps, collected as CSV rows."""

from __future__ import annotations

import argparse
import gzip
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def free_port() -> int:
    """A TCP port free on 127.0.0.1 for the process group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def trace_and_time(
    step: Callable[[], None], raw: Path, traced: int, timed: int, between: Callable[[], None] | None = None
) -> list[float]:
    """`traced` profiled steps (after one profiler warm-up step) exported to `raw`.gz as a Kineto
    trace with shapes, `between()` (a barrier, say), then `timed` unprofiled steps; their seconds."""
    from torch.profiler import ProfilerActivity, profile, schedule

    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        schedule=schedule(wait=0, warmup=1, active=traced),
        on_trace_ready=lambda p: p.export_chrome_trace(str(raw)),
    ) as prof:
        for _ in range(traced + 1):
            step()
            prof.step()
    with raw.open("rb") as src, gzip.open(f"{raw}.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    if between is not None:
        between()
    times_s = []
    for _ in range(timed):
        t0 = time.perf_counter_ns()
        step()
        times_s.append((time.perf_counter_ns() - t0) * 1e-9)
    return times_s


def run_ranks(script: str, size: int, out_dir: Path, prefix: str, timeout_s: int) -> list[str]:
    """Run `script --out out_dir --worker RANK SIZE PORT` once per rank; each writes its timed steps
    to out_dir/{prefix}{size}.rank{RANK}.steps.txt. Returns CSV rows size,rank,step,step_s."""
    port = free_port()
    procs = [
        subprocess.Popen([sys.executable, script, "--out", str(out_dir), "--worker", str(r), str(size), str(port)])
        for r in range(size)
    ]
    for p in procs:
        if p.wait(timeout=timeout_s) != 0:
            sys.exit(f"a worker of {prefix}{size} failed")
    rows = []
    for r in range(size):
        f = out_dir / f"{prefix}{size}.rank{r}.steps.txt"
        rows += [f"{size},{r},{i},{t}" for i, t in enumerate(f.read_text().split())]
        f.unlink()
    return rows


def measure(
    script: str,
    worker: Callable[[int, int, int, Path], None],
    sizes: tuple[int, ...],
    prefix: str,
    timeout_s: int,
    describe: list[str],
    size_column: str,
) -> None:
    """A measurement script's command line: `--out DIR` runs every size (`run_ranks`, each rank
    calling `worker(rank, size, port, out_dir)`) and writes DIR/steps.csv with a header naming the
    machine, the versions, the command and `describe` (comment lines)."""
    ap = argparse.ArgumentParser(description=(sys.modules["__main__"].__doc__ or "").splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the traces and steps.csv")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    out_dir = Path(args.out)
    if args.worker:
        rank, size, port = map(int, args.worker)
        worker(rank, size, port, out_dir)
        return
    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [row for size in sizes for row in run_ranks(script, size, out_dir, prefix, timeout_s)]
    header = [
        f"# machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, {platform.processor() or 'cpu'}",
        f"# python {platform.python_version()}, torch {torch.__version__}, threads per rank 1",
        f"# command: python tools/{Path(script).name} --out {args.out}",
        *describe,
        f"{size_column},rank,step,step_s",
    ]
    (out_dir / "steps.csv").write_text("\n".join(header + rows) + "\n")
    print(f"wrote {len(rows)} rows and the traces to {out_dir}")
