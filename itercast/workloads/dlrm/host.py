"""The host side of a model-built DLRM step: which host overheads T1–T5 apply, how many operators
each task of the step issues, and the host seconds of one operator.

Lin et al. (TPDS'24, "Building a Performance Model for Deep Learning Recommendation Model Training
on GPUs"; traces/host_overheads.py names the five types) price every operator's host time: T1 before
it, T2 to its first launch, T4 per launch, T5 between launches, T3 after the last; an operator that
launches nothing (views, reshapes, most AccumulateGrad) costs T1 and the pooled no-call time of the
overheads (a user's own calibration measures it; the defaults, measured to price another workload,
carry none: the reference's rule for an operator without statistics is T1 alone). A DLRM
step issues hundreds of small operators, so its host often sets the pace (the PARAM DLRM 8 × V100
trace: 505 top-level operators per rank, most under 50 µs of GPU time).

Overheads: the calibration's `host_overheads` section when it has one (`itercast calibrate
--host-trace` of the user's own run: "own trace"; measured on another workload's traces when the
calibration names them in `host_overheads_source`: "other trace"), else the TorchRec defaults in
costs/host_overheads.json (measured on the PARAM DLRM traces: "other trace" for any other job).

On a system whose accelerator is the host (a CPU) an operator's T2 and T3 (its host time before and
after its kernel) and its kernel run on one thread as one stretch: the operator's measured time
(profile/microbench.py _time: perf_counter around the call, dispatch included; a trace's operator
duration) holds them already, so only what lies between operators is added: T1 before each one, and
the silent operators (T1 and their no-call time). A CPU trace has no runtime calls, so its overheads
tell no operator apart as silent (silent_per_launching 0): every operator there is a counted one.

Operators per task are counted from the model, one per launching PyTorch operator, as TorchRec and
PyTorch issue them (each count cites its source below); the operators that launch nothing come on
top in the measured ratio (`silent_per_launching`: the defaults' 2,730 no-call operators to 1,304
launching ones). APPROXIMATIONS: every operator has the typical (pooled) T2/T3, not its own; one
launch per operator (no T5). TorchRec's table-batched lookups fuse a rank's tables of one sharding type
into one operator (group_tables), counted so, its data-parallel tables one dense parameter updated once; the pooled
exchanges, sharded updates and dense gradients as TorchRec, FBGEMM and DDP issue them, or, for a model whose
`exchange` is point_to_point (one lookup and one update a table),
as tools/measure_dlrm_sharding.py's emulation does (point-to-point sends and their concatenations, a
gather of each lookup's gradient before the update, one flat gradient buffer: exchange_ops); the host
never waits for the GPU (TorchRec's input distribution syncs for its splits: not modelled).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any

from itercast.config.plan import TORCH_DDP_BUCKET_BYTES
from itercast.config.system import SystemConfig
from itercast.costs.host_overheads import KINDS, HostOverheads
from itercast.workloads.dlrm.config import DLRMConfig, Shard
from itercast.workloads.dlrm.embedding import F32

LAUNCH = "cudaLaunchKernel"
#: PyTorch ops per MLP layer: forward aten::linear (addmm) and aten::relu; backward AddmmBackward0,
#: ReluBackward0 and an AccumulateGrad for the weight and the bias (torch/csrc/autograd: one
#: evaluate_function per graph node, as the PARAM trace's autograd thread shows)
MLP_FWD_OPS, MLP_BWD_OPS = 2, 4
#: the dot interaction, forward and backward: cat, bmm, the upper-triangle index, cat
#: (facebookresearch/dlrm dlrm_s_pytorch.py interact_features); DCNv2's cross layers are MLP layers
DOT_OPS, CAT_OPS = 4, 1
LOSS_OPS = 1  # binary_cross_entropy_with_logits, and its backward
#: Adam per parameter tensor: step += 1, exp_avg.lerp_, exp_avg_sq.mul_ and addcmul_, sqrt, div, add
#: ε, addcdiv_ (torch/optim/adam.py _single_tensor_adam, the default for CPU tensors); on GPUs the
#: foreach path issues the same 8 operators once for all tensors (_multi_tensor_adam)
ADAM_OPS = 8
#: a data-parallel table's dense row-wise Adagrad: vector_norm, pow_, div_, add_ to the state; sqrt,
#: add ε, −lr / x (reciprocal, mul), addcmul_ (tools/measure_dlrm_sharding.py, ShardedDLRM.step)
DENSE_ADAGRAD_OPS = 9
#: a data-parallel table's backward: its dense gradient zeroed (zeros_like), the lookups' pooled
#: gradients gathered (index) and added into it (index_add_) (ShardedDLRM.step)
REPLICA_BWD_OPS = 3


@dataclass(frozen=True)
class HostModel:
    """Host overheads for a model-built step: seconds per launching operator (with its share of
    silent ones), whether the host's operators run on the compute resource itself (a CPU: they add
    to the step) and where the overheads came from."""

    op_s: float
    on_compute: bool
    source: str


def default_overheads() -> tuple[HostOverheads, str]:
    """The TorchRec defaults (costs/host_overheads.json) and their source."""
    doc = json.loads(resources.files("itercast.costs").joinpath("host_overheads.json").read_text())
    return HostOverheads.from_dict(doc["host_overheads"], "costs/host_overheads.json"), doc["source"]


def no_overheads() -> HostOverheads:
    """Zero host time: the step of the GPU streams alone."""
    return HostOverheads(0.0, {}, {}, dict.fromkeys(KINDS, 0.0))


def host_model(
    system: SystemConfig, calibration: dict[str, Any] | None, overheads: HostOverheads | None = None
) -> HostModel:
    """`overheads` when given, else the calibration's host_overheads section ("own trace", or "other
    trace" where `host_overheads_source` names the traces it was measured on), else the TorchRec
    defaults ("other trace"). One launching operator costs HostOverheads.launching_op_us: T1 + T2 + T4 +
    T3 and `silent_per_launching` × (T1 + no-call time); on a system whose accelerator is the host
    (gpu.executes_on_host) T1 and the silent operators alone (module docstring: T2 and T3 are inside
    the operator's measured time, nothing is launched) and the host time adds to the compute."""
    if overheads is not None:
        h, source = overheads, "given"
    elif calibration is not None and "host_overheads" in calibration:
        h = HostOverheads.from_dict(calibration["host_overheads"])
        other = calibration.get("host_overheads_source")
        source = f"other trace: {other}" if other else "own trace (calibration host_overheads)"
    else:
        h, where = default_overheads()
        source = f"other trace: costs/host_overheads.json, {where.split(' (')[0]}"
    on_host = system.gpu.executes_on_host
    return HostModel(h.launching_op_us(on_host) * 1e-6, on_host, source)


POOLED = ("table_wise", "column_wise")


def exchange_ops(plan: dict[str, Shard], rank: int, world: int) -> tuple[int, int, int]:
    """(forward, backward, received) operators of the pooled exchanges on `rank`, as
    tools/measure_dlrm_sharding.py ShardedDLRM issues them. Forward: an owner of table- or
    column-wise shards concatenates its pooled parts for itself and for each peer and sends each
    peer its part (cat + isend), every rank receives from each peer that owns one (irecv); row-wise
    partial sums are concatenated and reduce-scattered (cat + reduce_scatter_tensor). Backward: each
    rank concatenates and sends every owning peer its gradients, an owner concatenates its own and
    receives from each peer; row-wise gradients concatenated and all-gathered. Received: each
    pooled table's columns concatenated from what arrived (one cat a table, after the exchange)."""
    owners = {r for s in plan.values() if s.strategy in POOLED for r in s.ranks}
    owns, peers = rank in owners, len(owners - {rank})
    row_wise = 2 * any(s.strategy == "row_wise" for s in plan.values())
    forward = owns * (1 + 2 * (world - 1)) + peers + row_wise
    backward = 2 * peers + owns * (1 + (world - 1)) + row_wise
    return forward, backward, sum(s.strategy in POOLED for s in plan.values())


def ops_per_task(
    model: DLRMConfig, plan: dict[str, Shard], rank: int, world: int, foreach_optimizer: bool
) -> dict[str, int]:
    """Launching operators each task of dlrm_step's graph issues on `rank` (module docstring), as the
    job's program issues them (model.exchange): TorchRec's collectives, FBGEMM's fused updates and
    PyTorch DDP's buckets, or the point-to-point emulation of tools/measure_dlrm_sharding.py."""
    mine = [s for s in plan.values() if rank in s.ranks]
    replicas = sum(s.strategy == "data_parallel" for s in mine)
    sharded = len(mine) - replicas
    layers = model.mlp_layers()
    bottom, top = len(model.bottom_mlp), len(layers) - len(model.bottom_mlp)
    interaction = DOT_OPS if model.interaction == "dot" else CAT_OPS
    mlp_tensors = 2 * len(layers)  # a weight and a bias per layer
    ddp = world > 1  # one rank exchanges nothing
    adam = ADAM_OPS if foreach_optimizer else ADAM_OPS * 2 * len(layers)
    ops = {
        # TorchRec's KJT all-to-all: the lengths, then the indices (torchrec/distributed/dist_data.py)
        "index_exchange": 2 if model.input_distribution and ddp else 0,
        "embedding_fwd": len(mine),
        "bottom_mlp_fwd": MLP_FWD_OPS * bottom,
        # the top MLP's last layer, the logit, has no ReLU forward nor ReluBackward0 (mlp_seconds)
        "interaction_top_mlp_fwd_bwd": 2 * (interaction + LOSS_OPS) + (MLP_FWD_OPS + MLP_BWD_OPS) * top - 2,
        "bottom_mlp_bwd": MLP_BWD_OPS * bottom,
        "optimizer": adam + DENSE_ADAGRAD_OPS * replicas,
    }
    if model.exchange == "torchrec":
        # one output dist per sharding type (torchrec/distributed/embeddingbag.py _output_dists)
        kinds = {s.strategy for s in plan.values()} & {*POOLED, "row_wise"}
        exchanges = len(kinds) * ddp
        # TorchRec batches a rank's tables of one sharding type into one table-batched lookup (embedding_sharding.py
        # group_tables: by data type, pooling, weighting and compute kernel, which every table here shares): one
        # lookup and one backward per sharding type on the rank; its data-parallel tables one dense parameter
        here = {s.strategy for s in mine}
        replica_groups = int(replicas > 0)
        dense_tensors = mlp_tensors + replica_groups  # and the replica tables' one dense gradient
        replicated = [t for t in model.tables if t.name in plan and plan[t.name].strategy == "data_parallel"]
        dense_bytes = (model.mlp_params() + sum(t.num_rows * t.embedding_dim for t in replicated)) * F32
        return ops | {
            "embedding_fwd": len(here),
            "optimizer": adam + DENSE_ADAGRAD_OPS * replica_groups,
            # an all-to-all per table- and column-wise, a reduce-scatter for row-wise
            "pooled_exchange": exchanges,
            "replica_embedding_bwd": replica_groups,  # FBGEMM's dense table-batched backward
            # DDP copies each gradient into its bucket dividing it (c10d reducer.cpp copy_grad_to_bucket,
            # at::mul_out) or divides its bucket view, all-reduces each bucket; TorchRec's DDP views the
            # buckets as the gradients (gradient_as_bucket_view=True): nothing copied back
            "ddp_to_buckets": dense_tensors if ddp else 0,
            "grad_all_reduce": math.ceil(dense_bytes / TORCH_DDP_BUCKET_BYTES) if ddp else 0,
            "pooled_grad_exchange": exchanges,
            "embedding_bwd": len(here - {"data_parallel"}),  # FBGEMM's backward with its fused optimizer
            "ddp_from_buckets": 0,
        }
    owned_pooled = sum(s.strategy in POOLED for s in mine)
    forward, backward, received = (n * ddp for n in exchange_ops(plan, rank, world))
    return ops | {
        "pooled_exchange": forward,
        # the pooled tables' received columns concatenated before the interaction
        "interaction_top_mlp_fwd_bwd": ops["interaction_top_mlp_fwd_bwd"] + received,
        "replica_embedding_bwd": REPLICA_BWD_OPS * replicas,
        # the dense gradients in one flat buffer: one cat, one all-reduce; after it the buffer divided
        # (div_) and each MLP gradient copied back (copy_)
        "ddp_to_buckets": 1 if ddp else 0,
        "grad_all_reduce": 1 if ddp else 0,
        "pooled_grad_exchange": backward,
        # per shard: its lookups' gradients gathered (index; a table- or column-wise shard's first
        # concatenated from the peers': cat), then the row-wise Adagrad update (one operator)
        "embedding_bwd": 2 * sharded + owned_pooled * ddp,
        "ddp_from_buckets": 1 + mlp_tensors if ddp else 0,
    }
