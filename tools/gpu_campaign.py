"""What only a GPU can show, in one command: kernel, memory and whole-step measurements of one GPU.

    python tools/gpu_campaign.py --out OUT                  # every part (about 15 minutes on an H100)
    python tools/gpu_campaign.py --out OUT --parts attention,gemm --deadline-s 540
    python tools/gpu_campaign.py --out OUT --budgets gemm=110,attention=100 --sustained-s 45
    python tools/gpu_campaign.py --dry-run --out OUT        # the same code at tiny sizes, on this CPU
    python tools/gpu_campaign.py --readme --out DIR         # rewrite DIR's README from its run records

Parts (tools/campaign/): attention (SDPA back ends, causal or not, 1K–32K, head 64/128, GQA),
cross_entropy (logits and loss at 32K–256K vocabularies), gemm (bf16 and fp8 at training shapes, then a
60-second sustained run of each), grouped_gemm (MoE experts), moe_routing
(the router's top-k and the routed rows' permutation around them), traces (a GPU-bound training step's Kineto trace
and its measured what-ifs), memory (peaks of training-step configurations), step_times (1,000
consecutive steps), launch_blocking (the same work under CUDA_LAUNCH_BLOCKING=1 and =0), embedding (embedding
bags at DLRM shard sizes), dlrm (single-GPU DLRM steps).

Everything lands under OUT: one CSV per part (rows written as measured, so a killed run keeps what it
had), traces/, a record of the run (run_<UTC time>.json: the command, the machine read with nvidia-smi
and torch, each part's summary) and README.md describing every file. With --archive FILE the folder
is also packed into FILE after each part (what a lent GPU machine hands back). Each part has a time
budget; configurations past it are skipped and counted in the summary, and the run stops starting
parts once --deadline-s is spent. The embedding and dlrm parts import itercast (its dependencies must
be installed); the others need torch alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tools"), str(ROOT)]

import torch  # noqa: E402
from campaign import kernels, launch_blocking, recsys, training  # noqa: E402
from campaign.common import Budget, ClockSampler, Context, machine_readout, write_json  # noqa: E402

#: part → (function, its time budget in seconds on a GPU)
PARTS: dict[str, tuple[Callable[[Context, Budget], str], float]] = {
    "attention": (kernels.run_attention, 200),
    "cross_entropy": (kernels.run_cross_entropy, 60),
    "gemm": (kernels.run_gemms, 150),  # then the sustained run (60 s) outside the budget
    "grouped_gemm": (kernels.run_grouped_gemms, 40),
    "moe_routing": (kernels.run_moe_routing, 40),
    "traces": (training.run_traces, 120),
    "memory": (training.run_memory, 90),
    "step_times": (training.run_step_distribution, 120),
    "launch_blocking": (launch_blocking.run_launch_blocking, 90),
    "embedding": (recsys.run_embedding, 150),
    "dlrm": (recsys.run_dlrm_steps, 90),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="output folder (created)")
    ap.add_argument("--parts", default="all", help=f"comma-separated parts or 'all': {', '.join(PARTS)}")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes (any device; what CI runs on a CPU)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--deadline-s", type=float, default=1140.0, help="start no part after this many seconds")
    ap.add_argument("--budgets", default="", help="PART=SECONDS,... replacing those parts' time budgets")
    ap.add_argument("--sustained-s", type=float, help="seconds of each sustained GEMM run (default 60 on a GPU)")
    ap.add_argument("--archive", type=Path, help="pack the output folder into this .tar.gz after each part")
    ap.add_argument("--readme", action="store_true", help="only rewrite OUT/README.md from its run records")
    args = ap.parse_args(argv)
    if args.readme:
        write_readme(args.out)
        return 0
    parts = list(PARTS) if args.parts == "all" else [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        ap.error(f"--parts: expected names from {', '.join(PARTS)} or 'all', got {args.parts!r}")
    try:
        budgets = {p: b for p, (_, b) in PARTS.items()} | parse_budgets(args.budgets)
    except ValueError as err:
        ap.error(f"--budgets: {err}")
    if args.sustained_s is not None and args.sustained_s <= 0:
        ap.error(f"--sustained-s: expected seconds > 0, got {args.sustained_s}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: torch {torch.__version__} sees no CUDA GPU here (use --dry-run on a CPU)")
    args.out.mkdir(parents=True, exist_ok=True)
    return run(args, parts, budgets)


def parse_budgets(text: str) -> dict[str, float]:
    """`PART=SECONDS,...` as {part: seconds}; a part not in PARTS or seconds not > 0 raise ValueError."""
    out: dict[str, float] = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        part, _, seconds = item.partition("=")
        if part not in PARTS:
            raise ValueError(f"expected PART=SECONDS with PART one of {', '.join(PARTS)}, got {item!r}")
        try:
            out[part] = float(seconds)
        except ValueError:
            raise ValueError(f"expected seconds as a number in {item!r}") from None
        if out[part] <= 0:
            raise ValueError(f"expected seconds > 0 in {item!r}")
    return out


def run(args: argparse.Namespace, parts: list[str], budgets: dict[str, float]) -> int:
    started = time.monotonic()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    with ClockSampler() as sampler:
        ctx = Context(args.out, args.device, args.dry_run, sampler, args.sustained_s)
        record = {
            "command": "python tools/gpu_campaign.py " + " ".join(sys.argv[1:]),
            "machine": machine_readout(args.device) | {"context_bytes": ctx.context_bytes},
            "parts": {},
            "files": ctx.files,
        }
        for part in parts:
            fn, budget_s = PARTS[part][0], budgets[part]
            left = args.deadline_s - (time.monotonic() - started)
            if left <= 0:
                record["parts"][part] = "not run: the deadline was spent"
                continue
            t0 = time.monotonic()
            print(f"[{time.monotonic() - started:7.1f} s] {part} …", flush=True)
            try:
                summary = fn(ctx, Budget(min(budget_s, left) if not args.dry_run else 600.0))
            except Exception as err:  # one part's failure must not lose the others' data
                summary = f"failed: {type(err).__name__}: {str(err).strip().splitlines()[0][:300] if str(err) else ''}"
            record["parts"][part] = f"{summary} ({time.monotonic() - t0:.0f} s)"
            print(f"           {part}: {record['parts'][part]}", flush=True)
            write_json(args.out / f"run_{stamp}.json", record)
            write_readme(args.out)
            if args.archive:
                pack(args.out, args.archive)
    return 0


def pack(folder: Path, archive: Path) -> None:
    """The folder as a .tar.gz, replaced atomically (a kill mid-write leaves the previous one)."""
    tmp = archive.with_name(archive.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(folder, arcname=".")
    tmp.replace(archive)


def write_readme(folder: Path) -> None:
    """README.md from the folder's run records: the machine of each run, its command and parts, and
    what every file holds."""
    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("run_*.json"))]
    lines = [
        "# GPU measurement campaign",
        "",
        "Written by `tools/gpu_campaign.py` (its docstring says what each part measures).",
        "",
    ]
    files: dict[str, str] = {}
    for r in runs:
        m = r["machine"]
        smi = m.get("nvidia_smi", {})
        lines += [f"## Run of {m['date_utc']} UTC", "", f"`{r['command']}`", ""]
        lines += [
            f"- device: {m.get('gpu', m['device'])}; torch {m['torch']}, CUDA {m['cuda_runtime']}, "
            f"cuDNN {m.get('cudnn', '')}",
            f"- host: {m['host']}, {m['cpus']} CPUs, Python {m['python']}; CUDA context and workspaces "
            f"{m['context_bytes']} bytes",
        ]
        lines += [f"- nvidia-smi: {k} = {v}" for k, v in smi.items()]
        lines += [f"- {m['nvidia_smi_error']}"] if "nvidia_smi_error" in m else []
        lines += [""] + [f"- part {p}: {s}" for p, s in r["parts"].items()] + [""]
        files |= r["files"]
    lines += ["## Files", "", "| file | what |", "|---|---|"]
    lines += [f"| {name} | {what} |" for name, what in sorted(files.items())]
    (folder / "README.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
