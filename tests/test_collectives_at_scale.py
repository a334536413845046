"""validation/collectives_at_scale.py: a transcribed row's measured time, the bands it is summed in,
and the transcribed public points' own integrity (every row sourced, a time or a busbw each)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
import collectives_at_scale as cas

from itercast.data_paths import read_csv_rows


def test_a_log_row_is_its_printed_out_of_place_time() -> None:
    # NVIDIA/nccl#1469's 8-byte line: 72.01 us out of place
    assert cas.measured_time_s("all_reduce", 8, 128, "72.01", "0.00") == pytest.approx(72.01e-6)


def test_a_stated_all_reduce_busbw_becomes_size_times_bus_factor_over_busbw() -> None:
    # 512 MiB over 1984 ranks at 350 GB/s: 536870912 B x 2 x 1983 / 1984 = 1073200623.5 B of bus
    # bytes (1073741824 - 1073741824 / 1984 = 1073741824 - 541200.516); / 350e9 B/s = 3.066287e-3 s
    assert cas.measured_time_s("all_reduce", 536870912, 1984, "", "350") == pytest.approx(1073200623.48 / 350e9)
    assert cas.measured_time_s("all_reduce", 536870912, 1984, "", "350") == pytest.approx(3.066287e-3, rel=1e-6)


def test_a_stated_reduce_scatter_busbw_uses_the_ring_factor_n_minus_1_over_n() -> None:
    # 8 GiB over 1024 ranks at 260 GB/s: 8589934592 x 1023 / 1024 = 8589934592 - 8388608 = 8581545984 B
    # of bus bytes; / 260e9 B/s = 0.0330059461 s
    assert cas.measured_time_s("reduce_scatter", 8 << 30, 1024, "", "260") == pytest.approx(8581545984 / 260e9)


def test_bands_are_half_open_on_their_upper_edge() -> None:
    assert cas.band(10, cas.NODE_BANDS) == "2-10"
    assert cas.band(11, cas.NODE_BANDS) == "11-32"
    assert cas.band(248, cas.NODE_BANDS) == ">128"
    assert cas.band(1048575, cas.SIZE_BANDS) == "<1MiB"
    assert cas.band(1048576, cas.SIZE_BANDS) == "1-64MiB"
    assert cas.band(64 * 1048576, cas.SIZE_BANDS) == ">=64MiB"
    with pytest.raises(ValueError):
        cas.band(1, cas.NODE_BANDS)


def test_every_transcribed_point_names_its_source_and_carries_a_time_or_a_busbw() -> None:
    rows = read_csv_rows(cas.POINTS)
    assert rows
    for r in rows:
        assert r["url"].startswith("https://github.com/NVIDIA/")
        assert r["evidence"] in ("log", "stated")
        assert r["collective"] in cas.BUS_FACTOR
        assert int(r["nodes"]) >= 2
        if r["evidence"] == "log":
            assert float(r["oop_time_us"]) > 0 and float(r["size_B"]) > 0
        else:
            assert not r["oop_time_us"] and float(r["busbw_GBs"]) > 0


def test_the_aws_efa_rows_are_the_sources_grid_and_a_busbw_becomes_a_time() -> None:
    """crazyguitar/aws-gpu-communication-benchmark: all-gather at 32 MiB-2 GiB (7 sizes) and all-reduce at 32 MiB-8 GiB
    (9) on 2, 4, 8, 16 and 32 nodes of 8 H100: 80 rows. Its 32-node all-gather of 32 MiB at 12.38 GB/s: 33554432 x
    255 / 256 = 33423360 bus bytes, 2.6998 ms, 10.59 us for each of the ring's 255 steps."""
    rows = read_csv_rows(cas.EFA_POINTS)
    assert len(rows) == 80
    grid = {(r["collective"], int(r["nodes"]), int(r["size_B"]) >> 20) for r in rows}
    assert len(grid) == 80 and {n for _, n, _ in grid} == {2, 4, 8, 16, 32}
    assert {mb for k, _, mb in grid if k == "all_gather"} == {32, 64, 128, 256, 512, 1024, 2048}
    assert {mb for k, _, mb in grid if k == "all_reduce"} == {32, 64, 128, 256, 512, 1024, 2048, 4096, 8192}
    assert all(r["evidence"] == "table" and r["gpus_per_node"] == "8" and float(r["busbw_GBs"]) > 0 for r in rows)
    (row,) = [r for r in rows if (r["collective"], r["nodes"], r["size_B"]) == ("all_gather", "32", "33554432")]
    seconds = cas.measured_time_s("all_gather", 33554432, 256, row["oop_time_us"], row["busbw_GBs"])
    assert seconds == pytest.approx(33423360 / 12.38e9) and seconds / 255 == pytest.approx(10.587e-6, rel=1e-3)
