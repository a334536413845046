"""Kernel-level parts of the GPU campaign: attention (a), logits and cross-entropy (b), GEMMs in bf16
and fp8 at training shapes, a sustained run of each and MoE grouped GEMMs (c).

Shapes are those of published models (Llama 3 8B/70B/405B, GPT-3 175B, Mixtral 8x7B, Qwen2 57B-A14B,
DeepSeek-V3, Llama 4 Scout; their model cards / configs, as in itercast's presets) at 4K–16K tokens
per micro-batch. Every row carries the SM clock, power and temperature sampled while it was timed.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from campaign.common import Budget, Context, attempt

BF16 = torch.bfloat16
CLOCK_FIELDS = ["sm_mhz_mean", "sm_mhz_min", "power_w_mean", "temp_c_max", "clock_reasons"]
TIME_FIELDS = ["status", "median_ms", "p10_ms", "p90_ms", "reps", *CLOCK_FIELDS]
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}

ATTENTION: dict[str, dict[str, Any]] = {
    # 32K tokens per call whatever the sequence (batch = 32768 / seq); 32 query heads (Llama 3 8B)
    "full": {
        "seqs": [4096, 8192, 1024, 16384, 2048, 32768],
        "head_dims": [128, 64],
        "heads": 32,
        "kv_heads": [8, 32],
        "tokens": 32768,
        "backends": ["flash", "cudnn", "efficient"],
    },
    "dry": {
        "seqs": [64, 128],
        "head_dims": [16],
        "heads": 4,
        "kv_heads": [2, 4],
        "tokens": 256,
        "backends": ["flash", "cudnn", "math"],
    },
}
#: vocabularies: Llama 2, GPT-2/3, Llama 3, Qwen2, GPT-OSS (o200k), Gemma
CROSS_ENTROPY: dict[str, dict[str, Any]] = {
    "full": {"vocabs": [32000, 50257, 128256, 151936, 201088, 256000], "tokens": [4096, 8192], "hidden": 4096},
    "dry": {"vocabs": [320, 1024], "tokens": [64], "hidden": 32},
}
#: (hidden, ffn, heads, kv heads, head dim, gated MLP)
GEMM_MODELS: dict[str, tuple[int, int, int, int, int, bool]] = {
    "llama3-8b": (4096, 14336, 32, 8, 128, True),
    "llama3-70b": (8192, 28672, 64, 8, 128, True),
    "gpt3-175b": (12288, 49152, 96, 96, 128, False),
    "llama3-405b": (16384, 53248, 128, 8, 128, True),
    # hidden 2048, where the fitting table's smallest runs sit too fast (Megatron-Core's GPT 1.7B, −16%) and the
    # checking table's Qwen3 30B-A3B attention: K = 2048 GEMMs the FLOPs-only curve has no measurement of
    "gpt-1.7b": (2048, 8192, 16, 16, 128, False),
    "qwen3-30b-a3b": (2048, 768, 32, 4, 128, True),  # its MLP shapes: one expert (ffn 768)
}
GEMM: dict[str, dict[str, Any]] = {
    "full": {
        "models": GEMM_MODELS,
        "tps": [1, 2, 4, 8],
        "tokens": [8192, 4096, 16384],
        "square": [1024, 2048, 4096, 8192, 16384],
        "sustained_s": 60.0,
        "sustained_n": 8192,
    },
    "dry": {
        "models": {"tiny": (64, 128, 4, 2, 16, True)},
        "tps": [1, 2],
        "tokens": [64],
        "square": [64, 128],
        "sustained_s": 0.5,
        "sustained_n": 64,
    },
}
#: (name, local experts, hidden, expert ffn, tokens per expert on average): each rank's share of a
#: micro-batch of 8192 tokens routed top-k and exchanged over the expert-parallel group
MOE: dict[str, list[tuple[str, int, int, int, int]]] = {
    "full": [
        ("mixtral-8x7b-ep1", 8, 4096, 14336, 2048),
        ("qwen2-57b-a14b-ep8", 8, 3584, 2560, 1024),
        ("deepseek-v3-ep8", 32, 7168, 2048, 2048),
        ("llama4-scout-ep1", 16, 5120, 8192, 512),
        ("qwen3-30b-a3b-ep8", 16, 2048, 768, 512),  # 128 experts top-8 over EP 8: 8192 · 8 / 128 rows each
    ],
    "dry": [("tiny", 4, 32, 64, 32)],
}


def run_attention(ctx: Context, budget: Budget) -> str:
    """(a) SDPA forward and forward+backward per back end, masking, sequence, head size and GQA."""
    grid = ATTENTION["dry" if ctx.dry else "full"]
    fields = ["backend", "causal", "seq", "batch", "heads", "kv_heads", "head_dim", "gqa", "pass", *TIME_FIELDS]
    rows = ctx.rows(
        "attention.csv",
        fields,
        [
            "torch.nn.functional.scaled_dot_product_attention in bf16 under sdpa_kernel(backend); "
            f"{grid['tokens']} tokens per call (batch = tokens / seq)",
            "gqa: none (kv_heads = heads), native (enable_gqa=True), expanded (k, v repeated to every head "
            "before the call, outside the timing, where a back end refuses native GQA)",
            "pass: fwd (inputs require grad, as in training) or fwd_bwd (forward and torch.autograd.grad of q, k, v)",
        ],
        "attention forward and backward timings by back end, causal masking, sequence, head size and GQA",
    )
    for seq in grid["seqs"]:
        for d in grid["head_dims"]:
            for kv in grid["kv_heads"]:
                for causal in (True, False):
                    for backend in grid["backends"]:
                        if not budget.take():
                            continue
                        key = {"backend": backend, "causal": causal, "seq": seq, "batch": grid["tokens"] // seq}
                        key |= {"heads": grid["heads"], "kv_heads": kv, "head_dim": d}
                        for row in _attention_case(ctx, key):
                            rows.add(row)
    rows.close()
    return f"{rows.count} rows, {budget.skipped} configurations skipped for time"


def _attention_case(ctx: Context, key: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of one configuration: forward, then forward+backward; with GQA natively first and, where a
    back end refuses that, with k and v expanded to every head."""
    h, kv = key["heads"], key["kv_heads"]
    out: list[dict[str, Any]] = []
    for gqa in ["none"] if kv == h else ["native", "expanded"]:
        q, k, v = _attention_inputs(ctx.device, key, h if gqa == "expanded" else kv)
        g = torch.randn_like(q)
        fwd = partial(F.scaled_dot_product_attention, q, k, v, is_causal=key["causal"], enable_gqa=gqa == "native")
        passes = {"fwd": fwd, "fwd_bwd": partial(_forward_backward, fwd, (q, k, v), g)}
        got = [
            {**key, "gqa": gqa, "pass": name, **attempt(partial(_under, ctx, key["backend"], fn))}
            for name, fn in passes.items()
        ]
        out += got
        if got[0]["status"] == "ok":
            break  # native GQA ran: the expanded form is not needed
    return out


def _forward_backward(fwd: Any, inputs: tuple[Any, ...], grad: Any) -> Any:
    return torch.autograd.grad(fwd(), inputs, grad)


def _attention_inputs(dev: str, key: dict[str, Any], kv_heads: int) -> tuple[Any, Any, Any]:
    b, s, d = key["batch"], key["seq"], key["head_dim"]
    q = torch.randn(b, key["heads"], s, d, device=dev, dtype=BF16, requires_grad=True)
    k, v = (torch.randn(b, kv_heads, s, d, device=dev, dtype=BF16, requires_grad=True) for _ in "kv")
    return q, k, v


def _under(ctx: Context, backend: str, fn: Any) -> dict[str, Any]:
    with sdpa_kernel(BACKENDS[backend]):
        return ctx.timed(fn, target_ms=150)


def run_cross_entropy(ctx: Context, budget: Budget) -> str:
    """(b) the output layer's GEMM and the cross-entropy at large vocabularies, alone and together."""
    grid = CROSS_ENTROPY["dry" if ctx.dry else "full"]
    fields = ["vocab", "tokens", "hidden", "op", "peak_bytes", *TIME_FIELDS]
    rows = ctx.rows(
        "cross_entropy.csv",
        fields,
        [
            "logits = x @ W^T (x: tokens × hidden, W: vocab × hidden, bf16); cross-entropy over integer labels",
            "op: logits_fwd; logits_fwd_bwd (and the gradients of x and W); ce_fp32_fwd_bwd (bf16 logits upcast "
            "to fp32, Megatron-LM's default, loss and its gradient); ce_bf16_fwd_bwd (no upcast); "
            "full_fwd_bwd (logits, fp32 cross-entropy, gradients of x and W)",
            "peak_bytes: the allocator's peak during the timed calls, above the inputs (GPU only)",
        ],
        "output-layer GEMM and cross-entropy timings and peak memory by vocabulary",
    )
    for tokens in grid["tokens"]:
        for vocab in grid["vocabs"]:
            if not budget.take():
                continue
            for row in _cross_entropy_case(ctx, vocab, tokens, grid["hidden"]):
                rows.add(row)
    rows.close()
    return f"{rows.count} rows, {budget.skipped} configurations skipped for time"


def _cross_entropy_case(ctx: Context, vocab: int, tokens: int, hidden: int) -> list[dict[str, Any]]:
    dev = ctx.device
    x = torch.randn(tokens, hidden, device=dev, dtype=BF16, requires_grad=True)
    w = (torch.randn(vocab, hidden, device=dev, dtype=BF16) * 0.02).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), device=dev)
    logits = torch.randn(tokens, vocab, device=dev, dtype=BF16, requires_grad=True)
    g = torch.randn(tokens, vocab, device=dev, dtype=BF16)
    ops = {
        "logits_fwd": lambda: F.linear(x, w),
        "logits_fwd_bwd": lambda: torch.autograd.grad(F.linear(x, w), (x, w), g),
        "ce_fp32_fwd_bwd": lambda: torch.autograd.grad(F.cross_entropy(logits.float(), labels), logits),
        "ce_bf16_fwd_bwd": lambda: torch.autograd.grad(F.cross_entropy(logits, labels), logits),
        "full_fwd_bwd": lambda: torch.autograd.grad(F.cross_entropy(F.linear(x, w).float(), labels), (x, w)),
    }
    out = []
    for op, fn in ops.items():

        def once(fn: Any = fn) -> dict[str, Any]:
            ctx.reset_peak()
            base = torch.cuda.memory_allocated(ctx.clock.device) if ctx.cuda else 0
            got = ctx.timed(fn, target_ms=150)
            peak = ctx.peak_bytes()
            return {**got, "peak_bytes": peak - base if isinstance(peak, int) else ""}

        out.append({"vocab": vocab, "tokens": tokens, "hidden": hidden, "op": op, **attempt(once)})
    return out


def linear_gemms(
    hidden: int, ffn: int, heads: int, kv: int, head_dim: int, gated: bool, tp: int
) -> list[tuple[str, int, int]]:
    """A transformer layer's four linear layers on one tensor-parallel rank as (name, in, out) features:
    QKV and the MLP's up projection split by output (column-parallel), the attention projection and
    the MLP's down projection split by input (row-parallel), Megatron-LM's layout."""
    up = (2 if gated else 1) * ffn
    return [
        ("qkv", hidden, (heads + 2 * kv) * head_dim // tp),
        ("proj", heads * head_dim // tp, hidden),
        ("fc1", hidden, up // tp),
        ("fc2", ffn // tp, hidden),
    ]


def gemm_passes(tokens: int, n_in: int, n_out: int) -> list[tuple[str, int, int, int]]:
    """The three GEMMs of a linear layer in training as (pass, M, K, N): the forward Y = X·Wᵀ, the
    input gradient dX = dY·W and the weight gradient dW = dYᵀ·X."""
    return [("fprop", tokens, n_in, n_out), ("dgrad", tokens, n_out, n_in), ("wgrad", n_out, tokens, n_in)]


def _bf16_operands(dev: str, pas: str, m: int, k: int, n: int) -> tuple[Any, Any]:
    """Operands in the layouts PyTorch's linear autograd hands cuBLAS: X·Wᵀ, dY·W and dYᵀ·X."""
    if pas == "fprop":
        return torch.randn(m, k, device=dev, dtype=BF16), torch.randn(n, k, device=dev, dtype=BF16).t()
    if pas == "dgrad":
        return torch.randn(m, k, device=dev, dtype=BF16), torch.randn(k, n, device=dev, dtype=BF16)
    return torch.randn(k, m, device=dev, dtype=BF16).t(), torch.randn(k, n, device=dev, dtype=BF16)


def _fp8_call(dev: str, pas: str, m: int, k: int, n: int) -> Any:
    """torch._scaled_mm as Transformer Engine runs it on Hopper: operands cast (and transposed) so that
    the product is row-major × column-major; E4M3 activations and weights, E5M2 gradients (TE's hybrid
    format); fast accumulation in the forward only (TE's fprop; dgrad and wgrad split the accumulator)."""
    a_type = torch.float8_e4m3fn if pas == "fprop" else torch.float8_e5m2
    a = torch.randn(m, k, device=dev).to(a_type)
    b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=dev)
    fast = pas == "fprop"
    return lambda: torch._scaled_mm(a, b, one, one, out_dtype=BF16, use_fast_accum=fast)


def run_gemms(ctx: Context, budget: Budget) -> str:
    """(c) bf16 and fp8 GEMMs: a square sweep, then each model's layer GEMMs by tensor parallelism."""
    grid = GEMM["dry" if ctx.dry else "full"]
    fields = ["model", "tp", "tokens", "linear", "pass", "dtype", "m", "k", "n", *TIME_FIELDS]
    rows = ctx.rows(
        "gemm.csv",
        fields,
        [
            "C[m×n] = A[m×k]·B[k×n]: 2·m·n·k FLOPs; bf16: torch.matmul with linear autograd's layouts; "
            "fp8: torch._scaled_mm (row-major × column-major, per-tensor scales, bf16 out)",
            "model rows: the layer's linear layers on one tensor-parallel rank (campaign/kernels.py "
            "linear_gemms) × (fprop, dgrad, wgrad); square rows: m = k = n, the forward layout",
        ],
        "bf16 and fp8 GEMM timings at training shapes, with the SM clock during each",
    )
    cases: list[tuple[str, int, int, str, str, int, int, int]] = []
    for n in grid["square"]:
        cases.append(("square", 1, n, "square", "fprop", n, n, n))
    for tokens in grid["tokens"]:
        for model, shape in grid["models"].items():
            for tp in grid["tps"]:
                for linear, n_in, n_out in linear_gemms(*shape, tp):
                    for pas, m, k, n in gemm_passes(tokens, n_in, n_out):
                        cases.append((model, tp, tokens, linear, pas, m, k, n))
    for model, tp, tokens, linear, pas, m, k, n in cases:
        for dtype in ("bf16", "fp8"):
            if not budget.take():
                continue

            def once(dtype: str = dtype, pas: str = pas, m: int = m, k: int = k, n: int = n) -> dict[str, Any]:
                if dtype == "bf16":
                    a, b = _bf16_operands(ctx.device, pas, m, k, n)
                    return ctx.timed(lambda: torch.matmul(a, b), target_ms=60)
                return ctx.timed(_fp8_call(ctx.device, pas, m, k, n), target_ms=60)

            key = {"model": model, "tp": tp, "tokens": tokens, "linear": linear, "pass": pas, "dtype": dtype}
            rows.add({**key, "m": m, "k": k, "n": n, **attempt(once)})
    rows.close()
    sustained = _sustained(ctx, ctx.sustained_s or grid["sustained_s"], grid["sustained_n"])
    return f"{rows.count} rows, {budget.skipped} GEMMs skipped for time; sustained: {sustained}"


def _sustained(ctx: Context, seconds: float, n: int) -> str:
    """One n³ product back to back for `seconds`, in bf16 (torch.matmul) and then in fp8 (torch._scaled_mm as
    Transformer Engine's forward runs it): throughput, SM clock, power and temperature per half-second window
    (how far the clock settles below boost under the power limit; GPUSpec.sustained_gemm_flops per dtype)."""
    fields = ["dtype", "t_s", "products", "tflops", *CLOCK_FIELDS]
    rows = ctx.rows(
        "gemm_sustained.csv",
        fields,
        [
            f"{n}×{n}×{n} products into one output, back to back for {seconds:g} s per dtype; one row per window",
            "bf16: torch.matmul; fp8: torch._scaled_mm, E4M3 operands, per-tensor scales, bf16 out, fast accumulation",
        ],
        f"a {seconds:g}-second sustained GEMM run per dtype (bf16, fp8): TFLOP/s, SM clock, power and temperature",
    )
    a, b = torch.randn(n, n, device=ctx.device, dtype=BF16), torch.randn(n, n, device=ctx.device, dtype=BF16)
    c = torch.empty(n, n, device=ctx.device, dtype=BF16)
    products = {"bf16": lambda: torch.matmul(a, b, out=c), "fp8": _fp8_call(ctx.device, "fprop", n, n, n)}
    done = []
    for dtype, product in products.items():
        try:
            probe = ctx.clock.times_ms(product, 3, flush=False)
        except RuntimeError as exc:  # no fp8 GEMM on this device (before Hopper / Ada, or a CPU build)
            done.append(f"{dtype}: {str(exc).splitlines()[0][:80]}")
            continue
        per_window = max(1, int(500 / max(min(probe), 1e-3)))
        start, windows = time.time(), 0
        while time.time() - start < seconds:
            t0 = time.time()
            ms = sum(ctx.clock.times_ms(lambda p=product, k=per_window: [p() for _ in range(k)], 1, flush=False))
            got = ctx.sampler.summary(t0, time.time())
            tflops = 2 * n**3 * per_window / (ms * 1e-3) / 1e12
            rows.add(
                {"dtype": dtype, "t_s": round(t0 - start, 3), "products": per_window, "tflops": round(tflops, 2), **got}
            )
            windows += 1
        done.append(f"{dtype}: {windows} windows of {per_window} products")
    rows.close()
    return "; ".join(done)


def run_grouped_gemms(ctx: Context, budget: Budget) -> str:
    """(c) MoE experts' GEMMs as frameworks run them: one bmm over equal groups, torch._grouped_mm over
    equal and skewed groups, and a loop of one matmul per expert."""
    fields = ["case", "method", "gemm", "experts", "tokens", "max_expert_tokens", "k", "n", *TIME_FIELDS]
    rows = ctx.rows(
        "grouped_gemm.csv",
        fields,
        [
            "experts' forward GEMMs, bf16: up (hidden → 2·ffn, gate and up fused) and down (ffn → hidden); "
            "tokens: routed tokens on the rank (experts × tokens per expert)",
            "method: bmm (equal groups), grouped_mm (torch._grouped_mm, equal groups), grouped_mm_skewed "
            "(group sizes ∝ 1/(rank+1), multiples of 16, same total), loop (one torch.matmul per expert, equal)",
        ],
        "MoE grouped/batched expert GEMM timings by method and group balance",
    )
    for case, experts, hidden, ffn, per_expert in MOE["dry" if ctx.dry else "full"]:
        for gemm, k, n in (("up", hidden, 2 * ffn), ("down", ffn, hidden)):
            for method in ("bmm", "grouped_mm", "grouped_mm_skewed", "loop"):
                if not budget.take():
                    continue
                sizes = expert_token_counts(experts, per_expert, skewed=method == "grouped_mm_skewed")

                def once(method: str = method, k: int = k, n: int = n, sizes: list[int] = sizes) -> dict[str, Any]:
                    return ctx.timed(_expert_call(ctx.device, method, k, n, sizes), target_ms=100)

                key = {"case": case, "method": method, "gemm": gemm, "experts": experts, "tokens": sum(sizes)}
                rows.add({**key, "max_expert_tokens": max(sizes), "k": k, "n": n, **attempt(once)})
    rows.close()
    return f"{rows.count} rows, {budget.skipped} skipped for time"


#: MoE routing cases: (name, tokens on the rank, hidden, experts, top-k), the routed models of MOE at 8,192 tokens
ROUTING: dict[str, list[tuple[str, int, int, int, int]]] = {
    "full": [
        ("mixtral-8x7b", 8192, 4096, 8, 2),
        ("qwen3-30b-a3b", 8192, 2048, 128, 8),
        ("qwen3-30b-a3b-16k", 16384, 2048, 128, 8),
        ("deepseek-v3", 8192, 7168, 256, 8),
        ("llama4-scout", 8192, 5120, 16, 1),
    ],
    "dry": [("tiny", 64, 32, 8, 2)],
}
#: the routing kernels timed, in the order of an MoE layer's forward, then the permutation's backward
ROUTING_OPS = ("softmax_topk", "sort", "permute_fwd", "unpermute_fwd", "permute_bwd")


def run_moe_routing(ctx: Context, budget: Budget) -> str:
    """(c') the kernels around an MoE layer's experts, one rank's tokens, in torch as torchtitan's local (no
    expert-parallel) path runs them: the router's fp32 scores through softmax and top-k, the routed copies'
    order (a stable argsort of the n·k expert ids), the gather of the copies' rows, their weighted scatter-add
    back to the tokens, and the gather's backward (an index_add into zeros)."""
    fields = ["case", "op", "tokens", "hidden", "experts", "top_k", *TIME_FIELDS]
    rows = ctx.rows(
        "moe_routing.csv",
        fields,
        [
            "one rank's tokens (bf16 rows, fp32 router scores), experts drawn uniformly at random per token (seed 0)",
            "softmax_topk: softmax over the experts and top-k of the scores; sort: argsort (stable) of the n·k "
            "expert ids; permute_fwd: index_select of the n·k routed rows; unpermute_fwd: rows × their weights, "
            "index_add_ into the n token rows (zeroed first); permute_bwd: index_add_ of the n·k row gradients "
            "into zeros of the n token rows",
        ],
        "MoE routing and permutation kernels around the experts",
    )
    for case, tokens, hidden, experts, top_k in ROUTING["dry" if ctx.dry else "full"]:
        for op in ROUTING_OPS:
            if not budget.take():
                continue

            def once(op: str = op, n: int = tokens, h: int = hidden, e: int = experts, k: int = top_k) -> dict:
                return ctx.timed(_routing_call(ctx.device, op, n, h, e, k), target_ms=100)

            key = {"case": case, "op": op, "tokens": tokens, "hidden": hidden, "experts": experts, "top_k": top_k}
            rows.add({**key, **attempt(once)})
    rows.close()
    return f"{rows.count} rows, {budget.skipped} skipped for time"


def _routing_call(dev: str, op: str, n: int, h: int, experts: int, k: int) -> Any:
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.rand(n, experts, generator=gen).topk(k, -1).indices.to(dev)  # k distinct experts a token
    if op == "softmax_topk":
        logits = torch.randn(n, experts, device=dev, dtype=torch.float32)
        return lambda: logits.softmax(-1).topk(k, -1)
    flat = ids.flatten()
    if op == "sort":
        return lambda: torch.argsort(flat, stable=True)
    token_of_row = (torch.argsort(flat, stable=True) // k).to(dev)  # each routed copy's token, in expert order
    x = torch.randn(n, h, device=dev, dtype=BF16)
    routed = torch.randn(n * k, h, device=dev, dtype=BF16)
    if op == "permute_fwd":
        return lambda: x.index_select(0, token_of_row)
    weights = torch.rand(n * k, 1, device=dev, dtype=BF16)
    if op == "unpermute_fwd":
        return lambda: x.zero_().index_add_(0, token_of_row, routed * weights)
    return lambda: torch.zeros_like(x).index_add_(0, token_of_row, routed)  # permute_bwd


def expert_token_counts(experts: int, per_expert: int, skewed: bool) -> list[int]:
    """Tokens per expert summing to experts × per_expert: equal, or ∝ 1/(rank+1) in multiples of 16
    (torchtitan pads each expert's group to 16 rows for torch._grouped_mm), the remainder on the first."""
    total = experts * per_expert
    if not skewed:
        return [per_expert] * experts
    weights = [1 / (r + 1) for r in range(experts)]
    sizes = [16 * max(1, int(total * w / sum(weights)) // 16) for w in weights]
    sizes[0] += total - sum(sizes)
    return sizes


def _expert_call(dev: str, method: str, k: int, n: int, sizes: list[int]) -> Any:
    experts = len(sizes)
    w = torch.randn(experts, n, k, device=dev, dtype=BF16)  # nn.Linear's (out, in) per expert
    if method == "bmm":
        x = torch.randn(experts, sizes[0], k, device=dev, dtype=BF16)
        return lambda: torch.bmm(x, w.transpose(1, 2))
    x = torch.randn(sum(sizes), k, device=dev, dtype=BF16)
    if method == "loop":
        parts = x.split(sizes)
        return lambda: [torch.matmul(p, w[e].t()) for e, p in enumerate(parts)]
    offs = torch.tensor(sizes, device=dev).cumsum(0).to(torch.int32)
    return lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs, out_dtype=BF16)
