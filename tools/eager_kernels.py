"""The memory-bound kernel model on eager PyTorch kernels, kernel by kernel (issue 27 item 4).

plan.pointwise_kernels eager prices torchtitan's norms, rotary and SwiGLU as chains of PyTorch's own
elementwise and reduction kernels (workloads/transformer_ops.py eager_*_cost) with the `elementwise`
memory curve. This checks that curve against eager kernels measured on an H100: the Kineto traces of
data/measured/h100_traces (eager GPT, DLRM and CNN iterations, fp32; torch 2.11) joined to their
execution traces for each operator's tensors. A kernel counts when its operator is one of the
pointwise or reduction operators of EAGER_OPS and launched only it; its bytes are aten_ops.features'
(its tensors' bytes), less the written-only `self` of copy_ and fill_, which features counts as read
too; predicted by AnalyticCostModel.memory_s(`elementwise`) on dgx-h100. No step time is read.

    python tools/eager_kernels.py
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from itercast.config.job import Job
from itercast.costs.analytic import AnalyticCostModel
from itercast.costs.aten_ops import features, tensor_bytes
from itercast.traces.execution_trace import link, read_execution_trace
from itercast.traces.kineto import read_kineto

TRACES = Path(__file__).resolve().parents[1] / "data/measured/h100_traces"
#: PyTorch's pointwise and reduction operators (vectorized_elementwise_kernel, reduce_kernel), what eager
#: chains run; fused attention, convolutions, losses, lookups and multi-tensor optimizer kernels left out
EAGER_OPS = {
    "aten::add", "aten::add_", "aten::sub_", "aten::mul", "aten::mul_", "aten::div", "aten::div_",
    "aten::copy_", "aten::fill_", "aten::clamp_min", "aten::threshold_backward", "aten::gelu",
    "aten::gelu_backward", "aten::sigmoid", "aten::sum", "aten::mean", "aten::cat",
}  # fmt: skip
WRITE_ONLY_SELF = {"aten::copy_", "aten::fill_"}
#: size classes (upper bounds in bytes): H100's 50 MB L2 holds the smaller ones
SIZES = (("< 1 MB", 2**20), ("1-16 MB", 2**24), (">= 16 MB", math.inf))


def kernels(case: str) -> list[tuple[str, float, float]]:
    """(operator, bytes, measured µs) of each EAGER_OPS kernel its operator launched alone."""
    kineto = read_kineto(TRACES / f"{case}.kineto.json.gz")
    et = read_execution_trace(TRACES / f"{case}.et.json.gz")
    lk = link(et, kineto)
    launched = Counter(lk.cpu_op_of_gpu_op.values())
    out = []
    for k in np.flatnonzero(kineto.op_kind == 0).tolist():
        cpu = lk.cpu_op_of_gpu_op.get(k)
        node = lk.node_of_gpu_op(et, k)
        if node is None or cpu is None or launched[cpu] != 1 or node.name not in EAGER_OPS:
            continue
        nbytes = features(node).size
        if node.name in WRITE_ONLY_SELF:
            nbytes -= tensor_bytes(node.input_shapes[:1], node.input_types[:1])
        out.append((node.name, nbytes, float(kineto.op_dur_us[k])))
    return out


def main() -> None:
    costs = AnalyticCostModel(Job.from_presets("llama3-8b", "dgx-h100").system, "fp32")
    rows: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for case in sorted({p.name.split(".")[0] for p in TRACES.glob("*.kineto.json.gz")}):
        for name, moved, us in kernels(case):
            rows[name].append((moved, us))
    print(f"{'operator':26s} {'kernels':>7s} {'median bytes':>12s} {'measured us':>11s} {'predicted us':>12s}")
    logs: dict[str, list[float]] = defaultdict(list)
    for name, xs in sorted(rows.items(), key=lambda r: -len(r[1])):
        nbytes = np.array([b for b, _ in xs])
        measured = np.array([u for _, u in xs])
        predicted = np.asarray(costs.memory_s("elementwise", nbytes)) * 1e6
        on_norm = np.asarray(costs.memory_s("norm", nbytes)) * 1e6  # the fused-norm curve, for comparison
        for b, m, p, q in zip(nbytes, measured, predicted, on_norm, strict=True):
            logs["all"].append(math.log(p / m))
            logs[next(part for part, top in SIZES if b < top)].append(math.log(p / m))
            if b >= 2**24:
                logs[">= 16 MB on the norm curve"].append(math.log(q / m))
        print(
            f"{name:26s} {len(xs):7d} {np.median(nbytes):12,.0f} {np.median(measured):11.2f} "
            f"{np.median(predicted):12.2f}"
        )
    for part, ls in logs.items():
        a = np.array(ls)
        print(
            f"{part}: {a.size} kernels, geomean predicted/measured {math.exp(a.mean()):.2f}, "
            f"geomean |error| {math.exp(np.abs(a).mean()) - 1:.0%}"
        )


if __name__ == "__main__":
    main()
