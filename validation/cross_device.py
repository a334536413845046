"""One trace priced on another device, checked against that device's measurement (issue 14's
what-if against a measured change; the reference performance model's own workflow).

    python validation/cross_device.py

The execution traces were recorded on an H100 (data/measured/h100_traces, tools/measure_gpu.sh);
each is priced with this CPU's operator models (data/measured/cpu_profile.db, `predict --et`'s
path) and compared with the same model and batch measured on this CPU (data/measured/e2e_cpu.csv,
validation/e2e_local.py --measure). Nothing here was fitted to the iteration times. Fused attention
and batch norm run under backend-specific operator names; op_model.OTHER_BACKEND maps them.
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from itercast.costs.op_model import OperatorCostModel, fit_operator_models
from itercast.profile.db import ProfileDB
from itercast.traces.execution_trace import read_execution_trace
from itercast.traces.iteration_model import predict_iteration

MEASURED = Path(__file__).resolve().parents[1] / "data" / "measured"


def main() -> None:
    with (MEASURED / "e2e_cpu.csv").open() as fh:
        cpu = {(r["workload"], int(r["batch"])): float(r["median_s"]) for r in csv.DictReader(fh)}
    db = ProfileDB(MEASURED / "cpu_profile.db", readonly=True)
    device = db.devices()[-1][0]
    model = OperatorCostModel(fit_operator_models(list(db.measurements(device_id=device))))
    print(f"{'trace recorded on H100':24} {'CPU measured ms':>16} {'priced on CPU ms':>17} {'error':>8}")
    errors = []
    for path in sorted((MEASURED / "h100_traces").glob("*.et.json.gz")):
        name, batch = path.name.removesuffix(".et.json.gz").rsplit("_", 1)
        measured = cpu.get((name, int(batch)))
        if measured is None:
            continue  # this batch was not measured on the CPU
        predicted = predict_iteration(read_execution_trace(path), model).total_s
        err = predicted / measured - 1
        errors.append(err)
        print(f"{path.name:24} {measured * 1e3:16.2f} {predicted * 1e3:17.2f} {err:+8.1%}")
    geo = math.exp(sum(math.log(abs(e)) for e in errors) / len(errors))
    mean = sum(abs(e) for e in errors) / len(errors)
    print(f"{len(errors)} cases: geomean |error| {geo:.1%}, mean {mean:.1%}, worst {max(errors, key=abs):+.1%}")


if __name__ == "__main__":
    main()
