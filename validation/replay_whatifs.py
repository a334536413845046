"""Do replayed steps follow their kernels and their data-parallel size? Checked on measured traces.

    python validation/replay_whatifs.py        # reads $ITERCAST_DATA or ../shared/data, and data/measured

Data-parallel size (issue 30 item 3): the gloo DDP traces of data/measured/gloo_parallelism
(tools/measure_gloo_parallelism.py: the same MLP and per-rank batch at 1, 2 and 4 ranks on this
2-core CPU, one thread a rank) replayed with `--dp N` and compared with the measured traced steps
at N ranks (mean over every step of every rank). The what-if re-times the all-reduces; on 2 cores
the ranks also slow each other's compute (4 ranks share 2 cores): the `shared` columns give the
machine's core count (steps.csv's `# machine:` line) as `--host-cores`, so the trace's sharing is
divided out and the target's applied (sim/sharing.py). The table above them shows each run's
main-thread busy time per step (compute) and its all-reduce time per step, measured.

Pipeline stages (issue 30 item 3): the gloo GPipe traces of data/measured/gloo_pipeline
(tools/measure_gloo_pipeline.py: the same 8-layer MLP and global batch in 2 and 4 stages, 8
micro-batches) replayed with `--pp-stages N` and compared with the measured traced steps at N
stages (mean over every step of every rank; the unprofiled steps of steps.csv beside them). Each
run's compute per step, summed over its ranks (the stages' micro-batch work and other work,
pipeline_stages.py), is the same model's work and would not change without contention; on 2 cores
it does (4 processes share them): the `shared` columns give `--host-cores` as for `--dp`.
`--pp-stages p` on a p-stage trace (no change) shows the re-staging's own error.

Tensor-parallel size (issue 30 item 3): the gloo traces of data/measured/gloo_tensor_parallel
(tools/measure_gloo_tp.py: 4 Megatron MLP blocks, hidden 512, at TP 1, 2 and 4, the same batch on
every rank) replayed with `--tp N` (tensor_parallel.py: sharded operators × t/N, TP all-reduces
re-timed for N ranks) and compared with the measured traced steps at TP N (mean over every step of
every rank; the unprofiled median beside), without and with `--host-cores`.

For each step (ProfilerStep) of each trace: measured time, the rank's GPU busy share (its own measured
GPU ops inside the measured step), and the replayed step with every kernel class scaled ×2 and
×0.5 (copies and memsets unchanged). Issue 30's target: a step at ≥ 95% GPU busy takes ≥ 1.8× its
measured time under ×2 and ≤ 0.75× under ×0.5 (a GPU-bound step follows its kernels). Ratios are
what-if / measured; steps below 95% busy are printed for context (the host decides them).
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np
from replay import extract  # validation/replay.py: the bounded tar extraction

from itercast.data_paths import shared_data_dir
from itercast.replay import replay_whatif
from itercast.traces.kineto import RankTrace, read_traces
from itercast.traces.pipeline_stages import stage_steps
from itercast.traces.whatif import KERNEL_CLASSES, WhatIf

GPU_BOUND = 0.95  # issue 30: "a step at ≥ 95% GPU busy"
GLOO = Path(__file__).resolve().parents[1] / "data" / "measured" / "gloo_parallelism"
PIPELINE = GLOO.parent / "gloo_pipeline"
TENSOR = GLOO.parent / "gloo_tensor_parallel"
TP_CASES = [(2, 1), (2, 4), (4, 2)]  # (measured TP size, what-if TP size)
PP_CASES = [(2, 2), (4, 4), (2, 4), (4, 2)]  # (measured stages, what-if stages)
DP_CASES = [(2, 4), (2, 1), (4, 2), (4, 1)]  # (measured world size, what-if data-parallel size)
ALL_KERNELS = [cls for cls, _ in KERNEL_CLASSES] + ["other"]  # every kernel class (not memcpy/memset)


def data_parallel() -> None:
    """`--dp N` on the measured gloo traces against the measured steps at N ranks."""
    runs = {ws: read_traces(sorted(GLOO.glob(f"ws{ws}.rank*.trace.json.gz"))) for ws in (1, 2, 4)}
    print("measured gloo DDP runs (per step, mean over steps and ranks):")
    print(f"{'ranks':>5} {'step_ms':>8} {'compute_ms':>10} {'all_reduce_ms':>13}")
    measured = {}
    for ws, traces in runs.items():
        steps = [s_[3] * 1e-3 for t in traces for s_ in t.steps]
        measured[ws] = float(np.mean(steps))
        compute, comm = np.mean([_busy_ms(t) for t in traces], axis=0)
        print(f"{ws:5d} {measured[ws]:8.2f} {compute:10.2f} {comm:13.2f}")
    cores = host_cores(GLOO / "steps.csv")
    print()
    print(
        f"{'trace':>5} {'--dp':>4} {'replayed_ms':>11} {'predicted_ms':>12} {'measured_ms':>11} {'error':>7} "
        f"{'shared_ms':>9} {'error':>7}   (shared: --host-cores {cores})"
    )
    for ws, dp in DP_CASES:
        paths = sorted(GLOO.glob(f"ws{ws}.rank*.trace.json.gz"))
        base, moved, _ = replay_whatif(paths, WhatIf(dp=dp))
        _, shared, _ = replay_whatif(paths, WhatIf(dp=dp, host_cores=cores))
        replayed = float(np.mean([s_.replayed_s for s_ in base.steps])) * 1e3
        predicted = float(np.mean([s_.replayed_s for s_ in moved.steps])) * 1e3
        with_sharing = float(np.mean([s_.replayed_s for s_ in shared.steps])) * 1e3
        print(
            f"{ws:5d} {dp:4d} {replayed:11.2f} {predicted:12.2f} {measured[dp]:11.2f} "
            f"{predicted / measured[dp] - 1:+7.1%} {with_sharing:9.2f} {with_sharing / measured[dp] - 1:+7.1%}"
        )


def pipeline_stages() -> None:
    """`--pp-stages N` on the measured gloo pipeline traces against the measured steps at N stages."""
    runs = {pp: sorted(PIPELINE.glob(f"pp{pp}.rank*.trace.json.gz")) for pp in (2, 4)}
    unprofiled = _unprofiled_ms(PIPELINE / "steps.csv")
    print("measured gloo GPipe runs (per step, mean over steps and ranks; compute summed over the ranks):")
    print(f"{'stages':>6} {'traced_ms':>9} {'unprofiled_ms':>13} {'compute_ms':>10} {'per_rank_ms':>11}")
    measured = {}
    for pp, paths in runs.items():
        traces = read_traces(paths)
        measured[pp] = float(np.mean([s_[3] * 1e-3 for t in traces for s_ in t.steps]))
        work = [
            [float(st.forward_s.sum() + st.backward_s.sum() + st.rest_s) * 1e3 for st in stage_steps(t, t.rank)]
            for t in traces
        ]
        compute = float(np.sum(np.mean(work, axis=1)))
        print(f"{pp:6d} {measured[pp]:9.2f} {np.mean(unprofiled[pp]):13.2f} {compute:10.2f} {compute / pp:11.2f}")
    print()
    _whatif_rows("--pp", PP_CASES, runs, measured, host_cores(PIPELINE / "steps.csv"))


def tensor_parallel() -> None:
    """`--tp N` on the measured gloo Megatron-MLP traces against the measured steps at TP N."""
    runs = {tp: sorted(TENSOR.glob(f"tp{tp}.rank*.trace.json.gz")) for tp in (1, 2, 4)}
    unprofiled = _unprofiled_ms(TENSOR / "steps.csv")
    measured = {}
    print("measured gloo tensor-parallel runs (per step: traced mean over steps and ranks, unprofiled median):")
    for tp, paths in runs.items():
        measured[tp] = float(np.mean([s_[3] * 1e-3 for t in read_traces(paths) for s_ in t.steps]))
        print(f"  TP {tp}: traced {measured[tp]:.2f} ms, unprofiled {np.median(unprofiled[tp]):.2f} ms")
    _whatif_rows("--tp", TP_CASES, runs, measured, host_cores(TENSOR / "steps.csv"))


def _whatif_rows(
    flag: str, cases: list[tuple[int, int]], runs: dict[int, list[Path]], measured: dict[int, float], cores: int
) -> None:
    """One row per (measured size, what-if size): the what-if's step (mean over its steps) without and
    with `--host-cores`, against the measured mean at the what-if's size."""
    print(
        f"{'trace':>5} {flag:>4} {'predicted_ms':>12} {'measured_ms':>11} {'error':>7} "
        f"{'shared_ms':>9} {'error':>7}   (shared: --host-cores {cores})"
    )
    option = {"--pp": "pp_stages", "--tp": "tp"}[flag]
    for size, new in cases:
        _, moved, _ = replay_whatif(runs[size], WhatIf(**{option: new}))
        _, shared, _ = replay_whatif(runs[size], WhatIf(**{option: new, "host_cores": cores}))
        predicted = float(np.mean([s_.replayed_s for s_ in moved.steps])) * 1e3
        with_sharing = float(np.mean([s_.replayed_s for s_ in shared.steps])) * 1e3
        print(
            f"{size:5d} {new:4d} {predicted:12.2f} {measured[new]:11.2f} {predicted / measured[new] - 1:+7.1%} "
            f"{with_sharing:9.2f} {with_sharing / measured[new] - 1:+7.1%}"
        )


def _unprofiled_ms(steps_csv: Path) -> dict[int, list[float]]:
    """steps.csv's unprofiled step times (ms) by the size in its first column (tools/gloo_runs.py)."""
    out: dict[int, list[float]] = {}
    for line in steps_csv.read_text().splitlines()[1:]:
        if not line.startswith("#") and line[:1].isdigit():
            size, _, _, step_s = line.split(",")
            out.setdefault(int(size), []).append(float(step_s) * 1e3)
    return out


def host_cores(steps_csv: Path) -> int:
    """The measuring machine's cores, from its steps.csv header (`# machine: vm x86_64 2 cpus, cpu`,
    tools/gloo_runs.py): Kineto traces record none."""
    found = re.search(r"^# machine: .*?(\d+) cpus", steps_csv.read_text(), re.MULTILINE)
    if found is None:
        raise SystemExit(f"{steps_csv}: no '# machine: … N cpus' line to read the host's cores from")
    return int(found.group(1))


def _busy_ms(t: RankTrace) -> tuple[float, float]:
    """Per step (mean, ms): time the step's thread spent in its top-level ops, and in gloo collectives."""
    compute, comm = [], []
    for _, tid, ts, dur in t.steps:
        top = t.top_level_ops(tid)
        lo = np.clip(t.cpu_ts_us[top], ts, ts + dur)
        hi = np.clip(t.cpu_ts_us[top] + t.cpu_dur_us[top], ts, ts + dur)
        inside = (t.comm_ts_us >= ts) & (t.comm_ts_us < ts + dur)
        compute.append(float((hi - lo).sum()) * 1e-3)
        comm.append(float(t.comm_dur_us[inside].sum()) * 1e-3)
    return float(np.mean(compute)), float(np.mean(comm))


def main() -> None:
    data_parallel()
    print()
    pipeline_stages()
    print()
    tensor_parallel()
    print()
    data = shared_data_dir()
    if data is None or not (data / "traces").is_dir():
        print("no shared traces (set ITERCAST_DATA or place ../shared/data beside the repo): nothing to check")
        return
    traces = data / "traces"
    print(
        f"{'trace':30} {'rank':>4} {'step':>5} {'busy':>5} {'measured_ms':>11} "
        f"{'x2_ms':>9} {'x2':>5} {'x0.5_ms':>9} {'x0.5':>5}"
    )
    bound: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = [(p.name.removesuffix(".json.gz"), [p]) for p in sorted(traces.glob("hta_*.json.gz"))]
        dlrm = traces / "param_dlrm_kineto_8rank_v100.tar.gz"
        if dlrm.is_file():
            cases.append(("param_dlrm_8rank_v100", sorted(extract(dlrm, Path(tmp)).glob("*.json"))))
        for name, paths in cases:
            base, slow, _ = replay_whatif(paths, WhatIf({cls: 2.0 for cls in ALL_KERNELS}))
            _, fast, _ = replay_whatif(paths, WhatIf({cls: 0.5 for cls in ALL_KERNELS}))
            for b, s, f in zip(base.steps, slow.steps, fast.steps, strict=True):
                x2, x05 = s.replayed_s / b.measured_s, f.replayed_s / b.measured_s
                print(
                    f"{name[:30]:30} {b.rank:4d} {b.step:5d} {b.gpu_busy:5.0%} {b.measured_s * 1e3:11.3f} "
                    f"{s.replayed_s * 1e3:9.3f} {x2:5.2f} {f.replayed_s * 1e3:9.3f} {x05:5.2f}"
                )
                if b.gpu_busy >= GPU_BOUND:
                    bound.append((x2, x05))
    print()
    if not bound:
        print(f"steps at ≥ {GPU_BOUND:.0%} GPU busy: none in the data (the busiest is printed above)")
        return
    ok = sum(x2 >= 1.8 and x05 <= 0.75 for x2, x05 in bound)
    print(f"steps at ≥ {GPU_BOUND:.0%} GPU busy: {len(bound)}; following their kernels (×2 ≥ 1.8, ×0.5 ≤ 0.75): {ok}")


if __name__ == "__main__":
    main()
