"""Pipeline schedules: the order in which one pipeline stage runs its forward and backward passes.

A pass is (is_forward, chunk, microbatch). `chunk` is the model chunk on this stage (always 0
unless interleaved). Virtual stage of (stage s, chunk c) = c · p + s, with p stages.
"""

from __future__ import annotations

from typing import NamedTuple


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
    With as many micro-batches as stages every forward runs first (Megatron's
    `all_warmup_microbatches`: forward_backward_pipelining_with_interleaving)."""
    total = microbatches * chunks
    warmup = total if microbatches == stages else min((stages - stage - 1) * 2 + (chunks - 1) * stages, total)

    def locate(k: int, forward: bool) -> Pass:
        chunk = (k // stages) % chunks
        micro = (k // (stages * chunks)) * stages + k % stages
        return Pass(forward, chunk if forward else chunks - 1 - chunk, micro)

    out = [locate(k, True) for k in range(warmup)]
    for i in range(total - warmup):
        out += [locate(warmup + i, True), locate(i, False)]
    out += [locate(k, False) for k in range(total - warmup, total)]
    return out


def schedule(name: str, stage: int, stages: int, microbatches: int, chunks: int = 1) -> list[Pass]:
    if name == "gpipe":
        return gpipe(stage, stages, microbatches)
    if name == "1f1b":
        return one_f_one_b(stage, stages, microbatches)
    if name == "interleaved-1f1b":
        return interleaved_one_f_one_b(stage, stages, microbatches, chunks)
    raise ValueError(f"unknown schedule {name!r}; expected gpipe | 1f1b | interleaved-1f1b")


def in_flight_microbatches(name: str, stage: int, stages: int, microbatches: int, chunks: int = 1) -> float:
    """Peak number of forward passes whose activations are held, in units of one whole stage's layers.

    Counted from the schedule itself: the maximum over time of (forwards done − backwards done),
    each chunk pass weighing 1/chunks of the stage.
    """
    held = peak = 0
    for p in schedule(name, stage, stages, microbatches, chunks):
        held += 1 if p.forward else -1
        peak = max(peak, held)
    return peak / chunks
