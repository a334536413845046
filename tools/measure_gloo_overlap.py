"""A point-to-point exchange between 2 gloo ranks alone and beside an all-reduce in flight: do two
collectives of one rank share its core (workloads/dlrm/step.py, "Cores")?

    python tools/measure_gloo_overlap.py --out data/measured/gloo_exchange_beside_allreduce.csv

2 processes of one thread each on 127.0.0.1, as tools/measure_dlrm_sharding.py runs a DLRM step's ranks:
per (exchange size, all-reduce size), REPEATS timed repeats after WARMUP, each behind a barrier: an
async all-reduce issued (none for size 0), then irecv + isend to the peer and both waited
(ShardedDLRM._exchange), then the all-reduce waited. Rank 0's medians in milliseconds: the exchange,
the all-reduce's wait after it, the whole; and each all-reduce alone. Needs torch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from measure_dlrm_sharding import free_port, init_gloo_rank  # noqa: E402

EXCHANGE_KIB, ALL_REDUCE_KIB = (16, 256, 1024), (0, 40, 1024)
WARMUP, REPEATS = 10, 50


def worker(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    init_gloo_rank(torch, rank, 2, port)
    peer, rows = 1 - rank, []
    for ex_kib, ar_kib in [(e, a) for e in EXCHANGE_KIB for a in ALL_REDUCE_KIB] + [(0, a) for a in ALL_REDUCE_KIB[1:]]:
        send, recv = torch.randn(ex_kib * 256), torch.empty(ex_kib * 256)
        flat = torch.randn(ar_kib * 256)
        times = []
        for i in range(WARMUP + REPEATS):
            dist.barrier()
            t0 = time.perf_counter()
            handle = dist.all_reduce(flat, async_op=True) if ar_kib else None
            t1 = time.perf_counter()
            if ex_kib:
                for req in (dist.irecv(recv, peer), dist.isend(send, peer)):
                    if req is not None:  # point-to-point calls return their work
                        req.wait()
            t2 = time.perf_counter()
            if handle is not None:
                handle.wait()
            t3 = time.perf_counter()
            if i >= WARMUP:
                times.append((t2 - t1, t3 - t2, t3 - t0))
        medians = [statistics.median(t[j] for t in times) * 1e3 for j in range(3)]
        rows.append(f"{ex_kib},{ar_kib},{REPEATS}," + ",".join(f"{m:.4f}" for m in medians))
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text("\n".join(rows) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import torch
    import torch.multiprocessing as mp

    tmp = args.out.with_suffix(".tmp")
    mp.spawn(worker, args=(free_port(), str(tmp)), nprocs=2)
    header = [
        f"# command: python tools/measure_gloo_overlap.py --out {args.out}",
        f"# torch {torch.__version__}; rank 0's medians over {REPEATS} repeats after {WARMUP}; exchange_kib 0: "
        "the all-reduce alone",
        "exchange_kib,all_reduce_kib,repeats,exchange_ms,all_reduce_wait_after_ms,total_ms",
    ]
    args.out.write_text("\n".join(header) + "\n" + tmp.read_text() + "\n")
    tmp.unlink()
    print(args.out.read_text())


if __name__ == "__main__":
    main()
