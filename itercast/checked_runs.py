"""How itercast's step compared with published runs of the same model on the same GPU family.

The checking table (data/published/checking/: published runs nothing in itercast was tuned on, read by
validation/checking_step_times.py) is kept here per distinct configuration, its measured step (the median of a
configuration's measurements, seconds) beside itercast's (seconds) and the model it ran, in checked_runs.json
(each model once),
written by `python validation/checking_step_times.py --write-checked itercast/checked_runs.json`.
tests/test_checked_runs.py predicts every kept configuration again, so a model change that moves one fails the
tests until the file is written again. `checked_note` says, for a job, how its model's runs on its GPU family
compared: a forecast's error bar where one was measured, said beside the forecast.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from itercast.config.job import Job
from itercast.config.model import ModelConfig

CHECKED_RUNS_PATH = Path(__file__).with_name("checked_runs.json")
#: ModelConfig fields a run of "the same model" may differ in: the preset's name and the sequence length
NOT_THE_MODEL = frozenset({"name", "seq_length"})


@dataclass(frozen=True)
class CheckedRun:
    """One distinct configuration of the checking table: where it comes from, and its two step times."""

    label: str
    source: str  # the checking file's stem
    gpu_family: str  # A100, H100, H200, V100: the GPU's name up to its first dash
    gpus: int
    seq_length: int
    measured_s: float  # median of the configuration's published measurements
    predicted_s: float  # itercast's step when the file was written
    model: dict[str, Any] = field(repr=False)  # model_signature of the run's model (in the file: its place in "models")

    @property
    def ratio(self) -> float:
        """Measured over predicted step: above 1 where itercast is too fast."""
        return self.measured_s / self.predicted_s


def model_signature(model: ModelConfig) -> dict[str, Any]:
    """The model's architecture: every validated field but NOT_THE_MODEL, JSON-typed."""
    return model.model_dump(mode="json", exclude=set(NOT_THE_MODEL))


def gpu_family(gpu_name: str) -> str:
    """A GPU's family: its name up to the first dash (H100-SXM5-80GB: H100)."""
    return gpu_name.split("-")[0]


@cache
def checked_runs(path: Path = CHECKED_RUNS_PATH) -> tuple[CheckedRun, ...]:
    """The kept configurations (empty where the file is absent)."""
    if not path.is_file():
        return ()
    doc = json.loads(path.read_text(encoding="utf-8"))
    models = doc["models"]
    return tuple(CheckedRun(**{**run, "model": models[run["model"]]}) for run in doc["runs"])


def runs_like(job: Job, path: Path = CHECKED_RUNS_PATH) -> list[CheckedRun]:
    """The kept runs of the job's model (any sequence length) on its GPU family."""
    signature, family = model_signature(job.model), gpu_family(job.system.gpu.name)
    return [r for r in checked_runs(path) if r.gpu_family == family and r.model == signature]


def _spread(runs: list[CheckedRun]) -> str:
    """Measured / predicted of `runs`: the one ratio, or their range and median and the farthest run."""
    ratios = [r.ratio for r in runs]
    if len(runs) == 1:
        return f"measured / predicted {ratios[0]:.2f}x"
    farthest = max(runs, key=lambda r: abs(r.ratio - 1))
    return (
        f"measured / predicted {min(ratios):.2f}x to {max(ratios):.2f}x, median "
        f"{statistics.median(ratios):.2f}x; farthest: {farthest.label}, {farthest.ratio:.2f}x"
    )


def checked_note(job: Job, path: Path = CHECKED_RUNS_PATH) -> str | None:
    """How the job's model's published runs on its GPU family compared with itercast's step, or None without
    any: their count, the range and median of measured / predicted, and the farthest run; where the runs span
    several sequence lengths, also the same for the runs at the job's own (or, without any, the nearest)."""
    runs = runs_like(job, path)
    if not runs:
        return None
    family = runs[0].gpu_family
    configurations = "configuration" if len(runs) == 1 else "configurations"
    note = (
        f"checked: published runs of this model on {family} GPUs in {len(runs)} {configurations} (plans and sizes "
        f"of their own; the checking table, {', '.join(sorted({r.source for r in runs}))}): {_spread(runs)}"
    )
    lengths = {r.seq_length for r in runs}
    if len(lengths) == 1:
        return note
    seq = job.model.seq_length
    nearest = min(lengths, key=lambda n: (abs(n - seq), n))
    at = [r for r in runs if r.seq_length == nearest]
    where = f"at this job's {seq:,} tokens a sequence" if nearest == seq else f"none at {seq:,} tokens; at {nearest:,}"
    return f"{note}; {where}: {_spread(at)}"


def checked_runs_json(job: Job, path: Path = CHECKED_RUNS_PATH) -> list[dict[str, Any]]:
    """`runs_like(job)` as JSON objects (without the model), each with its ratio, measured over predicted."""
    runs = [{k: v for k, v in asdict(r).items() if k != "model"} for r in runs_like(job, path)]
    return [{**run, "ratio": run["measured_s"] / run["predicted_s"]} for run in runs]
