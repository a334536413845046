"""Predicted vs measured step time on the CHECKING table: published runs nothing in itercast was tuned on.

    python validation/checking_step_times.py

Data: data/published/checking/*.csv, each frozen before any prediction was made on its rows, on the date its
first line gives (issue 27: fitting apart from checking; megatron_bridge_h100_2026.csv, Megatron-Bridge's
2026 releases, on 2026-11-30; megatron_bridge_cuda_graph_ab_h100.csv, megatron_bridge_skills_cards_h100.csv and
megatron_lm_moe_recipes_h100.csv on 2026-12-01; nemo_long_sequence_h100.csv on 2026-12-02; the others on
2026-11-25). Each file starts with `#` lines naming
its source (repository@commit:path or paper and table), the hardware, and how step_time_s follows from the published
number (seconds per iteration as printed, or tokens/s or TFLOP/s per GPU with the global batch, sequence and
the stated FLOP count). One row is one published measurement with every plan field the source states; the
rest is in its `assumed` column with the reason. A row the source describes but itercast cannot express
carries the reason in `not_expressible` and is listed as skipped; a row the tool refuses is listed with its
error.

Not a fitting table: validation/step_times.py, published_step_times.py and search_ranks.py read the
tables the models were chosen on. The rows here must not be edited, dropped or re-derived after seeing
their errors; a change to a row is a new frozen version of the table, stated in its header.

Printed: every row (source, label, GPUs, GPU, measured s, predicted s, signed error, OOM), the skipped
rows with their reasons, then per distinct configuration (a configuration measured several times counts
once, at the median of its measurements) the geomean, mean and max |error| and the mean signed error:
overall, per GPU family and per source; and the rows itercast judges out of memory although they ran.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.checked_runs import CheckedRun, model_signature
from itercast.config.job import Job, parse_section
from itercast.errors import ConfigError
from itercast.predict import predict

CHECKING = Path(__file__).resolve().parents[1] / "data" / "published" / "checking"
#: a checking file's first line, with the date it was frozen (before any prediction on its rows)
FROZEN = re.compile(r"# CHECKING SET, frozen (\d{4}-\d{2}-\d{2}): itercast's models were not tuned on these rows")

#: Plan columns passed to itercast as they are (typed by `typed`); blanks are left to itercast's defaults.
PLAN_COLUMNS = (
    "tensor_parallel",
    "pipeline_parallel",
    "context_parallel",
    "data_parallel",
    "expert_parallel",
    "expert_tensor_parallel",
    "virtual_pipeline",
    "schedule",
    "sequence_parallel",
    "micro_batch_size",
    "global_batch_size",
    "dtype",
    "zero_stage",
    "recompute",
    "flash_attention",
    "grad_reduce_dtype",
    "overlap_grad_reduce",
    "overlap_param_gather",
    "tp_comm_overlap",
)


@dataclass
class Row:
    source: str
    label: str
    gpu: str
    gpus: int
    measured_s: float
    model: dict[str, Any] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)
    system: dict[str, Any] = field(default_factory=dict)
    predicted_s: float | None = None
    memory_gib: float = 0.0
    capacity_gib: float = 0.0
    oom: bool = False
    skipped: str = ""

    @property
    def family(self) -> str:
        """A100, H100, H200 or V100: the GPU column up to its first dash."""
        return self.gpu.split("-")[0]

    @property
    def error(self) -> float:
        assert self.predicted_s is not None
        return self.predicted_s / self.measured_s - 1


def typed(text: str) -> Any:
    """A CSV cell as a list (`[a b]`: its space-separated items, each typed), None (`null`: a field unset from
    its preset's value), bool, int, float or str (in that order of preference)."""
    low = text.strip().lower()
    if low.startswith("[") and low.endswith("]"):
        return [typed(item) for item in text.strip()[1:-1].split()]
    if low == "null":
        return None
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip()


def parse_fields(text: str) -> dict[str, Any]:
    """`a=1;b.c=x` → {"a": 1, "b": {"c": "x"}}: the model_fields / plan_fields / system_fields cells
    (plan_fields: plan settings without a column of their own, such as recompute_method; a table of
    version 2 on has the column)."""
    out: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"field `{item}`: expected NAME=VALUE")
        *parents, leaf = key.strip().split(".")
        node = out
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = typed(value)
    return out


def read_table(path: Path) -> list[dict[str, str]]:
    """One checking CSV: its first line must be the frozen-set line, then `#` comments, then the rows."""
    with path.open(newline="", encoding="utf-8-sig") as fh:  # utf-8-sig: a spreadsheet's byte-order mark
        lines = fh.read().splitlines()
    first = lines[0] if lines else ""
    found = FROZEN.fullmatch(first)
    try:
        frozen_on = date.fromisoformat(found.group(1)) if found else None
    except ValueError:
        frozen_on = None
    if frozen_on is None or frozen_on > date.today():
        raise ValueError(
            f"{path.name}: first line is not the frozen-set header `# CHECKING SET, frozen YYYY-MM-DD: itercast's "
            f"models were not tuned on these rows` with a past date; got {first[:100]!r}"
        )
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    if not rows:
        raise ValueError(f"{path.name}: no rows after its header")
    return rows


def sections(r: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(model, plan, system) raw sections of one row, for Job.from_dicts."""
    model = parse_fields(r["model_fields"]) | {"seq_length": int(r["seq_length"])}
    if r["model"] != "custom":
        model = {"preset": r["model"], **model}
    plan = {k: typed(r[k]) for k in PLAN_COLUMNS if r[k].strip()} | parse_fields(r.get("plan_fields") or "")
    if r["stage_layers"].strip():
        plan["stage_layers"] = [int(n) for n in r["stage_layers"].split()]
    system = {"preset": r["system"], **parse_fields(r["system_fields"])}
    per_node = parse_section("system", system).node.gpus_per_node  # type: ignore[attr-defined]
    system["num_nodes"] = max(int(r["gpus"]) // per_node, 1)
    return model, plan, system


def load_rows(folder: Path = CHECKING) -> list[Row]:
    rows = []
    for path in sorted(folder.glob("*.csv")):
        for r in read_table(path):
            row = Row(path.stem, r["label"], r["gpu"], int(r["gpus"]), float(r["step_time_s"]))
            row.skipped = r["not_expressible"].strip()
            if not row.skipped:
                try:
                    row.model, row.plan, row.system = sections(r)
                except (ConfigError, ValueError) as exc:
                    row.skipped = str(exc).splitlines()[0]
            rows.append(row)
    if not rows:
        raise ValueError(f"{folder}: no checking tables (*.csv)")
    return rows


def _predicted(row: Row) -> tuple[float, float, float, bool] | str:
    """(step s, memory GiB, capacity GiB, out of memory) of one row's prediction, or the first line of its error."""
    try:
        p = predict(Job.from_dicts(row.model, row.plan, row.system, source=row.label))
    except ConfigError as exc:
        return str(exc).splitlines()[0]
    return p.step_time_s, p.memory.total_bytes / 2**30, p.memory.capacity_bytes / 2**30, p.memory.oom


def run(rows: list[Row], workers: int = 1) -> None:
    """Predict every row not skipped, in `workers` processes (each row's prediction is independent), once per
    distinct job: rows of one job measured several times (releases of one recipe) share its prediction; a job
    the tool refuses is tried row by row, so that each row's error names its own label."""
    todo = [row for row in rows if not row.skipped]
    jobs: dict[str, list[Row]] = {}
    for row in todo:
        jobs.setdefault(json.dumps([row.model, row.plan, row.system], sort_keys=True), []).append(row)
    first = [same[0] for same in jobs.values()]
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:  # one row at a time: their costs differ 1,000-fold
            results = list(pool.map(_predicted, first))
    else:
        results = [_predicted(row) for row in first]
    for same, result in zip(jobs.values(), results, strict=True):
        for row in same:
            if isinstance(result, str):
                found = result if row is same[0] else _predicted(row)
                assert isinstance(found, str), f"{row.label}: refused as {same[0].label}, not alone"
                row.skipped = found
                continue
            row.predicted_s, row.memory_gib, row.capacity_gib, row.oom = result


def report_rows(rows: list[Row]) -> None:
    print(f"{'source':40} {'row':72} {'GPUs':>5} {'GPU':10} {'measured_s':>10} {'predicted_s':>11} {'error':>8}")
    for row in rows:
        if row.predicted_s is None:
            continue
        flag = f"  OOM ({row.memory_gib:.0f} of {row.capacity_gib:.0f} GiB)" if row.oom else ""
        print(
            f"{row.source:40} {row.label[:72]:72} {row.gpus:5d} {row.gpu:10} {row.measured_s:10.3f} "
            f"{row.predicted_s:11.3f} {row.error:+8.1%}{flag}"
        )
    skipped = [r for r in rows if r.predicted_s is None]
    print(f"\nrows not expressed ({len(skipped)} of {len(rows)}):")
    for row in skipped:
        print(f"  {row.source:40} {row.label[:72]:72}  {row.skipped}")


def distinct(rows: list[Row]) -> list[tuple[Row, float]]:
    """One (representative row, signed error) per distinct (source, model, plan, system): the error
    against the median of that configuration's measurements."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        if row.predicted_s is not None:
            key = json.dumps([row.source, row.model, row.plan, row.system], sort_keys=True)
            groups.setdefault(key, []).append(row)
    out = []
    for members in groups.values():
        measured = statistics.median(r.measured_s for r in members)
        predicted = members[0].predicted_s
        assert predicted is not None
        out.append((members[0], predicted / measured - 1))
    return out


def summary_line(name: str, errs: list[tuple[Row, float]]) -> str:
    absolute = [abs(e) for _, e in errs]
    geo = math.exp(sum(math.log(max(a, 1e-9)) for a in absolute) / len(absolute))
    worst_row, worst = max(errs, key=lambda re: abs(re[1]))
    signed, mean = sum(e for _, e in errs) / len(errs), sum(absolute) / len(absolute)
    return (
        f"{name:40} configs {len(errs):3d}  geomean |error| {geo:6.1%}  mean |error| {mean:6.1%}"
        f"  mean signed {signed:+7.1%}  max |error| {worst:+7.1%} ({worst_row.label[:60]})"
    )


def report_summary(rows: list[Row]) -> None:
    configs = distinct(rows)
    expressed = sum(r.predicted_s is not None for r in rows)
    print(f"\nper distinct configuration ({len(configs)} of {expressed} predicted rows):")
    print(summary_line("ALL", configs))
    for title, key in (("GPU family", lambda r: r.family), ("source", lambda r: r.source)):
        print(f"by {title}:")
        for name in sorted({key(r) for r, _ in configs}):
            print(summary_line(f"  {name}", [(r, e) for r, e in configs if key(r) == name]))
    ooms = [r for r in rows if r.oom]
    print(f"\nrows itercast judges out of memory although they ran ({len(ooms)}):")
    for row in ooms:
        print(f"  {row.source:40} {row.label[:72]:72}  {row.memory_gib:.1f} GiB > {row.capacity_gib:.1f} GiB")


def checked(rows: list[Row]) -> list[CheckedRun]:
    """The predicted rows per distinct configuration (as `distinct` groups them), its measured step the median of
    its measurements, for itercast/checked_runs.py."""
    out = []
    for row, error in distinct(rows):
        assert row.predicted_s is not None
        job = Job.from_dicts(row.model, row.plan, row.system)
        out.append(
            CheckedRun(
                label=row.label,
                source=row.source,
                gpu_family=row.family,
                gpus=row.gpus,
                seq_length=job.model.seq_length,
                measured_s=row.predicted_s / (1 + error),
                predicted_s=row.predicted_s,
                model=model_signature(job.model),
            )
        )
    return out


def write_checked(rows: list[Row], path: Path) -> None:
    """Write `checked(rows)` as itercast/checked_runs.py reads it."""
    runs = [asdict(run) for run in checked(rows)]
    models = list({json.dumps(run["model"], sort_keys=True): run["model"] for run in runs}.values())
    for run in runs:  # each model once: the runs name it by its place in `models`
        run["model"] = models.index(run["model"])
    doc = {
        "written_by": "python validation/checking_step_times.py --write-checked itercast/checked_runs.json",
        "models": models,
        "runs": runs,
    }
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"\nwrote {len(doc['runs'])} configurations to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--write-checked",
        type=Path,
        metavar="PATH",
        help="also write each configuration's measured and predicted step (itercast/checked_runs.json)",
    )
    args = parser.parse_args()
    rows = load_rows()
    run(rows)
    report_rows(rows)
    report_summary(rows)
    if args.write_checked is not None:
        write_checked(rows, args.write_checked)


if __name__ == "__main__":
    main()
