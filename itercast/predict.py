"""`predict(job)`: time per iteration, its breakdown and critical path, memory and MFU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from itercast.config.job import Job
from itercast.costs.analytic import AnalyticCostModel
from itercast.memory import MemoryEstimate, estimate_memory
from itercast.sim.analysis import Breakdown, breakdown, critical_path
from itercast.sim.engine import SimResult, simulate
from itercast.workloads.transformer import TransformerStepBuilder


@dataclass(frozen=True)
class Prediction:
    """One predicted training step. Times in seconds, memory in bytes, FLOPs as counts."""

    job: Job
    step_time_s: float
    breakdown: Breakdown
    memory: MemoryEstimate
    model_flops_per_step: float
    family_time_s: dict[str, float]
    critical_path: list[dict[str, Any]]
    sim: SimResult

    @property
    def model_tflops_per_gpu(self) -> float:
        return self.model_flops_per_step / self.step_time_s / self.job.system.num_gpus / 1e12

    @property
    def hardware_flops_per_step(self) -> float:
        """Model FLOPs plus what recomputation runs again: with full recompute one more forward of
        every layer (Narayanan et al. SC'21 count 4 forward passes), with selective recompute of
        unfused attention its score and value matmuls (fused attention recomputes inside its own
        backward, counted in neither figure)."""
        job = self.job
        m, p = job.model, job.plan
        tokens = p.gbs * m.seq_length
        if p.recompute == "full":
            return self.model_flops_per_step + m.layers_forward_flops_per_token() * tokens
        if p.recompute == "selective" and not p.flash_attention:
            return self.model_flops_per_step + m.num_layers * 4 * m.seq_length * m.hidden_size * tokens
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
    def tokens_per_s(self) -> float:
        return self.job.plan.gbs * self.job.model.seq_length / self.step_time_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_time_s": self.step_time_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "hardware_flops_per_step": self.hardware_flops_per_step,
            "tokens_per_s": self.tokens_per_s,
            "memory_per_gpu_bytes": self.memory.total_bytes,
            "oom": self.memory.oom,
            "memory": self.memory.as_dict(),
            "breakdown": self.breakdown.as_dict(),
            "family_time_s": self.family_time_s,
            "critical_path": self.critical_path,
            "num_microbatches": self.job.num_microbatches,
            "job": self.job.to_dict(),
        }


def predict(job: Job, calibration: dict[str, Any] | None = None) -> Prediction:
    """Build the step graph of `job`, simulate it and summarise. `calibration`: curves from
    profile.calibrate.load_calibration (else the built-in ones)."""
    builder = TransformerStepBuilder(job, AnalyticCostModel(job.system, job.plan.dtype, calibration))
    sim = simulate(builder.build())
    bd = breakdown(sim)
    model_flops = job.model.flops_per_token() * job.plan.gbs * job.model.seq_length
    return Prediction(
        job,
        sim.step_time_s,
        bd,
        estimate_memory(job),
        model_flops,
        dict(sorted(builder.family_time_s[bd.rank].items())),
        summarise_path(sim),
        sim,
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
