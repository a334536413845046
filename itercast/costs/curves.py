"""Efficiency curves fitted once from public microbenchmarks (tools/fit_efficiency_curves.py).

    eff(x) = e_max / (1 + exp(gamma · (log_half − ln x)))

The numbers and their sources live in curves.json beside this file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Curve:
    """A saturating efficiency curve in the size x (FLOPs or bytes)."""

    e_max: float
    log_half: float
    gamma: float

    def __call__(self, x: np.ndarray | float) -> np.ndarray:
        x = np.maximum(np.asarray(x, dtype=np.float64), 1.0)
        return self.e_max / (1.0 + np.exp(self.gamma * (self.log_half - np.log(x))))

    def least_time_size(self) -> float:
        """The size below which x / eff(x) grows as x shrinks (0.0 when gamma ≤ 1: it never does).

        For gamma > 1, x / eff(x) = (x + exp(gamma · log_half) · x^(1 − gamma)) / e_max has its
        minimum where x^gamma = (gamma − 1) · exp(gamma · log_half), i.e.
        ln x* = log_half + ln(gamma − 1) / gamma. A kernel does not get slower by moving fewer bytes:
        below x* the curve extrapolates its fit, not a measurement (the memory curves' gamma 1.1–1.3
        priced a 1-byte H100 elementwise op at 24 µs, one of 1 MB at 1.1 µs)."""
        if self.gamma <= 1.0:
            return 0.0
        return float(np.exp(self.log_half + np.log(self.gamma - 1.0) / self.gamma))


@cache
def curves() -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath("curves.json").read_text())


def curve(entry: dict[str, Any]) -> Curve:
    return Curve(entry["e_max"], entry["log_half"], entry["gamma"])


def own_curves(by_gpu: dict[str, Any], gpu_name: str, shared: dict[str, Any], calibrated: set[str]) -> dict[str, Any]:
    """`shared` curves (fitted on H100s) with the built-in ones fitted on this GPU's own measured kernels over
    them (`by_gpu`, matched by GPU name prefix: curves.json gemm_by_gpu, V100's GEMMs from Alpa's matmuls;
    collectives.intra_node_by_gpu, A100's all-reduce from vidur's and Azure's, V100's from Alpa's), except those
    `calibrated` names: a calibration's own curves win."""
    own: dict[str, Any] = next((v for k, v in by_gpu.items() if gpu_name.startswith(k)), {})
    return shared | {k: v for k, v in own.items() if k not in calibrated}
