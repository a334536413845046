"""Replay every trace in ../shared/data/traces: measured vs replayed time per rank and step.

    python validation/replay.py            # reads $ITERCAST_DATA or ../shared/data

Replay uses the measured kernel and host durations (no cost model), so this checks the graph
semantics: launches, inferred stream waits and synchronisations, cross-rank rendezvous. Then two
what-ifs per trace (GEMMs ×0.5, NCCL removed) show how much of each step the GPU can still move.
Steps are reported GPU-bound and host-bound apart (GPU busy ≥ 90% of the step, or less): on a
host-bound step the GPU side can be wrong without moving the step. Besides the shared traces, the
H100 traces of data/measured/h100_traces (one iteration each, compared by span). Target (issue #3):
≤ 2% per step; Lumos reports 3.3% on average.
"""

from __future__ import annotations

import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.data_paths import shared_data_dir
from itercast.replay import GPU_BOUND_BUSY, replay_whatif
from itercast.traces.kineto import read_traces
from itercast.traces.whatif import WhatIf

MAX_MEMBER_BYTES = 64 << 20
H100 = Path(__file__).resolve().parents[1] / "data" / "measured" / "h100_traces"  # ours: see its README


def extract(archive: Path, into: Path) -> Path:
    """Unpack regular files only, flattened into `into` (no links, no paths outside, bounded size)."""
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.size <= MAX_MEMBER_BYTES and member.name.endswith(".json"):
                src = tar.extractfile(member)
                if src is not None:
                    (into / Path(member.name).name).write_bytes(src.read())
    return into


def measured_span_s(paths: list[Path]) -> float:
    """First runtime call or GPU op to the last end, over the traces (for traces without step marks)."""
    traces = read_traces(paths)
    first = min(float(min(t.call_ts_us.min(), t.op_ts_us.min())) for t in traces)
    last = max(float(max((t.call_ts_us + t.call_dur_us).max(), (t.op_ts_us + t.op_dur_us).max())) for t in traces)
    return (last - first) * 1e-6


def main() -> None:
    data = shared_data_dir()
    if data is None:
        print("no shared data (set ITERCAST_DATA or place ../shared/data beside the repo): nothing to validate")
        return
    traces = data / "traces"
    rows: list[tuple[str, float, float, float, float]] = []  # (bound, |error|, GPU busy, gemm move, nccl move)
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("param_dlrm_kineto_8rank_v100", [extract(traces / "param_dlrm_kineto_8rank_v100.tar.gz", Path(tmp))])]
        cases += [(p.name.removesuffix(".json.gz"), [p]) for p in sorted(traces.glob("*.json.gz"))]
        cases += [
            (f"h100 {p.name.removesuffix('.kineto.json.gz')}", [p]) for p in sorted(H100.glob("*.kineto.json.gz"))
        ]
        print(
            f"{'trace':34} {'rank':>4} {'step':>5} {'measured_ms':>12} {'replayed_ms':>12} {'error':>8} "
            f"{'GPU busy':>8} {'gemm×0.5_ms':>12} {'no_nccl_ms':>11}"
        )
        for name, paths in cases:
            base, gemm, _ = replay_whatif(paths, WhatIf({"gemm": 0.5}))
            _, nonccl, _ = replay_whatif(paths, WhatIf({"nccl": 0.0}))
            if base.steps:
                found = [
                    (s.rank, s.step, s.measured_s, s.replayed_s, s.gpu_busy, g.replayed_s, n.replayed_s)
                    for s, g, n in zip(base.steps, gemm.steps, nonccl.steps, strict=True)
                ]
            else:  # no ProfilerStep marks: the whole trace's span
                span = measured_span_s([Path(p) for p in paths])
                found = [
                    (
                        0,
                        -1,
                        span,
                        base.sim.step_time_s,
                        base.span_gpu_busy,
                        gemm.sim.step_time_s,
                        nonccl.sim.step_time_s,
                    )
                ]
            for rank, step, measured, replayed, busy, g, n in found:
                error = replayed / measured - 1
                rows.append(
                    ("gpu" if busy >= GPU_BOUND_BUSY else "host", abs(error), busy, 1 - g / replayed, 1 - n / replayed)
                )
                print(
                    f"{name[:34]:34} {rank:4d} {step:5d} {measured * 1e3:12.3f} {replayed * 1e3:12.3f} "
                    f"{error:+8.2%} {busy:8.0%} {g * 1e3:12.3f} {n * 1e3:11.3f}"
                )
    print()
    for bound in ("gpu", "host"):
        sel = [r for r in rows if r[0] == bound]
        if not sel:
            sign = "≥" if bound == "gpu" else "<"
            print(f"{bound}-bound steps (GPU busy {sign} {GPU_BOUND_BUSY:.0%}): none in the data")
            continue
        errs = [r[1] for r in sel]
        print(
            f"{bound}-bound steps: {len(sel)}  mean |error| {sum(errs) / len(errs):.3%}  max |error| {max(errs):.3%}  "
            f"GPU busy {min(r[2] for r in sel):.0%}–{max(r[2] for r in sel):.0%}; the step shortened by gemm×0.5 "
            f"up to {max(r[3] for r in sel):.1%}, without NCCL up to {max(r[4] for r in sel):.1%}"
        )


if __name__ == "__main__":
    main()
