"""Simulation of an ExecGraph: timing (engine), critical path and breakdown (analysis)."""

from itercast.sim.analysis import Breakdown, breakdown, critical_path
from itercast.sim.engine import SimResult, simulate

__all__ = ["Breakdown", "SimResult", "breakdown", "critical_path", "simulate"]
