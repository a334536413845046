"""What CUDA_LAUNCH_BLOCKING=1 costs beyond the kernels (g): the same work with every launch blocking and without.

CUDA reads the variable when it initialises, so each (configuration, mode) runs in a child process of its own:

    python tools/campaign/launch_blocking.py CONFIG MODE DEVICE [--dry]

which prints one JSON line. Under CUDA_LAUNCH_BLOCKING=1 each launch returns once its kernel has ended (CUDA C++
Programming Guide, Asynchronous Concurrent Execution), so the host's dispatch of the next operator no longer hides
behind the GPU: what itercast's plan.cuda_launch_blocking prices as each kernel's host launch time added to its
own (workloads/transformer.py _task). BigScience's BLOOM runs and OpenLLM-France's Lucie runs ran so on Jean Zay
(data/published/launch_blocking/, data/published/plan_ranking/). Configurations (CONFIGS), each iteration
synchronised at its end and timed on the host clock:
- chain: 1,000 in-place adds to a one-element tensor, host-bound either way: per op the host's dispatch (async),
  and dispatch, launch and the wait for the kernel's end (blocking);
- gemm: 100 bf16 products of 4096 × 4096 (dry: 64), GPU-bound: blocking − async per op is what a blocking
  launch adds to a kernel that is already waited for;
- step, step_batch1: a training step of campaign/training.py's model (BASE at its batch and at batch 1; dry:
  DRY), hundreds of kernels of every kind; its kernels (and copies, memsets) counted in a profiled step of the
  async run (`ops`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

if __name__ == "__main__":  # the child: campaign/ is a package of tools/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from campaign.common import Budget, Context, timing
from campaign.training import BASE, DRY, SHAPE_FIELDS, StepConfig, Trainer

CONFIGS = ("chain", "gemm", "step", "step_batch1")
DRY_CONFIGS = ("chain", "step_batch1")  # a dry run's children each import torch: one of each kind
MODES = ("0", "1")  # CUDA_LAUNCH_BLOCKING
CHAIN_OPS, GEMM_OPS = 1000, 100
CHILD_TIMEOUT_S = 240.0


def _work(config: str, device: str, dry: bool) -> tuple[Callable[[], None], int, dict[str, Any]]:
    """One iteration of `config` on `device`, its operators' count where fixed by construction (0: counted by the
    profiler), and the model's shape fields for a step."""
    dev = torch.device(device)
    if config == "chain":
        x = torch.zeros(1, device=dev)

        def chain() -> None:
            for _ in range(CHAIN_OPS):
                x.add_(1.0)

        return chain, CHAIN_OPS, {}
    if config == "gemm":
        n = 64 if dry else 4096
        a, b = (torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(2))

        def gemms() -> None:
            for _ in range(GEMM_OPS):
                torch.mm(a, b)

        return gemms, GEMM_OPS, {}
    shape = DRY if dry else BASE
    shape = replace(shape, batch=1) if config == "step_batch1" else shape
    return Trainer(device, shape, StepConfig()).step, 0, asdict(shape)


def kernels_per_call(fn: Callable[[], None], device: str) -> int:
    """Device activities (kernels, copies, memsets) of one call of `fn`, by the profiler; 0 on a CPU."""
    from torch.profiler import ProfilerActivity, profile

    if torch.device(device).type != "cuda":
        return 0
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def child(config: str, device: str, dry: bool) -> dict[str, Any]:
    """Time `config` in this process (its CUDA_LAUNCH_BLOCKING set by the parent): warm-up, then each iteration
    synchronised and timed on the host clock."""
    fn, ops, shape = _work(config, device, dry)
    cuda = torch.device(device).type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    for _ in range(3):
        fn()
    sync()
    samples = []
    for _ in range(3 if dry else 20):
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append((time.perf_counter() - t0) * 1e3)
    counted = ops or (kernels_per_call(fn, device) if os.environ.get("CUDA_LAUNCH_BLOCKING", "0") == "0" else 0)
    return {"ops": counted, **shape, **timing(samples)}


def run_launch_blocking(ctx: Context, budget: Budget) -> str:
    """(g) every configuration in both modes, each a child process (module docstring)."""
    fields = ["config", "cuda_launch_blocking", "ops", *SHAPE_FIELDS, "status", "median_ms", "p10_ms", "p90_ms"]
    rows = ctx.rows(
        "launch_blocking.csv",
        [*fields, "reps"],
        [
            "one GPU; each (config, mode) a fresh process with CUDA_LAUNCH_BLOCKING set; 3 untimed iterations, then "
            "each iteration synchronised and timed on the host clock (median, 10th and 90th percentiles, ms)",
            f"chain: {CHAIN_OPS} in-place adds to one element; gemm: {GEMM_OPS} bf16 4096^2 products; step, "
            "step_batch1: training.py's step (its shape fields); ops: kernels an iteration (the steps': counted "
            "by the profiler in the async run, blank in the blocking one)",
        ],
        "the same work with CUDA_LAUNCH_BLOCKING=0 and =1: what a blocking launch adds beyond the kernels",
    )
    here = Path(__file__).resolve()
    for config in DRY_CONFIGS if ctx.dry else CONFIGS:
        for mode in MODES:
            if not budget.take():
                continue
            cmd = [sys.executable, str(here), config, mode, ctx.device, *(["--dry"] if ctx.dry else [])]
            env = os.environ | {"CUDA_LAUNCH_BLOCKING": mode}
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=CHILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                rows.add({"config": config, "cuda_launch_blocking": mode, "status": f"error: over {CHILD_TIMEOUT_S} s"})
                continue
            last = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
            if not last:
                why = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
                rows.add({"config": config, "cuda_launch_blocking": mode, "status": f"error: {why}"})
                continue
            got = json.loads(last[0])
            rows.add({"config": config, "cuda_launch_blocking": mode, "status": "ok", **got, "ops": got["ops"] or ""})
    rows.close()
    return f"{rows.count} runs, {budget.skipped} skipped for time"


if __name__ == "__main__":
    name, blocking, dev = sys.argv[1:4]
    assert name in CONFIGS and blocking == os.environ.get("CUDA_LAUNCH_BLOCKING"), sys.argv
    print(json.dumps(child(name, dev, "--dry" in sys.argv[4:])))
