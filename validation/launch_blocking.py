"""Does plan.cuda_launch_blocking price what CUDA_LAUNCH_BLOCKING=1 cost BigScience? A check, read once.

    python validation/launch_blocking.py

Data: data/published/launch_blocking/bloom200b_a100_jean_zay.csv (its header cites the source, the hardware and
what the rows assume): BigScience's 200B candidate (80 layers × 14400, 96 heads) on Jean Zay's A100s, TFLOPs of
the 2nd iteration with CUDA_LAUNCH_BLOCKING=1 and =0 at 80, 160 and 320 GPUs (bigscience-workshop/bigscience@
9e64edec train/tr11-176B-ml/chronicles-prequel.md, "dealing with JZ hanging on the large model"). A row is one
model, plan and GPU count, so its step time ratio is the inverse of its TFLOPs ratio: blocking step / async step
= async TFLOPs / blocking TFLOPs. Each row is predicted by the graph simulation (`predict`) with
plan.cuda_launch_blocking false and true; printed: both predicted steps, the predicted and measured ratios and the
ratio's error (predicted / measured − 1), then each predicted step against the measured one (TFLOPs to seconds:
`measured_step_s`). Nothing in itercast is fitted to these rows.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_ranking import _plan_job, _read

from itercast.errors import ConfigError
from itercast.predict import predict

DATA = Path(__file__).resolve().parents[1] / "data" / "published" / "launch_blocking"

# The prequel's "Best TFLOPs" log lines of the same 200B model at GBS 2048, which print both the seconds per
# iteration and the TFLOPs (s, GPUs, TFLOPs): fp16 on 80 and 160 GPUs, then bf16 on 80 and 160.
BEST_TFLOPS_LOG_LINES = ((844.81, 80, 98.87), (430.21, 160, 97.07), (853.81, 80, 97.82), (434.14, 160, 96.19))
LOGGED_GBS = 2048


def flop_per_iteration(global_batch_size: int) -> float:
    """FLOPs Megatron-DeepSpeed's TFLOPs counts in one iteration of this model: s × GPUs × TFLOPs × 1e12 of the
    four log lines above (6.682e18 each, within 0.01%: math/README.md's model_size_in_B × 4 × 2 × seqlen × GBS
    with the 199.11B non-embedding parameters gives 6.681e18), averaged, and proportional to the global batch."""
    per_line = [s * gpus * tflops * 1e12 for s, gpus, tflops in BEST_TFLOPS_LOG_LINES]
    return sum(per_line) / len(per_line) * global_batch_size / LOGGED_GBS


def measured_step_s(tflops: float, gpus: int, global_batch_size: int) -> float:
    """Seconds per iteration behind a printed TFLOPs: the iteration's FLOPs / (TFLOPs × 1e12 × GPUs)."""
    return flop_per_iteration(global_batch_size) / (tflops * 1e12 * gpus)


def rows() -> list[dict[str, str]]:
    """The CSV's rows, in file order."""
    return [r for path in sorted(DATA.glob("*.csv")) for r in _read(path)]


def predicted_steps_s(r: dict[str, str]) -> tuple[float, float]:
    """(async, blocking) step seconds of a row: its plan as plan_ranking's rows, cuda_launch_blocking off and on."""
    steps = [
        predict(_plan_job(r | {"overrides": f"{r['overrides']} plan.cuda_launch_blocking={flag}"})).step_time_s
        for flag in ("false", "true")
    ]
    return steps[0], steps[1]


def main() -> None:
    errors = []
    for r in rows():
        gpus, gbs = int(r["gpus"]), int(r["global_batch_size"])
        async_s, blocking_s = predicted_steps_s(r)
        ratio = blocking_s / async_s
        print(f"{r['label']} (dp{r['data_parallel']} tp{r['tensor_parallel']} pp{r['pipeline_parallel']}):")
        print(f"    predicted async {async_s:.2f} s, blocking {blocking_s:.2f} s, ratio {ratio:.4f}")
        line = "    measured "
        for kind, predicted_s in (("async", async_s), ("blocking", blocking_s)):
            if r[f"tflops_{kind}"]:
                m_s = measured_step_s(float(r[f"tflops_{kind}"]), gpus, gbs)
                line += f"{kind} {m_s:.2f} s (predicted {predicted_s / m_s - 1:+.1%}), "
            else:
                line += f"{kind}: none ({r['measured_note']}), "
        if r["tflops_async"] and r["tflops_blocking"]:
            measured = float(r["tflops_async"]) / float(r["tflops_blocking"])
            errors.append(ratio / measured - 1)
            line += f"ratio {measured:.4f}; ratio error {errors[-1]:+.2%}"
        print(line.rstrip(", "))
    mean_abs = sum(abs(e) for e in errors) / len(errors)
    print(f"{len(errors)} measured ratios: mean |ratio error| {mean_abs:.2%}, worst {max(errors, key=abs):+.2%}")


if __name__ == "__main__":
    try:
        main()
    except ConfigError as exc:
        print(f"launch_blocking: {exc}", file=sys.stderr)
        sys.exit(2)
