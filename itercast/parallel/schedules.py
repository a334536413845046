"""Pipeline schedules: the order in which one pipeline stage runs its forward and backward passes.

A pass is (is_forward, chunk, microbatch). `chunk` is the model chunk on this stage (always 0
unless interleaved). Virtual stage of (stage s, chunk c) = c · p + s, with p stages.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")  # codes of the schedule column of a PlanTable


class Pass(NamedTuple):
    forward: bool
    chunk: int
    microbatch: int


def gpipe(stage: int, stages: int, microbatches: int) -> list[Pass]:
    """All forwards, then all backwards (Huang et al. 2019)."""
    return [Pass(True, 0, m) for m in range(microbatches)] + [Pass(False, 0, m) for m in range(microbatches)]


def one_f_one_b(stage: int, stages: int, microbatches: int) -> list[Pass]:
    """PipeDream-Flush / Megatron 1F1B: warm-up forwards, steady one-forward-one-backward, cool-down."""
    warmup = min(stages - stage - 1, microbatches)
    out = [Pass(True, 0, m) for m in range(warmup)]
    for i in range(microbatches - warmup):
        out += [Pass(True, 0, warmup + i), Pass(False, 0, i)]
    out += [Pass(False, 0, m) for m in range(microbatches - warmup, microbatches)]
    return out


def interleaved_one_f_one_b(stage: int, stages: int, microbatches: int, chunks: int) -> list[Pass]:
    """Megatron-LM interleaved 1F1B (Narayanan et al. SC'21, schedules.py): needs microbatches % stages == 0.
    Warm-up as Megatron-Core's get_pp_rank_microbatches (d98e8a64): min(2 (p − s − 1) + (v − 1) p, all
    chunk passes), also with as many micro-batches as stages (every forward first on every stage only
    before a606486, March 2025: core_v0.8.0's all_warmup_microbatches)."""
    total = microbatches * chunks
    warmup = interleaved_warmup(stage, stages, microbatches, chunks)

    def locate(k: int, forward: bool) -> Pass:
        chunk = (k // stages) % chunks
        micro = (k // (stages * chunks)) * stages + k % stages
        return Pass(forward, chunk if forward else chunks - 1 - chunk, micro)

    out = [locate(k, True) for k in range(warmup)]
    for i in range(total - warmup):
        out += [locate(warmup + i, True), locate(i, False)]
    out += [locate(k, False) for k in range(total - warmup, total)]
    return out


def interleaved_warmup(stage: int, stages: int, microbatches: int, chunks: int) -> int:
    """Chunk passes `stage` runs forward before its first backward under interleaved 1F1B (then one forward and
    one backward in turn): Megatron-Core's get_pp_rank_microbatches, min(2 (p − s − 1) + (v − 1) p, all of them)."""
    return min((stages - stage - 1) * 2 + (chunks - 1) * stages, microbatches * chunks)


def schedule(name: str, stage: int, stages: int, microbatches: int, chunks: int = 1) -> list[Pass]:
    if name == "gpipe":
        return gpipe(stage, stages, microbatches)
    if name == "1f1b":
        return one_f_one_b(stage, stages, microbatches)
    if name == "interleaved-1f1b":
        return interleaved_one_f_one_b(stage, stages, microbatches, chunks)
    raise ValueError(f"unknown schedule {name!r}; expected gpipe | 1f1b | interleaved-1f1b")


def in_flight_microbatches(
    name: str | np.ndarray,
    stage: int | np.ndarray,
    stages: int | np.ndarray,
    microbatches: int | np.ndarray,
    chunks: int | np.ndarray = 1,
) -> np.ndarray:
    """Peak number of forward passes whose activations are held, in units of one whole stage's layers.

    The maximum over time of (forwards done − backwards done) in `schedule`, in closed form (each
    chunk pass weighs 1/chunks): GPipe holds every micro-batch; the 1F1B schedules hold their
    warm-up forwards plus the one of the first steady pair. `name` is a schedule name or an array
    of SCHEDULES codes; every argument broadcasts.
    """
    code = np.asarray(SCHEDULES.index(name) if isinstance(name, str) else name)
    s, p, m, v = (np.asarray(x, dtype=np.int64) for x in (stage, stages, microbatches, chunks))
    v = np.where(code == SCHEDULES.index("interleaved-1f1b"), v, 1)
    total = m * v
    warmup = np.where(
        code == SCHEDULES.index("interleaved-1f1b"),
        np.minimum((p - s - 1) * 2 + (v - 1) * p, total),  # get_pp_rank_microbatches
        np.minimum(p - s - 1, m),
    )
    peak = np.where(warmup < total, warmup + 1, warmup)
    return np.where(code == SCHEDULES.index("gpipe"), m, peak / v)
