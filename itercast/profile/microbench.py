"""Microbenchmarks on the local device (torch: CPU here, CUDA when present) into a profiling database.

Families (the grids are QUICK and FULL below):
- gemm: aten::mm over (M, N, K) and the three layouts training uses (nn: x·W, nt: x·Wᵀ in the
  forward, tn: gradient·x for the weight gradient); aten::bmm over (batch, M, N, K);
- conv: aten::convolution and aten::convolution_backward (2-D, 3×3 and 1×1);
- attention: fused scaled-dot-product attention forward and backward, causal and not;
- norm: layer norm, batch norm, softmax and log-softmax, forward and backward;
- elementwise: add (new output and in place), mul, gelu, relu, copy, sum and gelu backward over sizes;
- embedding: EmbeddingBag forward and backward, and the fused sparse row-wise Adagrad update
  (op_calls.rowwise_adagrad_update), over rows × dim × pooling factor × index distribution (uniform,
  Zipf 1.05), with the fraction of distinct rows among the indices measured;
- host: small programs of tiny operators (Python calls, nested calls, autograd functions), whose
  counts of each come from an execution trace of the program, to fit the per-call host overheads;
- collective: all-reduce, all-gather, reduce-scatter and all-to-all through torch.distributed across
  local processes (profile/collective_bench.py: gloo on CPU, NCCL on CUDA).
Every row stores its operator call (name, shapes, types, strides, scalars; costs/aten_ops.OpCall),
so a calibration prices a trace's operators from the same description; profile/op_calls.py sets up
each configuration's tensors, closure and call.

Each configuration runs `warmup` times, then between 3 and `repeats` timed runs (fewer once 0.5 s
of timed runs have passed), each after caches are flushed (FLUSH_BYTES, or `flush_bytes`); the
median and the standard deviation are kept. A configuration
already in the database for this device fingerprint is skipped, so an interrupted run resumes.
Timing: perf_counter on CPU; CUDA events with synchronisation on a GPU.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from rich.progress import Progress, TaskID

from itercast.costs.aten_ops import OpCall, features
from itercast.measurements import Measurement, ProfileError
from itercast.profile import collective_bench
from itercast.profile.db import ProfileDB

# rowwise_adagrad_update is re-exported: tests/test_dlrm.py imports it from here
from itercast.profile.op_calls import prepare, rowwise_adagrad_update  # noqa: F401

#: written before every timed run so that caches start cold (twice the 32 MiB L3 of the machine here;
#: above the 50 MiB L2 of an H100): inside a training iteration an operator's inputs were written
#: many operators earlier, so timing them hot in cache under-prices memory-bound operators 4–8×
FLUSH_BYTES = 64 << 20
#: GPU clock cycles of the spin queued before each timed GPU run (~0.5 ms at 1.98 GHz)
GPU_HOLD_CYCLES = 1_000_000
FAMILIES = ("gemm", "conv", "attention", "norm", "elementwise", "embedding", "host", "collective")
QUICK: dict[str, Any] = {
    "gemm": [64, 256, 1024],
    "layouts": ["nn"],
    "bmm": [],
    "conv": [(8, 16, 16, 16, 3)],
    "attention": [(2, 64, 32)],
    "norm_rows": [256],
    "norm_cols": [256],
    "elementwise": [1 << 14, 1 << 18, 1 << 22],
    "embedding_rows": [10_000],
    "embedding_dims": [64],
    "pooling": [1, 16],
    "distributions": ["uniform", "zipf"],
    "host": ["view", "tiny_add"],
    "collective": collective_bench.QUICK,
}
FULL: dict[str, Any] = {
    "gemm": [64, 128, 256, 512, 1024, 2048],
    "layouts": ["nn", "nt", "tn"],
    # and a DLRM's interaction: b samples' F × d by d × F (F = tables + 1) products, and its backward's F × F by F × d
    "bmm": [(b, m, n, k) for b in (8, 32) for m, n, k in itertools.product((32, 128, 512), repeat=3)]
    + [(b, f, n, k) for b in (256, 2048) for f in (5, 27) for d in (32, 128) for n, k in ((f, d), (d, f))],
    # (batch, channels in, channels out, height = width, kernel)
    "conv": [
        (b, ci, co, hw, ks)
        for b, ci, co, hw, ks in itertools.product((8, 32), (16, 64), (16, 64), (8, 32), (1, 3))
        if not (b == 32 and hw == 32 and ci == co == 64)
    ],
    # (batch × heads, sequence, head dim)
    "attention": [(bh, s, d) for bh in (8, 32) for s in (64, 128, 256, 512) for d in (32, 64)],
    "norm_rows": [64, 256, 1024, 2048, 4096, 8192],
    "norm_cols": [64, 256, 1024],
    "elementwise": [1 << k for k in range(10, 27)],  # up to 256 MiB per tensor (a 1M × 64 table)
    "embedding_rows": [10_000, 100_000, 1_000_000],  # 100k × 32 / × 128: 12.8 / 51 MB, either side of 32 MiB
    "embedding_dims": [32, 128],
    # bags per call: a sharded table pools for every rank's samples (2 ranks × 2048 in the DLRM
    # measurement; MLPerf DLRM-DCNv2 runs 8,192+ per GPU): 4096 × pooling 128 reaches 524k lookups
    "embedding_batches": [512, 4096],
    "pooling": [1, 8, 32, 128],
    "distributions": ["uniform", "zipf"],
    "host": [
        "view",
        "transpose",
        "tiny_add",
        "tiny_chain_backward",
        "tiny_view_backward",
        "tiny_linear_backward",
        "tiny_mlp_step",
    ],
    "collective": collective_bench.FULL,
}
#: the full grid on a GPU: the same operators at sizes that fill one (an H100 runs an fp32 1024³
#: product in ~0.1 ms and a 16 MiB add in ~15 µs, so FULL's sizes mostly time launch latency), and
#: embedding bags also at a training batch of 8192 bags
GPU: dict[str, Any] = FULL | {
    "gemm": [64, 256, 1024, 2048, 4096, 8192],
    "bmm": [(b, m, n, k) for b in (8, 64) for m, n, k in itertools.product((32, 128, 512, 2048), repeat=3)],
    "conv": list(itertools.product((32, 512), (16, 64, 128), (16, 64, 128), (8, 16, 32), (1, 3))),
    "attention": [(bh, s, d) for bh in (8, 32, 128) for s in (64, 128, 256, 512, 1024) for d in (32, 64)],
    "norm_rows": [1 << k for k in range(6, 21, 2)],  # 64 … 1M rows
    "norm_cols": [32, 128, 512, 4096],
    "norm_max_elements": 1 << 28,
    "elementwise": [1 << k for k in range(10, 29)],
    "embedding_batches": [512, 8192],
}
NORM_OPS = ("layer_norm", "batch_norm", "softmax", "log_softmax")
ELEMENTWISE_OPS = ("add", "add_", "mul", "gelu", "relu", "copy", "sum", "gelu_backward")


def _config(params: dict[str, Any]) -> dict[str, Any]:
    """The configuration part of stored params (what a resumed run compares), without what was measured."""
    return {k: v for k, v in params.items() if k not in ("features", "call", "counts", "host_issue_s")}


def fingerprint(device: str) -> dict[str, Any]:
    """What identifies the machine that measured (so results are never mixed across machines)."""
    import torch

    fp: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": device,
    }
    try:
        with open("/proc/cpuinfo") as fh:
            fp["cpu"] = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        fp["cpu"] = platform.processor()
    if device.startswith("cuda"):
        fp["gpu"] = torch.cuda.get_device_name(0)
    return fp


def configs(grid: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(family, op, params) of every configuration of the grid."""
    for (m, n, k), layout in itertools.product(itertools.product(grid["gemm"], repeat=3), grid["layouts"]):
        yield "gemm", "mm", {"m": m, "n": n, "k": k, "layout": layout}
    for b, m, n, k in grid["bmm"]:
        yield "gemm", "bmm", {"batch": b, "m": m, "n": n, "k": k}
    for (b, ci, co, hw, ks), direction in itertools.product(grid["conv"], ("fwd", "bwd")):
        yield "conv", f"conv2d_{direction}", {"batch": b, "c_in": ci, "c_out": co, "hw": hw, "kernel": ks}
    for (bh, s, d), causal, direction in itertools.product(grid["attention"], (False, True), ("fwd", "bwd")):
        yield "attention", f"sdpa_{direction}", {"batch_heads": bh, "seq": s, "head_dim": d, "causal": causal}
    for op, rows, cols, direction in itertools.product(NORM_OPS, grid["norm_rows"], grid["norm_cols"], ("fwd", "bwd")):
        if rows * cols <= grid.get("norm_max_elements", rows * cols):
            yield "norm", f"{op}_{direction}", {"rows": rows, "cols": cols}
    for op, size in itertools.product(ELEMENTWISE_OPS, grid["elementwise"]):
        yield "elementwise", op, {"elements": size}
    for rows, dim, pool, dist, batch, direction in itertools.product(
        grid["embedding_rows"],
        grid["embedding_dims"],
        grid["pooling"],
        grid["distributions"],
        grid.get("embedding_batches", [512]),
        ("fwd", "bwd", "update"),
    ):
        params = {"rows": rows, "dim": dim, "pooling": pool, "distribution": dist, "batch": batch}
        yield "embedding", f"embedding_bag_{direction}", params
    for program in grid["host"]:
        yield "host", program, {"calls": 100}
    yield from collective_bench.configs(grid["collective"])


def _time(
    fn: Callable[[], Any],
    device: str,
    warmup: int,
    repeats: int,
    budget_s: float = 0.5,
    host: bool = False,
    flush_bytes: int = FLUSH_BYTES,
) -> tuple[list[float], list[float]]:
    """Seconds of each timed run of `fn`, and on a GPU the host's issue time of each run that did not
    wait for the device. On a GPU the times are the device's (CUDA events), with the stream held
    busy by a GPU_HOLD_CYCLES spin while the host issues the call, so the host's issue time stays
    out of them and is timed on its own (perf_counter around the call: the iteration model puts it
    on the host's timeline); a call whose issue outlasted 90% of the spin waited for the device and
    gives no issue time. `host`: wall-clock time to the end of the device's work instead (the host
    programs, whose tiny kernels finish before the next is issued)."""
    import torch

    cuda = device.startswith("cuda")
    flush = torch.empty(max(flush_bytes // 4, 1), device=device)
    issue: list[float] = []
    with torch.no_grad():
        for _ in range(warmup):
            fn()
        times: list[float] = []
        while len(times) < repeats and (len(times) < 3 or sum(times) < budget_s):
            flush.fill_(len(times))  # cold caches, as for an operator inside an iteration
            if cuda and not host:
                hold, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
                hold.record()
                torch.cuda._sleep(GPU_HOLD_CYCLES)
                start.record()
                t0 = time.perf_counter()
                fn()
                issue_s = time.perf_counter() - t0
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) * 1e-3)
                if issue_s < 0.9e-3 * hold.elapsed_time(start):
                    issue.append(issue_s)
            else:
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                if cuda:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
    return times, issue


def check_device(device: str) -> None:
    """torch is installed and the device exists here, else one clear error (not torch's AssertionError)."""
    try:
        import torch
    except ImportError:
        raise ProfileError("itercast profile needs torch: pip install 'itercast[torch]' (CPU build 2.13.0)") from None
    if device == "cpu":
        return
    if device.split(":")[0] != "cuda":
        raise ProfileError(f"--device {device}: expected cpu or cuda (cuda:N)")
    if not torch.cuda.is_available():
        why = "this torch has no CUDA (the CPU build)" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ProfileError(f"--device {device}: {why}; measure on a machine with a GPU, or use --device cpu")
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise ProfileError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def run(
    db: ProfileDB,
    device: str = "cpu",
    quick: bool = False,
    families: tuple[str, ...] = FAMILIES,
    warmup: int = 3,
    repeats: int = 10,
    passes: int = 1,
    threads: int | None = None,
    embedding_batches: tuple[int, ...] | None = None,
    embedding_dims: tuple[int, ...] | None = None,
    collective_ranks: tuple[int, ...] | None = None,
    flush_bytes: int = FLUSH_BYTES,
) -> dict[str, int]:
    """Measure every configuration not yet in the database for this device. Returns counts.

    `embedding_batches`: the bags per embedding call, instead of the grid's; `embedding_dims`: the
    tables' widths, instead of the grid's. `collective_ranks`: the
    group sizes of the collectives, instead of the grid's (2): more ranks than cores measures the
    host as a run that oversubscribes it would use it (replay's `--dp`/`--tp` what-ifs on a CPU trace).

    `threads`: torch's intra-op threads (default: torch's, one per core); a CPU that runs one rank
    per core is profiled with 1. The count is part of the device's fingerprint.

    `flush_bytes`: bytes written before each timed run (default: a GPU's L2 or a CPU's last-level
    cache whole). A size other than the default is part of the device's fingerprint. Inside a step a
    CPU rank's operator finds the cache as the operators before it left it: on this project's 2-core VM
    the row-wise update ran inside measured DLRM steps about as fast as after a 16 MiB flush (in-step /
    flushed, geomean 0.89, 0.83, 1.07 under 1k, 1k–10k and over 10k lookups; 0.52, 0.67, 1.08 after
    64 MiB: data/measured/cpu_update_in_step.csv), but the whole grid profiled that way priced the
    sharding tasks' steps 20–26% too fast (data/measured/README.md: cpu_profile_1thread_corun_flush16.db),
    so the default stays.

    Each pass runs in its own seeded shuffled order. passes > 1: the whole grid `passes` times, each
    row stored as it is measured (params["pass"]), so that a host whose speed drifts over minutes
    (this project's 2-core VM: most families of the grid measured 1.2–2.3× slower in one 3-minute
    stretch than in another) is sampled across the whole run; the database reads each
    configuration as the median of its passes (ProfileDB.measurements)."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # quiets the trace observer's notices (read at import)
    check_device(device)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    unknown = set(families) - set(FAMILIES)
    if unknown:
        raise ProfileError(f"unknown families {sorted(unknown)}: expected some of {', '.join(FAMILIES)}")
    fp = fingerprint(device) | ({"flush_bytes": flush_bytes} if flush_bytes != FLUSH_BYTES else {})
    dev = db.device(fp.get("gpu") or fp.get("cpu") or device, fp)
    if passes < 1:
        raise ProfileError(f"passes: expected 1 or more, got {passes}")
    done = {_pass_key(m.family, m.op, m.params) for m in db.measurements(device_id=dev, passes=True)}
    chosen = QUICK if quick else GPU if device.startswith("cuda") else FULL
    if embedding_batches:
        chosen = chosen | {"embedding_batches": list(embedding_batches)}
    if embedding_dims:
        chosen = chosen | {"embedding_dims": list(embedding_dims)}
    if collective_ranks:
        chosen = chosen | {"collective": chosen["collective"] | {"ranks": list(collective_ranks)}}
    grid = [c for c in configs(chosen) if c[0] in families]
    if passes > 1:
        grid = [(f, op, params | {"pass": k}) for k in range(1, passes + 1) for f, op, params in grid]
    todo = [c for c in grid if _pass_key(*c) not in done]
    with Progress(transient=True) as bar:
        task = bar.add_task("profiling", total=len(todo))
        for k in sorted({c[2].get("pass", 1) for c in todo}):
            this_pass = [c for c in todo if c[2].get("pass", 1) == k]
            _measure_pass(db, dev, k, this_pass, device, warmup, repeats, bar, task, flush_bytes)
    return {"measured": len(todo), "already there": len(done)}


def _pass_key(family: str, op: str, params: dict[str, Any]) -> tuple[str, str, str]:
    """A configuration and its pass (a row of a single-pass run is pass 1), as resuming compares them."""
    return family, op, json.dumps(_config(params) | {"pass": params.get("pass", 1)}, sort_keys=True)


def _measure_pass(
    db: ProfileDB,
    dev: int,
    pass_number: int,
    todo: list[tuple[str, str, dict[str, Any]]],
    device: str,
    warmup: int,
    repeats: int,
    bar: Progress,
    task: TaskID,
    flush_bytes: int,
) -> None:
    """One pass: its configurations in a shuffled order seeded by the pass, then its collectives."""
    random.Random(pass_number).shuffle(todo)
    collectives = [(op, params) for family, op, params in todo if family == "collective"]
    for family, op, params in (c for c in todo if c[0] != "collective"):
        fn, call, measured = prepare(family, op, params, device)
        times, issue = _time(fn, device, warmup, repeats, host=family == "host", flush_bytes=flush_bytes)
        stored = {**params, **({"call": call.__dict__} if call else {})}
        stored |= {"host_issue_s": statistics.median(issue)} if issue else {}
        stored |= {"counts": measured["counts"]} if "counts" in measured else {}
        stored |= {"features": measured} if measured and "counts" not in measured else {}
        db.add(dev, [_row(family, op, _size(call, measured), times, stored)])
        bar.advance(task)
    if collectives:  # one group of processes per world size, stored at the end
        bar.update(task, description=f"{len(collectives)} collectives (spawned processes)")
        rows = collective_bench.measure(collectives, device, warmup, repeats)
        db.add(dev, [_row("collective", op, p["bytes"], times, p, group_size=p["ranks"]) for op, p, times in rows])
        bar.advance(task, len(collectives))


def _row(
    family: str, op: str, size: float, times: list[float], params: dict[str, Any], group_size: int = 1
) -> Measurement:
    """A measured configuration: median and standard deviation of its timed runs."""
    return Measurement(
        family,
        op,
        size,
        statistics.median(times),
        "fp32",
        group_size,
        time_std_s=statistics.pstdev(times),
        repeats=len(times),
        params=params,
        source="measured: itercast profile",
    )


def _size(call: OpCall | None, measured: dict[str, Any]) -> float:
    """The row's size: FLOPs or bytes of its operator; for host programs, the number of host nodes."""
    return features(call).size if call else float(sum(measured["counts"].values()))
