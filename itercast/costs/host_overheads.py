"""Host overheads T1–T5 as a cost model (DESIGN.md §4, the host-overheads family): the mean
overheads of Lin et al.'s five types, what a calibration's `host_overheads` section holds, and the
defaults. traces/host_overheads.py measures them from Kineto traces and applies them to replayed
traces; workloads/dlrm/host.py to model-built DLRM steps. Both defaults (DEFAULT_HOST_OVERHEADS here,
the TorchRec ones in host_overheads.json) price jobs other than the ones they were measured on, so
they are measured to price another workload (traces/host_overheads.py measure(…, other_workloads=True))."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from itercast.config.system import GPUSpec, SystemConfig

VERSION = 1
KINDS = ("t2_us", "t3_us", "t5_us", "no_call_us")
#: runtime calls that wait for the GPU (CUDA runtime API, "API synchronization behavior"); their time is
#: the GPU's (the replay graph and the ET walk make the host wait), so no T4 is measured or charged for them
SYNC_CALLS = frozenset({"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy"})
#: `calls_per_op`'s key for the calls that waited for the GPU (SYNC_CALLS, and async copies to pageable memory)
WAITING_CALLS = "synchronising"
LAUNCH = "cudaLaunchKernel"
#: Operators grouped by what they do on the host, for pricing an operator that launches nothing whose name
#: another workload's traces do not show often enough (HostOverheads.no_call_by_category):
#: - "view": the view operators of PyTorch's "Tensor Views" page (docs.pytorch.org/docs/stable/tensor_view.html:
#:   no data movement, a new tensor header on the same storage), reshape/flatten (a view when the strides
#:   allow), and the operators that return their input itself (lift_fresh, resolve_conj, resolve_neg, detach_);
#: - "allocation": the factory functions that allocate a tensor (empty, zeros, ones, full and their _like/new_
#:   forms), on the host alone when nothing fills it on the GPU;
#: - "autograd": the autograd engine's wrapper of a backward function (`autograd::engine::evaluate_function: …`).
VIEW_OPS = frozenset(
    f"aten::{n}"
    for n in [
        "as_strided",
        "alias",
        "chunk",
        "detach",
        "detach_",
        "diagonal",
        "expand",
        "expand_as",
        "flatten",
        "imag",
        "indices",
        "lift_fresh",
        "movedim",
        "narrow",
        "numpy_T",
        "permute",
        "real",
        "reshape",
        "resolve_conj",
        "resolve_neg",
        "select",
        "slice",
        "split",
        "split_with_sizes",
        "squeeze",
        "swapaxes",
        "swapdims",
        "t",
        "transpose",
        "unbind",
        "unflatten",
        "unfold",
        "unsqueeze",
        "values",
        "view",
        "view_as",
        "view_as_real",
        "_reshape_alias",
        "_unsafe_view",
        "tensor_split",
        "hsplit",
        "vsplit",
    ]
)
ALLOCATION_OPS = frozenset(
    f"aten::{n}"
    for n in [
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "zeros",
        "zeros_like",
        "new_zeros",
        "ones",
        "ones_like",
        "new_ones",
        "full",
        "full_like",
        "new_full",
    ]
)
AUTOGRAD_PREFIX = "autograd::engine::evaluate_function: "


def no_call_category(name: str) -> str | None:
    """The category of an operator name ("view", "allocation", "autograd": VIEW_OPS), None for any other."""
    if name in VIEW_OPS:
        return "view"
    if name in ALLOCATION_OPS:
        return "allocation"
    return "autograd" if name.startswith(AUTOGRAD_PREFIX) else None


class HostOverheadError(ValueError):
    """A host-overhead document is malformed; the message names the field."""


@dataclass
class HostOverheads:
    """Mean host overheads (µs): t1_us for every gap between operators; per operator name t2/t3/t5
    and no_call; per runtime call name t4; `pooled` the means over all operators; `samples` counts;
    `calls_per_op`: per operator name, the mean runtime calls of each name that one of its calling
    operators (one making at least one call) makes, the calls that waited for the GPU under WAITING_CALLS;
    `no_call_by_category`: no_call µs of an operator whose name per_op lacks, by its no_call_category
    (measured on other workloads' traces; empty: `pooled` prices every unseen name)."""

    t1_us: float
    t4_us: dict[str, float]
    per_op: dict[str, dict[str, float]]
    pooled: dict[str, float]
    samples: dict[str, int] = field(default_factory=dict)
    calls_per_op: dict[str, dict[str, float]] = field(default_factory=dict)
    no_call_by_category: dict[str, float] = field(default_factory=dict)

    def op_us(self, kind: str, name: str) -> float:
        """Overhead `kind` (µs) of operator `name`: its own where measured, else (no_call_us only) its
        category's, else the pooled one."""
        own = self.per_op.get(name, {}).get(kind)
        if own is not None:
            return own
        category = no_call_category(name) if kind == "no_call_us" else None
        return self.no_call_by_category.get(category, self.pooled[kind]) if category else self.pooled[kind]

    def calls_us(self, name: str) -> float | None:
        """Host µs from a calling operator `name`'s start to the end of its last runtime call, for the
        calls it makes on average (`calls_per_op`): T2 + Σ calls × T4 of the call + (calls − 1) × T5 (Lin et
        al.'s T2, T4, T5), the calls that waited for the GPU at no T4 (their wait is the GPU's). A call name
        without a T4 here costs the kernel launch's. None when `name`'s calls were never counted."""
        counts = self.calls_per_op.get(name)
        if counts is None:
            return None
        launch_us = self.t4_us.get(LAUNCH, 0.0)
        t4 = sum(n * (0.0 if c == WAITING_CALLS else self.t4_us.get(c, launch_us)) for c, n in counts.items())
        return self.op_us("t2_us", name) + t4 + max(sum(counts.values()) - 1.0, 0.0) * self.op_us("t5_us", name)

    @property
    def silent_per_launching(self) -> float:
        """Operators that launch nothing per operator that launches (their sample counts; 0 without)."""
        launching = self.samples.get("t2", 0)
        return self.samples.get("no_call", 0) / launching if launching else 0.0

    def launching_op_us(self, on_host: bool = False) -> float:
        """Host µs of one operator that launches a kernel, with its share of the operators that launch
        nothing: T1 + T2 + T4 + T3 and silent_per_launching × (T1 + no-call time); `on_host` (an accelerator
        that is the host, gpu.executes_on_host) T1 and the silent operators alone: T2 and T3 are inside the
        operator's measured time and nothing is launched (workloads/dlrm/host.py)."""
        around_launch_us = 0.0 if on_host else self.pooled["t2_us"] + self.t4_us.get(LAUNCH, 0.0) + self.pooled["t3_us"]
        return self.t1_us + around_launch_us + self.silent_per_launching * (self.t1_us + self.pooled["no_call_us"])

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "t1_us": self.t1_us,
            "t4_us": self.t4_us,
            "per_op": self.per_op,
            "pooled": self.pooled,
            "samples": self.samples,
            "calls_per_op": self.calls_per_op,
            "no_call_by_category": self.no_call_by_category,
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
            calls = {  # absent from documents written before runtime calls were counted
                str(name): {str(c): _number(n, f"{where}.calls_per_op.{name}.{c}", "calls") for c, n in counts.items()}
                for name, counts in doc.get("calls_per_op", {}).items()
            }
            categories = {  # absent from documents measured on the same software (traces/host_overheads.py)
                str(c): _number(v, f"{where}.no_call_by_category.{c}")
                for c, v in doc.get("no_call_by_category", {}).items()
            }
        except (KeyError, AttributeError, TypeError) as exc:
            raise HostOverheadError(f"{where}: missing or malformed field ({exc})") from None
        samples = {str(k): int(v) for k, v in doc.get("samples", {}).items()}
        return cls(t1, t4, per_op, pooled, samples, calls, categories)


#: Defaults where no host calibration is given: T1–T5 pooled over the three other-workload traces in
#: ../shared/data/traces (HolisticTraceAnalysis test inputs: V100 transformer, A100 transformer,
#: A100 CNN DDP; 18,071 T1 and 75,189 T4 samples), measured to price another workload (they price
#: every job but these three: T1 from gaps under 200 µs without Tukey's outliers, 9.85 µs where the mean
#: of every gap is 14.4; an operator that launches nothing at its category's median, else T1 alone;
#: traces/host_overheads.py) by
#: `python -c "from itercast.traces.kineto import read_kineto; from itercast.traces.host_overheads import measure;
#: print(measure([read_kineto(f) for f in FILES], other_workloads=True))"` with FILES the three hta_*.json.gz
#: (or `itercast calibrate --host-trace FILES --for-another-workload`). Per-operator figures are not kept:
#: these are other workloads' operators, the pooled medians are the typical operator's.
DEFAULT_HOST_OVERHEADS = HostOverheads(
    t1_us=9.85,
    t4_us={"cudaLaunchKernel": 7.8, "cudaMemcpyAsync": 13.06, "cudaMemsetAsync": 7.94},
    per_op={},
    pooled={"t2_us": 12.0, "t3_us": 5.0, "t5_us": 4.0, "no_call_us": 0.0},
    samples={"t1": 18071, "t2": 14399, "t3": 14399, "t5": 60910, "no_call": 5159, "t4": 75189},
    no_call_by_category={"view": 3.0, "allocation": 3.0, "autograd": 8.0},
)


def _number(value: Any, where: str, unit: str = "µs") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value) or value < 0:
        raise HostOverheadError(f"{where}: expected a finite number ≥ 0 ({unit}), got {value!r}")
    return float(value)


def host_calibrated(system: SystemConfig, calibration: dict[str, Any] | None) -> SystemConfig:
    """`system` with the host cost per kernel of a model-built transformer step (GPUSpec.kernel_launch_overhead_s,
    every GPU kind of it) taken from the calibration's host overheads when it has a host_overheads section
    (`itercast calibrate --host-trace`: one launching operator's HostOverheads.launching_op_us, the same figure
    a DLRM step prices an operator at); unchanged otherwise (the preset's: 11.3 µs measured
    on an H100 host)."""
    if calibration is None or "host_overheads" not in calibration:
        return system
    h = HostOverheads.from_dict(calibration["host_overheads"])

    def calibrated(gpu: GPUSpec) -> GPUSpec:
        return gpu.model_copy(update={"kernel_launch_overhead_s": h.launching_op_us(gpu.executes_on_host) * 1e-6})

    groups = tuple(g.model_copy(update={"gpu": calibrated(g.gpu)}) for g in system.device_groups)
    return system.model_copy(update={"gpu": calibrated(system.gpu), "device_groups": groups})
