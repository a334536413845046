"""A100's and V100's intra-node all-reduces on their own curves (curves.json collectives.intra_node_by_gpu), not
on the H100 node's, whose NVSwitch reduces in the switch (NVLink SHARP); a calibration's measured curve still wins.
Expected values: measured bus bandwidths typed from the sources, and times worked out by hand."""

from __future__ import annotations

import pytest

from itercast.config.job import parse_section
from itercast.config.system import SystemConfig
from itercast.costs.analytic import AnalyticCostModel
from itercast.hardware.topology import place_group
from itercast.profile.calibrate import merge_calibration

GIB = 2**30
EIGHT = place_group(8, 1, 8)


def model(preset: str, calibration: dict | None = None) -> AnalyticCostModel:
    system = parse_section("system", {"preset": preset}, "system")
    assert isinstance(system, SystemConfig)
    return AnalyticCostModel(system, "bf16", calibration)


@pytest.mark.parametrize(
    ("preset", "busbw_gb_s"),
    [
        # Azure AI-benchmarking-guide nccl-tests, 8 GPUs of one VM, 1 GiB all-reduce, in-place bus bandwidth:
        # ND A100 v4 228 GB/s (NVLink3, 300 GB/s links), ND H100 v5 466 GB/s (NVLink SHARP on 450 GB/s links)
        ("dgx-a100", 228.0),
        ("dgx-h100", 466.0),
        # Alpa's OSDI'22 profiling database, one p3.16xlarge, all 8 V100 in one group, fp16 all-reduce of 1 GiB:
        # 14.562 ms less the 0.209 ms its harness takes for 0 bytes, so 1,879,048,192 bus bytes in 14.353 ms at
        # 130.9 GB/s (NVLink2, 150 GB/s links)
        ("v100-p3.16xlarge", 130.9),
    ],
)
def test_a_one_node_all_reduce_runs_at_its_gpus_measured_bus_bandwidth(preset, busbw_gb_s):
    # bus bytes 2 × 7/8 × 1 GiB = 1,879,048,192 B: 8.24 ms at 228 GB/s, 4.03 ms at 466 GB/s
    measured_s = 2 * 7 / 8 * GIB / (busbw_gb_s * 1e9)
    assert model(preset).collective_s("all_reduce", GIB, EIGHT) == pytest.approx(measured_s, rel=0.10)


@pytest.mark.parametrize(("preset", "links_bytes_per_s"), [("dgx-a100", 300e9), ("v100-p3.16xlarge", 150e9)])
def test_an_all_reduce_without_in_switch_reduction_is_no_faster_than_its_links(preset, links_bytes_per_s):
    # at 8 GiB the ring's 2 × 7/8 × 8 GiB bus bytes take at least 50.1 ms over A100's 300 GB/s links, 100.2 ms
    # over V100's 150 GB/s (the H100 node's curve, e_max 1.22 with NVLink SHARP, would not hold to either)
    assert model(preset).collective_s("all_reduce", 8 * GIB, EIGHT) >= 2 * 7 / 8 * 8 * GIB / links_bytes_per_s


def test_a_calibrations_measured_intra_node_all_reduce_wins_over_the_built_in_a100_curve():
    # a measured curve: 10 µs + bus bytes / (300 GB/s × 0.5) (gamma 1, log_half 1: the ramp is within 1e-9 of
    # its top at 1.9 GB)
    flat = {"alpha0_s": 10e-6, "e_max": 0.5, "log_half": 1.0, "gamma": 1.0}
    calibration = merge_calibration({"system": "dgx-a100", "collectives": {"intra_node": {"all_reduce": flat}}})
    bus = 2 * 7 / 8 * GIB
    assert model("dgx-a100", calibration).collective_s("all_reduce", GIB, EIGHT) == pytest.approx(
        10e-6 + bus / 150e9, rel=1e-6
    )
    # one that measured only the GEMMs keeps the A100's own all-reduce
    gemms_only = merge_calibration({"system": "dgx-a100"})
    assert model("dgx-a100", gemms_only).collective_s("all_reduce", GIB, EIGHT) == pytest.approx(
        model("dgx-a100").collective_s("all_reduce", GIB, EIGHT), rel=1e-12
    )
