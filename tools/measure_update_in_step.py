"""How long the row-wise Adagrad update takes inside a measured DLRM step, against the same call timed
alone after flushes of FLUSHES_MIB (0: back to back; 64: as `itercast profile` times it by default,
profile/microbench._time): which flush leaves the cache a step leaves?

    python tools/measure_update_in_step.py --out data/measured/cpu_update_in_step.csv --seed 29 --tasks 11 0

Per task of tools/measure_sharding_tasks.draw_tasks(20, seed), its all-row-wise and greedy-by-size
proposals run on 2 gloo processes of one thread each (tools/measure_dlrm_sharding.ShardedDLRM): 3 untimed
and 20 timed steps, every update call inside them timed; then, both ranks at once, each shard's last
call again, 20 times after each flush. One row per (rank, proposal, table shard, lookups): the medians
in milliseconds. Needs torch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]
import measure_dlrm_sharding as step_module  # noqa: E402  (its ShardedDLRM calls the update by this name)
from measure_sharding_tasks import all_row_wise, draw_tasks, greedy_size  # noqa: E402

from itercast.profile.op_calls import rowwise_adagrad_update  # noqa: E402

WARMUP, STEPS, REPEATS = 3, 20, 20
#: MiB written before each alone run: 0 is back to back (warm), 64 what `itercast profile` writes by default
FLUSHES_MIB = (0, 1, 4, 8, 16, 32, 64)


def worker(rank: int, world: int, port: int, seed: int, picked: list[int], out: str) -> None:
    import torch
    import torch.distributed as dist

    step_module.init_gloo_rank(torch, rank, world, port)
    calls: list[tuple[Any, ...]] = []

    def timed(weight: Any, state: Any, idx: Any, grad: Any, lr: float) -> None:
        t0 = time.perf_counter()
        rowwise_adagrad_update(weight, state, idx, grad, lr)
        calls.append((weight, state, idx, grad, time.perf_counter() - t0))

    step_module.rowwise_adagrad_update = timed
    flushes = {mib: torch.empty(max((mib << 20) // 4, 1)) for mib in FLUSHES_MIB}
    tasks, rows = draw_tasks(20, seed), []
    for n in picked:
        task = tasks[n]
        for name, plan in (("row_wise", all_row_wise), ("greedy_size", greedy_size)):
            sharding = {k: (s.strategy, s.ranks) for k, s in plan(task.model(), task.batch_per_rank).items()}
            run = step_module.ShardedDLRM(
                torch, task.model(), sharding, rank, world, task.batch_per_rank, task.zipf_alpha
            )
            for _ in range(WARMUP):
                run.step()
            calls.clear()
            for _ in range(STEPS):
                dist.barrier()
                run.step()
            by_call: dict[tuple[int, int, int], list[tuple[Any, ...]]] = {}
            for c in calls:
                by_call.setdefault((c[0].shape[0], c[0].shape[1], c[2].numel()), []).append(c)
            dist.barrier()
            for (table_rows, dim, lookups), cs in sorted(by_call.items()):
                weight, state, idx, grad = cs[-1][:4]
                alone = []
                for flush in flushes.values():
                    times = []
                    for k in range(REPEATS):
                        flush.fill_(k)
                        t0 = time.perf_counter()
                        rowwise_adagrad_update(weight, state, idx, grad, 0.0)
                        times.append(time.perf_counter() - t0)
                    alone.append(statistics.median(times))
                in_step = statistics.median(c[4] for c in cs)
                medians = (in_step, *alone)
                rows.append(
                    f"{seed},{n},{rank},{name},{table_rows},{dim},{lookups},{len(cs)},"
                    + ",".join(f"{m * 1e3:.4f}" for m in medians)
                )
            dist.barrier()
    step_module.end_rank(torch, out, rank, rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--tasks", type=int, nargs="+", required=True, help="task numbers of the seed's draw of 20")
    args = ap.parse_args()
    import torch
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(2, step_module.free_port(), args.seed, args.tasks, str(args.out)), nprocs=2)
    tasks = " ".join(map(str, args.tasks))
    header = [
        f"# command: python tools/measure_update_in_step.py --out {args.out} --seed {args.seed} --tasks {tasks}",
        f"# torch {torch.__version__}; medians over the calls of {STEPS} timed steps (in_step), {REPEATS} repeats",
        "seed,task,rank,proposal,shard_rows,dim,lookups,calls,in_step_ms,"
        + ",".join(f"flush{m}_ms" for m in FLUSHES_MIB),
    ]
    step_module.join_rank_files(args.out, header, 2)


if __name__ == "__main__":
    main()
