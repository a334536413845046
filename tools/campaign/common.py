"""Shared pieces of the GPU measurement campaign (tools/gpu_campaign.py): timing with device events,
the clock sampler, incremental CSV files, a time budget per part and the machine readout.

Only torch and the standard library are imported here: the campaign runs on a bare GPU machine.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

#: bytes written before every timed call so that its inputs start outside the L2 (50 MB on an H100,
#: Hopper whitepaper): inside a training step an operator's inputs were written many operators earlier
FLUSH_BYTES = 128 << 20
#: the nvidia-smi fields the README records (`nvidia-smi --help-query-gpu` names them)
SMI_FIELDS = (
    "name,driver_version,pci.bus_id,vbios_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm,"
    "clocks.max.mem,clocks.applications.graphics,clocks.default_applications.graphics,power.draw,power.limit,"
    "power.default_limit,power.max_limit,enforced.power.limit,temperature.gpu,pstate,compute_mode,"
    "persistence_mode,ecc.mode.current,clocks_event_reasons.active"
)


class DeviceClock:
    """Times callables on one device. On a GPU: a CUDA event before and after each call, the L2
    flushed before each (outside the events); elsewhere the host clock around each call, which
    then ends with the call's work (CPU operators are synchronous)."""

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._flush = torch.empty(FLUSH_BYTES // 4, device=self.device) if self.cuda else None

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def times_ms(self, fn: Callable[[], Any], reps: int, flush: bool = True) -> list[float]:
        """Milliseconds of each of `reps` calls of `fn`."""
        self.sync()
        if not self.cuda:
            out = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e3)
            return out
        marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for start, end in marks:
            if flush and self._flush is not None:
                self._flush.zero_()
            start.record()
            fn()
            end.record()
        self.sync()
        return [start.elapsed_time(end) for start, end in marks]

    def measure(self, fn: Callable[[], Any], target_ms: float, max_reps: int = 50, flush: bool = True) -> list[float]:
        """Two warm-up calls (library set-up, autotuning), one timed call to size the run, then as
        many timed calls as fit in `target_ms` (at least 3, at most `max_reps`)."""
        fn()
        probe = self.times_ms(fn, 1, flush)[0]
        reps = int(min(max_reps, max(3, target_ms // max(probe, 1e-3))))
        return self.times_ms(fn, reps, flush)


class ClockSampler:
    """Samples the GPU's SM clock (MHz), power (W), temperature (°C) and clock-event reasons (NVML's
    bit mask: power cap, thermal, ...) every `interval_s` on a thread, through NVML (nvidia-ml-py).
    Without NVML (a CPU run) it records nothing and every summary is empty."""

    def __init__(self, index: int = 0, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self.samples: list[tuple[float, float, float, float, int]] = []
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml: Any = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # no NVML: a CPU dry run
            self._nvml = None

    def _read(self) -> tuple[float, float, float, float, int]:
        nv, h = self._nvml, self._handle
        # renamed from ...ThrottleReasons in NVML 12.535; either names the same mask
        reasons_of = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if reasons_of is None:
            reasons_of = nv.nvmlDeviceGetCurrentClocksThrottleReasons
        reasons = reasons_of(h)
        return (
            time.time(),
            float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            nv.nvmlDeviceGetPowerUsage(h) / 1e3,
            float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            int(reasons),
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                sample = self._read()
            except Exception:  # a failed read loses one sample, never the run
                continue
            with self._lock:
                self.samples.append(sample)

    def __enter__(self) -> ClockSampler:
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def window(self, t0: float, t1: float) -> list[tuple[float, float, float, float, int]]:
        with self._lock:
            return [s for s in self.samples if t0 <= s[0] <= t1]

    def summary(self, t0: float, t1: float) -> dict[str, float | int | str]:
        """The samples between host times t0 and t1: mean and lowest SM clock, mean power, highest
        temperature, every clock-event reason seen (OR of the masks), how many samples."""
        got = self.window(t0, t1)
        if not got:
            return {"sm_mhz_mean": "", "sm_mhz_min": "", "power_w_mean": "", "temp_c_max": "", "clock_reasons": ""}
        mask = 0
        for s in got:
            mask |= s[4]
        return {
            "sm_mhz_mean": round(statistics.fmean(s[1] for s in got), 1),
            "sm_mhz_min": min(s[1] for s in got),
            "power_w_mean": round(statistics.fmean(s[2] for s in got), 1),
            "temp_c_max": max(s[3] for s in got),
            "clock_reasons": hex(mask),
        }


class Rows:
    """One CSV file written row by row (flushed, so a killed run keeps what it measured): `#` lines
    first (what was measured and how), then the header."""

    def __init__(self, path: Path, fields: list[str], notes: list[str]) -> None:
        self.path = path
        self._fh = path.open("w", newline="")
        self._fh.write("".join(f"# {n}\n" for n in notes))
        self._writer = csv.DictWriter(self._fh, fieldnames=fields, extrasaction="raise")
        self._writer.writeheader()
        self.count = 0

    def add(self, row: dict[str, Any]) -> None:
        self._writer.writerow(row)
        self._fh.flush()
        self.count += 1

    def close(self) -> None:
        self._fh.close()


def timing(samples_ms: list[float]) -> dict[str, float | int]:
    """Median, 10th and 90th percentiles (ms) and the count of timed calls."""
    q = statistics.quantiles(samples_ms, n=10, method="inclusive") if len(samples_ms) > 1 else samples_ms * 9
    return {
        "median_ms": round(statistics.median(samples_ms), 5),
        "p10_ms": round(q[0], 5),
        "p90_ms": round(q[-1], 5),
        "reps": len(samples_ms),
    }


def attempt(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one measurement; a refused or failed configuration (no kernel for it, out of memory) becomes a
    row whose status says why, and the run goes on."""
    try:
        return {"status": "ok", **fn()}
    except (RuntimeError, NotImplementedError, ValueError, TypeError) as err:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return {"status": f"error: {type(err).__name__}: {first[:200]}"}


class Budget:
    """A part's share of the run's wall time: configurations left when it is spent are skipped and counted."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.skipped = 0

    def spent(self) -> bool:
        return time.monotonic() > self.deadline

    def take(self) -> bool:
        """True if the next configuration may run; False (and counted as skipped) once spent."""
        if self.spent():
            self.skipped += 1
            return False
        return True


@contextmanager
def timed_window(sampler: ClockSampler) -> Iterator[dict[str, Any]]:
    """Yields a dict that is filled, on exit, with the clock summary of the window it spanned."""
    out: dict[str, Any] = {}
    t0 = time.time()
    yield out
    out.update(sampler.summary(t0, time.time()))


def machine_readout(device: str) -> dict[str, Any]:
    """What ran the campaign: nvidia-smi's fields (clocks, power limits, driver), torch, CUDA, cuDNN,
    the device's properties, the host."""
    info: dict[str, Any] = {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "device": device,
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    if torch.cuda.is_available() and torch.device(device).type == "cuda":
        p = torch.cuda.get_device_properties(torch.device(device))
        info |= {
            "gpu": p.name,
            "sms": p.multi_processor_count,
            "gpu_memory_bytes": p.total_memory,
            "l2_bytes": getattr(p, "L2_cache_size", ""),
            "cudnn": torch.backends.cudnn.version(),
        }
    if shutil.which("nvidia-smi"):
        q = subprocess.run(
            ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv"], capture_output=True, text=True, check=False
        )
        if q.returncode == 0 and len(q.stdout.splitlines()) >= 2:
            keys, values = (line.split(", ") for line in q.stdout.splitlines()[:2])
            info["nvidia_smi"] = dict(zip(keys, values, strict=False))
        else:
            info["nvidia_smi_error"] = (q.stderr or q.stdout).strip()[:500]
    return info


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    tmp.replace(path)


class Context:
    """What every part of the campaign shares: the output folder, the device, its timer and clock
    sampler, whether sizes are the dry run's, each file's description (for the README) and each part's
    summary line; `sustained_s` replaces the sustained GEMM run's length (seconds) where given."""

    def __init__(
        self, out: Path, device: str, dry: bool, sampler: ClockSampler, sustained_s: float | None = None
    ) -> None:
        self.out, self.device, self.dry, self.sampler = out, device, dry, sampler
        self.sustained_s = sustained_s
        self.clock = DeviceClock(device)
        self.cuda = self.clock.cuda
        self.context_bytes: int | str = ""
        if self.cuda:  # what the device holds beyond the allocator's reserve: the CUDA context, libraries
            free, total = torch.cuda.mem_get_info(self.clock.device)
            self.context_bytes = total - free - torch.cuda.memory_reserved(self.clock.device)
        self.files: dict[str, str] = {}

    def rows(self, name: str, fields: list[str], notes: list[str], description: str) -> Rows:
        """A new CSV file `name` under the output folder, described in the README."""
        self.files[name] = description
        path = self.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return Rows(path, fields, notes)

    def timed(self, fn: Callable[[], Any], target_ms: float, flush: bool = True) -> dict[str, Any]:
        """Time `fn` (DeviceClock.measure) with the clock summary of the timed window."""
        with timed_window(self.sampler) as clocks:
            samples = self.clock.measure(fn, target_ms, flush=flush)
        return {**timing(samples), **clocks}

    def peak_bytes(self) -> int | str:
        """Most bytes the caching allocator held in tensors since the last reset (GPU only)."""
        return torch.cuda.max_memory_allocated(self.clock.device) if self.cuda else ""

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.clock.device)
