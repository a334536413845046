"""A node whose GPUs are joined by direct links (the p3.16xlarge's and DGX-1's hybrid cube-mesh): a group rides
the links its GPUs have to each other, not the GPU's six. Expected values: link counts read off `nvidia-smi topo
-m` as typed below, and Alpa's measured all-reduces typed from its profiling database."""

from __future__ import annotations

import numpy as np
import pytest

from itercast.config.job import parse_section
from itercast.config.system import NodeSpec, SystemConfig
from itercast.costs.analytic import AnalyticCostModel
from itercast.costs.fitting import collective_time_s
from itercast.errors import ConfigError
from itercast.hardware.topology import pair_groups, place_group
from itercast.measurements import Measurement
from itercast.profile.calibrate import calibrate, merge_calibration
from itercast.profile.db import ProfileDB

GIB = 2**30

# nvidia-smi topo -m on 8 V100-SXM2 "close to a DGX-1" (Oneflow-Inc/OneFlow-Benchmark's reports): NV1 = 1, NV2 = 2,
# SYS = 0; six links a GPU, 25 GB/s each way
CUBE_MESH = (
    (0, 1, 1, 2, 2, 0, 0, 0),
    (1, 0, 2, 1, 0, 2, 0, 0),
    (1, 2, 0, 2, 0, 0, 1, 0),
    (2, 1, 2, 0, 0, 0, 0, 1),
    (2, 0, 0, 0, 0, 1, 1, 2),
    (0, 2, 0, 0, 1, 0, 2, 1),
    (0, 0, 1, 0, 1, 2, 0, 2),
    (0, 0, 0, 1, 2, 1, 2, 0),
)


#: 4 GPUs in a ring, 2 links between neighbours, none between GPUs 2 apart
RING_OF_FOUR = ((0, 2, 0, 2), (2, 0, 2, 0), (0, 2, 0, 2), (2, 0, 2, 0))


def four_gpus(links, host_bytes_per_s: float = 6e9) -> NodeSpec:
    # 100 GB/s a GPU: 25 GB/s a link where a GPU has 4, 100 where it has 1
    return NodeSpec(
        gpus_per_node=4,
        intra_node_bandwidth_bytes_per_s=100e9,
        nvlink_links=links,
        host_path_bandwidth_bytes_per_s=host_bytes_per_s,
    )


def mesh(links=CUBE_MESH) -> NodeSpec:
    # 6 GB/s a GPU through the host: a round number for the hand computations below, not the preset's
    return NodeSpec(
        gpus_per_node=8, intra_node_bandwidth_bytes_per_s=150e9, nvlink_links=links, host_path_bandwidth_bytes_per_s=6e9
    )


@pytest.mark.parametrize(
    ("size", "stride", "gb_s"),
    [
        (2, 1, 25.0),  # {0,1}: NV1, {2,3}: NV2 -> the worst pair's 1 link, 25 GB/s
        (2, 4, 25.0),  # {0,4}, {1,5}: NV2 but {2,6}, {3,7}: NV1
        (4, 1, 100.0),  # {0,1,2,3}: GPU 0 has 1 + 1 + 2 links to the others, GPU 1 1 + 2 + 1, GPUs 2 and 3 five
        (4, 2, 50.0),  # {0,2,4,6}: GPU 2 has 1 to GPU 0 and 1 to GPU 6, none to 4
        (8, 1, 150.0),  # the whole node: every GPU's six
        # {0,6} and {1,7} (an embedding group's pairs): no link, and no GPU between them in their communicator: the
        # 6 GB/s host path (not 0 -> 2 -> 6's 1 link, GPU 2 being outside the group)
        (2, 6, 6.0),
        # {0,7}: no link; the host path (not 0 -> 4 -> 7's 2)
        (2, 7, 6.0),
    ],
)
def test_a_group_rides_the_links_its_worst_joined_gpu_has_to_the_rest(size, stride, gb_s):
    assert mesh().group_bandwidth_bytes_per_s(size, stride) == pytest.approx(gb_s * 1e9, rel=1e-12)


def test_a_gpu_without_a_link_to_its_group_rides_the_host_path_even_beside_linked_ones():
    # {0,5,6,7} is no group Megatron lays out, so a node of 4 GPUs whose GPU 0 has no link to the other three (which
    # are joined by 2 links each): GPU 0 on the 6 GB/s host path, not 2 links' 50
    lone = four_gpus(((0, 0, 0, 0), (0, 0, 2, 2), (0, 2, 0, 2), (0, 2, 2, 0)))
    assert lone.group_bandwidth_bytes_per_s(4, 1) == pytest.approx(6e9, rel=1e-12)
    # a host path faster than the links a GPU has (not the p3.16xlarge's): the linked GPU's 1 link still bounds it
    fast_host = four_gpus(((0, 0, 0, 1), (0, 0, 1, 0), (0, 1, 0, 0), (1, 0, 0, 0)), 40e9)
    assert fast_host.group_bandwidth_bytes_per_s(2, 1) == pytest.approx(40e9, rel=1e-12)  # {0,1}, {2,3}: none
    assert fast_host.group_bandwidth_bytes_per_s(4, 1) == pytest.approx(100e9, rel=1e-12)  # one link: 100 / 1


def test_a_node_of_fewer_gpus_than_its_mesh_uses_the_links_among_its_first_ones():
    # a job on GPUs 0-3 of the p3.16xlarge (gpus_per_node 4): still 25 GB/s a link (six a GPU in the matrix), the
    # four GPUs on GPU 0's 4 links to the others, pairs 2 apart ({0,2}, {1,3}) on 1; on GPUs 0 and 1, their 1 link
    first_four = NodeSpec(gpus_per_node=4, intra_node_bandwidth_bytes_per_s=150e9, nvlink_links=CUBE_MESH)
    assert first_four.group_bandwidth_bytes_per_s(4, 1) == pytest.approx(100e9, rel=1e-12)
    assert first_four.group_bandwidth_bytes_per_s(2, 2) == pytest.approx(25e9, rel=1e-12)
    first_two = NodeSpec(gpus_per_node=2, intra_node_bandwidth_bytes_per_s=150e9, nvlink_links=CUBE_MESH)
    assert first_two.group_bandwidth_bytes_per_s(2, 1) == pytest.approx(25e9, rel=1e-12)
    assert first_two.pair_bandwidth_bytes_per_s(1) == pytest.approx(25e9, rel=1e-12)


def test_a_switch_gives_every_group_the_gpus_whole_bandwidth():
    switch = NodeSpec(gpus_per_node=8, intra_node_bandwidth_bytes_per_s=300e9)
    assert switch.group_bandwidth_bytes_per_s(2, 1) == 300e9
    assert switch.group_bandwidth_bytes_per_s(4, 2) == 300e9


def test_the_placement_of_a_group_carries_how_far_apart_its_gpus_sit():
    assert place_group(4, 2, 8).stride == 2  # data parallel over tp 2: {0,2,4,6}
    assert place_group(4, 8, 8).stride == 1  # one GPU a node: nothing to space
    assert pair_groups(6, 2, 8).stride == 6


@pytest.mark.parametrize(
    ("size", "stride", "busbw_gb_s"),
    [
        # Alpa's p3.16xlarge profiling database, fp16 all-reduce of 1 GiB less its harness's time at 0 bytes:
        # GPUs {0,1}: 48.050 - 0.050 ms, 1 GiB of bus bytes at 22.4 GB/s;
        (2, 1, 22.4),
        # {0,1,2,3}: 19.863 - 0.100 ms, 2 x 3/4 GiB at 81.5 GB/s;
        (4, 1, 81.5),
        # {0,2,4,6} and {1,3,5,7} at once: 36.642 - 0.103 ms at 44.1 GB/s
        (4, 2, 44.1),
    ],
)
def test_a_p3_16xlarge_group_all_reduces_at_its_measured_bus_bandwidth(size, stride, busbw_gb_s):
    system = parse_section("system", {"preset": "v100-p3.16xlarge"}, "system")
    assert isinstance(system, SystemConfig)
    bus_bytes = 2 * (size - 1) / size * GIB
    measured_s = bus_bytes / (busbw_gb_s * 1e9)
    priced_s = AnalyticCostModel(system, "fp16").collective_s("all_reduce", GIB, place_group(size, stride, 8))
    assert priced_s == pytest.approx(measured_s, rel=0.10)  # GPUs 0-3 reach 0.82 of their links, the curve 0.91


@pytest.mark.parametrize(
    ("links", "says"),
    [
        (((0, 1), (1, 0)), r"expected 8 rows \(gpus_per_node\) or more"),
        (tuple((0,) * 8 for _ in range(8)), "nvlink_links: expected at least one link; got none"),
        (
            tuple(tuple(3 if (i, j) == (0, 1) else v for j, v in enumerate(row)) for i, row in enumerate(CUBE_MESH)),
            "symmetric",
        ),
    ],
)
def test_a_link_matrix_that_is_no_mesh_is_refused_in_one_line(links, says):
    node = {"gpus_per_node": 8, "intra_node_bandwidth_bytes_per_s": 150e9, "nvlink_links": [list(r) for r in links]}
    with pytest.raises(ConfigError, match=says):
        parse_section("system", {"preset": "v100-p3.16xlarge", "node": node}, "system")


@pytest.mark.parametrize(
    ("stride", "gb_s"),
    [
        # every GPU to the one after it: {0,1} NV1, {1,2} NV2 ... but {3,4} no link: the worst pair on the whole
        # 6 GB/s host path (not 2 links through GPU 0, a ring's path)
        (1, 6.0),
        (2, 6.0),  # {2,4} no link
        (4, 25.0),  # {0,4}, {1,5} NV2 (50 GB/s), but {2,6}, {3,7} NV1: the worst pair's 25
    ],
)
def test_a_send_rides_the_pairs_links_or_the_host_path(stride, gb_s):
    assert mesh().pair_bandwidth_bytes_per_s(stride) == pytest.approx(gb_s * 1e9, rel=1e-12)


def test_a_send_between_neighbours_with_two_links_rides_both():
    # a ring of 4 GPUs with 2 links between neighbours (4 a GPU, 25 GB/s a link): neighbours 2 × 25 GB/s, 2 apart no
    # link: the host path, for a send and for a ring of the two alike (no GPU between them in their communicator); a
    # ring over all four rides 2 links each way a GPU
    ring = four_gpus(RING_OF_FOUR)
    assert ring.pair_bandwidth_bytes_per_s(1) == pytest.approx(50e9, rel=1e-12)
    assert ring.pair_bandwidth_bytes_per_s(2) == pytest.approx(6e9, rel=1e-12)
    assert ring.group_bandwidth_bytes_per_s(2, 2) == pytest.approx(6e9, rel=1e-12)
    assert ring.group_bandwidth_bytes_per_s(4, 1) == pytest.approx(100e9, rel=1e-12)


def test_a_pipeline_send_in_a_p3_16xlarge_is_no_faster_than_one_link():
    # 1 GiB from each GPU to the one 4 on (every such pair linked) over 25 GB/s takes at least 42.9 ms; the node's
    # six links would allow 7.2
    system = parse_section("system", {"preset": "v100-p3.16xlarge"}, "system")
    assert isinstance(system, SystemConfig)
    assert AnalyticCostModel(system, "fp16").p2p_s(GIB, False, 4) >= GIB / 25e9


@pytest.mark.parametrize(
    ("stride", "want_s"),
    [
        # the 2-GPU all-to-all curve (curves.json mesh_alltoall: 18.180 µs, e_max 0.565157, gamma 1.334325, log_half
        # 14.869089) over one link, 25 GB/s, its ramp on 150 / 25 = 6 times the bytes: ln 6,291,456 = 15.654703,
        # e = 0.565157 / (1 + e^(1.334325 × (14.869089 − 15.654703))) = 0.418464;
        # 18.180 µs + 1,048,576 B / (25e9 × 0.418464) = 18.180 + 100.231 µs
        (4, 118.41e-6),
        # GPUs 3 and 4 have no link: the preset's 4.96 GB/s host path, ramp on 150 / 4.96 = 30.2419 times the bytes:
        # ln 31,710,968 = 17.272173, e = 0.565157 / (1 + e^(1.334325 × (14.869089 − 17.272173))) = 0.543160;
        # 18.180 µs + 1,048,576 B / (4.96e9 × 0.543160) = 18.180 + 389.22 µs
        (1, 407.40e-6),
    ],
)
def test_a_pipeline_send_of_one_mib_on_a_p3_16xlarge_by_hand(stride, want_s):
    system = parse_section("system", {"preset": "v100-p3.16xlarge"}, "system")
    assert isinstance(system, SystemConfig)
    assert AnalyticCostModel(system, "fp16").p2p_s(2**20, False, stride) == pytest.approx(want_s, rel=1e-3)


def test_a_calibration_on_a_mesh_prices_each_measured_layout_on_its_own_links(tmp_path):
    """All-reduces measured on a p3.16xlarge that follow one law at each layout's links (by hand above: GPUs {0,1}
    25 GB/s, {0,1,2,3} 100, {0,2,4,6} 50, all 8 150; the ramp on 150 / that times the bytes): calibration recovers
    the law, and prices the 2-apart quads as it does, 4 links' worth slower than the neighbouring ones."""
    law = {"alpha0_s": 8e-6, "alpha_per_log2_nodes_s": 0.0, "alpha_per_log2_ranks_s": 6e-6}
    law |= {"e_max": 0.7, "log_half": 14.0, "gamma": 1.1, "ramp_of": "step"}
    layouts = {(2, 1): ([0, 1], 25e9), (4, 1): ([0, 1, 2, 3], 100e9), (4, 2): ([0, 2, 4, 6], 50e9)}
    layouts[8, 1] = (list(range(8)), 150e9)
    costs = calibrated_on_layouts(tmp_path, "all_reduce", 2.0, law, layouts)
    want = collective_time_s(law, 2 * 3 / 4 * 2**26, 1, 4, 50e9, None, 3.0)
    priced = costs.collective_s("all_reduce", 2**26, place_group(4, 2, 8))
    assert priced == pytest.approx(float(want), rel=1e-2)


@pytest.mark.parametrize(
    ("size", "stride", "gb_s"),
    [
        (2, 1, 25.0),  # {0,1}: 1 link, one peer at one link's 25 GB/s
        (4, 1, 75.0),  # {0,1,2,3}: every pair linked (by 1 or 2): 3 peers × 25
        # {0,2,4,6}: GPU 0 has no link to 6, GPU 2 none to 4: each one unlinked peer on the whole 6 GB/s host path,
        # slower than its linked ones: 3 × 6
        (4, 2, 18.0),
        (8, 1, 14.0),  # GPU 0 has no link to 5, 6 or 7: 6 GB/s shared by 3, 2 GB/s a peer: 7 × 2
        (2, 3, 6.0),  # {0,3} NV2, but {1,4} and {2,5} have no link: their one peer on the host path
    ],
)
def test_a_mesh_all_to_all_ends_with_its_slowest_peer(size, stride, gb_s):
    assert mesh().alltoall_bandwidth_bytes_per_s(size, stride) == pytest.approx(gb_s * 1e9, rel=1e-12)


def test_a_linked_peer_of_an_all_to_all_rides_every_link_of_the_pair():
    # the ring of 4 GPUs with 2 links between neighbours (25 GB/s a link): pairs {0,1} and {2,3} exchange at 2 × 25
    # GB/s; two A100s joined by 12 NVLink3 links (three NVLink bridges, 300 GB/s a GPU): 12 × 25 = 300 GB/s, not
    # one link's 25; a switch gives every all-to-all the GPU's bandwidth
    ring = four_gpus(RING_OF_FOUR)
    assert ring.alltoall_bandwidth_bytes_per_s(2, 1) == pytest.approx(50e9, rel=1e-12)
    pair = NodeSpec(gpus_per_node=2, intra_node_bandwidth_bytes_per_s=300e9, nvlink_links=((0, 12), (12, 0)))
    assert pair.alltoall_bandwidth_bytes_per_s(2, 1) == pytest.approx(300e9, rel=1e-12)
    assert pair.pair_bandwidth_bytes_per_s(1) == pytest.approx(300e9, rel=1e-12)
    switch = NodeSpec(gpus_per_node=8, intra_node_bandwidth_bytes_per_s=300e9)
    assert switch.alltoall_bandwidth_bytes_per_s(4, 2) == 300e9


def test_a_mesh_that_leaves_gpus_unlinked_needs_a_host_path():
    node = {"host_path_bandwidth_bytes_per_s": None}  # the preset's mesh without its host path
    with pytest.raises(ConfigError, match=r"host_path_bandwidth_bytes_per_s: expected .* GPUs 0 and 5 without a link"):
        parse_section("system", {"preset": "v100-p3.16xlarge", "node": node}, "system")
    # GPUs 0-3 of the same matrix are all linked: no host path to give
    first_four = NodeSpec(gpus_per_node=4, intra_node_bandwidth_bytes_per_s=150e9, nvlink_links=CUBE_MESH)
    assert first_four.alltoall_bandwidth_bytes_per_s(4, 1) == pytest.approx(75e9, rel=1e-12)


@pytest.mark.parametrize(
    ("size", "buffer_bytes", "measured_s", "within"),
    [
        # Alpa's p3.16xlarge fp16 all-to-alls (its x is the group's bytes: a rank's buffer is x / n) less the
        # harness's time at 0 bytes: GPUs {0,1}, x 1 GiB: 18.913 - 0.017 ms (the 2-GPU rows were fitted on)
        (2, 2**29, 18.913e-3 - 0.017e-3, 0.02),
        # all 8, x 1 GiB: 15.183 - 0.018 ms, held out of every fit: three peers a GPU through the host
        (8, 2**27, 15.183e-3 - 0.018e-3, 0.20),
    ],
)
def test_a_p3_16xlarge_all_to_all_is_priced_near_its_measured_time(size, buffer_bytes, measured_s, within):
    system = parse_section("system", {"preset": "v100-p3.16xlarge"}, "system")
    assert isinstance(system, SystemConfig)
    priced_s = AnalyticCostModel(system, "fp16").collective_s("alltoall", buffer_bytes, place_group(size, 1, 8))
    assert priced_s == pytest.approx(measured_s, rel=within)


def test_a_calibration_on_a_mesh_fits_all_to_alls_on_their_exchanges(tmp_path):
    """All-to-alls measured on a p3.16xlarge that follow one law at each layout's exchange bandwidth (by hand, on
    the preset's 4.96 GB/s host path: {0,1} 25 GB/s; {0,1,2,3} 3 × 25; {0,2,4,6} 3 × 4.96; all 8 7 × 4.96 / 3):
    calibration recovers the law, and the cost model prices the 2-apart quads on it as measured."""
    law = {"alpha0_s": 8e-6, "alpha_per_log2_nodes_s": 0.0, "alpha_per_log2_ranks_s": 0.0, "alpha_per_peer_s": 5e-6}
    law |= {"e_max": 0.6, "log_half": 14.0, "gamma": 1.2, "ramp_of": "step"}
    layouts = {(2, 1): ([0, 1], 25e9), (4, 1): ([0, 1, 2, 3], 75e9), (4, 2): ([0, 2, 4, 6], 3 * 4.96e9)}
    layouts[8, 1] = (list(range(8)), 7 * 4.96e9 / 3)
    costs = calibrated_on_layouts(tmp_path, "alltoall", 1.0, law, layouts)
    want = collective_time_s(law, 3 / 4 * 2**26, 1, 4, 3 * 4.96e9, None, 150e9 / (3 * 4.96e9))
    priced = costs.collective_s("alltoall", 2**26, place_group(4, 2, 8))
    assert priced == pytest.approx(float(want), rel=1e-2)


def calibrated_on_layouts(tmp_path, op: str, bus_factor: float, law: dict, layouts: dict) -> AnalyticCostModel:
    """The p3.16xlarge's cost model calibrated on `op`s measured in each layout ((ranks, stride): (first group, its
    bandwidth)) that follow `law` at that bandwidth, `bus_factor` × (ranks − 1) / ranks of a buffer its bus bytes,
    the ramp on 150 GB/s / that bandwidth times them; the fit asserted to recover the law."""
    db = ProfileDB(tmp_path / "p.db")
    rows = []
    for (ranks, _), (first, bw) in layouts.items():
        for size in np.logspace(4, 9, 11):
            t = collective_time_s(law, bus_factor * (ranks - 1) / ranks * size, 1, ranks, bw, None, 150e9 / bw)
            params = {"replica_groups": first}
            rows.append(Measurement("collective", op, float(size), float(t), "f16", ranks, 1, params=params))
    db.add(db.device("p3", {}), rows)
    system = parse_section("system", {"preset": "v100-p3.16xlarge"}, "system")
    assert isinstance(system, SystemConfig)
    doc = calibrate(db, 1, system)
    assert doc["collectives"]["intra_node"][op]["fit_mean_abs_err"] < 1e-3
    return AnalyticCostModel(system, "fp16", merge_calibration(doc))
