"""Measure DLRM training steps under several embedding shardings on this CPU (the measured side of
validation/sharding.py): 2 processes over gloo on 127.0.0.1, one thread each.

    python tools/measure_dlrm_sharding.py --out data/measured/cpu_dlrm_sharding.csv

Model: the `dlrm-small` preset (4 tables of 1M, 500k, 100k and 1k rows, dim 32, pooling 20, 10, 5
and 1; MLPs 13-64-32 and 42-64-1, dot interaction), in plain torch.distributed with TorchRec's
sharding semantics, so that what is timed is what workloads/dlrm.py models:
- table-wise / column-wise: the owner pools its table (or its columns) for all W·b samples and
  sends each rank its b rows (point-to-point sends, as an all-to-all would); backward, each rank
  sends the pooled gradients back and the owner updates the distinct rows it looked up (row-wise
  Adagrad, one fp32 state per row: profile/op_calls.rowwise_adagrad_update, the update that
  `itercast profile` times on its own);
- row-wise: each rank holds a block of rows, pools the lookups that fall in it for all samples,
  and the partial sums of all row-wise tables are reduce-scattered at once; backward, their pooled
  gradients are all-gathered at once (TorchRec runs one collective per sharding type);
- data-parallel: a replica per rank pooling its own b samples; its dense gradient is all-reduced
  with the MLPs' gradients (asynchronously, beside the other tables' backward) and the whole table
  is updated (DDP's dense row-wise Adagrad);
- MLPs: autograd, the gradients all-reduced as one buffer, Adam.
Every rank draws the same global batch of indices (uniform, or Zipf with α over each table's rows,
the popular rows spread over the table as hashed ids are),
so the input distribution of indices to the ranks that own them is not timed (validation/sharding.py
prices these steps with model.input_distribution false). A sharding set is a (batch per rank,
index distribution, t0 pooling); within a set every sharding runs in rounds, interleaved, WARMUP
untimed then ITERATIONS timed steps each round. One row per timed step: the slowest rank's seconds
from the forward's start to the optimizer's end (time.perf_counter_ns). The header records the
machine, torch version and command. Needs torch.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from itercast.profile.op_calls import rowwise_adagrad_update

#: the shardings measured in every set (2 ranks; dlrm-small's tables t0..t3), chosen before any
#: prediction was made to span the strategies: each uniform one, two mixes, one badly balanced
RW, CW, DP = ("row_wise", (0, 1)), ("column_wise", (0, 1)), ("data_parallel", (0, 1))
TW0, TW1 = ("table_wise", (0,)), ("table_wise", (1,))
SHARDINGS: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {
    name: dict(zip(("t0", "t1", "t2", "t3"), shards, strict=True))
    for name, shards in {
        "tw_balanced": (TW0, TW1, TW1, TW1),
        "tw_rank0": (TW0, TW0, TW0, TW0),
        "row_wise": (RW, RW, RW, RW),
        "column_wise": (CW, CW, CW, CW),
        "mix_rw_cw": (RW, CW, TW0, DP),
        "mix_tw_rw": (TW1, RW, TW0, DP),
        "dp_large": (DP, TW1, TW0, TW1),
    }.items()
}
#: (batch per rank, Zipf α (0: uniform), t0's pooling factor): dlrm-small as it is (t0 20 lookups a
#: sample), and with t0 at 100 (MLPerf DLRM-DCNv2's largest multi-hot size), where one table
#: outweighs the rest and placing whole tables can no longer balance the ranks
SETS = ((256, 0.0, 20), (256, 1.05, 20), (2048, 0.0, 20), (2048, 1.05, 20), (2048, 0.0, 100), (2048, 1.05, 100))
WARMUP, ITERATIONS, ROUNDS, BATCHES = 3, 15, 5, 4  # BATCHES: distinct index batches cycled through
LR, EPS = 0.01, 1e-8  # Adagrad's step and ε (the replicas' dense update; the sharded tables' is in the update)


def draw(torch: Any, rows: int, count: int, alpha: float, gen: Any) -> Any:
    """`count` row indices: uniform, or Zipf (the r-th most popular row drawn with probability
    ∝ r^−α) with the popular rows scattered over the table by a fixed random permutation, as hashed
    ids are (with the hot rows first, a row-wise shard's first block would get most lookups). Zipf
    ranks are drawn by inverting the cumulative weights (torch.multinomial refuses over 2^24 rows,
    and DLRM tables reach 40M)."""
    if alpha == 0:
        return torch.randint(0, rows, (count,), generator=gen)
    cdf = (torch.arange(1, rows + 1, dtype=torch.float64) ** -alpha).cumsum_(0)
    ranks = torch.searchsorted(cdf, torch.rand(count, dtype=torch.float64, generator=gen) * cdf[-1])
    return torch.randperm(rows, generator=gen)[ranks.clamp_(max=rows - 1)]


class ShardedDLRM:
    """One rank's part of the model under one sharding, and its training step."""

    def __init__(
        self, torch: Any, model: Any, sharding: dict, rank: int, world: int, b: int, alpha: float, device: str = "cpu"
    ) -> None:
        self.torch, self.rank, self.world, self.b, self.device = torch, rank, world, b, device
        self.dist = torch.distributed
        gen = torch.Generator().manual_seed(1234)  # the same indices on every rank
        B = b * world
        self.tables = []
        for t in model.tables:
            strategy, ranks = sharding[t.name]
            P, d = int(t.pooling_factor), t.embedding_dim
            batches = [draw(torch, t.num_rows, B * P, alpha, gen) for _ in range(BATCHES)]
            entry: dict[str, Any] = {"name": t.name, "strategy": strategy, "ranks": ranks, "dim": d, "inputs": []}
            if strategy in ("table_wise", "column_wise"):
                entry["width"] = d // len(ranks)
            if rank in ranks:
                rows = t.num_rows
                if strategy == "row_wise":
                    block = -(-t.num_rows // world)
                    lo, rows = rank * block, min(block, t.num_rows - rank * block)
                width = entry.get("width", d)
                entry["weight"] = torch.randn(rows, width, device=device).mul_(0.01)
                entry["state"] = torch.zeros(rows, device=device)
                for idx in batches:  # what this rank looks up, its bags' offsets and each lookup's bag
                    bag = torch.arange(B).repeat_interleave(P)
                    if strategy == "row_wise":
                        keep = (idx >= lo) & (idx < lo + rows)
                        idx, bag = idx[keep] - lo, bag[keep]
                    elif strategy == "data_parallel":
                        idx, bag = idx[rank * b * P : (rank + 1) * b * P], bag[: b * P]
                    bags = b if strategy == "data_parallel" else B
                    counts = torch.bincount(bag, minlength=bags)
                    offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)[:-1]])
                    entry["inputs"].append((idx.to(device), offsets.to(device), bag.to(device)))
            self.tables.append(entry)
        nn = torch.nn
        dims = (model.dense_features, *model.bottom_mlp)
        self.bottom = nn.Sequential(*[m for i, o in itertools.pairwise(dims) for m in (nn.Linear(i, o), nn.ReLU())])
        dims = (model.interaction_width(), *model.top_mlp)
        top = [m for i, o in itertools.pairwise(dims) for m in (nn.Linear(i, o), nn.ReLU())]
        self.top = nn.Sequential(*top[:-1])
        self.bottom.to(device)
        self.top.to(device)
        self.params = [*self.bottom.parameters(), *self.top.parameters()]
        self.opt = torch.optim.Adam(self.params, lr=1e-3)
        f = len(model.tables) + 1
        self.pairs = torch.triu_indices(f, f, offset=1, device=device)
        self.dense = torch.randn(b, model.dense_features, device=device)
        self.labels = torch.randint(0, 2, (b, 1), device=device).float()
        self.step_count = 0
        #: (phase, perf_counter_ns at its end) of the steps run while a list is set (tools/measure_phases_in_step.py)
        self.marks: list[tuple[str, int]] | None = None

    def _mark(self, phase: str) -> None:
        if self.marks is not None:
            self.marks.append((phase, time.perf_counter_ns()))

    def _exchange(self, parts: dict[int, list[Any]], widths: dict[int, int], rows: int) -> dict[int, Any]:
        """Send each peer the concatenation of its parts; receive `rows` × widths[peer] from each."""
        torch, dist, out, reqs = self.torch, self.dist, {}, []
        for peer in range(self.world):
            if peer == self.rank:
                out[peer] = torch.cat(parts[peer], 1) if parts[peer] else None
                continue
            if widths[peer]:
                out[peer] = torch.empty(rows, widths[peer], device=self.device)
                reqs.append(dist.irecv(out[peer], peer))
            if parts[peer]:
                reqs.append(dist.isend(torch.cat(parts[peer], 1).contiguous(), peer))
        for r in reqs:
            r.wait()
        return out

    def step(self) -> None:
        torch, dist, b, world, rank = self.torch, self.dist, self.b, self.world, self.rank
        F = torch.nn.functional
        k = self.step_count % BATCHES
        self.step_count += 1
        parts: dict[int, list[Any]] = {p: [] for p in range(world)}
        widths = dict.fromkeys(range(world), 0)
        pooled: dict[str, Any] = {}
        row_wise = [e for e in self.tables if e["strategy"] == "row_wise"]
        partial = []
        self._mark("start")
        for e in self.tables:  # forward lookups
            mine = "weight" in e
            if mine:
                idx, offsets, _ = e["inputs"][k]
                out = F.embedding_bag(idx, e["weight"], offsets, mode="sum")
            if e["strategy"] in ("table_wise", "column_wise"):
                for owner in e["ranks"]:
                    widths[owner] += e["width"]
                if mine:
                    for p in range(world):
                        parts[p].append(out[p * b : (p + 1) * b])
            elif e["strategy"] == "row_wise":
                partial.append(out)
            else:
                pooled[e["name"]] = out
        self._mark("embedding_fwd")
        if row_wise:  # the row-wise tables' partial sums in one reduce-scatter, as TorchRec groups them
            summed = torch.empty(b, sum(e["dim"] for e in row_wise), device=self.device)
            dist.reduce_scatter_tensor(summed, torch.cat(partial, 1))
            pooled |= dict(
                zip([e["name"] for e in row_wise], summed.split([e["dim"] for e in row_wise], 1), strict=True)
            )
        received = self._exchange(parts, widths, b)
        at = dict.fromkeys(range(world), 0)
        for e in self.tables:
            if e["strategy"] in ("table_wise", "column_wise"):
                cols = []
                for owner in e["ranks"]:
                    cols.append(received[owner][:, at[owner] : at[owner] + e["width"]])
                    at[owner] += e["width"]
                pooled[e["name"]] = torch.cat(cols, 1)
        self._mark("pooled_exchange")
        emb = torch.stack([pooled[e["name"]] for e in self.tables], 1).requires_grad_()
        x = self.bottom(self.dense)
        z = torch.cat([x[:, None], emb], 1)
        inter = torch.bmm(z, z.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        loss = F.binary_cross_entropy_with_logits(self.top(torch.cat([x, inter], 1)), self.labels)
        self.opt.zero_grad()
        loss.backward()
        self._mark("mlp_fwd_bwd")
        grad = emb.grad
        dense_grads = [p.grad.reshape(-1) for p in self.params]
        dp_tables = []
        for i, e in enumerate(self.tables):  # data-parallel tables: dense gradients, all-reduced with the MLPs'
            if e["strategy"] == "data_parallel":
                idx, _, bag = e["inputs"][k]
                g = torch.zeros_like(e["weight"]).index_add_(0, idx, grad[:, i][bag])
                dp_tables.append((e, g))
                dense_grads.append(g.reshape(-1))
        self._mark("replica_embedding_bwd")
        flat = torch.cat(dense_grads)
        reduce = dist.all_reduce(flat, async_op=True)
        self._mark("ddp_to_buckets")
        parts = {p: [] for p in range(world)}
        widths = dict.fromkeys(range(world), 0)
        for i, e in enumerate(self.tables):  # pooled gradients back to the owners
            if e["strategy"] in ("table_wise", "column_wise"):
                c = 0
                for owner in e["ranks"]:
                    parts[owner].append(grad[:, i, c : c + e["width"]])
                    c += e["width"]
                    if owner == rank:
                        widths = {p: widths[p] + e["width"] for p in range(world)}
        back = self._exchange(parts, widths, b)
        if row_wise:  # and their pooled gradients in one all-gather
            mine = torch.cat([grad[:, i] for i, e in enumerate(self.tables) if e["strategy"] == "row_wise"], 1)
            gathered = torch.empty(b * world, mine.shape[1], device=self.device)
            dist.all_gather_into_tensor(gathered, mine)
            full_rw = dict(
                zip([e["name"] for e in row_wise], gathered.split([e["dim"] for e in row_wise], 1), strict=True)
            )
        at = dict.fromkeys(range(world), 0)
        self._mark("pooled_grad_exchange")
        for e in self.tables:
            if "weight" not in e or e["strategy"] == "data_parallel":
                continue
            idx, _, bag = e["inputs"][k]
            if e["strategy"] == "row_wise":
                full = full_rw[e["name"]]
            else:
                full = torch.cat([back[p][:, at[p] : at[p] + e["width"]] for p in range(world)], 0)
                for p in range(world):
                    at[p] += e["width"]
            rowwise_adagrad_update(e["weight"], e["state"], idx, full[bag], LR)
        self._mark("embedding_bwd")
        reduce.wait()
        self._mark("grad_all_reduce")
        flat /= world
        at_flat = 0
        for p in self.params:
            n = p.numel()
            p.grad.copy_(flat[at_flat : at_flat + n].view_as(p.grad))
            at_flat += n
        self._mark("ddp_from_buckets")
        self.opt.step()
        for e, _ in dp_tables:  # dense row-wise Adagrad over the whole replica
            n = e["weight"].numel()
            g = flat[at_flat : at_flat + n].view_as(e["weight"])
            at_flat += n
            e["state"] += torch.linalg.vector_norm(g, dim=1).pow_(2).div_(g.shape[1])  # mean of g² per row
            e["weight"].addcmul_(g, (-LR / (e["state"].sqrt() + EPS))[:, None])  # in place: no table-sized temporaries
        self._mark("optimizer")


def worker(rank: int, world: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from itercast.cli.shard_cmds import load_dlrm

    init_gloo_rank(torch, rank, world, port)
    model = load_dlrm("dlrm-small")
    rows = []
    for b, alpha, pooling in SETS:
        tables = (model.tables[0].model_copy(update={"pooling_factor": pooling}), *model.tables[1:])
        variant = model.model_copy(update={"tables": tables})
        runs = {name: ShardedDLRM(torch, variant, s, rank, world, b, alpha) for name, s in SHARDINGS.items()}
        for name, rnd, i, seconds in timed_rounds(torch, dist, runs):
            rows.append(f"{b},{alpha},{pooling},{name},{rnd},{i},{seconds:.9f}")
        if rank == 0:
            print(f"set b={b} alpha={alpha} t0 pooling {pooling} done", flush=True)
        del runs
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text("\n".join(rows) + "\n")


def timed_rounds(
    torch: Any, dist: Any, runs: dict[str, Any], rounds: int = ROUNDS
) -> Iterator[tuple[str, int, int, float]]:
    """Every run's steps in `rounds` interleaved rounds of WARMUP untimed + ITERATIONS timed steps, each
    behind a barrier: (run's key, round, timed step, the slowest rank's seconds) per timed step."""
    for rnd in range(rounds):
        for name, run in runs.items():
            for i in range(WARMUP + ITERATIONS):
                dist.barrier()
                t0 = time.perf_counter_ns()
                run.step()
                seconds = torch.tensor([(time.perf_counter_ns() - t0) * 1e-9], dtype=torch.float64)
                dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank's step
                if i >= WARMUP:
                    yield name, rnd, i - WARMUP, float(seconds.item())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch
    import torch.multiprocessing as mp

    tmp = Path(args.out).with_suffix(".tmp")
    mp.spawn(worker, args=(2, free_port(), str(tmp)), nprocs=2)
    header = [
        f"# command: python tools/measure_dlrm_sharding.py --out {args.out}",
        "# model: preset dlrm-small; shardings: tools/measure_dlrm_sharding.py SHARDINGS",
        f"# each (set, sharding): {ROUNDS} interleaved rounds of {WARMUP} untimed + {ITERATIONS} timed steps",
        "batch_per_rank,zipf_alpha,t0_pooling,sharding,round,iteration,step_s",
    ]
    write_measured(torch, Path(args.out), tmp, 2, header)


def init_gloo_rank(torch: Any, rank: int, world: int, port: int) -> None:
    """One process of a measured run: torch seeded with its rank, one thread, in the gloo group of `world`
    processes on 127.0.0.1:`port`."""
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)


def end_rank(torch: Any, out: str, rank: int, rows: list[str]) -> None:
    """A rank's last act in a measured run: leave the gloo group, write its rows to `out`.rank<rank>
    (join_rank_files reads them)."""
    torch.distributed.destroy_process_group()
    Path(f"{out}.rank{rank}").write_text("\n".join(rows) + "\n")


def join_rank_files(out: Path, header: list[str], world: int) -> None:
    """`out`: `header`, then the rows each rank r wrote to `out`.rank<r> (removed), rank by rank."""
    parts = [Path(f"{out}.rank{r}") for r in range(world)]
    out.write_text("\n".join(header) + "\n" + "".join(p.read_text() for p in parts))
    for part in parts:
        part.unlink()
    print(f"wrote {out}")


def write_measured(torch: Any, out: Path, tmp: Path, world: int, header: list[str]) -> None:
    """`out`: the machine's and software's lines, then `header`, then the rows rank 0 wrote to `tmp`
    (removed)."""
    machine = [
        f"# machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, {platform.processor() or 'cpu'}",
        f"# python {platform.python_version()}, torch {torch.__version__}, {world} ranks over gloo, 1 thread each",
    ]
    out.write_text("\n".join(machine + header) + "\n" + tmp.read_text())
    tmp.unlink()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
