"""Slicing L layers into k pipeline stages: exact dynamic programming and a softmax relaxation.

A stage is a run of consecutive layers [b_s, b_{s+1}). Its time per micro-batch is the sum of its
layers' forward + backward times plus the send of its last layer's activations to the next stage
(none from the last stage). With m micro-batches the 1F1B / GPipe step is

    step = (m − 1) · max_s T_s + Σ_s T_s                (Narayanan et al. SC'21 §2.2; Alpa eq. 2)

A stage's memory must fit the device's limit: from a job, memory.StageMemory's bytes of stage s of
k holding those layers (the model `predict` reports); from a table of layers, their resident bytes
plus the activations of the micro-batches stage s holds in flight (min(k − s, m) under 1F1B).

Exact: the step couples the bottleneck B = max_s T_s and the sum. For a fixed B the sum is
minimised by a DP over (stages, last layer) with every stage ≤ B: O(k·L²), vectorised over the
first layer. B* is one of the O(L²) stage-time values, and only those with (m − 1)·B + (the least
sum any slicing has) ≤ the step at the least feasible bottleneck can win (Alpa's pruning), a
handful when m is large. The least feasible bottleneck itself is found by bisection over the
sorted stage times with the same DP. The naive search is O(k·L⁴).

Relaxed: boundaries as k − 1 increasing real positions (softplus increments), layer i's share of
stage s a difference of sigmoids at temperature τ, the max a log-sum-exp; minimised by L-BFGS from
random starting boundaries, rounded, and priced exactly. Starts run in parallel processes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import permutations

import numpy as np
from scipy import special
from scipy.optimize import minimize


@dataclass(frozen=True)
class LayerCosts:
    """Per layer: forward + backward seconds per micro-batch, bytes of its output activations (sent
    when a stage ends after it), bytes it needs resident, and bytes per micro-batch it holds in flight."""

    time_s: np.ndarray
    send_s: np.ndarray  # seconds to send layer i's output to the next stage (0: free)
    static_bytes: np.ndarray
    activation_bytes: np.ndarray

    @property
    def num_layers(self) -> int:
        return int(self.time_s.shape[0])

    @classmethod
    def of(
        cls,
        time_s: np.ndarray,
        send_s: np.ndarray | None = None,
        static_bytes: np.ndarray | None = None,
        activation_bytes: np.ndarray | None = None,
    ) -> LayerCosts:
        t = np.asarray(time_s, dtype=np.float64)
        zero = np.zeros_like(t)
        return cls(
            t,
            zero if send_s is None else np.asarray(send_s, np.float64),
            zero if static_bytes is None else np.asarray(static_bytes, np.float64),
            zero if activation_bytes is None else np.asarray(activation_bytes, np.float64),
        )


@dataclass(frozen=True)
class Slicing:
    boundaries: list[int]  # first layer of each stage
    stage_times_s: list[float]
    step_time_s: float
    stage_groups: list[str] = field(default_factory=list)  # the device group of each stage (mixed clusters)

    @property
    def bottleneck_s(self) -> float:
        return max(self.stage_times_s)


def evaluate(costs: LayerCosts | list[LayerCosts], boundaries: list[int], microbatches: int) -> Slicing:
    """Stage times and step time of one slicing (`boundaries` start with 0, strictly increasing);
    `costs` one table for every stage, or one per stage (stages on different devices)."""
    per_stage = costs if isinstance(costs, list) else [costs] * len(boundaries)
    ends = [*boundaries[1:], per_stage[0].num_layers]
    times = []
    for s, (a, b) in enumerate(zip(boundaries, ends, strict=True)):
        c = per_stage[s]
        send = c.send_s[b - 1] if s < len(boundaries) - 1 else 0.0
        times.append(float(c.time_s[a:b].sum() + send))
    return Slicing(list(boundaries), times, (microbatches - 1) * max(times) + sum(times))


def _tables(costs: LayerCosts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """T[i, j]: time of a stage of layers i..j−1 that sends (j ≤ L; +inf where j ≤ i); static and
    activation bytes of the same stage."""
    L = costs.num_layers
    c = np.concatenate([[0.0], np.cumsum(costs.time_s)])
    cs = np.concatenate([[0.0], np.cumsum(costs.static_bytes)])
    ca = np.concatenate([[0.0], np.cumsum(costs.activation_bytes)])
    i, j = np.meshgrid(np.arange(L + 1), np.arange(L + 1), indexing="ij")
    valid = j > i
    send = np.concatenate([[0.0], costs.send_s])[j]
    T = np.where(valid, c[j] - c[i] + send, np.inf)
    return T, np.where(valid, cs[j] - cs[i], np.inf), np.where(valid, ca[j] - ca[i], np.inf)


def _dp(
    T: list[np.ndarray], fits: np.ndarray, last_T: np.ndarray, k: int, bound: float
) -> tuple[float, list[int]] | None:
    """Least Σ stage times with k stages, each ≤ bound and fitting; (sum, boundaries) or None.
    T[s][i, j] is stage s's time over layers i..j−1 with the send after it; the last stage (ending at
    L) uses last_T[i] (no send). fits[s] masks the (i, j) a stage s may span."""
    L = T[0].shape[0] - 1
    INF = np.inf
    f = np.full(L + 1, INF)
    f[0] = 0.0
    back = np.zeros((k, L + 1), dtype=np.int64)
    for s in range(k - 1):  # stages that send
        cand = f[:, None] + np.where(fits[s] & (bound >= T[s]), T[s], INF)
        back[s] = np.argmin(cand, axis=0)
        f = cand[back[s], np.arange(L + 1)]
    ok = fits[k - 1][:, L] & (bound >= last_T)
    total = np.where(ok, f + last_T, INF)
    first = int(np.argmin(total))
    if not np.isfinite(total[first]):
        return None
    bounds, j = [first], first
    for s in range(k - 2, -1, -1):
        j = int(back[s][j])
        bounds.append(j)
    return float(total[first]), bounds[::-1]


#: bytes of stage s of k over every span of layers [i, j) (an (L + 1) × (L + 1) table; j ≤ i unused)
StageBytes = Callable[[int, int], np.ndarray]


def slice_exact(costs: LayerCosts, stages: int, microbatches: int, memory_bytes: float = math.inf) -> Slicing:
    """The slicing into `stages` stages with the least step time (ties: the first found)."""
    return exact_candidates(costs, stages, microbatches, memory_bytes)[0]


def exact_candidates(
    costs: LayerCosts,
    stages: int,
    microbatches: int,
    memory_bytes: float = math.inf,
    stage_bytes: StageBytes | None = None,
    slack: float = 0.0,
) -> list[Slicing]:
    """The slicings into `stages` stages whose step time is within `slack` (a fraction) of the least,
    fastest first, one per bottleneck value. `stage_bytes`: the memory of each candidate stage
    (default: the layers' own bytes, module docstring)."""
    L = costs.num_layers
    if not 1 <= stages <= L:
        raise ValueError(f"stages must be in 1..{L} (the number of layers); got {stages}")
    found = _slice_on([_Priced.of(costs, memory_bytes, stage_bytes)], [0] * stages, microbatches, slack)
    if not found:
        raise ValueError(f"no slicing into {stages} stages fits {_per_stage_gib(memory_bytes)}")
    return found


def stage_candidates(
    per_stage: list[LayerCosts],
    microbatches: int,
    memory_bytes: float = math.inf,
    stage_bytes: StageBytes | None = None,
    slack: float = 0.0,
) -> list[Slicing]:
    """As exact_candidates, with stage s priced by per_stage[s]: stages fixed in place on devices of
    different speeds (a slow stage's table is the layers' times / its speed), none moved."""
    L, stages = per_stage[0].num_layers, len(per_stage)
    if any(c.num_layers != L for c in per_stage) or not 1 <= stages <= L:
        raise ValueError(f"need 1..{L} stages pricing the same {L} layers; got {[c.num_layers for c in per_stage]}")
    devices = [_Priced.of(c, memory_bytes, stage_bytes) for c in per_stage]
    found = _slice_on(devices, list(range(stages)), microbatches, slack)
    if not found:
        raise ValueError(f"no slicing into {stages} stages fits {_per_stage_gib(memory_bytes)}")
    return found


def _per_stage_gib(memory_bytes: float) -> str:
    """A stage's memory limit as the errors say it: in GiB, as --memory-gib and the GPUs' memory are given."""
    return f"{memory_bytes / 2**30:.4g} GiB per stage"


@dataclass(frozen=True)
class _Priced:
    """One device's stage tables (see _tables) and memory limit."""

    costs: LayerCosts
    T: np.ndarray
    static: np.ndarray
    activations: np.ndarray
    last_T: np.ndarray  # the last stage i..L−1, no send
    memory_bytes: float
    stage_bytes: StageBytes | None

    @classmethod
    def of(cls, costs: LayerCosts, memory_bytes: float, stage_bytes: StageBytes | None = None) -> _Priced:
        L = costs.num_layers
        T, S, A = _tables(costs)
        c = np.concatenate([[0.0], np.cumsum(costs.time_s)])
        last_T = np.where(np.arange(L + 1) < L, c[L] - c, np.inf)
        return cls(costs, T, S, A, last_T, memory_bytes, stage_bytes)

    def fits(self, stage: int, stages: int, microbatches: int) -> np.ndarray:
        """Which spans [i, j) stage `stage` of `stages` may hold within the memory limit."""
        if self.stage_bytes is not None:
            return np.asarray(self.stage_bytes(stage, stages) <= self.memory_bytes)
        held = min(stages - stage, microbatches)  # 1F1B: the warm-up's forwards and one more, at most all
        return np.asarray(self.static + self.activations * held <= self.memory_bytes)


def _slice_on(devices: list[_Priced], stage_device: list[int], microbatches: int, slack: float = 0.0) -> list[Slicing]:
    """The slicings whose stage s runs on devices[stage_device[s]] within `slack` of the fastest,
    fastest first ([] if none fits): the least feasible bottleneck by bisection, then Alpa's pruning
    over larger ones, one slicing (the least sum) per bottleneck."""
    k = len(stage_device)
    T = [devices[d].T for d in stage_device]
    last_T = devices[stage_device[-1]].last_T
    fits = np.stack([devices[d].fits(s, k, microbatches) for s, d in enumerate(stage_device)])
    values = np.unique(np.concatenate([t[np.isfinite(t)] for t in (*T, last_T)]))
    lo, hi = 0, values.shape[0] - 1
    floor_sum = _dp(T, fits, last_T, k, values[hi])
    if floor_sum is None:
        return []
    while lo < hi:  # least feasible bottleneck: feasibility is monotone in the bound
        mid = (lo + hi) // 2
        if _dp(T, fits, last_T, k, values[mid]) is None:
            lo = mid + 1
        else:
            hi = mid
    found: dict[tuple[int, ...], Slicing] = {}
    best_step = math.inf
    per_stage = [devices[d].costs for d in stage_device]
    for b in values[lo:]:  # Alpa's pruning: a larger bottleneck must pay for itself in the sum
        if (microbatches - 1) * b + floor_sum[0] >= best_step * (1 + slack):
            break
        got = _dp(T, fits, last_T, k, b)
        if got is not None and tuple(got[1]) not in found:
            sl = evaluate(per_stage, got[1], microbatches)
            found[tuple(got[1])] = sl
            best_step = min(best_step, sl.step_time_s)
    ranked = sorted(found.values(), key=lambda sl: sl.step_time_s)
    return [sl for sl in ranked if sl.step_time_s <= best_step * (1 + slack)]


@dataclass(frozen=True)
class DeviceGroup:
    """Devices of one kind in a mixed cluster: the layers priced on them, how many pipeline stages they
    can host, the memory one stage may use there and, from a job, what each candidate stage holds."""

    name: str
    costs: LayerCosts
    slots: int
    memory_bytes: float = math.inf
    stage_bytes: StageBytes | None = None


def slice_groups(groups: list[DeviceGroup], stages: int, microbatches: int) -> Slicing:
    """The fastest slicing into `stages` stages on a mixed cluster, and which group hosts each stage."""
    return group_candidates(groups, stages, microbatches)[0]


def group_candidates(groups: list[DeviceGroup], stages: int, microbatches: int, slack: float = 0.0) -> list[Slicing]:
    """The slicings into `stages` stages on a mixed cluster within `slack` of the fastest, fastest
    first, with the group that hosts each stage (Metis-like, exact): every split of the stages among
    the groups within their slots, every order of the groups along the pipeline (each group a
    contiguous run of stages), the exact slicings of each."""
    L = groups[0].costs.num_layers
    if any(g.costs.num_layers != L for g in groups):
        raise ValueError("every device group must price the same layers")
    if not 1 <= stages <= L:
        raise ValueError(f"stages must be in 1..{L} (the number of layers); got {stages}")
    if sum(g.slots for g in groups) < stages:
        raise ValueError(f"{stages} stages do not fit the groups' {sum(g.slots for g in groups)} stage slots")
    devices = [_Priced.of(g.costs, g.memory_bytes, g.stage_bytes) for g in groups]
    found: list[Slicing] = []
    for split in _splits(stages, [g.slots for g in groups]):
        used = [gi for gi, n in enumerate(split) if n]
        for order in permutations(used):
            stage_device = [gi for gi in order for _ in range(split[gi])]
            names = [groups[d].name for d in stage_device]
            for sl in _slice_on(devices, stage_device, microbatches, slack):
                found.append(Slicing(sl.boundaries, sl.stage_times_s, sl.step_time_s, names))
    if not found:
        raise ValueError(f"no slicing into {stages} stages fits the groups' memory")
    found.sort(key=lambda sl: sl.step_time_s)
    return [sl for sl in found if sl.step_time_s <= found[0].step_time_s * (1 + slack)]


def _splits(total: int, caps: list[int]) -> list[list[int]]:
    """Every way to give `total` stages to groups with at most caps[g] each."""
    if len(caps) == 1:
        return [[total]] if total <= caps[0] else []
    return [[n, *rest] for n in range(min(total, caps[0]) + 1) for rest in _splits(total - n, caps[1:])]


def slice_best_stages(costs: LayerCosts, microbatches: int, max_stages: int, memory_bytes: float = math.inf) -> Slicing:
    """Over stage counts 1..max_stages, the slicing with the least step time."""
    return best_stage_count(
        lambda k: slice_exact(costs, k, microbatches, memory_bytes),
        min(max_stages, costs.num_layers),
        _per_stage_gib(memory_bytes),
    )


def best_stage_count(slicer: Callable[[int], Slicing], max_stages: int, limit: str) -> Slicing:
    """The fastest of slicer(k) over k = 1..max_stages (a k that cannot fit raises ValueError and is
    passed over); `limit` names what no k fits, for the error."""
    found = []
    for k in range(1, max_stages + 1):
        try:
            found.append(slicer(k))
        except ValueError:
            continue
    if not found:
        raise ValueError(f"no slicing into 1..{max_stages} stages fits {limit}")
    return min(found, key=lambda s: s.step_time_s)


# -- the relaxation -----------------------------------------------------------------------------
def _positions(x: np.ndarray, L: int) -> np.ndarray:
    """k − 1 increasing boundary positions in (0, L) from unconstrained x (softplus increments,
    one more increment of softplus(0) after the last boundary)."""
    inc = np.logaddexp(0.0, x)
    return np.cumsum(inc) / (inc.sum() + np.log(2.0)) * L


def _relaxed_objective(x: np.ndarray, costs: LayerCosts, microbatches: int, tau: float) -> float:
    """Smooth step time: layer i belongs to stage s by σ((i − b_s)/τ)·σ((b_{s+1} − i)/τ); the send
    after stage s is the send of the layers around its upper boundary, Gaussian-weighted; the
    bottleneck a log-sum-exp at temperature τ × the mean layer time."""
    L = costs.num_layers
    edges = np.concatenate([[-np.inf], _positions(x, L), [np.inf]])
    centre = np.arange(L) + 0.5
    share = special.expit((centre[None, :] - edges[:-1, None]) / tau) * special.expit(
        (edges[1:, None] - centre[None, :]) / tau
    )
    stage = share @ costs.time_s
    near = np.exp(-(((centre[None, :] + 0.5) - edges[1:-1, None]) ** 2) / (2 * tau * tau))
    stage[:-1] += (near / near.sum(axis=1, keepdims=True)) @ costs.send_s
    temperature = tau * float(costs.time_s.mean())
    smooth_max = temperature * special.logsumexp(stage / temperature)
    return float((microbatches - 1) * smooth_max + stage.sum())


def _round(x: np.ndarray, L: int) -> list[int]:
    """Boundaries (first layer of each stage) nearest the relaxed positions, strictly increasing;
    [] where rounding cannot keep every stage non-empty."""
    out = [0]
    for c in np.clip(np.rint(_positions(x, L)).astype(int), 1, L - 1).tolist():
        out.append(max(c, out[-1] + 1))
    return out if out[-1] < L else []


def _relaxed_start(args: tuple[LayerCosts, int, int, float, int]) -> Slicing | None:
    """One start: L-BFGS (numerical gradients) from random boundaries, rounded, priced exactly."""
    costs, stages, microbatches, tau, seed = args
    x0 = np.random.default_rng(seed).normal(0.0, 1.0, stages - 1)
    res = minimize(_relaxed_objective, x0, args=(costs, microbatches, tau), method="L-BFGS-B")
    bounds = _round(res.x, costs.num_layers)
    return evaluate(costs, bounds, microbatches) if len(bounds) == stages else None


def slice_relaxed(
    costs: LayerCosts,
    stages: int,
    microbatches: int,
    starts: int = 16,
    workers: int = 1,
    tau: float = 0.5,
    seed: int = 0,
) -> Slicing:
    """The best rounded solution of the relaxation over `starts` random starting points (start i
    seeded seed + i; `workers` processes)."""
    if not 1 <= stages <= costs.num_layers:
        raise ValueError(f"stages must be in 1..{costs.num_layers} (the number of layers); got {stages}")
    if stages == 1:
        return evaluate(costs, [0], microbatches)
    jobs = [(costs, stages, microbatches, tau, seed + i) for i in range(starts)]
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            found = list(pool.map(_relaxed_start, jobs))
    else:
        found = [_relaxed_start(j) for j in jobs]
    valid = [f for f in found if f is not None]
    if not valid:
        raise ValueError("the relaxation found no valid slicing from any start")
    return min(valid, key=lambda s: s.step_time_s)
