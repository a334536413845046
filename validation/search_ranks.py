"""Where the plans practitioners published rank in `itercast search` over the same problem.

    python validation/search_ranks.py            # reads $ITERCAST_DATA or ../shared/data

For each distinct published configuration of ../shared/data/step_times (model, GPU count, global
batch, dtype; the rows validation/step_times.py reads), the search enumerates every plan of that
problem that fits (the recipe's shared fields: fused attention, the row's optimizer and gradient dtype)
and prices it with the fast path. Printed: the published plan's rank among the fitting plans (1 =
fastest), its percentile, and how much slower itercast predicts it to be than the plan it ranks
first. A published plan far from the top means either a better plan exists or the model misjudges
what practitioners know; the measured step times (validation/step_times.py) tell which. A
negative slowdown with "fits: NO" is a published plan that ran but that our memory model puts over
the GPU's memory (so the search does not offer it).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_times import RECIPE, Row, dgxc_rows, megatron_rows, nemo_rows

from itercast.config.job import Job, parse_section
from itercast.data_paths import shared_data_dir
from itercast.errors import ConfigError
from itercast.parallel.plan_table import PlanTable
from itercast.search.fast_estimate import FastEstimator
from itercast.search.plan_space import SpaceOptions, enumerate_plans

SHARED = {k: v for k, v in RECIPE.items() if k in ("flash_attention",)}


def rank(row: Row) -> tuple[int, int, float, bool] | None:
    """(rank of the published plan among fitting plans, fitting plans, predicted slowdown vs the best,
    whether our memory model says the published plan fits)."""
    system_raw = {"preset": "dgx-h100", "num_nodes": row.gpus // 8}
    try:
        job = Job.from_dicts(row.model, row.plan, system_raw)
    except ConfigError:
        return None
    model, system = job.model, job.system
    # the source's switches and optimizer, for every plan
    kept = ("grad_reduce_dtype", "main_params", "adam_state_dtype", "tp_comm_overlap_sms")
    optimizer = {k: row.plan[k] for k in kept if k in row.plan}
    switches = {**SHARED, "tp_comm_overlap": row.plan.get("tp_comm_overlap", False), **optimizer}
    base = parse_section("plan", {**switches, "dtype": row.plan["dtype"], "global_batch_size": job.plan.gbs})
    table, _ = enumerate_plans(model, system, base, row.gpus, SpaceOptions())  # type: ignore[arg-type]
    fe = FastEstimator(model, system)
    est = fe.evaluate(table)
    fits = est["fits"]
    published = fe.evaluate(PlanTable.of_jobs([job.__class__(model, job.plan.model_copy(update=switches), system)]))
    mine = float(published["step_time_s"][0])
    times = est["step_time_s"][fits]
    if not times.size:
        return None
    return int((times < mine).sum()) + 1, int(times.size), mine / float(times.min()) - 1, bool(published["fits"][0])


def main() -> None:
    data = shared_data_dir()
    if data is None:
        print("no shared data (set ITERCAST_DATA or place ../shared/data beside the repo): nothing to validate")
        return
    seen: set[str] = set()
    results = []
    print(f"{'source':18} {'configuration':58} {'rank':>7} {'of':>7} {'pct':>6} {'slower':>7}  fits")
    for row in dgxc_rows(data) + nemo_rows(data) + megatron_rows(data):
        key = f"{row.source} {row.model} {sorted(row.plan.items())} {row.gpus}"
        if row.skipped or key in seen:
            continue
        seen.add(key)
        found = rank(row)
        if found is None:
            continue
        r, n, slower, fits = found
        results.append((r, n, slower))
        print(
            f"{row.source:18} {row.label[:58]:58} {r:7d} {n:7d} {r / n:6.1%} {slower:+7.1%}  {'yes' if fits else 'NO'}"
        )
    pct = [r / n for r, n, _ in results]
    slow = [s for *_, s in results]
    print(
        f"\n{len(results)} published configurations: median percentile {statistics.median(pct):.1%}, "
        f"in the top 1%: {np.mean(np.array(pct) <= 0.01):.0%}, top 10%: {np.mean(np.array(pct) <= 0.10):.0%}; "
        f"predicted slower than the search's best by median {statistics.median(slow):+.1%}, worst {max(slow):+.1%}"
    )


if __name__ == "__main__":
    main()
