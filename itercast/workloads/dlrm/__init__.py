"""A DLRM under an embedding-table sharding (TorchRec's strategies), every rank simulated.

Where things live: config.py, what a DLRM and its job are (tables, MLPs, shards, the plan section,
the validated job, a user's sharding checked); embedding.py, one table's work on one rank and its
price (lookups, distinct rows from the index distribution or a sample of real indices, the fused
row-wise Adagrad update); step.py, one training step as a graph of every rank and the memory each
rank holds; host.py, the host overheads T1–T5 of the step's operators; sharding.py, the planner
of the fastest shardings. Importers use this package's names.
"""

from itercast.workloads.dlrm.config import (
    STRATEGIES,
    DLRMConfig,
    DLRMJob,
    DLRMPlan,
    EmbeddingTable,
    Shard,
    ShardSpec,
    Strategy,
    check_sharding,
    dlrm_model,
    is_dlrm_model,
)
from itercast.workloads.dlrm.embedding import (
    IndexSample,
    ShardWork,
    beyond_profile,
    dlrm_notes,
    embedding_seconds,
    index_stats,
    load_index_sample,
    read_index_sequence,
    replica_update_bytes,
    shard_work,
    unmeasured_embedding_ops,
    unmeasured_lookups,
)
from itercast.workloads.dlrm.host import HostModel, default_overheads, host_model, no_overheads, ops_per_task
from itercast.workloads.dlrm.sharding import ShardingResult, candidate_shards, distinct_candidates, plan_sharding
from itercast.workloads.dlrm.step import (
    DLRMStep,
    dense_activation_bytes,
    dlrm_step,
    memory_parts_per_rank,
    memory_per_rank,
    mlp_seconds,
)

__all__ = [
    "STRATEGIES",
    "DLRMConfig",
    "DLRMJob",
    "DLRMPlan",
    "DLRMStep",
    "EmbeddingTable",
    "HostModel",
    "IndexSample",
    "Shard",
    "ShardSpec",
    "ShardWork",
    "ShardingResult",
    "Strategy",
    "beyond_profile",
    "candidate_shards",
    "check_sharding",
    "default_overheads",
    "dense_activation_bytes",
    "distinct_candidates",
    "dlrm_model",
    "dlrm_notes",
    "dlrm_step",
    "embedding_seconds",
    "host_model",
    "index_stats",
    "is_dlrm_model",
    "load_index_sample",
    "memory_parts_per_rank",
    "memory_per_rank",
    "mlp_seconds",
    "no_overheads",
    "ops_per_task",
    "plan_sharding",
    "read_index_sequence",
    "replica_update_bytes",
    "shard_work",
    "unmeasured_embedding_ops",
    "unmeasured_lookups",
]
