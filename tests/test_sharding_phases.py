"""validation/sharding_phases.py's phases: every task of a model-built DLRM step is measured in one phase
of the measured step (tools/measure_dlrm_sharding.ShardedDLRM._mark), or is one the phases cannot time."""

from __future__ import annotations

import sys
from pathlib import Path

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
