"""One embedding table's work on one rank per step under its shard, and its price: the lookups,
rows and width a shard holds, what its indices are (a named distribution or a sample of real
indices), the forward lookup and the backward with TorchRec's fused row-wise Adagrad update, priced
as memory traffic or on a calibration's operator models; on a Hopper GPU without a calibration the
forward lookup is priced on the model fitted to this project's H100 lookups (curves.json
`embedding_lookup`): random row gathers run far below HBM's streaming rate (a lent H200's lookups took
3.4× what streaming prices, geomean; validation/gpu_campaign_check.py); and where the step runs the
update in eager PyTorch (the point-to-point emulation), that update on the model fitted to a lent H200's
calls of it (curves.json `embedding_update`).

Sources: TorchRec's sharding types and fused row-wise Adagrad (FBGEMM's rowwise_adagrad); index
statistics of costs/index_stats.py (distinct rows, the most frequent row, reuse distances).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from itercast.config.system import SystemConfig, renamed_gpu_note
from itercast.costs.analytic import AnalyticCostModel, unmeasured_network_note
from itercast.costs.aten_ops import EMBEDDING_UPDATE, lookup_features
from itercast.costs.curves import curves
from itercast.costs.fitted_ranges import EXTRAPOLATION_FACTOR
from itercast.costs.op_model import IndexStats, OperatorCostModel, zipf_hot_fraction
from itercast.errors import ConfigError
from itercast.workloads.dlrm.config import DLRMConfig, EmbeddingTable, Shard

F32 = 4  # bytes: fp32 tables, gradients and pooled vectors
ADAGRAD_ROW_BYTES = 4  # row-wise Adagrad: one fp32 state per row
INDEX_BYTES, LENGTH_BYTES = 8, 4  # a KeyedJaggedTensor's int64 indices and int32 length per bag (TorchRec)
LOOKUP_OP = "aten::_embedding_bag"  # the operator a calibrated forward lookup is priced as


@dataclass(frozen=True)
class ShardWork:
    """One table's work on one rank per step: lookups, rows and width held, bytes it exchanges."""

    lookups: float
    rows: float
    dim: int
    bags: float  # the pooled vectors its lookups are summed into (a row-wise shard's are partial sums)
    replica: bool = False  # data-parallel: a dense gradient, all-reduced, and the whole table updated

    @property
    def index_bytes(self) -> float:
        """Its lookups' indices and its bags' lengths: what the input distribution delivers, and what the
        embedding's backward keeps."""
        return self.lookups * INDEX_BYTES + self.bags * LENGTH_BYTES

    @property
    def pooled_out_bytes(self) -> float:
        """Pooled vectors this rank sends (all-to-all or reduce-scatter); a replica keeps its own."""
        return 0.0 if self.replica else self.bags * self.dim * F32


@dataclass(frozen=True)
class IndexSample:
    """A sample of a table's real indices (load_index_sample): its distinct rows, ascending, and how often each
    appears."""

    rows: np.ndarray
    counts: np.ndarray
    #: busiest_block's answers by (rows, k): the planner asks the same for every plan it prices
    _blocks: dict[tuple[int, int], IndexSample] = field(default_factory=dict, compare=False, repr=False)

    def busiest_block(self, num_rows: int, k: int) -> IndexSample:
        """The sample's lookups in the busiest of k row-wise blocks of ⌈num_rows / k⌉ consecutive rows: TorchRec's
        row-wise sharding sends each index to the rank whose block holds its row (rw_sharding.py, block_size
        ⌈N/k⌉, bucketize_kjt_before_all2all), so the rows' own ids set each rank's load."""
        found = self._blocks.get((num_rows, k))
        if found is None:
            block = self.rows // -(-num_rows // k)
            busiest = np.argmax(np.bincount(block, weights=self.counts, minlength=k))
            on = block == busiest
            found = self._blocks[(num_rows, k)] = IndexSample(self.rows[on], self.counts[on])
        return found


def shard_work(
    table: EmbeddingTable, shard: Shard, rank: int, world: int, batch: int, sample: IndexSample | None = None
) -> ShardWork | None:
    """The work of `table` on `rank` under `shard` (None if the rank holds none of it); `batch` is the
    local batch b; `sample`: the table's real indices, which set a row-wise shard's share of the lookups."""
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
        share = row_wise_share(table, world, rank == shard.ranks[0], sample)
        return ShardWork(B * P * share, table.num_rows / world, d, B)
    return ShardWork(batch * P, table.num_rows, d, batch, replica=True)  # data_parallel: the local batch only


def row_wise_share(table: EmbeddingTable, k: int, holds_hot: bool, sample: IndexSample | None = None) -> float:
    """The share of a table's lookups one of its k row-wise shards serves. TorchRec's row-wise sharding gives each
    rank a block of about N/k consecutive rows (torchrec/distributed/sharding/rw_sharding.py, block_size ⌈N/k⌉)
    and routes every lookup to its row's block; with hashed ids the rows' popularity falls on the blocks at random,
    so one block holds the most frequent row, a share `hot` of the lookups (zipf_hot_fraction), and its other
    r − 1 rows (r = N/k) are drawn from the other N − 1 at random: hot + (1 − hot)(r − 1)/(N − 1) on that shard
    (`holds_hot`: the shard's first rank, the one the step and the memory price), (1 − hot) r/(N − 1) on each
    other; uniform draws (hot 1/N) give 1/k on every shard. The next most frequent rows, each on a block at random,
    are taken as spread (a lower bound on the busiest shard's share). With a `sample` of real indices, their own
    rows set it: the busiest block's share of them (IndexSample.busiest_block), the rest spread over the other
    shards."""
    rows = table.num_rows
    if sample is not None:
        busiest = float(sample.busiest_block(rows, k).counts.sum() / sample.counts.sum())
        return busiest if holds_hot else (1.0 - busiest) / max(k - 1, 1)
    if rows <= 1:
        return 1.0 if holds_hot else 0.0
    hot, per_shard = zipf_hot_fraction(rows, table.zipf_alpha), rows / k
    if holds_hot:
        return hot + (1.0 - hot) * max(per_shard - 1.0, 0.0) / (rows - 1)
    return (1.0 - hot) * per_shard / (rows - 1)


def index_stats(table: EmbeddingTable, work: ShardWork, counts: IndexSample | IndexStats | None = None) -> IndexStats:
    """What the shard's lookups are: as given (an IndexStats, e.g. IndexStats.from_sequence of a real
    sample in its order), from a sample of real indices (`counts`, load_index_sample; a row-wise shard, the busiest
    block's rows of it: IndexSample.busiest_block), else from the table's named distribution (uniform or Zipf). Under
    a named distribution a row-wise shard of 1/k of the rows
    (the rows' popularity spread over the shards at random, as hashed ids are) sees 1/k of the distinct
    rows of the table's k times its lookups (and between two lookups of one of its rows, 1/k of the
    table's distinct rows): the shard's rows are a random 1/k of the table's, not a Zipf law of their
    own over N/k ranks (which overstates them: +11.6% at a million rows, 163,840 lookups, alpha 1.05,
    k 4). The shard priced, the most loaded, holds the most frequent row (row_wise_share): of its share s of
    the table's lookups, the distinct rows are 1/k of the table's (a fraction 1/(k s) of the table's unique
    fraction) and that row's lookups hot/s (k hot where every shard serves 1/k)."""
    if isinstance(counts, IndexStats):
        return counts
    k = table.num_rows / work.rows
    lookups, row_bytes = max(1, round(work.lookups)), work.dim * F32
    total = work.bags * table.pooling_factor  # the table's lookups (a row-wise shard's bags are every sample's)
    share = work.lookups / total
    if counts is not None:
        own = counts.busiest_block(table.num_rows, round(k)) if k > 1 else counts
        return IndexStats.sampled(own.counts, lookups, row_bytes)
    if k == 1:
        return IndexStats.zipf(max(1, round(work.rows)), lookups, table.zipf_alpha, row_bytes)
    whole = IndexStats.zipf(table.num_rows, max(1, round(total)), table.zipf_alpha, row_bytes / k)
    hot = zipf_hot_fraction(table.num_rows, table.zipf_alpha)  # alpha 0: 1 / rows
    return IndexStats(min(1.0, whole.unique_fraction / (k * share)), min(1.0, hot / share), whole.reuse_beyond)


@cache
def _builtin_model(section: str, key: str, gpu_name: str) -> OperatorCostModel | None:
    """The operator model `key` for `gpu_name` from curves.json `section` (an entry whose
    `gpu_name_prefixes` match the name), None for a GPU family the operator was not measured on."""
    for entry in curves().get(section, {}).values():
        if any(gpu_name.startswith(p) for p in entry["gpu_name_prefixes"]):
            return OperatorCostModel({"models": {key: entry["model"]}})
    return None


def builtin_lookup_model(gpu_name: str) -> OperatorCostModel | None:
    """The forward lookup's model for `gpu_name` (curves.json `embedding_lookup`: this project's H100 lookups)."""
    return _builtin_model("embedding_lookup", f"{LOOKUP_OP}:embedding_bag_fwd", gpu_name)


def builtin_update_model(gpu_name: str) -> OperatorCostModel | None:
    """The eager row-wise Adagrad update's model for `gpu_name` (curves.json `embedding_update`: a lent H200's
    calls of itercast::rowwise_adagrad_update, whose torch.unique waits for the GPU: about 0.34 ms a call
    before any row moves). Not FBGEMM's fused update, which TorchRec runs as one kernel."""
    return _builtin_model("embedding_update", f"{EMBEDDING_UPDATE}:embedding_bag_update", gpu_name)


def embedding_seconds(
    costs: AnalyticCostModel,
    table: EmbeddingTable,
    work: ShardWork,
    ops: OperatorCostModel | None = None,
    counts: IndexSample | IndexStats | None = None,
    eager_update: bool = False,
) -> tuple[float, float]:
    """(forward, backward) seconds of one shard.

    Forward reads every looked-up row and writes the pooled vectors. Backward reads the pooled
    gradients and writes each lookup's gradient row; a sharded table then runs the fused row-wise
    Adagrad update (TorchRec): every distinct row's gradient summed, the row and its state read and
    written; a replica zeroes its dense gradient (rows·d·4 bytes), reads the lookups' gradient rows
    back and accumulates them into its distinct rows (tools/measure_dlrm_sharding.py ShardedDLRM.step:
    zeros_like, index, index_add_; its update is replica_update_bytes, after the all-reduce). Priced
    as memory traffic on the cost model, except where `ops` (a calibration's `operators`, fitted on `itercast profile`'s
    embedding microbenchmarks), or for the lookup on a Hopper GPU builtin_lookup_model, has a model of
    the operator: the lookup (aten::_embedding_bag) and
    the update (itercast::rowwise_adagrad_update), each at this shard's rows, width, lookups and
    distinct-row fraction. PyTorch's aten::_embedding_bag_backward, which the profile also
    measures, writes a dense table-sized gradient: it is not the sparse update and is not used.
    Skewed indices (fewer distinct rows) make the update cheaper, never slower: FBGEMM's split TBE backward
    sorts the lookups by row and splits a row's run longer than max_segment_length_per_cta (1,024) across
    thread blocks (embedding_backward_split_template.cu; one block a run under deterministic algorithms,
    not priced), so a hot row is no serial chain; aten's _embedding_bag_backward is not this operator.
    `counts`: a sample of the table's real indices (load_index_sample).
    `eager_update`: the step runs the update as itercast::rowwise_adagrad_update in eager PyTorch (the
    point-to-point emulation, DLRMConfig.exchange): on a Hopper GPU without a calibration's update model,
    builtin_update_model prices it."""
    pooled = work.bags * work.dim * F32
    index = index_stats(table, work, counts)
    distinct = index.unique_fraction * max(1, round(work.lookups))
    per_lookup = work.lookups * work.dim * F32
    lookup = ops if ops is not None and ops.has_model(LOOKUP_OP) else builtin_lookup_model(costs.system.gpu.name)
    if lookup is not None:
        fwd_s = lookup.price(
            LOOKUP_OP, lookup_features("embedding_bag_fwd", work.rows, work.dim, work.lookups, work.bags), index
        )
    else:
        fwd_s = float(costs.memory_s("elementwise", per_lookup + pooled))
    if work.replica:
        return fwd_s, float(
            costs.memory_s("elementwise", pooled + 2 * per_lookup + (work.rows + 2 * distinct) * work.dim * F32)
        )
    update = ops if ops is not None and ops.has_model(EMBEDDING_UPDATE) else None
    update = update or (builtin_update_model(costs.system.gpu.name) if eager_update else None)
    if update is not None:
        return fwd_s, float(costs.memory_s("elementwise", pooled + per_lookup)) + update_seconds(update, work, index)
    return fwd_s, float(
        costs.memory_s("elementwise", pooled + per_lookup + distinct * 2 * (work.dim * F32 + ADAGRAD_ROW_BYTES))
    )


def update_seconds(model: OperatorCostModel, work: ShardWork, index: IndexStats) -> float:
    """One shard's row-wise Adagrad update (itercast::rowwise_adagrad_update) on an operator model of it:
    its rows, width, lookups (one gradient row each) and their distinct rows."""
    features = lookup_features("embedding_bag_update", work.rows, work.dim, work.lookups, work.lookups)
    return model.price(EMBEDDING_UPDATE, features, index)


def beyond_profile(
    model: DLRMConfig,
    world: int,
    batch_per_rank: int,
    calibration: dict[str, Any] | None,
    gpu_name: str = "",
    plan: dict[str, Shard] | None = None,
    samples: dict[str, IndexSample] | None = None,
) -> str:
    """A warning (or "") when the largest call of lookups exceeds EXTRAPOLATION_FACTOR × the largest call the
    calibration's embedding operator models were profiled at: their linear models are then extrapolating (a
    calibration fitted before the largest call was recorded is not checked). Under `plan`, the busiest shard's
    call (shard_work, with the tables' index `samples`); without one, what a table-wise owner would look up, its
    pooling factor × every rank's samples. Without a calibration's lookup model, `gpu_name`'s built-in one
    (builtin_lookup_model) is checked the same way."""
    fits = dict((calibration or {}).get("operators", {}).get("models", {}))
    builtin = builtin_lookup_model(gpu_name)
    if builtin is not None and not any(k.startswith(LOOKUP_OP + ":") for k in fits):
        fits |= builtin.models
    profiled = [f["max_lookups"] for k, f in fits.items() if k.startswith((LOOKUP_OP, EMBEDDING_UPDATE))]
    profiled = [v for v in profiled if v]
    if not profiled:
        return ""
    if plan is None:
        table = max(model.tables, key=lambda t: t.pooling_factor)
        most, who = table.pooling_factor * batch_per_rank * world, f"a table-wise owner of {table.name}"
    else:
        calls = [
            (work.lookups, f"{t.name}'s {plan[t.name].strategy.replace('_', '-')} shard")
            for t in model.tables
            if t.name in plan
            and (
                work := shard_work(
                    t, plan[t.name], plan[t.name].ranks[0], world, batch_per_rank, (samples or {}).get(t.name)
                )
            )
        ]
        most, who = max(calls, key=lambda call: call[0], default=(0.0, ""))
    if most <= EXTRAPOLATION_FACTOR * min(profiled):
        return ""
    return (
        f"{who} looks up {most:,.0f} rows per call, {most / min(profiled):.1f}× the largest call the "
        f"embedding models were profiled at ({min(profiled):,.0f}): their prices there are "
        "extrapolated (itercast profile run --families embedding --embedding-batches …, then itercast calibrate)"
    )


def unmeasured_lookups(gpu_name: str, calibration: dict[str, Any] | None) -> str:
    """A warning (or "") when neither the calibration nor builtin_lookup_model has a model of the
    forward lookup on `gpu_name`: its lookups are then priced as streaming memory traffic, which a lent
    H200's lookups took 3.4× longer than, geomean (validation/gpu_campaign_check.py)."""
    fits = (calibration or {}).get("operators", {}).get("models", {})
    if any(k.startswith(LOOKUP_OP + ":") for k in fits) or builtin_lookup_model(gpu_name) is not None:
        return ""
    return (
        f"embedding lookups on {gpu_name} are priced as streaming memory traffic, with no lookup measured on "
        "this GPU: on an H200 that pricing was 3.4x too fast (random row gathers); profile it "
        "(itercast profile run --families embedding, then itercast calibrate) and pass --calibration"
    )


def unmeasured_update(gpu_name: str, calibration: dict[str, Any] | None, eager_update: bool = False) -> str:
    """A warning (or "") when the calibration has no model of the row-wise Adagrad update: it is then
    priced as streaming memory traffic on `gpu_name`, unless the step runs the eager update
    (`eager_update`) on a GPU builtin_update_model has measured."""
    fits = (calibration or {}).get("operators", {}).get("models", {})
    if any(k.startswith(EMBEDDING_UPDATE + ":") for k in fits):
        return ""
    if eager_update and builtin_update_model(gpu_name) is not None:
        return ""
    return (
        f"the row-wise Adagrad update of sharded tables on {gpu_name} is priced as streaming memory traffic, "
        "with no update measured on this GPU; profile it (itercast profile run --families embedding, then "
        "itercast calibrate) and pass --calibration"
    )


def unmeasured_embedding_ops(
    gpu_name: str, calibration: dict[str, Any] | None, eager_update: bool = False
) -> list[str]:
    """The warnings of unmeasured_lookups and unmeasured_update that apply."""
    notes = (unmeasured_lookups(gpu_name, calibration), unmeasured_update(gpu_name, calibration, eager_update))
    return [n for n in notes if n]


def dlrm_notes(
    model: DLRMConfig,
    system: SystemConfig,
    batch_per_rank: int,
    calibration: dict[str, Any] | None,
    plan: dict[str, Shard] | None = None,
    samples: dict[str, IndexSample] | None = None,
) -> list[str]:
    """What a DLRM step's price rests on, said beside it by `predict`, `shard` and `search`: lookups beyond the
    profiled calls (beyond_profile, under `plan` where one is priced), embedding operators no measurement prices
    (unmeasured_embedding_ops) and the network's unmeasured collectives (costs/analytic.unmeasured_network_note)."""
    gpu = system.gpu.name
    notes = (
        beyond_profile(model, system.num_gpus, batch_per_rank, calibration, gpu, plan, samples),
        *unmeasured_embedding_ops(gpu, calibration, eager_update=model.eager_update),
        unmeasured_network_note(system),
        renamed_gpu_note(system),
    )
    return [n for n in notes if n]


#: fp32 reads and writes per row of the dense row-wise Adagrad's per-row chain, as
#: tools/measure_dlrm_sharding.py ShardedDLRM.step runs it: vector_norm's output 1, pow_ 2, div_ 2,
#: state += 3, sqrt 2, + ε 2, −lr / x (reciprocal 2, mul 2), the scale read by addcmul_ 1
DENSE_ADAGRAD_ROW_ACCESSES = 17


def replica_update_bytes(table: EmbeddingTable) -> float:
    """A data-parallel table's dense row-wise Adagrad step: the all-reduced gradient read twice (its
    row norms, then addcmul_), every row read and written, and the per-row state chain
    (DENSE_ADAGRAD_ROW_ACCESSES)."""
    return table.num_rows * (4 * table.embedding_dim * F32 + DENSE_ADAGRAD_ROW_ACCESSES * F32)


MAX_INDEX_FILE_BYTES = 1 << 30  # a sample of 134M int64 indices; it is sorted in memory once


def load_index_sample(path: Path, table: EmbeddingTable) -> IndexSample:
    """A sample of `table`'s real indices (each distinct row and how often it appears), read by
    read_index_sequence; also refused: indices outside the table's rows (the file of another table)."""
    where = f"{path} (indices of table {table.name!r})"
    idx = read_index_sequence(path, where)
    low, high = int(idx.min()), int(idx.max())
    if low < 0 or high >= table.num_rows:
        raise ConfigError(
            f"{where}: indices {low}..{high}; the table has rows 0..{table.num_rows - 1} (the file of another table?)"
        )
    rows, counts = np.unique(idx, return_counts=True)
    return IndexSample(rows, counts)


#: a text index file is parsed this many bytes at a time: the tokens of one block, as Python strings,
#: take about ten times its size, so the whole file is never split at once (a 1 GiB file would take 12)
TEXT_BLOCK_BYTES = 1 << 24


def read_index_sequence(path: Path, where: str) -> np.ndarray:
    """A sample of real indices in the order they were looked up: a NumPy .npy array of integers
    (read without pickles), or an ASCII text file of integers separated by whitespace or commas,
    parsed TEXT_BLOCK_BYTES at a time (memory: the int64 array and one block's tokens). Refused
    (ConfigError naming `where`): a missing or larger-than-MAX_INDEX_FILE_BYTES file, non-integers,
    integers beyond int64, an empty sample."""
    if not path.is_file():
        raise ConfigError(f"{where}: no such file")
    if path.stat().st_size > MAX_INDEX_FILE_BYTES:
        raise ConfigError(f"{where}: {path.stat().st_size} bytes; expected at most {MAX_INDEX_FILE_BYTES}")
    try:
        idx = np.load(path, allow_pickle=False, mmap_mode="r") if path.suffix == ".npy" else _text_indices(path)
    except (ValueError, UnicodeDecodeError) as exc:
        why = str(exc).splitlines()[0][:120]
        if "pickled" in why or "Python objects" in why:  # numpy's advice to load it unsafely is not ours to give
            why = "a pickled object array, which itercast never loads: np.save an integer array instead"
        raise ConfigError(f"{where}: expected integers (.npy, or text); {why}") from None
    except OverflowError:
        raise ConfigError(f"{where}: expected integer indices within int64 (< 2**63); got a larger one") from None
    if idx.dtype.kind not in "iu":
        raise ConfigError(f"{where}: expected integer indices; got dtype {idx.dtype}")
    if idx.size == 0:
        raise ConfigError(f"{where}: no indices")
    return np.asarray(idx).ravel()


def _text_indices(path: Path) -> np.ndarray:
    """The integers of an ASCII text file (whitespace or commas between them), TEXT_BLOCK_BYTES at a
    time; each block is cut after its last separator, the token it splits carried to the next."""
    blocks: list[np.ndarray] = []
    carry = b""
    with path.open("rb") as f:
        while block := f.read(TEXT_BLOCK_BYTES):
            block = carry + block
            cut = max(block.rfind(sep) for sep in b" \t\r\n\v\f,") + 1
            blocks.append(np.array(block[:cut].decode("ascii").replace(",", " ").split(), dtype=np.int64))
            carry = block[cut:]
            if len(carry) > 64:  # an int64 takes at most 20 characters: never carry a huge token along
                raise ValueError(f"{len(carry):,} characters without a separator, not an integer")
    blocks.append(np.array(carry.decode("ascii").replace(",", " ").split(), dtype=np.int64))
    return np.concatenate(blocks)
