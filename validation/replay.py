"""Replay every trace in ../shared/data/traces: measured vs replayed time per rank and step.

    python validation/replay.py            # reads $ITERCAST_DATA or ../shared/data

Replay uses the measured kernel and host durations (no cost model), so this checks the graph
semantics: launches, inferred stream waits and synchronisations, cross-rank rendezvous. Then two
what-ifs per trace (GEMMs ×0.5, NCCL removed) show how much of each step the GPU can still move.
Target (issue #3): ≤ 2% per step; Lumos reports 3.3% on average.
"""

from __future__ import annotations

import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.data_paths import shared_data_dir
from itercast.replay import replay_whatif
from itercast.traces.whatif import WhatIf

MAX_MEMBER_BYTES = 64 << 20


def extract(archive: Path, into: Path) -> Path:
    """Unpack regular files only, flattened into `into` (no links, no paths outside, bounded size)."""
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.size <= MAX_MEMBER_BYTES and member.name.endswith(".json"):
                src = tar.extractfile(member)
                if src is not None:
                    (into / Path(member.name).name).write_bytes(src.read())
    return into


def main() -> None:
    data = shared_data_dir()
    if data is None:
        print("no shared data (set ITERCAST_DATA or place ../shared/data beside the repo): nothing to validate")
        return
    traces = data / "traces"
    errors: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("param_dlrm_kineto_8rank_v100", [extract(traces / "param_dlrm_kineto_8rank_v100.tar.gz", Path(tmp))])]
        cases += [(p.name.removesuffix(".json.gz"), [p]) for p in sorted(traces.glob("*.json.gz"))]
        print(
            f"{'trace':34} {'rank':>4} {'step':>5} {'measured_ms':>12} {'replayed_ms':>12} {'error':>8} "
            f"{'gemm×0.5_ms':>12} {'no_nccl_ms':>11}"
        )
        for name, paths in cases:
            base, gemm, _ = replay_whatif(paths, WhatIf({"gemm": 0.5}))
            _, nonccl, _ = replay_whatif(paths, WhatIf({"nccl": 0.0}))
            for s, g, n in zip(base.steps, gemm.steps, nonccl.steps, strict=True):
                errors.append(abs(s.error))
                print(
                    f"{name[:34]:34} {s.rank:4d} {s.step:5d} {s.measured_s * 1e3:12.3f} {s.replayed_s * 1e3:12.3f} "
                    f"{s.error:+8.2%} {g.replayed_s * 1e3:12.3f} {n.replayed_s * 1e3:11.3f}"
                )
    print(f"steps {len(errors)}  mean |error| {sum(errors) / len(errors):.3%}  max |error| {max(errors):.3%}")


if __name__ == "__main__":
    main()
