"""The sharding planner: the fastest embedding-table shardings of a DLRM, each priced by simulating
its step (dlrm_step)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from itercast.config.system import SystemConfig
from itercast.memory import describe_reserve
from itercast.workloads.dlrm.config import DLRMConfig, EmbeddingTable, Shard
from itercast.workloads.dlrm.embedding import IndexSample
from itercast.workloads.dlrm.step import DLRMStep, dlrm_step, rank_loads


def candidate_shards(table: EmbeddingTable, world: int) -> list[Shard]:
    """The shardings the planner tries for one table: table-wise on each rank, row-wise and
    data-parallel over all ranks, column-wise over blocks of 2, 4, … ranks whose count divides the
    embedding dimension."""
    everyone = tuple(range(world))
    out = [Shard("table_wise", (r,)) for r in range(world)]
    if world > 1:
        out.append(Shard("row_wise", everyone))
    out.append(Shard("data_parallel", everyone))
    k = 2
    while k <= world and world % k == 0 and table.embedding_dim % k == 0:
        out += [Shard("column_wise", tuple(range(s, s + k))) for s in range(0, world, k)]
        k *= 2
    return out


def distinct_candidates(shards: list[Shard], chosen: dict[str, Shard], world: int) -> list[Shard]:
    """`shards` less those a rank permutation makes the same step as an earlier one: a table- or
    column-wise candidate whose ranks carry the same loads (rank_loads of `chosen`) as an earlier one's
    of its strategy. The step is symmetric in the ranks: a rank's work depends on its load alone, and
    every collective of the step spans every rank (the cores ranks share are modelled on one node only,
    where all ranks share them alike). So the greedy planner's choice is unchanged (the first of equals,
    as before) while it prices a few classes of ranks instead of every rank: on 128 GPUs, 26 tables,
    ~10 candidates a table instead of 257."""
    load = rank_loads(chosen, world)
    seen: set[tuple] = set()
    out = []
    for shard in shards:
        if shard.strategy in ("row_wise", "data_parallel"):  # one candidate each, over every rank
            out.append(shard)
            continue
        key = (shard.strategy, len(shard.ranks), tuple(sorted(load[r] for r in shard.ranks)))
        if key not in seen:
            seen.add(key)
            out.append(shard)
    return out


def same_step_key(plan: dict[str, Shard], world: int) -> tuple:
    """What a rank permutation leaves of a plan: its row-wise and data-parallel tables (every rank alike) and
    its ranks' loads (rank_loads) as a multiset. Two plans of one key are the same step (distinct_candidates:
    the step is symmetric in the ranks), the ranks of a table- or column-wise shard being those whose loads
    name it."""
    spread = ("row_wise", "data_parallel")
    everyone = tuple(sorted((name, s.strategy) for name, s in plan.items() if s.strategy in spread))
    return everyone, tuple(sorted(rank_loads(plan, world)))


def tail_plans(order: list[EmbeddingTable], chosen: dict[str, Shard], world: int) -> list[dict[str, Shard]]:
    """Plans that keep the greedy choice for the first i tables of `order` (by lookup traffic, largest first) and give
    the rest one strategy together: table-wise round-robin over the ranks, row-wise or data-parallel, for i = 1 …
    n − 1. The greedy planner places one table at a time, so the first of many small tables it would make table-wise
    pays a whole new pooled all-to-all alone and it picks row-wise instead, though all of them table-wise share that
    exchange and their table-batched lookups (user probe 12: one 200M-row table and ten of 100 rows on 8 H100, greedy
    2.16 ms; the huge table row-wise and the small ones table-wise, 1.61 ms)."""
    everyone = tuple(range(world))
    out = []
    for i in range(1, len(order)):
        head = {t.name: chosen[t.name] for t in order[:i]}
        for kind in ("table_wise", "row_wise", "data_parallel"):
            if kind == "row_wise" and world == 1:
                continue
            rest = {
                t.name: Shard("table_wise", (j % world,)) if kind == "table_wise" else Shard(kind, everyone)
                for j, t in enumerate(order[i:])
            }
            out.append(head | rest)
    return out


def _rank_key(step: DLRMStep) -> tuple[bool, float, float]:
    """How the planner orders plans: those that fit first, then the faster, then, at equal step times (a host-bound
    step, where a rank's table-batched lookups cost one operator however many tables it holds), the one that holds
    less on its fullest GPU."""
    return not step.fits, step.step_time_s, step.memory_per_gpu_bytes


@dataclass(frozen=True)
class ShardingResult:
    plans: list[tuple[dict[str, Shard], DLRMStep]]  # fastest first, plans that fit before those that do not
    method: str  # exhaustive | greedy
    evaluated: int  # plans priced


def plan_sharding(
    model: DLRMConfig,
    system: SystemConfig,
    batch_per_rank: int,
    exhaustive_limit: int = 4096,
    calibration: dict[str, Any] | None = None,
    index_counts: dict[str, IndexSample] | None = None,
) -> ShardingResult:
    """The fastest shardings (_rank_key), priced by dlrm_step: every combination when there are at most
    `exhaustive_limit` (one of each set a rank permutation makes the same step, same_step_key), else greedily
    (tables by lookup traffic, largest first, each given the
    candidate with the least step time of the plan so far among those that fit), and beside it the fastest of its
    tail_plans and the uniform plans (all table-wise round-robin, all row-wise, all data-parallel)."""
    world = system.num_gpus
    options = {t.name: candidate_shards(t, world) for t in model.tables}
    combos = 1
    for shards in options.values():
        combos *= len(shards)
    priced: list[tuple[dict[str, Shard], DLRMStep]] = []
    if combos <= exhaustive_limit:
        seen: set[tuple] = set()
        for choice in itertools.product(*options.values()):
            plan = dict(zip(options, choice, strict=True))
            key = same_step_key(plan, world)
            if key not in seen:  # the first of the plans a rank permutation makes the same step
                seen.add(key)
                priced.append((plan, dlrm_step(model, system, plan, batch_per_rank, calibration, index_counts)))
        method, combos = "exhaustive", len(priced)
    else:
        chosen: dict[str, Shard] = {}
        evaluated = 0
        order = sorted(model.tables, key=lambda t: -t.pooling_factor * t.embedding_dim)
        for t in order:
            best: tuple[bool, float, float, Shard] | None = None
            for shard in distinct_candidates(options[t.name], chosen, world):
                plan = {**chosen, t.name: shard}
                step = dlrm_step(model, system, plan, batch_per_rank, calibration, index_counts, every_rank=False)
                evaluated += 1
                key = (*_rank_key(step), shard)
                if best is None or key[:3] < best[:3]:
                    best = key
            assert best is not None
            chosen[t.name] = best[3]
        everyone = tuple(range(world))
        uniform = [
            {t.name: Shard("table_wise", (i % world,)) for i, t in enumerate(model.tables)},
            {t.name: Shard("data_parallel", everyone) for t in model.tables},
        ]
        if world > 1:
            uniform.append({t.name: Shard("row_wise", everyone) for t in model.tables})
        tails = [
            (p, dlrm_step(model, system, p, batch_per_rank, calibration, index_counts, every_rank=False))
            for p in tail_plans(order, chosen, world)
        ]
        evaluated += len(tails)
        best_tail = [min(tails, key=lambda ps: _rank_key(ps[1]))[0]] if tails else []
        plans = [chosen]
        plans += [p for p in [*best_tail, *uniform] if p not in plans]  # the greedy choice can be one of them
        priced = [(p, dlrm_step(model, system, p, batch_per_rank, calibration, index_counts)) for p in plans]
        method, combos = "greedy", evaluated + len(plans)
    priced.sort(key=lambda ps: _rank_key(ps[1]))
    if not priced[0][1].fits:
        least = min(step.memory_per_gpu_bytes for _, step in priced)
        raise ValueError(
            f"no sharding fits: the least memory per GPU of the plans tried is {least / 2**30:.1f} GiB (with its "
            f"reserve: {describe_reserve(system.gpu)}), {system.gpu.hbm_bytes / 2**30:.1f} GiB on "
            f"{system.gpu.name} (more GPUs, or smaller tables)"
        )
    return ShardingResult(priced, method, combos)
