"""Does itercast rank alternative plans of one job as they measured? Published plan comparisons.

    python validation/plan_ranking.py

Data: data/published/plan_ranking/*.csv (each file's header cites its sources and states what the sources left
unsaid: torchtitan's H100 tables, BLOOM's 3D-layout benchmarks on Jean Zay A100s, TWIST's Megatron-LM baseline on
H800s, DLPerf's and BigScience's V100 tables; since 2026-12-02 Lucie-7B's layout search on Jean Zay A100s, the Zero
Bubble paper's 1F1B against interleaved 1F1B, InternLM-7B's TP 1 against TP 2) and
data/published/korthikanti2022_a100_iteration_times.csv (Korthikanti et al. 2022: full recompute vs sequence
parallel + selective recompute, four GPT models). A job is one model, GPU count and global batch; its
rows are plans. A row's model and system are a preset (blank model: none) with `section.field=value` overrides
(the `overrides` column, the CLI's --set syntax); its measurement is seconds per step (`s_per_step`), or
tokens/s per GPU or MFU, whose inverse orders the plans of one job alike. Each plan is predicted by the graph
simulation (`predict`). Printed per job: Kendall τ between predicted and measured times, whether the measured
fastest is ranked first, the loss when not (measured time of itercast's pick / measured best − 1); then the
fastest-pick rate over jobs whose plans differ by ≥ 5% in measured time. Then the same for the checking
table's plan comparisons (checking_jobs: data/published/checking, validation/checking_step_times.py's rows and
predictions), and over both.
"""

from __future__ import annotations

import csv
import itertools
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from checking_step_times import load_rows as checking_rows
from published_step_times import job as korthikanti_job
from published_step_times import rows as korthikanti_rows

from itercast.config.job import Job, apply_override, parse_section
from itercast.config.system import SystemConfig
from itercast.errors import ConfigError
from itercast.predict import predict

DATA = Path(__file__).resolve().parents[1] / "data" / "published" / "plan_ranking"
DISTINCT = 0.05  # jobs whose measured plans differ by at least this share count toward the pick rate
#: checking sources whose plan comparisons the plan_ranking files already hold (BLOOM's prequel tables, there
#: split by day): left out of checking_jobs
SAME_AS_RANKING = ("bloom176b_a100",)


def _read(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))


def _plan_job(r: dict[str, str]) -> Job:
    """A plan_ranking row as a Job: the row's plan fields, its model and system presets (system default
    dgx-h100, the closest preset to torchtitan's H100s), then its `section.field=value` overrides."""
    ints = ("global_batch_size", "micro_batch_size", "data_parallel", "tensor_parallel", "pipeline_parallel")
    plan: dict[str, object] = {k: int(r[k]) for k in (*ints, "virtual_pipeline", "zero_stage")}
    plan |= {"schedule": r["schedule"], "recompute": r["recompute"], "dtype": r["dtype"]}
    plan |= {"tp_comm_overlap": r["tp_comm_overlap"] == "true", "sequence_parallel": int(r["tensor_parallel"]) > 1}
    if r["stage_layers"]:
        plan["stage_layers"] = [int(n) for n in r["stage_layers"].split()]
    model: dict[str, object] = {"seq_length": int(r["seq_length"])} | ({"preset": r["model"]} if r["model"] else {})
    system = {"preset": r.get("system") or "dgx-h100"}
    raw: dict[str, Any] = {"model": model, "plan": plan, "system": system}
    for item in (r.get("overrides") or "").split():
        apply_override(raw, item)
    # the row's GPUs over its nodes, of the preset's size unless an override sets it
    per_node = cast(SystemConfig, parse_section("system", raw["system"])).node.gpus_per_node
    raw["system"]["num_nodes"] = max(1, int(r["gpus"]) // per_node)
    return Job.from_dicts(raw["model"], raw["plan"], raw["system"])


# A row's measurement, as a quantity that orders the plans of one job like their step times.
_TIME_LIKE: dict[str, Callable[[float], float]] = {
    "s_per_step": lambda x: x,
    "tokens_per_s_per_gpu": lambda x: 1 / x,  # same tokens per step and GPUs within a job
    "mfu": lambda x: 1 / x,  # same model FLOPs per step, GPUs and peak within a job
}


def measured_time_like(r: dict[str, str], where: str) -> float:
    """The one measurement column a row fills, made time-like; several or none: one line naming the row."""
    filled = [k for k in _TIME_LIKE if r.get(k)]
    if len(filled) != 1:
        raise ConfigError(f"{where}: expected exactly one of {', '.join(_TIME_LIKE)} filled; got {filled or 'none'}")
    return _TIME_LIKE[filled[0]](float(r[filled[0]]))


def jobs() -> dict[str, list[tuple[str, Job, float]]]:
    """Job name -> (plan label, job, measured time-like quantity: only the order within a job matters)."""
    out: dict[str, list[tuple[str, Job, float]]] = defaultdict(list)
    for path in sorted(DATA.glob("*.csv")):
        for n, r in enumerate(_read(path), start=1):
            label = f"dp{r['data_parallel']} tp{r['tensor_parallel']} pp{r['pipeline_parallel']} "
            label += (
                f"vp{r['virtual_pipeline']} mbs{r['micro_batch_size']} {r['schedule']} asyncTP={r['tp_comm_overlap']}"
                f" rc={r['recompute']}"
            )
            job = _plan_job(r)
            if job.plan.zero_shard_ranks is not None:
                label += f" zero-shard{job.plan.zero_shard_ranks}"
            out[r["job"]].append((label, job, measured_time_like(r, f"{path.name} data row {n}")))
    for r in korthikanti_rows():
        out[f"gpt-{r['model']} {r['gpus']} A100 (Korthikanti)"].append(
            (r["mode"], korthikanti_job(r), float(r["measured_s"]))
        )
    return {name: one_row_per_configuration(plans) for name, plans in out.items()}


def configuration_key(job: Job) -> str:
    """What makes two rows one configuration: every field of the job, ZeRO's state sharded within groups of all
    the data × context-parallel ranks (plan.zero_shard_ranks = dp · cp: one copy of the state, InternLM's zero1=8
    on 8 data-parallel GPUs) written as sharded over every rank (zero_shard_ranks unset), which it is."""
    doc, p = job.to_dict(), job.plan
    if p.zero_shard_ranks == p.dp * p.context_parallel:
        doc["plan"]["zero_shard_ranks"] = None
    return json.dumps(doc, sort_keys=True)


def one_row_per_configuration(plans: list[tuple[str, Job, float]]) -> list[tuple[str, Job, float]]:
    """A job's rows of one configuration (configuration_key) as one plan at the median of their measurements, as
    checking_jobs takes a plan measured in several rows; labelled by its first row."""
    rows: dict[str, list[tuple[str, Job, float]]] = defaultdict(list)
    for plan in plans:
        rows[configuration_key(plan[1])].append(plan)
    return [(same[0][0], same[0][1], statistics.median(m for _, _, m in same)) for same in rows.values()]


def checking_jobs() -> dict[str, list[tuple[str, Job, float]]]:
    """Jobs of the checking table (data/published/checking, validation/checking_step_times.py): its expressed
    rows of one source, model, system, global batch and dtype with two or more distinct plans, each plan at the
    median of its measured seconds; none whose model, GPUs, sequence, global batch and dtype a plan_ranking
    file already holds, nor SAME_AS_RANKING's."""
    held = {
        (r["model"], int(r["gpus"]), int(r["seq_length"]), int(r["global_batch_size"]), r["dtype"])
        for path in DATA.glob("*.csv")
        for r in _read(path)
    }
    groups: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for row in checking_rows():
        if row.skipped or row.source in SAME_AS_RANKING:
            continue
        key = (row.model.get("preset"), row.gpus, row.model["seq_length"], row.plan["global_batch_size"])
        if (*key, row.plan["dtype"]) in held:
            continue
        job = json.dumps([row.source, row.model, row.system, row.plan["global_batch_size"], row.plan["dtype"]])
        groups[job][json.dumps(row.plan, sort_keys=True)].append(row)
    out: dict[str, list[tuple[str, Job, float]]] = {}
    for plans in groups.values():
        if len(plans) < 2:
            continue
        first = next(iter(plans.values()))[0]
        name = f"{first.model.get('preset', 'custom')} {first.gpus} {first.family} (checking: {first.source})"
        out[name] = [
            (
                rows[0].label,
                Job.from_dicts(rows[0].model, rows[0].plan, rows[0].system, source=rows[0].label),
                statistics.median(r.measured_s for r in rows),
            )
            for rows in plans.values()
        ]
    return out


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall τ-a over all pairs: (concordant − discordant) / pairs."""
    pairs = list(itertools.combinations(range(len(a)), 2))
    score = sum((a[i] - a[j]) * (b[i] - b[j]) > 0 for i, j in pairs) - sum(
        (a[i] - a[j]) * (b[i] - b[j]) < 0 for i, j in pairs
    )
    return score / len(pairs)


def main() -> None:
    totals = []
    for title, found in (("plan_ranking files", jobs()), ("checking table", checking_jobs())):
        print(f"== jobs from the {title}")
        totals.append(rank(found))
        print(totals[-1][0])
    taus = [t for _, ts, _, _, _ in totals for t in ts]
    losses = [x for _, _, xs, _, _ in totals for x in xs]
    picked, counted = sum(t[3] for t in totals), sum(t[4] for t in totals)
    print(f"== all: {summary(taus, picked, counted, losses)}")


def rank(found: dict[str, list[tuple[str, Job, float]]]) -> tuple[str, list[float], list[float], int, int]:
    """Prints each job's plans, predicted and measured; returns (summary line, τ per job, loss per counted job,
    jobs whose fastest was ranked first, jobs counted: plans differing by ≥ DISTINCT)."""
    picked = counted = 0
    taus, losses = [], []
    for name, plans in found.items():
        predicted = [predict(job).step_time_s for _, job, _ in plans]
        measured = [m for _, _, m in plans]
        tau = kendall_tau(predicted, measured)
        best = min(range(len(plans)), key=measured.__getitem__)
        pick = min(range(len(plans)), key=predicted.__getitem__)
        loss = measured[pick] / measured[best] - 1
        spread = max(measured) / min(measured) - 1
        first = loss == 0  # a plan tied with the measured fastest (times printed in whole seconds) counts as it
        taus.append(tau)
        if spread >= DISTINCT:
            counted += 1
            picked += first
            losses.append(loss)
        print(f"{name}: {len(plans)} plans, measured spread {spread:.1%}, τ {tau:+.2f}, ", end="")
        print("fastest ranked first" if first else f"picked {plans[pick][0]} (loss {loss:.1%})")
        for (label, _, m), p in zip(plans, predicted, strict=True):
            print(f"    {label:55} measured {m / measured[best]:.3f}× best, predicted {p:.3f} s")
    return summary(taus, picked, counted, losses), taus, losses, picked, counted


def summary(taus: list[float], picked: int, counted: int, losses: list[float]) -> str:
    return (
        f"{len(taus)} jobs: mean Kendall τ {sum(taus) / len(taus):+.2f}; fastest ranked first on {picked}/{counted} "
        f"jobs differing by ≥ {DISTINCT:.0%}; mean loss {sum(losses) / max(len(losses), 1):.1%}, "
        f"worst {max(losses, default=0.0):.1%}"
    )


if __name__ == "__main__":
    try:
        main()
    except ConfigError as exc:
        print(f"plan_ranking: {exc}", file=sys.stderr)
        sys.exit(2)
