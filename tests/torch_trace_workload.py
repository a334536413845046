"""Train a tiny MLP for a few steps under torch.profiler and write one Kineto trace per rank.

    python tests/torch_trace_workload.py OUT_DIR RANK WORLD_SIZE PORT

With WORLD_SIZE > 1 it runs DistributedDataParallel over gloo on 127.0.0.1:PORT (real all-reduces).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule


def main(out_dir: str, rank: int, world: int, port: int) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def save(prof: profile) -> None:
        prof.export_chrome_trace(str(Path(out_dir) / f"rank{rank}.json"))

    with profile(
        activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=4), on_trace_ready=save
    ) as prof:
        for _ in range(5):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            prof.step()
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    # The traces are written. Leave before the interpreter's finalization: there Gloo's worker threads, destroyed
    # while still joinable, can abort the process ("terminate called without an active exception", SIGABRT; seen once
    # under load with the CPU build of torch 2.13; pytorch/pytorch#179291 describes the race), which would fail a run
    # whose traces are whole. An exception in main() still exits non-zero before this line.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
