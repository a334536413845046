"""Predicted vs measured iteration time on published A100 runs that nothing here was fitted to.

    python validation/published_step_times.py

Data: data/published/korthikanti2022_a100_iteration_times.csv (its header cites the paper and where
each number was transcribed from): GPT 22B–1T on 8–512 A100 with full recompute, and with
sequence parallelism + selective recompute, fp16, unfused attention (2022 Megatron-LM). Every plan
field is the paper's setup; the cost curves come from microbenchmark tables only. Printed: each
configuration's error, then geomean, mean and worst over the distinct configurations (each row is one).
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.config.job import Job
from itercast.predict import predict

DATA = Path(__file__).resolve().parents[1] / "data" / "published" / "korthikanti2022_a100_iteration_times.csv"


def rows() -> list[dict[str, str]]:
    with DATA.open() as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))


def job(r: dict[str, str]) -> Job:
    model = {"family": "gpt", "tie_embeddings": True}
    model |= {k: int(r[k]) for k in ("hidden_size", "num_attention_heads", "num_layers", "seq_length", "vocab_size")}
    vp = int(r["virtual_pipeline"])
    plan = {k: int(r[k]) for k in ("tensor_parallel", "pipeline_parallel", "global_batch_size", "micro_batch_size")}
    plan |= {
        "virtual_pipeline": vp,
        "schedule": "interleaved-1f1b" if vp > 1 else "1f1b",
        "recompute": r["recompute"],
        "sequence_parallel": r["sequence_parallel"] == "true",
        "dtype": "fp16",
        "flash_attention": False,
        "zero_stage": 0,
        # 2022's Megatron-LM had no NaN check of the gradient buffer before its all-reduce (d66807759c added it,
        # 2023-12-05); its contiguous buffer was zeroed and scaled by 1/dp as today's
        "grad_nan_check": False,
        # its pipeline exchanges (p2p_communication.py _communicate at 35a3fa8b7c, 2022-05-13, the paper's month, and
        # 748a9a7db3, 2022-07-11): batched, waited for and followed by torch.cuda.synchronize(); without sequence
        # parallelism each GPU sends 1/tp of the stage output and the receiver all-gathers it
        # (scatter_gather_tensors_in_pipeline, on by default; 748a9a7db3 turns it off under sequence parallelism)
        "pipeline_p2p": "megatron",
        "p2p_scatter_gather": True,
        # and its interleaved schedule's exchanges were each waited for and synchronised too (schedules.py
        # forward_backward_pipelining_with_interleaving at 35a3fa8b7c: send_forward_backward_recv_forward_backward
        # and the others through _communicate); the overlap came in f9283c5a8a (2023-05-31)
        "overlap_p2p_comm": False,
    }
    return Job.from_dicts(model, plan, {"preset": "dgx-a100", "num_nodes": int(r["gpus"]) // 8})


def main() -> None:
    print(f"{'model':6} {'mode':7} {'GPUs':>5} {'measured s':>11} {'predicted s':>12} {'error':>8} {'GiB/GPU':>8}")
    errors = []
    for r in rows():
        p = predict(job(r))
        measured = float(r["measured_s"])
        err = p.step_time_s / measured - 1
        errors.append(err)
        print(
            f"{r['model']:6} {r['mode']:7} {int(r['gpus']):5d} {measured:11.2f} {p.step_time_s:12.2f} {err:+8.1%} "
            f"{p.memory.total_bytes / 2**30:8.1f}"
        )
    geo = math.exp(sum(math.log(abs(e)) for e in errors) / len(errors))
    mean = sum(abs(e) for e in errors) / len(errors)
    worst = max(errors, key=abs)
    print(f"{len(errors)} configurations: geomean |error| {geo:.1%}, mean {mean:.1%}, worst {worst:+.1%}")


if __name__ == "__main__":
    main()
