"""Hand-written minimal Kineto traces (times in µs) for importer and replay tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

HOST = {"pid": 100, "tid": 100}


def call(name: str, ts: float, dur: float, corr: int = -1, tid: int = 100) -> dict:
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": name,
        **HOST,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": {"correlation": corr},
    }


def cpu_op(name: str, ts: float, dur: float, tid: int = 100) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, **HOST, "tid": tid, "ts": ts, "dur": dur}


def fp32_all_reduce_comms(ts: float, dur: float, nelems: int, group_size: int) -> dict:
    """PyTorch's record_param_comms host op around an NCCL launch: an fp32 all-reduce of `nelems` elements."""
    args = {"Collective name": "allreduce", "In msg nelems": nelems, "dtype": "Float", "Group size": group_size}
    return {**cpu_op("record_param_comms", ts, dur), "args": args}


def kernel(name: str, ts: float, dur: float, corr: int, stream: int = 7, **meta) -> dict:
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"correlation": corr, "stream": stream, **meta},
    }


def step(n: int, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", **HOST, "ts": ts, "dur": dur}


def write(path: Path, events: list[dict], gz: bool = False, **top) -> Path:
    text = json.dumps({"schemaVersion": 1, **top, "traceEvents": events})
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def gpu_bound_step() -> list[dict]:
    """One step [0, 100]: launch at 10 (5 µs) → GEMM 20–70 on stream 7; cudaDeviceSynchronize
    30–75 waits until 70 and then takes 5 µs; the CPU works until the step ends at 100."""
    return [
        step(1, 0, 100),
        call("cudaLaunchKernel", 10, 5, corr=1),
        kernel("volta_sgemm_128x64", 20, 50, corr=1),
        call("cudaDeviceSynchronize", 30, 45),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", **HOST, "ts": 5, "dur": 4},
    ]
