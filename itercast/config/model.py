"""What is trained: a transformer described by the canonical fields of DESIGN.md §2."""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field, NonNegativeInt, PositiveFloat, model_validator

from itercast.config.strict import STRICT, Layers, Width

#: Megatron-DeepSpeed's --moe-min-capacity default (megatron/arguments.py), the fewest slots of an expert in
#: DeepSpeed's MOELayer with a capacity factor (deepspeed/moe/sharded_moe.py _capacity)
DEEPSPEED_MIN_CAPACITY = 4

TransformerFamily = Literal["gpt", "llama", "bert"]
PositionEmbedding = Literal["learned", "rope"]


def expert_hit_chance(experts: int, k: int, held: int) -> float:
    """The chance that a token's k experts, drawn evenly without replacement from `experts`, include at least one
    of `held` given ones: 1 − C(experts − held, k) / C(experts, k). 8 of 128 experts, 16 held: 0.667."""
    return 1.0 - math.comb(experts - held, k) / math.comb(experts, k)


class ModelConfig(BaseModel):
    """A decoder/encoder transformer. Sizes are counts; nothing here depends on the plan.

    Family conventions (what the family implies when a field is left out):
    - gpt:   LayerNorm, GELU MLP with ffn = 4·hidden, learned positions, biases, tied embeddings, causal.
    - llama: RMSNorm, SwiGLU MLP (gate + up + down), RoPE, no biases, untied embeddings, causal, GQA.
    - bert:  LayerNorm, GELU MLP, learned positions, biases, bidirectional (no causal mask), tied embeddings.
    `position_embedding` and `add_bias` override the family's choice (Nemotron-4: a gpt-style
    LayerNorm model with RoPE and no biases, Parmar et al. 2024 §2).

    Mixture of experts (`num_experts` set): in an MoE layer the MLP is `num_experts` routed experts
    (MLPs of width moe_ffn_hidden_size in the family's style), of which each token visits
    `moe_top_k`, plus an optional shared MLP of width moe_shared_ffn_hidden_size that every token
    visits (DeepSeek-MoE, Qwen-MoE, Llama 4). Layer i is an MoE layer when i ≥ moe_first_dense_layers
    and i % moe_layer_freq == 0 (Megatron-Core's `--moe-layer-freq` and DeepSeek-V3's
    `first_k_dense_replace`).

    Multi-latent attention (`kv_lora_rank` set; DeepSeek-V2 §2.1, DeepSeek-V3): queries and keys/values
    are projected down to small latents (replicated across tensor-parallel ranks, normed), then up
    per head (column-parallel); heads carry qk_nope + qk_rope dims for scores and v_head_dim for
    values; the output projection reads heads × v_head_dim.
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
    # None only until validated: _derive_head_dim fills it, or _check_shapes rejects the model
    head_dim: Width = Field(  # type: ignore[assignment]
        None,
        description="Query, key and value size of one head; default hidden_size / num_attention_heads "
        "(Qwen3, GPT-OSS and Gemma set it apart: HF config.json `head_dim`, Megatron --kv-channels).",
    )
    qk_norm: bool = Field(False, description="RMSNorm over each query and key head before attention (Qwen3, OLMo 2).")
    sliding_window: Width | None = Field(
        None,
        description="Causal local attention: a query sees itself and the window − 1 keys before it "
        "(HF `sliding_window`); absent: every layer attends to the whole sequence.",
    )
    global_attention_every: Layers | None = Field(
        None,
        description="With sliding_window: layer i (from 0) attends globally when (i + 1) % n == 0 "
        "(Gemma 2 and GPT-OSS: 2; Gemma 3: 6); absent: every layer is windowed.",
    )
    glu_clamp: PositiveFloat | None = Field(
        None,
        description="GPT-OSS's clamped gated activation in the routed experts (HF `swiglu_limit` 7.0, Megatron-Core "
        "activation_func_clamp_value): the gate clamped above and the linear half on both sides before the "
        "activation; absent: no clamp.",
    )
    rope_mscale: PositiveFloat = Field(
        1.0,
        description="YaRN's attention scaling folded into the rotary embedding's cos and sin (GPT-OSS: 1 + 0.1 ln 32 "
        "= 1.3466 from rope_scaling factor 32); 1: none. Megatron-Core rotates q and k unfused when it is not 1.",
    )
    dropout: bool | None = Field(
        None,
        description="Hidden and attention dropout in training: a 1-byte mask per element kept for backward after "
        "the attention and MLP outputs and, with unfused attention, over the scores. Default: yes for gpt and bert "
        "(Megatron-LM --hidden-dropout and --attention-dropout 0.1), no for llama.",
    )
    seq_length: Width = 2048
    vocab_size: Width = 50257
    tie_embeddings: bool | None = Field(None, description="Default: True for gpt/bert, False for llama.")
    position_embedding: PositionEmbedding | None = Field(
        None, description="learned (a seq_length × hidden table) or rope; default rope for llama, else learned."
    )
    add_bias: bool | None = Field(None, description="Biases in linear layers; default False for llama, else True.")
    kv_lora_rank: Width | None = Field(
        None, description="Multi-latent attention (DeepSeek-V2/V3): rank of the compressed keys and values."
    )
    q_lora_rank: Width | None = Field(None, description="Multi-latent attention: rank of the compressed queries.")
    qk_rope_head_dim: Width = Field(64, description="Multi-latent attention: rotary part of each query/key head.")
    qk_nope_head_dim: Width | None = Field(
        None, description="Multi-latent attention: non-rotary part of each query/key head; default head_dim."
    )
    v_head_dim: Width | None = Field(None, description="Multi-latent attention: value head size; default head_dim.")
    num_experts: Width | None = Field(None, description="Routed experts per MoE layer; absent: a dense model.")
    moe_top_k: Width = Field(2, description="Experts each token is routed to.")
    moe_ffn_hidden_size: Width | None = Field(None, description="Width of one routed expert; default ffn.")
    moe_shared_ffn_hidden_size: NonNegativeInt = Field(
        0, le=100_000_000, description="Width of the shared experts together (0: none)."
    )
    moe_layer_freq: Layers = Field(1, description="Every n-th layer is an MoE layer (Megatron --moe-layer-freq).")
    moe_first_dense_layers: NonNegativeInt = Field(
        0, le=100_000, description="Leading dense layers (DeepSeek-V3: first_k_dense_replace = 3)."
    )
    moe_capacity_factor: float | None = Field(
        None, gt=0, le=1000, description="Tokens an expert takes, relative to an even share; absent: dropless."
    )
    moe_pad_to_capacity: bool = Field(
        False, description="Experts always process their full capacity (Megatron --moe-pad-expert-input-to-capacity)."
    )
    moe_token_imbalance: float = Field(
        1.0,
        ge=1,
        le=1000,
        description="Tokens of the busiest expert-parallel rank over the mean (router load imbalance; 1: even).",
    )

    @model_validator(mode="before")
    @classmethod
    def _derive_head_dim(cls, data: Any) -> Any:
        """head_dim left out: hidden_size / num_attention_heads where they divide (else _check_shapes
        asks for it)."""
        if isinstance(data, dict) and "head_dim" not in data:
            h, a = data.get("hidden_size"), data.get("num_attention_heads")
            if type(h) is int and type(a) is int and a > 0 and h % a == 0:
                return {**data, "head_dim": h // a}
        return data

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelConfig:
        problems = []
        if self.head_dim is None:
            problems.append(
                f"model.hidden_size({self.hidden_size}) not divisible by "
                f"model.num_attention_heads({self.num_attention_heads}); set model.head_dim"
            )
        problems += self._attention_problems()
        if self.num_attention_heads % self.kv_heads:
            problems.append(
                f"model.num_attention_heads({self.num_attention_heads}) not divisible by "
                f"model.num_query_groups({self.kv_heads})"
            )
        problems += self._moe_problems()
        if self.glu_clamp is not None and (self.num_experts is None or not self.gated_mlp):
            problems.append(  # transformer_ops._megatron_expert_extras prices it on the routed experts only
                "model.glu_clamp is priced on gated routed experts (GPT-OSS's); got "
                f"num_experts={self.num_experts}, family={self.family}"
            )
        if not self.mla:
            fields = type(self).model_fields
            mla_fields = ("q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
            problems += [
                f"model.{n} needs model.kv_lora_rank (multi-latent attention)"
                for n in mla_fields
                if getattr(self, n) != fields[n].default
            ]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _attention_problems(self) -> list[str]:
        problems = []
        if self.global_attention_every is not None and self.sliding_window is None:
            problems.append("model.global_attention_every needs model.sliding_window")
        if self.sliding_window is not None and not self.causal:
            problems.append(f"model.sliding_window needs a causal family; got {self.family}")
        if self.mla and self.num_query_groups not in (None, self.num_attention_heads):
            problems.append(  # its keys and values are decompressed from the latent for every head
                f"model.num_query_groups({self.num_query_groups}) with multi-latent attention (model.kv_lora_rank): "
                "Megatron-LM: 'Group query attention is mutually exclusive with multi latent attention': expected it "
                f"unset or num_attention_heads({self.num_attention_heads})"
            )
        if self.mla and self.qk_norm:
            problems.append("model.qk_norm needs standard attention (multi-latent attention norms its latents)")
        return problems

    def _moe_problems(self) -> list[str]:
        if self.num_experts is None:
            fields = type(self).model_fields
            changed = [n for n in fields if n.startswith("moe_") and getattr(self, n) != fields[n].default]
            return [f"model.{n} needs model.num_experts (a mixture-of-experts model)" for n in changed]
        problems = []
        if self.moe_top_k > self.num_experts:
            problems.append(f"model.moe_top_k({self.moe_top_k}) > model.num_experts({self.num_experts})")
        if self.moe_first_dense_layers >= self.num_layers:
            problems.append(
                f"model.moe_first_dense_layers({self.moe_first_dense_layers}) leaves no MoE layer of "
                f"model.num_layers({self.num_layers})"
            )
        if self.moe_pad_to_capacity and self.moe_capacity_factor is None:
            problems.append("model.moe_pad_to_capacity needs model.moe_capacity_factor")
        return problems

    @property
    def ffn(self) -> int:
        """MLP inner width (the field, or 4·hidden_size)."""
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def kv_heads(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def qk_head_dim(self) -> int:
        """Query/key size per head (scores)."""
        return (self.qk_nope_head_dim or self.head_dim) + self.qk_rope_head_dim if self.mla else self.head_dim

    @property
    def value_head_dim(self) -> int:
        return (self.v_head_dim or self.head_dim) if self.mla else self.head_dim

    # -- sliding-window attention ---------------------------------------------------------------
    def is_windowed_layer(self, index: int) -> bool:
        """Layer `index` (from 0) attends within model.sliding_window: HF transformers' Gemma 2
        (`is_sliding = not bool(layer_idx % 2)`), Gemma 3 (`(layer_idx + 1) % sliding_window_pattern`)
        and GPT-OSS (`layer_types`: sliding, full, sliding, ...) all make layer i global when
        (i + 1) % n == 0."""
        if self.sliding_window is None:
            return False
        n = self.global_attention_every
        return n is None or (index + 1) % n != 0

    @property
    def num_windowed_layers(self) -> int:
        n = self.global_attention_every
        if self.sliding_window is None:
            return 0
        return self.num_layers if n is None else self.num_layers - self.num_layers // n

    def causal_keys_per_query(self, windowed: bool = False) -> float:
        """Keys a query of a full sequence meets, on average, in a causal layer (the diagonal's half
        left out, as FlashAttention's causal FLOP count S²/2): S/2 globally; in a window of W ≤ S
        keys (FlashAttention's window_size = (W − 1, 0): query i sees keys i − W + 1 … i), query i
        sees min(i + 1, W) keys, Σ_i = S·W − W²/2 (+ W/2, dropped), so W − W²/(2S) per query."""
        s = self.seq_length
        if not windowed:
            return s / 2
        w = min(self.sliding_window or s, s)
        return w - w * w / (2 * s)

    def attention_score_flops_per_token(self, windowed: bool = False) -> float:
        """QKᵀ and AV FLOPs of one layer per token in the model-FLOPs convention (Narayanan et al.,
        SC'21, eq. 3: the full S keys per query, twice the causal count); a windowed layer twice
        its causal count too (S at W = S)."""
        keys = 2 * self.causal_keys_per_query(windowed) if windowed else self.seq_length
        return 2 * keys * self.num_attention_heads * (self.qk_head_dim + self.value_head_dim)

    def attention_params(self) -> tuple[int, int]:
        """Attention weights of one layer: (split by tensor parallelism, whole on every rank).
        Standard: QKV (GQA) and the output projection, all split. MLA: the down projections and
        their norms whole; the up projections and the output projection split."""
        h, a = self.hidden_size, self.num_attention_heads
        if not self.mla:
            return h * (a + 2 * self.kv_heads) * self.head_dim + a * self.head_dim * h, 0
        kv_lora, rope = self.kv_lora_rank or 0, self.qk_rope_head_dim
        q_in = self.q_lora_rank or h
        split = q_in * a * self.qk_head_dim + kv_lora * a * (self.qk_head_dim - rope + self.value_head_dim)
        split += a * self.value_head_dim * h
        whole = h * (kv_lora + rope) + kv_lora
        if self.q_lora_rank:
            whole += h * self.q_lora_rank + self.q_lora_rank
        return split, whole

    @property
    def gated_mlp(self) -> bool:
        """SwiGLU (three weight matrices) for llama; two matrices otherwise."""
        return self.family == "llama"

    @property
    def has_dropout(self) -> bool:
        """Whether training applies dropout (`dropout`, else the family's default)."""
        return self.dropout if self.dropout is not None else self.family != "llama"

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

    # -- mixture of experts ------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def experts(self) -> int:
        """Routed experts per MoE layer (0 for a dense model)."""
        return self.num_experts or 0

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn

    def moe_load(self) -> float:
        """Rows the busiest expert-parallel rank processes, relative to an even split of the n·k routed
        copies: the router's imbalance, capped by the capacity factor when tokens beyond it are
        dropped, or the capacity itself when experts are padded to it (Megatron-Core's
        --moe-expert-capacity-factor and --moe-pad-expert-input-to-capacity)."""
        cf = self.moe_capacity_factor
        if cf is None:
            return self.moe_token_imbalance
        return cf if self.moe_pad_to_capacity else min(self.moe_token_imbalance, cf)

    def deepep_rows_per_token(self, expert_parallel: int) -> float:
        """Rows DeepEP's dispatch delivers to one of `expert_parallel` ranks per token of each sender, a token once
        however many of the rank's experts it selected (torchtitan's DeepEP backend, distributed/deepep/deepep.py:
        is_token_in_rank from get_dispatch_layout): ep × the chance it selected one of the rank's E/ep experts
        (expert_hit_chance), times the router's load (moe_load). 8 of 128 experts over 8 ranks: 8 × 0.667 = 5.34
        rows, against the 8 copies a per-expert dispatch delivers."""
        held = self.experts // expert_parallel
        return self.moe_load() * expert_parallel * expert_hit_chance(self.experts, self.moe_top_k, held)

    def deepspeed_capacity(self, tokens: Any, round_to: Any = 1) -> Any:
        """Slots of one expert in DeepSpeed's MOELayer for `tokens` tokens a micro-batch on the rank (a number or an
        array). With a capacity factor cf (padded: drop_tokens), deepspeed/moe/sharded_moe.py _capacity at 38327e0
        and from v0.19.4: `torch.ceil((num_tokens / num_experts) * capacity_factor)` in float32 (the factor a
        float32 tensor: cf for top-1, cf·2 for top-2, cf·k for top-k), at least DEEPSPEED_MIN_CAPACITY. Dropless,
        the busiest expert's count, taken as k·tokens/E × moe_token_imbalance rounded up to a whole token, then up
        to a multiple of `round_to` (a number or an array): the tensor-parallel size beside whole experts, so that
        drop_tokens can split it (sharded_moe.py top1gating/top2gating/topkgating: `if
        groups._get_expert_model_parallel_world_size() == 1: ... torch.ceil(new_capacity / tp).mul(tp)`, that size
        the expert-tensor one, 1 unless --enable-expert-tensor-parallelism); 1: none."""
        E, k = self.experts, self.moe_top_k
        if self.moe_capacity_factor is None:
            busiest = np.asarray(tokens) * k * self.moe_token_imbalance / E
            return (np.ceil(busiest / round_to) * round_to).astype(np.float64)
        scaled = np.float32(np.asarray(tokens) / E) * np.float32(self.moe_capacity_factor * k)
        return np.maximum(np.ceil(scaled), DEEPSPEED_MIN_CAPACITY).astype(np.float64)

    def moe_layers_before(self, index: int | np.ndarray) -> np.ndarray:
        """MoE layers among layers 0 … index − 1 (vectorised over `index`)."""
        x = np.asarray(index, dtype=np.int64)
        if not self.is_moe:
            return np.zeros_like(x)
        n, k = self.moe_layer_freq, self.moe_first_dense_layers
        return np.maximum(-(-x // n) - (-(-k // n)), 0)

    def is_moe_layer(self, index: int) -> bool:
        return bool(self.moe_layers_before(index + 1) - self.moe_layers_before(index))

    @property
    def num_moe_layers(self) -> int:
        return int(self.moe_layers_before(self.num_layers))

    def expert_params(self) -> int:
        """Weights (and biases) of one routed expert: an MLP of width expert_ffn in the family's style."""
        f, h = self.expert_ffn, self.hidden_size
        return (3 if self.gated_mlp else 2) * h * f + ((f + h) if self.biases else 0)

    def expert_params_per_rank(self, expert_parallel: Any, expert_tensor_parallel: Any) -> Any:
        """Routed-expert parameters of one MoE layer on one GPU (num_experts / EP experts, split by
        ETP); the sizes may be numpy columns."""
        return self.experts / expert_parallel * self.expert_params() / expert_tensor_parallel

    # -- parameters of one layer -------------------------------------------------------------
    def _mlp_width(self, moe: bool) -> int:
        """Width of the tensor-parallel MLP of a layer: the MLP, or in an MoE layer its shared experts."""
        return self.moe_shared_ffn_hidden_size if moe else self.ffn

    def mlp_params(self, moe: bool = False) -> int:
        """The tensor-parallel MLP's weights and its up projection's bias (an MoE layer: its shared experts')."""
        f = self._mlp_width(moe)
        return (3 if self.gated_mlp else 2) * self.hidden_size * f + (f if self.biases else 0)

    def layer_sharded_params(self, moe: bool = False) -> int:
        """Parameters of one layer that tensor parallelism splits: attention's weight matrices, the
        MLP's (an MoE layer: its shared experts') and the biases of the column-parallel layers (QKV,
        MLP up), Megatron-LM's ColumnParallelLinear. Routed experts are counted apart."""
        qkv_biases = (self.num_attention_heads + 2 * self.kv_heads) * self.head_dim if self.biases else 0
        return self.attention_params()[0] + self.mlp_params(moe) + qkv_biases

    def layer_replicated_params(self, moe: bool = False) -> int:
        """Parameters of one layer that every tensor-parallel rank holds whole: the two norms
        (RMSNorm: weight; LayerNorm: weight + bias), with QK-norm the query and key norms (one
        head_dim weight each, shared by the heads: HF Qwen3RMSNorm(head_dim)), the row-parallel
        layers' output biases and, in an MoE layer, the router (hidden × num_experts, Megatron-Core's TopKRouter)."""
        h = self.hidden_size
        norms = (2 * h if self.family == "llama" else 4 * h) + (2 * self.head_dim if self.qk_norm else 0)
        return norms + (2 * h if self.biases else 0) + (h * self.experts if moe else 0) + self.attention_params()[1]

    def layer_params_per_rank(self, tensor_parallel: Any, moe: bool = False, whole_mlp: Any = False) -> Any:
        """Parameters of one layer on one tensor-parallel rank, routed experts excluded; `whole_mlp` (a bool or an
        array of them, as `tensor_parallel` an int or an array): the MLP whole on every rank (DeepSpeed's PR-MoE
        residual MLP beside whole experts, PlanConfig.whole_residual_mlp)."""
        whole = self.mlp_params(moe) * whole_mlp
        return (self.layer_sharded_params(moe) - whole) / tensor_parallel + self.layer_replicated_params(moe) + whole

    def params_per_layer(self, moe: bool = False) -> int:
        """Weights and biases of one transformer layer (attention + MLP or experts + two norms)."""
        experts = self.experts * self.expert_params() if moe else 0
        return self.layer_sharded_params(moe) + self.layer_replicated_params(moe) + experts

    def position_params(self) -> int:
        """The learned position table (replicated across tensor-parallel ranks), or 0 with RoPE."""
        return self.seq_length * self.hidden_size if self.learned_positions else 0

    def embedding_params(self) -> int:
        """Input embedding (+ learned positions) and, if untied, the output layer."""
        emb = self.vocab_size * self.hidden_size
        return emb + self.position_params() + (0 if self.tied else emb)

    def final_norm_params(self) -> int:
        """The norm before the output layer, whole on every tensor-parallel rank of the last stage
        (RMSNorm: a weight; LayerNorm: weight and bias)."""
        return self.hidden_size if self.family == "llama" else 2 * self.hidden_size

    def num_params(self) -> int:
        """All parameters (every expert counted), the final norm included."""
        moe = self.num_moe_layers
        layers = (self.num_layers - moe) * self.params_per_layer() + moe * self.params_per_layer(moe=True)
        return layers + self.embedding_params() + self.final_norm_params()

    def layer_forward_flops_per_token(self, moe: bool = False, windowed: bool = False) -> float:
        """Forward FLOPs of one layer per token: its matmuls (2 FLOPs per multiply-add) and attention
        scores/values over the full sequence (Narayanan et al., SC'21, eq. 3 counts attention without
        the causal half; we do the same so that MFU matches Megatron's and NeMo's reported figures).
        An MoE layer: the router, the shared experts and top_k routed experts (active parameters)."""
        h = self.hidden_size
        projections = 2 * sum(self.attention_params())  # every attention weight once per token
        up = 3 if self.gated_mlp else 2
        mlp = 2 * up * h * self._mlp_width(moe)
        if moe:
            mlp += 2 * h * self.experts + self.moe_top_k * 2 * up * h * self.expert_ffn
        return projections + mlp + self.attention_score_flops_per_token(windowed)

    def layers_forward_flops_per_token(self) -> float:
        """Forward FLOPs per token of all layers (dense and MoE, windowed and global)."""
        moe = self.num_moe_layers
        dense = (self.num_layers - moe) * self.layer_forward_flops_per_token()
        local = self.attention_score_flops_per_token(True) - self.attention_score_flops_per_token()
        return dense + moe * self.layer_forward_flops_per_token(moe=True) + self.num_windowed_layers * local

    def layers_attention_score_flops_per_token(self) -> float:
        """QKᵀ and AV FLOPs per token of all layers (windowed and global), in the model-FLOPs convention."""
        windowed = self.num_windowed_layers
        return (self.num_layers - windowed) * self.attention_score_flops_per_token() + (
            windowed * self.attention_score_flops_per_token(True)
        )

    def flops_per_token(self) -> float:
        """Model FLOPs of one token, forward + backward (3× forward), no recompute."""
        logits = 2 * self.hidden_size * self.vocab_size
        return 3.0 * (self.layers_forward_flops_per_token() + logits)
