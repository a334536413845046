"""A corpus of hostile inputs, generated (no large files in the repository): each case is a command
line and the files it reads, and what its one-line error must say. tests/test_hostile_inputs.py runs
every case through the CLI; `python tests/hostile_inputs.py DIR` writes the files to look at.

Sizes stay small on disk (a few KB, or a gzip of a few KB) while what they would cost a naive
reader is huge: deep nesting, a gigantic string, a billion-laughs YAML.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Case:
    name: str
    files: dict[str, bytes]  # file name -> content, written under a temporary directory
    args: list[str]  # the command line; "{dir}" stands for that directory
    message: str  # a fragment of the expected error line


def _kineto(events: object, extra: str = "") -> bytes:
    return ('{"schemaVersion": 1, ' + extra + '"traceEvents": ' + json.dumps(events) + "}").encode()


def _kernel(**fields: object) -> dict[str, object]:
    return {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 10, "dur": 5, **fields}


def _step(n: int, ts: float) -> dict[str, object]:
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1, "ts": ts, "dur": 50}


def _gzip_of_one_long_string(nbytes: int) -> bytes:
    """A .gz whose text is one JSON string of `nbytes` (compresses ~1000×)."""
    head, tail = b'{"traceEvents": [{"name": "', b'"}]}'
    return gzip.compress(head + b"a" * nbytes + tail, compresslevel=9)


LAUGHS = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]"
        for i in range(8)
    ]
    + ["model: *i"]
).encode()


def cases() -> list[Case]:
    replay: Callable[[str, bytes, str], Case] = lambda name, data, msg: Case(  # noqa: E731
        name, {"t.json": data}, ["replay", "{dir}/t.json"], msg
    )
    predict = ["predict", "--model", "gpt3-1.3b", "--system", "dgx-h100", "--set"]
    return [
        # traces
        replay("trace nested 40,000 deep", b'{"traceEvents": ' + b"[" * 40_000 + b"]" * 40_000 + b"}", "nested deeper"),
        Case(
            "trace: one 64 MiB string in 70 KB of gzip",
            {"t.json.gz": _gzip_of_one_long_string(64 << 20)},
            ["replay", "{dir}/t.json.gz"],
            "a string longer than",
        ),
        replay("trace without ts", _kineto([{k: v for k, v in _kernel().items() if k != "ts"}]), "missing field `ts`"),
        replay("trace with a string ts", _kineto([_kernel(ts="soon")]), "field `ts`: expected a number"),
        replay("trace with a negative duration", _kineto([_kernel(dur=-3)]), "expected a duration ≥ 0"),
        replay("trace at ts 1e300", _kineto([_kernel(ts=1e300)]), "expected a finite number of µs"),
        replay("trace with an event that is a list", _kineto([[1, 2]]), "expected an object"),
        replay("trace with empty traceEvents", _kineto([]), "nothing to replay"),
        replay("trace whose traceEvents is an object", _kineto({"a": 1}), "nothing to replay"),
        replay("not a trace", b'{"hello": "world"}', "not a Kineto trace"),
        replay("truncated trace", _kineto([_kernel()])[:-20], "malformed or truncated"),
        replay("trace that is not UTF-8", b'{"traceEvents": [{"name": "\xff\xfe"}]}', "malformed or truncated"),
        Case(
            "traces of two runs",
            {"a.json": _kineto([_kernel(ts=10)]), "b.json": _kineto([_kernel(ts=10_000_000)])},
            ["replay", "{dir}/a.json", "{dir}/b.json"],
            "look like different runs",
        ),
        Case(
            "traces of two world sizes",
            {
                "a.json": _kineto([_kernel()], '"distributedInfo": {"rank": 0, "world_size": 2}, '),
                "b.json": _kineto([_kernel()], '"distributedInfo": {"rank": 1, "world_size": 4}, '),
            },
            ["replay", "{dir}/a.json", "{dir}/b.json"],
            "different world sizes",
        ),
        replay(
            "one step marked twice at different times",
            _kineto([_kernel(), _step(5, 0), _step(5, 100)]),
            "ProfilerStep#5 is marked twice",
        ),
        Case(
            "variability over ranks of one step each",
            {"a.json": _kineto([_kernel(), _step(1, 0)]), "b.json": _kineto([_kernel(), _step(1, 0)])},
            ["variability", "--trace", "{dir}/a.json", "--trace", "{dir}/b.json"],
            "ranks are not steps",
        ),
        # job files and options
        Case("billion laughs", {"job.yaml": LAUGHS}, ["predict", "{dir}/job.yaml"], "aliases"),
        Case(
            "job nested deep",
            {"job.yaml": b"model: " + b"[" * 5000 + b"]" * 5000},
            ["predict", "{dir}/job.yaml"],
            "nested",
        ),
        Case("job not UTF-8", {"job.yaml": b"model: \xff\xfe"}, ["predict", "{dir}/job.yaml"], "UTF-8"),
        Case("num_layers 1e7", {}, [*predict, "model.num_layers=10000000"], "less than or equal to 100000"),
        Case("num_nodes 10^30", {}, [*predict, "system.num_nodes=1000000000000000000000000000000"], "less than"),
        Case("num_layers true", {}, [*predict, "model.num_layers=true"], "valid integer"),
        Case("inf in a job", {}, [*predict, "system.gpu.hbm_bytes=.inf"], "finite"),
        Case("NaN option", {}, ["variability", "--example", "--comm-cv", "nan"], "finite"),
        Case("zero steps", {}, ["variability", "--example", "--steps", "0"], "greater than or equal to 1"),
        Case("a billion samples", {}, ["variability", "--example", "--samples", "1000000000"], "10000000"),
        Case("deadline without steps", {}, ["variability", "--example", "--deadline-hours", "5"], "needs --steps"),
        Case(
            "output onto its input",
            {"job.yaml": b"model: gpt3-1.3b\nsystem: dgx-h100\n"},
            ["predict", "{dir}/job.yaml", "--trace", "{dir}/job.yaml"],
            "is an input",
        ),
        Case(
            "output into a missing directory",
            {},
            ["predict", "--example", "--trace", "{dir}/no/such/t.json"],
            "directory",
        ),
        Case(
            "experts not divisible by EP",
            {},
            ["predict", "--model", "mixtral-8x7b", "--system", "dgx-h100", "--set", "plan.expert_parallel=3"],
            "not divisible by plan.expert_parallel(3)",
        ),
        Case(
            "top-k above the experts",
            {},
            ["predict", "--model", "mixtral-8x7b", "--system", "dgx-h100", "--set", "model.moe_top_k=9"],
            "moe_top_k(9) > model.num_experts(8)",
        ),
        Case(
            "report of a non-result",
            {"r.json": b"[1, 2]"},
            ["report", "--result", "{dir}/r.json", "-o", "{dir}/r.html"],
            "expected the JSON of",
        ),
        Case(
            "a sharding naming a rank that does not exist",
            {
                "s.yaml": b"t0: {strategy: table_wise, ranks: [9]}\nt1: {strategy: table_wise, ranks: [0]}\n"
                b"t2: {strategy: table_wise, ranks: [0]}\nt3: {strategy: table_wise, ranks: [0]}\n"
            },
            ["shard", "--model", "dlrm-small", "--sharding", "{dir}/s.yaml"],
            "ranks [9] do not exist",
        ),
        Case(
            "a table larger than every GPU together",
            {
                "m.yaml": b"dense_features: 4\nbottom_mlp: [128]\ntop_mlp: [1]\n"
                b"tables: [{name: huge, num_rows: 10000000000, embedding_dim: 128, pooling_factor: 1}]\n"
            },
            ["shard", "--model", "{dir}/m.yaml"],
            "no sharding fits",
        ),
        Case("profile on a missing GPU", {}, ["profile", "run", "--device", "cuda", "--db", "{dir}/p.db"], "cuda"),
        # found by a new-user check (session 20): each a traceback, a hang or a number before
        Case(
            "--set into a value",
            {},
            ["predict", "--example", "--set", "plan.tensor_parallel.x=2"],
            "`plan.tensor_parallel` is a value (8)",
        ),
        Case(
            "a key given twice in a job",
            {"j.yaml": b"model: gpt3-1.3b\nplan: {tensor_parallel: 1, tensor_parallel: 2}\nsystem: dgx-h100\n"},
            ["predict", "{dir}/j.yaml"],
            "line 2: key `tensor_parallel` given twice",
        ),
        Case(
            "an execution trace whose nodes are numbers",
            {"et.json": b'{"schema": "1.0.1", "nodes": [1, 2, 3]}'},
            ["predict", "--et", "{dir}/et.json", "--system", "dgx-h100"],
            "a node is int",
        ),
        Case(
            "an execution trace node whose inputs are a string",
            {"et.json": b'{"schema": "1.0.1", "nodes": [{"id": 1, "name": "aten::mm", "inputs": "oops"}]}'},
            ["predict", "--et", "{dir}/et.json", "--system", "dgx-h100"],
            "inputs and outputs: expected two lists or two objects",
        ),
        replay(
            "trace whose rank is a word",
            _kineto([_kernel()], '"distributedInfo": {"rank": "one", "world_size": 2}, '),
            "distributedInfo.rank: expected an integer of at least 0; got 'one'",
        ),
        replay(
            "trace of rank 5 in a world of 2",
            _kineto([_kernel()], '"distributedInfo": {"rank": 5, "world_size": 2}, '),
            "distributedInfo.rank: expected below its world_size 2; got 5",
        ),
        replay(
            "trace of a world of 0",
            _kineto([_kernel()], '"distributedInfo": {"rank": 0, "world_size": 0}, '),
            "distributedInfo.world_size: expected an integer of at least 1; got 0",
        ),
        Case(
            "an execution trace whose GEMM has a dimension in words",
            {
                "et.json": b'{"schema": "1.0.1", "nodes": [{"id": 1, "name": "r", "inputs": [], "outputs": []}, '
                b'{"id": 2, "name": "aten::mm", "inputs": [1, 2], "input_shapes": [[4, "8"], [8, 2]], "outputs": []}]}'
            },
            ["predict", "--et", "{dir}/et.json", "--system", "dgx-h100"],
            "node 1: expected fields id, name and inputs/outputs (input shapes: expected per argument a list of "
            "non-negative integer dimensions",
        ),
        Case(
            "an execution trace whose GEMM has a negative dimension",
            {
                "et.json": b'{"schema": "1.0.1", "nodes": [{"id": 1, "name": "r", "inputs": [], "outputs": []}, '
                b'{"id": 2, "name": "aten::mm", "inputs": [1, 2], "input_shapes": [[4, -8], [8, 2]], "outputs": []}]}'
            },
            ["predict", "--et", "{dir}/et.json", "--system", "dgx-h100"],
            "got '[[4, -8], [8, 2]]'",
        ),
        Case(
            "an execution trace whose operator name is a number",
            {"et.json": b'{"schema": "1.0.1", "nodes": [{"id": 1, "name": 5, "inputs": [], "outputs": []}]}'},
            ["predict", "--et", "{dir}/et.json", "--system", "dgx-h100"],
            "node 0: expected fields id, name and inputs/outputs (name: expected a string; got 5)",
        ),
        Case(
            "an execution trace without nodes",
            {"et.json": b'{"schema": "1.0.1", "nodes": []}'},
            ["predict", "--et", "{dir}/et.json", "--system", "dgx-h100"],
            "`nodes`: expected the operators of a traced step",
        ),
        Case(
            "a calibration nested 100,000 deep",
            {"c.json": b"[" * 100_000 + b"]" * 100_000},
            [*predict[:-1], "--calibration", "{dir}/c.json"],
            "nested too deeply",
        ),
        Case(
            "a saved result nested 100,000 deep",
            {"r.json": b"[" * 100_000 + b"]" * 100_000},
            ["report", "--result", "{dir}/r.json", "-o", "{dir}/r.html"],
            "nested too deeply",
        ),
        Case(
            "a calibration curve that is a list",
            {"c.json": _calibration('"gemm": {"tf32": [1, 2]}')},
            [*predict[:-1], "--calibration", "{dir}/c.json"],
            "`gemm.tf32`: expected a curve",
        ),
        Case(
            "a calibration curve of efficiency 0",
            {"c.json": _calibration('"gemm": {"bf16": {"alpha_s": 0, "e_max": 0, "log_half": 1, "gamma": 0}}')},
            [*predict[:-1], "--calibration", "{dir}/c.json"],
            "`gemm.bf16.e_max`: expected a curve's e_max, 0.001 ≤ e_max ≤ 4; got 0",
        ),
        Case(
            "a calibration curve of efficiency 50",
            {"c.json": _calibration('"gemm": {"bf16": {"alpha_s": 0, "e_max": 50, "log_half": 1, "gamma": 0}}')},
            [*predict[:-1], "--calibration", "{dir}/c.json"],
            "0.001 ≤ e_max ≤ 4; got 50",
        ),
        Case(
            "a calibration curve whose half-size overflows the step to infinity",
            {"c.json": _calibration('"gemm": {"bf16": {"alpha_s": 0, "e_max": 1, "log_half": 1000, "gamma": 1}}')},
            [*predict[:-1], "--calibration", "{dir}/c.json"],
            "`gemm.bf16.log_half`: expected a curve's log_half, -50 ≤ log_half ≤ 50; got 1000",
        ),
        Case(
            "a collective's latency of 1e300 s",
            {
                "c.json": _calibration(
                    '"collectives": {"intra_node": {"all_reduce": {"alpha0_s": 1e300, "e_max": 1, '
                    '"log_half": 14, "gamma": 1}}}'
                )
            },
            [*predict[:-1], "--calibration", "{dir}/c.json"],
            "`collectives.intra_node.all_reduce.alpha0_s`: expected a curve's alpha0_s, 0 ≤ alpha0_s ≤ 1; got 1e+300",
        ),
        Case(
            "a calibration curve of efficiency 1e-300",
            {"c.json": _calibration('"memory": {"elementwise": {"e_max": 1e-300, "log_half": 14, "gamma": 1}}')},
            [*predict[:-1], "--calibration", "{dir}/c.json"],
            "0.001 ≤ e_max ≤ 4; got 1e-300",
        ),
        Case(
            "a sharding with a Python tag",
            {"s.yaml": b"t1: !!python/object/apply:os.system ['true']\n"},
            ["shard", "--model", "dlrm-small", "--sharding", "{dir}/s.yaml"],
            "malformed YAML",
        ),
        Case(
            "a DLRM model file that is no YAML",
            {"m.yaml": b"\tdense_features: 4\n"},
            ["shard", "--model", "{dir}/m.yaml"],
            "malformed YAML",
        ),
        Case(
            "a binary file imported as a table",
            {"t.csv": bytes(range(128, 256))},
            ["profile", "import", "xla-matmul", "{dir}/t.csv", "--db", "{dir}/p.db"],
            "not UTF-8 text",
        ),
        Case(
            "an nccl-tests time of 1e300 µs (it once calibrated a 1e6 s step)",
            {
                "n.txt": b"#  Rank  0 Group  0 Pid 1 on h device  0 [0x18] NVIDIA H100 80GB HBM3\n"
                b"   134217728   33554432  float  sum  -1   1e300  228.89  400.55  0   586.1  229.01  400.77  0\n"
            },
            ["profile", "import", "nccl-log", "{dir}/n.txt", "--db", "{dir}/p.db"],
            "n.txt: measurement all_reduce size 134217728.0: expected 0 < time_s ≤ 3600 s",
        ),
        Case(
            "calibrate of a missing database, without --out (it once said 'nothing to do')",
            {},
            ["calibrate", "{dir}/none.db", "--system", "dgx-h100"],
            "none.db: no such profiling database",
        ),
        Case(
            "a table of measurements given to calibrate",
            {"t.csv": b"op,time_s\ndot,0.1\n"},
            ["calibrate", "{dir}/t.csv", "--system", "dgx-h100", "--out", "{dir}/c.json"],
            "becomes one with `itercast profile import KIND FILE --db DB`",
        ),
        Case(
            "a truncated JSON imported as a table",
            {"t.json": b"[1,2"},
            ["profile", "import", "xla-matmul", "{dir}/t.json", "--db", "{dir}/p.db"],
            "found no rows",
        ),
        Case(
            "a DLRM search result without its plans' memory given to report",
            {"r.json": b'{"plans": [{"tables": [], "step_time_s": 0.001}]}'},
            ["report", "--result", "{dir}/r.json", "-o", "{dir}/r.html"],
            "plans[0]: missing field memory_per_gpu_bytes, fits",
        ),
        Case(
            "--json beside --format csv",
            {},
            ["search", *predict[1:], "plan.global_batch_size=8", "--json", "--format", "csv"],
            "--json and --format csv",
        ),
        Case(
            "variability of a trace with a job's options",
            {"t.json": _kineto([_kernel(), _step(1, 0), _step(2, 100)])},
            ["variability", "--trace", "{dir}/t.json", "--plot", "{dir}/v.png"],
            "--plot: for a job's",
        ),
        Case("--kineto without --et", {}, ["predict", "--example", "--kineto", "{dir}/k.json"], "--kineto: for an"),
        Case(
            "a search over 100,000 node counts",
            {},
            ["search", *predict[1:], "plan.global_batch_size=8", "--num-nodes-range", "1:100000"],
            "100000 node counts; expected at most 1024",
        ),
        *(
            Case(
                f"search: --set {field} beside {option}",
                {},
                ["search", *predict[1:], "plan.global_batch_size=8", "--set", f"{field}=2", option, "4"],
                f"--set {field} and {option}: give one",
            )
            for field, option in (
                ("plan.global_batch_size", "--global-batch-sizes"),
                ("plan.micro_batch_size", "--micro-batch-sizes"),
                ("system.num_nodes", "--num-nodes-range"),
            )
        ),
        Case(
            "variability: --slow-factor without --slow-gpus",
            {},
            ["variability", *predict[1:3], "--samples", "100", "--slow-factor", "2"],
            "--slow-factor: the slow GPUs' speed, which needs --slow-gpus",
        ),
        Case(
            "variability: failures without --steps",
            {},
            ["variability", *predict[1:3], "--samples", "100", "--mtbf-hours", "10", "--restart-s", "60"],
            "--mtbf-hours, --restart-s: for time to train, which needs --steps",
        ),
        Case(
            "variability --trace with a job's variability model",
            {},
            ["variability", "--trace", "{dir}/t.json", "--compute-cv", "0.5", "--deadline-hours", "3"],
            "--deadline-hours, --compute-cv: for a job's spread",
        ),
        Case(
            "a DLRM search with its sharding fixed",
            {},
            ["search", "--model", "dlrm-small", "--system", "dgx-h100", "--set", "plan.sharding={}"],
            "a DLRM search searches the sharding",
        ),
        Case(
            "report --result with --set",
            {"r.json": b"{}"},
            ["report", "--result", "{dir}/r.json", "--set", "plan.tensor_parallel=4", "-o", "{dir}/r.html"],
            "give a job (with its --set and --calibration) or --result, not both",
        ),
        Case(
            "compare two saved results with --set",
            {"a.json": b"{}", "b.json": b"{}"},
            ["compare", "{dir}/a.json", "{dir}/b.json", "--set", "plan.tensor_parallel=4"],
            "--set applies to two jobs",
        ),
        Case(
            "a calibration with a field nothing reads",
            {"c.json": _calibration('"foo": 1')},
            [*predict[:-1], "--calibration", "{dir}/c.json"],
            "unknown field foo: a calibration holds format, version, system, device, gemm,",
        ),
        Case(
            "a calibration's GEMM curve of a dtype no plan prices on",
            {"c.json": _calibration('"gemm": {"int4": {"alpha_s": 0, "e_max": 1, "log_half": 20, "gamma": 1}}')},
            [*predict[:-1], "--calibration", "{dir}/c.json"],
            "`gemm.int4`: no such curve; itercast reads gemm curves bf16, tf32, fp8",
        ),
        Case(
            "a DLRM on 100,000 GPUs",
            {},
            ["predict", "--model", "dlrm-small", "--system", "dgx-h100", "--set", "system.num_nodes=12500"],
            "system: a DLRM step is simulated rank by rank, on at most 16,384 GPUs; got 100,000 (12,500 nodes)",
        ),
        Case(
            "a report written over a job file",
            {"job.yaml": b"model: gpt3-1.3b\n"},
            ["report", "--example", "--samples", "100", "-o", "{dir}/job.yaml"],
            "job.yaml: expected a file name ending in .html or .htm; got .yaml",
        ),
        Case(
            "a PNG plot named .txt",
            {},
            ["variability", "--example", "--samples", "200", "--plot", "{dir}/cdf.txt"],
            "cdf.txt: expected a file name ending in .png; got .txt",
        ),
        Case(
            "an index sample that is a pickled object array",
            {"a.npy": _pickled_npy()},
            ["shard", "--model", "dlrm-small", "--indices", "t0={dir}/a.npy"],
            "a pickled object array, which itercast never loads: np.save an integer array instead",
        ),
        Case(
            "one table's index sample given twice",
            {"a.txt": b"1 2 3\n"},
            ["shard", "--model", "dlrm-small", "--indices", "t0={dir}/a.txt", "--indices", "t0={dir}/a.txt"],
            "table 't0' is given a sample twice; give it one",
        ),
        # options of another mode, accepted and ignored until a user probe (session 61) found them
        Case(
            "predict --device-id without --et", {}, ["predict", "--example", "--device-id", "3"], "--device-id: for an"
        ),
        Case(
            "predict --index-distribution without --et",
            {},
            ["predict", "--example", "--index-distribution", "zipf:1.5"],
            "--index-distribution: for an execution trace (--et)",
        ),
        Case(
            "search --batches of a transformer",
            {},
            ["search", "--example", "--batches", "1024,2048"],
            "--batches: a DLRM search's samples per GPU; a transformer's global batches are --global-batch-sizes",
        ),
        Case(
            "variability --slow-factor at its default without --slow-gpus",
            {},
            ["variability", "--example", "--slow-factor", "1.5"],
            "--slow-factor: the slow GPUs' speed, which needs --slow-gpus",
        ),
        Case(
            "report --result with a deadline",
            {"r.json": b"{}"},
            ["report", "--result", "{dir}/r.json", "--within-s", "10", "--seed", "5", "-o", "{dir}/r.html"],
            "--within-s, --seed: a job's step-time CDF; a saved result is reported as it was saved",
        ),
        Case(
            "slice --layer-times on device groups",
            {"l.csv": b"layer,time_s\nl1,0.01\nl2,0.01\n"},
            ["slice", "--layer-times", "{dir}/l.csv", "--stages", "2", "--device-groups", "dgx-a100:1"],
            "--device-groups is for a job; --layer-times are one device's measured times",
        ),
        Case(
            "slice of a job with --send-gbps",
            {},
            ["slice", "--example", "--send-gbps", "1"],
            "--send-gbps is for --layer-times; a job's sends are priced on its system's links",
        ),
        Case("an empty job file", {"e.yaml": b"\n"}, ["predict", "{dir}/e.yaml"], "e.yaml: an empty file; expected"),
        Case(  # user probe 11: the file that names an unknown preset is named
            "a job file naming an unknown model preset",
            {"j.yaml": b"model: llama3-70B\nsystem: dgx-h100\nplan: {}\n"},
            ["predict", "{dir}/j.yaml"],
            "j.yaml: model: unknown preset `llama3-70B`",
        ),
        Case(
            "a directory given as a job file",
            {},
            ["predict", "{dir}"],
            ": a directory; expected a job file",
        ),
    ]


def _pickled_npy() -> bytes:
    """A .npy of one Python object (None): numpy pickles object arrays, and loading one runs the pickle."""
    import io

    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.array([None], dtype=object), allow_pickle=True)
    return buf.getvalue()


def _calibration(curves: str) -> bytes:
    """A calibration file of this itercast's format and version with `curves` as its fields."""
    return ('{"format": "itercast-calibration", "version": "3", ' + curves + "}").encode()


def write(directory: Path) -> None:
    """Write every case's files under DIRECTORY/<case number>/ (to inspect them by hand)."""
    for i, case in enumerate(cases()):
        target = directory / f"{i:02d}"
        target.mkdir(parents=True, exist_ok=True)
        for name, data in case.files.items():
            (target / name).write_bytes(data)
        print(f"{target}: {case.name}: itercast {' '.join(case.args)}")


if __name__ == "__main__":
    write(Path(sys.argv[1]))
