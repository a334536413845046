"""Measure per-iteration wall times of a small training loop on this machine (real variability data).

    python tools/measure_step_times.py --ranks 1 --runs 10 --iterations 300 --out data/measured/cpu_mlp_1rank.csv
    python tools/measure_step_times.py --ranks 2 --runs 10 --iterations 300 --out data/measured/cpu_mlp_2rank.csv

Model: a 4-layer MLP (1024 wide, batch 64) with SGD; with 2 ranks, DistributedDataParallel over gloo
on 127.0.0.1 (a real all-reduce each step). Each run is a fresh process set; the first 20 iterations
are warm-up and not written. One row per (run, rank, iteration): seconds from just before the
forward pass to just after the optimizer step, timed with time.perf_counter_ns. The header records
the machine, torch version and command. Needs torch (the optional extra).
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


def worker(rank: int, world: int, port: int, iterations: int, out: str) -> None:
    import torch
    import torch.distributed as dist

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
    times = []
    for _ in range(WARMUP + iterations):
        t0 = time.perf_counter_ns()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        times.append((time.perf_counter_ns() - t0) * 1e-9)
    if world > 1:
        dist.destroy_process_group()
    Path(out).write_text("\n".join(f"{t:.9f}" for t in times[WARMUP:]) + "\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--out", required=True)
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        rank, world, port, iterations, out = args.worker
        worker(int(rank), int(world), int(port), int(iterations), out)
        return
    import torch

    rows = []
    tmp = Path(args.out).with_suffix(".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    for run in range(args.runs):
        port = free_port()
        files = [tmp / f"run{run}_rank{r}.txt" for r in range(args.ranks)]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--out",
                    args.out,
                    "--worker",
                    str(r),
                    str(args.ranks),
                    str(port),
                    str(args.iterations),
                    str(files[r]),
                ]
            )
            for r in range(args.ranks)
        ]
        for p in procs:
            if p.wait(timeout=1800) != 0:
                sys.exit(f"run {run}: a worker failed")
        for r, f in enumerate(files):
            rows += [f"{run},{r},{i},{t}" for i, t in enumerate(f.read_text().split())]
            f.unlink()
    tmp.rmdir()
    header = [
        f"# machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, {platform.processor() or 'cpu'}",
        f"# python {platform.python_version()}, torch {torch.__version__}, threads per rank 1",
        f"# command: python tools/measure_step_times.py --ranks {args.ranks} --runs {args.runs} "
        f"--iterations {args.iterations} --out {args.out}",
        "# model: 4×Linear(1024,1024)+ReLU, batch 64, SGD; 2 ranks: DDP over gloo on 127.0.0.1",
        "run,rank,iteration,step_s",
    ]
    Path(args.out).write_text("\n".join(header + rows) + "\n")
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
