"""Megatron-Core's pipeline exchanges (plan.pipeline_p2p = megatron) computed by hand: under 1F1B every
exchange blocks both stages' compute streams, a send batched with the receive from the same neighbour.

Sources (NVIDIA/Megatron-LM d98e8a64, the same at core_r0.8.0): megatron/core/pipeline_parallel/schedules.py
forward_backward_pipelining_without_interleaving (warm-up recv_forward / send_forward, steady
send_forward_recv_backward / send_backward_recv_forward, cool-down recv_backward / send_backward);
p2p_communication.py _communicate (batch_isend_irecv, req.wait()); megatron/training/arguments.py
(overlap_p2p_comm forced off without interleaving; batch_p2p_comm = not overlap_p2p_comm).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import fast_vs_graph, pipeline_builder, plan_of
from test_deepspeed_pipeline import B, F, T, _stages_step_s, job, step_s
from test_golden import MODEL, SYSTEM

from itercast.config.job import Job, parse_section
from itercast.costs.analytic import AnalyticCostModel
from itercast.errors import ConfigError
from itercast.predict import simulate_transformer_step
from itercast.search.fast_estimate import _blocking_interleaved, _blocking_pipeline
from itercast.search.frameworks import FRAMEWORKS
from itercast.search.launch_settings import launch_settings
from itercast.search.plan_space import SpaceOptions, enumerate_plans
from itercast.sim.engine import simulate
from itercast.workloads.transformer import Groups, p2p_message_bytes


def test_two_stages_two_micro_batches_by_hand():
    # Stage 0 (1 warm-up forward): F0 | send act0 | F1 | send act1 + recv grad0 | B0 | recv grad1 | B1
    # Stage 1 (none):    recv act0 | F0 | B0 | send grad0 + recv act1 | F1 | B1 | send grad1
    # F0 ends at F; "act0" at F + T; stage 1 runs F0, B0 to 2F + B + T while stage 0 runs F1 and waits;
    # the batched pair meets then, 2F + B + 2T; stage 1 runs F1, B1 to 3F + 2B + 2T, "grad1" 3F + 2B + 3T;
    # stage 0's B1 ends 3F + 3B + 3T. Overlapped sends: 3F + 3B + 2T; DeepSpeed's apart: 3F + 3B + 4T.
    assert step_s("megatron", 2, 2) == pytest.approx(3 * F + 3 * B + 3 * T)  # 9.75
    assert step_s("overlapped", 2, 2) == pytest.approx(3 * F + 3 * B + 2 * T)  # 9.5
    assert step_s("deepspeed", 2, 2) == pytest.approx(3 * F + 3 * B + 4 * T)  # 10.0


def test_one_micro_batch_sends_alone():
    # M = 1 on 2 stages: stage 0 has no steady state (warm-up F0, send act0; cool-down recv grad0, B0),
    # so nothing is batched: F, T, F + B on stage 1, T, B = 2F + 2B + 2T
    assert step_s("megatron", 2, 1) == pytest.approx(2 * F + 2 * B + 2 * T)  # 6.5


def test_steady_state_pays_one_exchange_per_micro_batch_at_the_ends_two_between():
    # 2 stages: one batched exchange per micro-batch on each: (M + 1)(F + B) + (M + 1) T
    for micro in (4, 8):
        assert step_s("megatron", 2, micro) == pytest.approx((micro + 1) * (F + B) + (micro + 1) * T)
    # 4 stages, 8 micro-batches: an inner stage's F, exchange, B, exchange: (8 + 3)(F + B) + (2·8 + 2·4 − 5) T
    assert step_s("megatron", 4, 8) == pytest.approx(11 * (F + B) + 19 * T)  # 37.75


def test_exchanges_run_on_the_compute_stream_batched():
    g = pipeline_builder(job("megatron", 2, 2), F, B, T).build()
    names = {g.names[g.name[t]]: g.kinds[g.resource_kind[g.resource[t]]] for t in range(g.num_tasks)}
    assert names["send_act.m1+recv_grad.m0.c0"] == "compute"  # stage 0 after F1
    assert names["send_grad.m0+recv_act.m1.c0"] == "compute"  # stage 1 after B0
    assert "send_act.m0.c0" in names and "recv_grad.m1.c0" in names  # warm-up / cool-down alone


def test_interleaved_sends_stay_overlapped():
    # overlap_p2p_comm, as every Megatron launcher sets it with VP > 1: the overlapped graph's step
    def interleaved(mode: str) -> float:
        j = Job.from_dicts(
            {**MODEL, "num_layers": 4},
            dict(
                pipeline_parallel=2,
                virtual_pipeline=2,
                schedule="interleaved-1f1b",
                data_parallel=1,
                micro_batch_size=1,
                global_batch_size=4,
                pipeline_p2p=mode,
            ),
            {**SYSTEM, "node": {**SYSTEM["node"], "gpus_per_node": 2}, "num_nodes": 1},
        )
        return simulate(pipeline_builder(j, F, B, T).build()).step_time_s

    assert interleaved("megatron") == interleaved("overlapped")


def interleaved_job(overlap: bool, stages: int = 2, micro: int = 2, chunks: int = 2, **plan: object) -> Job:
    """MODEL with one layer a chunk, `chunks` chunks a stage, `micro` micro-batches, Megatron's exchanges."""
    fields = dict(
        pipeline_parallel=stages,
        virtual_pipeline=chunks,
        schedule="interleaved-1f1b",
        data_parallel=1,
        micro_batch_size=1,
        global_batch_size=micro,
        pipeline_p2p="megatron",
        overlap_p2p_comm=overlap,
    )
    system = {**SYSTEM, "node": {**SYSTEM["node"], "gpus_per_node": stages}, "num_nodes": 1}
    return Job.from_dicts({**MODEL, "num_layers": chunks * stages}, fields | plan, system)


def test_interleaved_exchanges_without_overlap_by_hand():
    # overlap_p2p_comm false (Megatron-LM before 2023-10; it interleaves more than 2 stages only): 3 stages × 2 chunks
    # (virtual stages v0 v1 v2 on GPUs 0 1 2, v3 v4 v5 on 0 1 2), 3 micro-batches; a chunk's forward f = F/2, backward
    # b = B/2, each message T. Megatron's warm-up, (p − s − 1)·2 + (v − 1)·p forwards: GPU 0 all 6 (then 6
    # backwards), GPU 1 five (one steady pair, five backwards), GPU 2 three (then its three pairs F, B of v5 and
    # three backwards of v2). Each exchange point meets its peers' (NCCL: a send ends once its receive is posted)
    # and the compute stream waits for all its messages. The longest chain:
    #   v0 m0 on GPU 0, v1 m0 on GPU 1, then GPU 2's warm-up v2 m0, m1, m2, each forward followed by
    #   an exchange (GPU 2's next input leaves GPU 1 at the same point) ......... 5f + 5T
    #   GPU 2's three steady pairs, an exchange after each (v4's next output) ....... 3 (f + b) + 3T
    #   GPU 2's three backwards of v2, each sending its gradient to GPU 1 ............ 3b + 3T
    #   m2's backward of v1 on GPU 1, its gradient to GPU 0, m2's of v0 ............. 2b + T
    # in all 8f + 8b + 12T; with overlapped sends it is shorter
    f, b = F / 2, B / 2
    blocking = simulate(pipeline_builder(interleaved_job(False, 3, 3), F, B, T).build()).step_time_s
    assert blocking == pytest.approx(8 * f + 8 * b + 12 * T)  # 15.0
    overlapped = simulate(pipeline_builder(interleaved_job(True, 3, 3), F, B, T).build()).step_time_s
    assert overlapped < blocking


def test_interleaved_exchanges_without_overlap_synchronise_at_every_point():
    g = pipeline_builder(interleaved_job(False, 3, 3), F, B, T).build()
    rank, kind = g.resource_rank[g.resource], np.array(g.kinds, dtype=object)[g.resource_kind[g.resource]]
    names = np.array(g.names, dtype=object)[g.name]
    syncs = names == "cuda_synchronize"
    # GPU 0: after each of its 12 passes (its first forward receives nothing: no recv_forward); GPU 1: before its
    # first forward, after its 5 warm-up forwards, its pair and its 5 cool-down backwards; GPU 2: 1 + 3 + 3 + 3
    assert [int((syncs & (rank == s)).sum()) for s in range(3)] == [12, 12, 10]
    # every message on streams of its own, each end a collective member; the compute stream waits, priced 0 s
    ends = {end: np.array([str(n).startswith(end) for n in names]) for end in ("send_", "recv_")}
    assert int((ends["send_"] | ends["recv_"]).sum()) == 2 * 30  # (6 − 1) hops × 3 micro-batches each way, two ends
    # an activation leaves for the next GPU and arrives from the previous one, a gradient the other way round
    for end, stream in (("send_act", "p2p_next"), ("recv_act", "p2p_prev_recv"), ("send_grad", "p2p_prev")):
        assert set(kind[np.char.startswith(names.astype(str), end)]) == {stream}
    assert set(kind[np.char.startswith(names.astype(str), "recv_grad")]) == {"p2p_next_recv"}
    waits = np.array([str(n).startswith("p2p_wait") for n in names])
    assert set(kind[waits]) == {"compute"} and not g.duration_s[waits].any()
    # with 6 micro-batches GPU 0 has steady pairs too (7 warm-up forwards of its 12), whose forward of the first
    # chunk goes to GPU 1: every message still leaves once and arrives once, (6 − 1) virtual hops × 6 micro-batches
    # each way
    g6 = pipeline_builder(interleaved_job(False, 3, 6), F, B, T).build()
    names6 = np.array(g6.names, dtype=str)[g6.name]
    assert int(np.char.startswith(names6, "send_").sum()) == int(np.char.startswith(names6, "recv_").sum()) == 60


def test_blocking_interleaving_needs_more_than_two_stages():
    # Megatron-LM's arguments.py, 2021 (de7dc40f) to today (d98e8a64): a point's batch would exchange twice with
    # the same rank; the overlapped schedule runs on 2 stages
    with pytest.raises(ConfigError, match=r"more than 2 pipeline stages only .* got pipeline_parallel 2"):
        interleaved_job(False)
    assert interleaved_job(True).plan.pipeline_parallel == 2
    # the search's space holds the same rule: gpt3-1.3b's 24 layers interleave over 2 (vp 2, 3), 4 (2, 3) or 8 (3)
    # stages on 8 GPUs; blocking, over 4 and 8 only
    model = parse_section("model", {"preset": "gpt3-1.3b"})
    system = parse_section("system", {"preset": "dgx-a100", "num_nodes": 1})
    base = parse_section("plan", {"global_batch_size": 64, "pipeline_p2p": "megatron", "overlap_p2p_comm": False})
    options = SpaceOptions(micro_batch_sizes=(1,), max_virtual_pipeline=3)
    table, _ = enumerate_plans(model, system, base, 8, options)  # type: ignore[arg-type]
    stages = {p["pipeline_parallel"] for p in map(table.plan_fields, range(len(table))) if p["virtual_pipeline"] > 1}
    assert stages == {4, 8}


def test_overlap_p2p_comm_changes_nothing_under_1f1b():
    # Megatron-LM forces it off without interleaving: 1F1B's exchanges always block
    def one_f_one_b(overlap: bool) -> float:
        j = interleaved_job(overlap, virtual_pipeline=1, schedule="1f1b")
        return simulate(pipeline_builder(j, F, B, T).build()).step_time_s

    assert one_f_one_b(False) == one_f_one_b(True) == step_s("megatron", 2, 2)


def test_interleaved_exchanges_without_overlap_gather_what_came_scattered():
    # Megatron-LM of 2021 (p2p_scatter_gather): each received tensor all-gathered after the point's synchronize,
    # as many as with overlap: every chunk's input but the first virtual stage's forwards and the last one's
    # backwards, 8 micro-batches on 4 GPUs × 2 chunks
    plan = {"tensor_parallel": 8, "pipeline_parallel": 4, "global_batch_size": 8, "pipeline_p2p": "megatron"}
    plan |= {"schedule": "interleaved-1f1b", "virtual_pipeline": 2, "p2p_scatter_gather": True}
    j = Job.from_presets("gpt3-1.3b", "dgx-a100", 4, plan | {"overlap_p2p_comm": False})
    g = simulate_transformer_step(j)[0].graph
    names, rank = np.array(g.names, dtype=str)[g.name], g.resource_rank[g.resource]
    gathers = np.char.startswith(names, "pipe_all_gather")
    assert [int((gathers & (rank == s)).sum()) for s in range(4)] == [24, 32, 32, 24]


def test_overlap_p2p_comm_false_is_megatrons():
    with pytest.raises(ConfigError, match=r"overlap_p2p_comm is Megatron's switch .* got false with pipeline_p2p"):
        Job.from_dicts(MODEL | {"num_layers": 4}, {"pipeline_parallel": 2, "overlap_p2p_comm": False}, SYSTEM)


def test_fast_path_blocking_interleaved_by_hand():
    # the by-hand graph above: stage seconds a micro-batch S = 2 chunks × (f + b) = F + B = 3 on both stages, M = 2,
    # v = 2, p = 2: M·S + (ΣS − max S)/v = 6 + 1.5 = 7.5 (= 5f + 5b), exchanges v(M + p) + p − 3 = 7: 7.5 + 7T = 9.25
    stage = np.array([[F + B, F + B]])
    assert _blocking_interleaved(stage, np.array([2]), 2, np.array([T]))[0] == pytest.approx(9.25)
    # 3 stages × 3 chunks, M = 6, a chunk's f = 1/3, b = 2/3: passes 6·3 + 2·3/3 = 20, exchanges 3·9 + 0 = 27
    stage = np.full((1, 3), F + B)
    assert _blocking_interleaved(stage, np.array([6]), 3, np.array([T]))[0] == pytest.approx(20 + 27 * T)  # 26.75


def test_fast_path_blocking_interleaved_agrees_with_the_graph():
    # uniform stages (pipeline_builder: each chunk pass F/v and B/v, each message T): exact for every p, v and M
    for stages, chunks, groups in itertools.product((3, 4, 5), (2, 3), (1, 2, 3)):
        micro = stages * groups  # Megatron's interleaved schedule takes micro-batches in multiples of the stages
        job = interleaved_job(False, stages, micro, chunks)
        graph = simulate(pipeline_builder(job, F, B, T).build()).step_time_s
        fast = _blocking_interleaved(np.full((1, stages), F + B), np.array([micro]), chunks, np.array([T]))[0]
        assert fast == pytest.approx(graph)
    # priced plans (host synchronisation, embedding and head, sequence parallel or scatter-gather): measured worst
    # 0.52% over 40 plans of tp 1-4, pp 3-4, vp 2-4, ZeRO 0-1 on 48 GPUs; eight of them here
    plans = []
    for i, (tp, (pp, vp)) in enumerate(itertools.product([1, 4], [(3, 2), (3, 4), (4, 2), (4, 3)])):
        fields = {"sequence_parallel": tp > 1, "overlap_p2p_comm": False, "pipeline_p2p": "megatron"}
        plan = plan_of(tp, pp, 1, "interleaved-1f1b", i % 2, **fields) | {"virtual_pipeline": vp}
        plan |= {"global_batch_size": (96, 192)[i % 2], "overlap_grad_reduce": False, "overlap_param_gather": False}
        plans.append(plan)
    valid, rel = fast_vs_graph("gpt3-1.3b", {"preset": "dgx-a100", "num_nodes": 6}, plans)
    assert len(valid) == 8 and rel.max() < 0.01


def test_megatron_exchanges_refuse_gpipe():
    with pytest.raises(ConfigError, match=r"pipeline_p2p\(megatron\) runs Megatron-Core's schedules"):
        plan = {"pipeline_parallel": 2, "pipeline_p2p": "megatron", "schedule": "gpipe"}
        Job.from_dicts(MODEL | {"num_layers": 2}, plan, {**SYSTEM, "num_nodes": 1})


def test_megatron_frameworks_price_its_exchanges_and_nemo_names_the_switches():
    assert FRAMEWORKS["megatron-core"].plan_fields["pipeline_p2p"] == "megatron"
    assert FRAMEWORKS["nemo"].plan_fields["pipeline_p2p"] == "megatron"
    model = Job.from_dicts(MODEL | {"num_layers": 4}, {}, {**SYSTEM, "num_nodes": 1}).model
    base = Job.from_dicts(MODEL | {"num_layers": 4}, {}, {**SYSTEM, "num_nodes": 1}).plan.model_dump()
    flat = base | {"pipeline_parallel": 2}
    settings = launch_settings("nemo", flat, model)
    assert "overlap_p2p_comm=False" in settings and "batch_p2p_comm=True" in settings
    settings = launch_settings("nemo", flat | {"virtual_pipeline": 2}, model)
    assert "overlap_p2p_comm=True" in settings and "batch_p2p_comm=False" in settings
    assert "p2p" not in launch_settings("nemo", base, model)  # no pipeline, no switch
    # Megatron-LM: overlap is on by default with interleaving and forced off without: no flag either way, but to
    # interleave with blocking exchanges (arguments.py --no-overlap-p2p-communication)
    assert "p2p" not in launch_settings("megatron-core", flat | {"virtual_pipeline": 2}, model)
    blocking = flat | {"pipeline_parallel": 4, "virtual_pipeline": 2, "overlap_p2p_comm": False}
    assert "--no-overlap-p2p-communication" in launch_settings("megatron-core", blocking, model)
    settings = launch_settings("nemo", blocking, model)
    assert "overlap_p2p_comm=False" in settings and "batch_p2p_comm=True" in settings


def test_fast_path_blocking_pipeline_agrees_with_the_graph():
    # uniform stages: exact for any M, (M + p − 1)(F + B) + (2M + 2p − 5) T beyond 2 stages
    for stages, micro in itertools.product((2, 3, 4, 8), (1, 2, 3, 8, 32)):
        stage = np.full((1, stages), F + B)
        fast = _blocking_pipeline(stage, np.array([micro]), np.array([T]), deepspeed=False)[0]
        assert fast == pytest.approx(step_s("megatron", stages, micro))
    # an embedding on the first stage and a head on the last
    for stages, micro, head in itertools.product((2, 3, 4, 8), (1, 2, 8, 32), (0.0, 0.2, 0.6)):
        forward = [F + 0.05] + [F] * (stages - 1)
        backward = [B + 0.04] + [B] * (stages - 1)
        forward[-1] += head
        backward[-1] += 2 * head
        stage = np.array([forward]) + np.array([backward])
        fast = _blocking_pipeline(stage, np.array([micro]), np.array([T]), deepspeed=False)[0]
        assert fast == pytest.approx(_stages_step_s(forward, backward, micro, T, "megatron"), rel=0.01)


def test_fast_path_agrees_with_graph_on_megatron_plans():
    # sequence parallel wherever tp > 1, or without it Megatron-LM's scatter-gather (an all-gather before each pass
    # that received, hiding a synchronised pass's first launch: _host_synced); one table per switch
    for scatter, count in ((False, 24), (True, 16)):
        plans = []
        tps = [2, 8] if scatter else [1, 2, 8]
        for i, (tp, pp, vp, zero) in enumerate(itertools.product(tps, [2, 4], [1, 2], [0, 1])):
            schedule = "interleaved-1f1b" if vp > 1 else "1f1b"
            fields = {"sequence_parallel": tp > 1 and not scatter, "p2p_scatter_gather": scatter}
            plan = plan_of(tp, pp, 1, schedule, zero, pipeline_p2p="megatron", **fields)
            plan["global_batch_size"] = (64, 256)[i % 2]
            plan["overlap_grad_reduce"] = plan["overlap_param_gather"] = False
            plans.append(plan)
        valid, rel = fast_vs_graph("gpt3-1.3b", {"preset": "dgx-a100", "num_nodes": 4}, plans)
        blocking = np.array([j.plan.virtual_pipeline == 1 for j in valid])
        # blocking 1F1B: the stages' formula, measured worst 2e-14 (scattered 2e-15); interleaved: the overlapped
        # fast path's tolerance (tests/test_fast_estimate.py), measured worst 1.2% (scattered 0.39%)
        assert len(valid) == count and rel[blocking].max() < 1e-9 and rel[~blocking].max() < 0.02


def test_megatron_lm_of_2021_scatters_its_sends_and_gathers_them_on_arrival():
    # p2p_communication.py at 50a4b5fa: without sequence parallelism each GPU sends 1/tp of [s, b, h] and the
    # receiver all-gathers it over its tensor-parallel group after the exchange: the forward input on every stage
    # but the first, the gradient on every stage but the last, per micro-batch and model chunk
    def built(**extra) -> tuple[Job, np.ndarray, np.ndarray, np.ndarray]:
        plan = {"tensor_parallel": 8, "pipeline_parallel": 4, "global_batch_size": 8, "pipeline_p2p": "megatron"}
        j = Job.from_presets("gpt3-1.3b", "dgx-a100", 4, plan | extra)
        g = simulate_transformer_step(j)[0].graph
        names = np.array(g.names, dtype=str)[g.name]
        return j, names, g.resource_rank[g.resource], g.duration_s

    j, names, rank, seconds = built(p2p_scatter_gather=True)
    S = 1 * 2048 * 2048 * 2  # micro-batch × sequence × hidden × 2 bytes
    assert p2p_message_bytes(j) == S / 8
    gathers = np.char.startswith(names, "pipe_all_gather")
    assert [int((gathers & (rank == s)).sum()) for s in range(4)] == [8, 16, 16, 8]  # 8 micro-batches
    # interleaved, 2 chunks a stage: stage 0's first chunk and stage 3's last receive one way only
    _, names_v, rank_v, _ = built(p2p_scatter_gather=True, schedule="interleaved-1f1b", virtual_pipeline=2)
    gathers_v = np.char.startswith(names_v, "pipe_all_gather")
    assert [int((gathers_v & (rank_v == s)).sum()) for s in range(4)] == [24, 32, 32, 24]
    # each is one all-gather of the whole output over the node's 8 GPUs
    expected = AnalyticCostModel(j.system, "bf16").collective_s("all_gather", S, Groups.of(j).tp)
    assert np.allclose(seconds[gathers], expected)
    # no effect under sequence parallelism (sends 1/tp already, nothing to gather), nor at tp 1
    for extra, sent in (({"sequence_parallel": True}, S / 8), ({"tensor_parallel": 1}, S)):
        on, names_on, _, _ = built(p2p_scatter_gather=True, **extra)
        off = built(**extra)[0]
        assert not np.char.startswith(names_on, "pipe_all_gather").any()
        assert p2p_message_bytes(on) == p2p_message_bytes(off) == sent
    # Megatron-LM's exchange only
    with pytest.raises(ConfigError, match="needs pipeline_p2p megatron"):
        Job.from_presets("gpt3-1.3b", "dgx-a100", 4, {"pipeline_parallel": 2, "p2p_scatter_gather": True})
