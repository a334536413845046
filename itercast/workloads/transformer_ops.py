"""The ops of one transformer layer (and of the embedding and the head) on one GPU, per micro-batch.

Shapes follow Megatron-LM (Shoeybi et al. 2019; Narayanan et al. SC'21; Korthikanti et al. 2022):
with t = tensor_parallel, c = context_parallel, b = micro_batch_size, s = seq_length / c tokens
per rank, h = hidden, f = ffn, a heads, g key/value groups, d = h / a, e = bytes per activation.
GEMM FLOPs are 2·m·n·k. Backward: every GEMM becomes two of the same FLOPs (data and weight
gradients); fused attention's backward does 2.5× its forward FLOPs (5 matmuls instead of 2,
FlashAttention-2); memory-bound ops move twice their forward bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from itercast.config.model import ModelConfig
from itercast.config.plan import PlanConfig

COMPUTE_FAMILIES = ("gemm", "attention", "elementwise", "norm", "activation")


@dataclass(frozen=True)
class Op:
    """One kernel (or one collective). `amount` is FLOPs for gemm/attention, bytes otherwise."""

    name: str
    family: str  # gemm | attention | elementwise | norm | activation | tp_comm | cp_comm
    amount: float
    comm_kind: str = ""  # all_reduce | all_gather | reduce_scatter (tp_comm) | p2p (cp_comm)
    count: int = 1  # sequential repetitions (ring steps of context parallelism)


@dataclass(frozen=True)
class Shapes:
    """Per-rank sizes of one micro-batch."""

    tokens: float  # b · s / c
    sp_tokens: float  # tokens / t with sequence parallelism (norms, dropout, residual), else tokens
    seq_local: float
    seq_full: float
    t: int
    e: int

    @classmethod
    def of(cls, model: ModelConfig, plan: PlanConfig) -> Shapes:
        s_loc = model.seq_length / plan.context_parallel
        tokens = plan.micro_batch_size * s_loc
        sp = tokens / plan.tensor_parallel if plan.sequence_parallel else tokens
        return cls(tokens, sp, s_loc, model.seq_length, plan.tensor_parallel, plan.dtype_bytes)


def _tp_comm(name: str, nbytes: float, plan: PlanConfig) -> list[Op]:
    """Megatron's f/g operators: an all-reduce, or with sequence parallelism an all-gather before
    and a reduce-scatter after the parallel region (same bytes)."""
    if plan.tensor_parallel == 1:
        return []
    if plan.sequence_parallel:
        return [
            Op(f"{name}.all_gather", "tp_comm", nbytes, "all_gather"),
            Op(f"{name}.reduce_scatter", "tp_comm", nbytes, "reduce_scatter"),
        ]
    return [Op(f"{name}.all_reduce", "tp_comm", nbytes, "all_reduce")]


def layer_forward(model: ModelConfig, plan: PlanConfig) -> list[Op]:
    """Forward ops of one layer, in execution order."""
    sh = Shapes.of(model, plan)
    h, f, d, t, e = model.hidden_size, model.ffn, model.head_dim, sh.t, sh.e
    a, g = model.num_attention_heads, model.kv_heads
    T, Tsp = sh.tokens, sh.sp_tokens
    causal = 0.5 if model.causal else 1.0
    attn_flops = 4.0 * plan.micro_batch_size * (a / t) * sh.seq_local * sh.seq_full * d * causal
    ops = [Op("input_norm", "norm", 2 * Tsp * h * e)]
    ops += _tp_comm("attn_in", T * h * e, plan)[:1] if plan.sequence_parallel else []
    ops += [Op("qkv", "gemm", 2 * T * h * (a + 2 * g) * d / t)]
    if model.family == "llama":
        ops.append(Op("rope", "elementwise", 2 * T * (a + g) * d / t * e))
    ops.append(Op("attention", "attention", attn_flops))
    if plan.context_parallel > 1:  # ring attention: K and V blocks pass around the CP ring
        ops.append(Op("cp_kv_exchange", "cp_comm", 2 * T * g * d / t * e, "p2p", plan.context_parallel - 1))
    ops.append(Op("attn_proj", "gemm", 2 * T * h * h / t))
    ops += _tp_comm("attn_out", T * h * e, plan)[-1:]
    ops += [Op("residual_1", "elementwise", 3 * Tsp * h * e), Op("post_attn_norm", "norm", 2 * Tsp * h * e)]
    ops += _tp_comm("mlp_in", T * h * e, plan)[:1] if plan.sequence_parallel else []
    up = 2 if model.gated_mlp else 1
    ops += [
        Op("mlp_up", "gemm", 2 * T * h * up * f / t),
        Op("mlp_act", "activation", (3 if model.gated_mlp else 2) * T * f / t * e),
        Op("mlp_down", "gemm", 2 * T * f * h / t),
    ]
    ops += _tp_comm("mlp_out", T * h * e, plan)[-1:]
    ops.append(Op("residual_2", "elementwise", 3 * Tsp * h * e))
    return ops


def backward_of(forward: list[Op]) -> list[Op]:
    """Backward ops for a forward list (reverse order). Collectives mirror: AG ↔ RS, AR stays."""
    mirror = {"all_gather": "reduce_scatter", "reduce_scatter": "all_gather", "all_reduce": "all_reduce"}
    out: list[Op] = []
    for op in reversed(forward):
        if op.family == "gemm":
            out += [Op(f"{op.name}.dgrad", "gemm", op.amount), Op(f"{op.name}.wgrad", "gemm", op.amount)]
        elif op.family == "attention":
            out.append(Op(f"{op.name}.bwd", "attention", 2.5 * op.amount))
        elif op.family == "tp_comm":
            out.append(Op(f"{op.name}.bwd", "tp_comm", op.amount, mirror[op.comm_kind]))
        elif op.family == "cp_comm":  # K,V blocks and their gradients travel back
            out.append(Op(f"{op.name}.bwd", "cp_comm", 2 * op.amount, "p2p", op.count))
        else:
            out.append(Op(f"{op.name}.bwd", op.family, 2 * op.amount))
    return out


def layer_backward(model: ModelConfig, plan: PlanConfig) -> list[Op]:
    """Backward ops of one layer, with the recomputation the plan asks for first.

    full: the whole layer forward runs again. selective: core attention runs again, which fused
    (flash) attention already does inside its backward, so it adds nothing there.
    """
    fwd = layer_forward(model, plan)
    recompute: list[Op] = []
    if plan.recompute == "full":
        recompute = [Op(f"recompute.{o.name}", o.family, o.amount, o.comm_kind, o.count) for o in fwd]
    elif plan.recompute == "selective" and not plan.flash_attention:
        recompute = [Op("recompute.attention", o.family, o.amount) for o in fwd if o.family == "attention"]
    return recompute + backward_of(fwd)


def embedding_forward(model: ModelConfig, plan: PlanConfig) -> list[Op]:
    """Vocab-parallel embedding lookup (+ learned positions for gpt/bert)."""
    sh = Shapes.of(model, plan)
    h, e = model.hidden_size, sh.e
    ops = [Op("embedding_lookup", "elementwise", 2 * sh.tokens * h * e)]
    if model.family != "llama":
        ops.append(Op("position_add", "elementwise", 3 * sh.tokens * h * e))
    if plan.tensor_parallel > 1:
        kind = "reduce_scatter" if plan.sequence_parallel else "all_reduce"
        ops.append(Op("embedding.tp", "tp_comm", sh.tokens * h * e, kind))
    return ops


def head_forward(model: ModelConfig, plan: PlanConfig) -> list[Op]:
    """Final norm, vocab-parallel logits GEMM and cross-entropy (fp32 softmax over V / t)."""
    sh = Shapes.of(model, plan)
    h, e, v_loc = model.hidden_size, sh.e, model.vocab_size / plan.tensor_parallel
    ops = [Op("final_norm", "norm", 2 * sh.sp_tokens * h * e)]
    ops += _tp_comm("head_in", sh.tokens * h * e, plan)[:1] if plan.sequence_parallel else []
    ops += [
        Op("logits", "gemm", 2 * sh.tokens * h * v_loc),
        Op("cross_entropy", "elementwise", sh.tokens * v_loc * (e + 2 * 4)),
    ]
    if plan.tensor_parallel > 1:  # max and sum-exp across the vocab shards: tiny all-reduces
        ops.append(Op("cross_entropy.tp", "tp_comm", 2 * sh.tokens * 4, "all_reduce"))
    return ops
