"""Host overheads T1–T5 in a model-built DLRM step (workloads/dlrm/host.py, dlrm/step.py): the host
issues each task's operators, the GPU waits for their launches; values computed by hand."""

from __future__ import annotations

import pytest
from test_dlrm import model, system
from test_golden import SYSTEM, linear_calibration

from itercast.config.job import parse_section
from itercast.costs.host_overheads import HostOverheads
from itercast.graph.execgraph import Category, GraphBuilder
from itercast.profile.calibrate import host_overheads_only, merge_calibration
from itercast.sim.engine import simulate
from itercast.workloads.dlrm import HostModel, Shard, dlrm_step, host_model, no_overheads, ops_per_task
from itercast.workloads.dlrm.step import host_issuer

US = 1e-6
#: T1 2 µs, T2 3, T3 1, cudaLaunchKernel 4, no-call 1; 5 silent operators to 10 launching ones
OVERHEADS = HostOverheads(
    2.0,
    {"cudaLaunchKernel": 4.0},
    {},
    {"t2_us": 3.0, "t3_us": 1.0, "t5_us": 0.5, "no_call_us": 1.0},
    {"t2": 10, "no_call": 5},
)


def cpu_system(gpus: int):
    """test_dlrm's system whose accelerator is the host."""
    gpu = {**SYSTEM["gpu"], "executes_on_host": True}
    return parse_section(
        "system", {**SYSTEM, "gpu": gpu, "node": {**SYSTEM["node"], "gpus_per_node": gpus}, "num_nodes": 1}
    )


def chain(host: HostModel, kernels_s: list[float], ops: list[int]) -> float:
    """One rank: tasks one after another on its compute stream, each issued by its operators."""
    g = GraphBuilder()
    comp = g.resource(0, "compute")
    names = [f"op{i}" for i in range(len(kernels_s))]
    issue = host_issuer(g, host, comp if host.on_compute else g.resource(0, "host"), dict(zip(names, ops, strict=True)))
    last: list[int] = []
    for name, seconds in zip(names, kernels_s, strict=True):
        last = [issue(name, comp, seconds, Category.COMPUTE, "mlp", last)]
    return simulate(g.build()).step_time_s


def test_one_operator_costs_t1_t2_launch_t3_and_its_share_of_silent_ones():
    gpu = host_model(system(2), None, OVERHEADS)
    # launching: 2 + 3 + 4 + 1 = 10 µs; 0.5 silent per launching one, each T1 + no-call = 3 µs
    assert gpu.op_s == pytest.approx((10 + 0.5 * 3) * US) and not gpu.on_compute
    # on a CPU the operator's T2 and T3 run inside its measured time and nothing is launched: T1 2 µs
    # and the silent share 0.5 × 3 µs alone
    cpu = host_model(cpu_system(2), None, OVERHEADS)
    assert cpu.op_s == pytest.approx((2 + 0.5 * 3) * US) and cpu.on_compute


def test_a_host_bound_step_is_the_sum_of_host_times_and_the_last_kernel():
    host = HostModel(10 * US, False, "test")  # 10 µs of host per operator, 3 µs kernels
    assert chain(host, [3 * US] * 3, [1, 1, 1]) == pytest.approx((10 + 10 + 10 + 3) * US)


def test_long_kernels_hide_the_host():
    host = HostModel(10 * US, False, "test")  # only the first launch shows: 10 + 3 × 50 µs
    assert chain(host, [50 * US] * 3, [1, 1, 1]) == pytest.approx((10 + 3 * 50) * US)


def test_a_task_of_many_operators_waits_for_its_last_launch():
    host = HostModel(10 * US, False, "test")
    # 4 operators, 20 µs of GPU: first launch at 10, the last 1/4 (5 µs) after the 4th at 40: 45 µs
    assert chain(host, [20 * US], [4]) == pytest.approx((4 * 10 + 20 / 4) * US)
    # 4 operators, 100 µs of GPU: the kernels run from the first launch on: 10 + 100 µs
    assert chain(host, [100 * US], [4]) == pytest.approx((10 + 100) * US)


def test_on_a_cpu_the_host_adds_to_every_operator():
    host = HostModel(10 * US, True, "test")
    assert chain(host, [50 * US] * 3, [1, 2, 1]) == pytest.approx((4 * 10 + 3 * 50) * US)


def test_on_a_cpu_the_host_waits_for_an_exchange_before_issuing_what_reads_it():
    """The measured CPU step blocks on each exchange (gloo's blocking calls, reduce.wait()) before it
    issues the operators that read its result. Host 10 µs an operator; a 100 µs exchange of one
    operator, then a 50 µs task of 2 operators that reads it. On a CPU: 10 (issue) + 100 (exchange)
    + 2 × 10 (issue) + 50 = 180 µs. A GPU's host issues the task during the exchange: its first
    half (25 µs) starts when the exchange ends at 110, the second after it: 10 + 100 + 50 = 160 µs."""

    def step(host: HostModel) -> float:
        g = GraphBuilder()
        comp, comm = g.resource(0, "compute"), g.resource(0, "comm")
        issue = host_issuer(g, host, comp if host.on_compute else g.resource(0, "host"), {"a2a": 1, "top": 2})
        a2a = issue("a2a", comm, 100 * US, Category.COMMUNICATION, "alltoall", collective=g.new_collective())
        issue("top", comp, 50 * US, Category.COMPUTE, "mlp", [a2a])
        return simulate(g.build()).step_time_s

    assert step(HostModel(10 * US, True, "test")) == pytest.approx(180 * US)
    assert step(HostModel(10 * US, False, "test")) == pytest.approx(160 * US)


def test_operators_per_task_by_hand():
    """model(2): bottom MLP 8 → 16 (1 layer), top 19 → 8 → 1 (2 layers), dot interaction; 2 ranks,
    t0 table-wise on rank 0, t1 data-parallel; TorchRec's program (exchange torchrec, the default)."""
    plan = {"t0": Shard("table_wise", (0,)), "t1": Shard("data_parallel", (0, 1))}
    ops = ops_per_task(model(2), plan, 0, 2, foreach_optimizer=True)
    assert ops["index_exchange"] == 2  # lengths, then indices
    assert ops["embedding_fwd"] == 2
    assert ops["embedding_bwd"] == 1  # t0: FBGEMM's fused backward and update
    assert ops["replica_embedding_bwd"] == 1  # t1: FBGEMM's dense backward
    # one all-to-all each way for the table-wise t0, on both ranks; no row-wise table
    assert (ops["pooled_exchange"], ops["pooled_grad_exchange"]) == (1, 1)
    peer = ops_per_task(model(2), plan, 1, 2, foreach_optimizer=True)
    assert (peer["pooled_exchange"], peer["pooled_grad_exchange"], peer["embedding_bwd"]) == (1, 1, 0)
    assert ops["bottom_mlp_fwd"] == 2 and ops["bottom_mlp_bwd"] == 4
    # dot and loss both ways, 2 layers, less the logit layer's ReLU and ReluBackward0
    assert ops["interaction_top_mlp_fwd_bwd"] == 2 * (4 + 1) + 2 * (2 + 4) - 2
    # both tables row-wise: one reduce-scatter forward, one all-gather backward, one update a shard
    # both tables row-wise: one reduce-scatter forward, one all-gather backward; TorchRec batches a rank's tables of
    # one sharding type into one lookup and one fused backward (embedding_sharding.py group_tables; user probe 12)
    rows = ops_per_task(model(2), dict.fromkeys(("t0", "t1"), Shard("row_wise", (0, 1))), 0, 2, True)
    assert (rows["pooled_exchange"], rows["pooled_grad_exchange"], rows["embedding_fwd"], rows["embedding_bwd"]) == (
        1,
        1,
        1,
        1,
    )
    # both data-parallel: one dense table-batched lookup and backward, one dense gradient, one Adagrad chain
    replicas = ops_per_task(model(2), dict.fromkeys(("t0", "t1"), Shard("data_parallel", (0, 1))), 0, 2, True)
    assert (replicas["embedding_fwd"], replicas["replica_embedding_bwd"], replicas["optimizer"]) == (1, 1, 8 + 9)
    assert replicas["ddp_to_buckets"] == 6 + 1
    # DDP: the 3 layers' (weight, bias) and the replica's gradient, 7 tensors, each copied into its
    # bucket (dividing), none back (TorchRec's DDP: gradient_as_bucket_view=True); (313 + 1000 × 16) × 4
    # = 65,252 bytes: one 25 MiB bucket
    assert (ops["ddp_to_buckets"], ops["ddp_from_buckets"], ops["grad_all_reduce"]) == (7, 0, 1)
    # a table-wise and a column-wise table: TorchRec runs one output dist per sharding type, two all-to-alls
    mixed = {"t0": Shard("table_wise", (0,)), "t1": Shard("column_wise", (0, 1))}
    both = ops_per_task(model(2), mixed, 1, 2, foreach_optimizer=True)
    assert (both["pooled_exchange"], both["pooled_grad_exchange"]) == (2, 2)
    # foreach Adam; the replica's dense Adagrad: norm, pow_, div_, add_, sqrt, + ε, reciprocal, mul, addcmul_
    assert ops["optimizer"] == 8 + 9
    assert ops_per_task(model(2), plan, 1, 2, foreach_optimizer=False)["optimizer"] == 8 * 6 + 9
    # a replica of 10M × 16 fp32 rows: (160,000,000 + 313) × 4 = 640,001,252 bytes / 26,214,400 = 24.4:
    # 25 buckets, 25 all-reduces
    big = model(2).model_copy(update={"tables": (model(2).tables[0].model_copy(update={"num_rows": 10_000_000}),)})
    assert ops_per_task(big, {"t0": Shard("data_parallel", (0, 1))}, 0, 2, True)["grad_all_reduce"] == 25
    alone = ops_per_task(model(2), {"t0": Shard("table_wise", (0,))}, 0, 1, foreach_optimizer=True)
    assert alone["index_exchange"] == alone["pooled_exchange"] == alone["ddp_to_buckets"] == 0


def test_operators_per_task_of_the_point_to_point_emulation_by_hand():
    """The same model and plan as tools/measure_dlrm_sharding.py's ShardedDLRM runs them (exchange
    point_to_point)."""
    m = model(2).model_copy(update={"exchange": "point_to_point"})
    plan = {"t0": Shard("table_wise", (0,)), "t1": Shard("data_parallel", (0, 1))}
    ops = ops_per_task(m, plan, 0, 2, foreach_optimizer=True)
    # t0's update: its pooled gradients concatenated from both ranks', gathered per lookup, updated
    assert ops["embedding_bwd"] == 3
    assert ops["replica_embedding_bwd"] == 3  # the replica's gradient zeroed, the lookups' gathered, added
    # forward rank 0 owns t0: its parts concatenated for itself and for rank 1, sent (1 + 2); backward
    # its own gradients concatenated and rank 1's received (1 + 1). Rank 1 receives (1), then
    # concatenates and sends rank 0 its t0 gradients (2); no row-wise table
    assert (ops["pooled_exchange"], ops["pooled_grad_exchange"]) == (3, 2)
    peer = ops_per_task(m, plan, 1, 2, foreach_optimizer=True)
    assert (peer["pooled_exchange"], peer["pooled_grad_exchange"], peer["embedding_bwd"]) == (1, 2, 0)
    # t0's received columns concatenated (1); dot and loss both ways, 2 layers, less the logit
    # layer's ReLU and ReluBackward0
    assert ops["interaction_top_mlp_fwd_bwd"] == 1 + 2 * (4 + 1) + 2 * (2 + 4) - 2
    # both tables row-wise: partial sums concatenated and reduce-scattered, gradients concatenated and
    # all-gathered (2 each way); each shard's lookups' gradients gathered and updated (2 × 2)
    rows = ops_per_task(m, dict.fromkeys(("t0", "t1"), Shard("row_wise", (0, 1))), 0, 2, True)
    assert (rows["pooled_exchange"], rows["pooled_grad_exchange"], rows["embedding_bwd"]) == (2, 2, 4)
    # every dense gradient in one cat, one all-reduce; after it the buffer divided and the 3 layers ×
    # (weight, bias) = 6 MLP gradients copied back: 1 + 6
    assert (ops["ddp_to_buckets"], ops["ddp_from_buckets"], ops["grad_all_reduce"]) == (1, 7, 1)
    # a replica of 10M × 16 fp32 rows (640 MB): still one all-reduce of the buffer
    big = m.model_copy(update={"tables": (m.tables[0].model_copy(update={"num_rows": 10_000_000}),)})
    assert ops_per_task(big, {"t0": Shard("data_parallel", (0, 1))}, 0, 2, True)["grad_all_reduce"] == 1


@pytest.mark.parametrize(("exchange", "operators"), [("torchrec", 76), ("point_to_point", 80)])
def test_one_rank_on_a_cpu_adds_every_operators_host_time(exchange: str, operators: int):
    """1 rank on a CPU, both tables table-wise: their lookups (TorchRec's one table-batched lookup of the rank's
    table-wise tables; the emulation's 2), 2 bottom fwd, 20 interaction and top, 4 bottom bwd, Adam on 6 tensors
    (48), and the updates: FBGEMM's one fused backward of both (torchrec: 1 + 2 + 20 + 4 + 48 + 1 = 76 operators)
    or a gather and an update each (point_to_point: 2 + 2 + 20 + 4 + 48 + 4 = 80), all on the compute thread. The
    step is the operators' own times (no_overheads) and, once for each operator, the gap before it
    (T1 2 µs) and its share of silent operators (0.5 × (T1 2 + no-call 1) = 1.5 µs): T2 and T3 are
    inside the operators' times, not added again."""
    cpu = cpu_system(1)
    m = model(2).model_copy(update={"exchange": exchange})
    plan = {"t0": Shard("table_wise", (0,)), "t1": Shard("table_wise", (0,))}
    bare = dlrm_step(m, cpu, plan, 64, host_overheads=no_overheads())
    step = dlrm_step(m, cpu, plan, 64, host_overheads=OVERHEADS)
    assert step.step_time_s - bare.step_time_s == pytest.approx(operators * (2 + 0.5 * 3) * US)


def test_the_step_names_where_its_overheads_came_from():
    plan = {"t0": Shard("table_wise", (0,)), "t1": Shard("table_wise", (1,))}
    default = dlrm_step(model(2), system(2), plan, 64)
    assert default.host_source.startswith("other trace") and "costs/host_overheads.json" in default.host_source
    own = dlrm_step(model(2), system(2), plan, 64, merge_calibration(host_overheads_only(OVERHEADS)))
    assert own.host_source.startswith("own trace")
    other_cal = {**merge_calibration(host_overheads_only(OVERHEADS)), "host_overheads_source": "mlp.json"}
    assert dlrm_step(model(2), system(2), plan, 64, other_cal).host_source == "other trace: mlp.json"
    assert default.step_time_s > dlrm_step(model(2), system(2), plan, 64, host_overheads=no_overheads()).step_time_s


def test_on_one_cpu_host_each_rank_shares_its_core_between_its_compute_and_its_collectives():
    # two row-wise tables on 2 ranks of one CPU host (gpus_per_node 2: one core per rank, both ranks alike,
    # so each rank's running tasks share one core: k of them run at 1/k each); the same step on GPUs
    # (nothing shared) gives every task's work alone
    m, b = model(tables=2), 8
    plan = {t.name: Shard("row_wise", (0, 1)) for t in m.tables}
    gpu = dlrm_step(m, system(2), plan, b, linear_calibration(), host_overheads=no_overheads())
    cpu = dlrm_step(m, cpu_system(2), plan, b, linear_calibration(), host_overheads=no_overheads())
    work = _rank0(gpu, lambda g, i: g.duration_s[i])
    Ix, Bf, E, P = (work[n] for n in ("index_exchange", "bottom_mlp_fwd", "embedding_fwd", "pooled_exchange"))
    T, Bb, B, X = (
        work[n] for n in ("interaction_top_mlp_fwd_bwd", "bottom_mlp_bwd", "ddp_to_buckets", "pooled_grad_exchange")
    )
    A, U, F, Opt = (work[n] for n in ("grad_all_reduce", "embedding_bwd", "ddp_from_buckets", "optimizer"))
    assert Bf < Ix and B < X and X - B < A and A - (X - B) < U  # the order of events worked out below
    # the index exchange beside the bottom MLP: both at 1/2 until the MLP ends (2 Bf), the exchange alone after
    t = 2 * Bf + (Ix - Bf)
    t += E + P + T + Bb  # one task at a time
    # the buckets beside the gradients' exchange: both at 1/2 until the buckets end; the all-reduce starts
    # then, beside the exchange's rest (X - B), both at 1/2; the update starts once the exchange ends,
    # beside the all-reduce's rest, both at 1/2; the update alone after
    buckets_end = t + 2 * B
    exchange_end = buckets_end + 2 * (X - B)
    all_reduce_end = exchange_end + 2 * (A - (X - B))
    update_end = all_reduce_end + U - (A - (X - B))
    step_s = update_end + F + Opt
    ends = _rank0(cpu, lambda g, i: cpu.sim.end_s[i])
    assert ends["ddp_to_buckets"] == pytest.approx(buckets_end)
    assert ends["pooled_grad_exchange"] == pytest.approx(exchange_end)
    assert ends["grad_all_reduce"] == pytest.approx(all_reduce_end)
    assert ends["embedding_bwd"] == pytest.approx(update_end)
    assert cpu.step_time_s == pytest.approx(step_s)
    # the planner's pricing keeps both ranks here (one rank alone would have a core to itself)
    planner = dlrm_step(
        m, cpu_system(2), plan, b, linear_calibration(), host_overheads=no_overheads(), every_rank=False
    )
    assert planner.step_time_s == pytest.approx(step_s)
    # each task lasts what it ran (its span), so the graph alone replays the shared schedule
    assert _rank0(cpu, lambda g, i: g.duration_s[i])["pooled_grad_exchange"] == pytest.approx(exchange_end - t)
    # over several nodes the cores are not modelled apart: nothing shared, every task its work alone
    nodes = {"node": {**SYSTEM["node"], "gpus_per_node": 1}, "num_nodes": 2}
    apart = [
        dlrm_step(
            m,
            parse_section("system", {**SYSTEM, **nodes, "gpu": gpu_}),
            plan,
            b,
            linear_calibration(),
            host_overheads=no_overheads(),
        )
        for gpu_ in (SYSTEM["gpu"], {**SYSTEM["gpu"], "executes_on_host": True})
    ]
    assert _rank0(apart[1], lambda g, i: g.duration_s[i]) == _rank0(apart[0], lambda g, i: g.duration_s[i])
    assert apart[1].step_time_s == apart[0].step_time_s


def _rank0(step, value) -> dict[str, float]:
    """Per task name on rank 0 (host tasks left out), `value(graph, task)`."""
    g = step.graph
    return {
        g.names[g.name[i]]: float(value(g, i))
        for i in range(g.num_tasks)
        if g.resource_rank[g.resource[i]] == 0 and not g.names[g.name[i]].startswith("host:")
    }
