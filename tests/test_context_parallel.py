"""Context parallelism as each implementation runs it (plan.cp_comm, workloads/transformer_ops.py
`_cp_attention`, `_cp_merge`, `_cp_exchange`, `_cp_backward`): the kernel calls, the merge kernels'
bytes, the exchanges and what of them is exposed, all by hand on test_golden's linear calibration;
the fast path against the graph; the frameworks' choices; the memory.

The hand job: test_golden's one-layer GPT (4 heads of 16, 32 tokens, bf16: e = 2) with 2 key-value
groups, cp 4 on one node: 8 local tokens. Its output O and query Q hold 4 · 8 · 16 = 512 elements;
the K, V Transformer Engine passes 8 · 2 groups · 2 · 16 = 512, PyTorch's (torchtitan repeats the
groups to the 4 query heads before SDPA) 8 · 4 · 2 · 16 = 1,024.
"""

from __future__ import annotations

import pytest
from helpers import fast_vs_graph, plan_of, searched_top_plan
from test_golden import LINK, PEAK, linear_calibration
from test_step_by_hand import job
from typer.testing import CliRunner

from itercast.cli import app
from itercast.costs.analytic import AnalyticCostModel
from itercast.memory import estimate_memory
from itercast.search.launch_settings import launch_settings
from itercast.workloads.transformer import Groups, PassCost, pass_cost
from itercast.workloads.transformer_ops import layer_backward, layer_forward

CP_COMMS = ("p2p", "all_gather", "torch_allgather", "torch_alltoall")
#: causal attention FLOPs of one rank: 4 heads × 8 queries × 32 keys × 4·16 FLOPs, half kept
ATTENTION_FLOPS = 4 * 8 * 32 * 4 * 16 / 2  # = 32,768
FLASH_RATE = 0.75 * PEAK  # fused attention on a GPU without a fitted kernel (costs/analytic.py)


def cp_job(cp_comm: str, cp: int = 4):
    return job({"num_query_groups": 2}, context_parallel=cp, cp_comm=cp_comm)


def passes(cp_comm: str) -> tuple[PassCost, PassCost]:
    j = cp_job(cp_comm)
    costs, groups = AnalyticCostModel(j.system, "bf16", linear_calibration()), Groups.of(j)
    return pass_cost(layer_forward(j.model, j.plan), costs, groups), pass_cost(
        layer_backward(j.model, j.plan), costs, groups
    )


@pytest.mark.parametrize(
    ("cp_comm", "names"),
    [
        ("p2p", ["core_attention", "core_attention.ring", "core_attention.merge", "cp_kv_exchange"]),
        ("torch_alltoall", ["core_attention", "core_attention.ring", "core_attention.merge", "cp_kv_exchange"]),
        ("torch_allgather", ["core_attention", "core_attention.ring", "core_attention.merge", "cp_kv_all_gather"]),
        ("all_gather", ["core_attention", "core_attention.merge", "cp_kv_all_gather"]),
    ],
)
def test_each_implementation_calls_its_kernels_and_exchanges(cp_comm, names):
    j = cp_job(cp_comm)
    ops = [o for o in layer_forward(j.model, j.plan) if o.name.startswith(("core_attention", "cp_"))]
    assert [o.name for o in ops] == names
    calls = [o for o in ops if o.family == "attention"]
    if cp_comm == "all_gather":  # one call per local query chunk, both causal (bottom-right)
        assert [(o.amount, o.attention.causal, o.attention.calls) for o in calls] == [(ATTENTION_FLOPS, True, 2)]
    else:  # the diagonal step causal, the c − 1 = 3 later steps not: 32,768 / 4 = 8,192 FLOPs each
        assert [(o.amount, o.attention.causal, o.attention.calls) for o in calls] == [
            (8192, True, 1),
            (3 * 8192, False, 3),
        ]


def merge_of(cp_comm: str) -> tuple[float, int, float, int]:
    j = cp_job(cp_comm)
    (op,) = [o for o in layer_forward(j.model, j.plan) if o.name == "core_attention.merge"]
    return op.amount, op.count, op.backward_amount, op.backward_count


def test_transformer_engine_ring_merges_on_the_last_rank_by_hand():
    # c 4, e 2, O = Q = KV = 512. Forward: torch.cat of K, V 2e·KV = 2,048; out_correction_init 2e·O
    # and 3 out_corrections 3e·O: (4 + 18)·512 = 11,264; kernels 1 + 4 lse + 4 out = 9.
    # Backward: K, V copied 2,048; dq 2e + 3 · 3e: 22 · 512 = 11,264; dk, dv e + 1.5e·(c − 2) + 3e =
    # 2 + 6 + 6 = 14 · 512 = 7,168; kernels 1 + 4 dq + 8 dk, dv = 13
    assert merge_of("p2p") == (2048 + 11264, 9, 2048 + 11264 + 7168, 13)


def test_transformer_engine_all_gather_copies_by_hand():
    # Forward: index_select of the gathered K, V 2e·c·KV = 4 · 4 · 512 = 8,192, output copies 2e·O =
    # 2,048; 4 kernels. Backward: zero-fill e·c = 8, index_select 2e·c = 16, dk/dv adds 3e·(c + ½) =
    # 27, index_select back 16: 67 · 512 = 34,304, dq copies 2e·Q = 2,048; 2 + 2 + 2 + 4 + 2 = 12 kernels
    assert merge_of("all_gather") == (8192 + 2048, 4, 34304 + 2048, 12)


@pytest.mark.parametrize("cp_comm", ["torch_allgather", "torch_alltoall"])
def test_pytorch_fp32_merges_by_hand(cp_comm):
    # KV = 1,024. Forward: contiguous K, V 2e·KV = 4,096; 4 casts to fp32 (e + 4)·O = 6 · 4 · 512 =
    # 12,288; 3 merges of 12 + 8 + 12 = 32 B: 96 · 512 = 49,152; 3 torch.cat 2e·KV = 12,288; the
    # cast back 6 · 512 = 3,072: 80,896 bytes; kernels 2 + 4 + 3 · 8 + 3 + 1 = 34.
    # Backward Q: zeros 4, 4 adds of 8 + e = 40, cast back 6: 50 · 512 = 25,600. KV: zeros 4,
    # contiguous 2e = 4, 3 cats 2e = 12, step 0's add 10, 3 partial adds (5) and cats (8) = 39, 4 fp32
    # cats 8 = 32, cast back 6: 107 · 1,024 = 109,568. Kernels 3 + 2 + 3 + 2 + 3 · 4 + 4 + 4 + 2 = 32
    assert merge_of(cp_comm) == (80896, 34, 25600 + 109568, 32)


def test_the_ring_sends_keys_and_values_and_backward_their_gradients_with_them():
    # Transformer Engine: 3 forward sends of KV · e = 512 · 2 = 1,024 bytes; backward c = 4 sends,
    # 2(c − 1) · 1,024 = 6,144 bytes in all: 1,536 each
    j = cp_job("p2p")
    fwd = {o.name: o for o in layer_forward(j.model, j.plan)}["cp_kv_exchange"]
    bwd = {o.name: o for o in layer_backward(j.model, j.plan)}["cp_kv_exchange.bwd"]
    assert (fwd.amount, fwd.count, bwd.amount, bwd.count) == (1024, 3, 1536, 4)


def test_transformer_engine_all_gather_is_exposed_whole():
    # c · 1,024 = 4,096 bytes of K, V gathered as two all-gathers of 2,048: bus 3/4 · 2,048 = 1,536
    # each; backward the same two again and two reduce-scatters of the gradients
    fwd, bwd = passes("all_gather")
    assert fwd.family_s["cp_all_gather"] == pytest.approx(2 * 1536 / LINK)
    assert bwd.family_s["cp_all_gather"] == pytest.approx(2 * 1536 / LINK)
    assert bwd.family_s["cp_reduce_scatter"] == pytest.approx(2 * 1536 / LINK)
    assert "cp_p2p_exposed" not in fwd.family_s | bwd.family_s


def test_pytorch_all_gather_hides_behind_the_diagonal_call_and_its_last_gradient_send_does_not():
    # the all-gather of c · 2,048 = 8,192 bytes (bus 3/4: 6,144) runs beside the diagonal call only:
    # 8,192 FLOPs forward, 2.5× backward, at 0.75 of the peak
    fwd, bwd = passes("torch_allgather")
    diagonal_s = 8192 / FLASH_RATE
    assert fwd.family_s["cp_all_gather"] == pytest.approx(6144 / LINK - diagonal_s)
    assert bwd.family_s["cp_all_gather"] == pytest.approx(6144 / LINK - 2.5 * diagonal_s)
    # the fp32 key/value gradients, 1,024 · 4 = 4,096 bytes, sent after each of the 4 steps: 3 beside
    # the next step's call (a ring the 2.5 · 32,768 backward FLOPs cannot hide), the last waited at once
    assert bwd.family_s["cp_send"] == pytest.approx(4096 / LINK)
    assert bwd.family_s["cp_p2p_exposed"] == pytest.approx(3 * 4096 / LINK - 2.5 * ATTENTION_FLOPS / FLASH_RATE)


def test_pytorch_all_to_all_passes_a_ring_both_ways():
    # forward 3 sends of 2,048 bytes; backward the K, V ring again (3 × 2,048) and the gradients' (3 × 4,096)
    fwd, bwd = passes("torch_alltoall")
    assert fwd.family_s["cp_p2p_exposed"] == pytest.approx(3 * 2048 / LINK - ATTENTION_FLOPS / FLASH_RATE)
    ring_s = 3 * 2048 / LINK + 3 * 4096 / LINK
    assert bwd.family_s["cp_p2p_exposed"] == pytest.approx(ring_s - 2.5 * ATTENTION_FLOPS / FLASH_RATE)
    assert bwd.family_s["cp_send"] == pytest.approx(4096 / LINK)


def test_memory_is_the_same_whatever_the_exchange():
    # every implementation saves the local q, k, v (TE p2p: the last step's K, V, as large) and the
    # output for backward (ctx.save_for_backward); their transient buffers are not modelled
    estimates = {estimate_memory(cp_job(c)).total_bytes for c in CP_COMMS}
    assert len(estimates) == 1


@pytest.mark.parametrize("cp_comm", CP_COMMS)
def test_fast_path_agrees_with_graph_on_context_parallel_plans(cp_comm):
    plans = [
        plan_of(tp, pp, cp, "1f1b", 1, cp_comm=cp_comm, sequence_parallel=tp > 1, flash_attention=True)
        for tp in (1, 2)
        for pp in (1, 2)
        for cp in (2, 4)
    ]
    valid, rel = fast_vs_graph("gpt3-1.3b", {"preset": "dgx-h100", "num_nodes": 2}, plans)
    # measured at s = 0.189 (the presets' contention): worst 1.28% (p2p) to 1.64% (torch_allgather)
    assert len(valid) == 8 and rel.max() < 0.02


def test_launch_settings_name_the_exchange():
    from test_frameworks import GPT3, PLAN

    cp = {**PLAN, "context_parallel": 2, "data_parallel": PLAN["data_parallel"] // 2}
    assert "--cp-comm-type all_gather" in launch_settings("megatron-core", {**cp, "cp_comm": "all_gather"}, GPT3)  # type: ignore[arg-type]
    assert "model.config.cp_comm_type=p2p" in launch_settings("nemo", {**cp, "cp_comm": "p2p"}, GPT3)  # type: ignore[arg-type]
    titan = launch_settings("torchtitan", {**cp, "zero_stage": 3, "cp_comm": "torch_alltoall"}, GPT3)  # type: ignore[arg-type]
    assert 'context_parallel_rotate_method = "alltoall"' in titan


@pytest.mark.parametrize(
    ("framework", "cp_comm", "runs"),
    [
        ("torchtitan", "p2p", "torch_allgather or torch_alltoall"),
        ("megatron-core", "torch_allgather", "p2p or all_gather"),
    ],
)
def test_an_exchange_the_framework_cannot_run_is_a_one_line_error(framework, cp_comm, runs):
    args = ["search", "--example", "--framework", framework, "--set", f"plan.cp_comm={cp_comm}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and f"plan.cp_comm: {framework} runs {runs}, the job sets {cp_comm}" in result.output


@pytest.mark.parametrize(("framework", "cp_comm"), [("torchtitan", "torch_allgather"), ("nemo", "p2p")])
def test_the_search_prices_the_exchange_its_framework_runs(framework, cp_comm):
    assert searched_top_plan(framework)["cp_comm"] == cp_comm


def test_each_ring_call_pays_the_kernel_latency():
    # test_attention_kernels' round fit, cp 4: the 3 ring calls' backward, 2.5 × 3 · 8,192 = 61,440 FLOPs
    # on 3 × 4 problems, ramp 1/2 (gamma 0), eff 0.5 · 1 · 1/2 = 0.25 without a mask, + 3 × 1 µs
    from test_attention_kernels import hand_costs, hand_job

    j = hand_job(context_parallel=4)
    (ring,) = [o for o in layer_backward(j.model, j.plan) if o.name == "core_attention.ring.bwd"]
    assert float(hand_costs(j).attention_s(ring.amount, ring.attention)) == pytest.approx(3e-6 + 61440 / (1e12 * 0.25))
