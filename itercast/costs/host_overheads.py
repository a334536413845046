"""Host overheads T1–T5 as a cost model (DESIGN.md §4, the host-overheads family): the mean
overheads of Lin et al.'s five types, what a calibration's `host_overheads` section holds, and the
defaults. traces/host_overheads.py measures them from Kineto traces and applies them to replayed
traces; workloads/dlrm/host.py to model-built DLRM steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

VERSION = 1
KINDS = ("t2_us", "t3_us", "t5_us", "no_call_us")


class HostOverheadError(ValueError):
    """A host-overhead document is malformed; the message names the field."""


@dataclass
class HostOverheads:
    """Mean host overheads (µs): t1_us for every gap between operators; per operator name t2/t3/t5
    and no_call; per runtime call name t4; `pooled` the means over all operators; `samples` counts."""

    t1_us: float
    t4_us: dict[str, float]
    per_op: dict[str, dict[str, float]]
    pooled: dict[str, float]
    samples: dict[str, int] = field(default_factory=dict)

    def op_us(self, kind: str, name: str) -> float:
        return self.per_op.get(name, {}).get(kind, self.pooled[kind])

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "t1_us": self.t1_us,
            "t4_us": self.t4_us,
            "per_op": self.per_op,
            "pooled": self.pooled,
            "samples": self.samples,
        }

    @classmethod
    def from_dict(cls, doc: Any, where: str = "host_overheads") -> HostOverheads:
        if not isinstance(doc, dict):
            raise HostOverheadError(f"{where}: expected an object, got {type(doc).__name__}")
        if doc.get("version") != VERSION:
            raise HostOverheadError(f"{where}.version: expected {VERSION}, got {doc.get('version')!r}")
        try:
            t1 = _number(doc["t1_us"], f"{where}.t1_us")
            t4 = {str(k): _number(v, f"{where}.t4_us.{k}") for k, v in doc["t4_us"].items()}
            pooled = {k: _number(doc["pooled"][k], f"{where}.pooled.{k}") for k in KINDS}
            per_op = {
                str(name): {str(k): _number(v, f"{where}.per_op.{name}.{k}") for k, v in kinds.items()}
                for name, kinds in doc["per_op"].items()
            }
        except (KeyError, AttributeError, TypeError) as exc:
            raise HostOverheadError(f"{where}: missing or malformed field ({exc})") from None
        return cls(t1, t4, per_op, pooled, {str(k): int(v) for k, v in doc.get("samples", {}).items()})


#: Defaults where no host calibration is given: T1–T5 pooled over the three other-workload traces in
#: ../shared/data/traces (HolisticTraceAnalysis test inputs: V100 transformer, A100 transformer,
#: A100 CNN DDP; 19,224 T1 and 75,189 T4 samples), measured by
#: `python -c "from itercast.traces.kineto import read_kineto; from itercast.traces.host_overheads import measure;
#: print(measure([read_kineto(f) for f in FILES]))"` with FILES the three hta_*.json.gz. Per-operator means are
#: not kept: these are other workloads' operators, the pooled medians are the typical operator's.
DEFAULT_HOST_OVERHEADS = HostOverheads(
    t1_us=14.4,
    t4_us={"cudaLaunchKernel": 7.8, "cudaMemcpyAsync": 13.06, "cudaMemsetAsync": 7.94},
    per_op={},
    pooled={"t2_us": 12.0, "t3_us": 5.0, "t5_us": 4.0, "no_call_us": 2.0},
    samples={"t1": 19224, "t2": 14399, "t3": 14399, "t5": 60910, "no_call": 5159, "t4": 75189},
)


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value) or value < 0:
        raise HostOverheadError(f"{where}: expected a finite number ≥ 0 (µs), got {value!r}")
    return float(value)
