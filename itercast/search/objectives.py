"""What the search ranks plans by, and the fronts of plans no other plan beats on two figures at once.

Objectives (smaller is better, each a vectorised function of the same columns):

- `step`: seconds per step. When the search tries several global batches it ranks per sequence (a
  step of a larger batch does more), which orders plans as `tokens-per-s` does.
- `tokens-per-s`: throughput, ranked as seconds per token = step_s / (global batch × seq_length).
  At one global batch it orders plans as `step` does, across node counts too (the batch is fixed).
- `gpu-hours-per-token`: what a token costs, GPUs × step_s / 3600 / tokens per step. At one node
  count it orders plans as the others do; across node counts it prefers fewer GPUs unless more
  GPUs scale super-linearly.

- `p50`, `p95`, `p99`, `mean`: the step's distribution under variability (stochastic/variability.py,
  the `variability` command's CVs): the search ranks by the deterministic step, then the best plans
  are sampled with common random numbers and re-ranked by that quantile or the mean
  (distribution_rank.py).

Across node counts the two figures a team trades are time to its token budget (seconds per token ×
budget) and GPU-hours per token: `time_cost_front` keeps the plans no other plan beats on both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from itercast.errors import ConfigError, did_you_mean

#: the step-time distribution's figure each ranks by (StepDistribution.quantiles, and the mean)
DISTRIBUTION_OBJECTIVES = {"p50": "p50_s", "p95": "p95_s", "p99": "p99_s", "mean": "mean_s"}
#: a new objective adds a name and a branch below
OBJECTIVES = ("step", "tokens-per-s", "gpu-hours-per-token", *DISTRIBUTION_OBJECTIVES)
SECONDS_PER_HOUR = 3600.0


def check_objective(name: str) -> str:
    """`name` if it is an objective; otherwise a ConfigError naming the option and the choices."""
    if name not in OBJECTIVES:
        raise ConfigError(
            f"--objective: expected {' | '.join(OBJECTIVES)}; got {name!r}{did_you_mean(name, OBJECTIVES)}"
        )
    return name


def ranked_as(objective: str) -> str:
    """How a search's plans are called by the objective that ranked them: "fastest" by the step, else "best by …"."""
    return "fastest" if objective == "step" else f"best by {objective}"


def tokens_per_step(global_batch_size: Any, seq_length: int) -> Any:
    """Tokens one step trains: global batch (sequences) × sequence length (tokens)."""
    return global_batch_size * seq_length


def seconds_per_token(step_time_s: Any, tokens: Any) -> Any:
    """Wall-clock seconds per trained token: step time / tokens per step."""
    return step_time_s / tokens


def gpu_hours_per_token(num_gpus: Any, step_time_s: Any, tokens: Any) -> Any:
    """GPU-hours per trained token: every GPU is held for the whole step, GPUs × step_s / 3600 / tokens."""
    return num_gpus * step_time_s / SECONDS_PER_HOUR / tokens


def objective_values(
    name: str, step_time_s: Any, global_batch_size: Any, seq_length: int, num_gpus: Any, batches_vary: bool
) -> Any:
    """The objective of each plan (numpy arrays or floats), smaller is better. A distribution
    objective ranks by the deterministic step here; distribution_rank re-ranks the best plans."""
    tokens = tokens_per_step(global_batch_size, seq_length)
    if name == "gpu-hours-per-token":
        return gpu_hours_per_token(num_gpus, step_time_s, tokens)
    if name == "tokens-per-s" or batches_vary:
        return seconds_per_token(step_time_s, tokens)
    return step_time_s


def token_figures(
    step_time_s: float, global_batch_size: int, seq_length: int, num_gpus: int, token_budget: float | None
) -> dict[str, float]:
    """A plan's seconds and GPU-hours per token, and with a budget (tokens) the time and GPU-hours to reach it."""
    tokens = tokens_per_step(global_batch_size, seq_length)
    out = {
        "seconds_per_token": seconds_per_token(step_time_s, tokens),
        "gpu_hours_per_token": gpu_hours_per_token(num_gpus, step_time_s, tokens),
    }
    if token_budget is not None:
        out["time_to_budget_s"] = out["seconds_per_token"] * token_budget
        out["gpu_hours_to_budget"] = out["gpu_hours_per_token"] * token_budget
    return out


def pareto_front(time_s: np.ndarray, other: np.ndarray, rows: np.ndarray) -> list[int]:
    """`rows` on the front of (time, other), both minimised, fastest first: a row stays unless another
    is as fast and as small and better in one (of equal points the first in `rows` stays)."""
    order = np.lexsort((other, time_s))
    front, best = [], np.inf
    for i in order:
        if other[i] < best:
            front.append(int(rows[i]))
            best = other[i]
    return front


def time_cost_front(rows: list[dict[str, Any]], seq_length: int, token_budget: float | None) -> list[dict[str, Any]]:
    """Plans (search rows: plan, num_gpus, fast_step_time_s) no other plan beats on both seconds per
    token (time to the budget) and GPU-hours per token, fastest first, each with its token figures
    from the fast path (`fast_seconds_per_token`, `fast_gpu_hours_per_token`, …)."""
    figures = [
        token_figures(r["fast_step_time_s"], r["plan"]["global_batch_size"], seq_length, r["num_gpus"], token_budget)
        for r in rows
    ]
    time_s = np.array([f["seconds_per_token"] for f in figures])
    cost = np.array([f["gpu_hours_per_token"] for f in figures])
    front = pareto_front(time_s, cost, np.arange(len(rows)))
    return [{**rows[i], **{f"fast_{k}": v for k, v in figures[i].items()}} for i in front]
