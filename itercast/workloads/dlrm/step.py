"""One DLRM training step under an embedding-table sharding, on the step graph and simulator of
DESIGN.md §3, every rank simulated (the ranks' embedding work differs with the sharding), and the
memory each rank holds.

Sources: Naumov et al. 2019 (DLRM); Mudigere et al. 2022 (pooled embeddings exchanged by
all-to-all); TorchRec (input distribution, fused row-wise Adagrad); PyTorch DDP (gradient buckets).
W ranks, local batch b, global batch B = W·b, fp32 tables with row-wise Adagrad fused into the
backward (TorchRec's default), fp32 MLPs with Adam.

One step, per rank:
- forward: the input distribution (TorchRec's KeyedJaggedTensor all-to-all: a shard's owner
  receives its lookups' int64 indices and an int32 length per bag, the busiest rank sets the pace;
  model.input_distribution false when every owner already holds its indices); the bottom MLP (b
  rows, no gradient for its dense input) beside it, before the lookups (TorchRec's DLRM.forward:
  dense_arch, then sparse_arch; torchrec/models/dlrm.py), so that it never hides the pooled
  exchange; the lookups of the rank's shards, priced as
  memory traffic on the cost model (every looked-up row read, pooled vectors written) or on a
  calibration's operator models (embedding_seconds); an all-to-all of pooled vectors
  (a table- or column-wise shard serves all B samples: its rank sends B·d_shard·4 bytes, the busiest
  rank sets the pace), one per sharding type under TorchRec (ShardedEmbeddingBagCollection runs one
  output dist per sharding type, torchrec/distributed/embeddingbag.py _output_dists: table-wise and
  column-wise shards exchange in two all-to-alls), one for all in the point-to-point emulation, and a
  reduce-scatter of row-wise partial sums (B·d·4); the interaction (dot:
  pairwise products of the F = tables + 1 vectors; dcnv2: low-rank cross layers); the top MLP (its
  last layer the logit, without ReLU).
- backward: the mirror; the pooled gradients come back by all-to-all (row-wise: all-gather); each
  shard's backward reads its lookups' gradients and updates its distinct rows (weights and
  Adagrad state read and written): distinct rows from the index distribution (uniform, or Zipf with
  table.zipf_alpha; costs/op_model.py); a data-parallel table's dense gradient is all-reduced with
  the MLPs' gradients beside the other tables' backward, through PyTorch DDP's buckets as TorchRec
  builds it, gradient_as_bucket_view=True (torchrec/distributed/model_parallel.py
  DefaultDataParallelWrapper): each gradient copied in and divided by the world size at once (c10d
  reducer.cpp copy_grad_to_bucket, at::mul_out), or divided in place once it is the bucket's view: 2×
  its bytes; nothing copied back, the gradients are the buckets), or, for a model whose `exchange` is
  point_to_point, as
  tools/measure_dlrm_sharding.py (ShardedDLRM.step) runs it: every dense gradient copied into one
  buffer (2×), one all-reduce, the buffer divided by the world size (2×) and the MLPs' gradients
  copied back (2× the MLPs'; a replica reads its gradient from the buffer); then Adam on the MLPs
  and the replicas' dense row-wise Adagrad.
Collectives start when every rank is ready (the simulator's rendezvous).
Host (workloads/dlrm/host.py, DESIGN.md §3 rule 4): each rank's host issues the tasks' operators in
the order above, each costing the host model's seconds; a task of k operators and GPU time D starts
after its first operator's host time and its last 1/k of D waits for the last operator's launch, so
the task ends at max(first launch + D, last launch + D/k): the GPU hides the host when its kernels
are long, the host sets the pace when they are short. On a system whose accelerator is the host the
operators' host time runs on the compute resource itself, before the task, and starts only once the
task's inputs are ready: the measured CPU step waits for each exchange before it issues what reads
it (tools/measure_dlrm_sharding.py ShardedDLRM.step: gloo's blocking reduce_scatter_tensor and
all_gather_into_tensor, isend/irecv then wait, the all-reduce's reduce.wait()), where a GPU's host
runs ahead of its streams.
Co-running (`co_running`): ranks that share a host's memory and caches (CPU ranks) slow each other's
kernels while both compute; each compute task runs at its co-running price only then (sim/contention.py).
Cores (a system whose accelerator is the host, on one node): every rank has one core (one compute
thread each, as tools/measure_dlrm_sharding.py runs them), and its collectives run on it too (gloo's
threads copy over loopback TCP), so a collective in flight beside a rank's compute or beside another of
its collectives shares the node's gpus_per_node cores with them (processor sharing, sim/sharing.py):
the all-reduce of the dense gradients slows the pooled gradients' exchange and the updates beside it.
Measured on this project's 2-core VM (data/measured/gloo_exchange_beside_allreduce.csv): a 16 KiB
point-to-point exchange takes 0.39 ms alone, 0.48 ms beside a 40 KiB all-reduce and 1.13 ms beside a
1 MiB one; inside measured steps the pooled gradients' exchange ran about twice its price alone
(validation/sharding_phases.py). Processor sharing is the fluid limit: it slows the 16 KiB exchange
beside the 40 KiB all-reduce to 0.78 ms (more than measured) and ends the pair at 0.82 ms (0.87
measured). Not applied over several nodes (each host's cores are not modelled apart) nor with
`co_running`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from itercast.config.system import SystemConfig
from itercast.costs.analytic import AnalyticCostModel
from itercast.costs.aten_ops import OpFeatures
from itercast.costs.host_overheads import HostOverheads
from itercast.costs.op_model import OperatorCostModel
from itercast.graph.execgraph import Category, ExecGraph, GraphBuilder
from itercast.hardware.topology import place_group
from itercast.memory import reserve_bytes
from itercast.sim.contention import simulate_with_corunning
from itercast.sim.engine import SimResult, simulate
from itercast.sim.sharing import simulate_shared
from itercast.workloads.dlrm.config import DLRMConfig, Shard
from itercast.workloads.dlrm.embedding import (
    ADAGRAD_ROW_BYTES,
    F32,
    IndexSample,
    embedding_seconds,
    replica_update_bytes,
    shard_work,
)
from itercast.workloads.dlrm.host import HostModel, host_model, ops_per_task

ADAM_BYTES = 16  # an MLP parameter: fp32 weight, gradient, Adam m and v
#: fp32 accesses of one parameter in one Adam step, as torch/optim/adam.py _single_tensor_adam runs
#: it (the measured CPU step; _multi_tensor_adam's foreach operators move the same): exp_avg.lerp_ 3,
#: exp_avg_sq.mul_ 2 and addcmul_ 4 (the gradient read twice), sqrt 2, / bias correction 2, add_ ε 2,
#: param.addcdiv_ 4
ADAM_STEP_ACCESSES = 19


@dataclass(frozen=True)
class DLRMStep:
    sim: SimResult  # the simulated step: every rank's timeline
    memory_per_rank_bytes: list[float]  # what each rank holds (memory_per_rank)
    capacity_bytes: float  # the GPU's memory
    reserved_bytes: float  # kept from it on every GPU beyond the tensors (memory.reserve_bytes)
    host_source: str  # where the host overheads came from: own trace, other trace, given
    extrapolated: tuple[str, ...] = ()  # calibrated curves and operator models priced beyond their rows

    @property
    def step_time_s(self) -> float:
        return self.sim.step_time_s

    @property
    def graph(self) -> ExecGraph:
        return self.sim.graph

    @property
    def memory_per_gpu_bytes(self) -> float:
        """The busiest rank's memory with the reserved bytes: what `predict` reports as the GPU's total."""
        return max(self.memory_per_rank_bytes) + self.reserved_bytes

    @property
    def fits(self) -> bool:
        return self.memory_per_gpu_bytes <= self.capacity_bytes


def memory_per_rank(
    model: DLRMConfig,
    plan: dict[str, Shard],
    world: int,
    batch_per_rank: int,
    index_counts: dict[str, IndexSample] | None = None,
) -> list[float]:
    """Bytes each rank holds (memory_parts_per_rank summed)."""
    parts = _memory_parts(model, plan, world, batch_per_rank, index_counts)
    return (parts["weights"] + parts["gradients"] + parts["optimizer"] + parts["activations"]).tolist()


def memory_parts_per_rank(
    model: DLRMConfig,
    plan: dict[str, Shard],
    world: int,
    batch_per_rank: int,
    index_counts: dict[str, IndexSample] | None = None,
) -> list[dict[str, float]]:
    """Each rank's bytes by part (_memory_parts)."""
    parts = _memory_parts(model, plan, world, batch_per_rank, index_counts)
    return [{part: float(v[r]) for part, v in parts.items()} for r in range(world)]


def _memory_parts(
    model: DLRMConfig,
    plan: dict[str, Shard],
    world: int,
    batch_per_rank: int,
    index_counts: dict[str, IndexSample] | None = None,
) -> dict[str, np.ndarray]:
    """Bytes each rank holds as weights, gradients and optimizer state: its shards' rows (fp32) and
    row-wise Adagrad state (a replica also its dense fp32 gradient), and the MLPs with Adam (fp32
    weight and gradient, m and v); tables the plan does not name are left out. With more than one
    rank, the point-to-point emulation's flat buffer: another copy of every dense gradient (TorchRec's
    DDP views its buckets as the gradients: none; dlrm_step). And the activations that
    the backward keeps (dense_activation_bytes per sample × the local batch, and each shard's indices
    and bag lengths: FBGEMM's table-batched embedding saves them for its backward)."""
    bucket = F32 if world > 1 and model.exchange == "point_to_point" else 0
    mlp = model.mlp_params()
    held = {
        "weights": np.full(world, mlp * F32, dtype=np.float64),
        "gradients": np.full(world, mlp * (F32 + bucket), dtype=np.float64),
        "optimizer": np.full(world, mlp * (ADAM_BYTES - 2 * F32), dtype=np.float64),
        "activations": np.full(world, dense_activation_bytes(model) * batch_per_rank, dtype=np.float64),
    }
    for t in model.tables:
        shard = plan.get(t.name)
        if shard is None:
            continue
        sample = (index_counts or {}).get(t.name)
        work = shard_work(t, shard, shard.ranks[0], world, batch_per_rank, sample)  # priced on each of its ranks
        assert work is not None
        on = np.asarray(shard.ranks)
        held["weights"][on] += work.rows * work.dim * F32
        held["gradients"][on] += work.rows * work.dim * (F32 + bucket) if work.replica else 0
        held["optimizer"][on] += work.rows * ADAGRAD_ROW_BYTES
        held["activations"][on] += work.index_bytes
    return held


def rank_loads(plan: dict[str, Shard], world: int) -> list[tuple[tuple[str, str, int], ...]]:
    """Each rank's load: the (table, strategy, rank count) of the table- and column-wise shards `plan`
    puts on it (row-wise and data-parallel shards load every rank alike). Ranks of equal loads do the
    same work, and every collective of the step spans every rank: they run the same timeline."""
    load: list[list[tuple[str, str, int]]] = [[] for _ in range(world)]
    for name, s in plan.items():
        if s.strategy in ("table_wise", "column_wise"):
            for r in s.ranks:
                load[r].append((name, s.strategy, len(s.ranks)))
    return [tuple(sorted(x)) for x in load]


def dense_activation_bytes(model: DLRMConfig) -> float:
    """fp32 bytes per sample that the dense part's autograd keeps for the backward (TorchRec's DLRM):
    - the dense features (the first Linear's input) and every MLP layer's output (a ReLU keeps its
      output, the next Linear's input; the logit is kept by the loss);
    - the interaction's input, the bottom output beside the tables' pooled vectors (F × d: the dot
      interaction's bmm keeps it; the low-rank cross net keeps it as x0), and its output (the top MLP's
      input);
    - in the cross net, layer l's two factors' outputs (mlp_layers: the low-rank one, and the full-width
      one that multiplies x0) and its input x_l for l ≥ 1 (x_L is the interaction's output).
    Transient, not counted: the pooled vectors as the all-to-all delivers them (copied into the
    interaction's input), the bmm's product, the gradients."""
    f, d = len(model.tables) + 1, model.dim
    outputs = sum(o for _, o in model.mlp_layers())
    cross_inputs = (model.dcn_layers - 1) * f * d if model.interaction == "dcnv2" else 0
    return F32 * (model.dense_features + outputs + f * d + model.interaction_width() + cross_inputs)


def _gemm(batch: int, m: int, n: int, k: int, layout: str = "nn") -> OpFeatures:
    return OpFeatures("gemm", 2.0 * batch * m * n * k, {"batch": batch, "m": m, "n": n, "k": k, "layout": layout})


def mlp_seconds(
    costs: AnalyticCostModel,
    ops: OperatorCostModel | None,
    b: int,
    layers: list[tuple[int, int]],
    input_grad: bool = True,
    last_relu: bool = True,
) -> tuple[float, float]:
    """(forward, backward) seconds of Linear + ReLU layers (in, out) on `b` rows: the forward GEMM
    x·Wᵀ and the activation written; backward the input gradient (g·W) and weight gradient (gᵀ·x)
    GEMMs and the activation's gradient. GEMMs on the operator models of a calibration where it has
    them (aten::addmm / aten::mm, shape- and layout-aware: a DLRM's skinny layers run far below
    peak), else on the cost model's curve (backward: twice the forward). `input_grad` False: the
    first layer's input needs no gradient and autograd runs no g·W for it (the bottom MLP's dense
    features); `last_relu` False: the last layer is a bare Linear (the top MLP's logit: TorchRec's
    DLRM OverArch, tools/measure_dlrm_sharding.py ShardedDLRM's top[:-1])."""
    fwd = bwd = 0.0
    for n, (i, o) in enumerate(layers):
        relu = last_relu or n < len(layers) - 1
        act = float(costs.memory_s("activation", 2.0 * b * o * F32)) if relu else 0.0
        dx = input_grad or n > 0  # this layer's input gradient GEMM runs
        if ops is not None and ops.has_model("aten::mm"):
            fwd += ops.price("aten::addmm", _gemm(1, b, o, i, "nt")) + act
            bwd += ops.price("aten::mm", _gemm(1, o, i, b, "tn")) + act
            bwd += ops.price("aten::mm", _gemm(1, b, i, o)) if dx else 0.0
        else:
            gemm = float(costs.gemm_s(2.0 * b * i * o))
            fwd += gemm + act
            bwd += (1 + dx) * gemm + 2 * act
    return fwd, bwd


def dlrm_step(
    model: DLRMConfig,
    system: SystemConfig,
    plan: dict[str, Shard],
    batch_per_rank: int,
    calibration: dict[str, Any] | None = None,
    index_counts: dict[str, IndexSample] | None = None,
    host_overheads: HostOverheads | None = None,
    co_running: dict[str, Any] | None = None,
    every_rank: bool = True,
) -> DLRMStep:
    """Simulate one step of `model` on `system` (every GPU a rank) under the sharding `plan` (tables
    it does not name are left out: the planner prices partial plans). `calibration`: a calibration
    document (profile/calibrate.py) for the GEMM, memory and collective curves and, with an
    `operators` section, the operator models of the lookups, updates and GEMMs; the built-in curves
    when None. `index_counts`: per table, a sample of its real indices
    (load_index_sample); tables without one use their named distribution. `host_overheads`: T1–T5
    for the host (host.no_overheads() for none); else the calibration's, else the TorchRec defaults.
    `co_running`: a calibration measured while another rank of the host ran the same operators; each
    compute task then runs at its price there only while a compute task of another rank of its node
    runs, at its `calibration` price otherwise (sim/contention.simulate_with_corunning, s of a task its
    co-running / alone seconds − 1; its communication and host time from `calibration`).
    `every_rank` False (the planner's pricing): the graph holds one rank of each load (rank_loads), which
    gives the same step, except where ranks share cores or co-run (every rank is simulated there)."""
    host = host_model(system, calibration, host_overheads)
    shared_cores = system.gpu.executes_on_host and system.num_nodes == 1
    ranks: list[int] = list(range(system.num_gpus))
    if not every_rank and co_running is None and not shared_cores:
        first: dict[tuple, int] = {}
        for r, load in enumerate(rank_loads(plan, system.num_gpus)):
            first.setdefault(load, r)
        ranks = sorted(first.values())
    graph, extrapolated = _step_graph(model, system, plan, batch_per_rank, calibration, index_counts, host, ranks)
    if co_running is None and shared_cores:
        # the ranks share their cores (module docstring, "Cores"); each task then lasts what it ran there, so
        # that the graph alone replays this schedule (breakdown, variability: the sharing stays as predicted)
        shared = simulate_shared(graph, system.node.gpus_per_node, {})
        sim = simulate(graph.with_durations(shared.end_s - shared.start_s))
    elif co_running is None:
        sim = simulate(graph)
    else:
        corun, _ = _step_graph(model, system, plan, batch_per_rank, co_running, index_counts, host, ranks)
        node_of_rank = np.arange(system.num_gpus) // system.node.gpus_per_node
        sim = simulate_with_corunning(graph, corunning_slowdown(graph, corun), node_of_rank)
    gpu = system.gpu
    # with more than one rank, one NCCL communicator: TorchRec's all-to-alls and DDP's all-reduce share the
    # default process group
    return DLRMStep(
        sim,
        memory_per_rank(model, plan, system.num_gpus, batch_per_rank, index_counts),
        gpu.hbm_bytes,
        float(reserve_bytes(gpu, int(system.num_gpus > 1))),
        host.source,
        extrapolated,
    )


def corunning_slowdown(alone: ExecGraph, corun: ExecGraph) -> np.ndarray:
    """Per task, s = its seconds in `corun` / its seconds in `alone` − 1 (0 where it takes none): the
    same step built on two calibrations, task for task (the structure depends on the plan and the
    host model only, both shared)."""
    if corun.num_tasks != alone.num_tasks or corun.names != alone.names:
        raise ValueError(f"co-running step has {corun.num_tasks} tasks, the alone one {alone.num_tasks}: not one graph")
    positive = alone.duration_s > 0
    return np.where(positive, corun.duration_s / np.where(positive, alone.duration_s, 1.0) - 1.0, 0.0)


def _step_graph(
    model: DLRMConfig,
    system: SystemConfig,
    plan: dict[str, Shard],
    batch_per_rank: int,
    calibration: dict[str, Any] | None,
    index_counts: dict[str, IndexSample] | None,
    host: HostModel,
    ranks: Iterable[int],
) -> tuple[ExecGraph, tuple[str, ...]]:
    """The step's graph (module docstring) on `ranks`, priced on `calibration` (dlrm_step) and `host`, and
    the calibrated curves and operator models it priced beyond their rows (AnalyticCostModel.extrapolations,
    OperatorCostModel.extrapolations)."""
    world, b = system.num_gpus, batch_per_rank
    costs = AnalyticCostModel(system, "fp32", calibration)
    ops = OperatorCostModel(calibration["operators"]) if calibration and "operators" in calibration else None
    group = place_group(world, 1, system.node.gpus_per_node)

    layers, f = model.mlp_layers(), len(model.tables) + 1
    bottom_fwd, bottom_bwd = mlp_seconds(costs, ops, b, layers[: len(model.bottom_mlp)], input_grad=False)
    top_fwd, top_bwd = mlp_seconds(costs, ops, b, layers[len(model.bottom_mlp) :], last_relu=False)
    if model.interaction == "dot":  # pairwise dot products: a batched GEMM of F × d by d × F; backward two
        if ops is not None and ops.has_model("aten::bmm"):
            top_fwd += ops.price("aten::bmm", _gemm(b, f, f, model.dim))
            top_bwd += 2 * ops.price("aten::bmm", _gemm(b, f, model.dim, f))
        else:
            top_fwd += float(costs.gemm_s(2.0 * b * f * f * model.dim))
            top_bwd += 2 * float(costs.gemm_s(2.0 * b * f * f * model.dim))
    emb_fwd, emb_bwd, replica_bwd, index_bytes = (np.zeros(world) for _ in range(4))
    # pooled bytes each rank sends, per exchange: one per sharding type under TorchRec, one in the emulation
    a2a_bytes = {k: np.zeros(world) for k in ("table_wise", "column_wise")}
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
        counts = (index_counts or {}).get(t.name)
        work = shard_work(t, shard, shard.ranks[0], world, b, counts)  # priced on each of the shard's ranks
        assert work is not None
        fwd, bwd = embedding_seconds(costs, t, work, ops, counts, eager_update=model.eager_update)
        on = np.asarray(shard.ranks)
        emb_fwd[on] += fwd
        (replica_bwd if work.replica else emb_bwd)[on] += bwd
        if shard.strategy in a2a_bytes:
            kind = shard.strategy if model.exchange == "torchrec" else "table_wise"
            a2a_bytes[kind][on] += work.pooled_out_bytes
        if model.input_distribution and not work.replica:  # the shard's indices and bag lengths arrive
            index_bytes[on] += work.index_bytes
    exchange = sum(costs.collective_s("alltoall", float(sent.max()), group) for sent in a2a_bytes.values())
    index_exchange = costs.collective_s("alltoall", float(index_bytes.max()), group)
    fwd_comm = exchange + costs.collective_s("reduce_scatter", rw_bytes, group)
    bwd_comm = exchange + costs.collective_s("all_gather", rw_bytes, group)
    # the dense gradients (module docstring): read and written into DDP's buckets or the emulation's flat
    # buffer before the all-reduce; after it nothing (TorchRec's DDP: the gradients are the buckets'
    # views), or the buffer divided in place and the MLPs' gradients copied out of it (point_to_point)
    mlp_bytes = model.mlp_params() * F32
    dense_bytes = mlp_bytes + dp_bytes
    reduce = costs.collective_s("all_reduce", dense_bytes, group)
    back_bytes = 2 * dense_bytes + 2 * mlp_bytes if model.exchange == "point_to_point" else 0.0
    to_buckets, from_buckets = (
        (float(costs.memory_s("elementwise", 2 * dense_bytes)), float(costs.memory_s("elementwise", back_bytes)))
        if world > 1
        else (0.0, 0.0)
    )
    optimizer = float(costs.memory_s("elementwise", model.mlp_params() * ADAM_STEP_ACCESSES * F32 + update_bytes))
    g = GraphBuilder()
    exchange_fwd, exchange_bwd, all_reduce = g.new_collective(), g.new_collective(), g.new_collective()
    exchange_indices = g.new_collective()
    comp_, comm_ = Category.COMPUTE, Category.COMMUNICATION
    for r in ranks:
        comp, comm, dp = g.resource(r, "compute"), g.resource(r, "comm"), g.resource(r, "dp_comm")
        issue = host_issuer(
            g,
            host,
            comp if host.on_compute else g.resource(r, "host"),
            ops_per_task(model, plan, r, world, foreach_optimizer=not system.gpu.executes_on_host),
        )
        indices = issue("index_exchange", comm, index_exchange, comm_, "alltoall", collective=exchange_indices)
        # the bottom MLP before the lookups, as TorchRec's DLRM.forward (dense_arch, then sparse_arch):
        # it may hide the input distribution, never the pooled exchange (the measured step, which
        # distributes no indices, runs it after its blocking exchange: the same time)
        bottom = issue("bottom_mlp_fwd", comp, bottom_fwd, comp_, "mlp")
        emb = issue("embedding_fwd", comp, emb_fwd[r], comp_, "embedding", [indices])
        a2a = issue("pooled_exchange", comm, fwd_comm, comm_, "alltoall", [emb], collective=exchange_fwd)
        top = issue("interaction_top_mlp_fwd_bwd", comp, top_fwd + top_bwd, comp_, "mlp", [a2a, bottom])
        bottom_b = issue("bottom_mlp_bwd", comp, bottom_bwd, comp_, "mlp", [top])
        replica_b = issue("replica_embedding_bwd", comp, replica_bwd[r], comp_, "embedding", [bottom_b])
        buckets = issue("ddp_to_buckets", comp, to_buckets, comp_, "ddp", [replica_b])
        ar = issue("grad_all_reduce", dp, reduce, comm_, "all_reduce", [buckets], collective=all_reduce)
        back = issue("pooled_grad_exchange", comm, bwd_comm, comm_, "alltoall", [replica_b], collective=exchange_bwd)
        emb_b = issue("embedding_bwd", comp, emb_bwd[r], comp_, "embedding", [back])
        grads = issue("ddp_from_buckets", comp, from_buckets, comp_, "ddp", [ar])
        issue("optimizer", comp, optimizer, comp_, "optimizer", [emb_b, grads])
    return g.build(), tuple(costs.extrapolations() + (ops.extrapolations() if ops is not None else []))


def host_issuer(g: GraphBuilder, host: HostModel, host_resource: int, ops: dict[str, int]) -> Callable[..., int]:
    """Adds a task after the host time of its `ops[name]` operators on `host_resource` (module
    docstring; on a host that computes, that time starts once the task's `deps` have ended); returns
    the task a successor waits for. No host tasks where the host costs nothing."""

    def issue(
        name: str,
        resource: int,
        seconds: float,
        category: Category,
        family: str,
        deps: list[int] | None = None,
        collective: int = -1,
    ) -> int:
        k, before = ops[name], list(deps or [])
        if k == 0 or host.op_s == 0:
            return g.task(name, resource, seconds, category, family, before, collective=collective)
        first = g.task(
            f"host:{name}", host_resource, host.op_s, Category.HOST, "host", before if host.on_compute else []
        )
        if collective >= 0 or k == 1:  # a collective starts once all its operators are issued
            last = g.task(f"host:{name}", host_resource, (k - 1) * host.op_s, Category.HOST, "host") if k > 1 else first
            return g.task(name, resource, seconds, category, family, [*before, last], collective=collective)
        rest = g.task(f"host:{name}", host_resource, (k - 1) * host.op_s, Category.HOST, "host")
        g.task(name, resource, seconds * (k - 1) / k, category, family, [*before, first])
        return g.task(name, resource, seconds / k, category, family, [rest])

    return issue
