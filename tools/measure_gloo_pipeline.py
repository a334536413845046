"""Measure one pipeline-parallel training step at 2 and 4 stages over gloo on this CPU, with traces.

    python tools/measure_gloo_pipeline.py --out data/measured/gloo_pipeline

The same model and global batch at every stage count (strong scaling, as re-staging keeps them): an
8-layer MLP (Linear(1024, 1024) + ReLU, SGD), its layers split evenly into `pp` consecutive stages
(one process per stage, one torch thread per process: torch.set_num_threads(1)), a global batch
of 256 rows in M = 8 micro-batches of 32, run under GPipe (Huang et al. 2019, "GPipe", Fig. 2c):
every micro-batch's forward in order, then every micro-batch's backward in order, then the
optimizer. A stage receives its input activation (or output gradient) with a blocking
`dist.recv` and sends its output (or input gradient) with `dist.isend` (waited for before the
optimizer), over gloo on 127.0.0.1; the last stage takes an MSE loss. After WARMUP untimed steps,
TRACED_STEPS steps run under torch.profiler (CPU activities, record_shapes so `c10d::send` and
`c10d::recv_` carry their tensors' dims) and each stage writes a Kineto trace
`pp{P}.rank{R}.trace.json.gz`; then TIMED_STEPS unprofiled steps are timed per rank
(time.perf_counter_ns from before zero_grad to after the optimizer step) into `steps.csv`.

What the comparison must keep in mind: the machine has 2 cores. At 4 stages the four processes
share them: a stage computing while another does slows it, as well as the sends. Needs torch (the
optional extra).
"""

from __future__ import annotations

import os
from pathlib import Path

from gloo_runs import measure, trace_and_time  # tools/gloo_runs.py, beside this script

STAGE_COUNTS = (2, 4)
WARMUP = 5
TRACED_STEPS = 4
TIMED_STEPS = 30
WIDTH, LAYERS, GLOBAL_BATCH, MICRO_BATCHES = 1024, 8, 256, 8


def worker(rank: int, stages: int, port: int, out_dir: Path) -> None:
    import torch
    import torch.distributed as dist

    torch.manual_seed(0)  # every stage builds the same 8 layers and keeps its own
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=stages)
    layers: list[torch.nn.Module] = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    per_stage = 2 * LAYERS // stages
    model = torch.nn.Sequential(*layers[rank * per_stage : (rank + 1) * per_stage])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rows = GLOBAL_BATCH // MICRO_BATCHES
    x = torch.randn(MICRO_BATCHES, rows, WIDTH)
    y = torch.randn(MICRO_BATCHES, rows, WIDTH)
    first, last = rank == 0, rank == stages - 1

    def step() -> None:
        opt.zero_grad()
        sends, inputs, outputs = [], [], []
        for k in range(MICRO_BATCHES):  # forwards
            if first:
                inp = x[k]
            else:
                inp = torch.empty(rows, WIDTH)
                dist.recv(inp, rank - 1)
                inp.requires_grad_()
            out = model(inp)
            if last:
                out = torch.nn.functional.mse_loss(out, y[k]) / MICRO_BATCHES
            else:
                sends.append(dist.isend(out.detach(), rank + 1))
            inputs.append(inp)
            outputs.append(out)
        for k in range(MICRO_BATCHES):  # backwards
            if last:
                outputs[k].backward()
            else:
                grad = torch.empty(rows, WIDTH)
                dist.recv(grad, rank + 1)
                outputs[k].backward(grad)
            if not first:
                sends.append(dist.isend(inputs[k].grad, rank - 1))
        for work in sends:
            work.wait()
        opt.step()

    for _ in range(WARMUP):
        step()
    raw = out_dir / f"pp{stages}.rank{rank}.trace.json"
    times_s = trace_and_time(step, raw, TRACED_STEPS, TIMED_STEPS, between=dist.barrier)
    dist.destroy_process_group()
    (out_dir / f"pp{stages}.rank{rank}.steps.txt").write_text("\n".join(f"{t:.9f}" for t in times_s) + "\n")


def main() -> None:
    measure(
        __file__,
        worker,
        STAGE_COUNTS,
        "pp",
        600,
        [
            f"# model: {LAYERS}x(Linear({WIDTH},{WIDTH})+ReLU) split evenly into pp stages, "
            f"global batch {GLOBAL_BATCH} in {MICRO_BATCHES} micro-batches, GPipe, SGD; "
            "recv/isend over gloo on 127.0.0.1",
            f"# per stage count: {WARMUP} warm-up steps, {TRACED_STEPS} traced steps (pp*.rank*.trace.json.gz), "
            f"then {TIMED_STEPS} timed unprofiled steps (these rows)",
        ],
        "stages",
    )


if __name__ == "__main__":
    main()
