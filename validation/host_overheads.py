"""Host overheads T1–T5 (traces/host_overheads.py) checked on held-out steps of the shared traces.

    python validation/host_overheads.py        # reads $ITERCAST_DATA or ../shared/data
    python validation/host_overheads.py --write-defaults itercast/costs/host_overheads.json

Each step is replayed with its host chains (gaps between runtime calls, and the calls) priced by a
T1–T5 model instead of their measurement; GPU ops keep their measured durations, so the error is
the host model's. The model is fitted on
- "held-out": the other steps of the same trace (the 8-rank DLRM trace has one step per rank: the
  other 7 ranks, and only the held-out rank's host is modelled);
- "shared": the other traces only (the paper's shared overheads across workloads), measured to price
  another workload (measure(…, other_workloads=True): the reference's T1, typical operators).
"replay" keeps the measured host (the graph's own error); "no host" sets every modelled gap and call
to zero, to show how much of each step the host is. Lin et al. report 7.96% (own overheads) and
+2.19% with shared overheads for whole-iteration prediction, where kernels are modelled too.
--write-defaults FILE writes T1–T5 measured on all 8 ranks of the PARAM DLRM trace (TorchRec on
8 × V100) as a calibration document: the defaults of model-built DLRM steps (workloads/dlrm/host.py),
which price other jobs, so measured to price another workload (measure(…, other_workloads=True): T1
from gaps under 200 µs without Tukey's outliers; an operator that launches nothing at its category's
median, else T1 alone: the pooled no-call time is 0), without per-operator figures (another job's
operators are not these).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.costs.fitting import geomean_abs_err
from itercast.data_paths import shared_data_dir
from itercast.profile.calibrate import host_overheads_only
from itercast.replay import replay_graph
from itercast.traces.host_overheads import KINDS, HostOverheads, measure
from itercast.traces.kineto import RankTrace, read_traces
from itercast.traces.replay_graph import ReplayGraph, build_replay_graph
from itercast.traces.whatif import apply_host_overheads
from itercast.workloads.dlrm.host import LAUNCH
from validation.replay import extract


def step_ms(traces: list[RankTrace], rg: ReplayGraph, model: HostOverheads | None, rank: int, step: int) -> float:
    graph = rg if model is None else apply_host_overheads(rg, traces, model, {rank})[0]
    return next(s.replayed_s for s in replay_graph(traces, graph).steps if (s.rank, s.step) == (rank, step)) * 1e3


PARAM_DLRM = "param_dlrm_kineto_8rank_v100.tar.gz"


def write_defaults(dlrm: list[RankTrace], path: Path) -> None:
    """T1–T5 over every rank of the PARAM DLRM trace measured to price another workload, pooled and
    by category only, as a calibration document."""
    m = measure(dlrm, other_workloads=True)
    pooled = replace(m, t4_us={k: round(v, 3) for k, v in m.t4_us.items()}, per_op={}, calls_per_op={})
    doc = host_overheads_only(pooled) | {
        "source": f"PARAM DLRM, TorchRec on 8 x V100 (../shared/data/traces/{PARAM_DLRM}, all ranks), measured to "
        "price another workload (T1 from gaps under 200 us without Tukey's outliers; operators that launch "
        "nothing at their category's median, else T1 alone): "
        f"python validation/host_overheads.py --write-defaults {path}",
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(
        f"wrote {path}: T1 {m.t1_us:.2f} us, pooled {m.pooled}, no-call by category {m.no_call_by_category}, "
        f"{LAUNCH} {m.t4_us.get(LAUNCH, 0.0):.2f} us"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-defaults", type=Path, metavar="FILE", help="write the PARAM DLRM T1-T5 and stop")
    args = ap.parse_args()
    data = shared_data_dir()
    if data is None:
        print("no shared data (set ITERCAST_DATA or place ../shared/data beside the repo): nothing to validate")
        return
    with tempfile.TemporaryDirectory() as tmp:
        dlrm = read_traces([extract(data / "traces" / PARAM_DLRM, Path(tmp))])
    if args.write_defaults is not None:
        write_defaults(dlrm, args.write_defaults)
        return
    cases = {PARAM_DLRM.removesuffix(".tar.gz"): dlrm}
    cases |= {p.name.removesuffix(".json.gz"): read_traces([p]) for p in sorted((data / "traces").glob("*.json.gz"))}
    calls = {name for traces in cases.values() for name in measure(traces).t4_us}
    zero = HostOverheads(0.0, dict.fromkeys(calls, 0.0), {}, dict.fromkeys(KINDS, 0.0))
    print(
        f"{'trace':30} {'rank':>4} {'step':>5} {'measured':>9} {'replay':>8} {'held-out':>9} {'error':>7} "
        f"{'shared':>8} {'error':>7} {'no host':>8}  (ms)"
    )
    measured_ms: list[float] = []
    predicted_ms: dict[str, list[float]] = {"held-out": [], "shared": []}
    for name, traces in cases.items():
        rg = build_replay_graph(traces)
        shared = measure([t for other, ts in cases.items() if other != name for t in ts], other_workloads=True)
        numbers = sorted({s.step for s in rg.steps})
        for mark in rg.steps:
            if len(traces) > 1:
                own = measure([t for t in traces if t.rank != mark.rank])
            else:
                own = measure(traces, set(numbers) - {mark.step})
            measured = mark.measured_s * 1e3
            held = step_ms(traces, rg, own, mark.rank, mark.step)
            sh = step_ms(traces, rg, shared, mark.rank, mark.step)
            measured_ms.append(measured)
            predicted_ms["held-out"].append(held)
            predicted_ms["shared"].append(sh)
            print(
                f"{name[:30]:30} {mark.rank:4d} {mark.step:5d} {measured:9.2f} "
                f"{step_ms(traces, rg, None, mark.rank, mark.step):8.2f} {held:9.2f} {held / measured - 1:+7.1%} "
                f"{sh:8.2f} {sh / measured - 1:+7.1%} {step_ms(traces, rg, zero, mark.rank, mark.step):8.2f}"
            )
    meas = np.array(measured_ms)
    for kind, pred in predicted_ms.items():
        a = np.abs(np.array(pred) / meas - 1)
        print(
            f"{kind:9} steps {a.size}  geomean |error| {geomean_abs_err(np.array(pred), meas):.2%}  "
            f"mean {a.mean():.2%}  max {a.max():.2%}"
        )


if __name__ == "__main__":
    main()
