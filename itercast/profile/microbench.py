"""Microbenchmarks on the local device (torch: CPU here, CUDA when present) into a profiling database.

Families: GEMM over an (M, N, K) grid, elementwise add over sizes, and EmbeddingBag forward over
rows × dim × pooling factor × index distribution (uniform, Zipf). Each configuration runs `warmup`
times, then `repeats` timed runs; the median and the standard deviation are kept. A configuration
already in the database for this device fingerprint is skipped, so an interrupted run resumes.
Timing: perf_counter on CPU; CUDA events with synchronisation on a GPU.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from rich.progress import Progress

from itercast.profile.db import Measurement, ProfileDB, ProfileError

QUICK: dict[str, list[Any]] = {
    "gemm": [64, 256, 1024],
    "elementwise": [1 << 14, 1 << 18, 1 << 22],
    "embedding_rows": [10_000],
    "embedding_dims": [64],
    "pooling": [1, 16],
    "distributions": ["uniform", "zipf"],
}
FULL: dict[str, list[Any]] = {
    "gemm": [64, 128, 256, 512, 1024, 2048],
    "elementwise": [1 << k for k in range(12, 25, 2)],
    "embedding_rows": [10_000, 1_000_000],
    "embedding_dims": [32, 128],
    "pooling": [1, 8, 32, 128],
    "distributions": ["uniform", "zipf"],
}


def _config(params: dict[str, Any]) -> dict[str, Any]:
    """The configuration part of stored params (what a resumed run compares), without measured features."""
    return {k: v for k, v in params.items() if k != "features"}


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


def configs(grid: dict[str, list]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(family, op, params) of every configuration of the grid."""
    for m, n, k in itertools.product(grid["gemm"], repeat=3):
        yield "gemm", "mm", {"m": m, "n": n, "k": k}
    for size in grid["elementwise"]:
        yield "elementwise", "add", {"elements": size}
    for rows, dim, pool, dist in itertools.product(
        grid["embedding_rows"], grid["embedding_dims"], grid["pooling"], grid["distributions"]
    ):
        yield (
            "embedding",
            "embedding_bag_fwd",
            {"rows": rows, "dim": dim, "pooling": pool, "distribution": dist, "batch": 512},
        )


def _prepare(family: str, params: dict[str, Any], device: str) -> tuple[Callable[[], Any], float, dict[str, float]]:
    """A closure running one op, its size (FLOPs or bytes moved) and features measured from its inputs
    (for lookups: the fraction of distinct rows among the indices, which sets how much is re-read)."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(0)
    if family == "gemm":
        a = torch.randn(params["m"], params["k"], generator=gen).to(device)
        b = torch.randn(params["k"], params["n"], generator=gen).to(device)
        return (lambda: a @ b), 2.0 * params["m"] * params["n"] * params["k"], {}
    if family == "elementwise":
        x = torch.randn(params["elements"], generator=gen).to(device)
        y = torch.randn(params["elements"], generator=gen).to(device)
        return (lambda: x + y), 3.0 * 4 * params["elements"], {}
    bag = torch.nn.EmbeddingBag(params["rows"], params["dim"], mode="sum").to(device)
    count = params["batch"] * params["pooling"]
    if params["distribution"] == "zipf":  # skewed reuse: rank r drawn with probability ∝ 1/(r+1)^1.05
        weights = 1.0 / torch.arange(1, params["rows"] + 1, dtype=torch.float64) ** 1.05
        idx = torch.multinomial(weights, count, replacement=True, generator=gen)
    else:
        idx = torch.randint(0, params["rows"], (count,), generator=gen)
    offsets = torch.arange(0, count, params["pooling"])
    features = {"unique_fraction": idx.unique().numel() / count}
    idx, offsets = idx.to(device), offsets.to(device)
    with torch.no_grad():
        return (lambda: bag(idx, offsets)), 4.0 * params["dim"] * (count + params["batch"]), features


def _time(fn: Callable[[], Any], device: str, warmup: int, repeats: int) -> list[float]:
    import torch

    with torch.no_grad():
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            if device.startswith("cuda"):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) * 1e-3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
    return times


def run(
    db: ProfileDB,
    device: str = "cpu",
    quick: bool = False,
    families: tuple[str, ...] = ("gemm", "elementwise", "embedding"),
    warmup: int = 3,
    repeats: int = 10,
) -> dict[str, int]:
    """Measure every configuration not yet in the database for this device. Returns counts."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ProfileError("itercast profile needs torch: pip install 'itercast[torch]' (CPU build 2.13.0)") from None
    fp = fingerprint(device)
    dev = db.device(fp.get("gpu") or fp.get("cpu") or device, fp)
    done = {(m.family, m.op, json.dumps(_config(m.params), sort_keys=True)) for m in db.measurements(device_id=dev)}
    todo = [
        c
        for c in configs(QUICK if quick else FULL)
        if c[0] in families and (c[0], c[1], json.dumps(c[2], sort_keys=True)) not in done
    ]
    with Progress(transient=True) as bar:
        task = bar.add_task("profiling", total=len(todo))
        for family, op, params in todo:
            fn, size, features = _prepare(family, params, device)
            times = _time(fn, device, warmup, repeats)
            params = {**params, "features": features} if features else params
            db.add(
                dev,
                [
                    Measurement(
                        family,
                        op,
                        size,
                        statistics.median(times),
                        "fp32",
                        time_std_s=statistics.pstdev(times),
                        repeats=repeats,
                        params=params,
                        source="measured: itercast profile",
                    )
                ],
            )
            bar.advance(task)
    return {"measured": len(todo), "already there": len(done)}
