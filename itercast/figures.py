"""README figures that cannot drift: every figure README.md quotes from a command, recomputed.

    python -m itercast.figures --check            # exit 1 naming each figure beyond its tolerance
    python -m itercast.figures --check --cheap    # only the figures of one prediction each (seconds)
    python -m itercast.figures --write            # rewrite the drifted figures in README.md in place

Each figure is one row of FIGURES: its name, a regex matching it exactly once in README.md (the
number is its one group, written as the README writes it: thousands separators, a sign as + or −),
what recomputes it, and its tolerance in the figure's own units (half a unit of the last digit
quoted: the README's rounding). `--write` keeps the README's
format (decimals, separators, sign) and changes only figures beyond their tolerance.

Not checkable, so not listed: speeds and timings (search seconds, plans or events per second,
milliseconds per prediction: they vary ~2× with the load of this shared VM), and figures measured
on hardware (data/measured/, the GPU campaign, the CPU iteration and sharding validations).
Not yet listed: the fast path's agreement with the graph (tests/test_fast_estimate.py,
benchmarks/fast_path_agreement.py), the stage-slicing gap (benchmarks/stage_slicing.py), the
hostile-input corpus size, and the validation rows other than the published H100 (ALL line,
skipped without ../shared/data) and A100 step times.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from itercast.checked_runs import runs_like
from itercast.config.job import Job, parse_section
from itercast.data_paths import shared_data_dir
from itercast.predict import Prediction, predict
from itercast.search.job_slicing import JobSlicing, slice_job, slice_job_on_groups
from itercast.search.plan_search import SearchRequest, SearchResult, run_search
from itercast.stochastic.variability import VariabilityModel, build_transformer_step, graph_sensitivity
from itercast.workload import load_workload

README = Path(__file__).resolve().parents[1] / "README.md"
GIB = 2**30
NUMBER = r"([+−-]?[0-9][0-9,]*(?:\.[0-9]+)?)"  # the group every README regex holds


@dataclass(frozen=True)
class Figure:
    """A README figure: `pattern` matches it once (with NUMBER as its group); `compute` gives its
    value in the README's units; a drift beyond `tolerance` (same units) fails the check."""

    name: str
    pattern: str
    compute: Callable[[], float]
    tolerance: float
    cheap: bool = True
    needs_shared_data: bool = False


# -- what the README's commands run ---------------------------------------------------------------
LLAMA_JOB_PLAN = {  # README "Predict": the job.yaml block
    "pipeline_parallel": 4,
    "virtual_pipeline": 5,
    "schedule": "interleaved-1f1b",
    "sequence_parallel": True,
    "zero_stage": 1,
    "global_batch_size": 128,
}
MIXTRAL_PLAN = {"expert_parallel": 8, "global_batch_size": 256, "zero_stage": 1, "sequence_parallel": True}
MIXED_PLAN = {"pipeline_parallel": 4, "tensor_parallel": 4, "global_batch_size": 64}  # README "Slice"
MIXED_LAYERS = [15, 15, 5, 5]  # the slicing `itercast slice --device-groups dgx-h100:1,dgx-a100:1` chose
MIXED_GROUPS = [{"preset": "dgx-h100", "num_nodes": 1}, {"preset": "dgx-a100", "num_nodes": 1}]


@cache
def _example_job() -> Job:
    return Job.load(Path(str(resources.files("itercast").joinpath("examples", "gpt3-175b-a100.yaml"))))


@cache
def _predicted(name: str) -> Prediction:
    """predict() on the job each README command names."""
    jobs: dict[str, Callable[[], Job]] = {
        "example": _example_job,
        "llama tp8": lambda: Job.from_presets("llama3-70b", "dgx-h100", 8, LLAMA_JOB_PLAN | {"tensor_parallel": 8}),
        "llama tp4": lambda: Job.from_presets("llama3-70b", "dgx-h100", 8, LLAMA_JOB_PLAN | {"tensor_parallel": 4}),
        "mixtral tp2": lambda: Job.from_presets("mixtral-8x7b", "dgx-h100", 2, MIXTRAL_PLAN | {"tensor_parallel": 2}),
        "mixtral tp1": lambda: Job.from_presets(
            "mixtral-8x7b", "dgx-h100", 2, MIXTRAL_PLAN | {"tensor_parallel": 1, "sequence_parallel": False}
        ),
        "mixed": lambda: _mixed_job({"device_groups": MIXED_GROUPS}, MIXED_LAYERS),
        "mixed even": lambda: _mixed_job({"device_groups": MIXED_GROUPS}, None),
        "mixed all h100": lambda: _mixed_job({"num_nodes": 2}, None),  # one GPU kind: even stages
        "mixed all a100": lambda: _mixed_job({"preset": "dgx-a100", "num_nodes": 2}, None),
        "llama3-8b 131k": lambda: Job.from_dicts(
            {"preset": "llama3-8b", "seq_length": 131072},
            {"global_batch_size": 8, "zero_stage": 1},
            {"preset": "dgx-h100"},
        ),
    }
    return predict(jobs[name]())


def _checked_llama() -> list[float]:
    """Measured over predicted steps of the kept checking runs of job.yaml's model on its GPU family (the note
    `predict job.yaml` prints: checked_runs.checked_note)."""
    return [run.ratio for run in runs_like(_predicted("llama tp8").job)]


def _dlrm_small_ms(batch_per_rank: int) -> Callable[[], float]:
    """`itercast predict --model dlrm-small --system dgx-h100` on 2 GPUs at `batch_per_rank`, in ms."""
    sets = ["system.node.gpus_per_node=2", f"plan.batch_per_rank={batch_per_rank}"]
    return lambda: 1e3 * load_workload(None, sets, "dlrm-small", "dgx-h100").predict().step_time_s


def _mixed_job(system: dict[str, Any], stage_layers: list[int] | None) -> Job:
    plan = MIXED_PLAN | ({"stage_layers": stage_layers} if stage_layers else {})
    return Job.from_dicts({"preset": "gpt3-13b"}, plan, {"preset": "dgx-h100", "num_nodes": 2} | system)


@cache
def _example_sensitivity() -> dict[str, dict[str, Any]]:
    """`itercast variability --example`'s sensitivity rows by class: the default model, seed 0, the
    ATTRIBUTION_SAMPLES a sensitivity draws at the default 10,000."""
    rows = graph_sensitivity(build_transformer_step(_example_job()), VariabilityModel(), seed=0)
    return {r["class"]: r for r in rows}


@cache
def _example_slicing() -> JobSlicing:
    return slice_job(_example_job())


@cache
def _mixed_slicing() -> JobSlicing:
    groups = [(g["preset"], g["num_nodes"]) for g in MIXED_GROUPS]
    return slice_job_on_groups({"preset": "gpt3-13b"}, MIXED_PLAN, {"preset": "dgx-h100"}, groups)  # type: ignore[arg-type]


@cache
def _searched(node_counts: tuple[int, ...]) -> SearchResult:
    """benchmarks/search_speed.py's search: GPT-3 175B, global batch 1536, on DGX A100 nodes."""
    model = parse_section("model", {"preset": "gpt3-175b"})
    system = parse_section("system", {"preset": "dgx-a100", "num_nodes": node_counts[0]})
    base = parse_section("plan", {"global_batch_size": 1536})
    return run_search(SearchRequest(model, system, base, node_counts), workers=2)  # type: ignore[arg-type]


@cache
def _validation_output(script: str) -> str:
    """What `python validation/SCRIPT` prints (run in a fresh process, as the README says)."""
    import subprocess

    root = README.parent
    done = subprocess.run([sys.executable, str(root / "validation" / script)], capture_output=True, text=True, cwd=root)
    return done.stdout


def _printed(script: str, pattern: str) -> float:
    """The number (group 1) a validation script prints after `pattern`."""
    found = re.search(pattern, _validation_output(script))
    if found is None:
        raise ValueError(f"validation/{script} printed nothing matching {pattern!r}")
    return _number(found.group(1))


def _step(name: str) -> Callable[[], float]:
    return lambda: _predicted(name).step_time_s


def _gib(name: str) -> Callable[[], float]:
    return lambda: _predicted(name).memory.total_bytes / GIB


SWEEP = tuple(range(8, 129))  # 8..128 DGX A100 nodes (64–1024 GPUs)
ANY = r"[+−-]?[0-9.]+"
#: geomean, mean and worst |error| of validation/step_times.py's ALL line and of
#: validation/published_step_times.py's summary, as the README quotes them and as the scripts print them
H100_README = r"All \d+: geomean \\\|error\\\| {}%, mean {}%, worst {}%"
H100_LINE = r"ALL\s+configs\s+\d+\s+geomean \|error\|\s+{}%\s+mean\s+{}%\s+worst\s+{}%"
A100_README = r"8 configurations: geomean \\\|error\\\| {}%, mean {}%, worst {}%"
A100_LINE = r"configurations: geomean \|error\| {}%, mean {}%, worst {}%"
_THREE = [(what, [NUMBER if k == i else ANY for k in range(3)]) for i, what in enumerate(("geomean", "mean", "worst"))]


def _validation(script: str, line: str, i: int) -> Callable[[], float]:
    """The i-th of the three figures of `line` that `python validation/SCRIPT` prints."""
    return lambda: _printed(script, line.format(*[NUMBER if k == i else ANY for k in range(3)]))


# fmt: off
FIGURES: tuple[Figure, ...] = (
    Figure("predict --example: step", r"It prints a " + NUMBER + r" s step", _step("example"), 0.005),
    Figure("predict --example: memory per GPU", r"s step, " + NUMBER + r" GiB of 80", _gib("example"), 0.05),
    Figure("predict --example: MFU", r"and an MFU of " + NUMBER + "%", lambda: 100 * _predicted("example").mfu, 0.05),
    Figure("job.yaml: step", r"`itercast predict job.yaml`: " + NUMBER + " s per step", _step("llama tp8"), 0.05),
    Figure(
        "llama3-8b at 131,072 tokens: MFU",
        r"8 H100 reads MFU " + NUMBER + "%",
        lambda: 100 * _predicted("llama3-8b 131k").mfu,
        0.05,
    ),
    Figure(
        "llama3-8b at 131,072 tokens: MFU counted causally",
        r"MFU [0-9.]+%, " + NUMBER + "% counted causally",
        lambda: 100 * _predicted("llama3-8b 131k").mfu_causal,
        0.05,
    ),
    Figure("job.yaml: memory per GPU", r"s per step, " + NUMBER + " GiB of 80 per GPU", _gib("llama tp8"), 0.05),
    Figure("job.yaml at tp 4: step", r"faster, " + NUMBER + " s, but needs", _step("llama tp4"), 0.05),
    Figure("job.yaml at tp 4: memory", r"but needs " + NUMBER + " GiB: out of memory", _gib("llama tp4"), 0.05),
    Figure("job.yaml: checked configurations", r"on H100 GPUs in " + NUMBER + r" configurations \(…\)",
           lambda: len(_checked_llama()), 0.5),
    Figure("job.yaml: checked, lowest", r"predicted " + NUMBER + r"x to ", lambda: min(_checked_llama()), 0.005),
    Figure("job.yaml: checked, highest", r"x to " + NUMBER + r"x, median", lambda: max(_checked_llama()), 0.005),
    Figure("job.yaml: checked, median", r"median " + NUMBER + r"x`\. A ratio",
           lambda: statistics.median(_checked_llama()), 0.005),
    Figure("dlrm-small on 2 H100, host-bound", r"`dlrm-small` on 2 H100: " + NUMBER + " ms from 64", _dlrm_small_ms(64),
           0.005),
    Figure("dlrm-small on 2 H100, at 4,096", r"`dlrm-small` on 2 H100: " + NUMBER + " ms from 64", _dlrm_small_ms(4096),
           0.005),
    Figure("dlrm-small on 2 H100, at 65,536", NUMBER + " ms at 65,536, where its GPU", _dlrm_small_ms(65536), 0.005),
    Figure("Mixtral at tp 2: step", r"# " + NUMBER + r" s, [0-9.]+ GiB \(tp 1", _step("mixtral tp2"), 0.05),
    Figure("Mixtral at tp 2: memory", r" s, " + NUMBER + r" GiB \(tp 1", _gib("mixtral tp2"), 0.05),
    Figure("Mixtral at tp 1: memory", r"\(tp 1: " + NUMBER + " GiB, out of memory", _gib("mixtral tp1"), 0.5),
    Figure("mixed cluster: graph step", r"the slicing above: " + NUMBER + " s", _step("mixed"), 0.0005),
    Figure("mixed cluster: even split", r"an even split " + NUMBER + " s\n", _step("mixed even"), 0.0005),
    Figure("mixed cluster: graph step (text)", r"the simulated graph " + NUMBER + " s", _step("mixed"), 0.0005),
    Figure("mixed cluster: all H100", r"all H100 take " + NUMBER + " s", _step("mixed all h100"), 0.0005),
    Figure("mixed cluster: all A100", r"all A100 " + NUMBER + r" s\.", _step("mixed all a100"), 0.0005),
    Figure("mixed cluster: graph step (table)", r"the graph " + NUMBER + " s; an even", _step("mixed"), 0.0005),
    Figure("mixed cluster: even split (table)", r"an even split " + NUMBER + " s; all-H100", _step("mixed even"),
           0.0005),
    Figure("mixed cluster: all H100 (table)", r"all-H100 " + NUMBER + " s", _step("mixed all h100"), 0.0005),
    Figure("mixed cluster: all A100 (table)", r"all-A100 " + NUMBER + " s", _step("mixed all a100"), 0.0005),
    Figure("mixed cluster: slice's closed form", r"gives that slicing " + NUMBER + " s",
           lambda: _mixed_slicing().slicing.step_time_s, 0.0005, cheap=False),
    Figure("mixed cluster: slice's closed form (table)", r"slice's closed form " + NUMBER + " s, the graph",
           lambda: _mixed_slicing().slicing.step_time_s, 0.0005, cheap=False),
    Figure("slice --example: predict's step", r"the GPT-3 example:\n" + NUMBER + " s, its",
           lambda: _example_slicing().prediction.step_time_s, 0.005, cheap=False),
    Figure("slice --example: lumped objective", r"\(m − 1\)·max \+ Σ " + NUMBER + r" s\)",
           lambda: _example_slicing().slicing.step_time_s, 0.005, cheap=False),
    Figure("variability --example: GEMMs' p95 per CV", r"GEMMs first \(" + NUMBER + " ± ",
           lambda: _example_sensitivity()["gemm"]["dp95_per_cv_s"], 0.05, cheap=False),
    Figure("variability --example: GEMMs' share of the path", r"s per CV, " + NUMBER + "% of the critical path",
           lambda: 100 * _example_sensitivity()["gemm"]["critical_path_share"], 0.05, cheap=False),
    Figure("variability --example: DP all-reduce's p95 per CV", r"then the DP all-reduce\n\(" + NUMBER + " ± ",
           lambda: _example_sensitivity()["all-reduce × DP"]["dp95_per_cv_s"], 0.005, cheap=False),
    Figure("search 1024 A100: generated", r"1024 GPUs: " + NUMBER + " generated",
           lambda: _searched((128,)).evaluated, 0, cheap=False),
    Figure("search 1024 A100: valid", r"generated, " + NUMBER + " valid, [0-9.]+ s on one",
           lambda: _searched((128,)).valid, 0, cheap=False),
    Figure("search 64–1024 GPUs: generated (millions)", r"64–1024 GPUs: " + NUMBER + "M generated",
           lambda: _searched(SWEEP).evaluated / 1e6, 0.05, cheap=False),
    Figure("search 64–1024 GPUs: valid", r"M generated, " + NUMBER + " valid",
           lambda: _searched(SWEEP).valid, 0, cheap=False),
    Figure("search 64–1024 GPUs: fastest step", r"interleaved [0-9]+, " + NUMBER + r" s/step \(",
           lambda: _searched(SWEEP).plans[0]["step_time_s"], 0.05, cheap=False),
    *(
        Figure(f"published H100 runs: {what}", H100_README.format(*fields), _validation("step_times.py", H100_LINE, i),
               0.05, cheap=False, needs_shared_data=True)
        for i, (what, fields) in enumerate(_THREE)
    ),
    *(
        Figure(f"published A100 runs: {what}", A100_README.format(*fields),
               _validation("published_step_times.py", A100_LINE, i), 0.05, cheap=False)
        for i, (what, fields) in enumerate(_THREE)
    ),
)
# fmt: on


# -- reading and writing README numbers ------------------------------------------------------------
def _number(text: str) -> float:
    """A number as the README or a script writes it: '1,132,864', '−25.4', '+8.9'."""
    return float(text.replace(",", "").replace("−", "-"))


def _formatted(value: float, like: str) -> str:
    """`value` written as `like` is: its decimals, thousands separators and explicit sign."""
    decimals = len(like.split(".")[1]) if "." in like else 0
    text = f"{abs(value):,.{decimals}f}" if "," in like else f"{abs(value):.{decimals}f}"
    signed = like[:1] in ("+", "−", "-")
    if value < 0:
        return ("−" if like[:1] in ("+", "−") else "-") + text
    return ("+" if signed else "") + text


@dataclass(frozen=True)
class Drift:
    figure: Figure
    readme_text: str
    readme_value: float
    value: float
    span: tuple[int, int]  # where the number lies in the README text

    @property
    def drifted(self) -> bool:
        return abs(self.value - self.readme_value) > self.figure.tolerance + 1e-12


def _located(figure: Figure, text: str) -> re.Match[str]:
    found = list(re.finditer(figure.pattern, text))
    if len(found) != 1:
        raise ValueError(f"figure {figure.name!r}: its pattern matches {len(found)} times; expected once")
    return found[0]


def recompute(figures: tuple[Figure, ...], text: str) -> list[Drift]:
    """Every figure's README value beside its recomputed value (a README pattern not matching once
    raises ValueError naming the figure)."""
    located = [(f, _located(f, text)) for f in figures]  # every pattern first: a bad one costs no computing
    return [Drift(f, m.group(1), _number(m.group(1)), float(f.compute()), m.span(1)) for f, m in located]


def rewritten(text: str, drifts: list[Drift]) -> str:
    """`text` with each drifted figure replaced by its recomputed value, in the README's format."""
    for d in sorted((d for d in drifts if d.drifted), key=lambda d: -d.span[0]):
        start, end = d.span
        text = text[:start] + _formatted(d.value, d.readme_text) + text[end:]
    return text


def chosen(cheap_only: bool) -> tuple[Figure, ...]:
    """The figures to recompute: cheap ones only, or all (those needing ../shared/data when it is there)."""
    have_data = shared_data_dir() is not None
    return tuple(f for f in FIGURES if (f.cheap or not cheap_only) and (have_data or not f.needs_shared_data))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 when a figure drifted beyond its tolerance")
    mode.add_argument("--write", action="store_true", help="rewrite drifted figures in README.md")
    parser.add_argument("--cheap", action="store_true", help="only the figures of one prediction each")
    parser.add_argument("--readme", type=Path, default=README, help="the README to check (default: the repository's)")
    args = parser.parse_args(argv)
    text = args.readme.read_text(encoding="utf-8")
    try:
        drifts = recompute(chosen(args.cheap), text)
    except ValueError as exc:
        print(f"{args.readme}: {exc}", file=sys.stderr)
        return 2
    drifted = [d for d in drifts if d.drifted]
    for d in drifted:
        print(
            f"{d.figure.name}: README {d.readme_text}, recomputed {_formatted(d.value, d.readme_text)} "
            f"({d.value:.6g}; tolerance ±{d.figure.tolerance:g})"
        )
    if args.write:
        if drifted:
            args.readme.write_text(rewritten(text, drifts), encoding="utf-8")
        print(f"{len(drifted)} of {len(drifts)} figures rewritten in {args.readme}")
        return 0
    print(f"{len(drifts) - len(drifted)} of {len(drifts)} figures within tolerance")
    return 1 if drifted else 0


if __name__ == "__main__":
    sys.exit(main())
