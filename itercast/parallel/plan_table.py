"""Many plans of one model and system as numpy columns: what the fast path and the search work on.

The columns are the plan fields a search varies; every other plan field (dtype, flash attention,
gradient bucket and reduction dtype) is shared by the whole table and kept in `base`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from itercast.config.job import Job
from itercast.config.plan import PlanConfig, local_vocab_rows
from itercast.parallel.schedules import SCHEDULES

RECOMPUTE = ("none", "selective", "full")

#: column -> the plan field it holds (codes index SCHEDULES / RECOMPUTE)
COLUMNS = {
    "tp": "tensor_parallel",
    "pp": "pipeline_parallel",
    "cp": "context_parallel",
    "dp": "data_parallel",
    "ep": "expert_parallel",
    "etp": "expert_tensor_parallel",
    "vp": "virtual_pipeline",
    "mbs": "micro_batch_size",
    "gbs": "global_batch_size",
    "schedule": "schedule",
    "zero": "zero_stage",
    "recompute": "recompute",
    "sp": "sequence_parallel",
    "overlap_grad": "overlap_grad_reduce",
    "overlap_param": "overlap_param_gather",
    "shard": "zero_shard_ranks",  # 0: ZeRO's state over every data × context rank (the field unset)
}
VARIED = set(COLUMNS.values())


@dataclass(frozen=True)
class PlanTable:
    """Plans as int64 columns (one row a plan) plus the fields they share (`base`)."""

    cols: dict[str, np.ndarray]
    base: PlanConfig

    def __len__(self) -> int:
        return int(self.cols["tp"].shape[0])

    @property
    def microbatches(self) -> np.ndarray:
        return self.cols["gbs"] // (self.cols["mbs"] * self.cols["dp"])

    @property
    def whole_residual_mlp(self) -> np.ndarray:
        """Per row, PlanConfig.whole_residual_mlp: DeepSpeed's PR-MoE residual MLP whole on every tensor-parallel
        rank (expert tensor parallel 1 under its MoE layer)."""
        return self.base.deepspeed_moe & (self.cols["etp"] == 1)

    def local_vocab(self, vocab_size: int) -> np.ndarray:
        """Vocabulary rows one tensor-parallel rank holds, per row (PlanConfig.local_vocab's padding)."""
        return local_vocab_rows(vocab_size, self.cols["tp"], self.base.make_vocab_size_divisible_by)

    def plan_fields(self, row: int) -> dict[str, Any]:
        """Canonical plan fields of one row (the shared ones included)."""
        out = self.base.model_dump(mode="json")
        for col, name in COLUMNS.items():
            value = int(self.cols[col][row])
            if col == "schedule":
                out[name] = SCHEDULES[value]
            elif col == "recompute":
                out[name] = RECOMPUTE[value]
            elif col in ("sp", "overlap_grad", "overlap_param"):
                out[name] = bool(value)
            elif col == "shard":
                out[name] = value or None
            else:
                out[name] = value
        if out["recompute"] != "selective":  # Megatron-Core reads its modules under selective recompute only
            out["recompute_modules"] = ["core_attn"]
        if out["recompute"] != "full":  # and the layers it recomputes under full recompute only
            out |= {"recompute_method": "uniform", "recompute_num_layers": 1, "recompute_every": 1}
        return out

    @classmethod
    def of_jobs(cls, jobs: Sequence[Job]) -> PlanTable:
        """The table of validated jobs' plans; they must share the fields outside the columns."""
        base = jobs[0].plan
        shared = base.model_dump(exclude=VARIED)
        for job in jobs[1:]:
            if job.plan.model_dump(exclude=VARIED) != shared:
                raise ValueError(
                    "plans of one table must share the fields outside its columns (dtype, flash attention, "
                    "bucket and reduce dtype, recompute method and layers)"
                )
        cols: dict[str, list[int]] = {k: [] for k in COLUMNS}
        for job in jobs:
            p = job.plan
            for col, name in COLUMNS.items():
                value = getattr(p, name)
                if col == "schedule":
                    value = SCHEDULES.index(value)
                elif col == "recompute":
                    value = RECOMPUTE.index(value)
                cols[col].append(int(value or 0))
        return cls({k: np.asarray(v, dtype=np.int64) for k, v in cols.items()}, base)
