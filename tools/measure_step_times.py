"""Measure per-iteration wall times of a small training loop on this machine (real variability data).

    python tools/measure_step_times.py --ranks 1 --runs 10 --iterations 300 --out data/measured/cpu_mlp_1rank.csv
    python tools/measure_step_times.py --ranks 2 --runs 10 --iterations 300 --out data/measured/cpu_mlp_2rank.csv
    python tools/measure_step_times.py --ranks 1 --runs 10 --iterations 300 --trace-steps 30 \
        --out data/measured/cpu_mlp_1rank_traced.csv        # first a profiled run: OUT stem + .rankR.trace.json.gz

Model: a 4-layer MLP (1024 wide, batch 64) with SGD; with 2 ranks, DistributedDataParallel over gloo
on 127.0.0.1 (a real all-reduce each step). Each run is a fresh process set; the first 20 iterations
are warm-up and not written. One row per (run, rank, iteration): seconds from just before the
forward pass to just after the optimizer step, timed with time.perf_counter_ns. The header records
the machine, torch version and command. Needs torch (the optional extra).
With --trace-steps N, one more process set runs first: after the same warm-up it records N steps
under torch.profiler (CPU activities, one Kineto trace per rank) and times nothing. The trace is
what `itercast variability --trace` fits; the timed runs right after are what it must forecast
(validation/variability_model.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

WARMUP = 20


def worker(rank: int, world: int, port: int, iterations: int, out: str, trace_steps: int = 0) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(rank)
    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 1024), torch.randn(64, 1024)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    times = []
    for _ in range(WARMUP + (0 if trace_steps else iterations)):
        t0 = time.perf_counter_ns()
        step()
        times.append((time.perf_counter_ns() - t0) * 1e-9)
    if trace_steps:
        plan = schedule(wait=0, warmup=1, active=trace_steps)
        # exported when the active cycle ends (the profiler clears its events after it)
        with profile(
            activities=[ProfilerActivity.CPU], schedule=plan, on_trace_ready=lambda p: p.export_chrome_trace(out)
        ) as prof:
            for _ in range(trace_steps + 1):
                step()
                prof.step()
    if world > 1:
        dist.destroy_process_group()
    if not trace_steps:
        Path(out).write_text("\n".join(f"{t:.9f}" for t in times[WARMUP:]) + "\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(args: argparse.Namespace, outs: list[str], trace_steps: int) -> None:
    """One process per rank (a fresh process set), each writing its `outs[rank]`."""
    port = free_port()
    worker_args = [
        [str(r), str(args.ranks), str(port), str(args.iterations), outs[r], str(trace_steps)] for r in range(args.ranks)
    ]
    procs = [subprocess.Popen([sys.executable, __file__, "--out", args.out, "--worker", *a]) for a in worker_args]
    for p in procs:
        if p.wait(timeout=1800) != 0:
            sys.exit("a worker failed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--out", required=True)
    ap.add_argument("--trace-steps", type=int, default=0, help="first record this many profiled steps per rank")
    ap.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        rank, world, port, iterations, out, trace_steps = args.worker
        worker(int(rank), int(world), int(port), int(iterations), out, int(trace_steps))
        return
    import torch

    if args.trace_steps:
        stem = str(Path(args.out).with_suffix(""))
        traces = [f"{stem}.rank{r}.trace.json.gz" for r in range(args.ranks)]
        run_workers(args, traces, args.trace_steps)
        print(f"wrote {', '.join(traces)}")

    rows = []
    tmp = Path(args.out).with_suffix(".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    for run in range(args.runs):
        files = [tmp / f"run{run}_rank{r}.txt" for r in range(args.ranks)]
        run_workers(args, [str(f) for f in files], 0)
        for r, f in enumerate(files):
            rows += [f"{run},{r},{i},{t}" for i, t in enumerate(f.read_text().split())]
            f.unlink()
    tmp.rmdir()
    header = [
        f"# machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, {platform.processor() or 'cpu'}",
        f"# python {platform.python_version()}, torch {torch.__version__}, threads per rank 1",
        f"# command: python tools/measure_step_times.py --ranks {args.ranks} --runs {args.runs} "
        f"--iterations {args.iterations}"
        + (f" --trace-steps {args.trace_steps}" if args.trace_steps else "")
        + f" --out {args.out}",
        "# model: 4×Linear(1024,1024)+ReLU, batch 64, SGD; 2 ranks: DDP over gloo on 127.0.0.1",
        "run,rank,iteration,step_s",
    ]
    Path(args.out).write_text("\n".join(header + rows) + "\n")
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
