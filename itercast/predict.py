"""`predict(job)`: time per iteration, its breakdown and critical path, memory and MFU; a DLRM's step
under its sharding (`predict_dlrm`). Both give a Forecast: what every command shows of any workload."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from itercast.config.job import Job
from itercast.config.model import ModelConfig
from itercast.costs.analytic import AnalyticCostModel
from itercast.costs.host_overheads import host_calibrated
from itercast.errors import ConfigError
from itercast.memory import MemoryEstimate, estimate_memory, full_recompute_share
from itercast.sim.analysis import Breakdown, breakdown, critical_path
from itercast.sim.contention import simulate_with_contention
from itercast.sim.engine import SimResult
from itercast.workloads.dlrm import (
    DLRMJob,
    DLRMStep,
    IndexSample,
    Shard,
    dlrm_step,
    memory_parts_per_rank,
    plan_sharding,
)
from itercast.workloads.transformer import TransformerStepBuilder


def _moe_mlp_flops_per_token(m: ModelConfig) -> float:
    """An MoE layer's router, shared and routed experts' matmul FLOPs per token (its forward less attention)."""
    projections = 2 * sum(m.attention_params())
    return m.layer_forward_flops_per_token(moe=True) - projections - m.attention_score_flops_per_token()


@dataclass(frozen=True)
class Forecast:
    """One predicted training step of any workload. Times in seconds, memory in bytes; `breakdown` and
    `family_time_s` are those of the rank that finishes last, `memory` that of the most loaded GPU."""

    step_time_s: float
    breakdown: Breakdown
    memory: MemoryEstimate
    family_time_s: dict[str, float]
    critical_path: list[dict[str, Any]]
    sim: SimResult

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_time_s": self.step_time_s,
            "memory_per_gpu_bytes": self.memory.total_bytes,
            "oom": self.memory.oom,
            "memory": self.memory.as_dict(),
            "breakdown": self.breakdown.as_dict(),
            "family_time_s": self.family_time_s,
            "critical_path": self.critical_path,
        }


@dataclass(frozen=True)
class Prediction(Forecast):
    """A transformer's step: the Forecast, its job and the model FLOPs of a step."""

    job: Job
    model_flops_per_step: float
    #: calibrated curves priced beyond the sizes they were fitted on (AnalyticCostModel.extrapolations)
    extrapolated: tuple[str, ...] = ()

    @property
    def model_tflops_per_gpu(self) -> float:
        return self.model_flops_per_step / self.step_time_s / self.job.system.num_gpus / 1e12

    @property
    def hardware_flops_per_step(self) -> float:
        """Model FLOPs plus what recomputation runs again (FLOPs per step).

        full: one more forward of the recomputed share of the layers (memory.full_recompute_share: all under
        Megatron's uniform method, Narayanan et al. SC'21 count 4 forward passes; the first recompute_num_layers of
        each chunk under its block method; every n-th layer under torchtitan's recompute_every). selective,
        Megatron-Core's modules: core_attn the score and value matmuls of every layer again, unfused or in one fused
        kernel (Megatron-Core checkpoints the fused attention call too, transformer/attention.py
        `_checkpointed_attention_forward`; what the step runs: transformer_ops.layer_backward), mlp a dense layer's
        MLP matmuls, 2·(up + 1)·h·f per token, shared_experts an MoE layer's shared experts' alike, mla_up_proj
        every layer's query and key-value up projections, moe an MoE layer's router and experts (layernorm and
        moe_act run no matmul). selective, per op (torchtitan, transformer_ops._op_recompute): per token and layer
        the keys' share of QKV and the output projection, 2·h·d·(g + a), and one h×f MLP matmul, 2·h·f; an MoE
        layer's router and shared and routed experts whole (grouped GEMMs are not saved); unfused attention's scores
        again (its policy saves fused attention's outputs)."""
        job = self.job
        m, p = job.model, job.plan
        tokens = p.gbs * m.seq_length
        if p.recompute == "full":
            share = float(full_recompute_share(m, p, p.pipeline_parallel, p.virtual_pipeline))
            return self.model_flops_per_step + share * m.layers_forward_flops_per_token() * tokens
        if p.recompute == "selective" and p.selective_recompute == "op":
            h, d = m.hidden_size, m.head_dim
            attention = m.num_layers * 2.0 * h * d * (m.kv_heads + m.num_attention_heads)
            if not p.flash_attention:
                attention += m.layers_attention_score_flops_per_token()
            moe = m.num_moe_layers
            dense_mlp = 2 * h * m.ffn
            extra = attention + (m.num_layers - moe) * dense_mlp + moe * _moe_mlp_flops_per_token(m)
            return self.model_flops_per_step + extra * tokens
        if p.recompute == "selective":
            attention = m.layers_attention_score_flops_per_token() if "core_attn" in p.recompute_modules else 0.0
            up, h, a = 2 if m.gated_mlp else 1, m.hidden_size, m.num_attention_heads
            modules = {
                "mlp": (m.num_layers - m.num_moe_layers) * 2.0 * (up + 1) * h * m.ffn,
                "shared_experts": m.num_moe_layers * 2.0 * (up + 1) * h * m.moe_shared_ffn_hidden_size,
                # the up projections: the split attention weights less the output projection's
                "mla_up_proj": m.num_layers * 2.0 * (m.attention_params()[0] - a * m.value_head_dim * h),
                "moe": m.num_moe_layers * _moe_mlp_flops_per_token(m),
            }
            again = sum(flops for name, flops in modules.items() if name in p.recompute_modules)
            return self.model_flops_per_step + (attention + again) * tokens
        return self.model_flops_per_step

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation against the dense peak of the plan's dtype (PaLM, App. B)."""
        dtype = self.job.plan.dtype
        peaks = [
            g.peak_flops.get(dtype) or g.peak_flops.get("tf32") or g.peak_flops["fp32"] for g in self.job.stage_gpus()
        ]
        return self.model_tflops_per_gpu * 1e12 / (sum(peaks) / len(peaks))  # a mixed cluster: its mean peak

    @property
    def mfu_causal(self) -> float:
        """MFU with a causal model's attention scores counted as the work they are: half of what the model-FLOPs
        convention counts (ModelConfig.attention_score_flops_per_token: every key per query, as Megatron-LM's
        num_floating_point_operations and torchtitan's get_num_flop_per_token count; FlashAttention's causal
        benchmarks count half). Forward and backward: 3 × the forward's half. The same as `mfu` without causal
        attention (bert)."""
        m = self.job.model
        if not m.causal:
            return self.mfu
        half = 1.5 * m.layers_attention_score_flops_per_token() * self.job.plan.gbs * m.seq_length
        return self.mfu * (1 - half / self.model_flops_per_step)

    @property
    def tokens_per_s(self) -> float:
        return self.job.plan.gbs * self.job.model.seq_length / self.step_time_s

    @property
    def stage_compute_s(self) -> list[float]:
        """Each pipeline stage's compute seconds in the step (its compute stream's kernels, sim.analysis.breakdown;
        the step graph's rank r is stage r): stages that differ wait for the slowest, and the breakdown of the last
        to finish counts those waits as bubble beside the pipeline's fill and drain."""
        return [breakdown(self.sim, rank).compute_s for rank in range(self.job.plan.pipeline_parallel)]

    def to_dict(self) -> dict[str, Any]:
        return {
            **super().to_dict(),
            "stage_compute_s": self.stage_compute_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "mfu_causal": self.mfu_causal,
            "hardware_flops_per_step": self.hardware_flops_per_step,
            "tokens_per_s": self.tokens_per_s,
            "num_microbatches": self.job.num_microbatches,
            "extrapolated": list(self.extrapolated),
            "job": self.job.to_dict(),
        }


@dataclass(frozen=True)
class DLRMPrediction(Forecast):
    """A DLRM's step under one sharding: the Forecast (breakdown and memory of the busiest rank), the
    job, the sharding and where it came from (the plan's, or the planner's fastest of `evaluated`)."""

    job: DLRMJob
    sharding: dict[str, Shard]
    sharding_from: str
    evaluated: int
    #: calibrated curves priced beyond the sizes they were fitted on (AnalyticCostModel.extrapolations)
    extrapolated: tuple[str, ...] = ()

    @property
    def samples_per_s(self) -> float:
        return self.job.plan.batch_per_rank * self.job.system.num_gpus / self.step_time_s

    def to_dict(self) -> dict[str, Any]:
        tables = [{"name": n, "strategy": s.strategy, "ranks": list(s.ranks)} for n, s in self.sharding.items()]
        return {
            **super().to_dict(),
            "samples_per_s": self.samples_per_s,
            "sharding_from": self.sharding_from,
            "tables": tables,
            "extrapolated": list(self.extrapolated),
            "job": self.job.to_dict(),
        }


def simulate_transformer_step(
    job: Job, calibration: dict[str, Any] | None = None
) -> tuple[TransformerStepBuilder, SimResult]:
    """The step graph of `job` priced by `calibration`'s curves (profile.calibrate.load_calibration; None:
    the built-in ones), and its simulation with each compute task slowed by the communication beside it
    (sim/contention.py: the result's graph carries the stretched durations). What `predict` summarises and
    `variability` samples. A calibration with host overheads sets the host's cost per kernel
    (costs/host_overheads.py host_calibrated)."""
    job = Job(job.model, job.plan, host_calibrated(job.system, calibration))
    builder = TransformerStepBuilder(job, AnalyticCostModel(job.system, job.plan.dtype, calibration))
    slowdown = np.array([gpu.overlap_compute_slowdown for gpu in job.stage_gpus()])  # rank r = stage r
    return builder, simulate_with_contention(builder.build(), slowdown)


def predict(job: Job, calibration: dict[str, Any] | None = None) -> Prediction:
    """Build the step graph of `job`, simulate it (compute slowed by the communication beside it:
    sim/contention.py) and summarise (simulate_transformer_step). family_time_s gains
    'overlap_contention': that stretch, in seconds."""
    builder, sim = simulate_transformer_step(job, calibration)
    if not np.isfinite(sim.step_time_s):  # never printed or ranked: a curve that priced a task at inf or NaN
        which = "the calibration's curves" if calibration is not None else "the built-in curves"
        raise ConfigError(f"the step prices at {sim.step_time_s} s: a task of it is infinite or undefined on {which}")
    graph = builder.graph
    assert graph is not None  # built by simulate_transformer_step
    bd = breakdown(sim)
    families = dict(builder.family_time_s[bd.rank])
    on_rank = graph.resource_rank[graph.resource] == bd.rank
    stretch_s = float((sim.graph.duration_s[on_rank] - graph.duration_s[on_rank]).sum())
    if stretch_s > 0:
        # compute slowed by communication beside it, across passes (besides that within them: pass_cost)
        families["overlap_contention"] = families.get("overlap_contention", 0.0) + stretch_s
    model_flops = job.model.flops_per_token() * job.plan.gbs * job.model.seq_length
    return Prediction(
        sim.step_time_s,
        bd,
        estimate_memory(job),
        dict(sorted(families.items())),
        summarise_path(sim),
        sim,
        job,
        model_flops,
        tuple(dict.fromkeys(line for costs in builder.stage_costs for line in costs.extrapolations())),
    )


def predict_dlrm(
    job: DLRMJob, calibration: dict[str, Any] | None = None, index_counts: dict[str, IndexSample] | None = None
) -> DLRMPrediction:
    """One DLRM step under the plan's sharding, else under the fastest the planner finds
    (workloads/dlrm.plan_sharding); `index_counts`: samples of real indices per table."""
    given = job.shards()
    if given is not None:
        step, sharding, source, evaluated = (
            dlrm_step(job.model, job.system, given, job.plan.batch_per_rank, calibration, index_counts),
            given,
            "plan",
            1,
        )
    else:
        found = plan_sharding(
            job.model, job.system, job.plan.batch_per_rank, calibration=calibration, index_counts=index_counts
        )
        (sharding, step), source, evaluated = found.plans[0], f"planner ({found.method})", found.evaluated
    return _dlrm_forecast(job, step, sharding, source, evaluated, index_counts)


def _dlrm_forecast(
    job: DLRMJob,
    step: DLRMStep,
    sharding: dict[str, Shard],
    source: str,
    evaluated: int,
    index_counts: dict[str, IndexSample] | None = None,
) -> DLRMPrediction:
    bd = breakdown(step.sim)
    parts = memory_parts_per_rank(job.model, sharding, job.system.num_gpus, job.plan.batch_per_rank, index_counts)
    rank = int(np.argmax([sum(p.values()) for p in parts]))
    gpu = job.system.gpu
    mem = MemoryEstimate(
        parts[rank]["weights"],
        parts[rank]["gradients"],
        parts[rank]["optimizer"],
        parts[rank]["activations"],
        step.reserved_bytes,
        rank,
        gpu.hbm_bytes,
    )
    g = step.sim.graph
    on_rank = g.resource_rank[g.resource] == bd.rank
    family = np.bincount(g.family[on_rank], weights=g.duration_s[on_rank], minlength=len(g.families))
    seconds = {g.families[f]: float(t) for f, t in enumerate(family) if t > 0}
    return DLRMPrediction(
        step.step_time_s,
        bd,
        mem,
        dict(sorted(seconds.items())),
        summarise_path(step.sim),
        step.sim,
        job,
        sharding,
        source,
        evaluated,
        step.extrapolated,
    )


def summarise_path(sim: SimResult) -> list[dict[str, Any]]:
    """The critical path as runs of consecutive tasks of one family on one rank."""
    g = sim.graph
    runs: list[dict[str, Any]] = []
    for t in critical_path(sim):
        rank = int(g.resource_rank[g.resource[t]])
        family = g.families[g.family[t]]
        if runs and runs[-1]["rank"] == rank and runs[-1]["family"] == family:
            runs[-1]["end_s"] = float(sim.end_s[t])
            runs[-1]["tasks"] += 1
        else:
            runs.append(
                {
                    "rank": rank,
                    "family": family,
                    "start_s": float(sim.start_s[t]),
                    "end_s": float(sim.end_s[t]),
                    "tasks": 1,
                }
            )
    return runs
