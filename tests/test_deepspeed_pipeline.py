"""DeepSpeed's pipeline engine (plan.pipeline_p2p = deepspeed) computed by hand: blocking transfers on the
compute stream in TrainSchedule's order, partitioned sends and the receiver's all-gathers.

Sources (DeepSpeed 3401d2516, Feb. 2022): runtime/pipe/p2p.py send/recv (dist.send / dist.recv, async_op
False), runtime/pipe/schedule.py TrainSchedule, runtime/pipe/engine.py (is_pipe_partitioned =
is_model_parallel; PartitionedTensor of runtime/utils.py).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import FreeCosts, fast_vs_graph, pipeline_builder, plan_of, tiny_job
from test_golden import HBM, LINK, MODEL, SYSTEM, linear_calibration

from itercast.config.job import Job
from itercast.errors import ConfigError
from itercast.parallel.schedules import schedule
from itercast.predict import predict
from itercast.search.frameworks import FRAMEWORKS
from itercast.sim.engine import simulate
from itercast.workloads.transformer import PassCost, TransformerStepBuilder, UnitCosts
from itercast.workloads.transformer_ops import tp_allreduce_note

F, B, T = 1.0, 2.0, 0.25  # seconds: a stage's forward, its backward, one transfer


def job(pipeline_p2p: str, stages: int, micro: int, tp: int = 1, layers: int | None = None) -> Job:
    """MODEL on tp × stages GPUs of one node, `micro` micro-batches of one sequence."""
    plan = dict(
        pipeline_parallel=stages,
        tensor_parallel=tp,
        data_parallel=1,
        micro_batch_size=1,
        global_batch_size=micro,
        pipeline_p2p=pipeline_p2p,
    )
    system = {**SYSTEM, "node": {**SYSTEM["node"], "gpus_per_node": tp * stages}, "num_nodes": 1}
    return Job.from_dicts({**MODEL, "num_layers": layers or stages}, plan, system)


def step_s(pipeline_p2p: str, stages: int, micro: int) -> float:
    return simulate(pipeline_builder(job(pipeline_p2p, stages, micro), F, B, T).build()).step_time_s


def test_two_stages_two_micro_batches_by_hand():
    # 1F1B on two stages: stage 0 runs F0 F1 B0 B1, stage 1 F0 B0 F1 B1.
    # Overlapped (Megatron): a send runs on its own stream, the receiver waits for it. The critical
    # path is F0 on 0, its send, F0 B0 F1 B1 on 1 (F1's input arrived during B0), the send of B1's
    # gradient, B1 on 0: 3F + 3B + 2T.
    assert step_s("overlapped", 2, 2) == pytest.approx(3 * F + 3 * B + 2 * T)  # 9.5
    # DeepSpeed: TrainSchedule puts F(m) of stage s at step 2m + s, B(m) at 2m + 2p − s − 1; a pass's
    # output leaves at the stage's next step; each transfer holds both compute streams.
    #   stage 0: F0 | send F0 | F1 | send F1, recv B0 | B0 | recv B1 | B1
    #   stage 1: recv F0 | F0 | B0 | recv F1, send B0 | F1 | B1 | send B1
    # F0 ends at F, send F0 at F + T; stage 1 runs F0, B0 to 2F + B + T; the pair "send F1" then meets
    # (stage 0 waits since 2F + T): 2F + B + 2T; "send B0" 2F + B + 3T; stage 0's B0 ends 2F + 2B + 3T;
    # stage 1 runs F1, B1 to 3F + 2B + 3T; "send B1" 3F + 2B + 4T; B1 on stage 0: 3F + 3B + 4T.
    assert step_s("deepspeed", 2, 2) == pytest.approx(3 * F + 3 * B + 4 * T)  # 9.9: 2T later


def test_two_stages_steady_state_adds_both_transfers_to_every_micro_batch():
    # Between two meetings a stage runs its 2 transfers, one forward and one backward: a period of
    # F + B + 2T per micro-batch, and the fill of one more F + B: (M + 1)(F + B) + 2·M·T
    for micro in (4, 8):
        assert step_s("deepspeed", 2, micro) == pytest.approx((micro + 1) * (F + B) + 2 * micro * T)
    # overlapped, 1F1B's round trip: stage 0 holds 2 micro-batches, (2(F + B) + 2T) / 2 per micro-batch,
    # one T less than DeepSpeed's: M(F + B + T) + (F + B)
    assert step_s("overlapped", 2, 8) == pytest.approx(8 * (F + B + T) + (F + B))


def test_transfers_run_on_the_compute_stream_under_deepspeed_only():
    for mode, stream in (("overlapped", "p2p_next"), ("deepspeed", "compute")):
        g = pipeline_builder(job(mode, 2, 2), F, B, T).build()
        sends = [t for t in range(g.num_tasks) if g.names[g.name[t]] == "send_act.m0.c0"]
        assert [g.kinds[g.resource_kind[g.resource[t]]] for t in sends] == [stream]


def test_deepspeed_step_order_is_megatrons_1f1b():
    """TrainSchedule._step_to_micro_batch, as DeepSpeed writes it, walked step by step: the passes of
    each stage come in the order of itercast's 1F1B."""
    for stages, micro in itertools.product(range(2, 7), range(1, 9)):
        for s in range(stages):
            walked = []
            for step in range(2 * (micro + stages - 1)):
                if step % 2 == s % 2:  # even step on an even stage, odd on odd: a forward
                    m, forward = (step - s % 2) // 2 - s // 2, True
                elif step % 2 == 0:  # even step, odd stage
                    m, forward = step // 2 - stages + (s + 1) // 2, False
                else:  # odd step, even stage
                    m, forward = (step - 1) // 2 - stages + 1 + s // 2, False
                if 0 <= m < micro:
                    walked.append((forward, m))
            assert walked == [(p.forward, p.microbatch) for p in schedule("1f1b", s, stages, micro)]


def test_partitioned_sends_and_the_receivers_all_gathers_by_hand():
    # MODEL: 32 tokens × hidden 64 × 2 bytes = 4,096 bytes of activations per micro-batch. With tp 2 each
    # GPU sends its half, 2,048 bytes, after a header of 8 int64 + 1: ndims, 3 dims, parts, rank,
    # 3 offsets = 72 bytes, a send of its own; on test_golden's linear calibration each takes bytes/LINK
    j = job("deepspeed", 2, 2, tp=2, layers=2)
    g = predict(j, linear_calibration()).sim.graph
    seconds = {}
    for t in range(g.num_tasks):
        seconds.setdefault(g.names[g.name[t]], []).append(float(g.duration_s[t]))
    both_ends = [pytest.approx((2048 + 72) / LINK)] * 2
    assert seconds["send_act.m0.c0"] + seconds["recv_act.m0.c0"] == both_ends
    assert seconds["send_grad.m1.c0"] + seconds["recv_grad.m1.c0"] == both_ends
    # the receiver all-gathers the 4,096 bytes over its 2 tensor-parallel ranks, 1/2 of them per rank:
    # once before stage 1's forward, twice before stage 0's backward (its own output and the gradient)
    gather = pytest.approx(4096 / 2 / LINK)
    assert seconds["pipe_all_gather.F0"] == [gather]
    assert seconds["pipe_all_gather.B0"] == [gather, gather]
    # without tensor parallelism: the whole 4,096 bytes, no header, nothing to gather
    g1 = predict(job("deepspeed", 2, 2, layers=2), linear_calibration()).sim.graph
    names = {g1.names[g1.name[t]]: float(g1.duration_s[t]) for t in range(g1.num_tasks)}
    assert names["send_act.m0.c0"] == pytest.approx(4096 / LINK) and "pipe_all_gather.F0" not in names


def test_deepspeed_device_copies_around_its_transfers_by_hand():
    # pipe_copy_bytes, MODEL's 4,096-byte activation S, tp 2: a part P = 2,048 bytes, its 72-byte header H;
    # each copy kernel moves its bytes at test_golden's HBM (bytes read + written / HBM)
    j = job("deepspeed", 2, 2, tp=2, layers=2)
    g = predict(j, linear_calibration()).sim.graph
    seconds: dict[str, list[float]] = {}
    for t in range(g.num_tasks):
        seconds.setdefault(g.names[g.name[t]], []).append(float(g.duration_s[t]))
    # the sender keeps its part (.narrow().clone()): 2P = 4,096 bytes, activation and gradient alike
    assert seconds["pipe_copy.partition.F0"] == [pytest.approx(4096 / HBM)]
    assert seconds["pipe_copy.partition.B0"] == [pytest.approx(4096 / HBM)]
    # the receiver clones header and part on receipt, then again as the forward's input: 2 × (144 + 4,096)
    assert seconds["pipe_copy.receive.F0"] == [pytest.approx((144 + 4096) / HBM)] * 2
    # each PartitionedTensor.full(): zeros S (4,096 written), local part in (4,096), the all-gather's flat
    # output copied to its 2 parts (2 × 4,096), a clone of S (8,192): 24,576 bytes; once before stage 1's
    # forward, twice before stage 0's backward
    assert seconds["pipe_copy.gather.F0"] == [pytest.approx(24576 / HBM)]
    assert seconds["pipe_copy.gather.B0"] == [pytest.approx(24576 / HBM)] * 2
    # stage 1's stream before F0: receive the header and part, clone them, clone again, all-gather, full()'s copies
    names = [g.names[g.name[t]] for t in range(g.num_tasks) if g.task_label(t).endswith("@1:compute")]
    first = names.index("recv_act.m0.c0")
    assert names[first : first + 5] == [
        "recv_act.m0.c0",
        "pipe_copy.receive.F0",
        "pipe_copy.receive.F0",
        "pipe_all_gather.F0",
        "pipe_copy.gather.F0",
    ]
    # without tensor parallelism the whole activation is cloned twice (2 × 8,192 bytes), nothing else
    g1 = predict(job("deepspeed", 2, 2, layers=2), linear_calibration()).sim.graph
    copies = [(g1.names[g1.name[t]], float(g1.duration_s[t])) for t in range(g1.num_tasks)]
    copies = [(n, s) for n, s in copies if n.startswith("pipe_copy")]
    assert (
        copies
        == [("pipe_copy.receive.F0", pytest.approx(8192 / HBM))] * 2
        + [("pipe_copy.receive.F1", pytest.approx(8192 / HBM))] * 2
    )


def test_deepspeed_transfers_need_its_schedule_and_zero_0_or_1():
    for fields in ({"schedule": "gpipe"}, {"zero_stage": 2}):
        plan = {"pipeline_parallel": 2, "pipeline_p2p": "deepspeed", **fields}
        with pytest.raises(ConfigError, match=r"pipeline_p2p\(deepspeed\) runs DeepSpeed"):
            Job.from_dicts(MODEL | {"num_layers": 2}, plan, {**SYSTEM, "num_nodes": 1})


def test_deepspeed_pipelines_reduce_gradients_after_the_last_backward():
    # pipe/schedule.py TrainSchedule issues ReduceGrads in its last step: nothing overlaps the reduction.
    # Left out, overlap_grad_reduce is false under the engine; asked for, it is refused in one line
    plan = {"pipeline_parallel": 2, "pipeline_p2p": "deepspeed"}
    j = Job.from_dicts(MODEL | {"num_layers": 2}, plan, {**SYSTEM, "num_nodes": 1})
    assert j.plan.overlap_grad_reduce is False
    with pytest.raises(ConfigError, match=r"reduces the gradients after the last micro-batch's backward"):
        Job.from_dicts(MODEL | {"num_layers": 2}, plan | {"overlap_grad_reduce": True}, {**SYSTEM, "num_nodes": 1})


def test_the_deepspeed_framework_prices_its_engine():
    assert FRAMEWORKS["deepspeed"].plan_fields["pipeline_p2p"] == "deepspeed"


def _stages_step_s(
    forward: list[float], backward: list[float], micro: int, transfer: float, pipeline_p2p: str = "deepspeed"
) -> float:
    """The graph's step for stages of the given seconds per pass (deepspeed transfers unless named)."""
    b = TransformerStepBuilder(job(pipeline_p2p, len(forward), micro), costs=FreeCosts())
    zero = PassCost(0.0, 0.0, 0)
    b.stage_units = [
        UnitCosts(PassCost(f, 0.0, 0), PassCost(w, 0.0, 0), zero, zero, zero, zero)
        for f, w in zip(forward, backward, strict=True)
    ]
    b.p2p_s = dict.fromkeys(b.p2p_s, transfer)
    return simulate(b.build()).step_time_s


def test_fast_path_blocking_pipeline_agrees_with_the_graph():
    from itercast.search.fast_estimate import _blocking_pipeline

    # uniform stages: exact, e.g. 4 stages, 8 micro-batches: (8 + 3)(F + B) + (4·8 + 2·4 − 8) T
    assert _stages_step_s([F] * 4, [B] * 4, 8, T) == pytest.approx(11 * (F + B) + 32 * T)
    # an embedding on the first stage and a head on the last, all-gathers on the inner sides
    for stages, micro, head in itertools.product((2, 3, 4, 8), (1, 2, 8, 32), (0.0, 0.2, 0.6)):
        forward = [F + 0.05] + [F + 0.02] * (stages - 1)
        backward = [B + 0.04] * (stages - 1) + [B]
        forward[-1] += head
        backward[-1] += 2 * head
        stage = np.array([forward]) + np.array([backward])
        fast = _blocking_pipeline(stage, np.array([micro]), np.array([T]), deepspeed=True)[0]
        assert fast == pytest.approx(_stages_step_s(forward, backward, micro, T), rel=0.01)


def test_fast_path_agrees_with_graph_on_deepspeed_plans():
    plans = []
    for i, (tp, pp, zero, sp) in enumerate(itertools.product([1, 2, 8], [1, 2, 4], [0, 1], [False, True])):
        if sp and tp == 1:
            continue
        plan = plan_of(tp, pp, 1, "1f1b", zero, sequence_parallel=sp, pipeline_p2p="deepspeed")
        plan["recompute"] = ("none", "selective", "full")[i % 3]
        plan["global_batch_size"] = (64, 256)[i // 3 % 2]
        plan["overlap_grad_reduce"] = plan["overlap_param_gather"] = False
        plans.append(plan)
    valid, rel = fast_vs_graph("gpt3-1.3b", {"preset": "dgx-a100", "num_nodes": 4}, plans)
    assert len(valid) == 30 and rel.max() < 0.01  # measured: 30 plans, worst 2e-14


def test_a_mixture_of_experts_pipeline_sends_whole_activations_under_tensor_parallelism():
    # Megatron-DeepSpeed's MoE runs the pipe engine with pipe_partitioned and grad_partitioned off. MODEL's
    # activation S is 4,096 bytes; a dense stage over tp 2 sends half of it with a 72-byte header. The MoE
    # stage (sequence parallel, as a mixture of experts under tp needs: each rank holds S / 2 = 2,048 bytes)
    # sends those 2,048 bytes whole, no header, no all-gather, no partition copy; the receiver clones them twice
    import json

    from itercast.search.launch_settings import launch_settings
    from itercast.workloads.transformer import p2p_message_bytes, partition_header_bytes, pipe_copy_bytes

    dense = job("deepspeed", 2, 2, tp=2, layers=2)
    plan = {**dense.plan.model_dump(), "sequence_parallel": True}
    moe_model = {**MODEL, "num_layers": 2, "num_experts": 2, "moe_top_k": 1}
    moe = Job.from_dicts(moe_model, plan, dense.system.model_dump())
    assert (p2p_message_bytes(dense), partition_header_bytes(dense)) == (2048, 72)
    assert (p2p_message_bytes(moe), partition_header_bytes(moe)) == (2048, 0)
    assert pipe_copy_bytes(moe) == {"receive": [4096]}
    graph = predict(moe, linear_calibration()).sim.graph
    names = {graph.names[graph.name[t]] for t in range(graph.num_tasks)}
    assert "pipe_copy.receive.F0" in names
    assert not any(n.startswith(("pipe_all_gather", "pipe_copy.partition", "pipe_copy.gather")) for n in names)
    # its launch settings switch the partitioning off; a dense model's keep DeepSpeed's default
    for j, pipeline in ((moe, {"pipe_partitioned": False, "grad_partitioned": False}), (dense, None)):
        text = launch_settings("deepspeed", j.plan.model_dump(), j.model)
        assert json.loads(text.split("# ds_config.json\n")[1].split("\n# Megatron")[0]).get("pipeline") == pipeline


def test_a_deepspeed_job_left_with_megatrons_asynchronous_all_reduce_is_told_so():
    # Megatron-DeepSpeed turns the asynchronous input-gradient all-reduce off under DeepSpeed: a DeepSpeed job whose
    # plan keeps it on is priced beside the wgrad, and the note names the field that prices it as DeepSpeed runs it
    left = tiny_job(tensor_parallel=2, pipeline_parallel=2, pipeline_p2p="deepspeed", global_batch_size=8).plan
    note = tp_allreduce_note(left)
    assert note is not None and "plan.tp_allreduce_overlap=false" in note
    assert tp_allreduce_note(left.model_copy(update={"tp_allreduce_overlap": False})) is None
    assert tp_allreduce_note(left.model_copy(update={"sequence_parallel": True})) is None  # its reduce-scatter: async
    assert tp_allreduce_note(left.model_copy(update={"tensor_parallel": 1})) is None
    assert tp_allreduce_note(left.model_copy(update={"pipeline_p2p": "megatron"})) is None  # Megatron-LM's own
