"""Fused (flash) attention's efficiency, fitted to published kernel benchmarks (data/published/kernels/).

One kernel call runs `heads` independent (batch · head) problems of `flops / heads` FLOPs each. Its
efficiency, the fraction of the GPU's dense bf16 peak it reaches, is

    time = alpha + FLOPs / (peak · eff),
    eff = e_max · d / (d + d_half) · (causal_factor if causal else 1) · ramp(x),
    ramp(x) = 1 / (1 + exp(gamma · (log_half − ln x))),   x = FLOPs per (batch · head) of one call

- d / (d + d_half): the matmuls do 4·d FLOPs per query-key score (2·d for QKᵀ, 2·d for AV) while the
  softmax's exponential and rescaling cost the same per score whatever d: at a small head size
  that fixed work weighs more (FlashAttention-3 §3: H100 runs 989 TFLOP/s of matmul but 3.9 TFLOP/s
  of exponentials). On the FlashAttention-3 paper's H100 figures, head dim 64 reaches 0.69–0.88 of
  head dim 128's throughput at 16K tokens.
- causal_factor: a causal mask skips the blocks above the diagonal, but the diagonal blocks are
  masked element-wise and the work per query row is uneven (FA3 Fig. 5: 616 vs 648 TFLOP/s at 16K).
- ramp(x): short sequences give each (batch · head) few tiles, so the pipeline's prologue and
  epilogue and the softmax rescaling are not amortised.

The backward does 2.5× the forward FLOPs (5 matmuls instead of 2; FlashAttention-2 §3.2) at its own
efficiency (`direction` "bwd"). Fits and their errors: tools/fit_efficiency_curves.py, printed per
source by validation/kernel_tables.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: llm-foundry's attn_impl triton (Tri Dao's Triton FlashAttention, flash_attn_triton.py) against FlashAttention-2,
#: time per call by direction: the FlashAttention-2 paper (Dao 2023, §4.1, A100 80GB, sequence 512-16K, head
#: dim 64 and 128, causal or not): FlashAttention-2 "around 1.3-1.5× faster than FlashAttention in Triton in the
#: forward pass and around 2× faster in the backward pass"; the middle of each range. No H100 comparison is
#: published: the same ratios are taken there (the kernel uses no Hopper instruction, nor does FlashAttention-2).
TRITON_VS_FA2 = {"fwd": 1.4, "bwd": 2.0}


@dataclass(frozen=True)
class AttentionShape:
    """What a fused attention kernel's speed depends on, besides its FLOPs."""

    heads: float  # (batch · query head) problems of one call: micro_batch · heads / tp
    head_dim: float  # d: the mean of the query-key and value head sizes (4·d FLOPs per score)
    causal: bool  # a causal or sliding-window mask (blocks skipped, the diagonal masked)
    calls: int = 1  # kernel calls of equal FLOPs the FLOPs are split into (context parallelism's ring steps)
    backward: bool = False
    kernel: str = "cudnn"  # which implementation runs (PlanConfig.attention_kernel)


def efficiency(fit: dict, flops_per_head: np.ndarray | float, head_dim: float, causal: bool) -> np.ndarray:
    """Fraction of the dense bf16 peak one call reaches (module docstring); `fit` one direction's
    parameters (e_max, d_half, causal_factor, log_half, gamma)."""
    x = np.maximum(np.asarray(flops_per_head, dtype=np.float64), 1.0)
    ramp = 1.0 / (1.0 + np.exp(fit["gamma"] * (fit["log_half"] - np.log(x))))
    mask = fit["causal_factor"] if causal else 1.0
    return fit["e_max"] * head_dim / (head_dim + fit["d_half"]) * mask * ramp


def time_s(
    fit: dict,
    flops: np.ndarray | float,
    problems: float,
    head_dim: float,
    causal: bool,
    peak_flops: float,
    calls: int = 1,
) -> np.ndarray:
    """Seconds of one direction's `calls` kernel calls: each the fixed kernel latency `alpha_s` (pinned
    to the GEMM's: the benchmarks' smallest call takes ~0.1 ms and cannot identify it), together
    FLOPs / (peak · eff), the FLOPs split into `problems` (batch · head) problems × calls."""
    f = np.asarray(flops, dtype=np.float64)
    eff = efficiency(fit, f / problems, head_dim, causal)
    return np.where(f > 0, calls * fit["alpha_s"] + f / (peak_flops * eff), 0.0)


def fitted_kernel(tables: dict, gpu_name: str, kernel: str) -> dict | None:
    """The fit of `kernel` (an entry's `kernel`; an entry without one, a calibration's own, serves any)
    on the GPU whose name starts with one of the entry's `gpu_name_prefixes` (H100 and H200 share
    Hopper's SMs and clocks: their attention runs at the same FLOP/s), else None."""
    for entry in tables.values():
        if (
            isinstance(entry, dict)
            and entry.get("kernel", kernel) == kernel
            and any(gpu_name.startswith(p) for p in entry.get("gpu_name_prefixes", ()))
        ):
            return entry
    return None
