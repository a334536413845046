"""Closed-form step time for many plans at once: the fast path for search (DESIGN.md §3).

Same cost models, the same per-layer ops and the same memory model as the graph simulation; what
changes is how the step is assembled. Layer costs depend on a few plan fields (tensor and context
parallel, micro-batch, sequence parallel, recompute; under block or per-layer recompute the
pipeline shape too, memory.full_recompute_share) and are computed once per distinct value;
data-parallel collectives once per distinct group and size; the rest is numpy over a PlanTable:

    stage time     S_s = v · (t_f + t_b) + embedding (first stage) + head (last stage)
                   (+ ZeRO-2 without overlap: each backward pass's blocking reduction)
    pipeline       M · P + (Σ_s S'_s − S'_max) / v + 2 (p − 1) · t_p2p, and at least, where the passes
                   set the pace (P = S_max), M · S_max + (Σ_s S'_s − S'_max) / v + 2 (pv − 1) · t_p2p
                   (micro-batch 0 forward over every virtual stage, the last one's backward back)
                   P, the steady state's period: max_s S_s, and under 1F1B the round trip of
                   stage s's p − s micro-batches in flight, max_s (Σ_{j≥s} S_j + 2 (p − 1 − s) t_p2p)
                   / (p − s) (a max-plus cycle: the sends' latency slows the steady state); S'_s,
                   the fill and drain, which wait for the other stages' passes but not for what
                   follows their sends (a blocking ZeRO-2 reduction; interleaved, (v − 1)/v of it
                   lies ahead of the chunk that comes back). Exact for uniform stages without
                   sends: (M + p − 1)·t for 1F1B/GPipe, M·t + (p − 1)·t/v interleaved, Narayanan
                   et al. SC'21 §2.2; for uneven stages (plan.stage_layers) (M − 1)·max + Σ, the
                   objective of stage_slicing.py. When the round trips set P (1F1B), the fill's last
                   send and the drain's first lie on them: 2 (p − 2) t_p2p instead of 2 (p − 1).
                   Interleaved with overlapped sends (transformer.py _send: each stage's sends one at a
                   time on its p2p stream, in pass order), P is also at least, u_f and u_b a chunk's
                   forward and backward (S/v, passes only):
                   - the chunk at virtual stage pv − n holds 2n − 1 chunk passes in flight (Megatron's
                     warm-up, 2 (p − s − 1) + (v − 1) p, schedules.py), each round trip over its n
                     virtual stages: v (Σ_n u + 2 (n − 1) t_p2p) / (2n − 1), max over n;
                   - every 2p micro-batches, a cycle over two groups: ((2pv − 1) t_p2p + p u_f +
                     p (2v − 1) u_b) / (2p);
                   - each stage's p2p stream, v sends per micro-batch and v − 1 waits for a pass:
                     v t_p2p + (v − 1) mean_s max(u_f, u_b);
                   and the step at least the last micro-batch's first chunk there and back, (M − p) P
                   + (2pv + p − 3) t_p2p + Σ_s S_s. On a max-plus model of the graph's schedules and
                   streams with uniform stages: 1F1B exact; interleaved exact once a send outlasts
                   about two chunk passes, in between up to ~7% low (cycles not modelled here), with
                   short sends and few micro-batches up to ~3% high (tests/test_fast_estimate.py);
                   tests/test_fast_estimate.py bounds the slow-network grid against the graph.
                   Blocking exchanges (PlanConfig.blocking_p2p) instead: DeepSpeed's and Megatron-Core's
                   1F1B in lockstep, max_k (M (S_k + c_k t_p2p) + e_k t_p2p) + Σ_s S_s − max_s S_s
                   (_blocking_pipeline); Megatron-LM's interleaved without overlap_p2p_comm, M max_s S_s
                   + (Σ_s S_s − max_s S_s) / v + (v (M + p) + p − 3) t_p2p (_blocking_interleaved); each
                   pass after an exchange later by its host's first launches (_host_synced)
    exposed DP     DDP and ZeRO-1 as Megatron-Core buckets them (_first_chunk_exposed): stage 0's
                   first chunk in buckets, each released when its units' backward ends (each
                   its own size: the embedding's, released last, _bucket_tails), every later
                   chunk and every other stage's chunk in one bucket at its end,
                   interleaved chunks p passes apart, stage s a pass and a send earlier per hop;
                   otherwise (ZeRO-2) G seconds in n buckets, a share per model chunk:
                   max(G / n, max_k ((k + 1) G / v − k p W − W (n/v − 1)/(n/v)));
                   ZeRO-2 reduces after every micro-batch: also the backlog M·G − window when the
                   DP stream cannot keep up, whose window opens when micro-batch 0 has gone down
                   the pipeline and back to the first stage. FSDP2 under torch.distributed.pipelining
                   (ZeRO 2-3 with whole fp32 sums, plan.fsdp2_accumulates, pp > 1): nothing during the
                   passes; each chunk's reduce-scatters after its last backward, the compute stream
                   waiting: the first stage's chunks' one after another after the passes
    ZeRO-3         pp = 1: per unit (embedding, layer, head) max(its compute, the next unit's
                   gather, plus the previous unit's reduce-scatter in backward): FSDP's one-ahead
                   prefetch. With pipelining, each stage's chunk passes unit by unit in the graph's
                   stream order (_fsdp_pass): back to back for the period (a forward after a
                   backward inherits its trailing reduce-scatters), after a wait that hides the
                   first gathers for the fill and drain
    + exposed parameter gathers (ZeRO-1/2, same form as DP, behind the first forward) + embedding and
    gradient-norm all-reduces + optimizer + the first launch + Transformer Engine's once-per-step FP8
    weight casts of every chunk (transformer.weight_cast_bytes: each on micro-batch 0's way down).
    Transformer Engine 1.x DelayedScaling: every chunk pass ends in its blocking amax reduction
    (transformer.py _amax_reduction), counted in the stage's forward and backward seconds.
    host           the graph's semantics (transformer.py _run_segment): each stage's host issues its
                   kernels in stream order, h = GPUSpec.kernel_launch_overhead_s each, never waiting
                   for the stream; a segment's first kernel waits for its own launch, its last for all
                   of them. The passes end no earlier than (max of):
                   - the stream's pipeline plus h, or plus stage 0's host lead on micro-batch 0 (the
                     host issuing its first forward, or its warm-up forwards and first backward, later
                     than the stream would run them);
                   - each stage's host done issuing its M micro-batches, then its last backward (its
                     last kernel and blocking communication; in gradient buckets, a segment each, the
                     last bucket's or the one before it and then the last, _after_last_launch) and the
                     backwards of the stages below it;
                   - GPipe: each stage's backward phase, once its M forwards are issued and run (the
                     stage before it done too) and micro-batch 0's backward has come down to it, each
                     hop as the host issues it; then M backwards back to back and the stages below.
                   Exact for one segment of n kernels of c seconds: max(h + n c, n h + c); between the
                   bounds (host and stream alike busy) an approximation (tests/test_fast_estimate.py).
                   Overlapped DP reductions are released on whichever chain ends the last backward: the
                   stream's (exposed DP above) or the host's, its units n h apart (_behind_either)
    contention     compute beside communication on another stream runs at 1/(1 + s) of its rate
                   (GPUSpec.overlap_compute_slowdown, sim/contention.py). A segment of the graph runs
                   its compute first, then its blocking TP/CP communication (not slowed): c seconds of
                   compute beside a seconds from a common start take min(c (1 + s), c + s/(1 + s) a)
                   (_slowed, exact for one segment). ZeRO-3 unit by unit (_fsdp_pass: beside what its
                   DP stream holds when the unit starts, exact there; _fsdp_step: beside its gathers
                   and reduce-scatters); Megatron-Core's buckets: the first forward beside the gathers
                   it hides, the last backward beside the reductions it hides, and what outlasts them
                   again with the passes that much slower; per micro-batch and stage
                   (_released_beside): ZeRO-2's reductions, each beside the segment after its bucket,
                   and the overlapped pipeline sends, each beside the pass after it.
Approximations: stages are uniform but for the embedding and head, sends cost the same on every
hop, and a pass either runs back to back or waits long enough. tests/test_fast_estimate.py bounds
the disagreement with the graph simulation (every plan of its grids within 2%). Known larger, from a
random audit of 1,043 plans (session 25; 3.2% of them more than 5% off the graph): interleaved ZeRO-2
with overlapped reductions at few micro-batches, up to 26% above (the backlog term takes the DP stream
as fed steadily from the first backward; the cooldown feeds it in a bunch), GPipe × ZeRO-3 at 32
stages 19-21% above, ZeRO-2 reduced after the backward beside overlapped pipeline sends (no framework
runs it) -25% to +21%, DeepSpeed's lockstep sends with host-bound SequentialMLP layers to 13% below.
FSDP2's ZeRO-3 under pipelining (memory.zero3_kept) at few micro-batches on slow networks: its passes count
the steady state's gathers (a forward after a backward gathers nothing), not the warm-up forwards' (a forward
after a forward gathers again): 4 micro-batches of gpt3-1.3b on 5 GB/s NICs up to 11% below the graph
(tests/test_fast_estimate.py's torchtitan grid: 2.3% at the preset's 50 GB/s).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from itercast.config.job import Job, parse_section
from itercast.config.model import ModelConfig
from itercast.config.plan import PlanConfig, pipelined_fsdp2
from itercast.config.system import SystemConfig
from itercast.costs.analytic import AnalyticCostModel
from itercast.costs.host_overheads import host_calibrated
from itercast.errors import ConfigError
from itercast.hardware.topology import GroupPlacement
from itercast.memory import memory_columns, virtual_stage_layer_counts, zero3_kept
from itercast.parallel.plan_table import COLUMNS, RECOMPUTE, VARIED, PlanTable
from itercast.parallel.schedules import SCHEDULES, in_flight_microbatches
from itercast.workloads.transformer import (
    GRAD_NORM_BYTES,
    Groups,
    UnitCosts,
    WaitSplit,
    amax_reduction_bytes,
    bucket_spans,
    dp_collective_s,
    grad_bucket_pass_bytes,
    grad_buffer_zero_bytes,
    grad_collective,
    local_optimizer_params,
    optimizer_step_bytes,
    p2p_send_s,
    param_collective,
    pipe_copy_s,
    pipe_partitioned,
    scatter_gathered,
    stage_output_bytes,
    unit_kinds,
    unit_params,
    weight_bytes,
    weight_cast_bytes,
)

_LAYER_KEY = ("tp", "cp", "mbs", "sp", "recompute", "ep", "etp")
_CHUNK_KEY = ("pp", "vp")  # also a layer's, where the recomputed share depends on the chunks
_FSDP2_KEY = ("pp", "zero")  # also a unit's under grad_accumulation fsdp2 (transformer_ops.grad_accumulation_cost)
_GROUP_KEY = ("tp", "cp", "dp", "pp", "vp", "zero", "ep", "etp", "shard")
_STAGE_KEY = ("pp", "vp")
#: one pass of each unit: layer, embedding, head, MoE layer; forward and backward
UNIT_PASSES = ("lf", "lb", "ef", "eb", "hf", "hb", "mf", "mb")
_P2P_KEY = ("tp", "cp", "dp", "pp", "mbs", "sp")


def _shared(base: PlanConfig) -> str:
    """The fields a table's plans share (dtype, switches, batch, ...), as a cache key."""
    return base.model_dump_json(exclude=VARIED)


class FastEstimator:
    """Estimates for one model and system over many plans; caches unit and group costs across calls."""

    def __init__(
        self,
        model: dict[str, Any] | ModelConfig,
        system: dict[str, Any] | SystemConfig,
        calibration: dict[str, Any] | None = None,
    ) -> None:
        """`model`, `system`: validated configs, or raw sections (`preset: NAME` plus overrides);
        `calibration`: curves from profile.calibrate.load_calibration (None: the built-in ones) and its host
        overheads (costs/host_overheads.py host_calibrated), as predict's."""
        self.model = model if isinstance(model, ModelConfig) else cast(ModelConfig, parse_section("model", model))
        self.system = host_calibrated(
            system if isinstance(system, SystemConfig) else cast(SystemConfig, parse_section("system", system)),
            calibration,
        )
        self.calibration = calibration
        # keyed by the tables' shared fields too: one estimator may price tables of several bases
        self._units: dict[tuple[str | int, ...], UnitCosts] = {}
        self._groups: dict[tuple[str | int, ...], dict[str, float]] = {}
        self._costs: dict[str, AnalyticCostModel] = {}
        self._collectives: dict[int, dict[tuple[str, float, GroupPlacement], float]] = {}
        self._kinds: dict[tuple[str | int, ...], list[str]] = {}  # unit_kinds by (shared fields, pp, vp, stage, chunk)

    # -- the list-of-plans interface (validation through Job) ------------------------------------
    def jobs(self, plans: Sequence[dict[str, Any]]) -> tuple[list[Job | None], list[str]]:
        """Validate plans. Aligned with `plans`: a job and "" where valid, None and every problem where not."""
        jobs: list[Job | None] = []
        errors: list[str] = []
        for plan in plans:
            try:
                jobs.append(Job.from_dicts(self.model.model_dump(), plan, self.system.model_dump()))
                errors.append("")
            except ConfigError as exc:
                jobs.append(None)
                errors.append("; ".join(str(exc).splitlines()))
        return jobs, errors

    def step_time_s(self, jobs: Sequence[Job]) -> np.ndarray:
        """Predicted seconds per step for each job (same model and system)."""
        return self.evaluate(PlanTable.of_jobs(jobs))["step_time_s"]

    # -- the array interface -------------------------------------------------------------------
    def evaluate(self, table: PlanTable) -> dict[str, np.ndarray]:
        """Step time, memory per GPU and whether it fits, for every row of a validated table."""
        if table.base.cuda_launch_blocking:
            raise ConfigError(
                "plan.cuda_launch_blocking: the fast path has no closed form for every launch waiting for its "
                "kernel; `itercast predict` prices it on the graph (workloads/transformer.py)"
            )
        mem = memory_columns(self.model, self.system, table)
        out = {f"memory_{k}_bytes": v for k, v in mem.items() if k != "stage"}
        out["step_time_s"] = self._step_time_s(table)
        out["memory_per_gpu_bytes"] = mem["total"]
        out["fits"] = mem["total"] <= self.system.gpu.hbm_bytes
        return out

    def _step_time_s(self, t: PlanTable) -> np.ndarray:
        c = t.cols
        f = self._unit_columns(t)
        g = self._group_columns(t)
        p, v, M = c["pp"], c["vp"], t.microbatches
        zero, sync = c["zero"], g["grad_ranks"] > 1
        fsdp_pp = (zero == 3) & sync & (p > 1)
        # FSDP2 under torch.distributed.pipelining: whole fp32 sums, each chunk's reduce-scatters after its last
        # backward, the compute stream waiting for them (transformer.py, `accumulating`)
        accum = pipelined_fsdp2(t.base.grad_accumulation, p, zero) & sync
        kept = zero3_kept(t.base.grad_accumulation, p, zero)
        overlap_grad = c["overlap_grad"] > 0
        zero2_blocking = (zero == 2) & sync & ~overlap_grad & ~accum
        slowest, total = np.zeros(len(t)), np.zeros(len(t))
        tf, tb, host_s = np.zeros(len(t)), np.zeros(len(t)), np.zeros(len(t))
        tf_blocking, tb_blocking = np.zeros(len(t)), np.zeros(len(t))  # their blocking communication
        tb_host = np.zeros(len(t))  # tb at the host's pace: its kernels' launches
        host_chain = np.zeros(len(t))  # the passes' end where the last backward runs behind its host
        host_forwards = np.zeros(len(t))  # GPipe: the host's M forwards, then the backward phase on the stream
        host_opens = np.zeros(len(t))  # GPipe: the first stage's first backward, after the hosts' M forwards
        host_leads = np.zeros(len(t))  # how far stage 0's host holds micro-batch 0 back beyond its stream
        forward_leads = np.zeros(len(t))  # the same, of its first forward only
        launch_s = self.system.gpu.kernel_launch_overhead_s
        slowdown = self.system.gpu.overlap_compute_slowdown  # compute beside DP communication (sim/contention.py)
        last_kernel = f["lb"] / np.maximum(f["k_lb"], 1.0)  # a layer backward's mean kernel
        kernels = {n: f[f"k_{n}"] for n in UNIT_PASSES}  # kernels of one pass of each unit
        comms = {n: f[f"c_{n}"] for n in UNIT_PASSES}  # blocking communication of one pass of each unit
        # each unit's backward at the host's pace: a segment's last kernel waits for all its launches
        # (transformer.py _run_segment), so behind its host the units end (and release their
        # gradient buckets) n h apart, n its kernels
        # (plus what its host waits inside it: an MoE backward that re-runs the forward under recompute
        # waits for its stream there, _moe_waited, so its bucket leaves no earlier than the stream's)
        host_pace = {n: kernels[n] * launch_s + f[f"w_{n}"] for n in ("lb", "mb", "eb", "hb")}
        # a chunk's last backward in segments, one per gradient bucket (transformer.py _segments_of):
        # Megatron-Core's on stage 0, ZeRO-2's on every stage; ZeRO-3's one per unit; else one segment
        bucketed = overlap_grad & sync & (zero <= 2) & ~accum
        fill = np.zeros(len(t))  # micro-batch 0 down the pipeline and back up to the first stage's backward
        period = np.zeros(len(t))  # the steady state's seconds per micro-batch
        chunk_trip = np.zeros(len(t))  # interleaved: the last micro-batch's first chunk there and back
        deepspeed = t.base.pipeline_p2p == "deepspeed"
        # PlanConfig.blocking_p2p, row by row: DeepSpeed's transfers, Megatron-Core's under 1f1b, and Megatron's
        # interleaved without overlap_p2p_comm
        megatron_blocks = (c["schedule"] == SCHEDULES.index("1f1b")) | (
            (c["schedule"] == SCHEDULES.index("interleaved-1f1b")) & (not t.base.overlap_p2p_comm)
        )
        blocking = deepspeed | ((t.base.pipeline_p2p == "megatron") & megatron_blocks)
        lockstep = np.zeros(len(t))  # blocking: the pipeline of _blocking_pipeline or _blocking_interleaved
        gpipe = c["schedule"] == SCHEDULES.index("gpipe")
        keys, inverse = _distinct(t, _STAGE_KEY)
        for key_index, (pp, vp) in enumerate(keys):  # stage by stage, per pipeline shape
            rows = inverse == key_index
            dense_n, moe_n = self._stage_layers(t.base, pp, vp)
            forward = _per_stage(f, "f", rows, dense_n, moe_n) + vp * g["amax_f"][rows, None]
            backward = _per_stage(f, "b", rows, dense_n, moe_n) + vp * g["amax_b"][rows, None]
            if deepspeed:  # DeepSpeed's all-gathers of partitioned tensors, its copies (transformer.py _exchange)
                forward[:, 1:] += (g["p2p_gather"] + 2 * g["p2p_receive"])[rows, None]
                forward[:, :-1] += g["p2p_partition"][rows, None]
                backward[:, :-1] += 2 * g["p2p_gather"][rows, None]
                backward[:, 1:] += g["p2p_partition"][rows, None]
            # Megatron-LM's all-gather of each received input (_scatter_gather; 0 where it does not act): every
            # chunk pass but the first virtual stage's forwards and the last one's backwards
            received = g["p2p_gather"][rows, None] if t.base.p2p_scatter_gather else np.zeros((int(rows.sum()), 1))
            forward += vp * received
            forward[:, 0] -= received[:, 0]
            backward += vp * received
            backward[:, -1] -= received[:, 0]
            stage = forward + backward
            passes = stage.copy()  # the passes alone: what a micro-batch's round trip waits for
            blocked = np.where(zero2_blocking[rows], 1.0, 0.0)
            stage[:, 0] += blocked * g["block_first"][rows]
            stage[:, 1:-1] += (blocked * g["block_inner"][rows])[:, None]
            if pp > 1:
                stage[:, -1] += blocked * g["block_last"][rows]
            fsdp_rows = fsdp_pp[rows]
            fsdp_back = np.zeros_like(stage)  # ZeRO-3 × pipeline: a backward's steady seconds beside its DP stream
            if fsdp_rows.any():  # ZeRO-3 × pipeline: each stage's passes beside its DP stream, unit by unit
                stage[fsdp_rows], passes[fsdp_rows], fsdp_back[fsdp_rows] = self._fsdp_stages(
                    t.base, pp, vp, f, g, np.flatnonzero(rows)[fsdp_rows], c["schedule"], accum, kept
                )
                amax = vp * (g["amax_f"] + g["amax_b"])[rows][fsdp_rows, None]  # each chunk pass's (as above)
                stage[fsdp_rows] += amax
                passes[fsdp_rows] += amax
            # compute slowed beside the sends and ZeRO-2 reductions its passes release (_released_beside)
            released = _released_beside(
                forward,
                backward,
                _per_stage(comms, "f", rows, dense_n, moe_n),
                _per_stage(comms, "b", rows, dense_n, moe_n),
                np.where(blocking[rows], 0.0, g["p2p"][rows]),
                np.where((zero == 2)[rows] & overlap_grad[rows] & sync[rows] & ~accum[rows], g["grad"][rows], 0.0),
                g["buckets"][rows],
                gpipe[rows],
                vp,
                slowdown,
            )
            stage += released
            passes += released
            slowest[rows] = stage.max(axis=1)
            if blocking[rows].any():
                synced = np.zeros_like(stage)
                if not deepspeed:  # Megatron-Core's 1F1B: the host waits for the device after every exchange
                    c_f, c_b, n_f, n_b = (
                        _per_stage(x, d, rows, dense_n, moe_n) for x in (comms, kernels) for d in "fb"
                    )
                    chunked = (vp, M[rows]) if vp > 1 else None
                    synced = _host_synced((forward, backward), (c_f, c_b), (n_f, n_b), launch_s, received, chunked)
                if vp > 1:
                    lockstep[rows] = _blocking_interleaved(stage + synced, M[rows], vp, g["p2p"][rows])
                else:
                    lockstep[rows] = _blocking_pipeline(stage + synced, M[rows], g["p2p"][rows], deepspeed)
            # The fill and drain wait for the other stages' passes, not for what follows their sends:
            # a blocking ZeRO-2 reduction, of which (v − 1)/v lies ahead of the chunk that comes back
            # to the stage next (interleaved); without interleaving a ZeRO-3 pass's first gathers
            fills = passes + (stage - passes) * (vp - 1) / vp
            fills = np.where((zero2_blocking[rows] | (fsdp_rows & (vp == 1)))[:, None], fills, stage)
            busiest_stage = stage.argmax(axis=1)
            total[rows] = slowest[rows] + fills.sum(axis=1) - fills[np.arange(len(busiest_stage)), busiest_stage]
            if vp == 1 and pp > 1:  # 1F1B: stage s holds p − s micro-batches, each waiting on a round trip
                trip = 2 * (pp - 1 - np.arange(pp))[None, :] * g["p2p"][rows, None]
                bound = (passes[:, ::-1].cumsum(axis=1)[:, ::-1] + trip) / (pp - np.arange(pp))[None, :]
                # a stage whose warm-up takes every micro-batch (p − s − 1 ≥ M) has no steady state
                bound[np.arange(pp)[None, :] < pp - 1 - M[rows, None]] = 0.0
                # GPipe: a phase moves one micro-batch a send, so it runs at its slowest pass or its send, whichever
                # is longer (the link carries the forward phase's activations, then the backward's gradients)
                send = g["p2p"][rows, None]
                phases = np.maximum(forward, send).max(axis=1) + np.maximum(passes - forward, send).max(axis=1)
                period[rows] = np.where(
                    gpipe[rows], np.maximum(slowest[rows], phases), np.maximum(slowest[rows], bound.max(axis=1))
                )
            elif pp > 1:  # interleaved: the module docstring's three cycles (overlapped sends)
                send = g["p2p"][rows]
                n = np.arange(pp * vp, 0, -1)  # from virtual stage c·p + s, n virtual stages to the last
                ahead = np.tile(passes / vp, vp)[:, ::-1].cumsum(axis=1)[:, ::-1]
                trips = vp * (ahead + 2 * (n - 1)[None, :] * send[:, None]) / (2 * n - 1)[None, :]
                chunk_f, chunk_b = forward / vp, (passes - forward) / vp
                groups = (2 * pp * vp - 1) * send + pp * chunk_f.max(axis=1) + pp * (2 * vp - 1) * chunk_b.max(axis=1)
                stream = vp * send + (vp - 1) * np.maximum(chunk_f, chunk_b).mean(axis=1)
                cycle = np.maximum(np.maximum(trips.max(axis=1), groups / (2 * pp)), stream)
                # with as many micro-batches as stages every forward runs first: no steady state
                period[rows] = np.where(M[rows] > pp, np.maximum(slowest[rows], cycle), slowest[rows])
                # the last micro-batch's first chunk leaves stage 0 p − 1 sends after its group's
                # first, (M − p) periods in, and comes back over every virtual stage
                chunk_trip[rows] = (M[rows] - pp) * period[rows] + (2 * pp * vp + pp - 3) * send + passes.sum(axis=1)
            else:
                period[rows] = slowest[rows]
            # GPipe: the last stage runs all M forwards first
            late = np.where(gpipe[rows], (M[rows] - 1) * forward.max(axis=1), 0.0)
            fill[rows] = forward.sum(axis=1) + (stage - forward)[:, 1:].sum(axis=1) + late
            # a chunk pass of the most loaded stage, for the windows below
            busiest = (dense_n + moe_n).argmax()
            tf[rows] = (dense_n[busiest] * f["lf"][rows] + moe_n[busiest] * f["mf"][rows]) / vp + g["amax_f"][rows]
            tb[rows] = (dense_n[busiest] * f["lb"][rows] + moe_n[busiest] * f["mb"][rows]) / vp + g["amax_b"][rows]
            tf_blocking[rows] = (dense_n[busiest] * f["c_lf"][rows] + moe_n[busiest] * f["c_mf"][rows]) / vp
            tb_blocking[rows] = (dense_n[busiest] * f["c_lb"][rows] + moe_n[busiest] * f["c_mb"][rows]) / vp
            tb_host[rows] = (dense_n[busiest] * host_pace["lb"][rows] + moe_n[busiest] * host_pace["mb"][rows]) / vp
            # the host of each stage issues its M micro-batches' kernels without waiting; the stage's
            # last backward then still passes down the stages before it, a chunk's backward and a send each
            # (and waits: an MoE layer's host waits for its stream, _moe_waited)
            waits = {n: f[f"w_{n}"] for n in UNIT_PASSES}
            issued_f = _per_stage(kernels, "f", rows, dense_n, moe_n) * launch_s + _per_stage(
                waits, "f", rows, dense_n, moe_n
            )
            issued = issued_f + _per_stage(kernels, "b", rows, dense_n, moe_n) * launch_s
            issued += _per_stage(waits, "b", rows, dense_n, moe_n)
            # a backward on the stream (ZeRO-3 × pipeline: beside its gathers, back to back)
            back = np.where(fsdp_rows[:, None], fsdp_back, stage - forward)
            down = back / vp + g["p2p"][rows, None]
            below = np.cumsum(down, axis=1) - down
            # the last backward starts once all else is issued, then takes its stream time; or after the
            # last launch: its last kernel, its blocking communication (one segment) and ZeRO-2 reduction
            # (ZeRO-3: a layer's); in gradient buckets, _after_last_launch
            whole = _per_stage(comms, "b", rows, dense_n, moe_n)
            # a backward whose MoE layers recompute their forward waits for its stream in each of them
            # (transformer.py moe_wait_split): after its last launch only what follows its last wait is
            # left, the rest of that layer and the units after it, the dense layers and the embedding
            # (every dense layer counted as after it: where they alternate, an overcount)
            waited = np.isfinite(f["z_mb"][rows])[:, None] & (moe_n > 0)[None, :]
            after_wait = whole - moe_n[None, :] * f["c_mb"][rows, None] + np.nan_to_num(f["z_mb"][rows, None])
            after_wait[:, -1] -= f["c_hb"][rows]  # the head's backward ran before the layers'
            whole = np.where(waited, after_wait, whole) / vp * (zero != 3)[rows, None]
            split = np.zeros_like(whole, dtype=bool)
            split[:, 0], split[:, 1:] = bucketed[rows], (bucketed & (zero == 2))[rows, None]
            slots = ["first", *["second"] * (pp - 2), "last"][:pp]  # _group_costs's stages
            in_buckets = np.column_stack([_after_last_launch(g, f, rows, slot, launch_s) for slot in slots])
            after_launch = np.where(split, in_buckets, last_kernel[rows, None] + whole)
            after_launch += np.where(fsdp_rows[:, None], 0.0, stage - passes) / vp
            last_pass = np.maximum(after_launch, (back - issued + issued_f) / vp + launch_s)
            host_s[rows] = (M[rows, None] * issued + below + last_pass).max(axis=1)
            host_chain[rows] = (M[rows, None] * issued + below + after_launch).max(axis=1)
            # stage 0's micro-batch 0: the stream ahead of its host after its first forward and its
            # first backward, which comes after its warm-up forwards (in whole-stage units)
            warm = in_flight_microbatches(c["schedule"][rows], 0, pp, M[rows], vp)
            lead_f = issued_f[:, 0] / vp + last_kernel[rows] - forward[:, 0] / vp
            lead_b = warm * issued_f[:, 0] + (issued[:, 0] - issued_f[:, 0]) / vp + last_kernel[rows] - back[:, 0] / vp
            lead_b = np.where(gpipe[rows], 0.0, lead_b - fill[rows] - 2 * (pp - 1) * g["p2p"][rows])  # GPipe: below
            host_leads[rows], forward_leads[rows] = np.maximum(lead_f, lead_b), lead_f
            # GPipe: a stage's backward phase starts when its M forwards are done (the last one issued
            # after the others, then its stream time) and micro-batch 0's backward has come down to it,
            # a backward on each later stage's stream and a send a stage (`down`: its host issued that
            # backward while the stream finished the forwards); then M backwards back to back. Until
            # session 16 a step down took the larger of a backward's host issue time and its stream
            # time, which against the graph counted the host twice where forwards are host-bound and
            # backwards nearly stream-bound (GPipe between host- and stream-bound, 600 jobs of two
            # small llamas: 14 moved, worst 6.3% -> 0.8% above the graph, none worse; with ZeRO-3, 23
            # moved, none worse, their worst 17.7% -> 12.5%; that corner's worst stays 13.1% above it, and
            # 19-21% at 32 stages in session 25's audit of random plans, cause not found: pricing micro-batch
            # 0's hops down as passes that waited, their gathers hidden, moved it 0.4%)
            fwd = np.where(fsdp_rows[:, None], stage - fsdp_back, forward)
            done = np.maximum(M[rows, None] * issued_f, (M[rows, None] - 1) * issued_f + launch_s + fwd)
            for s in range(1, pp):  # and the stage before it done with its last forward
                done[:, s] = np.maximum(done[:, s], done[:, s - 1] + g["p2p"][rows] + fwd[:, s])
            done[:, -1] = np.maximum(done[:, -1], forward.sum(axis=1) + late + (pp - 1) * g["p2p"][rows])
            for s in range(pp - 2, -1, -1):
                done[:, s] = np.maximum(done[:, s], done[:, s + 1] + down[:, s + 1])
            host_forwards[rows] = np.where(gpipe[rows], (done + M[rows, None] * back + below).max(axis=1), 0.0)
            host_opens[rows] = np.where(gpipe[rows], done[:, 0], 0.0)
        # the module docstring's pipeline
        fill_drain = (total - slowest) / v + 2 * (p - 1) * g["p2p"]
        on_trips = np.where((v == 1) & ~gpipe & (period > slowest), 2 * g["p2p"], 0.0)  # 1F1B: 2 (p − 2) t_p2p
        # where the passes set the pace, micro-batch 0 goes down every virtual stage and the last one comes
        # back up: 2 (pv − 1) sends (interleaved: 2 p (v − 1) more than 1F1B's)
        every_hop = 2 * p * (v - 1) * g["p2p"]
        pipeline = np.maximum(M * slowest + fill_drain + every_hop, M * period + fill_drain - on_trips)
        pipeline = np.maximum(pipeline, chunk_trip)
        pipeline = np.where(blocking, lockstep, pipeline)
        buckets = g["buckets"]
        grad, gather = g["grad"], g["gather"]
        megatron = zero <= 1  # DDP and the distributed optimizer: Megatron-Core's bucketing (_first_chunk_exposed)

        def exposed(slower_f: np.ndarray, slower_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """The reductions after the last backward and the gathers before the first forward that
            outlast the passes, each pass `slower` times its seconds alone."""
            units = {k: v * (slower_f if k[1] == "f" else slower_b) for k, v in f.items() if len(k) == 2}
            pass_b, pass_f = tb * slower_b, tf * slower_f
            hop_b, hop_f = pass_b + g["p2p"], pass_f + g["p2p"]
            b = np.where(
                megatron,
                _first_chunk_exposed(g, units, "grad", pass_b, hop_b, v, p),
                _exposed(grad, buckets, pass_b, v, p),
            )
            fw = np.where(
                zero == 1,
                _first_chunk_exposed(g, units, "gather", pass_f, hop_f, v, p),
                _exposed(gather, buckets, pass_f, v, p),
            )
            return np.where(overlap_grad, b, g["grad_whole"]), np.where(gathering, fw, 0.0)

        # overlapped behind the first forward, else all at once after the optimizer step
        gathering = ((zero == 1) | (zero == 2)) & (c["overlap_param"] > 0)
        gather_after = np.where(((zero == 1) | (zero == 2)) & (c["overlap_param"] == 0), g["gather_whole"], 0.0)
        last_bwd, gather_before = exposed(np.ones(len(t)), np.ones(len(t)))
        # the passes end with the latest of the module docstring's host bounds
        host_end = np.maximum(host_s, host_forwards + launch_s)
        # the first forward beside the gathers it hides, the last backward beside the reductions it
        # hides (Megatron-Core's buckets): each pass as one beside one collective (_slowed); what
        # outlasts them, again with the passes that much slower
        hidden_f = np.where(gathering, np.maximum(gather - gather_before, 0.0), 0.0)
        hidden_b = np.where(megatron & overlap_grad & sync, np.maximum(grad - last_bwd, 0.0), 0.0)
        stretch_f = _slowed(tf, hidden_f, slowdown, tf_blocking) - tf
        stretch_b = _slowed(tb, hidden_b, slowdown, tb_blocking) - tb
        if slowdown:
            last_bwd, gather_before = exposed(
                1 + stretch_f / np.maximum(tf, 1e-300), 1 + stretch_b / np.maximum(tb, 1e-300)
            )
        leads = np.maximum(gather_before + launch_s, host_leads)
        stream_end = pipeline + stretch_f + stretch_b + leads
        # ZeRO-2: a reduction after every micro-batch; the backward may outrun the DP stream, whose
        # window opens at the first stage's first backward: micro-batch 0 down the pipeline and back up
        # (`fill`; under GPipe after the last stage's M forwards, or its host's)
        opens = np.maximum(fill + 2 * (p - 1) * g["p2p"] + gather_before, host_opens) + launch_s
        passes_end = np.maximum(stream_end, host_end)
        # overlapped reductions after the last backward, on whichever chain ends it (_behind_either): the
        # stream's holds stage 0's host lead on micro-batch 0's first backward only where that is not
        # the last (M > 1), and GPipe's backward phase after its hosts' forwards
        lead = np.maximum(gather_before + launch_s, np.where(M > 1, host_leads, forward_leads))
        stream_chain = np.maximum(stream_end - leads + lead, host_forwards + launch_s)
        exposed_host = np.where(
            megatron,
            _first_chunk_exposed(g, f | host_pace, "grad", tb_host, tb + g["p2p"], v, p),
            _exposed(grad, buckets, tb_host, v, p),
        )
        behind = _behind_either(last_bwd, exposed_host, passes_end, stream_chain, host_chain)
        last_bwd = np.where(overlap_grad, behind, last_bwd)
        backlog = M * grad - (passes_end - opens)
        zero2 = np.where(overlap_grad, np.maximum(last_bwd, backlog), 0.0)  # else inside the stages
        exposed_grad = np.where(zero == 2, zero2, np.where(fsdp_pp, g["rs_e"], last_bwd))
        exposed_grad = np.where(accum, g["block_first"], exposed_grad)  # stage 0's chunks, one after another
        # ZeRO-3 without pipelining: the embedding's reduce-scatter ends the step (_fsdp_step)
        fsdp = np.maximum(_fsdp_step(f, g, self.model, M, slowdown) + launch_s, host_end + g["rs_e"])
        fsdp += M * (g["amax_f"] + g["amax_b"])  # each pass's amax reduction (TE DelayedScaling), blocking
        step = np.where((zero == 3) & sync & (p == 1), fsdp, passes_end + exposed_grad + gather_after)
        # Megatron's gradient buffer (ZeRO 0-1), after the reductions as the graph places it (_buffer_passes):
        # zeroed, and each reduction's pass over its bucket (without overlap, or on one rank, the whole buffer)
        grad_pass = np.where(overlap_grad & sync, g["grad_pass_buckets"], g["grad_pass_whole"])
        buffer = g["grad_zero"] + grad_pass
        return step + buffer + g["weight_cast"] + g["tail"]  # Transformer Engine's once-per-step FP8 weight casts

    def _fsdp_stages(
        self,
        base: PlanConfig,
        pp: int,
        vp: int,
        f: dict[str, np.ndarray],
        g: dict[str, np.ndarray],
        rows: np.ndarray,
        sched: np.ndarray,
        accum: np.ndarray,
        kept: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Seconds per micro-batch of each stage (columns) for ZeRO-3 rows with pipeline parallelism:
        each chunk's forward and backward pass unit by unit beside the DP stream (_fsdp_pass), (1)
        back to back as in the steady state, where a forward after a backward inherits its trailing
        reduce-scatters (1F1B, interleaved) and under GPipe backwards follow backwards; (2) after
        a wait for their input that hid their first gathers (the fill and drain). Rows where `accum` (FSDP2
        under torch.distributed.pipelining) reduce-scatter nothing in their passes: after the last backward; and
        where `kept` (memory.zero3_kept) a pass after a backward of its chunk gathers nothing."""
        job = self._job(base, pp=pp, vp=vp)
        slowdown = self.system.gpu.overlap_compute_slowdown
        gpipe = sched[rows] == SCHEDULES.index("gpipe")
        out, waited, backs = (np.zeros((rows.shape[0], pp)) for _ in range(3))
        zero = np.zeros(rows.shape[0])
        for s in range(pp):
            for chunk in range(vp):
                kinds = [k[0] for k in unit_kinds(job, s, chunk)]
                cf = [f[f"{k}f"][rows] for k in kinds]
                cb = [f[f"{k}b"][rows] for k in kinds[::-1]]
                sf = [f[f"c_{k}f"][rows] for k in kinds]  # each unit's blocking communication
                sb = [f[f"c_{k}b"][rows] for k in kinds[::-1]]
                ag = [g[f"ag_{k}"][rows] for k in kinds]
                rs = [np.where(accum[rows], 0.0, g[f"rs_{k}"][rows]) for k in kinds[::-1]]
                # kept from a backward (memory.zero3_kept): a steady forward after a backward (1F1B, interleaved)
                # or backward after a backward (GPipe) gathers nothing
                ag_f = [np.where(kept[rows] & ~gpipe, 0.0, a) for a in ag]
                ag_b = [np.where(kept[rows] & gpipe, 0.0, a) for a in ag[::-1]]
                backward, left = _fsdp_pass(cb, ag_b, rs, zero, slowdown=slowdown, blocking=sb)
                backward, left = _fsdp_pass(
                    cb, ag_b, rs, np.where(gpipe, left, zero), slowdown=slowdown, blocking=sb
                )  # GPipe
                forward, _ = _fsdp_pass(cf, ag_f, None, np.where(gpipe, zero, left), slowdown=slowdown, blocking=sf)
                out[:, s] += forward + backward
                backs[:, s] += backward
                waited[:, s] += (
                    _fsdp_pass(cf, ag_f, None, zero, True, slowdown, sf)[0]
                    + _fsdp_pass(cb, ag_b, rs, zero, True, slowdown, sb)[0]
                )
        return out, waited, backs

    def _stage_layers(self, base: PlanConfig, pp: int, vp: int) -> tuple[np.ndarray, np.ndarray]:
        """Dense and MoE layers of each pipeline stage."""
        m = self.model
        shaped = base.model_copy(update={"pipeline_parallel": pp, "virtual_pipeline": vp})
        per_virtual, moe_virtual = virtual_stage_layer_counts(m, shaped)
        layers = per_virtual.reshape(vp, pp).sum(axis=0)
        moe_n = moe_virtual.reshape(vp, pp).sum(axis=0)
        return (layers - moe_n).astype(np.float64), moe_n.astype(np.float64)

    # -- per distinct value: unit costs and group costs ------------------------------------------
    def _unit_columns(self, t: PlanTable) -> dict[str, np.ndarray]:
        """Seconds of one pass of each unit (compute + blocking communication, and its stream's wait for its
        host: _moe_waited), kernel counts, blocking communication and the host's waits (w_)."""
        base = t.base
        keys, inverse = _distinct(t, _unit_key(base))
        rows: dict[str, list[float]] = {k: [] for n in UNIT_PASSES for k in (n, f"k_{n}", f"c_{n}", f"w_{n}")}
        rows["z_mb"] = []  # an MoE layer's backward: its blocking communication after its host's wait (_moe_waited)
        launch_s = self.system.gpu.kernel_launch_overhead_s
        for key in keys:
            u = self._unit_costs(t.base, key)
            passes = (u.layer_fwd, u.layer_bwd, u.embed_fwd, u.embed_bwd, u.head_fwd, u.head_bwd, u.moe_fwd, u.moe_bwd)
            waited = {"mf": _moe_waited(u.moe_fwd_wait, launch_s), "mb": _moe_waited(u.moe_bwd_wait, launch_s)}
            for name, pc in zip(UNIT_PASSES, passes, strict=True):
                stream_s, host_s = waited.get(name, (0.0, 0.0))
                rows[name].append(pc.compute_s + pc.comm_s + stream_s)
                rows[f"w_{name}"].append(host_s)
                rows[f"k_{name}"].append(pc.kernels)
                rows[f"c_{name}"].append(pc.comm_s)
            # NaN where the backward never waits (no recomputed forward, _after_last_launch's `whole`)
            split = u.moe_bwd_wait
            rows["z_mb"].append(np.nan if split is None else split[1].comm_s + split[2].comm_s)
        return {k: np.asarray(v, dtype=np.float64)[inverse] for k, v in rows.items()}

    def _unit_costs(self, base: PlanConfig, key: tuple[int, ...]) -> UnitCosts:
        cached: tuple[str | int, ...] = (_shared(base), *key)
        found = self._units.get(cached)
        if found is None:
            sizes = dict(zip(_unit_key(base), key, strict=True))
            update: dict[str, Any] = {"recompute": RECOMPUTE[sizes.pop("recompute")]}
            if "zero" in sizes:
                update["zero_stage"] = sizes.pop("zero")
            job = self._job(base.model_copy(update=update), **sizes)
            found = self._units[cached] = UnitCosts.of(job, self._cost_model(base.dtype), Groups.of(job))
        return found

    def _cost_model(self, dtype: str) -> AnalyticCostModel:
        found = self._costs.get(dtype)
        if found is None:
            found = self._costs[dtype] = AnalyticCostModel(self.system, dtype, self.calibration)
        return found

    def _collective_memo(self, costs: AnalyticCostModel) -> Callable[[str, float, GroupPlacement], float]:
        """costs.collective_s, remembered: plans that differ elsewhere repeat the same collectives."""
        memo = self._collectives.setdefault(id(costs), {})

        def collective(kind: str, nbytes: float, group: GroupPlacement) -> float:
            key = (kind, nbytes, group)
            found = memo.get(key)
            if found is None:
                found = memo[key] = costs.collective_s(kind, nbytes, group)
            return found

        return collective

    def _group_columns(self, t: PlanTable) -> dict[str, np.ndarray]:
        keys, inverse = _distinct(t, _GROUP_KEY)
        rows = [self._group_costs(t.base, key) for key in keys]
        out = {k: np.asarray([r[k] for r in rows], dtype=np.float64)[inverse] for k in rows[0]}
        keys, inverse = _distinct(t, _P2P_KEY)
        sends = np.asarray([self._p2p_s(t.base, key) for key in keys], dtype=np.float64).reshape(-1, 4)[inverse]
        out["p2p"], out["p2p_gather"], out["p2p_receive"], out["p2p_partition"] = sends.T
        return out

    def _job(self, base: PlanConfig, **sizes: int) -> Job:
        """A job of `base` with some plan fields set (unvalidated: the table's rows were validated)."""
        fields: dict[str, Any] = {COLUMNS[k]: (bool(v) if k == "sp" else v) for k, v in sizes.items()}
        # the column's 0, or a job for what the shard size does not change (units, sends): the field unset
        fields["zero_shard_ranks"] = fields.get("zero_shard_ranks") or None
        dp, mbs = fields.setdefault("data_parallel", 1), fields.setdefault("micro_batch_size", 1)
        tp = fields.get("tensor_parallel", base.tensor_parallel)
        ep = fields.get("expert_parallel", base.expert_parallel)
        etp = base.expert_tensor_parallel or base.default_etp(self.model.is_moe, tp, ep)
        fields.setdefault("expert_tensor_parallel", etp)
        return Job(self.model, base.model_copy(update={**fields, "global_batch_size": mbs * dp}), self.system)

    def _p2p_s(self, base: PlanConfig, key: tuple[int, ...]) -> tuple[float, float, float, float]:
        """One pipeline send of one micro-batch's activations; under DeepSpeed's pipe engine
        (transformer.py _exchange, pipe_copy_bytes) with tp > 1 one all-gather of them over the
        tensor-parallel group and its copies, one received activation's copies and one partitioning
        before a send; under Megatron-LM's scatter-gather (transformer.py scatter_gathered) the all-gather
        alone; 0 without pipeline parallelism."""
        tp, cp, dp, pp, mbs, sp = key
        if pp == 1:
            return 0.0, 0.0, 0.0, 0.0
        job = self._job(base, tp=tp, cp=cp, dp=dp, pp=pp, mbs=mbs, sp=sp)
        costs, groups = self._cost_model(base.dtype), Groups.of(job)
        gather = 0.0
        if pipe_partitioned(job) or scatter_gathered(job):  # transformer.py _pipe_all_gather
            gather = costs.collective_s("all_gather", stage_output_bytes(job), groups.tp)
            gather += pipe_copy_s(costs, job, "gather")  # DeepSpeed's copies; Megatron-LM's: none priced
        receive, partition = (pipe_copy_s(costs, job, site) for site in ("receive", "partition"))
        return p2p_send_s(costs, job, groups.stage_cross_node), gather, receive, partition

    def _group_costs(self, base: PlanConfig, key: tuple[int, ...]) -> dict[str, float]:
        """Data-parallel and tail costs of one (tp, cp, dp, pp, vp, zero, ep, etp, shard), for the most loaded stage."""
        cached: tuple[str | int, ...] = (_shared(base), *key)
        found = self._groups.get(cached)
        if found is not None:
            return found
        tp, cp, dp, pp, vp, zero, ep, etp, shard = key
        job = self._job(base, tp=tp, cp=cp, dp=dp, pp=pp, vp=vp, zero=zero, ep=ep, etp=etp, shard=shard)
        m, costs, groups = self.model, self._cost_model(base.dtype), Groups.of(job)
        collective = self._collective_memo(costs)
        sizes = unit_params(job)
        candidates = (  # where the most params sit; an inner stage stands for the others
            range(pp) if base.stage_layers is not None or m.is_moe else {0, min(1, pp - 1), pp - 1}
        )

        def kinds(s: int, ch: int) -> list[str]:  # plans that differ in their groups only share their units
            at = (cached[0], pp, vp, s, ch)
            found = self._kinds.get(at)
            if found is None:
                found = self._kinds[at] = unit_kinds(job, s, ch)
            return found

        stage_units = {s: [[sizes[k] for k in kinds(s, ch)] for ch in range(vp)] for s in candidates}

        def stage_total(s: int) -> float:
            return sum(sum(w) for chunk in stage_units[s] for w in chunk)

        stage = max(stage_units, key=stage_total)
        params = _sum([w for chunk in stage_units[stage] for w in chunk])  # = memory.stage_params
        kind, grad_bytes, w_bytes = grad_collective(job), job.plan.grad_bytes, weight_bytes(job)
        gather_kind = param_collective(job)

        def dp_s(kind: str, w: tuple[float, float], bytes_per_param: int) -> float:
            return dp_collective_s(collective, groups, kind, w, bytes_per_param)

        buckets: list[tuple[float, float]] = []  # the graph's gradient buckets of the most loaded stage, every chunk
        for per_unit in stage_units[stage]:
            backward = per_unit[::-1]
            for a, b in bucket_spans([sum(w) for w in backward], job.plan.bucket_params):
                buckets.append(_sum(backward[a:b]))
        # ZeRO 0-1 (Megatron-Core's buckets, TransformerStepBuilder._segments_of): only stage 0's first
        # chunk is split; the slots stand for the first, second and last stages
        slots: dict[str, float] = {}
        for name, s in (("first", 0), ("second", min(1, pp - 1)), ("last", pp - 1)):
            held = s if s in stage_units else stage
            later = [_sum(chunk) for chunk in stage_units[held][1:]]
            slots[f"{name}_stage"] = float(s)
            # the graph's buckets: gradients in backward order, gathers in forward order (_segments_of)
            forward = list(zip(stage_units[held][0], (k[0] for k in kinds(held, 0)), strict=True))
            for label, op, nbytes, units in (
                ("grad", kind, grad_bytes, forward[::-1]),
                ("gather", gather_kind, w_bytes, forward),
            ):
                whole = [(0, len(units))]
                spans = bucket_spans([sum(w) for w, _ in units], job.plan.bucket_params) if s == 0 else whole
                chunk0 = [
                    (dp_s(op, _sum([w for w, _ in units[a:b]]), nbytes), [k for _, k in units[a:b]]) for a, b in spans
                ]
                slots[f"{name}_{label}0"] = sum(seconds for seconds, _ in chunk0)
                if label == "grad":  # its backward's last two buckets, split on every stage (ZeRO-2)
                    split = bucket_spans([sum(w) for w, _ in units], job.plan.bucket_params)
                    slots.update(_last_buckets(f"{name}_grad", [[k for _, k in units[a:b]] for a, b in split]))
                slots[f"{name}_{label}_later"] = sum(dp_s(op, w, nbytes) for w in later) / max(len(later), 1)
                # a forward waits for the gathers in the mirror image of a backward's reductions
                slots.update(_bucket_tails(f"{name}_{label}", chunk0 if label == "grad" else chunk0[::-1]))
        tail = float(
            costs.memory_s("optimizer", optimizer_step_bytes(job, local_optimizer_params(job, groups, params)))
        )
        if pp > 1:
            tail += costs.collective_s("all_reduce", GRAD_NORM_BYTES, groups.model)
            if m.tied:
                vocab = job.plan.local_vocab(m.vocab_size) * m.hidden_size
                tail += costs.collective_s("all_reduce", vocab * grad_bytes, groups.embedding)
        counted = Counter(buckets)
        # Megatron's gradient buffer (transformer.py grad_buffer_zero_bytes, grad_bucket_pass_bytes)
        pass_e, pass_d = grad_bucket_pass_bytes(job, groups)

        def pass_s(w: tuple[float, float]) -> float:
            return float(costs.memory_s("elementwise", w[0] * pass_e + w[1] * pass_d))

        # Transformer Engine 1.x DelayedScaling: each chunk pass ends in a blocking amax reduction
        # (transformer.py _amax_reduction): the buffer's concatenation, its all-reduce, the scale update
        amax = amax_reduction_bytes(job)
        fwd, bwd, updates = amax[stage] if amax else (0.0, 0.0, [0.0])

        def amax_s(buffer: float) -> float:
            if not amax:
                return 0.0
            kernels = costs.memory_s("elementwise", 2 * buffer) + costs.memory_s("elementwise", max(updates))
            return float(kernels) + collective("all_reduce", buffer, groups.amax)

        def blocking(stages: list[int]) -> float:
            """ZeRO-2 without overlap: each backward pass's gradients reduced at its end, on the compute stream."""
            return max(
                (sum(dp_s(kind, _sum(chunk), grad_bytes) for chunk in stage_units[s]) for s in stages), default=0.0
            )

        found = {
            "block_first": blocking([0]),
            "block_inner": blocking([s for s in stage_units if 0 < s < pp - 1]),
            "block_last": blocking([pp - 1]),
            "grad_ranks": float(max(groups.grad.size, groups.expert_grad.size)),
            "buckets": float(len(buckets)),
            "grad": sum(n * dp_s(kind, b, grad_bytes) for b, n in counted.items()),
            "gather": sum(n * dp_s(gather_kind, b, w_bytes) for b, n in counted.items()),
            # without overlap the graph reduces (and gathers) the whole buffer at once
            "grad_whole": dp_s(kind, params, grad_bytes),
            "gather_whole": dp_s(gather_kind, params, w_bytes),
            "tail": tail,
            "grad_zero": float(costs.memory_s("elementwise", grad_buffer_zero_bytes(job) * sum(params))),
            "grad_pass_buckets": sum(n * pass_s(b) for b, n in counted.items()),
            "grad_pass_whole": pass_s(params),
            "weight_cast": sum(float(costs.memory_s("elementwise", b)) for b in weight_cast_bytes(job)),
            "amax_f": amax_s(fwd),  # per chunk pass
            "amax_b": amax_s(bwd),
            **slots,
        }
        for name, w in sizes.items():  # ZeRO-3: per-unit gathers and reduce-scatters
            found[f"ag_{name[0]}"] = dp_s("all_gather", w, w_bytes)
            found[f"rs_{name[0]}"] = dp_s(kind, w, grad_bytes)
        self._groups[cached] = found
        return found


def _per_stage(
    f: dict[str, np.ndarray], direction: str, rows: np.ndarray, dense_n: np.ndarray, moe_n: np.ndarray
) -> np.ndarray:
    """Seconds of each stage's forward or backward (`direction` 'f' | 'b') per micro-batch, for
    `rows` (columns: stages): its dense and MoE layers, the embedding on the first, the head on the last."""
    out = dense_n[None, :] * f[f"l{direction}"][rows, None] + moe_n[None, :] * f[f"m{direction}"][rows, None]
    out[:, 0] += f[f"e{direction}"][rows]
    out[:, -1] += f[f"h{direction}"][rows]
    return out


def _fsdp_pass(
    compute: list[np.ndarray],
    gather: list[np.ndarray],
    reduce: list[np.ndarray] | None,
    backlog: np.ndarray,
    waited: bool = False,
    slowdown: float = 0.0,
    blocking: Sequence[np.ndarray] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """One pass of units under ZeRO-3, in the graph's stream order (workloads/transformer.py): on the
    DP stream the first two units' gathers once the pass before has ended (after `backlog`
    seconds of that pass's reduce-scatters), then after each unit its reduce-scatter (backward)
    and the gather of the unit after next (FSDP's one-ahead prefetch); a unit starts when the unit
    before it has ended and its parameters are gathered. Returns the seconds from the end of the
    pass before to the end of this one, and the DP work still running then. `waited`: the pass
    waited for its input longer than the backlog and its first two gathers took (a pass off the
    steady state's critical stage): the seconds from its start. `slowdown`: s, `blocking`: each
    unit's blocking communication (none: 0); a unit beside the DP work queued when it starts (the
    stream is busy from then to `free`: what the unit's end queues runs after it) takes _slowed's
    seconds, exact in the fluid model of sim/contention.py."""
    free = backlog + gather[0]  # the DP stream, from the end of the pass before
    ready = [free]
    if len(compute) > 1:
        free = free + gather[1]
        ready.append(free)
    if waited:
        free, ready = np.zeros_like(backlog), [np.zeros_like(backlog)] * len(ready)
    end = np.zeros_like(backlog)
    for j, seconds in enumerate(compute):
        start = np.maximum(end, ready[j])
        end = start + _slowed(seconds, np.maximum(free - start, 0.0), slowdown, blocking[j] if blocking else 0.0)
        if reduce is not None:
            free = np.maximum(free, end) + reduce[j]
        if j + 2 < len(compute):
            free = np.maximum(free, end) + gather[j + 2]
            ready.append(free)
    return end, np.maximum(free - end, 0.0)


def _slowed(
    pass_s: np.ndarray, comm_s: np.ndarray, slowdown: float, blocking_s: np.ndarray | float = 0.0
) -> np.ndarray:
    """Seconds of a segment of `pass_s` that starts beside `comm_s` of communication on another
    stream, at s = `slowdown` (sim/contention.py: compute at 1/(1 + s) of its rate while both run).
    The segment runs its compute c = pass_s − blocking_s first, then `blocking_s` of blocking TP/CP
    communication on its own stream, not slowed (transformer.py _run_segment: body, last kernel,
    tp_comm). Overlapped throughout (comm_s ≥ c (1 + s)): c (1 + s); else comm_s of it at the slow
    rate do comm_s/(1 + s) of the work and the rest runs alone: c + s/(1 + s) · comm_s. Exact in the
    fluid model for one segment; a pass of several segments, each its compute then its
    communication, taken as one, an approximation."""
    compute_s = pass_s - blocking_s
    return np.minimum(compute_s * (1 + slowdown), compute_s + slowdown / (1 + slowdown) * comm_s) + blocking_s


def _beside(
    pass_s: np.ndarray, comm_s: np.ndarray, slowdown: float, blocking_s: np.ndarray | float = 0.0
) -> np.ndarray:
    """Seconds until both end: a segment and communication started together (_slowed)."""
    return np.maximum(comm_s, _slowed(pass_s, comm_s, slowdown, blocking_s))


def _released_beside(
    forward_s: np.ndarray,
    backward_s: np.ndarray,
    blocking_f_s: np.ndarray,
    blocking_b_s: np.ndarray,
    send_s: np.ndarray,
    reduce_s: np.ndarray,
    buckets: np.ndarray,
    gpipe: np.ndarray,
    vp: int,
    slowdown: float,
) -> np.ndarray:
    """Per micro-batch, the seconds each stage (columns) loses to communication that its own passes
    release onto other streams (sim/contention.py), from each stage's forward and backward (rows ×
    stages, seconds per micro-batch of vp chunks, of which blocking_*_s blocking communication).
    Each runs beside the segment after the one that released it, from its start: _slowed (that
    segment's compute first). ZeRO-2's reductions (reduce_s per micro-batch in `buckets` alike
    buckets over the vp chunks, transformer.py _build_stage: each bucket's after its segment): a
    chunk backward's buckets but the last beside the bucket after them, the last beside the pass
    after the backward (1F1B: a forward; GPipe: the next backward's first bucket). Overlapped
    sends (send_s each, transformer.py _send): a chunk's forward sends its activations on unless it
    holds the last virtual stage, its backward the gradients back unless it holds the first, each
    beside the pass after it (a chunk pass of the shorter direction); a backward's send runs inside
    its last bucket's reduction where ZeRO-2 reduces (concurrent communication counts once)."""
    pp = forward_s.shape[1]
    chunk_f, chunk_b, blocking_f, blocking_b = (x / vp for x in (forward_s, backward_s, blocking_f_s, blocking_b_s))
    n = np.maximum(buckets / vp, 1.0)[:, None]  # buckets per chunk backward
    one = reduce_s[:, None] / (vp * n)  # one bucket's reduction
    segment, segment_blocking = chunk_b / n, blocking_b / n
    after = np.where(gpipe[:, None], segment, chunk_f)
    after_blocking = np.where(gpipe[:, None], segment_blocking, blocking_f)
    inner = (n - 1) * (_slowed(segment, one, slowdown, segment_blocking) - segment)
    reducing = vp * (inner + _slowed(after, one, slowdown, after_blocking) - after)
    shorter = chunk_f <= chunk_b
    beside_s = np.where(shorter, chunk_f, chunk_b)
    one_send = _slowed(beside_s, send_s[:, None], slowdown, np.where(shorter, blocking_f, blocking_b)) - beside_s
    sends_f = vp - (np.arange(pp) == pp - 1)[None, :]
    sends_b = np.where(reduce_s[:, None] > 0, 0.0, vp - (np.arange(pp) == 0)[None, :])
    return (sends_f + sends_b) * one_send + reducing


def _fsdp_step(
    f: dict[str, np.ndarray], g: dict[str, np.ndarray], m: ModelConfig, M: np.ndarray, slowdown: float
) -> np.ndarray:
    """ZeRO-3 with pipeline_parallel 1, in the graph's stream order. Each pass starts with its first
    unit's gather exposed; a unit runs beside the next unit's gather, and in backward beside the
    previous unit's reduce-scatter too (one DP stream); the embedding's reduce-scatter ends each
    micro-batch, ahead of the next forward's first gather. An MoE model's layers are priced as
    their mean (dense and MoE layers in proportion), an approximation. Each unit beside its
    communication, from a common start, takes _beside(compute, communication) (the gather was issued
    a unit earlier, behind the DP stream's work: started together, an approximation)."""

    moe_share = m.num_moe_layers / m.num_layers
    layers = m.num_layers

    def mean(dense: np.ndarray, moe: np.ndarray) -> np.ndarray:
        return dense if not moe_share else (1 - moe_share) * dense + moe_share * moe

    def beside(unit: str, comm_s: np.ndarray) -> np.ndarray:  # unit: a pass of f's ("l": the mean layer)
        pass_s, blocking_s = f[unit], f[f"c_{unit}"]
        if unit[0] == "l":
            pass_s, blocking_s = mean(pass_s, f[f"m{unit[1]}"]), mean(blocking_s, f[f"c_m{unit[1]}"])
        return _beside(pass_s, comm_s, slowdown, blocking_s)

    c_h = f["hf"]
    a_l, a_e, a_h = mean(g["ag_l"], g["ag_m"]), g["ag_e"], g["ag_h"]
    fwd = a_e + beside("ef", a_l) + (layers - 1) * beside("lf", a_l) + beside("lf", a_h) + c_h
    r_l, r_e, r_h = mean(g["rs_l"], g["rs_m"]), g["rs_e"], g["rs_h"]
    bwd = (
        a_h
        + beside("hb", a_l)
        + beside("lb", r_h + a_l)
        + np.maximum(layers - 2, 0) * beside("lb", r_l + a_l)
        + beside("lb", r_l + a_e)
        + beside("eb", r_l)
        + r_e
    )
    return M * (fwd + bwd)


def _blocking_pipeline(stage: np.ndarray, M: np.ndarray, send_s: np.ndarray, deepspeed: bool) -> np.ndarray:
    """Blocking pipeline exchanges (PlanConfig.blocking_p2p): the passes and the exchanges of `stage`
    (rows × stages, seconds per micro-batch) over M micro-batches, each exchange send_s long on both
    stages' compute streams. Stage k takes part in c_k exchanges per micro-batch and the step is
    max_k (M (S_k + c_k t) + e_k t) + Σ_s S_s − max_s S_s.
    DeepSpeed's pipe engine sends and receives apart: c = 2 at either end, 4 between, e = 2 (p − c).
    Exact on the graph (transformer.py _exchange) for uniform stages from 2 micro-batches on: (M + p − 1) S
    + 2 M t at p = 2, + (4M + 2p − 8) t beyond (tests/test_deepspeed_pipeline.py).
    Megatron-Core's 1F1B batches a send with the receive from the same neighbour: c = 1 at either end,
    2 between, e = 2p − 2c − 1. Exact on the graph (_megatron_exchange) for uniform stages and any M:
    (M + p − 1) S + (M + 1) t at p = 2, + (2M + 2p − 5) t beyond (tests/test_megatron_pipeline.py).
    Within 1% with the embedding and head on the end stages."""
    pp = stage.shape[1]
    transfers = np.full(pp, 4.0 if deepspeed else 2.0)
    transfers[[0, -1]] = 2.0 if deepspeed else 1.0
    fill = 2 * (pp - transfers) if deepspeed else 2 * (pp - transfers) - 1
    t = send_s[:, None]
    bottleneck = (M[:, None] * (stage + transfers * t) + fill * t).max(axis=1)
    return bottleneck + stage.sum(axis=1) - stage.max(axis=1)


def _blocking_interleaved(stage: np.ndarray, M: np.ndarray, vp: int, send_s: np.ndarray) -> np.ndarray:
    """Megatron-LM's interleaved schedule with blocking exchanges (plan.overlap_p2p_comm false, transformer.py
    _interleaved_exchange): at every exchange point each stage sends and receives with both neighbours in one batch
    that its compute stream waits for, so the stages move in lockstep. With S_s stage s's seconds per micro-batch
    (rows × stages: its v chunks' forwards and backwards) over M micro-batches, each exchange send_s long, the
    step is M max_s S_s + (Σ_s S_s − max_s S_s) / v + (v (M + p) + p − 3) send_s: the overlapped schedule's
    passes and one exchange after each of the M v + p − 1 chunk passes of the critical path, and p v − 2 more.
    Exact on the graph for uniform stages, every p, v and M it accepts (tests/test_megatron_pipeline.py)."""
    pp = stage.shape[1]
    slowest = stage.max(axis=1)
    return M * slowest + (stage.sum(axis=1) - slowest) / vp + (vp * (M + pp) + pp - 3) * send_s


def _host_synced(
    passes: tuple[np.ndarray, np.ndarray],
    comms: tuple[np.ndarray, np.ndarray],
    kernels: tuple[np.ndarray, np.ndarray],
    launch_s: float,
    gathered: np.ndarray | float = 0.0,
    interleaved: tuple[int, np.ndarray] | None = None,
) -> np.ndarray:
    """Megatron-Core's 1F1B synchronises the host after every exchange (transformer.py _host_sync): the pass
    after one starts with its host, no launch ahead, and one segment of n kernels, C seconds of compute (P with
    its blocking communication), ends max(h + C, n·h + C/n) after the exchange instead of C: δ = max(h, n·h
    + C/n − C) later. Where Megatron-LM's scatter-gather runs its all-gather of G seconds first (`gathered`, per
    row, in P; transformer.py _scatter_gather: no launch of its own), the pass ends max(G + C, h + C, n·h + C/n)
    after: δ = max(0, max(h, n·h + C/n − C) − G). Per micro-batch (rows × stages, from the forward and backward
    passes, their blocking communication and kernels): a stage's forward follows an exchange but on the first
    stage, its backward but on the last (whose forward's send and backward's receive are no-ops; schedules.py
    forward_backward_pipelining_without_interleaving). Approximations: the first stage's warm-up forwards, which
    follow their sends, are left out, whole passes are one segment (gradient buckets), the host never runs
    behind its stream, and nothing waits for the DP stream (Megatron-Core pipelines with ZeRO 0-1 only, whose
    reductions start after the last backward); tests/test_host_sync.py bounds the error.
    `interleaved` (v, M per row: Megatron-LM's blocking exchanges, plan.overlap_p2p_comm false): an exchange
    point, and its synchronisation, comes after each warm-up forward, each steady forward-backward pair and each
    cool-down backward (schedules.py; transformer.py _interleaved_exchange), so a chunk pass (1/v of the stage's
    passes, communication and kernels) is δ later where one precedes it: every forward, and the cool-down's
    backwards. The longest chain runs through the last stage's steady pairs, whose backward follows its forward
    with no exchange between: per micro-batch v forwards and min(v M, (v − 1) p) / M backwards, the last stage's
    cool-down, on every stage; tests/test_host_sync.py bounds the error."""
    (fwd, bwd), pp = passes, passes[0].shape[1]
    chunks = interleaved[0] if interleaved else 1

    def delay(pass_s: np.ndarray, comm_s: np.ndarray, n: np.ndarray) -> np.ndarray:
        pass_s, comm_s, n = pass_s / chunks, comm_s / chunks, n / chunks
        compute, many = pass_s - comm_s - gathered, np.maximum(n, 1.0)
        late = np.maximum(launch_s, n * launch_s + compute / many - compute)
        return np.where(n > 0, np.maximum(late - gathered, 0.0), 0.0)

    d_f, d_b = delay(fwd, comms[0], kernels[0]), delay(bwd, comms[1], kernels[1])
    if interleaved:
        micro = interleaved[1][:, None]
        return chunks * d_f + np.minimum(chunks * micro, (chunks - 1) * pp) / micro * d_b
    return d_f * (np.arange(pp) > 0) + d_b * (np.arange(pp) < pp - 1)


def _moe_waited(split: WaitSplit | None, launch_s: float) -> tuple[float, float]:
    """Seconds an MoE layer's pass takes longer on its stream, and seconds its host waits, for the host's wait
    (transformer.py moe_wait_split, _host_wait), MoE layers back to back: per layer the host launches X, the
    layer's rest and the next one's part up to its wait (n_x kernels, C_x seconds of compute and m_x of blocking
    communication), then Y, what it launches before the wait beyond what it waits for (n_y kernels, b seconds:
    Megatron-Core's permutation 1), then waits for X's end; Y runs next. From one wait's return to the next
    (_run_segment: a run's first kernel waits for one launch, its last for all) P = max((n_x + n_y)·h, max(h, b)
    + C_x + m_x, n_x·h + C_x/n_x + m_x), against C_x + m_x + b on a stream whose host runs ahead: the stream
    δ = P − C_x − m_x − b (h − b where GPU-bound, none once b ≥ h; the host's pace where host-bound), the host
    waits P − (n_x + n_y)·h. Approximations: dense layers between MoE layers (model.moe_layer_freq,
    moe_first_dense_layers) and the chunk's last MoE layer, whose run ends with the chunk, priced as if the next
    MoE layer followed; tests/test_moe_host_sync.py bounds the error on a grid."""
    if split is None:
        return 0.0, 0.0
    before, between, after = split
    n_x, c_x, m_x = after.kernels + before.kernels, after.compute_s + before.compute_s, after.comm_s + before.comm_s
    n_y, b = between.kernels, between.compute_s + between.comm_s
    h = launch_s
    period = max((n_x + n_y) * h, max(h, b) + c_x + m_x, n_x * h + c_x / max(n_x, 1) + m_x)
    return period - c_x - m_x - b, period - (n_x + n_y) * h


def _sum(params: list[tuple[float, float]]) -> tuple[float, float]:
    """(routed experts', the rest) of a list of units' parameters."""
    return sum(w[0] for w in params), sum(w[1] for w in params)


def _unit_key(base: PlanConfig) -> tuple[str, ...]:
    """The plan columns a unit's costs depend on: the layer's shapes, and the pipeline's chunks where the
    recomputed share depends on them (memory.full_recompute_share), the pipeline and ZeRO stage where the
    gradient accumulation does (grad_accumulation fsdp2 and megatron_fsdp: transformer_ops.grad_accumulation_cost)."""
    key: tuple[str, ...] = _LAYER_KEY
    if base.recompute_method == "block" or base.recompute_every > 1:
        key += _CHUNK_KEY
    if base.grad_accumulation == "fsdp2":
        key += tuple(k for k in _FSDP2_KEY if k not in key)
    if base.grad_accumulation == "megatron_fsdp":  # copied into Megatron-FSDP's bucket under ZeRO 2-3 only
        key += ("zero",)
    return key


def _distinct(t: PlanTable, columns: tuple[str, ...]) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The distinct values of `columns` over the table's rows, and each row's index into them. Each
    column is made dense, the columns are combined into one integer (mixed radix), and the 1-D unique
    of that (a sort of int64) replaces a row-wise unique (a lexsort of rows), several times slower."""
    code, radix = np.zeros(len(t), dtype=np.int64), 1
    for name in columns:
        values, dense = np.unique(t.cols[name], return_inverse=True)
        code, radix = code * values.shape[0] + dense.reshape(-1), radix * values.shape[0]
    if radix >= 2**62:  # the code would overflow: the row-wise unique
        code = np.stack([t.cols[name] for name in columns], axis=1)  # type: ignore[assignment]
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True, axis=0)
    keys = [tuple(int(t.cols[name][row]) for name in columns) for row in first.tolist()]
    return keys, inverse.reshape(-1)


def _bucket_tails(prefix: str, buckets: list[tuple[float, list[str]]]) -> dict[str, float]:
    """A chunk pass's DP buckets in release order, each (seconds on the DP stream, kind letters of
    its units): bucket j is released when its units' passes end and the stream runs the buckets in
    order, so the last ends max_j (Σ_{i ≥ j} c_i − the passes of the buckets after j) after the
    pass (_first_chunk_exposed). For j in the first, second, second-last and last buckets:
    `{prefix}_tail{n}` the seconds of buckets j.., `{prefix}_tail{n}_{x}` the units of kind x
    (l, m, e, h) in the buckets after j. Those four are every candidate when the buckets between
    are alike (the term is linear in j there): Megatron-Core's buckets of uniform layers, the
    embedding and head at the ends (a bucket closes at bucket_params, bucket_spans); interleaved
    dense and MoE layers make the middle uneven, an approximation."""
    n = len(buckets)
    out: dict[str, float] = {}
    for tail, j in enumerate((0, min(1, n - 1), max(n - 2, 0), n - 1)):
        out[f"{prefix}_tail{tail}"] = sum(seconds for seconds, _ in buckets[j:])
        after = Counter(k for _, kinds in buckets[j + 1 :] for k in kinds)
        out.update({f"{prefix}_tail{tail}_{x}": float(after[x]) for x in "lmeh"})
    return out


def _behind_either(
    stream_s: np.ndarray, host_s: np.ndarray, end_s: np.ndarray, stream_end_s: np.ndarray, host_end_s: np.ndarray
) -> np.ndarray:
    """What of the overlapped gradient reductions outlasts the passes that release them (each bucket
    when its units' backward ends), the passes ending at end_s. In max-plus terms a unit ends at the
    later of two chains: the stream's, its passes back to back (ending at stream_end_s), and the
    host's, each unit's last kernel waiting for all its launches (transformer.py _run_segment), the
    units n h apart (ending at host_end_s). `stream_s`, `host_s`: the reductions' excess over the
    passes on each chain alone (_first_chunk_exposed, _exposed); each counts less by how long
    before end_s its chain ends. Exact where the chains cross once (uniform units)."""
    return np.maximum(stream_s - (end_s - stream_end_s), host_s - (end_s - host_end_s))


def _last_buckets(prefix: str, buckets: list[list[str]]) -> dict[str, float]:
    """The units of each kind (l, m, e, h) in a backward's last gradient bucket, `{prefix}_end1_{x}`,
    and in the bucket before it, `{prefix}_end2_{x}` (none where the backward is one bucket)."""
    out: dict[str, float] = {}
    for i in (1, 2):
        kinds = Counter(buckets[-i] if len(buckets) >= i else [])
        out.update({f"{prefix}_end{i}_{x}": float(kinds[x]) for x in "lmeh"})
    return out


def _after_last_launch(
    g: dict[str, np.ndarray], f: dict[str, np.ndarray], rows: np.ndarray, slot: str, launch_s: float
) -> np.ndarray:
    """Seconds a backward in gradient buckets, a segment each (transformer.py _segments_of, _run_segment:
    a segment's last kernel waits for all its launches, its blocking communication follows it), runs
    after its host's last launch: the last bucket's last kernel and blocking communication; or, from
    the last launch of the bucket before (n h earlier, n the last bucket's kernels), that bucket's last
    kernel and blocking communication, then the last bucket's stream seconds S: less n h. The later of
    the two (exact for two buckets; the buckets before taken as ended by then); a bucket's last kernel
    is its mean one. `slot`: _group_costs's stage; `f`: the units' pass seconds, communication, kernels."""

    def units(i: int, of: str) -> np.ndarray:
        """Bucket i from the end: the sum over its units of f[f"{of}{unit}b"] ("": seconds)."""
        out = np.zeros(int(rows.sum()))
        for u in "lmeh":
            out = out + g[f"{slot}_grad_end{i}_{u}"][rows] * f[f"{of}{u}b"][rows]
        return out

    def tail(i: int) -> np.ndarray:  # its last kernel and blocking communication
        comm = units(i, "c_")
        return (units(i, "") - comm) / np.maximum(units(i, "k_"), 1.0) + comm

    before = tail(2) + units(1, "") - units(1, "k_") * launch_s
    return np.maximum(tail(1), np.where(units(2, "k_") > 0, before, 0.0))


def _first_chunk_exposed(
    g: dict[str, np.ndarray],
    f: dict[str, np.ndarray],
    label: str,
    pass_s: np.ndarray,
    hop_s: np.ndarray,
    chunks: np.ndarray,
    stages: np.ndarray,
) -> np.ndarray:
    """What of the DP `label` traffic ("grad" after the last backward, "gather" before the first
    forward) outlasts the passes under Megatron-Core's bucketing: each stage's first chunk in
    buckets (stage 0; one bucket on the others), each later chunk in one. On one stream in release
    order, per stage: max(max_j (Σ_{i ≥ j} c_i − the passes after bucket j), max_{k ≥ 1} (c0 + k (L
    − p W))), with c_i the first chunk's buckets (_bucket_tails; each bucket's own size and units:
    the embedding's bucket, larger than a layer's and released last, sets the gradients' tail), c0
    their sum, L a later chunk's seconds, W a chunk's pass, chunk k released k·p passes early; a
    stage s ends (starts) s hops of a pass and a send before (after) the first, so its excess counts
    less by s·hop. Interleaved gradients under Megatron-LM's align_grad_reduce (the graph's `aligned`):
    every bucket of the first chunk leaves at its end, c0 + max(0, (v − 1)(L − p W)). The worst of the
    first, second and last stages. `f`: the units' pass seconds."""
    direction = "b" if label == "grad" else "f"
    out = np.zeros_like(pass_s)
    for name in ("first", "second", "last"):
        c0, later = g[f"{name}_{label}0"], g[f"{name}_{label}_later"]
        x = later - stages * pass_s
        chunk_k = np.where(chunks > 1, c0 + np.where(x < 0, x, (chunks - 1) * x), 0.0)
        own = chunk_k
        for tail in range(4):
            key = f"{name}_{label}_tail{tail}"
            after_s = sum(g[f"{key}_{u}"] * f[f"{u}{direction}"] for u in "lmeh")
            own = np.maximum(own, g[key] - after_s)
        if label == "grad":  # interleaved under align_grad_reduce: the first chunk's buckets all leave at its end
            own = np.where(chunks > 1, c0 + np.where(x < 0, 0.0, (chunks - 1) * x), own)
        out = np.maximum(out, own - g[f"{name}_stage"] * hop_s)
    return out


def _exposed(
    total_s: np.ndarray, buckets: np.ndarray, pass_s: np.ndarray, chunks: np.ndarray, stages: np.ndarray
) -> np.ndarray:
    """Communication of total_s in `buckets` pieces, a share 1/chunks per model chunk, what outlasts
    the passes that release it. Each chunk's pieces are released uniformly over one pass of pass_s;
    interleaved, the chunks' last backwards (first forwards) lie `stages` passes apart, so chunk k
    from the end is released k·stages passes early. On one stream in release order, the last piece
    ends max(total / buckets, max_k ((k + 1)·total / chunks − k·stages·pass_s − pass_s·(b − 1)/b))
    after the last pass, b = buckets / chunks (with one chunk: total − pass_s·(buckets − 1)/buckets)."""
    per_chunk = buckets / chunks
    window = pass_s * (per_chunk - 1) / per_chunk
    out = total_s / buckets
    for k in range(int(np.max(chunks))):
        early = (k + 1) * total_s / chunks - k * stages * pass_s - window
        out = np.maximum(out, np.where(k < chunks, early, 0.0))
    return out
