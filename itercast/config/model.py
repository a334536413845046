"""What is trained: a transformer described by the canonical fields of DESIGN.md §2."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

TransformerFamily = Literal["gpt", "llama", "bert"]


class ModelConfig(BaseModel):
    """A decoder/encoder transformer. Sizes are counts; nothing here depends on the plan.

    Family conventions (what the family implies when a field is left out):
    - gpt:   LayerNorm, GELU MLP with ffn = 4·hidden, learned positions, tied embeddings, causal.
    - llama: RMSNorm, SwiGLU MLP (gate + up + down), RoPE, untied embeddings, causal, GQA.
    - bert:  LayerNorm, GELU MLP, bidirectional (no causal mask), tied embeddings.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    family: TransformerFamily = "gpt"
    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_attention_heads: PositiveInt
    ffn_hidden_size: PositiveInt | None = Field(None, description="MLP inner width; default 4·hidden_size (gpt, bert).")
    num_query_groups: PositiveInt | None = Field(
        None, description="Key/value heads (GQA); default num_attention_heads (MHA)."
    )
    seq_length: PositiveInt = 2048
    vocab_size: PositiveInt = 50257
    tie_embeddings: bool | None = Field(None, description="Default: True for gpt/bert, False for llama.")

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelConfig:
        problems = []
        if self.hidden_size % self.num_attention_heads:
            problems.append(
                f"model.hidden_size({self.hidden_size}) not divisible by "
                f"model.num_attention_heads({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.kv_heads:
            problems.append(
                f"model.num_attention_heads({self.num_attention_heads}) not divisible by "
                f"model.num_query_groups({self.kv_heads})"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def ffn(self) -> int:
        """MLP inner width (the field, or 4·hidden_size)."""
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def kv_heads(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def gated_mlp(self) -> bool:
        """SwiGLU (three weight matrices) for llama; two matrices otherwise."""
        return self.family == "llama"

    @property
    def causal(self) -> bool:
        return self.family != "bert"

    @property
    def tied(self) -> bool:
        return self.tie_embeddings if self.tie_embeddings is not None else self.family != "llama"

    def params_per_layer(self) -> int:
        """Weights and biases of one transformer layer (attention + MLP + two norms)."""
        h, d = self.hidden_size, self.head_dim
        qkv = h * (self.num_attention_heads + 2 * self.kv_heads) * d
        proj = h * h
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn
        norms = 2 * h if self.family == "llama" else 4 * h  # RMSNorm: weight; LayerNorm: w + b
        biases = 0 if self.family == "llama" else (self.num_attention_heads + 2 * self.kv_heads) * d + h + self.ffn + h
        return qkv + proj + mlp + norms + biases

    def embedding_params(self) -> int:
        """Input embedding (+ learned positions for gpt/bert) and, if untied, the output layer."""
        emb = self.vocab_size * self.hidden_size
        pos = self.seq_length * self.hidden_size if self.family != "llama" else 0
        return emb + pos + (0 if self.tied else emb)

    def num_params(self) -> int:
        return self.num_layers * self.params_per_layer() + self.embedding_params() + 2 * self.hidden_size

    def flops_per_token(self) -> float:
        """Model FLOPs of one token, forward + backward (3× forward), no recompute.

        Counts every matmul (2 FLOPs per multiply-add) and attention scores/values over the
        full sequence (Narayanan et al., SC'21, eq. 3 counts attention without the causal
        half; we do the same so that MFU matches Megatron's and NeMo's reported figures).
        """
        h, d, s = self.hidden_size, self.head_dim, self.seq_length
        qkv = 2 * h * (self.num_attention_heads + 2 * self.kv_heads) * d
        proj = 2 * h * h
        mlp = 2 * (3 if self.gated_mlp else 2) * h * self.ffn
        attn = 2 * 2 * s * h  # QK^T and AV, per token, full (non-causal) count
        logits = 2 * h * self.vocab_size
        return 3.0 * (self.num_layers * (qkv + proj + mlp + attn) + logits)
