"""Measure DLRM steps under the shardings several sharders propose for random tasks drawn from public
table statistics (Lin et al., TPDS'24's design; the measured side of validation/sharding_tasks.py).

    python tools/measure_sharding_tasks.py --out data/measured/cpu_sharding_tasks.csv [--tasks 10 --seed 29]

Table statistics: MLPerf DLRM v2's 26 Criteo 1TB features, rows and multi-hot sizes (pooling factors)
as `--num_embeddings_per_feature` and `--multi_hot_sizes` of
mlcommons/training@55697bb05032d433a1c4d38cb77515028b8b5643:recommendation_v2/torchrec_dlrm/README.MD
(also the dlrm-dcnv2-criteo preset). Scaled to this 2-core, 24 GiB CPU: rows capped at ROW_CAP (the
40M-row tables become ROW_CAP-row ones; the small tables keep their rows), pooling factors kept.
A task (draw_tasks, seeded): 4–6 distinct features, one embedding dim for all (the dot interaction
needs them equal) from DIMS, a batch per rank from BATCHES_PER_RANK, uniform or Zipf 1.05 indices;
dense part as dlrm-small (13 dense features, bottom MLP 64-d, top MLP 64-1).
Sharders (each proposes one sharding for 2 ranks; identical proposals are measured once and
credited to every sharder that made them): `itercast` (workloads/dlrm/sharding.plan_sharding with
planner_calibration, fixed before any measurement: PLANNER_DB with cpu_profile_1thread.db's
collectives, host overheads measured on this CPU's MLP traces: CPU_HOST_OVERHEADS; seeds 29 and 30
were planned with the PyTorch HTA defaults, seed 33 on cpu_profile_1thread_corun_flush16.db, seed 34
with the forward lookups and GEMMs from it (rejected: validation/sharding_phases.py), seeds 29-33 before
dlrm_step shared a host's cores between its ranks' compute and collectives),
and TorchRec-style heuristics (SHARDERS below).
The step is tools/measure_dlrm_sharding.ShardedDLRM (its draws, semantics, warm-up and timing): per
task every distinct proposal runs in ROUNDS interleaved rounds of WARMUP untimed + ITERATIONS timed
steps, one row per timed step (the slowest rank's seconds). Needs torch.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "validation"))
from measure_dlrm_sharding import (  # noqa: E402  (the one timed step)
    ITERATIONS,
    ROUNDS,
    WARMUP,
    ShardedDLRM,
    free_port,
    init_gloo_rank,
    timed_rounds,
    write_measured,
)

from itercast.workloads.dlrm import DLRMConfig, EmbeddingTable, Shard  # noqa: E402
from itercast.workloads.dlrm.config import Strategy  # noqa: E402

#: (rows, multi-hot size) of the 26 Criteo 1TB features of MLPerf DLRM v2 (mlcommons/training@55697bb:
#: recommendation_v2/torchrec_dlrm/README.MD, --num_embeddings_per_feature and --multi_hot_sizes)
CRITEO_ROWS: tuple[int, ...] = (40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10)
CRITEO_ROWS += (2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36)
CRITEO_POOLING = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
ROW_CAP = 1_000_000  # rows kept at most: a 1M × 64 fp32 table is 256 MB, a task's 6 fit several times
DIMS = (16, 32, 64)
BATCHES_PER_RANK = (256, 1024)
ALPHAS = (0.0, 1.05)
WORLD = 2
#: the profile the planner is calibrated on (data/measured/README.md). Seed 33 was planned on
#: cpu_profile_1thread_corun_flush16.db (a 16 MiB flush before each timed run), which then priced every
#: draw's steps about 20% too fast (seeds 29-33 signed -20% to -26%): rejected
PLANNER_DB = "cpu_profile_1thread_corun.db"
#: a profile of data/measured whose per-call intercepts the embedding operators can take (planner_calibration's
#: `warm`): their grid timed back to back (`--flush-mib 0`), where PLANNER_DB's runs each follow a 64 MiB flush.
#: Decided on kernel data (inside measured steps the row-wise update runs at 0.80, 0.98 and 0.86 of the cold run
#: less the intercepts' difference, under 1k, 1k-10k and over 10k lookups, against 1.93, 1.50 and 0.93 of the
#: cold run itself: data/measured/cpu_update_in_step.csv), then rejected on seed 29's phases and steps before any
#: draw was planned on it: the cold fit had put per-lookup cost into its intercept (NNLS), so its slopes with the
#: warm intercept price forward lookups at 0.64 of their in-step time (1.81 with its own) and updates at 0.78
#: (1.04), and the steps 11.7%, signed -13.4% (10.5%, -0.8%). The planner keeps PLANNER_DB's own intercepts
WARM_DB = "cpu_profile_1thread_corun_warm.db"
WARM_INTERCEPTS = ("embedding_bag_fwd", "embedding_bag_bwd", "embedding_bag_update")
#: the measured phases of seed 29's steps (fitting data) the planner's embedding operators are refitted on
#: (planner_calibration `in_step`; validation/sharding_phases.py in_step_scales): inside a step the lookup's
#: fitted intercept counts 0.108 of itself and the rest of its price 1.498, the update's 0.137 and 1.331 (the
#: cold profile's NNLS had put per-lookup cost into the intercepts). Decided on those phases and seed 29's steps
#: (10.5% -> 5.5% geomean |error|; the model's pick 7 of 20 both), then checked on a fresh draw planned with it,
#: seed 37: 6.1% per step, itercast's proposal fastest 9 of 20 (+5), the model's pick 8 (+7)
IN_STEP_PHASES = "cpu_sharding_phases_seed29.csv"
SMALL_BYTES = 1 << 20  # dp_small: a table of at most 1 MiB (fp32) is replicated (its all-reduce is cheap)


@dataclass(frozen=True)
class Task:
    features: tuple[int, ...]  # Criteo feature indices (0–25)
    dim: int
    batch_per_rank: int
    zipf_alpha: float

    def model(self) -> DLRMConfig:
        """The task's DLRM (tables named f<feature>), as itercast prices it: no input distribution timed."""
        tables = tuple(
            EmbeddingTable(
                name=f"f{f}",
                num_rows=min(CRITEO_ROWS[f], ROW_CAP),
                embedding_dim=self.dim,
                pooling_factor=CRITEO_POOLING[f],
                zipf_alpha=self.zipf_alpha,
            )
            for f in self.features
        )
        return DLRMConfig(
            name="criteo-task",
            dense_features=13,
            bottom_mlp=(64, self.dim),
            top_mlp=(64, 1),
            tables=tables,
            input_distribution=False,
            exchange="point_to_point",  # ShardedDLRM's point-to-point emulation, as measured
        )


def draw_tasks(count: int, seed: int) -> list[Task]:
    """`count` tasks from random.Random(seed): per task, the number of tables (4–6), the features
    (without replacement), the dim, the batch per rank and the index distribution, in that order."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        k = rng.randint(4, 6)
        features = tuple(sorted(rng.sample(range(len(CRITEO_ROWS)), k)))
        out.append(Task(features, rng.choice(DIMS), rng.choice(BATCHES_PER_RANK), rng.choice(ALPHAS)))
    return out


Plan = dict[str, Shard]


def _greedy(tables: list[EmbeddingTable], cost: dict[str, float]) -> Plan:
    """Table-wise: largest cost first (ties in table order), each to the least-loaded rank (ties: the lower)."""
    load = [0.0] * WORLD
    plan = {}
    for t in sorted(tables, key=lambda t: -cost[t.name]):
        rank = min(range(WORLD), key=lambda r: load[r])
        plan[t.name] = Shard("table_wise", (rank,))
        load[rank] += cost[t.name]
    return {t.name: plan[t.name] for t in tables}


def greedy_size(model: DLRMConfig, batch_per_rank: int) -> Plan:
    """TorchRec-style table-wise greedy by size: rows × dim."""
    return _greedy(list(model.tables), {t.name: t.num_rows * t.embedding_dim for t in model.tables})


def greedy_lookups(model: DLRMConfig, batch_per_rank: int) -> Plan:
    """Table-wise greedy by lookups: pooling factor × global batch."""
    return _greedy(list(model.tables), {t.name: t.pooling_factor * batch_per_rank * WORLD for t in model.tables})


def all_row_wise(model: DLRMConfig, batch_per_rank: int) -> Plan:
    """Every table row-wise over both ranks."""
    return {t.name: Shard("row_wise", tuple(range(WORLD))) for t in model.tables}


def dp_small(model: DLRMConfig, batch_per_rank: int) -> Plan:
    """Data-parallel for tables of at most SMALL_BYTES (rows × dim × 4), the rest greedy by size."""
    small = [t for t in model.tables if t.num_rows * t.embedding_dim * 4 <= SMALL_BYTES]
    rest = [t for t in model.tables if t not in small]
    plan = {t.name: Shard("data_parallel", tuple(range(WORLD))) for t in small}
    plan |= _greedy(rest, {t.name: t.num_rows * t.embedding_dim for t in rest})
    return {t.name: plan[t.name] for t in model.tables}


SHARDERS = {
    "greedy_size": greedy_size,
    "greedy_lookups": greedy_lookups,
    "row_wise": all_row_wise,
    "dp_small": dp_small,
}


#: host overheads of this CPU measured on another workload's traces (the reference's overheads from other
#: workloads): the MLP of tools/measure_step_times.py, 1 and 2 gloo ranks of one thread, 90 profiled steps;
#: T1 15.8 µs over 3,985 gaps (data/measured/README.md has the command: itercast calibrate --host-trace
#: data/measured/cpu_mlp_*_traced.rank*.trace.json.gz --for-another-workload)
CPU_HOST_OVERHEADS = ROOT / "data" / "measured" / "cpu_host_overheads_mlp.json"


def planner_calibration(
    profile: str = PLANNER_DB,
    ops_from: dict[str, tuple[str, ...]] | None = None,
    warm: str | None = None,
    in_step: str | None = IN_STEP_PHASES,
) -> dict[str, Any]:
    """validation/sharding.py's corun calibration (`profile` of data/measured, its collectives from
    cpu_profile_1thread.db, and the operators `ops_from` names from those profiles: none for the planner),
    the WARM_INTERCEPTS operators' intercepts from the `warm` profile (None, the planner's: the profile's own), with
    CPU_HOST_OVERHEADS as its host_overheads section (other trace); with `in_step` (phases of data/measured:
    the planner's IN_STEP_PHASES) each embedding operator's intercept and slopes rescaled to what the
    phases measured inside steps (validation/sharding_phases.py in_step_scales; None: the profile's as fitted)."""
    import json

    from sharding import MEASURED, with_families_from

    from itercast.profile.calibrate import calibrate, merge_calibration
    from itercast.profile.db import ProfileDB

    alone = ProfileDB(MEASURED / "cpu_profile_1thread.db", readonly=True)
    db = with_families_from(ProfileDB(MEASURED / profile, readonly=True), alone)
    for other, ops in (ops_from or {}).items():
        db = with_families_from(db, ProfileDB(MEASURED / other, readonly=True), ops)
    cal = merge_calibration(calibrate(db, db.devices()[-1][0], planner_system()))
    if warm is not None:
        warm_db = ProfileDB(MEASURED / warm, readonly=True)
        intercepts = calibrate(warm_db, warm_db.devices()[-1][0], planner_system())["operators"]["models"]
        for key, fit in cal["operators"]["models"].items():
            if key.rsplit(":", 1)[-1] in WARM_INTERCEPTS:
                fit["alpha_s"] = intercepts[key]["alpha_s"]
    host = json.loads(CPU_HOST_OVERHEADS.read_text())["host_overheads"]
    cal = {**cal, "host_overheads": host, "host_overheads_source": str(CPU_HOST_OVERHEADS.relative_to(ROOT))}
    if in_step is None:
        return cal
    from sharding_phases import in_step_scales, read_phases, rescaled

    return rescaled(cal, in_step_scales(cal, read_phases(MEASURED / in_step)))


def planner_system() -> Any:
    from itercast.config.job import load_system

    return load_system("cpu-host", node={"gpus_per_node": WORLD})


def encode(plan: Plan) -> str:
    """A plan as text: `f3:table_wise:0 f20:row_wise:0-1 …` (decode inverts it)."""
    return " ".join(f"{name}:{s.strategy}:{'-'.join(map(str, s.ranks))}" for name, s in plan.items())


def decode(text: str) -> Plan:
    out = {}
    for item in text.split():
        name, strategy, ranks = item.split(":")
        out[name] = Shard(cast(Strategy, strategy), tuple(int(r) for r in ranks.split("-")))
    return out


def proposals(task: Task, calibration: dict[str, Any] | None) -> dict[str, list[str]]:
    """Each distinct proposal (encoded) and the sharders that made it, itercast's first when given a
    calibration (None: the heuristics only)."""
    from itercast.workloads.dlrm.sharding import plan_sharding

    model = task.model()
    made: dict[str, list[str]] = {}
    if calibration is not None:
        best = plan_sharding(model, planner_system(), task.batch_per_rank, calibration=calibration).plans[0][0]
        made[encode({t.name: best[t.name] for t in model.tables})] = ["itercast"]
    for name, sharder in SHARDERS.items():
        made.setdefault(encode(sharder(model, task.batch_per_rank)), []).append(name)
    return made


def worker(
    rank: int, world: int, port: int, out: str, work: list[tuple[Task, dict[str, list[str]]]], rounds: int
) -> None:
    import torch
    import torch.distributed as dist

    init_gloo_rank(torch, rank, world, port)
    rows = []
    for n, (task, made) in enumerate(work):
        model = task.model()
        runs = {
            text: ShardedDLRM(
                torch,
                model,
                {k: (s.strategy, s.ranks) for k, s in decode(text).items()},
                rank,
                world,
                task.batch_per_rank,
                task.zipf_alpha,
            )
            for text in made
        }
        tables = " ".join(f"f{f}" for f in task.features)
        head = f"{n},{tables},{task.dim},{task.batch_per_rank},{task.zipf_alpha}"
        for text, rnd, i, seconds in timed_rounds(torch, dist, runs, rounds):
            rows.append(f"{head},{'+'.join(made[text])},{text},{rnd},{i},{seconds:.9f}")
        if rank == 0:
            print(f"task {n + 1}/{len(work)} ({len(runs)} proposals) done at {time.strftime('%H:%M:%S')}", flush=True)
        del runs
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text("\n".join(rows) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tasks", type=int, default=10)
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument(
        "--rounds", type=int, default=ROUNDS, help="interleaved rounds per task (more: more tasks decidable)"
    )
    args = ap.parse_args()
    import torch
    import torch.multiprocessing as mp

    calibration = planner_calibration()
    work = [(task, proposals(task, calibration)) for task in draw_tasks(args.tasks, args.seed)]
    print(f"{sum(len(m) for _, m in work)} distinct proposals planned at {time.strftime('%H:%M:%S')}", flush=True)
    tmp = Path(args.out).with_suffix(".tmp")
    mp.spawn(worker, args=(WORLD, free_port(), str(tmp), work, args.rounds), nprocs=WORLD)
    header = [
        f"# command: python tools/measure_sharding_tasks.py --out {args.out} --tasks {args.tasks} --seed {args.seed}"
        + (f" --rounds {args.rounds}" if args.rounds != ROUNDS else ""),
        f"# tasks: draw_tasks({args.tasks}, seed={args.seed}), tables from MLPerf DLRM v2's Criteo 1TB statistics, "
        f"rows capped at {ROW_CAP}; sharders: itercast, {', '.join(SHARDERS)}",
        f"# each (task, proposal): {args.rounds} interleaved rounds of {WARMUP} untimed + {ITERATIONS} timed steps",
        "task,tables,dim,batch_per_rank,zipf_alpha,sharders,sharding,round,iteration,step_s",
    ]
    write_measured(torch, Path(args.out), tmp, WORLD, header)


if __name__ == "__main__":
    main()
