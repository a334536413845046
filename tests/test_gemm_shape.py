"""A GEMM's waves over the SMs (tools/gemm_waves.py: an analysis kept out of the cost model), by hand:
wave_efficiency = tiles / (SMs · ceil(tiles / SMs)) · the share of its 128 × 128 tiles inside the m × n output."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from gemm_waves import wave_efficiency

SMS = 132  # H100 SXM5


def test_two_full_waves_fill_every_sm():
    # 1536 × 2816: 12 × 22 = 264 tiles = 132 · 2, two full waves, every tile full
    assert float(wave_efficiency(1536, 2816, SMS)) == pytest.approx(1.0)


def test_one_tile_past_a_wave_pays_a_second_wave():
    # 896 × 2432: 7 × 19 = 133 tiles = 1.0076 waves -> 2 waves, 133 / 264 = 0.503788 of their slots
    assert float(wave_efficiency(896, 2432, SMS)) == pytest.approx(133 / 264)


def test_partial_edge_tiles_count_their_padding():
    # 1537 × 2816: ceil(1537/128) = 13 rows of tiles × 22 = 286 tiles -> 3 waves (396 slots): 286/396;
    # the 13th row holds 1 of its 128 rows: 1537 / 1664 of the tiles' area -> 0.722222 × 0.923678 = 0.667101
    assert float(wave_efficiency(1537, 2816, SMS)) == pytest.approx(286 / 396 * 1537 / 1664)


def test_batched_outputs_share_the_waves():
    # 2 × (896 × 1280): 2 × 7 × 10 = 140 tiles -> 2 waves: 140 / 264
    assert float(wave_efficiency(896, 1280, SMS, batch=2)) == pytest.approx(140 / 264)
