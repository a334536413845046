"""What a DLRM is and how a job runs it: the model (tables, MLPs, interaction), each table's shard
(TorchRec's strategies and the ranks that hold it), the plan section of a job file and the validated
job (model, plan, system), with every problem of a user's sharding named.

Sources: Naumov et al. 2019 (DLRM); TorchRec's sharding types (table-wise, column-wise, row-wise,
data-parallel); Wang et al. 2021 (DCN-V2 low-rank cross layers).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, Field, model_validator

from itercast.config.job import merge_fields, parse_section, validated
from itercast.config.presets import preset, preset_names
from itercast.config.strict import STRICT, Width
from itercast.config.system import SystemConfig
from itercast.errors import ConfigError

Strategy = Literal["table_wise", "column_wise", "row_wise", "data_parallel"]
STRATEGIES: tuple[Strategy, ...] = ("table_wise", "column_wise", "row_wise", "data_parallel")


class EmbeddingTable(BaseModel):
    model_config = STRICT

    name: str
    num_rows: Annotated[int, Field(gt=0, le=10**12)]  # production tables reach billions of rows
    embedding_dim: Width
    pooling_factor: Annotated[float, Field(gt=0, le=100_000)] = Field(description="Lookups per sample (multi-hot).")
    zipf_alpha: Annotated[float, Field(ge=0, le=10)] = Field(
        0.0, description="Index skew: Zipf exponent of the row popularity (0: uniform draws)."
    )


class DLRMConfig(BaseModel):
    """A DLRM: dense features through the bottom MLP, sparse features through embedding bags, an
    interaction, the top MLP."""

    model_config = STRICT

    name: str = "custom"
    dense_features: Width
    bottom_mlp: Annotated[tuple[Width, ...], Field(strict=False, min_length=1)]
    top_mlp: Annotated[tuple[Width, ...], Field(strict=False, min_length=1)]
    tables: Annotated[tuple[EmbeddingTable, ...], Field(strict=False, min_length=1, max_length=100_000)]
    interaction: Literal["dot", "dcnv2"] = "dot"
    dcn_layers: Width = 3
    dcn_low_rank: Width = 512
    input_distribution: bool = Field(
        True,
        description="TorchRec's input distribution: each rank's indices of a table go to the ranks that hold "
        "its shards in an all-to-all before the lookups (false: every owner already holds them).",
    )
    exchange: Literal["torchrec", "point_to_point"] = Field(
        "torchrec",
        description="How the job's operators exchange pooled embeddings and dense gradients (the host's "
        "operator counts, workloads/dlrm/host.ops_per_task, and the dense copies, step.py): torchrec, "
        "TorchRec's one all-to-all (or reduce-scatter / all-gather) per exchange, FBGEMM's one fused backward "
        "and update per sharded table, PyTorch DDP's gradient buckets; point_to_point, the plain "
        "torch.distributed emulation of tools/measure_dlrm_sharding.py (a cat and an isend per peer, one "
        "flat buffer of dense gradients, the updates' gathers), which this project's CPU measurements ran.",
    )

    @model_validator(mode="after")
    def _check(self) -> DLRMConfig:
        # each offending table also named by its field's path, so that the --set which gave it is named too
        # (config/job.py blame_overrides)
        wrong = [i for i, t in enumerate(self.tables) if t.embedding_dim != self.bottom_mlp[-1]][:5]
        if wrong:
            got = ", ".join(f"{self.tables[i].name}({self.tables[i].embedding_dim})" for i in wrong)
            raise ValueError(
                f"embedding_dim must equal the bottom MLP's output ({self.bottom_mlp[-1]}): the interaction combines "
                f"them; got tables {got} ({', '.join(f'`model.tables.{i}.embedding_dim`' for i in wrong)})"
            )
        twice = sorted(n for n, count in Counter(t.name for t in self.tables).items() if count > 1)[:5]
        if twice:
            fields = [f"`model.tables.{i}.name`" for i, t in enumerate(self.tables) if t.name in twice][:10]
            raise ValueError(f"table names must be unique; got {', '.join(twice)} more than once ({', '.join(fields)})")
        return self

    @property
    def eager_update(self) -> bool:
        """The step updates each sharded table with itercast::rowwise_adagrad_update in eager PyTorch (the
        point-to-point emulation of tools/measure_dlrm_sharding.py), not with FBGEMM's fused backward."""
        return self.exchange == "point_to_point"

    @property
    def dim(self) -> int:
        return self.bottom_mlp[-1]

    def interaction_width(self) -> int:
        """Width of the interaction's output, the top MLP's input."""
        f = len(self.tables) + 1
        return f * (f - 1) // 2 + self.dim if self.interaction == "dot" else f * self.dim

    def mlp_layers(self) -> list[tuple[int, int]]:
        """(in, out) of every MLP layer: bottom, DCN cross layers (two low-rank factors), top."""
        bottom = list(zip((self.dense_features, *self.bottom_mlp[:-1]), self.bottom_mlp, strict=True))
        top = list(zip((self.interaction_width(), *self.top_mlp[:-1]), self.top_mlp, strict=True))
        cross: list[tuple[int, int]] = []
        if self.interaction == "dcnv2":
            width = (len(self.tables) + 1) * self.dim
            cross = [(width, self.dcn_low_rank), (self.dcn_low_rank, width)] * self.dcn_layers
        return bottom + cross + top

    def mlp_params(self) -> int:
        return sum(i * o + o for i, o in self.mlp_layers())


@dataclass(frozen=True)
class Shard:
    """Where one table lives: its strategy and ranks (column-wise: the ranks sharing its columns)."""

    strategy: Strategy
    ranks: tuple[int, ...]


def check_sharding(model: DLRMConfig, plan: dict[str, Shard], world: int) -> list[str]:
    """What is wrong with a user's sharding: unknown or missing tables, ranks that do not exist,
    strategies and their rank counts, column splits that do not divide the dimension."""
    names = {t.name: t for t in model.tables}
    problems = [f"sharding names table {n!r}, which the model does not have" for n in plan if n not in names]
    problems += [f"table {n!r} has no sharding" for n in names if n not in plan]
    everyone = tuple(range(world))
    for name, shard in plan.items():
        bad = [r for r in shard.ranks if not 0 <= r < world]
        if bad:
            problems.append(f"table {name!r}: ranks {bad} do not exist (ranks 0..{world - 1})")
        if shard.strategy not in STRATEGIES:
            problems.append(f"table {name!r}: strategy {shard.strategy!r}; expected one of {', '.join(STRATEGIES)}")
        elif shard.strategy == "table_wise" and len(shard.ranks) != 1:
            problems.append(f"table {name!r}: table_wise takes one rank; got {list(shard.ranks)}")
        elif shard.strategy in ("row_wise", "data_parallel") and shard.ranks != everyone:
            problems.append(f"table {name!r}: {shard.strategy} spans every rank 0..{world - 1}")
        elif shard.strategy == "column_wise" and len(set(shard.ranks)) < len(shard.ranks):
            repeated = sorted({r for r in shard.ranks if shard.ranks.count(r) > 1})
            problems.append(  # TorchRec's column_wise(ranks) may reuse a rank; the step prices one shard a rank
                f"table {name!r}: column_wise on ranks {list(shard.ranks)} puts several shards on rank(s) {repeated}, "
                "which itercast does not price (one column shard a rank): give each shard its own rank"
            )
        elif shard.strategy == "column_wise" and name in names and names[name].embedding_dim % len(shard.ranks):
            problems.append(
                f"table {name!r}: embedding_dim {names[name].embedding_dim} not divisible by its "
                f"{len(shard.ranks)} column-wise ranks"
            )
    return problems


class ShardSpec(BaseModel):
    """One table's sharding in a job file: a TorchRec strategy and the ranks that hold it."""

    model_config = STRICT

    strategy: Strategy
    ranks: Annotated[tuple[Annotated[int, Field(ge=0)], ...], Field(strict=False, min_length=1, max_length=1 << 20)]


class DLRMPlan(BaseModel):
    """How a DLRM step runs: samples per GPU and where each table lives."""

    model_config = STRICT

    batch_per_rank: Annotated[int, Field(ge=1, le=10_000_000)] = Field(4096, description="Samples per GPU per step.")
    sharding: dict[str, ShardSpec] | None = Field(
        None,
        description="Each table's strategy and ranks (`itercast shard` prints one); absent: the sharding "
        "planner's fastest.",
    )


def dlrm_model(fields: dict[str, Any], source: str = "<input>", base: dict[str, Any] | None = None) -> DLRMConfig:
    """A DLRM model section: `preset: NAME` (or `base`, a file's fields) plus overrides merged over it
    (config/job.py merge_fields: `tables.0.X` one table's field), or every field; problems name the field."""
    fields = dict(fields)
    name = fields.pop("preset", None)
    if name is not None:
        base = preset("dlrm", str(name))
    if base is not None:
        try:
            fields = merge_fields(base, fields, "model.")
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return validated(DLRMConfig, fields, "model", source)


def is_dlrm_model(fields: dict[str, Any]) -> bool:
    """Whether a raw model section describes a DLRM (a DLRM preset, or tables of embeddings)."""
    return "tables" in fields or str(fields.get("preset")) in preset_names("dlrm")


#: the most GPUs a DLRM job may have: its step is simulated rank by rank (every rank's lookups and exchanges), 31 s
#: and 0.5 GB at 16,384 GPUs (dlrm-small, 2,048 nodes of 8; a user probe, session 61), and 12,500 nodes did not
#: finish in 2 minutes
MAX_DLRM_GPUS = 16_384


@dataclass(frozen=True)
class DLRMJob:
    """A validated DLRM, its plan and the system it runs on (every GPU a rank)."""

    model: DLRMConfig
    plan: DLRMPlan
    system: SystemConfig

    @classmethod
    def from_dicts(
        cls, model: dict[str, Any], plan: dict[str, Any], system: dict[str, Any], source: str = "<input>"
    ) -> DLRMJob:
        dlrm = dlrm_model(model, source)
        p = validated(DLRMPlan, plan, "plan", source)
        sys_cfg = cast(SystemConfig, parse_section("system", system, source))
        if sys_cfg.num_gpus > MAX_DLRM_GPUS:
            raise ConfigError(
                f"{source}: system: a DLRM step is simulated rank by rank, on at most {MAX_DLRM_GPUS:,} GPUs; got "
                f"{sys_cfg.num_gpus:,} ({sys_cfg.num_nodes:,} nodes)"
            )
        if p.sharding is not None:
            problems = check_sharding(
                dlrm, {n: Shard(s.strategy, s.ranks) for n, s in p.sharding.items()}, sys_cfg.num_gpus
            )
            if problems:
                raise ConfigError("\n".join(f"{source}: plan.sharding: {x}" for x in problems))
        return cls(dlrm, p, sys_cfg)

    def shards(self) -> dict[str, Shard] | None:
        """The plan's sharding, or None: the planner chooses."""
        s = self.plan.sharding
        return None if s is None else {n: Shard(v.strategy, v.ranks) for n, v in s.items()}

    def to_dict(self) -> dict[str, Any]:
        return {s: getattr(self, s).model_dump(mode="json") for s in ("model", "plan", "system")}
