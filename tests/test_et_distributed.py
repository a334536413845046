"""Execution traces of a distributed TorchRec / FBGEMM step: TBE lookups with their fused optimizer,
c10d collectives matched across ranks, host overheads, index order (traces/et_step.py, et_pricing.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from itercast.cli import app
from itercast.costs.dist_ops import DistOpError, collective_call, tbe_call
from itercast.costs.index_stats import IndexStats
from itercast.hardware.topology import GroupPlacement
from itercast.traces.et_pricing import ETPricer
from itercast.traces.et_step import predict_step
from itercast.traces.execution_trace import read_execution_trace
from itercast.traces.host_overheads import HostOverheads

ROOT = "[pytorch|profiler|execution_graph|thread]"
TBE = "fbgemm::split_embedding_codegen_lookup_adagrad_function"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"


def t(tensor_id: int, storage: int, shape: list[int], dtype: str = "float") -> tuple[Any, Any, str]:
    """A tensor argument: (value, shape, type) as an execution trace records it."""
    numel = int(np.prod(shape)) if shape else 1
    return [tensor_id, storage, 0, numel, 4, "cuda:0"], shape, f"Tensor({dtype})"


def node(node_id: int, name: str, args: list[tuple[Any, Any, str]], outs: list[tuple[Any, Any, str]] = ()) -> dict:
    return {
        "name": name,
        "id": node_id,
        "rf_id": node_id,
        "parent": 1,
        "tid": 1,
        "inputs": [a[0] for a in args],
        "input_shapes": [a[1] for a in args],
        "input_types": [a[2] for a in args],
        "outputs": [a[0] for a in outs],
        "output_shapes": [a[1] for a in outs],
        "output_types": [a[2] for a in outs],
    }


def tbe_args(indices: int = 12, offsets: int = 7, total_d: Any = 8, weights: int = 800) -> list[tuple[Any, Any, str]]:
    """FBGEMM's split lookup arguments up to pooling_mode: 2 tables (weights_offsets of 2), 800
    weights, total_D 8 (two tables of 4 columns, 100 rows each), `indices` and `offsets` (2 × 3 bags + 1)."""
    return [
        t(100, 100, [0]),
        t(101, 101, [weights]),
        t(102, 102, [0]),
        t(103, 103, [0, 0]),
        t(104, 104, [2], "int"),
        t(105, 105, [2], "long int"),
        t(106, 106, [3], "int"),
        (total_d, [], "Int"),
        (4, [], "Int"),
        t(107, 107, [3], "long int"),
        (26, [], "Int"),
        t(108, 108, [indices], "long int"),
        t(109, 109, [offsets], "long int"),
        (0, [], "Int"),
    ]


ALLREDUCE = [([[20, 20, 0, 1000, 4, "cuda:0"]], [[1000]], "GenericList[Tensor(float)]"), ("<Object>", [], "Object")]


def rank_trace(path: Path, with_mm: bool, splits: int = 0, backward: bool = False, tbe: list | None = None) -> Path:
    """mm (rank 0 only), a TBE lookup, an all-reduce of 1,000 floats, an add reading its output;
    `splits`: an even all-to-all over that many ranks; `backward`: the TBE's backward node."""
    nodes = [{"name": ROOT, "id": 1, "rf_id": 0, "parent": 1, "tid": 1, "inputs": [], "input_shapes": []}]
    if with_mm:
        nodes.append(node(2, "aten::mm", [t(10, 10, [8, 4]), t(11, 11, [4, 2])], [t(12, 12, [8, 2])]))
    nodes.append(node(3, TBE, tbe or tbe_args(), [t(13, 13, [3, 8])]))
    nodes.append(node(4, "c10d::allreduce_", ALLREDUCE))
    if splits:
        even = [4] * splits
        a2a = [t(30, 30, [4 * splits]), t(31, 31, [4 * splits]), ("<Object>", [], "Object")]
        a2a += [(even, [[]] * splits, "GenericList[Int]")] * 2
        nodes.append(node(6, "c10d::alltoall_base_", a2a))
    add_args = [t(21, 20, [1000]), t(22, 22, [1000]), (1, [], "Int")]
    nodes.append(node(5, "aten::add_", add_args, [t(21, 20, [1000])]))
    if backward:
        nodes.append(node(8, "torch::autograd::CppNode<SplitLookupFunction_adagrad_Op>", [t(50, 50, [3, 8])]))
    path.write_text(json.dumps({"schema": "1.0.1", "nodes": nodes}))
    return path


class LinearCosts:
    """A cost model of round numbers: 1 ns per byte moved or collected, 1 ps per FLOP, on a GPU of no
    family with a measured lookup model (so embedding lookups are priced as the bytes they move)."""

    system = SimpleNamespace(gpu=SimpleNamespace(name="round-numbers"))

    def memory_s(self, kind: str, nbytes: float) -> float:
        return nbytes * 1e-9

    def gemm_s(self, flops: float, te: bool = True) -> float:
        return flops * 1e-12

    def collective_s(self, kind: str, nbytes: float, group: GroupPlacement) -> float:
        return nbytes * 1e-9


#: T1 10 µs, T2 1, T3 2, T5 0, no call 3, T4 5 per launch
HOST = HostOverheads(10.0, {"cudaLaunchKernel": 5.0}, {}, {"t2_us": 1.0, "t3_us": 2.0, "t5_us": 0.0, "no_call_us": 3.0})


def test_tbe_call_reads_tables_widths_bags_and_indices_from_fbgemm_arguments():
    a = tbe_args()
    call = tbe_call(TBE, [x[1] for x in a], [x[2] for x in a], tuple(x[0] if x[2] == "Int" else None for x in a))
    # 2 tables (weights_offsets), total_D 8 → 4 columns each, 800 weights / 8 = 100 rows, (7 − 1) / 2 = 3 bags
    assert (call.optimizer, call.tables, call.dim, call.rows, call.bags, call.lookups) == ("adagrad", 2, 4, 100, 3, 12)


def test_one_tables_bags_are_its_offsets_less_the_closing_one():
    # FBGEMM's offsets hold each bag's start and one closing end: T × B + 1 of them. One table of
    # 4 columns (weights_offsets [0], total_D 4), 400 weights → 100 rows; 5 offsets → (5 − 1) / 1 = 4 bags
    a = tbe_args(indices=8, offsets=5, total_d=4, weights=400)
    a[5] = t(105, 105, [1], "long int")
    call = tbe_call(TBE, [x[1] for x in a], [x[2] for x in a], tuple(x[0] if x[2] == "Int" else None for x in a))
    assert (call.tables, call.dim, call.rows, call.bags, call.lookups) == (1, 4, 100, 4, 8)


def test_tbe_forward_and_fused_adagrad_backward_on_the_embedding_model():
    pricer = ETPricer(LinearCosts())  # type: ignore[arg-type]
    fwd_node = _tbe_node(tbe_args())
    bwd_node = _tbe_node([t(1, 1, [3, 8])], "torch::autograd::CppNode<SplitLookupFunction_adagrad_Op>")
    fwd, bwd = pricer.price(fwd_node, False), pricer.price(bwd_node, False)
    # per table: 6 lookups of 4 floats (96 B) read, 3 pooled bags of 4 floats (48 B) written
    assert fwd is not None and fwd.seconds == pytest.approx(2 * (96 + 48) * 1e-9)
    # backward: pooled gradients in, per-lookup gradients out, each distinct row (uniform draws: 100 rows,
    # 6 lookups → 100 (1 − 0.99⁶) rows) read and written with its Adagrad state (2 × (16 + 4) B)
    distinct = 100 * (1 - 0.99**6)
    assert bwd is not None and bwd.seconds == pytest.approx(2 * (48 + 96 + distinct * 40) * 1e-9)
    assert (fwd.family, bwd.family, fwd.model) == ("embedding:tbe_fwd", "embedding:tbe_bwd", "analytic:embedding")


def _tbe_node(args: list[tuple[Any, Any, str]], name: str = TBE) -> Any:
    from itercast.traces.execution_trace import _node

    return _node(node(3, name, args))


def test_index_order_sorted_and_shuffled_samples_price_apart():
    # the same multiset, 4 rows × 2 lookups; rows of 32 KiB, so the first break (64 KiB) is 2 rows
    shuffled, ordered = np.array([0, 1, 2, 3, 0, 1, 2, 3]), np.array([0, 0, 1, 1, 2, 2, 3, 3])
    a, b = IndexStats.from_sequence(shuffled, 8, 32768), IndexStats.from_sequence(ordered, 8, 32768)
    # one call of 8: 4 distinct rows either way; shuffled, each repeat has 3 other rows (96 KiB) since
    # its row's last lookup: 4 of 8 lookups beyond 64 KiB (an L1 of 64 KiB hits none of them)
    assert a.unique_fraction == b.unique_fraction == pytest.approx(4 / 8)
    assert a.reuse_beyond == pytest.approx((4 / 8, 0.0, 0.0)) and b.reuse_beyond == pytest.approx((0.0, 0.0, 0.0))
    hit_64k = [1 - s.unique_fraction - s.reuse_beyond[0] for s in (a, b)]
    assert hit_64k == pytest.approx([0.0, 0.5])
    # calls of 4 lookups: shuffled [0 1 2 3] has 4 distinct rows a call, sorted [0 0 1 1] two
    assert IndexStats.from_sequence(shuffled, 4, 16).unique_fraction == pytest.approx(1.0)
    assert IndexStats.from_sequence(ordered, 4, 16).unique_fraction == pytest.approx(0.5)


def test_uneven_alltoall_is_priced_for_its_busiest_direction():
    shapes = [[10], [6], [], [[], []], [[], []]]
    types = ["Tensor(float)", "Tensor(float)", "Object", "GenericList[Int]", "GenericList[Int]"]
    call = collective_call("c10d::alltoall_base_", shapes, types, [None, None, None, [2, 8], [1, 5]])
    # sends 1 + 5 rows of 4 B (24 B), receives 2 + 8 (40 B): the link's busier direction is 40 B
    assert call.send_bytes == (4, 20) and call.recv_bytes == (8, 32) and call.member_bytes == 40
    with pytest.raises(DistOpError, match="sum to"):
        collective_call("c10d::alltoall_base_", shapes, types, [None, None, None, [2, 8], [1, 1]])


def test_gathers_and_scatters_are_priced_on_their_full_buffer_not_a_shard():
    # 4 ranks, a 256-element bf16 shard each (512 B), the full buffer 4 × 512 = 2,048 B. c10d's schemas
    # (Ops.cpp): allgather_(Tensor[][] outputs, Tensor[] inputs), _allgather_base_(output, input),
    # reduce_scatter_(Tensor[] outputs, Tensor[][] inputs), _reduce_scatter_base_(output, input)
    shard, bf16 = [256], "Tensor(c10::BFloat16)"
    nested = "GenericList[GenericList[" + ",".join(["Tensor(c10::BFloat16)"] * 4) + "]]"
    flat = "GenericList[Tensor(c10::BFloat16)]"
    calls = {"c10d::allgather_": ([[shard] * 4], [shard]), "c10d::reduce_scatter_": ([shard], [[shard] * 4])}
    for name, (first, second) in calls.items():
        types = [nested, flat] if name == "c10d::allgather_" else [flat, nested]
        assert collective_call(name, [first, second, []], [*types, "Object"], []).nbytes == 2048
    full = [1024]
    assert collective_call("c10d::_allgather_base_", [full, shard, []], [bf16, bf16, "Object"], []).nbytes == 2048
    assert collective_call("c10d::_reduce_scatter_base_", [shard, full, []], [bf16, bf16, "Object"], []).nbytes == 2048


def test_two_ranks_meet_at_the_all_reduce_and_the_slowest_gates(tmp_path):
    ets = [read_execution_trace(rank_trace(tmp_path / f"r{r}.json", with_mm=r == 0)) for r in (0, 1)]
    steps = predict_step(ets, [ETPricer(LinearCosts()) for _ in ets], HOST, GroupPlacement(2, 1, 2))  # type: ignore[arg-type]
    # rank 0: mm (T1 10, T2 1, T4 5: launched at 16 µs, T3 → 18), TBE (launched at 34, host 36),
    #   all-reduce launched at 46 + 1 + 5 = 52, host 54; rank 1: TBE at 16 (host 18), all-reduce at 34, host 36.
    # Rendezvous: max(52, 34) = 52 µs; 4,000 B at 1 ns/B: ends at 56 µs on both.
    # The add reads the reduced storage: rank 0 launches it at 54 + 10 + 1 + 5 = 70 → runs 70-82 (12,000 B);
    # rank 1 at 36 + 16 = 52, waits for the all-reduce: 56-68.
    assert steps[0].iteration_s == pytest.approx(82e-6) and steps[1].iteration_s == pytest.approx(68e-6)
    assert steps[0].host_s == pytest.approx(72e-6) and steps[1].host_s == pytest.approx(54e-6)
    assert steps[0].seconds_by_family["collective:all_reduce"] == pytest.approx(4e-6)
    assert steps[0].seconds_by_family["gemm"] == pytest.approx(2 * 8 * 2 * 4 * 1e-12)


def run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["predict", *args])
    return res.exit_code, res.output


def test_cli_prices_every_rank_without_a_database_and_lists_unpriced_ops(tmp_path):
    for r in (0, 1):
        rank_trace(tmp_path / f"rank{r}.json", with_mm=r == 0)
    doc = json.loads((tmp_path / "rank1.json").read_text())
    doc["nodes"].append(node(7, "mylib::fused_thing", [t(40, 40, [64])]))
    (tmp_path / "rank1.json").write_text(json.dumps(doc))
    code, text = run("--et", str(tmp_path), "--system", "v100-p3.16xlarge", "--json")
    assert code == 0, text
    out = json.loads(text[text.index("{") :])
    assert len(out["ranks"]) == 2
    assert out["slowest_rank_iteration_s"] == max(r["iteration_s"] for r in out["ranks"])
    assert {"embedding:tbe_fwd", "collective:all_reduce", "gemm", "memory"} <= set(out["ranks"][0]["seconds_by_family"])
    assert [u["name"] for u in out["ranks"][1]["unpriced"]] == ["mylib::fused_thing"]
    assert "GPU time is unknown without --kineto" in text
    # its TBE lookups priced as streaming memory on a V100, with no lookup measured there: said, as shard says it
    assert "embedding lookups on V100-SXM2-16GB are priced as streaming memory traffic" in text
    # --gpu adds nothing to a --system step, which has its two clocks anyway: said, and the same price
    code, gpu_text = run("--et", str(tmp_path), "--system", "v100-p3.16xlarge", "--json", "--gpu")
    assert code == 0 and "--gpu changes nothing here" in gpu_text
    assert json.loads(gpu_text[gpu_text.index("{") :])["ranks"] == out["ranks"]


def test_an_operator_whose_own_kernel_goes_unpriced_is_listed(tmp_path):
    """aten::index launches its gather beside its children, which only copy the indices: the rule that a
    composite's children do its work leaves its kernel unpriced, so it is listed; an aten::mean that calls
    an inner aten::mean (the one that runs the reduction) is not, the inner one is."""
    rank_trace(tmp_path / "rank0.json", with_mm=False)
    doc = json.loads((tmp_path / "rank0.json").read_text())
    doc["nodes"] += [
        node(8, "aten::index", [t(50, 50, [16, 27, 27]), t(51, 51, [351], "long int")], [t(52, 52, [16, 351])]),
        {**node(9, "aten::copy_", [t(53, 53, [351], "long int"), t(51, 51, [351], "long int")]), "parent": 8},
        node(10, "aten::mean", [t(54, 54, [16, 8])], [t(55, 55, [16])]),
        {**node(11, "aten::mean", [t(54, 54, [16, 8])], [t(55, 55, [16])]), "parent": 10},
        {**node(12, "aten::as_strided", [t(55, 55, [16])], [t(55, 55, [16])]), "parent": 11},
    ]
    (tmp_path / "rank0.json").write_text(json.dumps(doc))
    code, text = run("--et", str(tmp_path / "rank0.json"), "--system", "v100-p3.16xlarge", "--json")
    assert code == 0, text
    out = json.loads(text[text.index("{") :])
    assert {u["name"]: u["calls"] for u in out["ranks"][0]["unpriced"]} == {"aten::index": 1, "aten::mean": 1}


def test_cli_index_sample_order_changes_the_lookup_price(tmp_path):
    # two tables of 10,000 rows, 30,000 lookups each; a sample of every row 6 times
    big = tbe_args(indices=60_000, weights=80_000)
    rank_trace(tmp_path / "r.json", with_mm=False, splits=2, backward=True, tbe=big)
    seconds = []
    for name, sample in (("sorted", np.repeat(np.arange(10_000), 6)), ("shuffled", np.tile(np.arange(10_000), 6))):
        (tmp_path / f"{name}.txt").write_text(" ".join(map(str, sample)))
        args = ("--et", str(tmp_path / "r.json"), "--system", "v100-p3.16xlarge", "--json")
        code, text = run(*args, "--indices", str(tmp_path / f"{name}.txt"))
        assert code == 0, text
        seconds.append(json.loads(text[text.index("{") :])["ranks"][0]["seconds_by_family"]["embedding:tbe_bwd"])
    assert seconds[0] < seconds[1]  # sorted: 5,000 distinct rows a call of 30,000 lookups, shuffled 10,000


def test_a_trace_of_another_rank_count_is_one_line(tmp_path):
    rank_trace(tmp_path / "a.json", with_mm=False, splits=2)
    rank_trace(tmp_path / "b.json", with_mm=False, splits=4)  # its all-to-all splits name 4 ranks
    code, text = run("--et", str(tmp_path / "a.json"), "--et", str(tmp_path / "b.json"), "--system", "v100-p3.16xlarge")
    assert code == 2 and "b.json: its all-to-all splits name 4 ranks; expected 2" in " ".join(text.split())


def test_a_malformed_fbgemm_argument_list_is_one_line(tmp_path):
    path = rank_trace(tmp_path / "r.json", with_mm=False)
    doc = json.loads(path.read_text())
    tbe = next(n for n in doc["nodes"] if n["name"] == TBE)
    tbe["inputs"][7] = "eight"  # total_D is not an int
    path.write_text(json.dumps(doc))
    code, text = run("--et", str(path), "--system", "v100-p3.16xlarge")
    assert code == 2 and "expected 1-D tensors" in text and "Traceback" not in text


@pytest.mark.skipif(not (SHARED / "param_dlrm_pytorch_et_8rank.tar.gz").is_file(), reason="shared traces absent")
def test_the_param_dlrm_step_is_priced_whole_on_every_rank(tmp_path):
    import tarfile

    with tarfile.open(SHARED / "param_dlrm_pytorch_et_8rank.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    code, text = run("--et", str(tmp_path / "dlrm_pytorch_et"), "--system", "v100-p3.16xlarge", "--json")
    assert code == 0, text
    out = json.loads(text[text.index("{") :])  # after the warnings naming the unpriced operators
    assert len(out["ranks"]) == 8
    # nothing unpriced but the operators whose own kernel the composite rule misses, said (et_step.OWN_KERNEL_OPS)
    own = {"aten::index", "aten::_index_put_impl_", "aten::sum", "aten::mean", "aten::arange"}
    assert all({u["name"] for u in r["unpriced"]} <= own for r in out["ranks"])
    assert {u["name"] for u in out["ranks"][0]["unpriced"]} == own
    calls = out["ranks"][0]["calls_by_model"]
    # one split TBE and one dense TBE, each forward and backward; 5 all-to-alls; 3 DDP bucket all-reduces
    assert calls["analytic:embedding"] == 4 and calls["collective:alltoall"] == 5
    assert calls["collective:all_reduce"] == 3


def test_a_host_calibration_sets_the_overheads_of_an_et_priced_step(tmp_path):
    from itercast.profile.calibrate import host_overheads_only

    path = tmp_path / "r.json"
    doc = {"schema": "1.0.1", "nodes": [{"name": ROOT, "id": 1, "parent": 1, "inputs": []}, node(3, TBE, tbe_args())]}
    path.write_text(json.dumps(doc))
    (tmp_path / "cal.json").write_text(json.dumps(host_overheads_only(HOST)))
    code, text = run(
        "--et", str(path), "--system", "v100-p3.16xlarge", "--calibration", str(tmp_path / "cal.json"), "--json"
    )
    assert code == 0, text
    out = json.loads(text[text.index("{") :])
    # one top-level operator with one launch: T1 10 + T2 1 + T4 5 + T3 2 = 18 µs of host
    assert out["ranks"][0]["host_s"] == pytest.approx(18e-6)
    assert out["host_overheads"] == str(tmp_path / "cal.json")


@pytest.mark.skipif(not (SHARED / "param_dlrm_kineto_8rank_v100.tar.gz").is_file(), reason="shared traces absent")
def test_a_kineto_trace_of_another_rank_is_one_line(tmp_path):
    import tarfile

    for name in ("param_dlrm_pytorch_et_8rank.tar.gz", "param_dlrm_kineto_8rank_v100.tar.gz"):
        with tarfile.open(SHARED / name) as tar:
            tar.extractall(tmp_path, filter="data")
    kinetos = sorted((tmp_path / "dlrm_kineto").iterdir(), key=lambda p: p.name)
    kinetos[0], kinetos[1] = kinetos[1], kinetos[0]  # rank 1's Kineto trace given for rank 0
    args = [x for k in kinetos for x in ("--kineto", str(k))]
    code, text = run("--et", str(tmp_path / "dlrm_pytorch_et"), "--system", "v100-p3.16xlarge", *args)
    assert code == 2 and "dlrm_eg_0.json does not match" in " ".join(text.split())


def test_a_cast_that_returned_its_input_is_free_and_copy_moves_its_source_and_destination():
    """PARAM DLRM's ET casts long to long with aten::to: its output is its input (tensor 630 -> 630), no
    _to_copy under it, no kernel. copy_([16, 13] fp32 into [16, 13] fp32) reads its source and writes self:
    2 x 832 bytes, not self read as well; fill_ writes 64 bytes of a [16] fp32, reading nothing (a helper's
    audit of the PARAM ET's pricing)."""
    from itercast.config.job import load_system
    from itercast.costs.analytic import AnalyticCostModel
    from itercast.costs.aten_ops import features
    from itercast.traces.et_pricing import ETPricer
    from itercast.traces.execution_trace import ETNode

    def node(name, shapes, types, tensors, out_tensors, out_shapes, out_types):
        return ETNode(1, 1, 0, name, 1, shapes, out_shapes, types, tensors, out_tensors, output_types=out_types)

    pricer = ETPricer(AnalyticCostModel(load_system("v100-p3.16xlarge"), "fp32"))
    cast = node("aten::to", [[16, 3]], ["Tensor(long int)"], (630,), (630,), [[16, 3]], ["Tensor(long int)"])
    assert pricer.price(cast, has_children=False) is None
    real = node("aten::to", [[16, 3]], ["Tensor(long int)"], (630,), (631,), [[16, 3]], ["Tensor(float)"])
    assert pricer.price(real, has_children=False) is not None
    f32 = "Tensor(float)"
    copy = node("aten::copy_", [[16, 13], [16, 13]], [f32, f32], (5, 6), (5,), [[16, 13]], [f32])
    assert features(copy).size == 2 * 16 * 13 * 4
    fill = node("aten::fill_", [[16]], [f32], (7,), (7,), [[16]], [f32])
    assert features(fill).size == 16 * 4


def test_a_profile_of_another_device_is_said():
    # the database's operator models keep their device's times on another system: a warning; on its own GPU none
    from itercast.cli.et_ranks import other_device_note
    from itercast.config.job import load_system

    h100 = {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3"}
    note = other_device_note(Path("p.db"), h100, load_system("v100-p3.16xlarge"))
    assert note is not None and note.startswith(
        "p.db profiled NVIDIA H100 80GB HBM3; the system here is 'v100-p3.16xlarge'"
    )
    assert other_device_note(Path("p.db"), h100, load_system("dgx-h100")) is None
    cpu = {"device": "cpu", "cpu": "AMD EPYC"}
    assert other_device_note(Path("p.db"), cpu, load_system("cpu-host")) is None
    assert "profiled a CPU (AMD EPYC)" in str(other_device_note(Path("p.db"), cpu, load_system("dgx-a100")))
    # an imported table names its device its own way (OpenXLA's sm_90), not a CPU (user probe 11)
    xla = {"source": "xla_collective_perf_table.csv", "device": "sm_90"}
    assert str(other_device_note(Path("x.db"), xla, load_system("dgx-h100"))).startswith("x.db profiled sm_90;")


def test_an_index_distribution_that_moves_no_price_is_said(tmp_path):
    """On a V100 (no lookup model) a TBE forward is priced as the bytes it moves, whatever the indices: Zipf 2 is
    said to move nothing there; with the fused backward in the trace the update's distinct rows move its price (not
    at the default 6 lookups a table, where every price is at its memory latency floor: said there too)."""
    big = tbe_args(indices=60_000, weights=80_000)  # two tables of 10,000 rows, 30,000 lookups each
    rank_trace(tmp_path / "fwd.json", with_mm=False, tbe=big)
    rank_trace(tmp_path / "both.json", with_mm=False, backward=True, tbe=big)
    said = "--index-distribution moves no price here"
    texts = {}
    for name in ("fwd", "both"):
        for dist in ("uniform", "zipf:2"):
            code, texts[name, dist] = run(
                "--et",
                str(tmp_path / f"{name}.json"),
                "--system",
                "v100-p3.16xlarge",
                "--index-distribution",
                dist,
                "--json",
            )
            assert code == 0, texts[name, dist]
    assert said in texts["fwd", "zipf:2"] and said not in texts["fwd", "uniform"]
    assert said not in texts["both", "zipf:2"]
    step = {k: json.loads(v[v.index("{") :])["ranks"][0]["iteration_s"] for k, v in texts.items()}
    assert step["fwd", "zipf:2"] == step["fwd", "uniform"] and step["both", "zipf:2"] != step["both", "uniform"]


def test_an_imported_profile_of_the_systems_gpu_that_prices_nothing_here_is_said(tmp_path):
    """A database imported from another tool (its device named, its fingerprint only its source) whose one model is a
    collective these traces do not run: it is not said to be 'a CPU' (its name says V100, the system's GPU), and
    since no operator of the traces is priced from it, that is said instead of every price passing as refined by it."""
    from itercast.measurements import Measurement
    from itercast.profile.db import ProfileDB

    db = ProfileDB(tmp_path / "imported.db")
    device = db.device("V100 p3.16xlarge (imported)", {"source": "table.csv"})
    rows = [Measurement("collective", "all_to_all", float(n), 1e-5 * n / 1024, "fp32", 2) for n in (1024, 4096, 16384)]
    db.add(device, rows)
    rank_trace(tmp_path / "r.json", with_mm=True)
    code, text = run("--et", str(tmp_path / "r.json"), "--system", "v100-p3.16xlarge", "--db", str(db.path))
    assert code == 0, text
    flat = " ".join(text.split())
    assert "profiled a CPU" not in flat and "does not name" not in flat
    assert "imported.db: none of its operator models prices an operator of these traces" in flat
    # on another system's GPU its name does not name: said
    code, text = run("--et", str(tmp_path / "r.json"), "--system", "dgx-h100", "--db", str(db.path))
    assert code == 0 and "device 1 ('V100 p3.16xlarge (imported)') does not name H100-SXM5-80GB" in text, text
