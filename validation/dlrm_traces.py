"""The PARAM DLRM step on 8 × V100, each rank predicted from its execution trace, against that rank's
measured Kineto step (issue 29; the reference: 5.21% geomean per iteration with own-trace overheads,
10.15% with overheads from other workloads).

    python validation/dlrm_traces.py [--data ../shared/data/traces]
    python validation/dlrm_traces.py --write-other hta.json   # the "other workloads" overheads, for the CLI

`itercast predict --et ETS/ --system v100-p3.16xlarge --calibration hta.json --kineto KINETOS/
--measured-starts` gives the "other wl, calls LOO +starts" column (cli/et_ranks.py); `calibrate
--host-trace` refuses the three traces together (runs of different world sizes).

Inputs (../shared/data/traces, facebookresearch/param et_replay test inputs, one step of one run):
param_dlrm_pytorch_et_8rank.tar.gz (execution traces, ranks 0-7) and param_dlrm_kineto_8rank_v100.tar.gz
(Kineto traces of the same step, worker0-7), extracted to a temporary directory.
Predicted: traces/et_step.predict_step with no profiling database: the v100-p3.16xlarge preset's
analytic cost models (fp32), every rank at once with collectives matched across ranks. Host overheads
T1-T5 and the runtime calls each operator makes (HostOverheads.calls_per_op), nothing fitted on the rank
checked, four sources: "other workloads", the three HolisticTraceAnalysis traces beside them (V100
transformer, A100 transformer, A100 CNN DDP), per operator name where seen there (their calls too: their
aten operators; TorchRec/FBGEMM operators, never seen there, keep one call per launch walked), measured
to price another workload (measure(…, other_workloads=True): T1 as the reference counts it, 9.85 µs
where the mean of every gap is 14.4; an operator that launches nothing at its name's or category's
median duration, else T1 alone);
"other wl, calls LOO": the same T1-T5 with rank r's calls per operator counted on the 7 other ranks'
Kineto traces (leave one rank out: the same software, counts, not times); "other ranks", rank r's
T1-T5 and calls from the 7 other ranks (leave one rank out); "own trace", the reference's own-trace
setting (not a check: fitted on the rank). Under each leave-one-rank-out model every rank is predicted
and rank r's figure kept (et_step.predict_each_rank), so rank r's trace does not reach it via a peer.
Measured: each rank's ProfilerStep duration. The ranks' steps end within 1 ms of each other but start
up to 7.5 ms apart (the previous step's skew, which one step's traces cannot show): a rank's measured
step includes its wait for the latest starter. "+starts" columns start each rank at its MEASURED start
(rendezvous.measured_starts_s: its ProfilerStep start relative to the end of its first NCCL kernel,
the same instant on every rank); the other columns start every rank at 0.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.cli.et_ranks import world_of
from itercast.config.job import load_system
from itercast.costs.analytic import AnalyticCostModel
from itercast.hardware.topology import place_group
from itercast.profile.calibrate import host_overheads_only
from itercast.traces.et_pricing import ETPricer
from itercast.traces.et_step import RankStep, predict_each_rank
from itercast.traces.execution_trace import ExecutionTrace, read_execution_trace
from itercast.traces.host_overheads import HostOverheads, left_out, measure, with_calls_of
from itercast.traces.kineto import read_kineto
from itercast.traces.rendezvous import measured_starts_s

OTHER_TRACES = (
    "hta_v100_ws2_rank1_allreduce.json.gz",
    "hta_a100_ws8_rank3_control.json.gz",
    "hta_a100_ws2_rank0_cnn_ddp.json.gz",
)


def rank_of(p: Path) -> int:
    """dlrm_eg_3.json and worker3_step_12….json are rank 3."""
    found = re.search(r"(?:eg_|worker)(\d+)", p.name)
    if found is None:
        raise SystemExit(f"{p}: no rank number in the name")
    return int(found.group(1))


def predict(traces: list[ExecutionTrace], hosts: list[HostOverheads], starts_s: list[float] | None) -> list[RankStep]:
    """Rank r's predicted step under hosts[r] (module docstring)."""
    system = load_system("v100-p3.16xlarge")
    costs = AnalyticCostModel(system, "fp32")
    group = place_group(world_of(traces), 1, system.node.gpus_per_node)
    return predict_each_rank(traces, lambda: [ETPricer(costs) for _ in traces], hosts, group, starts_s)


def geomean_abs(errors: list[float]) -> float:
    return math.exp(sum(math.log(max(abs(e), 1e-9)) for e in errors) / len(errors))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data/traces")
    parser.add_argument("--write-other", type=Path, metavar="FILE", help="write the other workloads' T1-T5 and stop")
    args = parser.parse_args()
    ets_tar = args.data / "param_dlrm_pytorch_et_8rank.tar.gz"
    kin_tar = args.data / "param_dlrm_kineto_8rank_v100.tar.gz"
    if not ets_tar.is_file() or not kin_tar.is_file():
        print(f"skipped: {ets_tar.name} or {kin_tar.name} not in {args.data}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        for tar in (ets_tar, kin_tar):
            with tarfile.open(tar) as f:
                f.extractall(tmp, filter="data")
        ets = sorted(Path(tmp).glob("dlrm_pytorch_et/*.json"), key=rank_of)
        kinetos = [read_kineto(k) for k in sorted(Path(tmp).glob("dlrm_kineto/*.json"), key=rank_of)]
        traces = [read_execution_trace(p) for p in ets]
        other = measure([read_kineto(args.data / name) for name in OTHER_TRACES], other_workloads=True)
    if args.write_other is not None:
        args.write_other.write_text(json.dumps(host_overheads_only(other), indent=1) + "\n")
        print(f"wrote {args.write_other}: T1-T5 and runtime calls of {', '.join(OTHER_TRACES)}")
        return
    measured = [statistics.median(s[3] for s in k.steps) * 1e-6 for k in kinetos]
    world = len(kinetos)
    others = left_out(kinetos)
    overheads = {
        "other workloads": [other] * world,
        "other wl, calls LOO": [with_calls_of(other, m) for m in others],
        "other ranks": others,
        "own trace": [measure([k]) for k in kinetos],
    }
    starts = measured_starts_s(kinetos)
    steps = {
        f"{name}{suffix}": predict(traces, hosts, s)
        for name, hosts in overheads.items()
        for suffix, s in (("", None), (" +starts", starts))
    }
    columns = {name: [s.iteration_s for s in ranks] for name, ranks in steps.items()}
    print(
        "measured starts (ms after the first rank's, from each trace's first rendezvous): "
        + " ".join(f"{x * 1e3:.3f}" for x in starts)
    )
    print("rank  measured ms  " + "  ".join(f"{name:>24}" for name in columns))
    for r, m in enumerate(measured):
        cells = "  ".join(f"{columns[c][r] * 1e3:16.3f} {columns[c][r] / m - 1:+6.1%}" for c in columns)
        print(f"{r:>4}  {m * 1e3:11.3f}  {cells}")
    for name, pred in columns.items():
        errors = [p / m - 1 for p, m in zip(pred, measured, strict=True)]
        mean = statistics.mean(map(abs, errors))
        print(
            f"{name:>24}: per rank geomean |error| {geomean_abs(errors):5.1%}, mean {mean:5.1%}, "
            f"max {max(map(abs, errors)):5.1%} (target geomean ≤ 10%); slowest rank {max(pred) * 1e3:.3f} ms vs "
            f"{max(measured) * 1e3:.3f} ms measured; "
            f"{statistics.mean(sum(s.default_calls.values()) for s in steps[name]):.0f} ops at the default 1 call "
            "per launch a rank"
        )


if __name__ == "__main__":
    main()
