"""What a GEMM's shape costs beyond its FLOPs: output tiles spread over the SMs in whole waves.

A tensor-core GEMM computes its m × n output in CTA tiles of TILE_M × TILE_N, one tile per SM at a
time, so it runs ceil(tiles / SMs) waves and the last wave's idle SMs, with the padding of the
partial tiles at the edges, do no useful work:

    wave_efficiency = tiles / (SMs · ceil(tiles / SMs)) · m · n / (ceil(m / Tm)·Tm · ceil(n / Tn)·Tn)

A GEMM's time would divide by wave_efficiency ** wave_exponent (fitted: costs/curves.json gemm
bf16_shaped, tools/fit_efficiency_curves.py); the cost model does not apply it (issue 28: it beat
FLOPs alone on the kernel tables but moved the fitting table from 4.6% to 5.2% geomean).

128 × 128 is CUTLASS's Hopper example tile (NVIDIA/cutlass@6407bcd
examples/48_hopper_warp_specialized_gemm: TileShape 128×128×32) and, of the three tiles tried
(128×128, 256×128, 128×256; Ampere's default is 128×256×64: include/cutlass/gemm/device/
default_gemm_configuration.h @7c04f95, Sm80 OpClassTensorOp), the one whose fit explains the kernel
tables best; tools/gemm_waves.py has the comparison (fitted and checked on disjoint halves of XLA's
and vidur's H100 GEMMs, A100 checked at its own SM count).
"""

from __future__ import annotations

import numpy as np

TILE_M = TILE_N = 128  # CTA output tile (rows × columns), see the module docstring


def wave_fraction(tiles: np.ndarray | float, sm_count: int) -> np.ndarray:
    """Share of the SMs' wave slots that hold a tile: tiles / (SMs · ceil(tiles / SMs)), in (0, 1]."""
    t = np.asarray(tiles, dtype=np.float64)
    return t / (sm_count * np.ceil(t / sm_count))


def tile_fill(m: np.ndarray | float, n: np.ndarray | float, tile_m: int, tile_n: int) -> np.ndarray:
    """Share of the tiles' area inside the m × n output: m·n / (ceil(m/Tm)·Tm · ceil(n/Tn)·Tn)."""
    m_, n_ = np.asarray(m, dtype=np.float64), np.asarray(n, dtype=np.float64)
    return m_ * n_ / (np.ceil(m_ / tile_m) * tile_m * np.ceil(n_ / tile_n) * tile_n)


def wave_efficiency(m: np.ndarray | float, n: np.ndarray | float, sm_count: int, batch: float = 1) -> np.ndarray:
    """Useful share of the waves a `batch` × m × n output takes in TILE_M × TILE_N tiles on `sm_count` SMs."""
    m_, n_ = np.asarray(m, dtype=np.float64), np.asarray(n, dtype=np.float64)
    tiles = batch * np.ceil(m_ / TILE_M) * np.ceil(n_ / TILE_N)
    return wave_fraction(tiles, sm_count) * tile_fill(m_, n_, TILE_M, TILE_N)
