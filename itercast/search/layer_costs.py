"""Per-layer costs for stage slicing: from the cost models (a transformer job) or a CSV of measurements.

From a job: the units are the embedding, the num_layers transformer layers and the head (logits and
loss), priced by the same unit costs as `predict` (workloads/transformer.py) for the job's tensor /
context parallel, micro-batch, sequence parallel and recompute; a send after a unit costs the
pipeline p2p of one micro-batch's activations; a unit's resident bytes are its parameters' weights,
gradients and optimizer state under the plan's ZeRO stage (memory.state_bytes_per_param), the head's
also the fp32 logits of one micro-batch; a layer holds its activations per micro-batch in flight.

From a CSV: columns `layer,time_s[,activation_bytes,memory_bytes]`; activation_bytes is what a stage
ending at that layer sends (seconds = bytes / the link bandwidth given), memory_bytes what the layer
needs resident.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from itercast.config.job import Job
from itercast.costs.analytic import AnalyticCostModel
from itercast.costs.host_overheads import host_calibrated
from itercast.errors import ConfigError, non_negative
from itercast.measurements import MAX_MEASURED_S
from itercast.memory import activation_bytes_per_token_layer, cross_entropy_peak_bytes, state_bytes_per_param
from itercast.search.stage_slicing import LayerCosts
from itercast.user_files import read_small_text
from itercast.workloads.transformer import Groups, UnitCosts, p2p_message_bytes, unit_params

MAX_CSV_BYTES = 16 << 20  # a layer table is a few KB; refuse anything huge
REQUIRED, OPTIONAL = ("layer", "time_s"), ("activation_bytes", "memory_bytes")


def job_layer_costs(job: Job, calibration: dict[str, Any] | None = None) -> tuple[LayerCosts, list[str]]:
    """Costs of the embedding, every layer (dense or MoE) and the head of `job`, and their names;
    `calibration`: curves fitted on a profiling database (`itercast calibrate`), else the built-in, and
    its host overheads, as predict takes them (host_calibrated). A unit's pass takes no less than its
    host's launches (kernels × the host's cost per kernel: predict's segments, transformer.py
    _run_segment), so host-bound layers are sliced by the time they take."""
    m, p = job.model, job.plan
    job = Job(m, p, host_calibrated(job.system, calibration))
    launch_s = job.system.gpu.kernel_launch_overhead_s
    groups = Groups.of(job)
    costs = AnalyticCostModel(job.system, p.dtype, calibration)
    u = UnitCosts.of(job, costs, groups)
    kinds = ["embed", *["moe" if m.is_moe_layer(i) else "layer" for i in range(m.num_layers)], "head"]

    def seconds(kind: str) -> float:
        fwd, bwd = u.forward(kind), u.backward(kind)
        return sum(max(c.compute_s + c.comm_s, c.kernels * launch_s) for c in (fwd, bwd))

    def per_param(shard: int) -> float:
        return float(sum(state_bytes_per_param(p, p.zero_stage, shard, p.pipeline_parallel)))

    rest_b, experts_b = per_param(groups.zero.size), per_param(groups.expert_zero.size)
    tokens = p.micro_batch_size * m.seq_length / p.context_parallel
    static = {k: e * experts_b + r * rest_b for k, (e, r) in unit_params(job).items()}
    static["head"] += tokens * p.local_vocab(m.vocab_size) * cross_entropy_peak_bytes(p)  # the loss's logits
    send = costs.p2p_s(p2p_message_bytes(job), groups.stage_cross_node, p.stage_ranks)
    activations = {
        "layer": activation_bytes_per_token_layer(job) * tokens,
        "moe": activation_bytes_per_token_layer(job, moe=True) * tokens,
    }
    priced = {k: seconds(k) for k in set(kinds)}
    out = LayerCosts.of(
        np.array([priced[k] for k in kinds]),
        np.array([send] * (len(kinds) - 1) + [0.0]),
        np.array([static[k] for k in kinds]),
        np.array([activations.get(k, 0.0) for k in kinds]),
    )
    names = ["embedding", *[f"layer {i}" for i in range(m.num_layers)], "head"]
    return out, names


def read_layer_csv(path: Path, send_bytes_per_s: float) -> tuple[LayerCosts, list[str]]:
    """A layer table (see the module docstring); every error names the file, the line and the field."""
    text = read_small_text(path, "layer-times file", MAX_CSV_BYTES)
    rows = list(csv.reader(io.StringIO(text)))
    rows = [r for r in rows if r and not r[0].lstrip().startswith("#")]
    if not rows:
        raise ConfigError(f"{path}: empty; expected a header {','.join(REQUIRED)}[,{','.join(OPTIONAL)}]")
    header = [h.strip() for h in rows[0]]
    missing = [c for c in REQUIRED if c not in header]
    unknown = [c for c in header if c not in REQUIRED + OPTIONAL]
    if missing or unknown:
        raise ConfigError(
            f"{path}: header {header}: missing {missing or 'nothing'}, unknown {unknown or 'nothing'}; "
            f"expected {','.join(REQUIRED)}[,{','.join(OPTIONAL)}]"
        )
    values: dict[str, list[float]] = {c: [] for c in header if c != "layer"}
    names = []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise ConfigError(f"{path}: line {line}: {len(row)} fields; the header has {len(header)}")
        names.append(row[header.index("layer")].strip())
        for col in values:
            cell = row[header.index(col)].strip()
            values[col].append(non_negative(cell, f"{path}: line {line}, field {col}"))
    if not names:
        raise ConfigError(f"{path}: a header but no layers")
    if twice := sorted(n for n, k in Counter(names).items() if k > 1):
        times = names.count(twice[0])
        raise ConfigError(f"{path}: layer {twice[0]!r} is given {times} times; expected one row a layer")
    if (longest := max(values["time_s"])) > MAX_MEASURED_S:  # 1e308 s overflowed the step to inf, then "no fit"
        raise ConfigError(f"{path}: field time_s: expected a layer's seconds ≤ {MAX_MEASURED_S:.0f}; got {longest:.3g}")
    activation = np.array(values.get("activation_bytes", [0.0] * len(names)))
    return (
        LayerCosts.of(
            np.array(values["time_s"]),
            activation / send_bytes_per_s,
            np.array(values.get("memory_bytes", [0.0] * len(names))),
        ),
        names,
    )
