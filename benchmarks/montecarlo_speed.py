"""Time for 10,000 Monte Carlo samples of one GPT-3 175B step on 16,384 GPUs (issue #5 target: ≤ 1 s, one core).

    python benchmarks/montecarlo_speed.py

The noise here is a PLACEHOLDER to exercise the engine, not a variability model (that is issue #5's
next step): log-normal per task, CV 5% for compute and 15% for communication, and for compute the
maximum over the tp ranks that meet at the next tensor-parallel collective, sampled directly by
order statistics (so the cost does not depend on how many GPUs a task stands for); host tasks fixed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.config.job import Job
from itercast.graph.execgraph import Category
from itercast.sim.engine import simulate
from itercast.sim.montecarlo import LogNormalNoise, simulate_samples
from itercast.workloads.transformer import TransformerStepBuilder

PLAN = {"tensor_parallel": 8, "pipeline_parallel": 16, "data_parallel": 128, "global_batch_size": 3072}


def main() -> None:
    job = Job.from_presets("gpt3-175b", "dgx-a100", 2048, PLAN)
    graph = TransformerStepBuilder(job).build()
    compute = graph.category == Category.COMPUTE
    cv = np.select([compute, graph.category == Category.COMMUNICATION], [0.05, 0.15], 0.0)
    sample = LogNormalNoise(graph.duration_s, cv, np.where(compute, job.plan.tensor_parallel, 1))

    simulate_samples(graph, sample, 8)  # load the compiled kernel once
    t0 = time.perf_counter()
    steps = simulate_samples(graph, sample, 10_000, seed=0)
    elapsed = time.perf_counter() - t0
    p50, p90, p95, p99 = np.percentile(steps, [50, 90, 95, 99])
    print(
        f"GPT-3 175B on {job.system.num_gpus:,} A100 (tp 8, pp 16, dp 128; {graph.num_tasks:,} tasks): "
        f"10,000 samples in {elapsed:.2f} s | deterministic {simulate(graph).step_time_s:.3f} s | "
        f"p50 {p50:.3f} p90 {p90:.3f} p95 {p95:.3f} p99 {p99:.3f} s (placeholder noise)"
    )


if __name__ == "__main__":
    main()
