"""Time to train with failures against the Llama 3 405B pre-training run (arXiv 2407.21783 §3.3.4).

    python validation/time_to_train.py            # the model (Python API) and `itercast variability --steps`

Published (Dubey et al. 2024, "The Llama 3 Herd of Models", §3.3.4 and Table 5): in a 54-day snapshot
of pre-training on 16,384 H100 GPUs, 466 job interruptions, 47 planned (maintenance, configuration or
dataset updates) and 419 unexpected; effective training time ("the time spent on useful training over
the elapsed time") higher than 90%. §3.3.1 (storage): checkpoints save each GPU's model state, 1 MB
to 4 GB per GPU, to Tectonic at 2 TB/s sustained and 7 TB/s peak. The paper gives no checkpoint or
restart time: the script derives a checkpoint time from the storage figures (a lower bound: the
whole training state at the sustained bandwidth) and prints the range of restart times that gives
more than 90%, instead of choosing one.

Inputs to the model: 16,384 GPUs, 54 days, the per-GPU MTBF from 419 interruptions (the job's MTBF:
54 d / 419 = 3.09 h; failures arrive through restarts too, Daly 2006's complete model), a checkpoint
time δ and a restart time R, the checkpoint interval at its optimum. The interruption count is fitted
(the MTBF is derived from it), so it checks the bookkeeping, not a prediction. The 47 planned
interruptions lose no work (the job checkpoints first): each costs δ + R of the 54 days.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.stochastic.time_to_train import (
    DAY_S,
    HOUR_S,
    FailureModel,
    best_interval_s,
    effective_training_time,
    longest_restart_s,
)

GPUS = 16_384  # §3.3.4: 16K H100 GPUs
WALL_S = 54 * DAY_S  # §3.3.4: a 54-day snapshot
UNEXPECTED = 419  # §3.3.4, Table 5
PLANNED = 47  # §3.3.4: 466 interruptions, 47 planned
PUBLISHED_EFFECTIVE = 0.90  # §3.3.4: "higher than 90% effective training time"
PARAMS = 405e9  # Llama 3 405B
#: bytes saved per parameter: bf16 weights (2) + fp32 master weights, Adam's m and v (3 × 4)
#: (Megatron-LM's distributed optimizer state, Rajbhandari et al. 2020 §3's 12 bytes of fp32 state)
CHECKPOINT_BYTES_PER_PARAM = 14
STORAGE_SUSTAINED_BPS = 2e12  # §3.3.1: Tectonic, 2 TB/s sustained
#: the CLI's defaults (itercast/cli/variability_cmds.py) before this check
CLI_CHECKPOINT_S, CLI_RESTART_S = 300.0, 900.0
JOB = """model: llama3-405b
system: {preset: dgx-h100, num_nodes: 2048}
plan: {tensor_parallel: 8, pipeline_parallel: 16, data_parallel: 128, micro_batch_size: 1, global_batch_size: 2048,
       stage_layers: [7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7]}
"""  # Table 4: TP 8, CP 1, PP 16, DP 128, 16M tokens per batch at 8K; 126 layers, one fewer on the end stages (§3.3.2)


def with_planned(effective: float, fm: FailureModel) -> float:
    """Effective training time once the planned interruptions (a checkpoint and a restart each) are
    taken from the wall time."""
    return effective * (1 - PLANNED * (fm.checkpoint_s + fm.restart_s) / WALL_S)


def long_run(fm: FailureModel) -> tuple[float, float]:
    """(best interval s, effective training time) of a long run on the Llama 3 GPUs."""
    rate = fm.job_failure_rate(GPUS)
    tau = best_interval_s(math.inf, rate, fm)
    return tau, effective_training_time(tau, rate, fm)


def cli_goodput(fm: FailureModel, job: Path) -> float:
    """`itercast variability JOB --steps N` with this failure model: its goodput (N steps fill 54 days
    at the CLI's own mean step, so the run is as long as the snapshot)."""
    base = [sys.executable, "-m", "itercast", "variability", str(job), "--samples", "200", "--json"]
    mean_s = json.loads(subprocess.run(base, capture_output=True, text=True, check=True).stdout)["mean_s"]
    steps = round(WALL_S * PUBLISHED_EFFECTIVE / mean_s)
    flags = ["--steps", str(steps), "--mtbf-hours", str(fm.mtbf_per_gpu_s / HOUR_S)]
    flags += ["--checkpoint-s", str(fm.checkpoint_s), "--restart-s", str(fm.restart_s)]
    out = json.loads(subprocess.run(base + flags, capture_output=True, text=True, check=True).stdout)
    return float(out["time_to_train"]["goodput"])


def main() -> None:
    fm0 = FailureModel.from_interruptions(UNEXPECTED, WALL_S, GPUS, CLI_CHECKPOINT_S, CLI_RESTART_S)
    rate = fm0.job_failure_rate(GPUS)
    mtbf_job_s = 1 / rate
    print(f"per-GPU MTBF {fm0.mtbf_per_gpu_s / HOUR_S:,.0f} h, job MTBF {mtbf_job_s / HOUR_S:.2f} h (published: ~3 h)")
    print(f"{'figure':46} {'predicted':>10} {'published':>10}")
    print(f"{'unexpected interruptions in 54 days (fitted)':46} {rate * WALL_S:10.0f} {UNEXPECTED:10d}")
    ckpt_s = PARAMS * CHECKPOINT_BYTES_PER_PARAM / STORAGE_SUSTAINED_BPS
    print(
        f"checkpoint time from storage: {PARAMS:.3g} params × {CHECKPOINT_BYTES_PER_PARAM} B / 2 TB/s = {ckpt_s:.1f} s"
    )
    print("\neffective training time at the best interval (unexpected only | with the 47 planned):")
    restarts_min = (2, 5, 10, 15, 30)
    print(
        f"{'checkpoint s':>12} {'interval min':>12} " + " ".join(f"{'R ' + str(r) + ' min':>15}" for r in restarts_min)
    )
    for c_s in (round(ckpt_s, 1), 10.0, 30.0, 60.0, CLI_CHECKPOINT_S):
        cells = []
        for r_min in restarts_min:
            fm = FailureModel(fm0.mtbf_per_gpu_s, c_s, r_min * 60.0)
            tau, eff = long_run(fm)
            cells.append(f"{eff:6.1%} | {with_planned(eff, fm):6.1%}")
        print(f"{c_s:12.1f} {tau / 60:12.0f} " + " ".join(f"{c:>15}" for c in cells))
    print("\nlongest restart keeping > 90% (unexpected only), by checkpoint time:")
    for c_s in (round(ckpt_s, 1), 10.0, 30.0, 60.0, CLI_CHECKPOINT_S):
        r_s = longest_restart_s(PUBLISHED_EFFECTIVE, rate, c_s)
        print(
            f"  checkpoint {c_s:6.1f} s: "
            + (f"restart ≤ {r_s / 60:5.1f} min" if r_s > 0 else "none (checkpoints alone cost more)")
        )
    tau, eff = long_run(fm0)
    print(
        f"\nwhy the CLI's defaults (checkpoint {CLI_CHECKPOINT_S:.0f} s, restart {CLI_RESTART_S:.0f} s) "
        f"give {eff:.1%}: "
        f"at the best interval {tau / 60:.0f} min, checkpoints take δ/τ = {CLI_CHECKPOINT_S / tau:.1%}, rework "
        f"≈ τ/(2·MTBF) = {tau / 2 / mtbf_job_s:.1%}, restarts ≈ R/MTBF = {CLI_RESTART_S / mtbf_job_s:.1%} of the time"
    )
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "llama3_405b_16k.yaml"
        job.write_text(JOB)
        for c_s, r_s in ((CLI_CHECKPOINT_S, CLI_RESTART_S), (round(ckpt_s, 1), 600.0)):
            fm = FailureModel(fm0.mtbf_per_gpu_s, c_s, r_s)
            print(
                f"itercast variability (Llama 3 405B job, --checkpoint-s {c_s} --restart-s {r_s:.0f}): goodput "
                f"{cli_goodput(fm, job):.1%}; model (long run) {long_run(fm)[1]:.1%}; published > 90%"
            )


if __name__ == "__main__":
    main()
