"""One interface over every workload (DESIGN.md §8): what the commands ask of a job, whatever it trains.

A job file, or presets with `--set` overrides, names a dense or mixture-of-experts transformer
(config/model.py; plan: config/plan.py) or a DLRM (a DLRM preset such as `model: dlrm-small`, or a
model section with `tables`; plan: batch_per_rank and an optional sharding, workloads/dlrm.py).
`load_workload` tells which from the model section. Each workload gives its prediction (one
Forecast: step, breakdown, memory, critical path), its throughput, the figures `compare` sets side
by side, its step graph with what the variability model needs of it, and its report sections; its
plan space is searched by `itercast search` (search/plan_search.py for transformers: parallel sizes,
schedules, ZeRO, recompute; search/dlrm_search.py for a DLRM: shardings × batch per GPU).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from itercast.checked_runs import runs_like
from itercast.config.job import Job, blame_overrides, raw_sections
from itercast.errors import ConfigError
from itercast.memory import MemoryEstimate
from itercast.predict import DLRMPrediction, Forecast, Prediction, predict, predict_dlrm
from itercast.report import html_report as rep
from itercast.sim.analysis import breakdown
from itercast.stochastic.variability import StepGraph, build_transformer_step
from itercast.workloads.dlrm import DLRMJob, IndexSample, Shard, Strategy, dlrm_notes, is_dlrm_model
from itercast.workloads.transformer_ops import priced_notes

#: MFU points between the model-FLOPs count and the causal one from which `predict` prints both (Prediction.mfu_causal):
#: printed for Llama 3 8B at its 8,192 tokens (half its scores 11% of its FLOPs: 6 points at 55% MFU) and at 4,096
#: (6.3%: 3 points at 50%), not for GPT-3 175B at 2,048 (1.4%: 0.7 points)
CAUSAL_MFU_GAP = 0.02


def seconds(value_s: float) -> str:
    """A duration as a reader takes it in: `1.234 s`, or below a second `12.345 ms` (a DLRM step)."""
    return f"{value_s:.3f} s" if value_s >= 1 else f"{value_s * 1e3:.3f} ms"


class Workload(Protocol):
    """What every command asks of a job (the implementations below)."""

    kind: str

    @property
    def name(self) -> str: ...

    @property
    def num_gpus(self) -> int: ...

    @property
    def gpus_per_node(self) -> int: ...

    def headline(self) -> str:
        """One line: the model, its GPUs and its plan."""
        ...

    def predict(self, calibration: dict[str, Any] | None = None) -> Forecast: ...

    def notes(self, calibration: dict[str, Any] | None = None, forecast: Forecast | None = None) -> list[str]:
        """What the forecast's price leaves out or rests on, said beside it by every command that prices the job
        (`forecast`: the one priced, where the notes depend on what it chose)."""
        ...

    def throughput(self, forecast: Forecast) -> tuple[str, float]:
        """(name with its unit, value): tokens or samples per second."""
        ...

    def summary_rows(self, forecast: Forecast) -> list[tuple[str, str]]:
        """The lines a reader wants first: step, throughput, efficiency, memory, the plan's choices."""
        ...

    def step_graph(self, calibration: dict[str, Any] | None = None) -> StepGraph:
        """The step graph the variability model samples, with what each of its ranks stands for, priced by
        `calibration`'s curves (None: the built-in ones), as `predict`'s."""
        ...

    def to_dict(self) -> dict[str, Any]: ...


def nodes_text(count: int) -> str:
    """'1 node', '2 nodes': a headline's node count."""
    return f"{count:,} node{'' if count == 1 else 's'}"


@dataclass(frozen=True)
class TransformerWorkload:
    """A dense or mixture-of-experts transformer job."""

    job: Job
    kind: str = "transformer"

    @property
    def name(self) -> str:
        return self.job.model.name

    @property
    def num_gpus(self) -> int:
        return self.job.system.num_gpus

    @property
    def gpus_per_node(self) -> int:
        return self.job.system.node.gpus_per_node

    def headline(self) -> str:
        job, p = self.job, self.job.plan
        dispatch = {
            "flex": " over the flex dispatcher",
            "torchtitan_deepep": " over torchtitan's DeepEP backend",
            "einsum": " in DeepSpeed's einsum MoE layer",
            "gather": " in DeepSpeed's index-gather MoE layer",
        }
        flex = dispatch.get(p.moe_token_dispatcher, "")
        experts = f", experts ep {p.expert_parallel} × etp {p.etp}{flex}" if job.model.is_moe else ""
        shard = "" if p.zero_shard_ranks is None else f" sharded within {p.zero_shard_ranks} ranks"
        gpus = job.stage_gpus()
        kinds = " + ".join(
            f"{job.system.num_gpus * sum(g == k for g in gpus) // len(gpus)}× {k.name}"
            for i, k in enumerate(gpus)
            if k not in gpus[:i]
        )
        return (
            f"{job.model.name} on {kinds} ({job.system.name}, {nodes_text(job.system.num_nodes)}) — dp {p.dp} × tp "
            f"{p.tensor_parallel} × pp {p.pipeline_parallel} × cp {p.context_parallel}{experts}, {p.schedule}, "
            f"{job.num_microbatches} micro-batches of {p.micro_batch_size}, ZeRO {p.zero_stage}{shard}, "
            f"recompute {p.recompute}"
        )

    def predict(self, calibration: dict[str, Any] | None = None) -> Prediction:
        return predict(self.job, calibration)

    def notes(self, calibration: dict[str, Any] | None = None, forecast: Forecast | None = None) -> list[str]:
        """transformer_ops.priced_notes of the job (the calibration and the forecast change none of them)."""
        return priced_notes(self.job.model, self.job.plan, self.job.system)

    def throughput(self, forecast: Forecast) -> tuple[str, float]:
        assert isinstance(forecast, Prediction)
        return "tokens_per_s", forecast.tokens_per_s

    def summary_rows(self, forecast: Forecast) -> list[tuple[str, str]]:
        assert isinstance(forecast, Prediction)
        r, p = forecast, self.job.plan
        rows = [
            ("step time", f"{r.step_time_s:.3f} s"),
            (
                "throughput",
                f"{r.tokens_per_s:,.0f} tokens/s, {r.model_tflops_per_gpu:.1f} TFLOP/s per GPU, MFU {r.mfu:.1%}",
            ),
        ]
        if r.mfu - r.mfu_causal >= CAUSAL_MFU_GAP:
            rows.append(
                (
                    "",
                    f"(attention counted over every key, as Megatron-LM and torchtitan count FLOPs; counting its "
                    f"causal half alone: MFU {r.mfu_causal:.1%})",
                )
            )
        if r.hardware_flops_per_step > r.model_flops_per_step:
            counted = r.hardware_flops_per_step / r.step_time_s / self.num_gpus / 1e12
            rows.append(
                (
                    "",
                    f"(model FLOPs only; counting the {p.recompute} recompute as papers often do: "
                    f"{counted:.1f} TFLOP/s)",
                )
            )
        if self.job.system.device_groups:
            rows.append(("stages on", ", ".join(f"{s}: {g.name}" for s, g in enumerate(self.job.stage_gpus()))))
        return rows + _memory_rows(r, "stage")

    def step_graph(self, calibration: dict[str, Any] | None = None) -> StepGraph:
        """One representative GPU per pipeline stage (stochastic/variability.transformer_step)."""
        return build_transformer_step(self.job, calibration)

    def to_dict(self) -> dict[str, Any]:
        return self.job.to_dict()


@dataclass(frozen=True)
class DLRMWorkload:
    """A DLRM job; `index_counts`: samples of real indices per table (shard --indices)."""

    job: DLRMJob
    index_counts: dict[str, IndexSample] | None = None
    kind: str = "dlrm"

    @property
    def name(self) -> str:
        return self.job.model.name

    @property
    def num_gpus(self) -> int:
        return self.job.system.num_gpus

    @property
    def gpus_per_node(self) -> int:
        return self.job.system.node.gpus_per_node

    def headline(self) -> str:
        j = self.job
        sharding = "its sharding" if j.plan.sharding is not None else "the sharding planner's fastest sharding"
        return (
            f"{j.model.name} on {self.num_gpus}× {j.system.gpu.name} ({j.system.name}, "
            f"{nodes_text(j.system.num_nodes)}) — "
            f"{j.plan.batch_per_rank} samples per GPU, {len(j.model.tables)} tables, {sharding}"
        )

    def predict(self, calibration: dict[str, Any] | None = None) -> DLRMPrediction:
        return predict_dlrm(self.job, calibration, self.index_counts)

    def notes(self, calibration: dict[str, Any] | None = None, forecast: Forecast | None = None) -> list[str]:
        """dlrm_notes of the job under `calibration`'s operator models, of its sharding (the plan's, else the one
        `forecast` priced)."""
        j = self.job
        plan = j.shards() or (forecast.sharding if isinstance(forecast, DLRMPrediction) else None)
        return dlrm_notes(j.model, j.system, j.plan.batch_per_rank, calibration, plan, self.index_counts)

    def throughput(self, forecast: Forecast) -> tuple[str, float]:
        assert isinstance(forecast, DLRMPrediction)
        return "samples_per_s", forecast.samples_per_s

    def summary_rows(self, forecast: Forecast) -> list[tuple[str, str]]:
        assert isinstance(forecast, DLRMPrediction)
        r = forecast
        rows = [
            ("step time", f"{r.step_time_s * 1e3:.3f} ms"),
            ("throughput", f"{r.samples_per_s:,.0f} samples/s"),
            ("sharding", f"{sharding_summary(r.sharding)} (from {r.sharding_from})"),
        ]
        return rows + _memory_rows(r, "rank")

    def step_graph(self, calibration: dict[str, Any] | None = None) -> StepGraph:
        """The predicted step's graph: every GPU a rank of its own, each compute task on one GPU."""
        return StepGraph(self.predict(calibration).sim.graph, gpus_per_task=1, gpus_per_rank=1)

    def to_dict(self) -> dict[str, Any]:
        return self.job.to_dict()


def _memory_rows(r: Forecast, where: str) -> list[tuple[str, str]]:
    mem = r.memory
    oom = " OUT OF MEMORY" if mem.oom else ""
    return [
        (
            "memory per GPU",
            f"{mem.total_bytes / 2**30:.1f} GiB of {mem.capacity_bytes / 2**30:.3g} GiB{oom} ({where} {mem.stage})",
        )
    ]


#: the sharding line's code of each TorchRec strategy (sharding_summary, parse_sharding_line)
SHORT_STRATEGY: dict[Strategy, str] = {"table_wise": "TW", "column_wise": "CW", "row_wise": "RW", "data_parallel": "DP"}


def sharding_summary(plan: dict[str, Any]) -> str:
    """`t0 TW@0, t1 RW, t2 CW@0-7, …`: a sharding on one line, consecutive ranks as a range."""
    parts = []
    for name, s in plan.items():
        where = f"@{rank_ranges(s.ranks)}" if s.strategy in ("table_wise", "column_wise") else ""
        parts.append(f"{name} {SHORT_STRATEGY[s.strategy]}{where}")
    return ", ".join(parts)


def parse_sharding_line(text: str, world: int) -> dict[str, Shard]:
    """The sharding a `sharding_summary` line states (`t0 TW@0, t1 RW, t2 CW@0-7`), as `shard` prints it: row-wise
    and data-parallel tables span every one of the `world` ranks; table- and column-wise ones name theirs (`@` ranks
    and `first-last` runs, in order). Each malformed part is named; what the ranks mean is checked by the caller
    (check_sharding)."""
    codes = {code: strategy for strategy, code in SHORT_STRATEGY.items()}
    plan: dict[str, Shard] = {}
    for part in (p.strip() for p in re.split(r",\s*(?=\D)", text) if p.strip()):  # `0-2,5`: one part
        name, _, rest = part.partition(" ")
        code, at, where = rest.strip().partition("@")
        if not name or code not in codes:
            raise ConfigError(f"--sharding {part!r}: expected `TABLE CODE[@RANKS]`, CODE one of {', '.join(codes)}")
        strategy = codes[code]
        if (strategy in ("table_wise", "column_wise")) != bool(at):
            need = "names its ranks (@0, @0-3)" if not at else "spans every rank (no @)"
            raise ConfigError(f"--sharding {part!r}: {strategy} {need}")
        ranks: list[int] = []
        for run in where.split(",") if at else []:
            first, dash, last = run.partition("-")
            if not first.isdigit() or (dash and not last.isdigit()) or len(first) + len(last) > 7:
                raise ConfigError(f"--sharding {part!r}: ranks {where!r}: expected ranks like 0 or 0-7")
            ranks += range(int(first), int(last if dash else first) + 1)
        if name in plan:
            raise ConfigError(f"--sharding: table {name!r} is given twice")
        plan[name] = Shard(strategy, tuple(ranks) if at else tuple(range(world)))
    return plan


def rank_ranges(ranks: tuple[int, ...]) -> str:
    """Ranks in their order, each run of consecutive ones as `first-last`: (0, 1, 2, 5) -> `0-2,5`."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def load_workload(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    model: str | None = None,
    system: str | None = None,
) -> TransformerWorkload | DLRMWorkload:
    """The job of a YAML file and/or presets with `section.field=value` overrides, of whichever workload
    its model section names."""
    raw = raw_sections(path, overrides, model, system)
    source = str(path) if path else "<command line>"
    try:
        if is_dlrm_model(raw["model"]):
            return DLRMWorkload(DLRMJob.from_dicts(raw["model"], raw["plan"], raw["system"], source))
        return TransformerWorkload(Job.from_dicts(raw["model"], raw["plan"], raw["system"], source))
    except ConfigError as exc:
        raise blame_overrides(exc, source, overrides) from None


def compare_figures(w: TransformerWorkload | DLRMWorkload, r: Forecast) -> dict[str, float]:
    """The figures `itercast compare` sets side by side: step, throughput, MFU (a transformer's),
    memory per GPU and the breakdown of the rank that finishes last."""
    name, value = w.throughput(r)
    out = {"step_time_s": r.step_time_s, name: value}
    if isinstance(r, Prediction):
        out["mfu"] = r.mfu
    out["memory_per_gpu_bytes"] = r.memory.total_bytes
    return out | {f"breakdown.{k}": v for k, v in r.breakdown.as_dict().items() if k != "rank"}


def oom_note(mem: MemoryEstimate, what: str = "the plan") -> str:
    """What `predict`, `compare` and `variability` say of a plan whose most loaded GPU does not fit."""
    return (
        f"{what} does not fit: {mem.total_bytes / 2**30:.1f} GiB per GPU on stage {mem.stage}, "
        f"{mem.capacity_bytes / 2**30:.0f} GiB available (`itercast search` finds plans that fit)"
    )


def same_kind(a: TransformerWorkload | DLRMWorkload, b: TransformerWorkload | DLRMWorkload, what: str) -> None:
    if a.kind != b.kind:
        raise ConfigError(f"{what}: a {a.kind} and a {b.kind} job: compare like with like")


#: when the sampled p50 exceeds the deterministic step by more than this share, the report and `variability`
#: say why (below it the two agree at the precision they print)
P50_ABOVE_REL = 5e-4
P50_ABOVE = "The p50 lies above the deterministic step: each rendezvous waits for the slowest GPU's draw."


def report_sections(
    w: TransformerWorkload | DLRMWorkload,
    r: Forecast,
    samples_s: np.ndarray,
    deterministic_s: float,
    within_s: float | None,
    notes: list[str],
) -> list[rep.Section]:
    """A job's report: its summary, the step per pipeline stage (a DLRM: per rank), the simulated
    timeline, memory per GPU, the step-time distribution, the critical path by family and `notes`, what the
    forecast leaves out or rests on (Workload.notes)."""
    units = sorted({int(x) for x in r.sim.graph.resource_rank.tolist()})
    per_unit = [breakdown(r.sim, u) for u in units]
    unit = "pipeline stage" if w.kind == "transformer" else "rank"
    q = np.percentile(samples_s, [50, 95, 99])
    within = None if within_s is None else float(np.mean(samples_s <= within_s))
    deadline = "" if within_s is None else f"; P(step ≤ {seconds(within_s)}) = {within:.1%}"
    rows = [*w.summary_rows(r), *((part, seconds(getattr(r.breakdown, key))) for key, (part, _) in rep.PARTS.items())]
    return [
        rep.Section("Summary", rep.table_html(["", "value"], rows)),
        rep.Section(
            f"Where the step goes, per {unit}",
            rep.stage_breakdown_svg(per_unit, unit)
            + '<p class="note">Each bar sums to the step time: what its compute stream was doing '
            "(a wait is charged to what it waited for).</p>",
        ),
        rep.Section("Timeline of the simulated step", rep.timeline_svg(r.sim)),
        rep.Section(f"Memory per GPU (most loaded {unit})", rep.memory_svg(r.memory)),
        rep.Section(
            f"Step-time distribution (Monte Carlo, {len(samples_s):,} samples of itercast variability's default model)",
            rep.cdf_svg(samples_s, deterministic_s, within_s)
            + f'<p class="note">p50 {seconds(q[0])}, p95 {seconds(q[1])}, p99 {seconds(q[2])}{deadline}.'
            + (f" {P50_ABOVE}" if q[0] > deterministic_s * (1 + P50_ABOVE_REL) else "")
            + "</p>",
        ),
        rep.Section(
            "Critical path by family", rep.seconds_by_family_svg(r.critical_path, "seconds on the critical path")
        ),
        *_notes_section(notes),
        *_checked_section(w),
    ]


def _notes_section(notes: list[str]) -> list[rep.Section]:
    """What the forecast's price leaves out or rests on (Workload.notes), one paragraph each, or nothing."""
    if not notes:
        return []
    body = "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes)
    return [rep.Section("What this forecast leaves out or rests on", body)]


def _checked_section(w: TransformerWorkload | DLRMWorkload) -> list[rep.Section]:
    """The checking table's runs of a transformer job's model on its GPU family (checked_runs.runs_like), one row
    each, or nothing where there are none."""
    runs = runs_like(w.job) if isinstance(w, TransformerWorkload) else []
    if not runs:
        return []
    headers = ["published run", "source", "GPUs", "tokens a sequence", "measured", "itercast", "measured / itercast"]
    rows = [
        (r.label, r.source, r.gpus, r.seq_length, seconds(r.measured_s), seconds(r.predicted_s), f"{r.ratio:.2f}x")
        for r in sorted(runs, key=lambda r: (r.gpus, r.label))
    ]
    return [
        rep.Section(
            f"Published runs of this model on {runs[0].gpu_family} GPUs (the checking table)",
            rep.table_html(headers, rows)
            + '<p class="note">Each its own plan and size, measured by its source, against itercast\'s step for it '
            "(validation/checking_step_times.py): above 1x itercast was too fast.</p>",
        )
    ]
