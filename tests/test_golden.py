"""Predictions computed by hand: each test pins one formula, so a one-line change to it fails here.

With `linear_calibration()` every curve is flat at efficiency 1 and every latency 0: a GEMM takes
FLOPs / peak, a memory-bound kernel bytes / HBM bandwidth, a collective bus bytes / link bandwidth.
"""

from __future__ import annotations

import pytest
from helpers import tiny_job

from itercast.config.job import Job
from itercast.costs.analytic import AnalyticCostModel
from itercast.errors import ConfigError
from itercast.hardware.topology import place_group
from itercast.memory import estimate_memory, stage_params
from itercast.parallel.schedules import schedule
from itercast.predict import predict
from itercast.workloads.transformer import Groups, optimizer_step_bytes, pass_cost
from itercast.workloads.transformer_ops import head_forward, layer_backward, layer_forward

PEAK, HBM, LINK = 1e12, 1e11, 1e10  # FLOP/s, bytes/s, bytes/s
#: fused attention runs at 0.75 of a GEMM's rate on a GPU without a fitted attention kernel (this
#: "linear" GPU): FlashAttention-2 reaches 50-73% of the A100's peak where large GEMMs reach ~80%
#: (Dao 2023), the cost model's stated guess (costs/analytic.py)
FLASH_VS_GEMM = 0.75


def flat(**extra: float) -> dict:
    return {"alpha_s": 0.0, "alpha0_s": 0.0, "e_max": 2.0, "log_half": 1.0, "gamma": 0.0, **extra}


def linear_calibration() -> dict:
    """Curves in the schema of costs/curves.json, all efficiency 2 / (1 + e^0) = 1, no latency."""
    kinds = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")
    return {
        "gemm": {k: flat() for k in ("bf16", "tf32", "fp8")},
        "memory": {k: flat() for k in ("elementwise", "norm", "activation")},
        "collectives": {
            "intra_node": {k: flat() for k in kinds},
            "inter_node": {k: flat() for k in kinds},
            "p2p": {"intra_node": flat(), "inter_node": flat()},
        },
    }


SYSTEM = {
    "gpu": {
        "name": "linear",
        "peak_flops": {"fp32": PEAK, "bf16": PEAK},
        "hbm_bytes": 1e12,
        "hbm_bandwidth_bytes_per_s": HBM,
        "l2_bytes": 1,
        "kernel_launch_overhead_s": 0.0,
        "reserved_bytes": 0.0,
        "sm_count": 100,
    },
    "node": {"gpus_per_node": 8, "intra_node_bandwidth_bytes_per_s": LINK, "intra_node_latency_s": 0.0},
    "network": {"nics_per_node": 8, "nic_bandwidth_bytes_per_s": LINK, "latency_s": 0.0},
}
# one layer: h 64, 4 heads of 16, s 32, ffn 256, vocab 128; gpt: LayerNorm, learned positions, tied
MODEL = {"family": "gpt", "num_layers": 1, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32}
MODEL |= {"vocab_size": 128}


def job(num_nodes: int = 1, **plan) -> Job:
    """A job on `num_nodes` nodes each sized to the plan's tp · pp · cp · dp (dp 1 by default)."""
    plan.setdefault("data_parallel", 1)
    sizes = ("tensor_parallel", "pipeline_parallel", "context_parallel", "data_parallel")
    gpus = 1
    for field in sizes:
        gpus *= plan.get(field, 1)
    node = {**SYSTEM["node"], "gpus_per_node": gpus // num_nodes}
    return Job.from_dicts(MODEL, plan, {**SYSTEM, "node": node, "num_nodes": num_nodes})


def test_one_layer_on_one_gpu_step_time_by_hand():
    j = job(data_parallel=1, tensor_parallel=1)
    # Per token T = 32, e = 2 bytes. GEMM FLOPs forward: qkv 2·T·h·3h, proj 2·T·h², mlp 2·2·T·h·4h,
    # logits 2·T·h·V; flash attention 4·a·s²·d / 2 (causal); backward: GEMMs ×2, attention ×2.5.
    T, h, V = 32, 64, 128
    gemm_fwd = 2 * T * h * 3 * h + 2 * T * h * h + 2 * 2 * T * h * 4 * h + 2 * T * h * V
    attn_fwd = 4 * 4 * 32 * 32 * 16 / 2
    flops = 3 * gemm_fwd + 3.5 * attn_fwd / FLASH_VS_GEMM  # fused attention: 0.75 of the GEMM rate
    # Memory-bound bytes forward: 3 norms 2·T·h·e each, residuals (dropout's 1-byte mask beside the
    # three tensors: gpt trains with dropout) T·h·(3e + 1) ×2, GELU 2·T·4h·e,
    # lookup 2·T·h·e, position add 3·T·h·e; backward moves twice as much. Megatron's unfused
    # cross-entropy: 38 bytes a logit forward, 14 backward (test_step_by_hand counts them), streamed at the
    # 0.853 of the elementwise bandwidth the lent H200's fp32 cross-entropy reached.
    mem_fwd = 3 * 2 * T * h * 2 + 2 * T * h * (3 * 2 + 1) + 2 * T * 4 * h * 2 + 2 * T * h * 2 + 3 * T * h * 2
    loss = T * V * (38 + 14)
    # Adam: 30 bytes per parameter (fp32 master, grad, m, v read; master, m, v, bf16 copy written)
    # layer weights + biases + norms, embedding, positions, the final LayerNorm (weight and bias)
    params = 12 * h * h + 13 * h + V * h + 32 * h + 2 * h
    # Megatron's fp32 gradient buffer: zeroed (4 bytes per parameter written) and its NaN check's norm (4 read);
    # one data-parallel rank: no 1/dp scaling
    seconds = flops / PEAK + 3 * mem_fwd / HBM + loss / (0.853 * HBM) + 30 * params / HBM + (4 + 4) * params / HBM
    assert predict(j, linear_calibration()).step_time_s == pytest.approx(seconds, rel=1e-9)


def test_adam_traffic_per_parameter():
    assert optimizer_step_bytes(job(), 1) == 30  # bf16, fp32 gradients
    assert optimizer_step_bytes(job(grad_reduce_dtype="bf16"), 1) == 28
    assert optimizer_step_bytes(job(dtype="fp32"), 1) == 28  # param, grad, m, v read; param, m, v written


def test_fused_attention_backward_is_two_and_a_half_forwards():
    j = job()
    fwd = {o.name: o.amount for o in layer_forward(j.model, j.plan)}
    bwd = {o.name: o.amount for o in layer_backward(j.model, j.plan)}
    assert bwd["core_attention.bwd"] == 2.5 * fwd["core_attention"]


def test_unfused_attention_times_its_score_kernels():
    j = job(flash_attention=False)
    ops = {o.name: o for o in layer_forward(j.model, j.plan)}
    scores = 4 * 32 * 32  # heads × s × s, no causal skipping when the scores are materialised
    assert ops["core_attention.scores"].amount == ops["core_attention.values"].amount == 2 * scores * 16
    assert ops["core_attention.softmax"].amount == 2 * scores * 2  # read and write, 2 bytes
    assert ops["core_attention.dropout"].amount == scores * 5  # read, write, 1-byte mask
    # selective recompute runs the three of them again before the backward
    rec = [o.name for o in layer_backward(j.model, j.plan.model_copy(update={"recompute": "selective"}))]
    assert rec[:4] == [f"recompute.core_attention.{k}" for k in ("scores", "softmax", "dropout", "values")]


def test_unfused_softmax_streams_at_its_measured_share_of_the_elementwise_bandwidth():
    """The H100 profile's softmax kernels reach 0.805 (forward) and 0.493 (backward) of the elementwise curve
    (transformer_ops.SOFTMAX_BANDWIDTH_SHARE, tools/fit_efficiency_curves.h100_softmax_shares); the backward
    reads the probabilities and their gradient and writes the scores' gradient: 3 tensors, not 4."""
    j = job(flash_attention=False)
    costs, groups = AnalyticCostModel(j.system, "bf16", linear_calibration()), Groups.of(j)
    scores = 4 * 32 * 32  # heads × s × s, bf16
    fwd = [o for o in layer_forward(j.model, j.plan) if o.name == "core_attention.softmax"]
    bwd = [o for o in layer_backward(j.model, j.plan) if o.name == "core_attention.softmax.bwd"]
    assert pass_cost(fwd, costs, groups).family_s == pytest.approx({"softmax": 2 * scores * 2 / (0.805 * HBM)})
    assert pass_cost(bwd, costs, groups).family_s == pytest.approx({"softmax": 3 * scores * 2 / (0.493 * HBM)})


def test_full_recompute_reruns_the_whole_forward_not_only_gemms():
    j = job(tensor_parallel=2, data_parallel=1, sequence_parallel=True, recompute="full")
    fwd = layer_forward(j.model, j.plan)
    bwd = layer_backward(j.model, j.plan)
    assert [(o.family, o.amount) for o in bwd[: len(fwd)]] == [(o.family, o.amount) for o in fwd]


def test_sequence_parallel_backward_has_four_gathers_and_two_scatters():
    # Korthikanti et al. §4.2.2: forward 2 AG + 2 RS; backward re-gathers the two saved inputs
    j = job(tensor_parallel=2, data_parallel=1, sequence_parallel=True)
    kinds = [o.comm_kind for o in layer_backward(j.model, j.plan) if o.family == "tp_comm"]
    assert sorted(kinds) == ["all_gather"] * 4 + ["reduce_scatter"] * 2


def test_tensor_parallel_backward_collectives_hide_behind_their_gemms():
    # Without SP: the g's backward is an identity; the f's all-reduce runs beside the weight-gradient
    # GEMM (Megatron's async all-reduce), so only what outlasts that GEMM is exposed.
    j = job(tensor_parallel=2, data_parallel=1)
    costs = AnalyticCostModel(j.system, "bf16", linear_calibration())
    bwd = layer_backward(j.model, j.plan)
    assert [o.overlaps for o in bwd if o.family == "tp_comm"] == ["mlp_up.wgrad", "qkv.wgrad"]
    T, h = 32, 64
    all_reduce_s = 2 * (2 - 1) / 2 * T * h * 2 / LINK  # bus bytes over the link
    wgrad_s = {"mlp_up": 2 * T * h * 4 * h / 2 / PEAK, "qkv": 2 * T * h * 3 * h / 2 / PEAK}
    exposed = sum(max(0.0, all_reduce_s - w) for w in wgrad_s.values())
    assert pass_cost(bwd, costs, Groups.of(j)).comm_s == pytest.approx(exposed)


def test_a_synchronous_tensor_parallel_all_reduce_waits_for_the_weight_gradient_and_hides_nothing():
    # Megatron-LM before 2021-09 and Megatron-DeepSpeed (plan.tp_allreduce_overlap false): the f's backward
    # all-reduces the input gradient after F.linear's backward, both GEMMs done, so each is exposed whole
    j = job(tensor_parallel=2, data_parallel=1, tp_allreduce_overlap=False)
    costs = AnalyticCostModel(j.system, "bf16", linear_calibration())
    bwd = layer_backward(j.model, j.plan)
    assert [o.overlaps for o in bwd if o.family == "tp_comm"] == ["", ""]
    T, h = 32, 64
    all_reduce_s = 2 * (2 - 1) / 2 * T * h * 2 / LINK
    assert pass_cost(bwd, costs, Groups.of(j)).comm_s == pytest.approx(2 * all_reduce_s)
    # the forward's two all-reduces (the g's) are blocking either way; sequence parallelism's reduce-scatter
    # stays beside the wgrad (every Megatron that has it issues it asynchronously)
    on = job(tensor_parallel=2, data_parallel=1)
    assert layer_forward(j.model, j.plan) == layer_forward(on.model, on.plan)
    sp = job(tensor_parallel=2, data_parallel=1, sequence_parallel=True, tp_allreduce_overlap=False)
    beside = {o.name: o.overlaps for o in layer_backward(sp.model, sp.plan) if o.family == "tp_comm"}
    assert beside["qkv.dgrad_reduce_scatter"] == "qkv.wgrad" and beside["mlp_up.dgrad_reduce_scatter"] == "mlp_up.wgrad"


def test_tp_comm_overlap_hides_each_gather_and_scatter_behind_its_gemm():
    # tp 2, SP: forward AG(T·h·e) → qkv, proj → RS, AG → mlp_up, mlp_down → RS; backward each RS's
    # all-gather beside the row-parallel GEMM's dgrad. Transformer Engine's pipeline reduce-scatters (after
    # proj and mlp_down) and bulk overlaps (beside the dgrad and wgrad of qkv and mlp_up) take 16 of the
    # GPU's 100 SMs: those GEMMs run 100/84 as long. The ring exchanges (the all-gathers) split their GEMM
    # in tp = 2 chunks and send one chunk of T·h·e / 2 per step beside the other chunk's GEMM: 1 step; the
    # pipeline splits its GEMM in 4 (TE's default num_splits) and reduce-scatters each quarter beside the
    # next quarter's GEMM, the last quarter after the last GEMM: 3 steps plus one quarter exposed.
    j = job(tensor_parallel=2, data_parallel=1, sequence_parallel=True, tp_comm_overlap=True)
    costs, groups = AnalyticCostModel(j.system, "bf16", linear_calibration()), Groups.of(j)
    fwd, bwd = layer_forward(j.model, j.plan), layer_backward(j.model, j.plan)
    assert [(o.comm_kind, o.overlaps, o.chunked) for o in fwd if o.family == "tp_comm"] == [
        ("all_gather", "qkv", "ring_exchange"),
        ("reduce_scatter", "attn_proj", "pipeline"),
        ("all_gather", "mlp_up", "ring_exchange"),
        ("reduce_scatter", "mlp_down", "pipeline"),
    ]
    T, h = 32, 64
    comm_s = (2 - 1) / 2 * T * h * 2 / LINK  # each whole gather or scatter of the T·h·e activations: 2.048e-7 s
    ring_step_s = T * h * 2 / 2 / LINK  # one of the 2 chunks to the neighbour: 2.048e-7 s
    quarter_rs_s = (2 - 1) / 2 * T * h * 2 / 4 / LINK  # a reduce-scatter of a quarter: 5.12e-8 s
    gemm_s = {
        "qkv": 2 * T * h * 3 * h,
        "attn_proj": 2 * T * h * h,
        "mlp_up": 2 * T * h * 4 * h,
        "mlp_down": 2 * T * h * 4 * h,
    }
    gemm_s = {k: v / 2 / PEAK for k, v in gemm_s.items()}
    slow = 100 / 84
    forward_exposed = (
        max(0.0, ring_step_s - gemm_s["qkv"] / 2)  # 8.2e-9 s
        + 3 * max(0.0, quarter_rs_s - gemm_s["attn_proj"] * slow / 4)
        + quarter_rs_s
        + max(0.0, ring_step_s - gemm_s["mlp_up"] / 2)  # 0
        + 3 * max(0.0, quarter_rs_s - gemm_s["mlp_down"] * slow / 4)  # 0
        + quarter_rs_s
    )
    assert forward_exposed == pytest.approx(2.048e-7 - 1.96608e-7 + 3 * (5.12e-8 - 1.31072e-7 * slow / 4) + 2 * 5.12e-8)
    assert pass_cost(fwd, costs, groups).comm_s == pytest.approx(forward_exposed)
    # backward: the two re-gathers beside the (slowed) dgrads of qkv and mlp_up and the two input-gradient
    # scatters beside their (slowed) wgrads (same FLOPs) are bulk: each only its excess over the whole GEMM,
    # none here. The all-gathers beside the dgrads of attn_proj and mlp_down are ring exchanges on all SMs:
    # attn_proj's half (6.6e-8 s) is shorter than one step (2.0e-7 s).
    bulk = {k: g * slow for k, g in gemm_s.items() if k in ("qkv", "mlp_up")}
    assert all(comm_s < g for g in bulk.values())
    backward_exposed = max(0.0, ring_step_s - gemm_s["attn_proj"] / 2) + max(0.0, ring_step_s - gemm_s["mlp_down"] / 2)
    assert backward_exposed == pytest.approx(2.048e-7 - 6.5536e-8)
    assert pass_cost(bwd, costs, groups).comm_s == pytest.approx(backward_exposed)
    plain = job(tensor_parallel=2, data_parallel=1, sequence_parallel=True)
    assert pass_cost(layer_forward(plain.model, plain.plan), costs, groups).comm_s == pytest.approx(4 * comm_s)
    with pytest.raises(ConfigError, match="tp_comm_overlap needs sequence_parallel with tensor_parallel > 1"):
        job(tensor_parallel=2, data_parallel=1, tp_comm_overlap=True)


def test_tp_comm_overlap_chunks_launch_more_gemms_and_ring_reduce_scatter_sums_the_chunks():
    # No SM margins. Each GEMM a chunked overlap splits runs as n GEMMs: with 1 µs of latency per GEMM,
    # the forward's qkv and mlp_up (ring exchange, tp = 2) and attn_proj and mlp_down (pipeline, 4) launch
    # 2 + 4 + 2 + 4 = 12 GEMMs instead of 4, 8 µs more. With tp_comm_overlap_rs ring_exchange the
    # reduce-scatters split in 2 too: 1 step beside the other half's GEMM, then one kernel reads the 2
    # halves received (T·h·e bytes) and writes one (T·h·e / 2) at HBM speed.
    zero = {k: 0 for k in ("proj_fprop", "fc2_fprop", "qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad")}
    plan = {"tensor_parallel": 2, "sequence_parallel": True, "tp_comm_overlap_sms": zero}
    overlapped, plain = job(tp_comm_overlap=True, **plan), job(**plan)
    calibration = linear_calibration()
    calibration["gemm"]["bf16"] = flat(alpha_s=1e-6)
    costs, groups = AnalyticCostModel(overlapped.system, "bf16", calibration), Groups.of(overlapped)
    chunked = pass_cost(layer_forward(overlapped.model, overlapped.plan), costs, groups)
    whole = pass_cost(layer_forward(plain.model, plain.plan), costs, groups)
    assert chunked.kernels - whole.kernels == 8
    assert chunked.compute_s - whole.compute_s == pytest.approx(8e-6)
    ring = job(tp_comm_overlap=True, tp_comm_overlap_rs="ring_exchange", **plan)
    fwd = layer_forward(ring.model, ring.plan)
    assert [o.chunked for o in fwd if o.family == "tp_comm"] == ["ring_exchange"] * 4
    T, h = 32, 64
    step_s = T * h * 2 / 2 / LINK  # 2.048e-7 s
    half_gemm = {"qkv": 2 * T * h * 3 * h / 2 / PEAK / 2 + 1e-6, "attn_proj": 2 * T * h * h / 2 / PEAK / 2 + 1e-6}
    half_gemm |= {
        "mlp_up": 2 * T * h * 4 * h / 2 / PEAK / 2 + 1e-6,
        "mlp_down": 2 * T * h * 4 * h / 2 / PEAK / 2 + 1e-6,
    }
    assert all(g > step_s for g in half_gemm.values())  # every step hides behind 1 µs of GEMM latency
    reduce_s = (T * h * 2 + T * h * 2 / 2) / HBM  # 6.144e-8 s after each reduce-scatter
    assert pass_cost(fwd, costs, groups).comm_s == pytest.approx(2 * reduce_s)
    linear = linear_calibration()  # without latency attn_proj's half (6.6e-8 s) is shorter than a step
    exposed = (
        (step_s - 2 * T * h * h / 2 / PEAK / 2) + 2 * reduce_s + max(0.0, step_s - 2 * T * h * 3 * h / 2 / PEAK / 2)
    )
    assert pass_cost(fwd, AnalyticCostModel(ring.system, "bf16", linear), groups).comm_s == pytest.approx(exposed)


def test_pytorch_async_tp_sums_its_reduce_scatter_chunks_at_a_third_of_the_bandwidth():
    # PyTorch's async TP (tp_layout dtensor) sums the partials of its matmul-reduce-scatter with torch.sum, at
    # 23-43% of HBM peak (pytorch/pytorch#191803): 0.35 of the elementwise curve. The ring exchange of the test
    # above, each step hidden behind 1 us of GEMM latency: what is left after each of the 2 reduce-scatters
    # reads the 2 halves received and writes one, T·h·e · 3/2 = 6,144 bytes, at 0.35 × 1e11 B/s: 1.755e-7 s.
    zero = {k: 0 for k in ("proj_fprop", "fc2_fprop", "qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad")}
    plan = {"tensor_parallel": 2, "sequence_parallel": True, "tp_comm_overlap_sms": zero, "tp_layout": "dtensor"}
    ring = job(tp_comm_overlap=True, tp_comm_overlap_rs="ring_exchange", **plan)
    calibration = linear_calibration()
    calibration["gemm"]["bf16"] = flat(alpha_s=1e-6)
    costs, groups = AnalyticCostModel(ring.system, "bf16", calibration), Groups.of(ring)
    fwd = layer_forward(ring.model, ring.plan)
    assert [o.bandwidth_share for o in fwd if o.family == "tp_comm"] == [1.0, 0.35, 1.0, 0.35]
    T, h = 32, 64
    reduce_s = (T * h * 2 + T * h * 2 / 2) / 0.35 / HBM
    assert reduce_s == pytest.approx(1.755e-7, rel=1e-3)
    assert pass_cost(fwd, costs, groups).comm_s == pytest.approx(2 * reduce_s)


def _contended(s: float, link: float = LINK, **plan) -> Job:
    """tp 2 with sequence parallelism on one node (NVLink of `link` bytes/s) of the linear GPU whose compute
    runs 1 + s times as long beside a collective (GPUSpec.overlap_compute_slowdown)."""
    plan = {"tensor_parallel": 2, "data_parallel": 1, "sequence_parallel": True, **plan}
    node = {**SYSTEM["node"], "gpus_per_node": 2, "intra_node_bandwidth_bytes_per_s": link}
    system = {**SYSTEM, "gpu": {**SYSTEM["gpu"], "overlap_compute_slowdown": s}, "node": node}
    return Job.from_dicts(MODEL, plan, {**system, "num_nodes": 1})


def test_compute_beside_a_collective_inside_a_pass_runs_slower_unless_its_sms_are_priced():
    # s = 0.25: o seconds of overlap add s / (1 + s) · o = 0.2 · o (sim/contention.py's fluid model).
    T, h = 32, 64
    comm_s = (2 - 1) / 2 * T * h * 2 / LINK  # a whole gather or scatter of T·h·e: 2.048e-7 s
    qkv_s, up_s = 2 * T * h * 3 * h / 2 / PEAK, 2 * T * h * 4 * h / 2 / PEAK  # 3.93e-7 and 5.24e-7 s
    assert comm_s < min(qkv_s, up_s)  # each collective overlaps its GEMM throughout its own 2.048e-7 s
    calibration = linear_calibration()
    # Megatron's async backward (NCCL): the re-gathers beside the qkv and mlp_up dgrads, the input-gradient
    # scatters beside their wgrads: 4 GEMMs each 0.2 · 2.048e-7 s longer, nothing exposed
    nccl, free = _contended(0.25), _contended(0.0)
    costs, groups = AnalyticCostModel(nccl.system, "bf16", calibration), Groups.of(nccl)
    slow = pass_cost(layer_backward(nccl.model, nccl.plan), costs, groups)
    alone = pass_cost(
        layer_backward(free.model, free.plan), AnalyticCostModel(free.system, "bf16", calibration), groups
    )
    assert slow.compute_s - alone.compute_s == pytest.approx(4 * 0.2 * 2.048e-7)
    assert slow.family_s["overlap_contention"] == pytest.approx(4 * 0.2 * 2.048e-7)
    assert slow.comm_s == pytest.approx(alone.comm_s)  # the g's all-gather is not overlapped: exposed alike
    # on a link 4 times slower each collective (8.192e-7 s) outlasts its GEMM even slowed (qkv 4.9e-7 s, mlp_up
    # 6.6e-7 s): each GEMM overlapped throughout runs 1.25 times as long, and hides that much more
    far, near = _contended(0.25, LINK / 4), _contended(0.0, LINK / 4)
    slow = pass_cost(layer_backward(far.model, far.plan), AnalyticCostModel(far.system, "bf16", calibration), groups)
    alone = pass_cost(
        layer_backward(near.model, near.plan), AnalyticCostModel(near.system, "bf16", calibration), groups
    )
    assert 4 * comm_s > 1.25 * up_s
    assert slow.compute_s - alone.compute_s == pytest.approx(0.25 * 2 * (qkv_s + up_s))
    assert alone.comm_s - slow.comm_s == pytest.approx(0.25 * 2 * (qkv_s + up_s))
    # Transformer Engine's userbuffers with TE's default margins (16 SMs, priced by sm_count) and ring
    # exchanges (copy engines): no stretch
    ub = _contended(0.25, tp_comm_overlap=True)
    ub_costs = AnalyticCostModel(ub.system, "bf16", calibration)
    for passes in (layer_forward, layer_backward):
        assert "overlap_contention" not in pass_cost(passes(ub.model, ub.plan), ub_costs, groups).family_s
    # TE 1.x (no margin): the bulk overlaps stretch as NCCL's do (4 × 0.2 · 2.048e-7 s backward); each
    # pipeline quarter's reduce-scatter (5.12e-8 s) stretches the next GEMM quarter: attn_proj's quarter
    # (3.2768e-8 s) is overlapped throughout, 0.2 · 1.25 · 3.2768e-8 = 8.192e-9 s; mlp_down's (1.31e-7 s)
    # for the 5.12e-8 s of the step, 0.2 · 5.12e-8 = 1.024e-8 s; 3 steps each
    zero = {k: 0 for k in ("proj_fprop", "fc2_fprop", "qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad")}
    te1 = _contended(0.25, tp_comm_overlap=True, tp_comm_overlap_sms=zero)
    te1_costs = AnalyticCostModel(te1.system, "bf16", calibration)
    forward = pass_cost(layer_forward(te1.model, te1.plan), te1_costs, groups)
    assert forward.family_s["overlap_contention"] == pytest.approx(3 * 8.192e-9 + 3 * 1.024e-8)
    quarter_s, proj_quarter_s = (2 - 1) / 2 * T * h * 2 / 4 / LINK, 2 * T * h * h / 2 / PEAK / 4
    ring_s = max(0.0, T * h * 2 / 2 / LINK - qkv_s / 2)  # qkv's ring step outlasts its half GEMM
    exposed = ring_s + 3 * (quarter_s - proj_quarter_s - 8.192e-9) + 2 * quarter_s
    assert forward.comm_s == pytest.approx(exposed)
    backward = pass_cost(layer_backward(te1.model, te1.plan), te1_costs, groups)
    assert backward.family_s["overlap_contention"] == pytest.approx(4 * 0.2 * 2.048e-7)


def test_context_parallel_ring_exposes_what_attention_does_not_hide():
    j = job(context_parallel=2, data_parallel=1, num_nodes=1)
    ops = {o.name: o for o in layer_forward(j.model, j.plan)}
    ring = ops["cp_kv_exchange"]
    assert (ring.count, ring.amount) == (1, 2 * 16 * 4 * 16 * 2)  # c − 1 steps of K and V: 2·T·g·d·e
    costs = AnalyticCostModel(j.system, "bf16", linear_calibration())
    attention_s = 4 * 4 * 16 * 32 * 16 / 2 / (PEAK * FLASH_VS_GEMM)  # local queries × all keys, causal half
    exposed = max(0.0, ring.amount / LINK - attention_s)
    cost = pass_cost(layer_forward(j.model, j.plan), costs, Groups.of(j))
    assert cost.family_s.get("cp_p2p_exposed", 0.0) == pytest.approx(exposed)
    # NCCL's send and receive kernels slow the attention beside them (s = 0.25: 0.2 of the overlap): the
    # ring's 4.096e-7 s outlast attention's 8.74e-8 s run 1.25 times as long, which hides 2.18e-8 s more
    system = {**j.system.model_dump(), "gpu": {**j.system.gpu.model_dump(), "overlap_compute_slowdown": 0.25}}
    slowed = Job.from_dicts(MODEL, {"context_parallel": 2, "data_parallel": 1}, system)
    cost = pass_cost(
        layer_forward(slowed.model, slowed.plan),
        AnalyticCostModel(slowed.system, "bf16", linear_calibration()),
        Groups.of(slowed),
    )
    assert cost.family_s["overlap_contention"] == pytest.approx(0.2 * 1.25 * attention_s)
    assert cost.family_s["cp_p2p_exposed"] == pytest.approx(ring.amount / LINK - 1.25 * attention_s)


def test_last_stage_holds_the_losss_peak_bytes_of_one_microbatchs_logits():
    j = job(pipeline_parallel=1, data_parallel=1)
    est = estimate_memory(j)
    unpadded = {"data_parallel": 1, "make_vocab_size_divisible_by": 1}  # else 1 row pads to 128 like 128 rows
    none = estimate_memory(Job.from_dicts({**MODEL, "vocab_size": 1}, unpadded, j.system.model_dump()))
    # the logits term alone (vocab 128 vs 1 changes nothing else in activations), T = 32 tokens: Megatron's
    # fp32 softmax, turned into the gradient in place and cast to bf16 for the output layer: 4 + 2 bytes
    assert est.activations_bytes - none.activations_bytes == 32 * (128 - 1) * 6
    system = j.system.model_dump()

    def loss(kind: str) -> float:
        return estimate_memory(
            Job.from_dicts(MODEL, {"data_parallel": 1, "cross_entropy": kind}, system)
        ).activations_bytes

    # Transformer Engine's kernel overwrites the bf16 logits with their gradient: 2 bytes
    assert est.activations_bytes - loss("te") == 32 * 128 * (6 - 2)
    # Inductor's compiled loss: the bf16 logits read again and their bf16 gradient written: 2 + 2
    assert est.activations_bytes - loss("torch_compiled") == 32 * 128 * (6 - 4)
    # flash-attn's CrossEntropyLoss (llm-foundry's MPT): the bf16 logits saved, a new bf16 gradient: 2 + 2
    assert est.activations_bytes - loss("flash_attn") == 32 * 128 * (6 - 4)
    # eager F.cross_entropy on fp32 logits: in LogSoftmaxBackward the kept fp32 log-softmax, nll_loss's
    # fp32 gradient and the fp32 input gradient live together: 4 + 4 + 4
    assert loss("torch") - est.activations_bytes == 32 * 128 * (12 - 6)


def test_norm_weights_and_positions_are_not_split_by_tensor_parallelism():
    h, s = 64, 32
    t2 = job(tensor_parallel=2, data_parallel=1)
    # layer: 12h² weights and 3h + 4h column biases split; 2 LayerNorms (4h) and 2 row biases (2h) whole;
    # the vocabulary padded to a multiple of 128 · tp = 256 (Megatron's default), 128 rows a rank; the final
    # LayerNorm (2h) whole
    layer = (12 * h * h + 7 * h) / 2 + 6 * h
    assert stage_params(t2, 0) == pytest.approx((0.0, layer + 256 * h / 2 + s * h + 2 * h))


def test_interleaved_warm_up_with_as_many_microbatches_as_stages_is_megatron_cores():
    # get_pp_rank_microbatches at HEAD: min(2 (p − s − 1) + (v − 1) p, m v) warm-up forwards; p = m = v = 2.
    # Stage 0: min(2 + 2, 4), every forward first; stage 1: 2, then 1F1B (core_v0.8.0 ran every forward
    # first on every stage when m = p, all_warmup_microbatches; gone since a606486, March 2025)
    assert [p.forward for p in schedule("interleaved-1f1b", 0, 2, 2, 2)] == [True] * 4 + [False] * 4
    last = schedule("interleaved-1f1b", 1, 2, 2, 2)
    assert [p.forward for p in last] == [True, True, True, False, True, False, False, False]


def test_network_latency_floors_collectives_across_nodes():
    slow = {**SYSTEM, "network": {**SYSTEM["network"], "latency_s": 1.0}}
    j = Job.from_dicts(MODEL, {"data_parallel": 16}, {**slow, "num_nodes": 2})
    costs = AnalyticCostModel(j.system, "bf16", linear_calibration())
    g = Groups.of(j).grad  # 16 ranks on 2 nodes: 3 hops in a node (free here), 1 across
    assert costs.collective_s("all_reduce", 1.0, g) == 2.0  # up and down the tree
    assert costs.collective_s("all_gather", 1.0, g) == 1.0
    base = predict(job(num_nodes=2, data_parallel=16), linear_calibration()).step_time_s
    assert predict(j, linear_calibration()).step_time_s > base + 1.0


def test_a_ring_of_several_gpus_a_node_pays_a_hop_per_rank():
    """NCCL runs an all-gather or reduce-scatter with several GPUs a node as a ring of ranks − 1 steps
    (PAT, log2 steps, only with one GPU a node). 16 ranks on 2 nodes, 1 ms a hop in a node, 1 s
    across: 14 hops in the nodes and 1 across, 1.014 s; the all-reduce's tree: 2 × (3 ms + 1 s); 32 ranks
    on 4 nodes: 28 hops in the nodes and 3 across.
    A data-parallel group beside tp 8 holds one GPU a node: 16 nodes, ⌈log2 16⌉ = 4 hops of 1 s."""
    node = {**SYSTEM["node"], "intra_node_latency_s": 1e-3}
    slow = {**SYSTEM, "node": node, "network": {**SYSTEM["network"], "latency_s": 1.0}}
    j = Job.from_dicts(MODEL, {"data_parallel": 16}, {**slow, "num_nodes": 2})
    costs = AnalyticCostModel(j.system, "bf16", linear_calibration())
    ring = Groups.of(j).grad
    assert costs.collective_s("all_gather", 1.0, ring) == pytest.approx(14e-3 + 1.0)
    assert costs.collective_s("reduce_scatter", 1.0, ring) == pytest.approx(14e-3 + 1.0)
    assert costs.collective_s("all_reduce", 1.0, ring) == pytest.approx(2 * (3e-3 + 1.0))
    four_nodes = place_group(32, 1, 8)  # 31 steps, 3 across: 28 ms + 3 s (a tree's log2 would say 2 s)
    assert costs.collective_s("all_gather", 1.0, four_nodes) == pytest.approx(28e-3 + 3.0)
    one_a_node = place_group(16, 8, 8)  # stride 8: one rank a node, 16 nodes
    assert (one_a_node.nodes, one_a_node.per_node) == (16, 1)
    assert costs.collective_s("all_gather", 1.0, one_a_node) == pytest.approx(4.0)


def test_zero3_reduces_gradients_every_microbatch():
    j = tiny_job(zero_stage=3, global_batch_size=32)  # 8-way DP, 4 micro-batches
    names = [n for n in predict(j).sim.graph.names if n.startswith("grad_reduce_scatter.m")]
    assert {n.split(".")[1] for n in names} == {"m0", "m1", "m2", "m3"}


def test_a_built_graph_recosted_equals_one_built_with_those_costs():
    # one graph per plan shape: re-pricing it (another calibration) needs no rebuild
    from itercast.sim.engine import simulate
    from itercast.workloads.transformer import TransformerStepBuilder

    j = tiny_job(tensor_parallel=2, pipeline_parallel=2, global_batch_size=8, zero_stage=1)  # dp 2
    linear = AnalyticCostModel(j.system, "bf16", linear_calibration())
    builder = TransformerStepBuilder(j)  # built with the built-in curves
    builder.build()
    recosted = builder.recost(linear)
    fresh = TransformerStepBuilder(j, linear).build()
    assert recosted.num_tasks == fresh.num_tasks
    assert list(recosted.duration_s) == list(fresh.duration_s)
    assert simulate(recosted).step_time_s == predict(j, linear_calibration()).step_time_s


def test_zero3_weights_are_a_shard_plus_two_whole_gathered_layers():
    j = job(data_parallel=4, zero_stage=3)
    layer = 12 * 64 * 64 + 13 * 64  # the one layer, whole on every rank (tp 1)
    params = layer + 128 * 64 + 32 * 64 + 2 * 64  # the embedding, positions, final LayerNorm (the head is tied)
    assert estimate_memory(j).weights_bytes == pytest.approx(params * 2 / 4 + 2 * layer * 2)
    assert estimate_memory(j).gradients_bytes == pytest.approx(params * 4 / 4)  # fp32 gradients, sharded
    assert estimate_memory(j).optimizer_bytes == pytest.approx(params * 12 / 4)


def test_hardware_flops_count_the_full_recompute_forward():
    # one layer per token forward: QKV 2·64·(4+2·4)·16 = 24,576; projection 2·64² = 8,192;
    # MLP 2·2·64·256 = 65,536; attention 4·32·64 = 8,192 → 106,496; 32 tokens of one sequence
    j = job(recompute="full")
    r = predict(j, linear_calibration())
    assert r.hardware_flops_per_step - r.model_flops_per_step == 106_496 * 32
    assert predict(job(), linear_calibration()).hardware_flops_per_step == r.model_flops_per_step


def test_hardware_flops_count_only_the_recompute_that_runs():
    # torchtitan's every-2nd-layer checkpointing on a 1-layer model recomputes no layer: ⌊1/2⌋ = 0
    r = predict(job(recompute="full", recompute_every=2), linear_calibration())
    assert r.hardware_flops_per_step == r.model_flops_per_step
    # per-op SAC, fused attention: the keys' third of QKV 2·64·16·4 = 8,192, the projection 2·64·16·4
    # = 8,192, the MLP's up matmul 2·64·256 = 32,768 → 49,152 per token, 32 tokens
    r = predict(job(recompute="selective", selective_recompute="op", flash_attention=True), linear_calibration())
    assert r.hardware_flops_per_step - r.model_flops_per_step == 49_152 * 32
    # Megatron's selective recompute runs the fused attention kernel again: QKᵀ and AV, 4·32·64 =
    # 8,192 per token in the model-FLOPs convention (the full 32 keys per query), 32 tokens
    for fused in (True, False):
        r = predict(job(recompute="selective", flash_attention=fused), linear_calibration())
        assert r.hardware_flops_per_step - r.model_flops_per_step == 8_192 * 32


def test_mfu_counted_with_the_causal_half_of_the_attention_scores():
    # per token, forward: the layer's 106,496 (its scores 4·32·64 = 8,192 counted over all 32 keys) and the
    # logits 2·64·128 = 16,384; 3× for training: 368,640, of which half the scores, 1.5 · 8,192, are not run
    r = predict(job(), linear_calibration())
    assert r.model_flops_per_step == 368_640 * 32
    assert r.mfu_causal == pytest.approx(r.mfu * (1 - 1.5 * 8_192 / 368_640))


def test_fp8_runs_only_transformer_engine_gemms_in_fp8():
    """fp8 at twice the bf16 peak, flat curves: the layer's projections and MLP at 2·PEAK; the output
    layer (Megatron's own linear), unfused attention's GEMMs and the MoE router at the bf16 PEAK."""
    gpu = {**SYSTEM["gpu"], "peak_flops": {"fp32": PEAK, "bf16": PEAK, "fp8": 2 * PEAK}}
    j = Job.from_dicts(MODEL, {"dtype": "fp8", "flash_attention": False}, {**SYSTEM, "gpu": gpu})
    costs = AnalyticCostModel(j.system, "fp8", linear_calibration())
    T, h, V = 32, 64, 128
    layer = {o.name: o for o in layer_forward(j.model, j.plan)}
    assert float(costs.gemm_s(layer["qkv"].amount, layer["qkv"].te)) == pytest.approx(2 * T * h * 3 * h / (2 * PEAK))
    scores = layer["core_attention.scores"]
    assert float(costs.gemm_s(scores.amount, scores.te)) == pytest.approx(2 * 4 * 32 * 32 * 16 / PEAK)
    head = {o.name: o for o in head_forward(j.model, j.plan)}
    assert float(costs.gemm_s(head["logits"].amount, head["logits"].te)) == pytest.approx(2 * T * h * V / PEAK)
    moe = Job.from_presets("mixtral-8x7b", "dgx-h100", 1, {"dtype": "fp8", "expert_parallel": 8})
    routed = {o.name: o.te for o in layer_forward(moe.model, moe.plan, moe=True) if o.family == "gemm"}
    assert routed == {"qkv": True, "attn_proj": True, "router": False, "expert_up": True, "expert_down": True}


def test_fp8_casts_each_gemm_input_and_output_gradient():
    # T = 32 tokens, h 64, GELU MLP of 256: inputs m × k of qkv, attn_proj, mlp_up, mlp_down are
    # 32 × (64, 64, 64, 256); output gradients m × n are 32 × (192, 64, 256, 64); 4 bytes each
    # (a bf16 read, FP8 and its transpose written). The output layer, in bf16, casts nothing.
    gpu = {**SYSTEM["gpu"], "peak_flops": {"fp32": PEAK, "bf16": PEAK, "fp8": 2 * PEAK}}
    j = Job.from_dicts(MODEL, {"dtype": "fp8"}, {**SYSTEM, "gpu": gpu})
    fwd, bwd = layer_forward(j.model, j.plan), layer_backward(j.model, j.plan)
    casts = [o for o in fwd if o.label == "fp8_cast"]
    assert [o.name for o in casts] == [f"{g}.fp8_cast" for g in ("qkv", "attn_proj", "mlp_up", "mlp_down")]
    assert all(fwd[fwd.index(c) + 1].name == c.name.removesuffix(".fp8_cast") for c in casts)
    assert sum(o.amount for o in casts) == 4 * 32 * (64 + 64 + 64 + 256)
    assert sum(o.amount for o in bwd if o.label == "fp8_cast") == 4 * 32 * (192 + 64 + 256 + 64)
    assert not any(o.label == "fp8_cast" for o in head_forward(j.model, j.plan))
    plain = job()
    assert not any(o.label == "fp8_cast" for o in layer_forward(plain.model, plain.plan))


def test_userbuffers_take_their_sms_from_the_gemms_they_overlap():
    # tp 2, SP, one layer, 100 SMs. Forward: proj and mlp_down (pipeline reduce-scatters) lose 16 SMs by
    # default: compute grows by (g_proj + g_down)·(100/84 − 1); a recipe's cfg of 24 for proj_fprop and 0
    # for fc2_fprop (set_sm_margin off) grows it by g_proj·(100/76 − 1) only. FLOPs / 2 ranks / PEAK.
    T, h = 32, 64
    g_proj, g_down = 2 * T * h * h / 2 / PEAK, 2 * T * h * 4 * h / 2 / PEAK
    tp = {"tensor_parallel": 2, "data_parallel": 1, "sequence_parallel": True}
    plain, default = job(**tp), job(**tp, tp_comm_overlap=True)
    cfg = job(**tp, tp_comm_overlap=True, tp_comm_overlap_sms={"proj_fprop": 24, "fc2_fprop": 0})
    costs, groups = AnalyticCostModel(plain.system, "bf16", linear_calibration()), Groups.of(plain)

    def compute(j: Job) -> float:
        return pass_cost(layer_forward(j.model, j.plan), costs, groups).compute_s

    assert compute(default) - compute(plain) == pytest.approx((g_proj + g_down) * (100 / 84 - 1))
    assert compute(cfg) - compute(plain) == pytest.approx(g_proj * (100 / 76 - 1))
    # backward: the bulk overlaps slow the dgrad and wgrad of qkv and mlp_up (each as long as its
    # forward GEMM); the ring-exchange all-gathers beside the dgrads of proj and mlp_down take no SMs
    g_qkv, g_up = 2 * T * h * 3 * h / 2 / PEAK, 2 * T * h * 4 * h / 2 / PEAK

    def backward(j: Job) -> float:
        return pass_cost(layer_backward(j.model, j.plan), costs, groups).compute_s

    assert backward(default) - backward(plain) == pytest.approx(2 * (g_qkv + g_up) * (100 / 84 - 1))
    assert backward(cfg) - backward(plain) == pytest.approx(2 * (g_qkv + g_up) * (100 / 84 - 1))
    # a GPU without an SM count cannot price a margin: one line naming the field
    bare = {**SYSTEM, "gpu": {k: v for k, v in SYSTEM["gpu"].items() if k != "sm_count"}}
    nosm = Job.from_dicts(
        MODEL, {**tp, "tp_comm_overlap": True}, {**bare, "node": {**SYSTEM["node"], "gpus_per_node": 2}}
    )
    with pytest.raises(ConfigError, match=r"needs gpu\.sm_count"):
        pass_cost(
            layer_forward(nosm.model, nosm.plan), AnalyticCostModel(nosm.system, "bf16", linear_calibration()), groups
        )
