"""Speed of the DLRM sharding planner: MLPerf's DCNv2 (26 tables) on DGX A100 clusters of 8 to 1,024 GPUs.

    python benchmarks/sharding_speed.py

Per GPU count: the plans the greedy planner prices, those it would price with every rank a candidate
of its own (tables × candidate_shards + the uniform plans), the seconds it takes, and its step. Prints
numbers; asserts nothing. Single process (one core).
"""

from __future__ import annotations

import time

from itercast.cli.shard_cmds import load_dlrm
from itercast.config.job import load_system
from itercast.workloads.dlrm import candidate_shards, plan_sharding


def main() -> None:
    model = load_dlrm("dlrm-dcnv2-criteo")
    for nodes in (1, 2, 4, 16, 128):
        system = load_system("dgx-a100", num_nodes=nodes)
        every = sum(len(candidate_shards(t, system.num_gpus)) for t in model.tables) + 4
        t0 = time.perf_counter()
        result = plan_sharding(model, system, 4096)
        seconds = time.perf_counter() - t0
        step_ms = result.plans[0][1].step_time_s * 1e3
        print(
            f"{system.num_gpus:4d} GPUs: {result.method}, {result.evaluated:5d} plans priced "
            f"(every rank a candidate: {every:5d}), {seconds:6.1f} s, step {step_ms:.3f} ms"
        )


if __name__ == "__main__":
    main()
