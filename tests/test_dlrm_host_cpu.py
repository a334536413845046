"""The DLRM sharding planner's host overheads on this CPU (tools/measure_sharding_tasks.py
planner_calibration): measured on another workload's traces (the MLP of tools/measure_step_times.py,
data/measured/cpu_host_overheads_mlp.json), not the sharding measurements it is checked on; values
from that file, worked by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
from measure_sharding_tasks import planner_calibration, planner_system

from itercast.workloads.dlrm import host_model


def test_the_planner_prices_this_cpus_host_from_another_workloads_traces():
    """The MLP traces' T1 is 15.779 µs (3,985 gaps between operators, cpu_host_overheads_mlp.json
    t1_us); a CPU trace makes no runtime calls, so no operator there is silent (samples t2 = 0) and
    an operator on the CPU host costs T1 alone: T2 and T3 are inside its measured time."""
    host = host_model(planner_system(), planner_calibration())
    assert host.op_s == pytest.approx(15.779e-6, rel=1e-4) and host.on_compute
    assert host.source == "other trace: data/measured/cpu_host_overheads_mlp.json"
