"""Measure one tensor-parallel training step at TP 1, 2 and 4 over gloo on this CPU, with traces.

    python tools/measure_gloo_tp.py --out data/measured/gloo_tensor_parallel

The same model and batch at every TP size (strong scaling: TP splits each layer's weights, every
rank sees the whole batch): BLOCKS Megatron-style MLP blocks of hidden size H (Shoeybi et al. 2019,
"Megatron-LM", §3 and Fig. 3a; megatron/core/tensor_parallel/layers.py): a column-parallel
Linear(H, 4H/t) with its bias shard, GELU, a row-parallel Linear(4H/t, H) without bias, the
all-reduce of its output over the TP group (the `g` operator: mappings.py
_ReduceFromModelParallelRegion), then the row layer's bias, replicated, added after the
reduction (as RowParallelLinear does). The block's input passes the `f` operator (identity
forward, all-reduce of the input gradient backward: _CopyToModelParallelRegion); the first
block's input needs no gradient, so its `f` reduces nothing. At t = 1 no collective runs
(Megatron skips them at TP 1). An MSE loss on the last block's output, SGD.

One process per rank, one torch thread each (torch.set_num_threads(1)); the TP group is made with
dist.new_group(..., group_desc="TENSOR_MODEL_PARALLEL_GROUP"), as Megatron-Core's
parallel_state.py names it, so a trace's collectives can say which group they ran on. After WARMUP
untimed steps, TRACED_STEPS steps run under torch.profiler (CPU activities, record_shapes: every
matmul and `c10d::allreduce_` carries its dims) and each rank writes `tp{T}.rank{R}.trace.json.gz`;
then TIMED_STEPS unprofiled steps are timed per rank (time.perf_counter_ns from before zero_grad to
after the optimizer step) into `steps.csv`. The machine has 2 cores: at TP 4 four processes share
them. Needs torch (the optional extra).
"""

from __future__ import annotations

import os
from pathlib import Path

from gloo_runs import measure, trace_and_time  # tools/gloo_runs.py, beside this script

TP_SIZES = (1, 2, 4)
WARMUP = 5
TRACED_STEPS = 4
TIMED_STEPS = 20
HIDDEN, BLOCKS, BATCH = 512, 4, 64


def worker(rank: int, tp: int, port: int, out_dir: Path) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    group = None
    if tp > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=tp)
        group = dist.new_group(list(range(tp)), group_desc="TENSOR_MODEL_PARALLEL_GROUP")

    def reduced(x: torch.Tensor) -> torch.Tensor:
        if group is not None:
            dist.all_reduce(x, group=group)
        return x

    class CopyToTP(torch.autograd.Function):  # Megatron's f
        @staticmethod
        def forward(ctx, x):  # type: ignore[no-untyped-def]
            return x

        @staticmethod
        def backward(ctx, grad):  # type: ignore[no-untyped-def]
            return reduced(grad.clone())

    class ReduceFromTP(torch.autograd.Function):  # Megatron's g
        @staticmethod
        def forward(ctx, x):  # type: ignore[no-untyped-def]
            return reduced(x.clone())

        @staticmethod
        def backward(ctx, grad):  # type: ignore[no-untyped-def]
            return grad

    torch.manual_seed(rank)  # each rank its own shards
    shard = 4 * HIDDEN // tp
    column = [torch.nn.Linear(HIDDEN, shard) for _ in range(BLOCKS)]
    row = [torch.nn.Linear(shard, HIDDEN, bias=False) for _ in range(BLOCKS)]
    row_bias = [torch.nn.Parameter(torch.zeros(HIDDEN)) for _ in range(BLOCKS)]
    params = [p for layer in column + row for p in layer.parameters()] + row_bias
    opt = torch.optim.SGD(params, lr=1e-3)
    torch.manual_seed(1234)  # the same batch on every rank (TP ranks see the whole batch)
    x, y = torch.randn(BATCH, HIDDEN), torch.randn(BATCH, HIDDEN)

    def step() -> None:
        opt.zero_grad()
        h = x
        for c, r, b in zip(column, row, row_bias, strict=True):
            h = ReduceFromTP.apply(r(torch.nn.functional.gelu(c(CopyToTP.apply(h))))) + b
        torch.nn.functional.mse_loss(h, y).backward()
        opt.step()

    for _ in range(WARMUP):
        step()
    raw = out_dir / f"tp{tp}.rank{rank}.trace.json"
    times_s = trace_and_time(step, raw, TRACED_STEPS, TIMED_STEPS, dist.barrier if group is not None else None)
    if group is not None:
        dist.destroy_process_group()
    (out_dir / f"tp{tp}.rank{rank}.steps.txt").write_text("\n".join(f"{t:.9f}" for t in times_s) + "\n")


def main() -> None:
    load = os.getloadavg()
    measure(
        __file__,
        worker,
        TP_SIZES,
        "tp",
        600,
        [
            f"# model: {BLOCKS} Megatron MLP blocks, hidden {HIDDEN}: column-parallel Linear({HIDDEN}, "
            f"{4 * HIDDEN}/t) + GELU + row-parallel Linear({4 * HIDDEN}/t, {HIDDEN}) + all-reduce (f/g), batch "
            f"{BATCH} on every rank, MSE loss, SGD; gloo on 127.0.0.1, group_desc TENSOR_MODEL_PARALLEL_GROUP",
            f"# per TP size: {WARMUP} warm-up steps, {TRACED_STEPS} traced steps (tp*.rank*.trace.json.gz), "
            f"then {TIMED_STEPS} timed unprofiled steps (these rows)",
            f"# load average before the runs (1, 5, 15 min): {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}",
        ],
        "tp",
    )


if __name__ == "__main__":
    main()
