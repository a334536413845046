"""The space of plans for one model on a number of GPUs, enumerated as numpy columns (a PlanTable).

Every combination of the varied fields is generated as arrays (no Python object per plan) and
filtered with the same rules Job validation applies (config/job.py), vectorised, then with the
rules of the framework that will run the plans (frameworks.py); the search keeps what passes. A
field fixed by the user (`fixed`) takes one value. Sizes follow Megatron-LM: tensor parallel within
a node unless allowed across; virtual pipeline sizes that divide the layers of a stage, up to one
layer per virtual stage (Megatron-LM --num-layers-per-virtual-pipeline-stage ≥ 1; NeMo's GPT-3 175B
recipe runs 12 on pp 8) unless capped; context parallel in powers of two dividing seq_length / 2. A
mixture-of-experts model adds expert parallel sizes dividing num_experts and expert tensor parallel
1 or tp (Megatron-Core's default and the common alternative); a dense model keeps both at 1, and
under a framework that shards ZeRO's state within groups of ranks adds those groups' sizes
(plan.zero_shard_ranks: whole nodes, `_shard_sizes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from itercast.config.deepep_buffer import DEEPEP_EP_SIZES
from itercast.config.model import ModelConfig
from itercast.config.plan import PlanConfig, torchtitan_expert_layout_ok
from itercast.config.system import SystemConfig
from itercast.parallel.plan_table import COLUMNS, RECOMPUTE, PlanTable
from itercast.parallel.schedules import SCHEDULES
from itercast.search.frameworks import Framework, Rule, check_fixed, framework, framework_rules, no_data_parallel

_INTERLEAVED = SCHEDULES.index("interleaved-1f1b")


@dataclass(frozen=True)
class SpaceOptions:
    """What the search may vary. `fixed`: plan field -> the one value it keeps; `framework`: whose plan
    space (frameworks.FRAMEWORKS); `max_virtual_pipeline`: None for every size the layers allow;
    `max_context_parallel`: None for `context_parallel_cap` of the model's sequence."""

    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    global_batch_sizes: tuple[int, ...] = ()  # empty: the base plan's global_batch_size
    max_context_parallel: int | None = None
    max_virtual_pipeline: int | None = None
    framework: str = "megatron-core"
    tp_across_nodes: bool = False
    fixed: dict[str, Any] = field(default_factory=dict)


@dataclass
class SpaceCounts:
    """How many plans each rule removed, in the order the rules apply (for an empty space's message)."""

    generated: int = 0
    removed: dict[str, int] = field(default_factory=dict)

    def add(self, other: SpaceCounts) -> None:
        self.generated += other.generated
        for k, v in other.removed.items():
            self.removed[k] = self.removed.get(k, 0) + v


#: tokens of a sequence each context-parallel rank keeps at the largest size the search tries by default: NeMo's
#: long-sequence runs keep 32,768 (Llama 2 7B at 128K-1M tokens on CP 4-32, NVIDIA/NeMo
#: docs/source/performance/performance_long_sequence.md); the search tries one halving beyond
CP_CAP_TOKENS_PER_RANK = 16384


def context_parallel_cap(seq_length: int) -> int:
    """The largest context parallel size the search tries by default: 8, or for sequences longer than
    8 × CP_CAP_TOKENS_PER_RANK tokens as many ranks as keep CP_CAP_TOKENS_PER_RANK each (1M tokens: 64)."""
    return max(8, seq_length // CP_CAP_TOKENS_PER_RANK)


def imbalance_note(model: ModelConfig, base: PlanConfig) -> str | None:
    """What the search's imbalance rule (_rules; config/job.py _imbalance_problems) leaves out, said where it can:
    an MoE model routed unevenly outside DeepSpeed's layer; None otherwise."""
    if not model.is_moe or base.deepspeed_moe or model.moe_token_imbalance <= 1:
        return None
    return (
        f"model.moe_token_imbalance {model.moe_token_imbalance:g}: plans with fewer expert-parallel ranks than it "
        "are left out (the busiest of ep ranks holds at most min(ep, num_experts / top_k) times the mean), and the "
        "others are priced at it, though it was measured at one expert-parallel size"
    )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _choices(name: str, default: list[int], fixed: dict[str, Any]) -> list[int]:
    """The values of one column: the user's fixed value, or the defaults."""
    if name not in fixed:
        return default
    value = fixed[name]
    if name == "schedule":
        return [SCHEDULES.index(value)]
    if name == "recompute":
        return [RECOMPUTE.index(value)]
    return [int(value or 0)]  # zero_shard_ranks None: the column's 0


def enumerate_plans(
    model: ModelConfig, system: SystemConfig, base: PlanConfig, num_gpus: int, options: SpaceOptions
) -> tuple[PlanTable, SpaceCounts]:
    """Every valid plan on `num_gpus` GPUs; `base` holds the shared fields and the global batch
    (unless options.global_batch_sizes lists several)."""
    fixed, gpn = options.fixed, system.node.gpus_per_node
    fw = framework(options.framework)
    check_fixed(fw, fixed, base.tp_comm_overlap, base.pointwise_kernels, base.dtype)
    batches = list(options.global_batch_sizes) or ([base.global_batch_size] if base.global_batch_size else [])
    if not batches:
        raise ValueError("the search needs plan.global_batch_size (e.g. --set plan.global_batch_size=1536)")
    divisors = _divisors(num_gpus)
    tp_max = num_gpus if options.tp_across_nodes else gpn
    cp_cap = options.max_context_parallel or context_parallel_cap(model.seq_length)
    cp_values = [c for c in divisors if c <= cp_cap and c & (c - 1) == 0]
    axes = {
        "tp": _choices("tensor_parallel", [d for d in divisors if d <= tp_max], fixed),
        "gbs": batches,
        "pp": _choices("pipeline_parallel", [d for d in divisors if model.num_layers % d == 0], fixed),
        "cp": _choices("context_parallel", cp_values, fixed),
        "ep": _choices(
            "expert_parallel", [d for d in divisors if model.experts % d == 0] if model.is_moe else [1], fixed
        ),
        "etp": _choices("expert_tensor_parallel", [d for d in divisors if d <= gpn] if model.is_moe else [1], fixed),
        "vp": _choices("virtual_pipeline", _virtual_sizes(model, base, options.max_virtual_pipeline), fixed),
        "mbs": _choices("micro_batch_size", list(options.micro_batch_sizes), fixed),
        "schedule": _choices("schedule", list(range(len(SCHEDULES))), fixed),
        "zero": _choices("zero_stage", [0, 1, 2, 3], fixed),
        "recompute": _choices("recompute", list(range(len(RECOMPUTE))), fixed),
        "sp": _choices("sequence_parallel", [0, 1], fixed),
        "overlap_grad": _choices("overlap_grad_reduce", [1, 0], fixed),
        "overlap_param": _choices("overlap_param_gather", [1, 0], fixed),
        "shard": _choices("zero_shard_ranks", _shard_sizes(model, fw, num_gpus), fixed),
    }
    counts = SpaceCounts(generated=int(np.prod([len(v) for v in axes.values()])))
    fw_rules = framework_rules(fw, model.is_moe, base.moe_a2a_overlap, base.dtype == "fp8", base.dtype == "bf16")
    pending = _rules(model, base, num_gpus, gpn, axes, fixed, fw_rules)
    cols: dict[str, np.ndarray] = {"tp": np.asarray(axes["tp"], dtype=np.int64)}
    for name in list(axes)[1:]:  # cross one axis in at a time; filter as soon as a rule can
        values = np.asarray(axes[name], dtype=np.int64)
        rows = cols["tp"].shape[0]
        cols = {k: np.repeat(v, values.shape[0]) for k, v in cols.items()}
        cols[name] = np.tile(values, rows)
        if "dp" not in cols and {"tp", "pp", "cp"} <= set(cols):
            cols["dp"] = num_gpus // (cols["tp"] * cols["pp"] * cols["cp"])
        pending, cols = _apply(pending, cols, counts)
    assert not pending, [rule for rule, _ in pending]  # every rule's columns exist by now
    return PlanTable({k: cols[k] for k in COLUMNS}, base), counts


def _shard_sizes(model: ModelConfig, fw: Framework, num_gpus: int) -> list[int]:
    """plan.zero_shard_ranks to try: 0 (ZeRO's state over every data × context rank) and, where the framework
    shards within groups (Megatron-Core's --num-distributed-optimizer-instances, for MoE models too; torchtitan's
    HSDP, for dense models), powers of two; the rules keep groups of whole nodes of 2 ranks or more and
    fewer than dp × cp (a group of one is ZeRO 0's state, a group of all the unset field)."""
    if not fw.zero_shard_stages or (model.is_moe and not fw.zero_shard_moe):
        return [0]
    return [0] + [d for d in _divisors(num_gpus) if d & (d - 1) == 0]


def _virtual_sizes(model: ModelConfig, base: PlanConfig, cap: int | None) -> list[int]:
    """Chunks per pipeline rank: divisors of the layers (the base plan's with fixed uneven stages)."""
    top = model.num_layers if cap is None else cap
    return [v for v in range(1, top + 1) if model.num_layers % v == 0 or v == base.virtual_pipeline]


def _apply(
    rules: list[Rule], cols: dict[str, np.ndarray], counts: SpaceCounts
) -> tuple[list[Rule], dict[str, np.ndarray]]:
    """Apply, in order, every rule whose columns exist; the rules still waiting and the rows kept."""
    waiting = []
    for rule, ok in rules:
        try:
            mask = np.broadcast_to(ok(cols), cols["tp"].shape)
        except KeyError:  # a column it reads is not crossed in yet
            waiting.append((rule, ok))
            continue
        assert mask.dtype == np.bool_, rule  # an integer array would index rows, not select them
        counts.removed[rule] = counts.removed.get(rule, 0) + int((~mask).sum())
        cols = {k: v[mask] for k, v in cols.items()}
    return waiting, cols


def _rules(
    model: ModelConfig,
    base: PlanConfig,
    gpus: int,
    gpn: int,
    axes: dict[str, list[int]],
    fixed: dict[str, Any],
    framework_specific: list[Rule],
) -> list[Rule]:
    """Job validation's rules over columns, in order, then the framework's; then switches that would
    change nothing are kept at their first value only (one plan, not two identical ones)."""

    def micro(c: dict[str, np.ndarray]) -> np.ndarray:
        return c["gbs"] // (c["mbs"] * c["dp"])

    def schedule_ok(c: dict[str, np.ndarray]) -> np.ndarray:
        ok = np.where(c["pp"] == 1, c["schedule"] == SCHEDULES.index("1f1b"), True)
        ok &= (c["vp"] == 1) == (c["schedule"] != _INTERLEAVED)
        return ok & ((c["schedule"] != _INTERLEAVED) | (micro(c) % c["pp"] == 0))

    first = {k: v[0] for k, v in axes.items()}
    want_dp = int(fixed.get("data_parallel") or 0)
    uneven = np.bool_(base.stage_layers is not None)
    moe = np.bool_(model.is_moe)  # a numpy bool: `~` negates it (a Python bool's is −2)
    deepspeed = np.bool_(base.deepspeed_moe)  # job.py _deepspeed_moe_problems
    titan = np.bool_(model.is_moe and base.torchtitan_moe)  # job.py _torchtitan_expert_problems
    deepep = np.bool_(base.moe_token_dispatcher == "torchtitan_deepep")
    flex = np.bool_(model.is_moe and base.moe_token_dispatcher == "flex")  # job.py _expert_problems
    flex_deepep = np.bool_(base.moe_flex_backend == "deepep")
    padded = np.bool_(model.is_moe and model.moe_capacity_factor is not None)

    def capacity(mbs: np.ndarray) -> np.ndarray:
        """An expert's slots in DeepSpeed's MOELayer at micro-batch `mbs` (context parallelism 1 there); 0 without a
        capacity factor."""
        if not padded:
            return np.zeros_like(mbs)
        return np.asarray(model.deepspeed_capacity(mbs * model.seq_length)).astype(np.int64)

    shard_fixed = np.bool_("zero_shard_ranks" in fixed)
    fits_stages = base.stage_layers is None or len(base.stage_layers) == base.pipeline_parallel * base.virtual_pipeline
    # Megatron's selective recompute of fused attention runs its forward again and frees nothing
    # the projection does not keep (transformer_ops.layer_backward, memory._recompute_kept): the plan
    # without recompute holds as much and is faster. Not so torchtitan's per-op selective recompute
    same_recompute = (
        base.flash_attention
        and base.selective_recompute == "modules"
        and base.recompute_modules == ["core_attn"]
        and RECOMPUTE.index("none") in axes["recompute"]
    )
    return [
        ("GPU count not divisible by tp × pp × cp", lambda c: gpus % (c["tp"] * c["pp"] * c["cp"]) == 0),
        (
            "data_parallel differs from the fixed value",
            lambda c: (want_dp == 0) | (c["dp"] == want_dp),
        ),
        (
            "model.num_attention_heads / num_query_groups not divisible by tp",
            lambda c: (model.num_attention_heads % c["tp"] == 0) & (model.kv_heads % c["tp"] == 0),
        ),
        ("model.num_layers not divisible by pp × vp", lambda c: (model.num_layers % (c["pp"] * c["vp"]) == 0) | uneven),
        (
            "plan.stage_layers fixes pipeline_parallel × virtual_pipeline (set both with it)",
            lambda c: (
                ~uneven | ((c["pp"] == base.pipeline_parallel) & (c["vp"] == base.virtual_pipeline) & fits_stages)
            ),
        ),
        (
            "model.seq_length not divisible by 2 × cp",
            lambda c: (c["cp"] == 1) | (model.seq_length % (2 * c["cp"]) == 0),
        ),
        ("global_batch_size not divisible by mbs × dp", lambda c: c["gbs"] % (c["mbs"] * c["dp"]) == 0),
        (
            "sequence parallelism: model.seq_length not divisible by cp × tp",
            lambda c: (c["sp"] == 0) | (model.seq_length % (c["cp"] * c["tp"]) == 0),
        ),
        ("schedule: interleaving needs vp > 1 and micro-batches divisible by pp", schedule_ok),
        (
            "plan.overlap_p2p_comm false: Megatron-LM interleaves more than 2 pipeline stages only",
            lambda c: np.bool_(base.overlap_p2p_comm) | (c["schedule"] != _INTERLEAVED) | (c["pp"] > 2),
        ),
        ("sequence_parallel needs tp > 1", lambda c: (c["sp"] == 0) | (c["tp"] > 1)),
        ("model.num_experts not divisible by ep", lambda c: model.experts % c["ep"] == 0),
        (  # config/job.py _imbalance_problems
            "model.moe_token_imbalance above what ep ranks can hold, min(ep, num_experts / top_k)",
            lambda c: (
                np.bool_(base.deepspeed_moe or not model.is_moe)
                | (model.moe_token_imbalance <= np.minimum(c["ep"], model.experts / max(model.moe_top_k, 1)))
            ),
        ),
        (
            "ep × etp does not divide tp × cp × dp",
            lambda c: (c["tp"] * c["cp"] * c["dp"]) % (c["ep"] * c["etp"]) == 0,
        ),
        (
            "expert_tensor_parallel is 1 or tp in the search",
            lambda c: (c["etp"] == 1) | (c["etp"] == c["tp"]) | ("expert_tensor_parallel" in fixed),
        ),
        (
            "MoE with tp > 1 needs sequence_parallel (DeepSpeed's MoE layer: none)",
            lambda c: ~moe | (c["tp"] == 1) | (c["sp"] == (0 if deepspeed else 1)),
        ),
        (
            "torchtitan's expert layouts (distributed/parallel_dims.py)",
            lambda c: ~titan | torchtitan_expert_layout_ok(c["ep"], c["etp"], c["tp"], c["cp"], c["dp"], deepep),
        ),
        (
            "Megatron-Core's flex dispatcher: expert_parallel > 1, expert_tensor_parallel 1, over DeepEP a size it has",
            lambda c: ~flex | ((c["ep"] > 1) & (c["etp"] == 1) & (~flex_deepep | np.isin(c["ep"], DEEPEP_EP_SIZES))),
        ),
        (
            "Megatron-Core's experts with biases: expert_tensor_parallel 1 ('Bias in Moe is only supported when "
            "ETP==1')",
            lambda c: ~(moe & np.bool_(model.biases)) | titan | deepspeed | (c["etp"] == 1),
        ),
        (
            "DeepSpeed's MoE layer: expert_tensor_parallel 1 or tp",
            lambda c: ~moe | ~deepspeed | (c["etp"] == 1) | (c["etp"] == c["tp"]),
        ),
        (
            "DeepSpeed's MoE layer: every expert's capacity divisible by tp (mappings.py _drop_tokens)",
            lambda c: ~deepspeed | (capacity(c["mbs"]) % c["tp"] == 0),
        ),
        (
            "plan.tp_comm_overlap needs sequence_parallel with tp > 1",
            lambda c: (not base.tp_comm_overlap) | (c["tp"] == 1) | (c["sp"] == 1),
        ),
        ("context_parallel needs flash attention", lambda c: (c["cp"] == 1) | base.flash_attention),
        (
            "plan.zero_shard_ranks must divide data_parallel × context_parallel and be a multiple of context_parallel",
            lambda c: (
                (c["shard"] == 0)
                | (((c["dp"] * c["cp"]) % np.maximum(c["shard"], 1) == 0) & (c["shard"] % c["cp"] == 0))
            ),
        ),
        (
            "plan.zero_shard_ranks: tp × shard not divisible by ep × etp (the experts' copies split their ranks)",
            lambda c: (c["shard"] == 0) | ~moe | ((c["tp"] * c["shard"]) % (c["ep"] * c["etp"]) == 0),
        ),
        (
            "search: ZeRO shard groups of whole nodes, of 2 to fewer than data_parallel × context_parallel ranks",
            lambda c: (
                shard_fixed
                | (c["shard"] == 0)
                | (((c["shard"] * c["tp"]) % gpn == 0) & (c["shard"] > 1) & (c["shard"] < c["dp"] * c["cp"]))
            ),
        ),
        *framework_specific,
        (
            "same plan (param-gather overlap acts only with ZeRO 1-2)",
            lambda c: (c["zero"] == 1) | (c["zero"] == 2) | (c["overlap_param"] == first["overlap_param"]),
        ),
        (
            "same plan (ZeRO-3 gathers and reduce-scatters layer by layer ahead: the overlap switches do not act)",
            lambda c: (
                (c["zero"] != 3)
                | ((c["overlap_grad"] == first["overlap_grad"]) & (c["overlap_param"] == first["overlap_param"]))
            ),
        ),
        (
            "dominated (selective recompute of fused attention frees nothing and runs attention again)",
            lambda c: (c["recompute"] != RECOMPUTE.index("selective")) | (not same_recompute),
        ),
        (
            "same plan (no data parallelism: nothing to reduce or shard)",
            lambda c: (
                ~no_data_parallel(c, model.is_moe)
                | ((c["overlap_grad"] == first["overlap_grad"]) & (c["zero"] == first["zero"]))
            ),
        ),
    ]
