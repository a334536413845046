"""What-if re-timing by hand: a matmul's FLOPs from its execution-trace shapes, and a collective
re-timed on the calibrated curves the what-if carries."""

from __future__ import annotations

import pytest
from kineto_fixtures import call, fp32_all_reduce_comms, kernel, step, write
from test_golden import linear_calibration

from itercast.replay import replay_whatif
from itercast.traces.whatif import WhatIf, matmul_flops


def test_a_linear_layers_flops_read_its_weight_as_out_by_in():
    # aten::linear(input [4, 8, 16], weight [32, 16] (out × in), bias [32]): 4 · 8 = 32 rows,
    # 2 FLOPs per multiply-add: 2 × 32 × 16 × 32 = 32,768
    assert matmul_flops("aten::linear", [[4, 8, 16], [32, 16], [32]]) == 32768


def test_addmm_multiplies_its_second_and_third_arguments_not_its_bias():
    # aten::addmm(bias [32], mat1 [4, 16], mat2 [16, 32]): 2 × 4 × 16 × 32 = 4,096
    assert matmul_flops("aten::addmm", [[32], [4, 16], [16, 32]]) == 4096
    # aten::mm(mat1 [4, 16], mat2 [16, 32]): the same product
    assert matmul_flops("aten::mm", [[4, 16], [16, 32]]) == 4096


def test_a_collective_is_retimed_on_the_what_ifs_calibrated_curves(tmp_path):
    # record_param_comms: an all-reduce of 2^20 fp32 (4,194,304 B) over 2 GPUs; on a DGX H100 (NVLink
    # 450 GB/s, 2 µs a hop) with the calibration's curves (efficiency 1, no latency): bus bytes
    # 2 × (2 − 1) / 2 × 4,194,304 = 4,194,304 B / 450e9 B/s = 9.3206756e-6 s, above the tree's floor
    # 2 × ⌈log2 2⌉ × 2 µs = 4e-6 s
    comms = fp32_all_reduce_comms(5, 20, 1 << 20, 2)
    events = [step(1, 0, 100), comms, call("cudaLaunchKernel", 10, 1, corr=1)]
    events += [kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 20, 50, corr=1), call("cudaDeviceSynchronize", 15, 60)]
    path = write(tmp_path / "t.json", events)
    _, moved, counts = replay_whatif([path], WhatIf(system="dgx-h100", curves=linear_calibration()))
    # one rank whose trace names no GPU: no wait for peers can be told apart, none is added (and that is said)
    dropped = "unmatched collectives re-timed without a wait (no wait for peers told from the transfer)"
    assert counts == {"re-timed all_reduce on dgx-h100": 1, dropped: 1}
    g = moved.sim.graph
    (task,) = [t for t in range(g.num_tasks) if g.names[g.name[t]].startswith("ncclKernel")]
    assert g.duration_s[task] == pytest.approx(9.3206756e-6)
