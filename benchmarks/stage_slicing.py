"""Stage slicing: exact DP time, and the relaxation's optimality gap and time by number of random starts.

    python benchmarks/stage_slicing.py

Cases: 128 layers of uneven random times (uniform 1–3 ms, sends 0–0.5 ms; seeded) into 50 stages
(the reference work's exact DP took 5,430 s at 128 layers × 50 choices), and GPT-3 175B's 96 layers
+ embedding + head from the cost models into 8 and 16 stages. The relaxation (softmax over
boundaries, L-BFGS, rounded, priced exactly) runs from 1, 4, 16 and 64 random starts in 2
processes. Gap = relaxed step / exact step − 1. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.config.job import Job
from itercast.search.layer_costs import job_layer_costs
from itercast.search.stage_slicing import LayerCosts, slice_exact, slice_relaxed


def case(label: str, costs: LayerCosts, stages: int, microbatches: int) -> None:
    t0 = time.perf_counter()
    exact = slice_exact(costs, stages, microbatches)
    exact_s = time.perf_counter() - t0
    print(f"{label}: {costs.num_layers} layers → {stages} stages, m {microbatches}: exact {exact_s * 1e3:.1f} ms")
    for starts in (1, 4, 16, 64):
        t0 = time.perf_counter()
        relaxed = slice_relaxed(costs, stages, microbatches, starts=starts, workers=2)
        print(
            f"    relaxed, {starts:2d} starts: {time.perf_counter() - t0:6.2f} s, "
            f"gap {relaxed.step_time_s / exact.step_time_s - 1:+.3%}"
        )


def main() -> None:
    rng = np.random.default_rng(0)
    uneven = LayerCosts.of(rng.uniform(1e-3, 3e-3, 128), rng.uniform(0, 0.5e-3, 128))
    for stages in (8, 50):
        t0 = time.perf_counter()
        slice_exact(uneven, stages, 256)
        print(f"exact, 128 uneven layers → {stages} stages: {(time.perf_counter() - t0) * 1e3:.1f} ms")
    case("uneven", uneven, 16, 64)
    job = Job.from_presets(
        "gpt3-175b", "dgx-a100", 128, {"tensor_parallel": 8, "pipeline_parallel": 8, "global_batch_size": 1536}
    )
    costs, _ = job_layer_costs(job)
    case("GPT-3 175B (cost models)", costs, 8, job.num_microbatches)
    case("GPT-3 175B (cost models)", costs, 16, job.num_microbatches)


if __name__ == "__main__":
    main()
