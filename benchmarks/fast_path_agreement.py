"""How close the search's closed-form fast path comes to the graph simulation, on random plans.

    python benchmarks/fast_path_agreement.py            # 150 plans per model, seed 1 (~15 s)
    python benchmarks/fast_path_agreement.py --plans 400

For Llama-2 13B on 4 DGX A100 nodes and Mixtral 8x7B on 4 DGX H100 nodes: plans drawn at random
(seeded) from tp 1–8 × pp 1–8 × cp 1–2 × every schedule × ZeRO 0–3 × sequence parallel × mbs 1–2 ×
global batch 32 / 128 × recompute × overlap (× ep 1–4 for Mixtral), priced by FastEstimator and by
the graph simulation (predict). Neither model was used to adjust the fast path (its grid test is
GPT-3 1.3B). Prints |fast / graph − 1|: mean and worst, apart for ZeRO-3 with pipelining, and the
worst plans; then 16 small plans with uneven stages (plan.stage_layers). Asserts nothing.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import plan_of  # the tests' plan fields and small model

from itercast.predict import predict
from itercast.search.fast_estimate import FastEstimator

CASES = (
    ("llama2-13b", {"preset": "dgx-a100", "num_nodes": 4}, False),
    ("mixtral-8x7b", {"preset": "dgx-h100", "num_nodes": 4}, True),
)


def plans(rng: np.random.Generator, moe: bool) -> list[dict]:
    """Every combination of the varied fields on 32 GPUs, shuffled; expert parallel drawn per plan."""
    out = []
    fields = itertools.product(
        [1, 2, 4, 8],
        [1, 2, 4, 8],
        [1, 2],
        ["1f1b", "gpipe", "interleaved-1f1b"],
        [0, 1, 2, 3],
        [False, True],
        [1, 2],
        [32, 128],
        ["none", "selective", "full"],
        [False, True],
    )
    for tp, pp, cp, sched, zero, sp, mbs, gbs, recompute, overlap in fields:
        if (sched == "interleaved-1f1b" and pp == 1) or (sp and tp == 1) or (pp == 1 and sched != "1f1b"):
            continue
        if tp * pp * cp > 32:
            continue
        plan = plan_of(
            tp,
            pp,
            cp,
            sched,
            zero,
            sequence_parallel=sp,
            micro_batch_size=mbs,
            global_batch_size=gbs,
            recompute=recompute,
            overlap_grad_reduce=overlap,
            overlap_param_gather=overlap,
        )
        if moe:
            plan["expert_parallel"] = int(rng.choice([1, 2, 4]))
        out.append(plan)
    rng.shuffle(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plans", type=int, default=150, help="valid plans per model")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    for model, system, moe in CASES:
        fe = FastEstimator({"preset": model}, system)
        candidates = plans(rng, moe)
        jobs = [j for j in fe.jobs(candidates[: 10 * args.plans])[0] if j is not None][: args.plans]
        t0 = time.perf_counter()
        exact = np.array([predict(j).step_time_s for j in jobs])
        rel = fe.step_time_s(jobs) / exact - 1
        err = np.abs(rel)
        fsdp_pp = np.array([j.plan.zero_stage == 3 and j.plan.pipeline_parallel > 1 for j in jobs])
        print(
            f"{model} on {system['preset']} × {system['num_nodes']}, {len(jobs)} plans: mean {err.mean():.2%}, "
            f"worst {err.max():.2%}; ZeRO-3 × pipeline ({fsdp_pp.sum()}): mean {err[fsdp_pp].mean():.2%}, "
            f"worst {err[fsdp_pp].max():.2%}; the others: mean {err[~fsdp_pp].mean():.2%}, worst "
            f"{err[~fsdp_pp].max():.2%} ({time.perf_counter() - t0:.0f} s)"
        )
        for i in np.argsort(-err)[:5]:
            p = jobs[i].plan
            print(
                f"   {rel[i]:+.2%}  tp {p.tensor_parallel} pp {p.pipeline_parallel} cp {p.context_parallel} "
                f"dp {p.data_parallel} ep {p.expert_parallel} {p.schedule} ZeRO {p.zero_stage} SP "
                f"{p.sequence_parallel} {p.recompute} mbs {p.micro_batch_size} M {jobs[i].num_microbatches} "
                f"overlap {p.overlap_grad_reduce}"
            )


def uneven_stages() -> None:
    """The small llama of the tests with uneven stages (plan.stage_layers), 1F1B: the closed form
    lumps a stage's forward and backward, which shows when an early stage is the heaviest. Each
    plan alone: a PlanTable's plans share one stage_layers."""
    from helpers import tiny_job

    two = [[2, 6], [5, 3], [6, 2], [3, 5], [7, 1], [1, 7]]
    cases = [({"pipeline_parallel": 2, "global_batch_size": 16}, s) for s in two]
    four = [[1, 2, 2, 3], [3, 2, 2, 1], [2, 3, 1, 2], [4, 2, 1, 1], [1, 1, 2, 4]]
    cases += [({"pipeline_parallel": 4, "global_batch_size": gbs}, s) for gbs in (16, 64) for s in four]
    jobs = [tiny_job(tensor_parallel=2, stage_layers=layers, **plan) for plan, layers in cases]
    fe = FastEstimator(jobs[0].model, jobs[0].system)
    rel = np.array([fe.step_time_s([j])[0] / predict(j).step_time_s - 1 for j in jobs])  # one base per table
    print(f"uneven stages, {len(jobs)} plans: from {rel.min():+.1%} to {rel.max():+.1%}")
    for j, r in zip(jobs, rel, strict=True):
        print(f"   {r:+.2%}  layers per stage {list(j.plan.stage_layers or ())}, {j.num_microbatches} micro-batches")


if __name__ == "__main__":
    main()
    uneven_stages()
