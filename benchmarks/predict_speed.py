"""Speed of prediction: one graph simulation of GPT-3 175B on 1024 A100, and plans/s of the fast path.

    python benchmarks/predict_speed.py

Targets (issue #2): one prediction ≤ 50 ms; ≥ 1,000 plans/s per core (Calculon: 114–192).
Prints numbers; asserts nothing. Single process (one core).
"""

from __future__ import annotations

import itertools
import statistics
import time

from itercast.config.job import Job
from itercast.predict import predict
from itercast.search.fast_estimate import FastEstimator

PLAN = {
    "tensor_parallel": 8,
    "pipeline_parallel": 8,
    "data_parallel": 16,
    "schedule": "1f1b",
    "global_batch_size": 1536,
    "micro_batch_size": 1,
}


def one_prediction() -> None:
    job = Job.from_presets("gpt3-175b", "dgx-a100", 128, PLAN)
    predict(job)  # warm caches (curves, presets)
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        result = predict(job)
        times.append(time.perf_counter() - t0)
    print(
        f"graph prediction, GPT-3 175B on 1024 A100 (tp 8, pp 8, dp 16, 1F1B, gbs 1536, mbs 1): "
        f"{result.sim.graph.num_tasks} tasks, median {statistics.median(times) * 1e3:.1f} ms, "
        f"min {min(times) * 1e3:.1f} ms over 10 runs; step {result.step_time_s:.3f} s"
    )


def search_grid() -> list[dict]:
    """Every plan of GPT-3 175B on 1024 GPUs over tp, pp, vp, micro-batch, recompute, SP, ZeRO."""
    plans = []
    for tp, pp, vp, mbs, rc, sp, zero in itertools.product(
        [1, 2, 4, 8],
        [1, 2, 4, 8, 16, 32],
        [1, 2, 3],
        [1, 2, 4],
        ["none", "selective", "full"],
        [False, True],
        [0, 1],
    ):
        if (vp > 1 and pp == 1) or (sp and tp == 1):
            continue
        plans.append(
            {
                "tensor_parallel": tp,
                "pipeline_parallel": pp,
                "virtual_pipeline": vp,
                "schedule": "interleaved-1f1b" if vp > 1 else "1f1b",
                "micro_batch_size": mbs,
                "recompute": rc,
                "sequence_parallel": sp,
                "zero_stage": zero,
                "global_batch_size": 1536,
            }
        )
    return plans


def batch_of_plans() -> None:
    fe = FastEstimator({"preset": "gpt3-175b"}, {"preset": "dgx-a100", "num_nodes": 128})
    plans = search_grid()
    t0 = time.perf_counter()
    jobs, _ = fe.jobs(plans)
    valid = [j for j in jobs if j is not None]
    t1 = time.perf_counter()
    times = fe.step_time_s(valid)
    t2 = time.perf_counter()
    times = fe.step_time_s(valid)  # layer costs cached: the cost of re-ranking under a new objective
    t3 = time.perf_counter()
    print(
        f"fast path: {len(plans)} plans, {len(valid)} valid; validation {len(plans) / (t1 - t0):,.0f} plans/s; "
        f"estimate (cold caches) {len(valid) / (t2 - t1):,.0f} plans/s; end to end "
        f"{len(plans) / (t2 - t0):,.0f} plans/s; warm re-estimate {len(valid) / (t3 - t2):,.0f} plans/s"
    )
    best = min(range(len(valid)), key=lambda i: times[i])
    print(f"fastest plan found: {valid[best].plan.model_dump(exclude_defaults=True)} → {times[best]:.3f} s/step")


if __name__ == "__main__":
    one_prediction()
    batch_of_plans()
