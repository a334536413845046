"""Measure one DDP training step at data-parallel sizes 1, 2 and 4 over gloo on this CPU, with traces.

    python tools/measure_gloo_parallelism.py --out data/measured/gloo_parallelism

For each world size (1, 2, 4: one fresh process set each, one process per rank, one torch thread
per rank: torch.set_num_threads(1)), the same model and per-rank batch (weak scaling, as DDP keeps
each rank's batch): a 4-layer MLP (Linear(1024, 1024) + ReLU, batch 64 per rank, SGD), wrapped in
DistributedDataParallel over gloo on 127.0.0.1 (default buckets: 25 MiB, the first 1 MiB). After
WARMUP untimed steps, TRACED_STEPS steps run under torch.profiler (CPU activities, record_shapes so
`c10d::allreduce_` carries its bucket's dims) and each rank writes a Kineto trace
`ws{W}.rank{R}.trace.json.gz`; then TIMED_STEPS unprofiled steps are timed per rank
(time.perf_counter_ns from before zero_grad to after the optimizer step) into `steps.csv`.

What the comparison must keep in mind: the machine has 2 cores. At world size 4 the four ranks
share them, so compute slows as well as communication; a data-parallel what-if on a trace re-times
the gradient all-reduces only. Needs torch (the optional extra).
"""

from __future__ import annotations

import os
from pathlib import Path

from gloo_runs import measure, trace_and_time  # tools/gloo_runs.py, beside this script

WORLD_SIZES = (1, 2, 4)
WARMUP = 10
TRACED_STEPS = 6
TIMED_STEPS = 30
WIDTH, LAYERS, BATCH = 1024, 4, 64


def worker(rank: int, world: int, port: int, out_dir: Path) -> None:
    import torch
    import torch.distributed as dist

    torch.manual_seed(rank)
    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    layers: list[torch.nn.Module] = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    model: torch.nn.Module = torch.nn.Sequential(*layers)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    for _ in range(WARMUP):
        step()
    raw = out_dir / f"ws{world}.rank{rank}.trace.json"
    times_s = trace_and_time(step, raw, TRACED_STEPS, TIMED_STEPS)
    if world > 1:
        dist.destroy_process_group()
    (out_dir / f"ws{world}.rank{rank}.steps.txt").write_text("\n".join(f"{t:.9f}" for t in times_s) + "\n")


def main() -> None:
    measure(
        __file__,
        worker,
        WORLD_SIZES,
        "ws",
        1800,
        [
            f"# model: {LAYERS}x(Linear({WIDTH},{WIDTH})+ReLU), batch {BATCH} per rank, SGD; "
            "DDP over gloo on 127.0.0.1",
            f"# per world size: {WARMUP} warm-up steps, {TRACED_STEPS} traced steps (ws*.rank*.trace.json.gz), "
            f"then {TIMED_STEPS} timed unprofiled steps (these rows)",
        ],
        "world_size",
    )


if __name__ == "__main__":
    main()
