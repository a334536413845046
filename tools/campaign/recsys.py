"""DLRM parts of the GPU campaign (g): embedding-bag forward, backward and the fused sparse update at
DLRM shard sizes under uniform and Zipf indices, and single-GPU DLRM training steps.

FBGEMM-GPU's fused kernels are not measured: its wheels (hundreds of MB, built per torch and CUDA
release) cannot travel to the bare GPU machine (64 MiB per call). The update timed is the eager
row-wise Adagrad that `itercast profile` and the CPU sharding measurement time
(profile/op_calls.rowwise_adagrad_update), so the three measure the same operation.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F

from campaign.common import Budget, Context, attempt, timing
from campaign.kernels import TIME_FIELDS
from campaign.training import step_times_ms

EMBEDDING: dict[str, dict[str, Any]] = {
    # rows: a per-GPU shard of MLPerf DLRM-DCNv2's tables (26 tables capped at 40M rows, dim 128)
    "full": {
        "rows": [1_000_000, 10_000_000, 40_000_000],
        "dims": [128, 64],
        "pooling": [1, 20, 100],
        "bags": [8192, 65536],
    },
    "dry": {"rows": [1000], "dims": [16], "pooling": [1, 4], "bags": [32]},
}
#: DLRM steps: dlrm-dcnv2-criteo's tables with rows capped (so that all 26 fit one GPU) and dot
#: interaction; samples per step; uniform or Zipf indices (α = itercast's ZIPF_ALPHA, the profiled skew)
DLRM: dict[str, dict[str, Any]] = {
    "full": {"row_cap": 10_000_000, "batches": [4096, 16384], "zipf": [False, True], "steps": 30},
    "dry": {"row_cap": 2000, "batches": [16, 32], "zipf": [False, True], "steps": 3},
}


def run_embedding(ctx: Context, budget: Budget) -> str:
    """(g) embedding bags: forward, dense backward and the row-wise Adagrad update."""
    from measure_dlrm_sharding import draw

    from itercast.costs.op_model import ZIPF_ALPHA
    from itercast.profile.op_calls import rowwise_adagrad_update

    grid = EMBEDDING["dry" if ctx.dry else "full"]
    fields = ["rows", "dim", "pooling", "bags", "distribution", "op", "lookups", "unique_rows", *TIME_FIELDS]
    rows_out = ctx.rows(
        "embedding_bag.csv",
        fields,
        [
            "fp32 table, sum pooling, fixed pooling per bag; indices: uniform or Zipf α=1.05 with the popular rows "
            "scattered by a random permutation (tools/measure_dlrm_sharding.py draw)",
            "op: fwd (F.embedding_bag); bwd (torch.autograd.grad of the table: the dense gradient, DDP's path); "
            "update (row-wise Adagrad of the looked-up rows, itercast.profile.op_calls.rowwise_adagrad_update, "
            "given each lookup's gradient row)",
        ],
        "embedding-bag forward, backward and sparse-update timings at DLRM shard sizes",
    )
    gen = torch.Generator().manual_seed(0)
    largest = max(grid["bags"]) * max(grid["pooling"])
    for n_rows in grid["rows"]:
        for dist in ("uniform", "zipf"):
            if budget.spent():
                budget.skipped += 1
                continue
            idx_all = draw(torch, n_rows, largest, ZIPF_ALPHA if dist == "zipf" else 0.0, gen).to(ctx.device)
            for dim in grid["dims"]:
                table = torch.randn(n_rows, dim, device=ctx.device).mul_(0.01).requires_grad_()
                state = torch.zeros(n_rows, device=ctx.device)
                for pooling in grid["pooling"]:
                    for bags in grid["bags"]:
                        if not budget.take():
                            continue
                        idx = idx_all[: bags * pooling]
                        key = {"rows": n_rows, "dim": dim, "pooling": pooling, "bags": bags, "distribution": dist}
                        key |= {"lookups": idx.numel(), "unique_rows": int(idx.unique().numel())}
                        for op, fn in _embedding_ops(table, state, idx, bags, pooling, rowwise_adagrad_update).items():
                            rows_out.add({**key, "op": op, **attempt(lambda fn=fn: ctx.timed(fn, target_ms=100))})
                del table, state
                ctx.reset_peak()
    rows_out.close()
    return f"{rows_out.count} rows, {budget.skipped} skipped for time"


def _embedding_ops(table: Any, state: Any, idx: Any, bags: int, pooling: int, update: Any) -> dict[str, Any]:
    offsets = torch.arange(0, bags * pooling, pooling, device=idx.device)
    g = torch.randn(bags, table.shape[1], device=idx.device)
    grad_rows = g.repeat_interleave(pooling, 0)
    weight = table.detach()

    def bwd() -> Any:
        return torch.autograd.grad(F.embedding_bag(idx, table, offsets, mode="sum"), table, g)

    return {
        "fwd": lambda: F.embedding_bag(idx, weight, offsets, mode="sum"),
        "bwd": bwd,
        "update": lambda: update(weight, state, idx, grad_rows),
    }


def run_dlrm_steps(ctx: Context, budget: Budget) -> str:
    """(g) single-GPU DLRM training steps at two batch sizes, uniform and Zipf indices: the sharding
    measurement's step (tools/measure_dlrm_sharding.py ShardedDLRM) with every table on the one rank."""
    import torch.distributed as dist
    from measure_dlrm_sharding import ShardedDLRM, free_port

    from itercast.cli.shard_cmds import load_dlrm
    from itercast.costs.op_model import ZIPF_ALPHA

    grid = DLRM["dry" if ctx.dry else "full"]
    preset = load_dlrm("dlrm-dcnv2-criteo")
    capped = tuple(t.model_copy(update={"num_rows": min(t.num_rows, grid["row_cap"])}) for t in preset.tables)
    model = preset.model_copy(update={"tables": capped, "interaction": "dot"})
    fields = ["batch", "zipf_alpha", "row_cap", "status", "median_ms", "p10_ms", "p90_ms", "reps"]
    rows = ctx.rows(
        "dlrm_steps.csv",
        fields,
        [
            f"model: preset dlrm-dcnv2-criteo with rows capped at {grid['row_cap']:,} and dot interaction "
            "(itercast: load_dlrm('dlrm-dcnv2-criteo') with those two changes), one GPU, every table table-wise "
            "on it; fp32 tables with row-wise Adagrad, MLPs with Adam (tools/measure_dlrm_sharding.py ShardedDLRM)",
            f"3 untimed steps, then {grid['steps']} consecutive steps timed by CUDA events",
        ],
        "single-GPU DLRM step times at two batch sizes, uniform and Zipf indices",
    )
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("nccl" if ctx.cuda else "gloo", rank=0, world_size=1)
    sharding = {t.name: ("table_wise", (0,)) for t in model.tables}
    try:
        for b in grid["batches"]:
            for alpha in (ZIPF_ALPHA if zipf else 0.0 for zipf in grid["zipf"]):
                if not budget.take():
                    continue

                def once(b: int = b, alpha: float = alpha) -> dict[str, Any]:
                    run = ShardedDLRM(torch, model, sharding, 0, 1, b, alpha, device=ctx.device)
                    for _ in range(3):
                        run.step()
                    return timing(step_times_ms(ctx, run.step, grid["steps"]))

                rows.add({"batch": b, "zipf_alpha": alpha, "row_cap": grid["row_cap"], **attempt(once)})
                ctx.reset_peak()
    finally:
        dist.destroy_process_group()
    rows.close()
    return f"{rows.count} rows, {budget.skipped} skipped for time"
