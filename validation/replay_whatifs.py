"""Do replayed steps follow their kernels? Every kernel ×2 and ×0.5 on the real traces of ../shared/data.

    python validation/replay_whatifs.py        # reads $ITERCAST_DATA or ../shared/data

For each step (ProfilerStep) of each trace: measured time, the rank's GPU busy share (its own measured
GPU ops inside the measured step), and the replayed step with every kernel class scaled ×2 and
×0.5 (copies and memsets unchanged). Issue 30's target: a step at ≥ 95% GPU busy takes ≥ 1.8× its
measured time under ×2 and ≤ 0.75× under ×0.5 (a GPU-bound step follows its kernels). Ratios are
what-if / measured; steps below 95% busy are printed for context (the host decides them).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay import extract  # validation/replay.py: the bounded tar extraction

from itercast.data_paths import shared_data_dir
from itercast.replay import replay_whatif
from itercast.traces.whatif import KERNEL_CLASSES, WhatIf

GPU_BOUND = 0.95  # issue 30: "a step at ≥ 95% GPU busy"
ALL_KERNELS = [cls for cls, _ in KERNEL_CLASSES] + ["other"]  # every kernel class (not memcpy/memset)


def main() -> None:
    data = shared_data_dir()
    if data is None or not (data / "traces").is_dir():
        print("no shared traces (set ITERCAST_DATA or place ../shared/data beside the repo): nothing to check")
        return
    traces = data / "traces"
    print(
        f"{'trace':30} {'rank':>4} {'step':>5} {'busy':>5} {'measured_ms':>11} "
        f"{'x2_ms':>9} {'x2':>5} {'x0.5_ms':>9} {'x0.5':>5}"
    )
    bound: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = [(p.name.removesuffix(".json.gz"), [p]) for p in sorted(traces.glob("hta_*.json.gz"))]
        dlrm = traces / "param_dlrm_kineto_8rank_v100.tar.gz"
        if dlrm.is_file():
            cases.append(("param_dlrm_8rank_v100", sorted(extract(dlrm, Path(tmp)).glob("*.json"))))
        for name, paths in cases:
            base, slow, _ = replay_whatif(paths, WhatIf({cls: 2.0 for cls in ALL_KERNELS}))
            _, fast, _ = replay_whatif(paths, WhatIf({cls: 0.5 for cls in ALL_KERNELS}))
            for b, s, f in zip(base.steps, slow.steps, fast.steps, strict=True):
                x2, x05 = s.replayed_s / b.measured_s, f.replayed_s / b.measured_s
                print(
                    f"{name[:30]:30} {b.rank:4d} {b.step:5d} {b.gpu_busy:5.0%} {b.measured_s * 1e3:11.3f} "
                    f"{s.replayed_s * 1e3:9.3f} {x2:5.2f} {f.replayed_s * 1e3:9.3f} {x05:5.2f}"
                )
                if b.gpu_busy >= GPU_BOUND:
                    bound.append((x2, x05))
    print()
    if not bound:
        print(f"steps at ≥ {GPU_BOUND:.0%} GPU busy: none in the data (the busiest is printed above)")
        return
    ok = sum(x2 >= 1.8 and x05 <= 0.75 for x2, x05 in bound)
    print(f"steps at ≥ {GPU_BOUND:.0%} GPU busy: {len(bound)}; following their kernels (×2 ≥ 1.8, ×0.5 ≤ 0.75): {ok}")


if __name__ == "__main__":
    main()
