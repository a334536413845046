"""`replay --tp N` on a CPU (gloo) trace (traces/tensor_parallel.py): sharded GEMMs scale by their
FLOPs (× t/N), the TP all-reduce keeps its bytes and is re-timed by the collective model's ratio for
N ranks (by hand: an alpha-beta fit, ring bus factor 2(n−1)/n), TP 1 drops it; a trace that names
no TP group: one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from kineto_fixtures import cpu_op, step, write
from test_replay_parallel import ALPHA_S, alpha_beta
from typer.testing import CliRunner

from itercast.cli import app
from itercast.replay import replay_whatif
from itercast.traces.whatif import WhatIf

RUN = CliRunner()
TP_GROUP = {"pg_name": "1", "pg_desc": "TENSOR_MODEL_PARALLEL_GROUP", "pg_size": 2, "ranks": [0, 1]}


def op(name: str, ts: float, dur: float, dims: list) -> dict:
    return cpu_op(name, ts, dur) | {"args": {"Input Dims": dims}}


def tp_rank(tmp_path: Path, rank: int, groups: list[dict] | None = None) -> str:
    """One Megatron MLP block at TP 2 (h = 512, 4h/2 = 1024), step 0–4,200 µs on thread 100: the
    column-parallel mm [64, 512] × [512, 1024] (0–1,000 µs), the row-parallel mm [64, 1024] ×
    [1024, 512] (1,000–2,000 µs), c10d::allreduce_ of its [64, 512] output (2,000–2,010 µs) that gloo
    thread 200 runs 2,005–4,005 µs while the thread waits; it resumes at 4,010 with the replicated
    bias add (90 µs) and ends the step 100 µs later."""
    events = [
        step(1, 0, 4200),
        op("aten::mm", 0, 1000, [[64, 512], [512, 1024]]),
        op("aten::mm", 1000, 1000, [[64, 1024], [1024, 512]]),
        op("c10d::allreduce_", 2000, 10, [[[64, 512]], [], []]),
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 100, "tid": 200}
        | {"ts": 2005, "dur": 2000.0},
        op("aten::add", 4010, 90, [[64, 512], [512], []]),
    ]
    info = {"rank": rank, "world_size": 2, "backend": "gloo", "pg_config": [TP_GROUP] if groups is None else groups}
    return str(write(tmp_path / f"r{rank}.json", events, distributedInfo=info))


def test_tp_2_to_4_halves_the_sharded_mms_and_retimes_the_all_reduce_for_4_ranks(tmp_path):
    # sharded size 1024: the contraction of the row-parallel mm whose [64, 512] output is all-reduced;
    # both mms carry it: 2 × 64 × 512 × 1024 FLOPs each at TP 2, half at TP 4 (2048/4 = 512): 1000 → 500 µs.
    # all-reduce of 64 × 512 × 4 B = 131,072 B on cpu-host (a group of n is n nodes, NIC 1.25e9 B/s):
    t2_s = ALPHA_S + 131_072 * (2 * (2 - 1) / 2) / 1.25e9  # 1.1048576 ms
    t4_s = ALPHA_S + 131_072 * (2 * (4 - 1) / 4) / 1.25e9  # 1.1572864 ms (floors 100, 200 µs: below)
    paths = [tp_rank(tmp_path, 0), tp_rank(tmp_path, 1)]
    base, moved, counts = replay_whatif(paths, WhatIf(tp=4, curves=alpha_beta("inter_node")))
    assert [s.replayed_s for s in base.steps] == pytest.approx([4200e-6, 4200e-6])
    # the two mms of each of the 2 ranks
    assert counts["sharded operators re-timed × 2/4 (sharded sizes [1024])"] == 2 * 2
    # mms 500 + 500, launch 5 µs before the transfer, the transfer 2,000 µs × t4/t2, the thread resumes
    # 5 µs after it ends (as measured) and runs 90 + 100 µs
    expected_s = 1000e-6 + 5e-6 + 2000e-6 * t4_s / t2_s + 5e-6 + 190e-6
    assert expected_s == pytest.approx(3294.9054e-6)
    assert [s.replayed_s for s in moved.steps] == pytest.approx([expected_s, expected_s])


def test_tp_1_doubles_the_mms_and_drops_the_all_reduce(tmp_path):
    paths = [tp_rank(tmp_path, 0), tp_rank(tmp_path, 1)]
    _, moved, _ = replay_whatif(paths, WhatIf(tp=1))
    # mms 2,000 + 2,000, the launch op 10 µs, the measured 5 µs after the (now empty) all-reduce, 190 µs
    assert [s.replayed_s for s in moved.steps] == pytest.approx([4205e-6, 4205e-6])


def test_host_cores_share_the_cores_among_the_what_ifs_processes(tmp_path):
    # 2 ranks measured on 2 cores never shared; TP 4 on 2 cores: 2 simulated ranks each stand for
    # 2, so their mms (running together) take twice their time alone: 2 × 500 µs each
    paths = [tp_rank(tmp_path, 0), tp_rank(tmp_path, 1)]
    _, alone, _ = replay_whatif(paths, WhatIf(tp=4))
    _, shared, _ = replay_whatif(paths, WhatIf(tp=4, host_cores=2))
    assert shared.steps[0].replayed_s > alone.steps[0].replayed_s + 900e-6


def test_cli_tp_on_a_trace_without_a_named_tp_group_is_one_line_exit_2(tmp_path):
    default = {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]}
    paths = [tp_rank(tmp_path, 0, [default]), tp_rank(tmp_path, 1, [default])]
    out = RUN.invoke(app, ["replay", *paths, "--tp", "4"])
    assert out.exit_code == 2
    assert out.output.count("\n") == 1 and "--tp: the traces name no tensor-parallel process group" in out.output


def test_cli_tp_with_dp_is_one_line_exit_2(tmp_path):
    out = RUN.invoke(app, ["replay", tp_rank(tmp_path, 0), tp_rank(tmp_path, 1), "--tp", "4", "--dp", "2"])
    assert out.exit_code == 2 and out.output.count("\n") == 1 and "--tp" in out.output


def test_cli_tp_prints_the_retimed_all_reduces(tmp_path):
    out = RUN.invoke(app, ["replay", tp_rank(tmp_path, 0), tp_rank(tmp_path, 1), "--tp", "4"])
    assert out.exit_code == 0, out.output
    assert "re-timed 2 of 2 collectives" in " ".join(out.output.split())


GLOO_TP = Path(__file__).resolve().parents[1] / "data" / "measured" / "gloo_tensor_parallel"


@pytest.mark.skipif(not GLOO_TP.is_dir(), reason="data/measured/gloo_tensor_parallel absent")
def test_measured_tp_traces_read_every_all_reduce_as_waited_for_at_once():
    # tools/measure_gloo_tp.py: 4 blocks, 4 forward + 3 backward all-reduces a step, each synchronous
    paths = sorted(GLOO_TP.glob("tp2.rank*.trace.json.gz"))
    base, _, counts = replay_whatif(paths, WhatIf(tp=4))
    assert max(abs(s.error) for s in base.steps) < 1e-3
    assert "CPU collectives never waited for in the trace" not in base.replay_graph.notes
    # per rank and step: 4 × (column linear, GELU, row linear) forward; backward 4 × (row mm, T, grad,
    # GELU, addmm, grad, T, grad) and 12 sharded SGD updates (8 weights/biases [1024, …], not the 4 row biases)
    assert counts["sharded operators re-timed × 2/4 (sharded sizes [1024])"] == 2 * 4 * (12 + 4 * 8 + 12)
