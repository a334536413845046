"""Measured training iterations on this CPU (or a GPU) versus predictions from calibrated operator models.

For a small GPT, a DLRM-like model (eight embedding-bag tables, bottom and top MLPs, dot
interaction) and a small CNN, at two batch sizes each:
1. measure: the median of all timed iterations (forward, backward, optimizer step) over --rounds
   rounds of --iterations per case, the cases interleaved (this VM's speed drifts over minutes),
   with nothing else running; written to data/measured/e2e_cpu.csv with the command;
2. predict: capture one iteration's execution trace (operators, shapes, parents; no times) and price
   it with the operator models fitted on the profiling database (costs/op_model.py, through
   traces/iteration_model.py). The measured iteration times are never used by the prediction, and
   the database holds only the microbenchmark grid (`itercast profile run`), not these shapes.

    python validation/e2e_local.py                       # predict; measures first if the CSV is missing
    python validation/e2e_local.py --measure             # re-measure the iterations
    python validation/e2e_local.py --db data/measured/cpu_profile.db
    itercast profile run --db new.db --passes 3 && \
        python validation/e2e_local.py --measure --csv new.csv --db new.db   # database and iterations back to back

On a GPU (--device cuda) the cases run at GPU-sized batches, each iteration is timed to the end of
its device work (synchronised before and after), and the prediction prices kernels on the device
timeline and host calls on the host's (traces/iteration_model.py, gpu=True), with a database measured
on that GPU (`itercast profile run --device cuda`). --traces DIR keeps each case's execution trace
and a Kineto trace of the same iteration (DIR/<case>.et.json.gz, DIR/<case>.kineto.json.gz) and
reads them from there when present, so a GPU's iterations are predicted on any machine:

    python validation/e2e_local.py --device cuda --measure --traces data/measured/h100_traces   # on the GPU
    python validation/e2e_local.py --device cuda     # anywhere: the H100's files in data/measured (default)

With Kineto traces at hand it also prints each case's device busy time (kernels, copies, memsets)
against the sum of its predicted kernel times.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import itertools

import torch
import torch.nn.functional as F
from torch import nn

from itercast.costs.op_model import OperatorCostModel, fit_operator_models
from itercast.profile.db import ProfileDB
from itercast.traces.execution_trace import read_execution_trace
from itercast.traces.iteration_model import predict_iteration
from itercast.traces.kineto import read_kineto

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "data" / "measured"
#: per device: measured iterations, profiling database, kept traces
DEFAULTS = {
    "cpu": (MEASURED / "e2e_cpu.csv", MEASURED / "cpu_profile.db", None),
    "cuda": (MEASURED / "e2e_h100.csv", MEASURED / "h100_profile.db", MEASURED / "h100_traces"),
}


class Block(nn.Module):
    """Pre-norm transformer block: fused attention, GELU MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, -1)
        )
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int = 4096, d: int = 256, layers: int = 4, heads: int = 4, seq: int = 128) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.ln(self.blocks(x)))


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class DLRM(nn.Module):
    """DLRM-like (Naumov et al. 2019): bottom MLP on dense features, embedding bags, pairwise dot
    interaction, top MLP."""

    def __init__(self, tables: list[int], dim: int = 64, dense: int = 13) -> None:
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for rows in tables)
        self.bottom = mlp([dense, 512, 256, dim])
        n = len(tables) + 1
        self.register_buffer("pairs", torch.triu_indices(n, n, 1))
        self.top = mlp([dim + n * (n - 1) // 2, 512, 256, 1])

    def forward(self, dense: torch.Tensor, idx: list[torch.Tensor], offsets: torch.Tensor) -> torch.Tensor:
        feats = torch.stack([self.bottom(dense)] + [bag(i, offsets) for bag, i in zip(self.bags, idx, strict=True)], 1)
        dots = torch.bmm(feats, feats.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([feats[:, 0], dots], 1)).squeeze(1)


class CNN(nn.Module):
    """Small ResNet-style network on 32×32 images: conv-BN-ReLU stages with stride-2 downsampling."""

    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for c_out, stride in ((width, 1), (width, 1), (2 * width, 2), (2 * width, 1), (4 * width, 2), (4 * width, 1)):
            layers += [nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(c_in, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


def workload(name: str, batch: int, device: str = "cpu") -> Callable[[], None]:
    """One training iteration of `name` at `batch` on `device` (seeded: same model and data every time)."""
    torch.manual_seed(0)
    with torch.device(device):
        return _workload(name, batch)


def _workload(name: str, batch: int) -> Callable[[], None]:
    if name == "gpt":
        model: nn.Module = GPT()
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x, y = torch.randint(0, 4096, (batch, 128)), torch.randint(0, 4096, (batch, 128))

        def loss() -> torch.Tensor:
            return F.cross_entropy(model(x).view(-1, 4096), y.view(-1))
    elif name == "dlrm":
        tables = [100_000, 200_000, 500_000, 1_000_000, 50_000, 20_000, 10_000, 300_000]
        model = DLRM(tables)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        pooling = 20
        dense = torch.randn(batch, 13)
        idx = [torch.randint(0, rows, (batch * pooling,)) for rows in tables]  # uniform: the model's default reuse
        offsets = torch.arange(0, batch * pooling, pooling)
        label = torch.randint(0, 2, (batch,)).float()

        def loss() -> torch.Tensor:
            return F.binary_cross_entropy_with_logits(model(dense, idx, offsets), label)
    else:
        model = CNN()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        img, label_c = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))

        def loss() -> torch.Tensor:
            return F.cross_entropy(model(img), label_c)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()

    return step


CASES = {
    "cpu": [("gpt", 4), ("gpt", 8), ("dlrm", 512), ("dlrm", 2048), ("cnn", 16), ("cnn", 64)],
    # a host-bound and a device-bound batch of each (an H100 runs the small ones faster than it is fed)
    "cuda": [("gpt", 8), ("gpt", 64), ("dlrm", 2048), ("dlrm", 16384), ("cnn", 64), ("cnn", 512)],
}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(iterations: int, rounds: int, device: str = "cpu") -> list[dict[str, object]]:
    """`rounds` rounds, each timing `iterations` iterations of every case after 3 warm-up ones, the
    cases in a rotated order per round: this machine's speed drifts by 10-30% over minutes (two
    back-to-back single rounds gave 61.6 and 81.7 ms for cnn batch 64), so every case is sampled
    across the whole measurement rather than in one stretch of it."""
    cases = CASES["cuda" if device.startswith("cuda") else "cpu"]
    times: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    round_medians: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    for r in range(rounds):
        for name, batch in cases[r % len(cases) :] + cases[: r % len(cases)]:
            step = workload(name, batch, device)
            for _ in range(3):
                step()
            these = []
            for _ in range(iterations):
                _sync(device)
                t0 = time.perf_counter()
                step()
                _sync(device)
                these.append(time.perf_counter() - t0)
            times[(name, batch)] += these
            round_medians[(name, batch)].append(statistics.median(these))
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    rows = []
    for (name, batch), all_times in times.items():
        q = statistics.quantiles(all_times, n=10)
        rows.append(
            {
                "workload": name,
                "batch": batch,
                "iterations": len(all_times),
                "rounds": rounds,
                "median_s": statistics.median(all_times),
                "p10_s": q[0],
                "p90_s": q[-1],
                "round_median_min_s": min(round_medians[(name, batch)]),
                "round_median_max_s": max(round_medians[(name, batch)]),
                "threads": torch.get_num_threads(),
                "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu",
                "torch": torch.__version__,
                "command": " ".join(["python", "validation/e2e_local.py", *sys.argv[1:]]),
            }
        )
    return rows


def trace(name: str, batch: int, device: str, et_path: Path, kineto_path: Path | None) -> None:
    """Execution trace (gzip JSON) of one iteration after two warm-up iterations; with `kineto_path`,
    a Kineto trace of the same iteration too."""
    step = workload(name, batch, device)
    step()
    step()
    _sync(device)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "et.json"
        observer = torch.profiler.ExecutionTraceObserver()
        observer.register_callback(str(raw))
        activities = [torch.profiler.ProfilerActivity.CPU]
        activities += [torch.profiler.ProfilerActivity.CUDA] if device.startswith("cuda") else []
        observer.start()
        if kineto_path is None:
            step()
        else:
            with torch.profiler.profile(activities=activities) as prof:
                step()
                _sync(device)
        observer.stop()
        observer.unregister_callback()
        _gzip(raw, et_path)
        if kineto_path is not None:
            prof.export_chrome_trace(str(Path(tmp) / "kineto.json"))
            _gzip(Path(tmp) / "kineto.json", kineto_path)


def _gzip(src: Path, dst: Path) -> None:
    with src.open("rb") as fin, gzip.open(dst, "wb", compresslevel=9) as fout:
        shutil.copyfileobj(fin, fout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="torch device: cpu or cuda (default cpu)")
    ap.add_argument("--db", type=Path, help="profiling database measured on the device (default by device)")
    ap.add_argument("--measure", action="store_true", help="re-measure the iterations into the CSV")
    ap.add_argument("--iterations", type=int, default=20, help="timed iterations per case and round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds over all cases (interleaved)")
    ap.add_argument("--csv", type=Path, help="measured iterations (read; written by --measure; default by device)")
    ap.add_argument("--traces", type=Path, help="keep the traces here, and read them from here when present")
    args = ap.parse_args()
    device: str = args.device
    gpu = device.startswith("cuda")
    csv_default, db_default, traces_default = DEFAULTS["cuda" if gpu else "cpu"]
    csv_path: Path = args.csv or csv_default
    db_path: Path = args.db or db_default
    if args.measure or not csv_path.exists():
        rows = measure(args.iterations, args.rounds, device)
        with csv_path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    measured = {(r["workload"], int(r["batch"])): float(r["median_s"]) for r in csv.DictReader(csv_path.open())}
    cases = CASES["cuda" if gpu else "cpu"]
    with tempfile.TemporaryDirectory() as tmp:
        kept: Path | None = args.traces or traces_default
        folder = kept or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for name, batch in cases:  # every trace first: they are kept even if pricing fails
            path = folder / f"{name}_{batch}.et.json.gz"
            if not path.exists():
                trace(
                    name,
                    batch,
                    device,
                    path,
                    folder / f"{name}_{batch}.kineto.json.gz" if kept else None,
                )
        report(cases, folder, measured, db_path, csv_path, gpu)


def report(
    cases: list[tuple[str, int]],
    folder: Path,
    measured: dict[tuple[str, int], float],
    db_path: Path,
    csv_path: Path,
    gpu: bool,
) -> None:
    """Price every case's trace in `folder` and print it next to its measured time."""
    db = ProfileDB(db_path, readonly=True)
    device_id = db.devices()[-1][0]
    model = OperatorCostModel(fit_operator_models(list(db.measurements(device_id=device_id))))
    print(f"operator models fitted on {db_path} (device {device_id}); iterations from {csv_path}")
    print(f"{'workload':9s} {'batch':>5s} {'measured ms':>12s} {'predicted ms':>13s} {'error':>7s}   breakdown")
    errors = []
    for name, batch in cases:
        pred = predict_iteration(read_execution_trace(folder / f"{name}_{batch}.et.json.gz"), model, gpu=gpu)
        meas = measured[(name, batch)]
        err = pred.total_s / meas - 1
        errors.append(abs(err))
        parts = {"host": pred.host_s, **pred.kernel_s_by_family}
        split = ", ".join(f"{k} {v / pred.total_s:.0%}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])[:5])
        print(f"{name:9s} {batch:5d} {meas * 1e3:12.2f} {pred.total_s * 1e3:13.2f} {err:+7.1%}   {split}")
    geo = math.exp(sum(math.log(e) for e in errors) / len(errors))
    print(f"geomean |error| {geo:.1%} over {len(errors)} cases (mean {statistics.mean(errors):.1%})")
    if gpu:
        device_time(cases, folder, model)


def device_time(cases: list[tuple[str, int]], folder: Path, model: OperatorCostModel) -> None:
    """The device's busy time alone: the kernels, copies and memsets of each case's Kineto trace
    (profiling slows the host, not the kernels) next to the sum of the predicted kernel times."""
    errors = []
    print(f"\n{'workload':9s} {'batch':>5s} {'device ms (Kineto)':>19s} {'predicted ms':>13s} {'error':>7s}")
    for name, batch in cases:
        kineto = folder / f"{name}_{batch}.kineto.json.gz"
        if not kineto.exists():
            continue
        busy_s = float(read_kineto(kineto).op_dur_us.sum()) * 1e-6
        pred = predict_iteration(read_execution_trace(folder / f"{name}_{batch}.et.json.gz"), model, gpu=True)
        kernels_s = sum(pred.kernel_s_by_family.values())
        errors.append(abs(kernels_s / busy_s - 1))
        print(f"{name:9s} {batch:5d} {busy_s * 1e3:19.2f} {kernels_s * 1e3:13.2f} {kernels_s / busy_s - 1:+7.1%}")
    if errors:
        geo = math.exp(sum(math.log(e) for e in errors) / len(errors))
        print(f"device time: geomean |error| {geo:.1%} over {len(errors)} cases")


if __name__ == "__main__":
    main()
