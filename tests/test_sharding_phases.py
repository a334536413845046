"""validation/sharding_phases.py's phases: every task of a model-built DLRM step is measured in one phase
of the measured step (tools/measure_dlrm_sharding.ShardedDLRM._mark), or is one the phases cannot time."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
from sharding_phases import PHASES
from test_dlrm import model, system
from test_golden import linear_calibration

from itercast.workloads.dlrm import Shard, dlrm_step, no_overheads

#: tasks no phase of the measured step times alone: the indices are not distributed there (each rank draws
#: them), and the all-reduce runs beside the exchange and the updates (its phase is only its exposed wait)
UNTIMED = {"index_exchange", "grad_all_reduce"}


def test_every_task_of_the_step_falls_in_one_measured_phase():
    m = model(tables=3)
    plan = {"t0": Shard("row_wise", (0, 1)), "t1": Shard("table_wise", (1,)), "t2": Shard("data_parallel", (0, 1))}
    g = dlrm_step(m, system(2), plan, 8, linear_calibration(), host_overheads=no_overheads()).graph
    names = {g.names[i] for i in set(g.name.tolist())}
    spanned = [t for tasks in PHASES.values() for t in tasks]
    assert len(spanned) == len(set(spanned))  # no task in two phases
    assert names - UNTIMED == set(spanned)


def test_rescaled_scales_one_familys_intercept_and_slopes_and_leaves_the_rest():
    from sharding_phases import rescaled

    fwd = {"alpha_s": 1e-3, "s_per_lookup": 2e-6, "s_per_gathered_byte": 4e-9, "cache_bytes": 5.0}
    cal = {
        "operators": {"models": {"aten::_embedding_bag:embedding_bag_fwd": dict(fwd), "aten::mm:mm": {"alpha_s": 7.0}}}
    }
    out = rescaled(cal, {"embedding_bag_fwd": (0.1, 3.0)})
    got = out["operators"]["models"]["aten::_embedding_bag:embedding_bag_fwd"]
    assert got == pytest.approx(
        {"alpha_s": 1e-4, "s_per_lookup": 6e-6, "s_per_gathered_byte": 12e-9, "cache_bytes": 5.0}
    )
    assert out["operators"]["models"]["aten::mm:mm"] == {"alpha_s": 7.0}
    assert cal["operators"]["models"]["aten::_embedding_bag:embedding_bag_fwd"] == fwd  # the input is not changed


def test_in_step_scales_recover_the_scales_the_phases_were_made_with():
    """Phases made from the planner's own parts with known scales, a = 0.5 on the intercepts and b = 2 on
    the rest of the lookup's price (0.25 and 1.5 for the update): measured = rest + a·intercepts + b·slopes
    on every rank of three seed-29 proposals; the fit must return those scales."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from measure_sharding_tasks import draw_tasks, planner_calibration
    from sharding_phases import IN_STEP, in_step_scales, predicted_phases_ms, rescaled

    cal = planner_calibration(in_step=None)
    tasks = draw_tasks(3, 29)
    shardings = {
        0: "f2:table_wise:1 f9:table_wise:0 f11:table_wise:0 f19:table_wise:1 f23:table_wise:1 f25:table_wise:1"
    }
    shardings |= {1: " ".join(f"{t.name}:row_wise:0-1" for t in tasks[1].model().tables)}
    shardings |= {2: " ".join(f"{t.name}:data_parallel:0-1" for t in tasks[2].model().tables[:1])}
    shardings[2] += " " + " ".join(f"{t.name}:table_wise:{i % 2}" for i, t in enumerate(tasks[2].model().tables[1:]))
    want = {"embedding_bag_fwd": (0.5, 2.0), "embedding_bag_update": (0.25, 1.5)}
    rows = []
    for n, sharding in shardings.items():
        made = predicted_phases_ms(rescaled(cal, want), tasks[n], sharding)
        for (rank, phase), ms in made.items():
            if phase in IN_STEP.values():
                rows.append(
                    {
                        "seed": "29",
                        "task": str(n),
                        "sharding": sharding,
                        "rank": str(rank),
                        "phase": phase,
                        "median_ms": str(ms),
                    }
                )
    got = in_step_scales(cal, rows)
    for op, (a, b) in want.items():
        assert got[op] == pytest.approx((a, b), rel=1e-6)
