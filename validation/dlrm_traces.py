"""The PARAM DLRM step on 8 × V100, each rank predicted from its execution trace, against that rank's
measured Kineto step (issue 29; the reference: 5.21% geomean per iteration with own-trace overheads,
10.15% with overheads from other workloads).

    python validation/dlrm_traces.py [--data ../shared/data/traces]

Inputs (../shared/data/traces, facebookresearch/param et_replay test inputs, one step of one run):
param_dlrm_pytorch_et_8rank.tar.gz (execution traces, ranks 0-7) and param_dlrm_kineto_8rank_v100.tar.gz
(Kineto traces of the same step, worker0-7), extracted to a temporary directory.
Predicted: traces/et_step.predict_step with no profiling database: the v100-p3.16xlarge preset's
analytic cost models (fp32), every rank at once with collectives matched across ranks. Host overheads
T1-T5 from other traces: measured on the three HolisticTraceAnalysis traces beside them (other
workloads: V100 transformer, A100 transformer, A100 CNN DDP), per operator name where seen there.
Shown apart: overheads from the run's own Kineto traces (the reference's own-trace setting).
Measured: each rank's ProfilerStep duration. The ranks' steps end within 0.1 ms of each other but
start up to 7.5 ms apart (the previous step's skew, which one step's traces cannot show): a rank's
measured step includes its wait for the latest starter, and the prediction, which starts every rank
at 0, cannot know it; the rank that started last is the one measured without that wait.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.cli.et_ranks import kineto_step_s, world_of
from itercast.config.job import load_system
from itercast.costs.analytic import AnalyticCostModel
from itercast.hardware.topology import place_group
from itercast.traces.et_pricing import ETPricer
from itercast.traces.et_step import RankStep, predict_step
from itercast.traces.execution_trace import ExecutionTrace, read_execution_trace
from itercast.traces.host_overheads import HostOverheads, measure
from itercast.traces.kineto import read_kineto

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


def predict(traces: list[ExecutionTrace], host: HostOverheads) -> list[RankStep]:
    system = load_system("v100-p3.16xlarge")
    costs = AnalyticCostModel(system, "fp32")
    group = place_group(world_of(traces), 1, system.node.gpus_per_node)
    return predict_step(traces, [ETPricer(costs) for _ in traces], host, group)


def geomean_abs(errors: list[float]) -> float:
    return math.exp(sum(math.log(max(abs(e), 1e-9)) for e in errors) / len(errors))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data/traces")
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
        kinetos = sorted(Path(tmp).glob("dlrm_kineto/*.json"), key=rank_of)
        traces = [read_execution_trace(p) for p in ets]
        measured = [kineto_step_s(k)[0] for k in kinetos]
        other = measure([read_kineto(args.data / name) for name in OTHER_TRACES])
        own = measure([read_kineto(k) for k in kinetos])
    settings = {"other traces": predict(traces, other), "own traces": predict(traces, own)}
    print("rank  measured ms  " + "  ".join(f"{name:>12} ms  error" for name in settings))
    errors: dict[str, list[float]] = {name: [] for name in settings}
    for r, m in enumerate(measured):
        row = f"{r:>4}  {m * 1e3:11.3f}"
        for name, steps in settings.items():
            err = steps[r].iteration_s / m - 1
            errors[name].append(err)
            row += f"  {steps[r].iteration_s * 1e3:15.3f}  {err:+6.1%}"
        print(row)
    slowest = max(measured)
    for name, steps in settings.items():
        pred = max(s.iteration_s for s in steps)
        print(
            f"{name}: geomean |error| per rank {geomean_abs(errors[name]):.1%} (target ≤ 10%); "
            f"slowest rank {pred * 1e3:.3f} ms predicted vs {slowest * 1e3:.3f} ms measured ({pred / slowest - 1:+.1%})"
        )


if __name__ == "__main__":
    main()
