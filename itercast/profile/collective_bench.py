"""Collective microbenchmarks through torch.distributed across local processes.

gloo on CPU, NCCL on CUDA (one GPU per rank). Per world size, one group of processes is spawned and
times every (collective, size) it is given. Sizes follow the cost model's convention
(costs/analytic.BUS_FACTOR): the buffer of an all-reduce, the gathered output of an all-gather, the
input of a reduce-scatter, each rank's operand of an all-to-all (fp32).

Timing: after `warmup` calls, every rank times each of a series of back-to-back calls
(perf_counter; with CUDA synchronisation on a GPU), and a call's time is the slowest rank's (what a
rendezvous costs; the series are compared element by element at the end). The series has between
max(3, `repeats`) and MAX_CALLS calls, as many as fit in BUDGET_S by the warm-up's pace, agreed by
all ranks. The median and standard deviation are kept: on this project's 2-core VM a gloo call is
bimodal (all-reduce of 4 KiB: p10 0.31 ms, p50 0.47 ms, p90 4.0 ms, the slow mode a 4 ms scheduler
tick when the ranks' threads outnumber the cores), so a mean over few calls swings by 2×.
Caches are not flushed: communication buffers are reused from step to step.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from itercast.measurements import ProfileError

OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")
QUICK = {"sizes": [1 << 10, 1 << 16, 1 << 20], "ranks": [2]}
FULL = {"sizes": [1 << k for k in range(8, 27)], "ranks": [2]}
BUDGET_S = 0.5
MAX_CALLS = 200


def configs(grid: dict[str, list[int]]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(family, op, params) of every collective configuration of the grid."""
    for ranks in grid["ranks"]:
        for op in OPS:
            for size in grid["sizes"]:
                yield "collective", op, {"ranks": ranks, "bytes": size}


def measure(
    todo: list[tuple[str, dict[str, Any]]], device: str, warmup: int, repeats: int
) -> list[tuple[str, dict[str, Any], list[float]]]:
    """Time every (op, params) of `todo`: one spawned group of processes per world size.
    Returns (op, params, seconds per timed run) in the order of `todo`."""
    import torch
    import torch.multiprocessing as mp

    out: dict[int, list[float]] = {}
    by_ranks: dict[int, list[int]] = {}
    for i, (_, params) in enumerate(todo):
        by_ranks.setdefault(int(params["ranks"]), []).append(i)
    for ranks, indices in by_ranks.items():
        if ranks < 2:
            raise ProfileError(f"collective benchmarks need at least 2 ranks; got {ranks}")
        if device.startswith("cuda") and ranks > torch.cuda.device_count():
            raise ProfileError(f"NCCL needs one GPU per rank: {ranks} ranks, {torch.cuda.device_count()} GPUs")
        jobs = [(todo[i][0], int(todo[i][1]["bytes"])) for i in indices]
        with tempfile.TemporaryDirectory() as tmp:
            result = Path(tmp) / "times.json"
            mp.spawn(_worker, args=(ranks, _free_port(), device, jobs, warmup, repeats, str(result)), nprocs=ranks)
            times = json.loads(result.read_text())
        out.update(zip(indices, times, strict=True))
    return [(op, params, out[i]) for i, (op, params) in enumerate(todo)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(
    rank: int, world: int, port: int, device: str, jobs: list[tuple[str, int]], warmup: int, repeats: int, out: str
) -> None:
    """One rank: time every job; rank 0 writes the slowest rank's times per job as JSON to `out`."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(rank)
    else:  # ranks share the host's cores: one compute thread each, as DDP launchers set
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    dev = torch.device(f"cuda:{rank}" if cuda else "cpu")
    results = []
    try:
        for op, nbytes in jobs:
            call = _collective(op, max(world, nbytes // 4), world, dev)
            pace = statistics.median(_timed_s(call, cuda) for _ in range(max(1, warmup)))
            agreed = torch.tensor([pace], dtype=torch.float64, device=dev)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)  # every rank runs the same number of calls
            calls = int(min(MAX_CALLS, max(3, repeats, BUDGET_S / max(float(agreed.item()), 1e-9))))
            series = torch.tensor([_timed_s(call, cuda) for _ in range(calls)], dtype=torch.float64, device=dev)
            dist.all_reduce(series, op=dist.ReduceOp.MAX)
            results.append(series.tolist())
        if rank == 0:
            Path(out).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def _timed_s(call: Any, cuda: bool) -> float:
    import torch

    t0 = time.perf_counter()
    call()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _collective(op: str, elements: int, world: int, dev: Any) -> Any:
    """A closure running `op` on fp32 buffers of `elements` (rounded down to a multiple of `world`)."""
    import torch
    import torch.distributed as dist

    n = elements - elements % world
    x = torch.ones(n, device=dev)
    if op == "all_reduce":
        return lambda: dist.all_reduce(x)
    if op == "all_gather":  # n is the gathered output
        shard, full = torch.ones(n // world, device=dev), torch.empty(n, device=dev)
        return lambda: dist.all_gather_single(full, shard)
    if op == "reduce_scatter":  # n is the input
        shard = torch.empty(n // world, device=dev)
        return lambda: dist.reduce_scatter_single(shard, x)
    if op == "alltoall":
        y = torch.empty(n, device=dev)
        return lambda: dist.all_to_all_single(y, x)
    raise ProfileError(f"unknown collective {op!r}: expected one of {', '.join(OPS)}")
