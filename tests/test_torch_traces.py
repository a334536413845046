"""Replay real traces written by torch.profiler on this CPU (one process; two gloo ranks)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from itercast.replay import replay

pytest.importorskip("torch")
WORKLOAD = Path(__file__).with_name("torch_trace_workload.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(out: Path, world: int) -> None:
    port = free_port()
    procs = [
        subprocess.Popen([sys.executable, str(WORKLOAD), str(out), str(r), str(world), str(port)]) for r in range(world)
    ]
    for p in procs:
        assert p.wait(timeout=180) == 0


def test_single_process_trace_replays_each_step(tmp_path):
    run_ranks(tmp_path, 1)
    result = replay([tmp_path / "rank0.json"])
    assert len(result.steps) == 4
    for s in result.steps:
        assert s.replayed_s == pytest.approx(s.measured_s, rel=0.02)


def test_two_rank_gloo_traces_replay_each_step(tmp_path):
    run_ranks(tmp_path, 2)
    result = replay([tmp_path])
    assert sorted({s.rank for s in result.steps}) == [0, 1] and len(result.steps) == 8
    for s in result.steps:
        assert s.replayed_s == pytest.approx(s.measured_s, rel=0.02)
