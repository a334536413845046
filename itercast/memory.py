"""Memory per GPU: weights, gradients, optimizer states, activations; the worst pipeline stage.

Sources: ZeRO (Rajbhandari et al. SC'20) for the states by stage; Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models", eq. 1–2) for activations:
per token and layer 34·h + 5·a·s bytes in 16-bit training, divided by t where tensor/sequence
parallelism shards them. We sum the same terms component by component so that GQA, SwiGLU and
fused attention (no s×s scores kept) change them where they should.
Conventions (Megatron-LM defaults): 16-bit weights; gradients in plan.grad_reduce_dtype (fp32 by
default: bf16 runs accumulate and reduce gradients in fp32); fp32 master weights + Adam m, v
(12 bytes/param) unless training in fp32.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from itercast.config.job import Job
from itercast.parallel.schedules import in_flight_microbatches


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on the most loaded GPU (pipeline stage `stage`)."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    reserved_bytes: float
    stage: int
    capacity_bytes: float

    @property
    def total_bytes(self) -> float:
        return (
            self.weights_bytes
            + self.gradients_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.reserved_bytes
        )

    @property
    def oom(self) -> bool:
        return self.total_bytes > self.capacity_bytes

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "total_bytes": self.total_bytes, "oom": self.oom}


def embedding_unit_params(job: Job) -> float:
    """Parameters of the embedding on one GPU: its vocab shard and the replicated position table."""
    m = job.model
    return m.vocab_size * m.hidden_size / job.plan.tensor_parallel + m.position_params()


def stage_params(job: Job, stage: int) -> float:
    """Parameters held by one GPU of pipeline stage `stage` (tensor-parallel shard, before ZeRO):
    its layers (norms and row-parallel biases whole on every rank), the embedding on the first
    stage, the output layer on the last."""
    m, p = job.model, job.plan
    pp, t = p.pipeline_parallel, p.tensor_parallel
    params = m.num_layers / pp * m.layer_params_per_rank(t)
    vocab = m.vocab_size * m.hidden_size / t
    if stage == 0:
        params += embedding_unit_params(job)
    if stage == pp - 1 and (not m.tied or pp > 1):  # untied head, or the tied copy on the last stage
        params += vocab
    return params


def activation_bytes_per_token_layer(job: Job) -> float:
    """Bytes one layer keeps per token of a micro-batch on one GPU for its backward pass."""
    m, p = job.model, job.plan
    h, f, d, t, e = m.hidden_size, m.ffn, m.head_dim, p.tensor_parallel, p.dtype_bytes
    a, g = m.num_attention_heads, m.kv_heads
    rep = t if p.sequence_parallel else 1  # norms, dropout, residual: sharded only with SP
    if p.recompute == "full":
        return e * h / rep  # only the layer input is kept
    dropout = 0 if m.family == "llama" else h  # 1-byte masks, two per layer
    replicated = 4 * e * h + 2 * dropout  # two norm inputs, QKV and MLP inputs, two dropout masks
    sharded = e * (a + 2 * g) * d + e * h  # q, k, v; projection input (= attention output)
    sharded += e * ((2 if m.gated_mlp else 1) * f + f)  # MLP up output(s) and activation output
    if not p.flash_attention and p.recompute != "selective":
        # per key: the softmax output and, with attention dropout, its 1-byte mask and output
        # (eq. 1's 5·a·s in 16-bit training with dropout)
        sharded += a * m.seq_length * (e + (0 if m.family == "llama" else 1 + e))
    return replicated / rep + sharded / t


def estimate_memory(job: Job) -> MemoryEstimate:
    m, p, gpu = job.model, job.plan, job.system.gpu
    shard = p.dp * p.context_parallel  # Megatron's distributed optimizer shards over DP×CP
    w_b, g_b, o_b = (4, 4, 8) if p.dtype == "fp32" else (2, p.grad_bytes, 12)
    tokens = p.micro_batch_size * m.seq_length / p.context_parallel
    per_layer = activation_bytes_per_token_layer(job) * tokens
    layers = m.num_layers / p.pipeline_parallel
    best: MemoryEstimate | None = None
    for stage in range(p.pipeline_parallel):
        params = stage_params(job, stage)
        weights = params * w_b / (shard if p.zero_stage >= 3 else 1)
        if p.zero_stage >= 3:  # gathered layers: the one computing and the one prefetched
            weights += 2 * m.layer_params_per_rank(p.tensor_parallel) * w_b
        grads = params * g_b / (shard if p.zero_stage >= 2 else 1)
        optim = params * o_b / (shard if p.zero_stage >= 1 else 1)
        held = in_flight_microbatches(p.schedule, stage, p.pipeline_parallel, job.num_microbatches, p.virtual_pipeline)
        acts = layers * per_layer * held
        if p.recompute == "full":  # one layer's full activations live during its recomputation
            full = job.plan.model_copy(update={"recompute": "none"})
            acts += activation_bytes_per_token_layer(Job(m, full, job.system)) * tokens
        if stage == p.pipeline_parallel - 1:  # fp32 logits/softmax of one micro-batch for the loss
            acts += tokens * m.vocab_size / p.tensor_parallel * 4
        est = MemoryEstimate(weights, grads, optim, acts, gpu.reserved_bytes, stage, gpu.hbm_bytes)
        if best is None or est.total_bytes > best.total_bytes:
            best = est
    assert best is not None
    return best
