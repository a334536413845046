"""What is trained: a transformer described by the canonical fields of DESIGN.md §2."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from itercast.config.strict import STRICT, Layers, Width

TransformerFamily = Literal["gpt", "llama", "bert"]
PositionEmbedding = Literal["learned", "rope"]


class ModelConfig(BaseModel):
    """A decoder/encoder transformer. Sizes are counts; nothing here depends on the plan.

    Family conventions (what the family implies when a field is left out):
    - gpt:   LayerNorm, GELU MLP with ffn = 4·hidden, learned positions, biases, tied embeddings, causal.
    - llama: RMSNorm, SwiGLU MLP (gate + up + down), RoPE, no biases, untied embeddings, causal, GQA.
    - bert:  LayerNorm, GELU MLP, learned positions, biases, bidirectional (no causal mask), tied embeddings.
    `position_embedding` and `add_bias` override the family's choice (Nemotron-4: a gpt-style
    LayerNorm model with RoPE and no biases, Parmar et al. 2024 §2).
    """

    model_config = STRICT

    name: str = "custom"
    family: TransformerFamily = "gpt"
    num_layers: Layers
    hidden_size: Width
    num_attention_heads: Width
    ffn_hidden_size: Width | None = Field(None, description="MLP inner width; default 4·hidden_size (gpt, bert).")
    num_query_groups: Width | None = Field(
        None, description="Key/value heads (GQA); default num_attention_heads (MHA)."
    )
    seq_length: Width = 2048
    vocab_size: Width = 50257
    tie_embeddings: bool | None = Field(None, description="Default: True for gpt/bert, False for llama.")
    position_embedding: PositionEmbedding | None = Field(
        None, description="learned (a seq_length × hidden table) or rope; default rope for llama, else learned."
    )
    add_bias: bool | None = Field(None, description="Biases in linear layers; default False for llama, else True.")

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

    @property
    def learned_positions(self) -> bool:
        """A learned position table (gpt, bert), not rotary embeddings computed in each layer."""
        default = "rope" if self.family == "llama" else "learned"
        return (self.position_embedding or default) == "learned"

    @property
    def biases(self) -> bool:
        return self.add_bias if self.add_bias is not None else self.family != "llama"

    def layer_sharded_params(self) -> int:
        """Parameters of one layer that tensor parallelism splits: the four weight matrices and the
        biases of the column-parallel layers (QKV, MLP up), Megatron-LM's ColumnParallelLinear."""
        h, d = self.hidden_size, self.head_dim
        qkv = h * (self.num_attention_heads + 2 * self.kv_heads) * d
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn
        column_biases = ((self.num_attention_heads + 2 * self.kv_heads) * d + self.ffn) if self.biases else 0
        return qkv + h * h + mlp + column_biases

    def layer_replicated_params(self) -> int:
        """Parameters of one layer that every tensor-parallel rank holds whole: the two norms
        (RMSNorm: weight; LayerNorm: weight + bias) and the row-parallel layers' output biases."""
        h = self.hidden_size
        norms = 2 * h if self.family == "llama" else 4 * h
        return norms + (2 * h if self.biases else 0)

    def layer_params_per_rank(self, tensor_parallel: int) -> float:
        """Parameters of one layer on one tensor-parallel rank."""
        return self.layer_sharded_params() / tensor_parallel + self.layer_replicated_params()

    def params_per_layer(self) -> int:
        """Weights and biases of one transformer layer (attention + MLP + two norms)."""
        return self.layer_sharded_params() + self.layer_replicated_params()

    def position_params(self) -> int:
        """The learned position table (replicated across tensor-parallel ranks), or 0 with RoPE."""
        return self.seq_length * self.hidden_size if self.learned_positions else 0

    def embedding_params(self) -> int:
        """Input embedding (+ learned positions) and, if untied, the output layer."""
        emb = self.vocab_size * self.hidden_size
        return emb + self.position_params() + (0 if self.tied else emb)

    def num_params(self) -> int:
        return self.num_layers * self.params_per_layer() + self.embedding_params() + 2 * self.hidden_size

    def layer_forward_flops_per_token(self) -> float:
        """Forward FLOPs of one layer per token: its matmuls (2 FLOPs per multiply-add) and attention
        scores/values over the full sequence (Narayanan et al., SC'21, eq. 3 counts attention without
        the causal half; we do the same so that MFU matches Megatron's and NeMo's reported figures)."""
        h, d, s = self.hidden_size, self.head_dim, self.seq_length
        qkv = 2 * h * (self.num_attention_heads + 2 * self.kv_heads) * d
        proj = 2 * h * h
        mlp = 2 * (3 if self.gated_mlp else 2) * h * self.ffn
        attn = 2 * 2 * s * h  # QK^T and AV, per token, full (non-causal) count
        return qkv + proj + mlp + attn

    def flops_per_token(self) -> float:
        """Model FLOPs of one token, forward + backward (3× forward), no recompute."""
        logits = 2 * self.hidden_size * self.vocab_size
        return 3.0 * (self.num_layers * self.layer_forward_flops_per_token() + logits)
