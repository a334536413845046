"""Time for 10,000 Monte Carlo samples of one GPT-3 175B step at 16,384 and 65,536 GPUs.

    python benchmarks/montecarlo_speed.py

Target (issue #14): 65,536 GPUs × 10,000 samples ≤ 1 s in-process. The noise is itercast's own
variability model (`itercast variability`'s defaults: per-task compute and communication noise,
a network factor per step, persistent per-GPU speed), each rendezvous over k ranks sampled as
the maximum of k draws by order statistics, so the cost does not grow with the GPU count. Times
the sampling and the max-plus passes (the graph is built once beforehand); blocks of samples run
on a thread pool, so this uses every core of the machine (2 here). Prints numbers; asserts nothing.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.config.job import Job
from itercast.sim.engine import simulate
from itercast.sim.montecarlo import simulate_samples
from itercast.stochastic.variability import StepSampler, VariabilityModel
from itercast.workloads.transformer import TransformerStepBuilder


def main() -> None:
    for nodes, gbs in ((2048, 3072), (8192, 12288)):  # dp 128 and 512, 24 micro-batches each
        plan = {"tensor_parallel": 8, "pipeline_parallel": 16, "global_batch_size": gbs}
        job = Job.from_presets("gpt3-175b", "dgx-a100", nodes, plan)
        graph = TransformerStepBuilder(job).build()
        sampler = StepSampler(job, graph, VariabilityModel())
        simulate_samples(graph, sampler, 8)  # load the compiled kernel once
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            steps = simulate_samples(graph, sampler, 10_000, seed=0)
            times.append(time.perf_counter() - t0)
        p50, p95, p99 = np.percentile(steps, [50, 95, 99])
        print(
            f"GPT-3 175B on {job.system.num_gpus:,} A100 (tp 8, pp 16, dp {job.plan.dp}; {graph.num_tasks:,} tasks): "
            f"10,000 samples in {min(times):.2f} s (best of 3; {os.cpu_count()} cores) | deterministic "
            f"{simulate(graph).step_time_s:.3f} s | p50 {p50:.3f} p95 {p95:.3f} p99 {p99:.3f} s"
        )


if __name__ == "__main__":
    main()
