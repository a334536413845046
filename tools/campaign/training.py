"""Whole training steps of a small Llama-style transformer on one GPU: profiler traces with measured
what-ifs (d), peak memory by configuration (e) and 1,000 consecutive step times (f).

The model is what itercast calls family `llama` (RMSNorm, rotary positions, SwiGLU MLP, grouped-query
attention, no biases, untied output layer), so that `itercast predict` prices the same job
(validation/gpu_campaign_check.py one_gpu_job builds it from each output row). Training runs as
PyTorch users run it: fp32 parameters, bf16 autocast, fused AdamW, fp32 cross-entropy.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from campaign.common import Budget, Context, attempt, timing


@dataclass(frozen=True)
class LlamaShape:
    """A Llama-style model and one micro-batch of it (itercast's model fields, and the batch)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    batch: int


@dataclass(frozen=True)
class StepConfig:
    """How one step runs: dtype (bf16: autocast over fp32 parameters; fp32), full recompute of every
    layer, and the attention back end (flash: SDPA's choice; math: unfused, scores kept)."""

    dtype: str = "bf16"
    recompute: bool = False
    attention: str = "flash"


#: ~400M parameters, 8K tokens a step: ~50 ms on an H100, hundreds of kernels, GPU-bound
BASE = LlamaShape(layers=6, hidden=2048, heads=16, kv_heads=4, ffn=5632, vocab=32000, seq=2048, batch=4)
DRY = LlamaShape(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, seq=32, batch=2)


class Layer(nn.Module):
    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        d = s.hidden // s.heads
        self.heads, self.kv_heads, self.head_dim = s.heads, s.kv_heads, d
        self.norm1, self.norm2 = nn.RMSNorm(s.hidden), nn.RMSNorm(s.hidden)
        self.qkv = nn.Linear(s.hidden, (s.heads + 2 * s.kv_heads) * d, bias=False)
        self.proj = nn.Linear(s.heads * d, s.hidden, bias=False)
        self.gate_up = nn.Linear(s.hidden, 2 * s.ffn, bias=False)
        self.down = nn.Linear(s.ffn, s.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        d, h, g = self.head_dim, self.heads, self.kv_heads
        q, k, v = self.qkv(self.norm1(x)).view(b, t, h + 2 * g, d).transpose(1, 2).split((h, g, g), 1)
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, h * d))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, -1)
        return x + self.down(F.silu(gate) * up)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021), the rotate-half form of Llama's reference code."""
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat((-x2, x1), -1) * sin


class Llama(nn.Module):
    def __init__(self, s: LlamaShape, recompute: bool = False) -> None:
        super().__init__()
        self.recompute = recompute
        self.embed = nn.Embedding(s.vocab, s.hidden)
        self.layers = nn.ModuleList(Layer(s) for _ in range(s.layers))
        self.norm = nn.RMSNorm(s.hidden)
        self.head = nn.Linear(s.hidden, s.vocab, bias=False)
        d = s.hidden // s.heads
        freq = 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d)
        angle = torch.outer(torch.arange(s.seq).float(), freq).repeat(1, 2)
        self.register_buffer("cos", angle.cos(), persistent=False)
        self.register_buffer("sin", angle.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        for layer in self.layers:
            x = checkpoint(layer, x, cos, sin, use_reentrant=False) if self.recompute else layer(x, cos, sin)
        return self.head(self.norm(x))


class Trainer:
    """A model, its optimizer and one fixed batch; `step()` is one training iteration."""

    def __init__(self, device: str, shape: LlamaShape, cfg: StepConfig) -> None:
        torch.manual_seed(0)
        self.device, self.shape, self.cfg = torch.device(device), shape, cfg
        self.model = Llama(shape, cfg.recompute).to(self.device)
        fused = self.device.type == "cuda"
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=fused)
        self.tokens = torch.randint(0, shape.vocab, (shape.batch, shape.seq), device=self.device)
        self.labels = torch.randint(0, shape.vocab, (shape.batch, shape.seq), device=self.device)

    def forward(self) -> torch.Tensor:
        """The loss of the batch (the backward's graph and saved tensors built)."""
        math = self.cfg.attention == "math"
        with (
            sdpa_kernel(SDPBackend.MATH) if math else nullcontext(),
            torch.autocast(self.device.type, torch.bfloat16, enabled=self.cfg.dtype == "bf16"),
        ):
            logits = self.model(self.tokens)
        return F.cross_entropy(logits.float().flatten(0, 1), self.labels.flatten())

    def step(self) -> None:
        self.forward().backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def step_times_ms(ctx: Context, step: Callable[[], None], steps: int) -> list[float]:
    """Milliseconds of `steps` consecutive steps, nothing synchronised between them: on a GPU the
    differences of events recorded as each step is reached on the stream (and as the last ends), so a
    host that falls behind shows as a longer step; on a CPU the host clock."""
    if not ctx.cuda:
        return ctx.clock.times_ms(step, steps, flush=False)
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    ctx.clock.sync()
    for i in range(steps):
        marks[i].record()
        step()
    marks[-1].record()
    ctx.clock.sync()
    return [a.elapsed_time(b) for a, b in itertools.pairwise(marks)]


WHATIFS: dict[str, Callable[[LlamaShape], LlamaShape]] = {
    "base": lambda s: s,
    "half_batch": lambda s: replace(s, batch=max(1, s.batch // 2)),
    "double_batch": lambda s: replace(s, batch=2 * s.batch),
    # the same head size, 1.5× the heads, query groups and width (BASE: 3072 wide, 24 heads, 6 groups, ffn 8192)
    "wide": lambda s: replace(
        s, hidden=s.hidden * 3 // 2, heads=s.heads * 3 // 2, kv_heads=s.kv_heads * 3 // 2, ffn=s.ffn * 16 // 11
    ),
}
SHAPE_FIELDS = list(asdict(BASE))


def run_traces(ctx: Context, budget: Budget) -> str:
    """(d) the base step and its what-ifs: 30 timed steps each, then a Kineto trace of 3 steps under a
    profiler schedule (ProfilerStep#N), no execution-trace observer."""
    base = DRY if ctx.dry else BASE
    timed_steps, warmup = (4, 2) if ctx.dry else (30, 5)
    fields = ["config", *SHAPE_FIELDS, "params", "status", "median_ms", "p10_ms", "p90_ms", "reps", "trace"]
    rows = ctx.rows(
        "training_steps.csv",
        fields,
        [
            "one GPU, Llama-style model (tools/campaign/training.py), fp32 parameters, bf16 autocast, fused AdamW",
            f"{warmup} untimed steps, then {timed_steps} consecutive steps timed by CUDA events (nothing synchronised "
            "between steps), then the trace: profiler schedule wait=1, warmup=2, active=3",
        ],
        "measured step times of the traced job and of its what-ifs (half and double batch, a wider model)",
    )
    for name, what in WHATIFS.items():
        if not budget.take():
            continue
        shape = what(base)
        trace = f"traces/{name}.kineto.json.gz"

        def once(shape: LlamaShape = shape, trace: str = trace) -> dict[str, Any]:
            t = Trainer(ctx.device, shape, StepConfig())
            for _ in range(warmup):
                t.step()
            got = timing(step_times_ms(ctx, t.step, timed_steps))
            _profile(ctx, t.step, trace)
            params = sum(p.numel() for p in t.model.parameters())
            return {**got, "params": params, "trace": trace}

        rows.add({"config": name, **asdict(shape), **attempt(once)})
        ctx.reset_peak()
    ctx.files["traces/"] = "Kineto traces (gzip JSON) of 3 profiled steps per configuration of training_steps.csv"
    rows.close()
    return f"{rows.count} configurations, {budget.skipped} skipped for time"


def _profile(ctx: Context, step: Callable[[], None], trace: str) -> None:
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.cuda else [])
    path = ctx.out / trace
    path.parent.mkdir(parents=True, exist_ok=True)
    plan = schedule(wait=1, warmup=2, active=3, repeat=1)
    # a path ending in .gz is written gzip-compressed by the profiler itself
    save: Callable[[Any], None] = lambda p: p.export_chrome_trace(str(path))  # noqa: E731
    with profile(activities=activities, schedule=plan, record_shapes=True, on_trace_ready=save) as prof:
        for _ in range(6):
            step()
            prof.step()
    ctx.clock.sync()


#: (name, shape change, step config): ≥ 6 configurations whose memory itercast predicts
MEMORY_CASES: list[tuple[str, Callable[[LlamaShape], LlamaShape], StepConfig]] = [
    ("base", lambda s: s, StepConfig()),
    ("recompute_full", lambda s: s, StepConfig(recompute=True)),
    ("double_batch", lambda s: replace(s, batch=2 * s.batch), StepConfig()),
    ("double_seq", lambda s: replace(s, seq=2 * s.seq), StepConfig()),
    ("fp32", lambda s: s, StepConfig(dtype="fp32")),
    ("math_attention", lambda s: s, StepConfig(attention="math")),
    ("wide", WHATIFS["wide"], StepConfig()),
    ("vocab_128k", lambda s: replace(s, vocab=s.vocab * 4), StepConfig()),
    ("recompute_double_batch", lambda s: replace(s, batch=2 * s.batch), StepConfig(recompute=True)),
]


def run_memory(ctx: Context, budget: Budget) -> str:
    """(e) the allocator's peaks over a training step, and what makes them up, per configuration."""
    base = DRY if ctx.dry else BASE
    fields = ["config", *SHAPE_FIELDS, "dtype", "recompute", "attention", "status", "params", "param_bytes"]
    fields += ["grad_bytes", "optimizer_bytes", "activation_bytes", "max_allocated_bytes", "max_reserved_bytes"]
    fields += ["device_used_bytes", "context_bytes"]
    rows = ctx.rows(
        "memory.csv",
        fields,
        [
            "per configuration: one step to create the optimizer state, then the peaks of the second step",
            "param/grad/optimizer bytes: the tensors' sizes; activation_bytes: allocated after the forward "
            "(loss included) minus before it; max_*: torch.cuda.max_memory_allocated / max_memory_reserved "
            "over the second step; device_used_bytes: total − free (cudaMemGetInfo) after it, the CUDA "
            "context and the allocator's cache included; context_bytes: that minus max_reserved's current "
            "reserve at the start of the campaign (the context and library workspaces alone)",
        ],
        "peak memory of training-step configurations and its parts (the itercast check sits in validation/)",
    )
    for name, change, cfg in MEMORY_CASES:
        if not budget.take():
            continue
        shape = change(base)
        row = {"config": name, **asdict(shape), "dtype": cfg.dtype, "recompute": cfg.recompute}
        rows.add({**row, "attention": cfg.attention, **attempt(partial_memory(ctx, shape, cfg))})
        ctx.reset_peak()
    rows.close()
    return f"{rows.count} configurations, {budget.skipped} skipped for time"


def partial_memory(ctx: Context, shape: LlamaShape, cfg: StepConfig) -> Callable[[], dict[str, Any]]:
    def measure() -> dict[str, Any]:
        ctx.reset_peak()
        t = Trainer(ctx.device, shape, cfg)
        t.step()
        ctx.clock.sync()
        ctx.reset_peak()
        alloc = torch.cuda.memory_allocated if ctx.cuda else (lambda *_: 0)
        before = alloc(ctx.clock.device)
        loss = t.forward()
        activations = alloc(ctx.clock.device) - before
        loss.backward()
        grads = sum(p.grad.numel() * p.grad.element_size() for p in t.model.parameters() if p.grad is not None)
        t.opt.step()
        t.opt.zero_grad(set_to_none=True)
        ctx.clock.sync()
        params = list(t.model.parameters())
        state = [v for s in t.opt.state.values() for v in s.values() if torch.is_tensor(v)]
        out = {
            "params": sum(p.numel() for p in params),
            "param_bytes": sum(p.numel() * p.element_size() for p in params),
            "grad_bytes": grads,
            "optimizer_bytes": sum(v.numel() * v.element_size() for v in state),
            "activation_bytes": activations if ctx.cuda else "",
        }
        if ctx.cuda:
            free, total = torch.cuda.mem_get_info(ctx.clock.device)
            out |= {
                "max_allocated_bytes": torch.cuda.max_memory_allocated(ctx.clock.device),
                "max_reserved_bytes": torch.cuda.max_memory_reserved(ctx.clock.device),
                "device_used_bytes": total - free,
                "context_bytes": ctx.context_bytes,
            }
        return out

    return measure


def run_step_distribution(ctx: Context, budget: Budget) -> str:
    """(f) 1,000 consecutive steps of the traced base job (d's `base`), one row each, and the clock
    sampled beside them."""
    if not budget.take():
        return "skipped: no time left"
    steps = 20 if ctx.dry else 1000
    shape = DRY if ctx.dry else BASE
    t = Trainer(ctx.device, shape, StepConfig())
    for _ in range(3 if ctx.dry else 10):
        t.step()
    t0 = time.time()
    times = step_times_ms(ctx, t.step, steps)
    t1 = time.time()
    rows = ctx.rows(
        "step_times.csv",
        ["step", "step_ms"],
        [
            f"{steps} consecutive training steps of training_steps.csv's base configuration after "
            f"{3 if ctx.dry else 10} untimed ones; CUDA events as each step is reached, nothing synchronised between"
        ],
        f"{steps} consecutive step times of the traced base job (step-time distribution)",
    )
    for i, ms in enumerate(times):
        rows.add({"step": i, "step_ms": round(ms, 5)})
    rows.close()
    clocks = ctx.rows(
        "step_times_clocks.csv",
        ["t_s", "sm_mhz", "power_w", "temp_c", "clock_reasons"],
        [f"NVML samples every {ctx.sampler.interval_s:g} s during step_times.csv's run (host seconds from its start)"],
        "the SM clock, power and temperature sampled during the 1,000 steps",
    )
    for ts, mhz, watts, temp, reasons in ctx.sampler.window(t0, t1):
        clocks.add(
            {"t_s": round(ts - t0, 3), "sm_mhz": mhz, "power_w": watts, "temp_c": temp, "clock_reasons": hex(reasons)}
        )
    clocks.close()
    return f"{len(times)} steps, median {timing(times)['median_ms']} ms"
