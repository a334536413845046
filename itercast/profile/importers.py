"""Import outside measurements into a profiling database: nccl-tests logs, the tidy nccl-tests table,
Alpa's profiling database (CSV form) and OpenXLA's matmul and collective tables. Each importer checks every row and
reports what it skipped and why; a malformed file is refused with the file and line, nothing added."""

from __future__ import annotations

import csv
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from itercast.measurements import Measurement, ProfileError
from itercast.profile.db import ProfileDB, file_key

NCCL_OPS = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "alltoall": "alltoall",
    "all_to_all": "alltoall",
    "sendrecv": "sendrecv",
}
#: Alpa's size x is split into ranks**k pieces: all-gather and reduce-scatter one shard per rank;
#: all-to-all's per-device operand (x/n) once more per peer (x/n²). x below that leaves every piece
#: empty: an all-to-all over 16 ranks on 2 hosts runs in 17 µs up to x = 128 = n²/2, then ≥ 1 ms.
SPLIT_POWER = {"all_gather": 1, "reduce_scatter": 1, "all_to_all": 2}
MAX_FILE_BYTES = 512 << 20


def _rows(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """CSV rows (after leading '#' comments) with their line numbers; bounded file size."""
    if not path.is_file():
        raise ProfileError(f"{path}: no such file")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise ProfileError(f"{path}: {path.stat().st_size} bytes; expected at most {MAX_FILE_BYTES}")
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            lines = [(i + 1, line) for i, line in enumerate(fh) if not line.startswith("#")]
        rows = list(csv.DictReader(line for _, line in lines))
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); expected a CSV table") from None
    except csv.Error as exc:
        raise ProfileError(f"{path}: not a CSV table ({exc})") from None
    if not rows:
        raise ProfileError(f"{path}: expected a CSV table with a header and rows; found no rows")
    yield from zip((number for number, _ in lines[1:]), rows, strict=False)


def _store(
    db: ProfileDB,
    counts: Counter,
    path: Path,
    importer: str,
    device: str,
    fingerprint: dict[str, object],
    rows: list[Measurement],
) -> None:
    """Add one device's rows of `path`, unless this file was imported for it before (then nothing)."""
    added = db.add(db.device(device, fingerprint), rows, file_key(path, importer, device))
    counts["imported"] += added
    if rows and not added:
        counts["already imported (same file, nothing added)"] += len(rows)


def _field(path: Path, line: int, row: dict[str, str], name: str, kind: Callable[[str], float] = float) -> float:
    try:
        return kind(row[name])
    except KeyError:
        raise ProfileError(f"{path}: line {line}: missing column `{name}`") from None
    except (TypeError, ValueError):
        raise ProfileError(f"{path}: line {line}: `{name}` should be a number; got {row.get(name)!r}") from None


def import_nccl_tidy(db: ProfileDB, path: Path) -> Counter:
    """The tidy nccl-tests CSV (one row per message size and repeat); one device per system."""
    counts: Counter = Counter()
    batches: dict[str, list[Measurement]] = {}
    for line, r in _rows(path):
        op = NCCL_OPS.get(r.get("collective", ""))
        size = _field(path, line, r, "size_B")
        if op is None or size <= 0:
            counts["skipped (unknown collective or empty message)"] += 1
            continue
        family = "p2p" if op == "sendrecv" else "collective"
        batches.setdefault(r.get("system", "?"), []).append(
            Measurement(
                family,
                op,
                size,
                _field(path, line, r, "oop_time_us") * 1e-6,
                r.get("dtype", ""),
                int(_field(path, line, r, "ranks", int)),
                int(_field(path, line, r, "nodes", int)),
                params={
                    "setup": r.get("setup", ""),
                    "nccl": r.get("nccl", ""),
                    "gpus_per_node": r.get("gpus_per_node"),
                },
                source=f"{path.name}:{r.get('source_file', '')}",
            )
        )
    for system, rows in batches.items():
        _store(db, counts, path, "nccl-tidy", system, {"source": path.name, "system": system}, rows)
    return counts


def import_nccl_log(db: ProfileDB, path: Path, collective: str, nodes: int, device: str) -> Counter:
    """One nccl-tests stdout log (e.g. all_reduce_perf): size (B), count, type, redop, root, time (µs), …"""
    op = NCCL_OPS.get(collective)
    if op is None:
        raise ProfileError(f"--collective {collective!r}: expected one of {', '.join(sorted(NCCL_OPS))}")
    text = path.read_text(errors="replace") if path.is_file() else None
    if text is None:
        raise ProfileError(f"{path}: no such file")
    ranks = len(re.findall(r"^#\s+Rank\s+\d+", text, flags=re.MULTILINE))
    # each rank's line ends in its GPU's name: "#  Rank  0 Group  0 Pid 1 on host device  0 [0x18] NVIDIA H100 ..."
    gpu = re.search(r"^#\s+Rank\s+\d+.*\sdevice\s+\d+\s+\[[^\]]*\]\s+(\S.*?)\s*$", text, flags=re.MULTILINE)
    rows: list[Measurement] = []
    counts: Counter = Counter()
    for number, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if line.lstrip().startswith("#") or not parts or not parts[0].isdigit():
            continue
        if len(parts) < 8:
            raise ProfileError(f"{path}: line {number}: expected ≥ 8 columns of an nccl-tests result; got {len(parts)}")
        try:
            size, time_us = float(parts[0]), float(parts[5])
        except ValueError:
            raise ProfileError(
                f"{path}: line {number}: size and time should be numbers; got {parts[0]!r}, {parts[5]!r}"
            ) from None
        if size <= 0:
            counts["skipped (empty message)"] += 1
            continue
        rows.append(
            Measurement(
                "p2p" if op == "sendrecv" else "collective",
                op,
                size,
                time_us * 1e-6,
                parts[2],
                max(ranks, 1),
                nodes,
                source=path.name,
            )
        )
    if not rows:
        raise ProfileError(f"{path}: no nccl-tests result lines found")
    # the log's GPU, by which `calibrate` tells whether it was measured on the system it is given (not "device":
    # that key is a profile of this machine's, `itercast profile run`'s torch device)
    fingerprint = {"source": path.name, "machine": device, **({"gpu": gpu.group(1)} if gpu else {})}
    _store(db, counts, path, f"nccl-log {collective} {nodes}", device, fingerprint, rows)
    return counts


def import_alpa(db: ProfileDB, path: Path) -> Counter:
    """Alpa's profiling database (CSV form) into `db`: `alpa_measurements`' rows, its counts returned."""
    rows, counts = alpa_measurements(path)
    _store(db, counts, path, "alpa", "V100 p3.16xlarge (Alpa)", {"source": path.name}, rows)
    return counts


def alpa_measurements(path: Path) -> tuple[list[Measurement], Counter]:
    """Alpa's profiling database (CSV form): collectives over every group layout and square dots.

    Skipped and counted: rows whose time is not finite (Alpa could not profile them); collectives
    whose message, or per-rank shard (all-gather, reduce-scatter of fewer elements than ranks), or
    per-peer chunk (all-to-all of fewer elements than ranks²) is empty; and the points Alpa's
    make_monotonic() wrote: a time equal to the previous size's time scaled by the size ratio
    (bandwidth exactly equal to the previous point's, which no measurement repeats to 1e-6), the
    caveat of the data's SOURCES.txt. An all-to-all is stored with its per-rank buffer, x/n."""
    rows: list[Measurement] = []
    counts: Counter = Counter()
    previous: dict[tuple[str, ...], tuple[float, float]] = {}  # series → (bytes, time_s) of its last row
    for line, r in _rows(path):
        time_s = _field(path, line, r, "time_s")
        series = tuple(r.get(k, "") for k in ("mesh_hosts", "mesh_gpus_per_host", "op", "replica_groups", "dtype"))
        last = previous.get(series)
        if r.get("op") != "dot":
            previous[series] = (_field(path, line, r, "bytes"), time_s)
        if math.isnan(time_s) or time_s < 0:
            raise ProfileError(f"{path}: line {line}: `time_s`: expected seconds ≥ 0 (inf: not profiled); got {time_s}")
        if math.isinf(time_s) or time_s == 0:
            counts["skipped (not profiled: time inf or 0)"] += 1
            continue
        op, x = r.get("op", ""), _field(path, line, r, "x")
        if op == "dot":
            rows.append(
                Measurement(
                    "gemm",
                    "dot",
                    x,
                    time_s,
                    r.get("dtype", ""),
                    source=path.name,
                    params={"n": round((x / 2) ** (1 / 3))},
                )
            )
            continue
        size, ranks = _field(path, line, r, "bytes"), int(_field(path, line, r, "group_size", int))
        if not math.isfinite(size) or size < 0 or ranks < 1:
            raise ProfileError(
                f"{path}: line {line}: `bytes` and `group_size`: expected a finite size ≥ 0 and ≥ 1 rank; got "
                f"{size}, {ranks}"
            )
        if size == 0 or x < ranks ** SPLIT_POWER.get(op, 0):
            counts["skipped (empty message, shard or peer chunk)"] += 1
            continue
        if last is not None and 0 < last[0] < size and abs(time_s / last[1] - size / last[0]) < 1e-6 * size / last[0]:
            counts["skipped (synthetic: make_monotonic clamp)"] += 1
            continue
        per_host = int(_field(path, line, r, "mesh_gpus_per_host", int))
        try:
            first = json.loads(r.get("replica_groups", "[]"))[0]
        except (ValueError, IndexError, TypeError):
            raise ProfileError(f"{path}: line {line}: `replica_groups` should be a list of lists of ranks") from None
        rows.append(
            Measurement(
                "collective",
                NCCL_OPS.get(op, op),
                size / ranks if op == "all_to_all" else size,  # per-rank buffer, as nccl-tests and torch
                time_s,
                r.get("dtype", ""),
                ranks,
                len({g // per_host for g in first}),
                params={
                    "mesh": [r.get("mesh_hosts"), per_host],
                    "replica_groups": first,
                    "n_groups": r.get("n_groups"),
                },
                source=path.name,
            )
        )
    return rows, counts


def alpa_one_host_collectives(path: Path, min_bytes: float, op: str) -> list[tuple[int, int, float, float]]:
    """(ranks, stride, bytes, seconds) of Alpa's collectives `op` (a Measurement op: all_reduce, all_gather,
    reduce_scatter, alltoall, whose bytes are a rank's buffer) within one host, from `min_bytes` (those
    `alpa_measurements` keeps), for every layout it measured: one group of 2, 4 or 8 GPUs, or groups of a host's 8
    run at once, `stride` GPUs apart (the time the slowest group's). Each is less the time Alpa's harness took for
    the same op, layout and dtype at 0 bytes: 0.21 ms for an all-reduce of 8 V100 where NCCL launches nothing for
    an empty message (Alpa's all-gather of 0 bytes takes 0.02 ms). What V100's one-node all-reduce curve is fitted
    on (its 8-GPU group: tools/fit_efficiency_curves.py) and the mesh's groups are checked against
    (validation/kernel_tables.py)."""
    harness_s = {
        (r["mesh_gpus_per_host"], r["n_groups"], json.dumps(json.loads(r["replica_groups"])[0]), r["dtype"]): float(
            r["time_s"]
        )
        for _, r in _rows(path)
        if NCCL_OPS.get(r.get("op", "")) == op and (r.get("mesh_hosts"), r.get("bytes")) == ("1", "0")
    }
    out = []
    for m in alpa_measurements(path)[0]:
        if m.op == op and m.params["mesh"][0] == "1" and m.group_size > 1 and m.size >= min_bytes:
            first = m.params["replica_groups"]
            layout = (str(m.params["mesh"][1]), m.params["n_groups"], json.dumps(first), m.dtype)
            out.append((m.group_size, first[1] - first[0], m.size, m.time_s - harness_s[layout]))
    return out


def import_xla_matmul(db: ProfileDB, path: Path) -> Counter:
    """OpenXLA's measured matmul table: achieved FLOP/s per (b, m, n, k, dtype); one device per GPU."""
    counts: Counter = Counter()
    batches: dict[str, list[Measurement]] = {}
    for line, r in _rows(path):
        b, m, n, k = (int(_field(path, line, r, c, int)) for c in ("b", "m", "n", "k"))
        flops = 2.0 * b * m * n * k
        rate = _field(path, line, r, "flops_per_s")
        if rate <= 0:
            counts["skipped (no throughput)"] += 1
            continue
        batches.setdefault(r.get("device", "?"), []).append(
            Measurement(
                "gemm",
                "matmul",
                flops,
                flops / rate,
                r.get("dtype", ""),
                params={"b": b, "m": m, "n": n, "k": k},
                source=path.name,
            )
        )
    for device, rows in batches.items():
        _store(db, counts, path, "xla-matmul", device, {"source": path.name, "device": device}, rows)
    return counts


#: OpenXLA collective opcodes this importer reads, and the element types' bytes
XLA_COLLECTIVES = {"all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter"}
XLA_TYPE_BYTES = {"F32": 4, "BF16": 2, "F16": 2, "F8E4M3FN": 1, "F8E5M2": 1, "F64": 8}


def import_xla_collectives(db: ProfileDB, path: Path) -> Counter:
    """OpenXLA's collective performance table (xla/service/gpu/model/default_collective_perf_table,
    generated by xla/tools/collective_perf_table_gen): network throughput per (device, opcode, element
    type, elements, replica groups). XLA prices a collective as bytes_transferred / throughput
    (collective_interpolator.cc), with bytes_transferred from GpuHloCostAnalysis: the whole tensor
    (all-reduce: its shape; all-gather: the gathered output; reduce-scatter: the input, i.e. the
    profiled output shard × group size). Stored as that time with size = those bytes, the
    convention of nccl-tests and this database. Every group lies in one NVLink domain (8-GPU hosts,
    72-GPU racks): nodes = 1. All-to-all and collective-permute rows are skipped and counted: the
    cited XLA code defines no bytes_transferred for them."""
    counts: Counter = Counter()
    batches: dict[str, list[Measurement]] = {}
    for line, r in _rows(path):
        if "opcode" not in r:  # a table of another kind: refused, not skipped row by row
            raise ProfileError(f"{path}: line {line}: missing column `opcode`")
        op = XLA_COLLECTIVES.get(r.get("opcode", ""))
        if op is None:
            counts[f"skipped ({r.get('opcode')!r}: no bytes_transferred in XLA's cost analysis)"] += 1
            continue
        dtype = r.get("element_type", "")
        if dtype not in XLA_TYPE_BYTES:
            raise ProfileError(
                f"{path}: line {line}: `element_type` should be one of {', '.join(XLA_TYPE_BYTES)}; got {dtype!r}"
            )
        ranks = int(_field(path, line, r, "num_devices_per_group", int))
        elements = _field(path, line, r, "num_elements")
        rate = _field(path, line, r, "throughput_Bps")
        if rate <= 0 or elements <= 0 or ranks < 1:
            counts["skipped (no throughput, elements or devices)"] += 1
            continue
        nbytes = elements * XLA_TYPE_BYTES[dtype] * (ranks if op == "reduce_scatter" else 1)
        batches.setdefault(r.get("device", "?"), []).append(
            Measurement(
                "collective",
                op,
                nbytes,
                nbytes / rate,
                dtype.lower(),
                ranks,
                1,
                params={"replica_groups": r.get("num_replica_groups", "")},
                source=path.name,
            )
        )
    for device, rows in batches.items():
        _store(db, counts, path, "xla-collective", device, {"source": path.name, "device": device}, rows)
    return counts
