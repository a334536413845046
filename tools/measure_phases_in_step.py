"""How long each phase of a measured DLRM sharding step takes on each rank: the in-step times of the
operator families that validation/sharding_phases.py sets against each profile's prices.

    python tools/measure_phases_in_step.py --out data/measured/cpu_sharding_phases_seed29.csv --seed 29

Per task of tools/measure_sharding_tasks.draw_tasks(20, seed), every distinct proposal of the heuristic
sharders (measure_sharding_tasks.SHARDERS; itercast's own is left out, so that no profile chooses what
is measured) runs on 2 gloo processes of one thread each (tools/measure_dlrm_sharding.ShardedDLRM): WARMUP
untimed and STEPS timed steps, each behind a barrier, with the step's phase marks on (ShardedDLRM._mark:
one perf_counter_ns at the end of each phase, named as the tasks of workloads/dlrm/step._step_graph
except mlp_fwd_bwd, which is its bottom_mlp_fwd, interaction_top_mlp_fwd_bwd and bottom_mlp_bwd). One
row per (task, proposal, rank, phase): the median of the phase's milliseconds over the timed steps.
Needs torch.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]
from measure_dlrm_sharding import ShardedDLRM, end_rank, free_port, init_gloo_rank, join_rank_files  # noqa: E402
from measure_sharding_tasks import WORLD, decode, draw_tasks, proposals  # noqa: E402

WARMUP, STEPS = 3, 20


def worker(rank: int, world: int, port: int, seed: int, tasks: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    init_gloo_rank(torch, rank, world, port)
    rows = []
    for n, task in enumerate(draw_tasks(tasks, seed)):
        for text, sharders in proposals(task, None).items():
            sharding = {k: (s.strategy, s.ranks) for k, s in decode(text).items()}
            run = ShardedDLRM(torch, task.model(), sharding, rank, world, task.batch_per_rank, task.zipf_alpha)
            for i in range(WARMUP + STEPS):
                if i == WARMUP:
                    run.marks = []
                dist.barrier()
                run.step()
            phases: dict[str, list[float]] = {}
            for (_, t0), (phase, t1) in itertools.pairwise(run.marks or []):
                if phase != "start":  # a step's phases run from its "start" mark to the next step's
                    phases.setdefault(phase, []).append((t1 - t0) * 1e-6)
            rows += [
                f"{seed},{n},{'+'.join(sharders)},{text},{rank},{phase},{len(ms)},{statistics.median(ms):.4f}"
                for phase, ms in phases.items()
            ]
            del run
        if rank == 0:
            print(f"task {n + 1}/{tasks} done at {time.strftime('%H:%M:%S')}", flush=True)
    end_rank(torch, out, rank, rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--tasks", type=int, default=20, help="the first TASKS tasks of the seed's draw")
    args = ap.parse_args()
    import torch
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(WORLD, free_port(), args.seed, args.tasks, str(args.out)), nprocs=WORLD)
    header = [
        f"# command: python tools/measure_phases_in_step.py --out {args.out} --seed {args.seed} --tasks {args.tasks}",
        f"# torch {torch.__version__}; per (task, proposal, rank, phase) the median over {STEPS} timed steps "
        f"after {WARMUP} untimed",
        "seed,task,sharders,sharding,rank,phase,steps,median_ms",
    ]
    join_rank_files(args.out, header, WORLD)


if __name__ == "__main__":
    main()
