"""A DLRM training step under an embedding-table sharding, on the step graph and simulator of
DESIGN.md §3, every rank simulated (the ranks' embedding work differs with the sharding).

Sources: Naumov et al. 2019 (DLRM); TorchRec's sharding types (table-wise, column-wise, row-wise,
data-parallel); Mudigere et al. 2022 (pooled embeddings exchanged by all-to-all); Wang et al. 2021
(DCN-V2 low-rank cross layers). W ranks, local batch b, global batch B = W·b, fp32 tables with
row-wise Adagrad fused into the backward (TorchRec's default), fp32 MLPs with Adam.

One step, per rank:
- forward: the input distribution (TorchRec's KeyedJaggedTensor all-to-all: a shard's owner
  receives its lookups' int64 indices and an int32 length per bag, the busiest rank sets the pace;
  model.input_distribution false when every owner already holds its indices); the bottom MLP (b
  rows) beside it; the lookups of the rank's shards, priced as memory traffic on
  the cost model (every looked-up row read, pooled vectors written) or on a calibration's operator
  models (embedding_seconds); an all-to-all of pooled vectors
  (a table- or column-wise shard serves all B samples: its rank sends B·d_shard·4 bytes, the busiest
  rank sets the pace) and a reduce-scatter of row-wise partial sums (B·d·4); the interaction (dot:
  pairwise products of the F = tables + 1 vectors; dcnv2: low-rank cross layers); the top MLP.
- backward: the mirror; the pooled gradients come back by all-to-all (row-wise: all-gather); each
  shard's backward reads its lookups' gradients and updates its distinct rows (weights and
  Adagrad state read and written): distinct rows from the index distribution (uniform, or Zipf with
  table.zipf_alpha; costs/op_model.py); a data-parallel table's dense gradient is all-reduced with
  the MLPs' gradients beside the other tables' backward, through PyTorch DDP's buckets (copied in
  and divided by the world size before, copied out after: 4 and 2 times the bytes, as DDP does
  without gradient_as_bucket_view); then Adam on the MLPs and the replicas' dense row-wise Adagrad.
Collectives start when every rank is ready (the simulator's rendezvous).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import numpy as np
from pydantic import BaseModel, Field, ValidationError, model_validator

from itercast.config.job import parse_section
from itercast.config.presets import preset, preset_names
from itercast.config.strict import STRICT, Width
from itercast.config.system import SystemConfig
from itercast.costs.analytic import AnalyticCostModel
from itercast.costs.aten_ops import EMBEDDING_UPDATE, OpFeatures, lookup_features
from itercast.costs.op_model import IndexStats, OperatorCostModel, zipf_hot_fraction
from itercast.errors import ConfigError
from itercast.graph.execgraph import Category, ExecGraph, GraphBuilder
from itercast.hardware.topology import place_group
from itercast.sim.engine import SimResult, simulate

Strategy = Literal["table_wise", "column_wise", "row_wise", "data_parallel"]
STRATEGIES: tuple[Strategy, ...] = ("table_wise", "column_wise", "row_wise", "data_parallel")
F32 = 4  # bytes: fp32 tables, gradients and pooled vectors
ADAGRAD_ROW_BYTES = 4  # row-wise Adagrad: one fp32 state per row
ADAM_BYTES = 16  # an MLP parameter: fp32 weight, gradient, Adam m and v
LOOKUP_OP = "aten::_embedding_bag"  # the operator a calibrated forward lookup is priced as
INDEX_BYTES, LENGTH_BYTES = 8, 4  # a KeyedJaggedTensor's int64 indices and int32 length per bag (TorchRec)


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

    @model_validator(mode="after")
    def _check(self) -> DLRMConfig:
        wrong = [t.name for t in self.tables if t.embedding_dim != self.bottom_mlp[-1]]
        if wrong:
            raise ValueError(
                f"tables {', '.join(wrong[:5])}: embedding_dim must equal the bottom MLP's output "
                f"({self.bottom_mlp[-1]}): the interaction combines them"
            )
        if len({t.name for t in self.tables}) != len(self.tables):
            raise ValueError("table names must be unique")
        return self

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


@dataclass(frozen=True)
class ShardWork:
    """One table's work on one rank per step: lookups, rows and width held, bytes it exchanges."""

    lookups: float
    rows: float
    dim: int
    bags: float  # the pooled vectors its lookups are summed into (a row-wise shard's are partial sums)
    replica: bool = False  # data-parallel: a dense gradient, all-reduced, and the whole table updated

    @property
    def pooled_out_bytes(self) -> float:
        """Pooled vectors this rank sends (all-to-all or reduce-scatter); a replica keeps its own."""
        return 0.0 if self.replica else self.bags * self.dim * F32


def shard_work(table: EmbeddingTable, shard: Shard, rank: int, world: int, batch: int) -> ShardWork | None:
    """The work of `table` on `rank` under `shard` (None if the rank holds none of it); `batch` is the
    local batch b."""
    if rank not in shard.ranks:
        return None
    B = batch * world
    d, P = table.embedding_dim, table.pooling_factor
    if shard.strategy == "table_wise":
        return ShardWork(B * P, table.num_rows, d, B)
    if shard.strategy == "column_wise":
        part = d // len(shard.ranks)
        return ShardWork(B * P, table.num_rows, part, B)
    if shard.strategy == "row_wise":
        return ShardWork(B * P / world, table.num_rows / world, d, B)
    return ShardWork(batch * P, table.num_rows, d, batch, replica=True)  # data_parallel: the local batch only


def index_stats(table: EmbeddingTable, work: ShardWork, counts: np.ndarray | IndexStats | None = None) -> IndexStats:
    """What the shard's lookups are: as given (an IndexStats, e.g. IndexStats.from_sequence of a real
    sample in its order), from a sample of real indices (`counts`, load_index_sample),
    else from the table's named distribution (uniform or Zipf). A row-wise shard of 1/k of the rows
    sees 1/k of the distinct rows of k times its lookups (and between two lookups of one of its
    rows, 1/k of the table's distinct rows); its most loaded shard holds the most frequent row,
    whose lookups are then k times the share they have of the whole table's."""
    if isinstance(counts, IndexStats):
        return counts
    k = table.num_rows / work.rows
    lookups, row_bytes = max(1, round(work.lookups)), work.dim * F32
    if counts is not None:
        lookups_all = max(1, round(work.lookups * k))
        whole = IndexStats.sampled(counts, lookups_all, row_bytes / k)
        return IndexStats(whole.unique_fraction, min(1.0, k * whole.hot_fraction), whole.reuse_beyond)
    shard = IndexStats.zipf(max(1, round(work.rows)), lookups, table.zipf_alpha, row_bytes)
    if k == 1:
        return shard
    hot = zipf_hot_fraction(table.num_rows, table.zipf_alpha)  # alpha 0: 1 / rows
    return IndexStats(shard.unique_fraction, min(1.0, k * hot), shard.reuse_beyond)


def embedding_seconds(
    costs: AnalyticCostModel,
    table: EmbeddingTable,
    work: ShardWork,
    ops: OperatorCostModel | None = None,
    counts: np.ndarray | IndexStats | None = None,
) -> tuple[float, float]:
    """(forward, backward) seconds of one shard.

    Forward reads every looked-up row and writes the pooled vectors. Backward reads the pooled
    gradients and writes each lookup's gradient row; a sharded table then runs the fused row-wise
    Adagrad update (TorchRec): every distinct row's gradient summed, the row and its state read and
    written; a replica zeroes its dense gradient (rows·d·4 bytes) and accumulates the distinct rows
    into it (its update is replica_update_bytes, after the all-reduce). Priced as memory traffic on
    the cost model, except where `ops` (a calibration's `operators`, fitted on `itercast profile`'s
    embedding microbenchmarks) has a model of the operator: the lookup (aten::_embedding_bag) and
    the update (itercast::rowwise_adagrad_update), each at this shard's rows, width, lookups and
    distinct-row fraction. PyTorch's aten::_embedding_bag_backward, which the profile also
    measures, writes a dense table-sized gradient: it is not the sparse update and is not used.
    `counts`: the row frequencies of a sample of the table's real indices (load_index_sample)."""
    pooled = work.bags * work.dim * F32
    index = index_stats(table, work, counts)
    distinct = index.unique_fraction * max(1, round(work.lookups))
    per_lookup = work.lookups * work.dim * F32
    if ops is not None and ops.has_model(LOOKUP_OP):
        fwd_s = ops.price(
            LOOKUP_OP, lookup_features("embedding_bag_fwd", work.rows, work.dim, work.lookups, work.bags), index
        )
    else:
        fwd_s = float(costs.memory_s("elementwise", per_lookup + pooled))
    if work.replica:
        return fwd_s, float(
            costs.memory_s("elementwise", pooled + per_lookup + (work.rows + 2 * distinct) * work.dim * F32)
        )
    if ops is not None and ops.has_model(EMBEDDING_UPDATE):
        update_s = ops.price(
            EMBEDDING_UPDATE,
            lookup_features("embedding_bag_update", work.rows, work.dim, work.lookups, work.lookups),
            index,
        )
        return fwd_s, float(costs.memory_s("elementwise", pooled + per_lookup)) + update_s
    return fwd_s, float(
        costs.memory_s("elementwise", pooled + per_lookup + distinct * 2 * (work.dim * F32 + ADAGRAD_ROW_BYTES))
    )


#: a shard's lookups beyond this many times the profile's largest call are reported (beyond_profile)
EXTRAPOLATION_FACTOR = 2.0


def beyond_profile(model: DLRMConfig, world: int, batch_per_rank: int, calibration: dict[str, Any] | None) -> str:
    """A warning (or "") when a table-wise owner's lookups per call, its pooling factor × every
    rank's samples, exceed EXTRAPOLATION_FACTOR × the largest call the calibration's embedding
    operator models were profiled at: their linear models are then extrapolating (a calibration
    fitted before the largest call was recorded is not checked)."""
    fits = (calibration or {}).get("operators", {}).get("models", {})
    profiled = [f["max_lookups"] for k, f in fits.items() if k.startswith((LOOKUP_OP, EMBEDDING_UPDATE))]
    profiled = [v for v in profiled if v]
    if not profiled:
        return ""
    table = max(model.tables, key=lambda t: t.pooling_factor)
    most = table.pooling_factor * batch_per_rank * world
    if most <= EXTRAPOLATION_FACTOR * min(profiled):
        return ""
    return (
        f"{table.name}'s owner looks up {most:,.0f} rows per call, {most / min(profiled):.1f}× the largest call the "
        f"calibration's embedding models were profiled at ({min(profiled):,.0f}): their prices there are "
        "extrapolated (itercast profile run --families embedding --embedding-batches …, then itercast calibrate)"
    )


def replica_update_bytes(table: EmbeddingTable) -> float:
    """A data-parallel table's dense row-wise Adagrad step: the all-reduced gradient read, every
    row and its state read and written."""
    return table.num_rows * (3 * table.embedding_dim * F32 + 2 * ADAGRAD_ROW_BYTES)


@dataclass(frozen=True)
class DLRMStep:
    sim: SimResult  # the simulated step: every rank's timeline
    memory_per_rank_bytes: list[float]
    capacity_bytes: float

    @property
    def step_time_s(self) -> float:
        return self.sim.step_time_s

    @property
    def graph(self) -> ExecGraph:
        return self.sim.graph

    @property
    def memory_per_gpu_bytes(self) -> float:
        return max(self.memory_per_rank_bytes)

    @property
    def fits(self) -> bool:
        return self.memory_per_gpu_bytes <= self.capacity_bytes


def memory_per_rank(model: DLRMConfig, plan: dict[str, Shard], world: int) -> list[float]:
    """Bytes each rank holds (memory_parts_per_rank summed)."""
    return [sum(parts.values()) for parts in memory_parts_per_rank(model, plan, world)]


def memory_parts_per_rank(model: DLRMConfig, plan: dict[str, Shard], world: int) -> list[dict[str, float]]:
    """Bytes each rank holds as weights, gradients and optimizer state: its shards' rows (fp32) and
    row-wise Adagrad state (a replica also its dense fp32 gradient), and the MLPs with Adam (fp32
    weight and gradient, m and v); tables the plan does not name are left out. With more than one
    rank, DDP's buckets: another copy of every dense gradient (dlrm_step)."""
    bucket = F32 if world > 1 else 0
    mlp = model.mlp_params()
    held = [
        {"weights": mlp * F32, "gradients": mlp * (F32 + bucket) * 1.0, "optimizer": mlp * (ADAM_BYTES - 2 * F32)}
        for _ in range(world)
    ]
    for t in model.tables:
        if t.name not in plan:
            continue
        for r in range(world):
            work = shard_work(t, plan[t.name], r, world, 1)
            if work is not None:
                held[r]["weights"] += work.rows * work.dim * F32
                held[r]["gradients"] += work.rows * work.dim * (F32 + bucket) if work.replica else 0
                held[r]["optimizer"] += work.rows * ADAGRAD_ROW_BYTES
    return held


def _gemm(batch: int, m: int, n: int, k: int, layout: str = "nn") -> OpFeatures:
    return OpFeatures("gemm", 2.0 * batch * m * n * k, {"batch": batch, "m": m, "n": n, "k": k, "layout": layout})


def mlp_seconds(
    costs: AnalyticCostModel, ops: OperatorCostModel | None, b: int, layers: list[tuple[int, int]]
) -> tuple[float, float]:
    """(forward, backward) seconds of Linear + ReLU layers (in, out) on `b` rows: the forward GEMM
    x·Wᵀ and the activation written; backward the input gradient (g·W) and weight gradient (gᵀ·x)
    GEMMs and the activation's gradient. GEMMs on the operator models of a calibration where it has
    them (aten::addmm / aten::mm, shape- and layout-aware: a DLRM's skinny layers run far below
    peak), else on the cost model's curve (backward: twice the forward)."""
    fwd = bwd = 0.0
    for i, o in layers:
        act = float(costs.memory_s("activation", 2.0 * b * o * F32))
        if ops is not None and ops.has_model("aten::mm"):
            fwd += ops.price("aten::addmm", _gemm(1, b, o, i, "nt")) + act
            bwd += ops.price("aten::mm", _gemm(1, b, i, o)) + ops.price("aten::mm", _gemm(1, o, i, b, "tn")) + act
        else:
            gemm = float(costs.gemm_s(2.0 * b * i * o))
            fwd += gemm + act
            bwd += 2 * (gemm + act)
    return fwd, bwd


def dlrm_step(
    model: DLRMConfig,
    system: SystemConfig,
    plan: dict[str, Shard],
    batch_per_rank: int,
    calibration: dict[str, Any] | None = None,
    index_counts: dict[str, np.ndarray] | None = None,
) -> DLRMStep:
    """Simulate one step of `model` on `system` (every GPU a rank) under the sharding `plan` (tables
    it does not name are left out: the planner prices partial plans). `calibration`: a calibration
    document (profile/calibrate.py) for the GEMM, memory and collective curves and, with an
    `operators` section, the operator models of the lookups, updates and GEMMs; the built-in curves
    when None. `index_counts`: per table, the row frequencies of a sample of its real indices
    (load_index_sample); tables without one use their named distribution."""
    world, b = system.num_gpus, batch_per_rank
    costs = AnalyticCostModel(system, "fp32", calibration)
    ops = OperatorCostModel(calibration["operators"]) if calibration and "operators" in calibration else None
    group = place_group(world, 1, system.node.gpus_per_node)

    layers, f = model.mlp_layers(), len(model.tables) + 1
    bottom_fwd, bottom_bwd = mlp_seconds(costs, ops, b, layers[: len(model.bottom_mlp)])
    top_fwd, top_bwd = mlp_seconds(costs, ops, b, layers[len(model.bottom_mlp) :])
    if model.interaction == "dot":  # pairwise dot products: a batched GEMM of F × d by d × F; backward two
        if ops is not None and ops.has_model("aten::bmm"):
            top_fwd += ops.price("aten::bmm", _gemm(b, f, f, model.dim))
            top_bwd += 2 * ops.price("aten::bmm", _gemm(b, f, model.dim, f))
        else:
            top_fwd += float(costs.gemm_s(2.0 * b * f * f * model.dim))
            top_bwd += 2 * float(costs.gemm_s(2.0 * b * f * f * model.dim))
    emb_fwd, emb_bwd, replica_bwd, a2a_bytes, index_bytes = ([0.0] * world for _ in range(5))
    rw_bytes = dp_bytes = update_bytes = 0.0
    for t in model.tables:
        shard = plan.get(t.name)
        if shard is None:
            continue
        if shard.strategy == "row_wise":
            rw_bytes += b * world * t.embedding_dim * F32
        if shard.strategy == "data_parallel":
            dp_bytes += t.num_rows * t.embedding_dim * F32
            update_bytes += replica_update_bytes(t)
        for r in shard.ranks:
            work = shard_work(t, shard, r, world, b)
            assert work is not None
            fwd, bwd = embedding_seconds(costs, t, work, ops, (index_counts or {}).get(t.name))
            emb_fwd[r] += fwd
            (replica_bwd if work.replica else emb_bwd)[r] += bwd
            if shard.strategy in ("table_wise", "column_wise"):
                a2a_bytes[r] += work.pooled_out_bytes
            if model.input_distribution and not work.replica:  # the shard's indices and bag lengths arrive
                index_bytes[r] += work.lookups * INDEX_BYTES + work.bags * LENGTH_BYTES
    exchange = costs.collective_s("alltoall", max(a2a_bytes), group)
    index_exchange = costs.collective_s("alltoall", max(index_bytes), group)
    fwd_comm = exchange + costs.collective_s("reduce_scatter", rw_bytes, group)
    bwd_comm = exchange + costs.collective_s("all_gather", rw_bytes, group)
    # PyTorch DDP, through which TorchRec's data-parallel tables and the MLPs go, keeps gradients
    # apart from its buckets (gradient_as_bucket_view False, the default): each dense gradient is
    # copied into its bucket and divided by the world size before the all-reduce, copied back after
    dense_bytes = model.mlp_params() * F32 + dp_bytes
    reduce = costs.collective_s("all_reduce", dense_bytes, group)
    to_buckets, from_buckets = (
        (float(costs.memory_s("elementwise", 4 * dense_bytes)), float(costs.memory_s("elementwise", 2 * dense_bytes)))
        if world > 1
        else (0.0, 0.0)
    )
    optimizer = float(costs.memory_s("elementwise", model.mlp_params() * ADAM_BYTES * 2 + update_bytes))
    g = GraphBuilder()
    exchange_fwd, exchange_bwd, all_reduce = g.new_collective(), g.new_collective(), g.new_collective()
    exchange_indices = g.new_collective()
    comp_, comm_ = Category.COMPUTE, Category.COMMUNICATION
    for r in range(world):
        comp, comm, dp = g.resource(r, "compute"), g.resource(r, "comm"), g.resource(r, "dp_comm")
        indices = g.task("index_exchange", comm, index_exchange, comm_, "alltoall", collective=exchange_indices)
        emb = g.task("embedding_fwd", comp, emb_fwd[r], comp_, "embedding", [indices])
        a2a = g.task("pooled_exchange", comm, fwd_comm, comm_, "alltoall", [emb], collective=exchange_fwd)
        bottom = g.task("bottom_mlp_fwd", comp, bottom_fwd, comp_, "mlp")
        top = g.task("interaction_top_mlp_fwd_bwd", comp, top_fwd + top_bwd, comp_, "mlp", [a2a, bottom])
        bottom_b = g.task("bottom_mlp_bwd", comp, bottom_bwd, comp_, "mlp", [top])
        replica_b = g.task("replica_embedding_bwd", comp, replica_bwd[r], comp_, "embedding", [bottom_b])
        buckets = g.task("ddp_to_buckets", comp, to_buckets, comp_, "ddp", [replica_b])
        ar = g.task("grad_all_reduce", dp, reduce, comm_, "all_reduce", [buckets], collective=all_reduce)
        back = g.task("pooled_grad_exchange", comm, bwd_comm, comm_, "alltoall", [replica_b], collective=exchange_bwd)
        emb_b = g.task("embedding_bwd", comp, emb_bwd[r], comp_, "embedding", [back])
        grads = g.task("ddp_from_buckets", comp, from_buckets, comp_, "ddp", [ar])
        g.task("optimizer", comp, optimizer, comp_, "optimizer", [emb_b, grads])
    graph = g.build()
    gpu = system.gpu
    return DLRMStep(simulate(graph), memory_per_rank(model, plan, world), gpu.hbm_bytes - gpu.reserved_bytes)


MAX_INDEX_FILE_BYTES = 1 << 30  # a sample of 134M int64 indices; it is sorted in memory once


def load_index_sample(path: Path, table: EmbeddingTable) -> np.ndarray:
    """The row frequencies of a sample of `table`'s real indices (how often each distinct row
    appears), read by read_index_sequence; also refused: indices outside the table's rows (the file
    of another table)."""
    where = f"{path} (indices of table {table.name!r})"
    idx = read_index_sequence(path, where)
    low, high = int(idx.min()), int(idx.max())
    if low < 0 or high >= table.num_rows:
        raise ConfigError(
            f"{where}: indices {low}..{high}; the table has rows 0..{table.num_rows - 1} (the file of another table?)"
        )
    return np.unique(idx, return_counts=True)[1]


def read_index_sequence(path: Path, where: str) -> np.ndarray:
    """A sample of real indices in the order they were looked up: a NumPy .npy array of integers
    (read without pickles), or a text file of integers separated by whitespace or commas. Refused
    (ConfigError naming `where`): a missing or larger-than-MAX_INDEX_FILE_BYTES file, non-integers,
    an empty sample."""
    if not path.is_file():
        raise ConfigError(f"{where}: no such file")
    if path.stat().st_size > MAX_INDEX_FILE_BYTES:
        raise ConfigError(f"{where}: {path.stat().st_size} bytes; expected at most {MAX_INDEX_FILE_BYTES}")
    try:
        if path.suffix == ".npy":
            idx = np.load(path, allow_pickle=False, mmap_mode="r")
        else:
            idx = np.array(path.read_text(encoding="utf-8").replace(",", " ").split(), dtype=np.int64)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: expected integers (.npy, or text); {str(exc).splitlines()[0][:120]}") from None
    if idx.dtype.kind not in "iu":
        raise ConfigError(f"{where}: expected integer indices; got dtype {idx.dtype}")
    if idx.size == 0:
        raise ConfigError(f"{where}: no indices")
    return np.asarray(idx).ravel()


def candidate_shards(table: EmbeddingTable, world: int) -> list[Shard]:
    """The shardings the planner tries for one table: table-wise on each rank, row-wise and
    data-parallel over all ranks, column-wise over blocks of 2, 4, … ranks whose count divides the
    embedding dimension."""
    everyone = tuple(range(world))
    out = [Shard("table_wise", (r,)) for r in range(world)]
    if world > 1:
        out.append(Shard("row_wise", everyone))
    out.append(Shard("data_parallel", everyone))
    k = 2
    while k <= world and world % k == 0 and table.embedding_dim % k == 0:
        out += [Shard("column_wise", tuple(range(s, s + k))) for s in range(0, world, k)]
        k *= 2
    return out


@dataclass(frozen=True)
class ShardingResult:
    plans: list[tuple[dict[str, Shard], DLRMStep]]  # fastest first, plans that fit before those that do not
    method: str  # exhaustive | greedy
    evaluated: int  # plans priced


def plan_sharding(
    model: DLRMConfig,
    system: SystemConfig,
    batch_per_rank: int,
    exhaustive_limit: int = 4096,
    calibration: dict[str, Any] | None = None,
    index_counts: dict[str, np.ndarray] | None = None,
) -> ShardingResult:
    """The fastest shardings, priced by dlrm_step: every combination when there are at most
    `exhaustive_limit`, else greedily (tables by lookup traffic, largest first, each given the
    candidate with the least step time of the plan so far among those that fit), and beside it
    the uniform plans (all table-wise round-robin, all row-wise, all data-parallel)."""
    world = system.num_gpus
    options = {t.name: candidate_shards(t, world) for t in model.tables}
    combos = 1
    for shards in options.values():
        combos *= len(shards)
    priced: list[tuple[dict[str, Shard], DLRMStep]] = []
    if combos <= exhaustive_limit:
        for choice in itertools.product(*options.values()):
            plan = dict(zip(options, choice, strict=True))
            priced.append((plan, dlrm_step(model, system, plan, batch_per_rank, calibration, index_counts)))
        method = "exhaustive"
    else:
        chosen: dict[str, Shard] = {}
        evaluated = 0
        for t in sorted(model.tables, key=lambda t: -t.pooling_factor * t.embedding_dim):
            best: tuple[bool, float, Shard] | None = None
            for shard in options[t.name]:
                step = dlrm_step(model, system, {**chosen, t.name: shard}, batch_per_rank, calibration, index_counts)
                evaluated += 1
                key = (not step.fits, step.step_time_s, shard)
                if best is None or key[:2] < best[:2]:
                    best = key
            assert best is not None
            chosen[t.name] = best[2]
        everyone = tuple(range(world))
        uniform = [
            {t.name: Shard("table_wise", (i % world,)) for i, t in enumerate(model.tables)},
            {t.name: Shard("data_parallel", everyone) for t in model.tables},
        ]
        if world > 1:
            uniform.append({t.name: Shard("row_wise", everyone) for t in model.tables})
        priced = [
            (p, dlrm_step(model, system, p, batch_per_rank, calibration, index_counts)) for p in (chosen, *uniform)
        ]
        method, combos = "greedy", evaluated + len(uniform) + 1
    priced.sort(key=lambda ps: (not ps[1].fits, ps[1].step_time_s))
    if not priced[0][1].fits:
        least = min(step.memory_per_gpu_bytes for _, step in priced)
        raise ValueError(
            f"no sharding fits: the least memory per GPU of the plans tried is {least / 2**30:.1f} GiB, "
            f"{priced[0][1].capacity_bytes / 2**30:.1f} GiB usable on {system.gpu.name} (more GPUs, or smaller tables)"
        )
    return ShardingResult(priced, method, combos)


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


def dlrm_model(fields: dict[str, Any], source: str = "<input>") -> DLRMConfig:
    """A DLRM model section: `preset: NAME` plus overrides, or every field; problems name the field."""
    fields = dict(fields)
    name = fields.pop("preset", None)
    if name is not None:
        fields = {**preset("dlrm", str(name)), **fields}
    return _validated(DLRMConfig, fields, f"{source}: model")


def _validated(schema: type[BaseModel], fields: dict[str, Any], where: str) -> Any:
    try:
        return schema.model_validate(fields)
    except ValidationError as exc:
        problems = [f"{where}.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        raise ConfigError("\n".join(problems)) from None


def is_dlrm_model(fields: dict[str, Any]) -> bool:
    """Whether a raw model section describes a DLRM (a DLRM preset, or tables of embeddings)."""
    return "tables" in fields or str(fields.get("preset")) in preset_names("dlrm")


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
        p = _validated(DLRMPlan, plan, f"{source}: plan")
        sys_cfg = cast(SystemConfig, parse_section("system", system, source))
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
