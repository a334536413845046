"""One training step's quantities computed by hand: the groups gradients are reduced over, the
optimizer's traffic under ZeRO, the QKV GEMM with grouped-query attention, the context-parallel
ring, the pipeline's messages.

Every number is written out below from the formula it comes from (Megatron-LM shapes; nccl-tests
bus bandwidth: an all-reduce moves 2(n − 1)/n of its buffer per rank, an all-gather and a
reduce-scatter (n − 1)/n). On test_golden's linear calibration a collective takes its bus bytes over
the link, a memory-bound kernel its bytes over HBM, a GEMM its FLOPs over the peak.
"""

from __future__ import annotations

import pytest
from test_golden import HBM, LINK, MODEL, PEAK, SYSTEM, flat, linear_calibration

from itercast.config.job import Job
from itercast.hardware.topology import GroupPlacement
from itercast.predict import predict
from itercast.workloads.transformer import Groups
from itercast.workloads.transformer_ops import backward_of, head_forward, layer_backward, layer_forward

H, V, S = 64, 128, 32  # MODEL: gpt, one layer, hidden 64, 4 heads of 16, MLP 256, vocab 128, 32 tokens
# one layer: QKV h·3h + projection h² + MLP 2·h·4h weights, biases 3h + 4h (column) + 2h (row), two
# LayerNorms 4h: 12h² + 13h; the embedding V·h and learned positions S·h; the tied head is the embedding,
# after the final LayerNorm (weight and bias, 2h)
PARAMS = 12 * H * H + 13 * H + V * H + S * H + 2 * H  # = 60,352 on one GPU (tp 1, pp 1)


def job(model: dict | None = None, gpus_per_node: int | None = None, **plan: object) -> Job:
    """MODEL (with `model`'s fields changed) under `plan` (dp 1 unless given); every GPU of the plan
    on one node unless `gpus_per_node` says how many a node has."""
    plan.setdefault("data_parallel", 1)
    gpus = 1
    for field in ("tensor_parallel", "pipeline_parallel", "context_parallel", "data_parallel"):
        gpus *= int(plan.get(field, 1))  # type: ignore[call-overload]
    per_node = gpus_per_node or gpus
    system = {**SYSTEM, "node": {**SYSTEM["node"], "gpus_per_node": per_node}, "num_nodes": gpus // per_node}
    return Job.from_dicts({**MODEL, **(model or {})}, plan, system)


def task_seconds(j: Job, name: str, calibration: dict | None = None) -> list[float]:
    """Durations of the step graph's tasks called `name`, on `calibration` (the linear one by default)."""
    g = predict(j, calibration or linear_calibration()).sim.graph
    return [float(g.duration_s[t]) for t in range(g.num_tasks) if g.names[g.name[t]] == name]


def test_gradients_are_all_reduced_over_data_times_context_parallel_ranks():
    # dp 2 × cp 2: every GPU holds all 60,352 parameters; fp32 gradients (Megatron's default):
    # 241,408 bytes all-reduced over 4 ranks: 2·3/4 of them per rank
    j = job(data_parallel=2, context_parallel=2, overlap_grad_reduce=False)
    assert task_seconds(j, "grad_all_reduce") == [pytest.approx(2 * 3 / 4 * 4 * PARAMS / LINK)]


def test_zero1_reduce_scatters_gradients_gathers_weights_and_steps_its_shard():
    # ZeRO-1 over the 4 data × context ranks: gradients reduce-scattered (3/4 of 4 bytes per
    # parameter), the updated bf16 weights all-gathered (3/4 of 2 bytes), and the Adam step on a
    # quarter of the parameters: 30 bytes each (fp32 master, fp32 gradient, m, v read: 16; master,
    # m, v and the bf16 copy written: 14)
    j = job(data_parallel=2, context_parallel=2, zero_stage=1, overlap_grad_reduce=False, overlap_param_gather=False)
    assert task_seconds(j, "grad_reduce_scatter") == [pytest.approx(3 / 4 * 4 * PARAMS / LINK)]
    assert task_seconds(j, "param_all_gather") == [pytest.approx(3 / 4 * 2 * PARAMS / LINK)]
    assert task_seconds(j, "optimizer_step") == [pytest.approx(30 * PARAMS / 4 / HBM)]


def test_fsdp2_under_pipelining_reduce_scatters_each_stage_once_after_its_last_backward():
    # torchtitan's FSDP2 under torch.distributed.pipelining (grad_accumulation fsdp2, pp 2, dp 2, 4 micro-batches
    # a stage): every backward sums into whole fp32 gradients; one reduce-scatter a stage after its last backward
    # (REDUCE_GRAD), 1/2 of 4 bytes a parameter, the compute stream waiting for it. Stage 0: one layer
    # (12h² + 13h), the embedding V·h and positions S·h; stage 1: one layer, the final LayerNorm 2h and the tied
    # head's copy of the embedding V·h
    layer = 12 * H * H + 13 * H
    fields = dict(pipeline_parallel=2, data_parallel=2, zero_stage=2, main_params="fp32_weights", global_batch_size=8)
    j = job({"num_layers": 2}, grad_accumulation="fsdp2", **fields)
    expected = [1 / 2 * 4 * (layer + 2 * H + V * H) / LINK, 1 / 2 * 4 * (layer + V * H + S * H) / LINK]
    assert sorted(task_seconds(j, "grad_reduce_scatter.c0")) == pytest.approx(expected)
    g = predict(j, linear_calibration()).sim.graph
    labels = [g.task_label(t) for t in range(g.num_tasks) if "reduce_scatter" in g.names[g.name[t]]]
    assert len(labels) == 2 and all(label.endswith(":compute") for label in labels)
    # ZeRO-3 (reshard after forward) keeps a chunk's parameters gathered from a backward to its next pass
    # (set_reshard_after_backward(False)): 1F1B over 4 micro-batches, stage 0 F0 F1 B0 F2 B1 F3 B2 B3 gathers
    # in F0, F1, B0, B1, B2; stage 1 F0 B0 F1 B1 F2 B2 F3 B3 in F0, B0, B1, B2, B3: 10 passes of 2 units each
    # (embedding and layer, layer and head), where every pass gathers under Megatron-style ZeRO-3: 16
    for accumulation, gathers in (("fsdp2", 10 * 2), ("fused", 16 * 2)):
        g3 = predict(job({"num_layers": 2}, grad_accumulation=accumulation, **(fields | {"zero_stage": 3}))).sim.graph
        assert sum("fsdp_all_gather" in g3.names[g3.name[t]] for t in range(g3.num_tasks)) == gathers
    # and in memory, stage 0: its fp32 weights sharded over 2 ranks beside the bf16 copies kept whole, 4 / 2 + 2
    # bytes a parameter, and the whole fp32 sums, 4
    kept = predict(job({"num_layers": 2}, grad_accumulation="fsdp2", **(fields | {"zero_stage": 3}))).memory
    stage0 = layer + V * H + S * H
    assert (kept.weights_bytes, kept.gradients_bytes) == (stage0 * (4 / 2 + 2), stage0 * 4)
    # Megatron-Core-style ZeRO-2 (fused accumulation) reduce-scatters after every micro-batch's backward instead
    fused = predict(job({"num_layers": 2}, grad_accumulation="fused", **fields), linear_calibration()).sim.graph
    assert sum("grad_reduce_scatter.m" in fused.names[fused.name[t]] for t in range(fused.num_tasks)) == 2 * 4


def test_megatron_zeroes_checks_and_scales_its_gradient_buffer():
    # Megatron's contiguous fp32 gradient buffer (grad_accumulation fused, the default), dp 4 without overlap:
    # zeroed each step (4 bytes a parameter written), and before the one reduction its NaN check's norm (4 read)
    # and the scaling by 1/4 (4 read, 4 written)
    passes = [f"grad_buffer_pass.{i}" for i in range(3)]
    j = job(data_parallel=4, overlap_grad_reduce=False)
    assert [task_seconds(j, n) for n in passes] == [[pytest.approx(4 * PARAMS / HBM)], [12 * PARAMS / HBM], []]
    # averaged inside the collective (NeMo 2, Megatron-Bridge): the norm alone; without the NaN check, nothing
    avg = dict(data_parallel=4, overlap_grad_reduce=False, grad_average_in_collective=True)
    assert task_seconds(job(**avg), passes[1]) == [pytest.approx(4 * PARAMS / HBM)]
    assert task_seconds(job(**avg, grad_nan_check=False), passes[1]) == []
    # bf16 buffers: 2 bytes each; one rank: the norm, no scaling (its factor is 1)
    bf16 = job(data_parallel=4, overlap_grad_reduce=False, grad_reduce_dtype="bf16")
    assert task_seconds(bf16, passes[1]) == [pytest.approx(6 * PARAMS / HBM)]
    assert task_seconds(job(), passes[1]) == [pytest.approx(4 * PARAMS / HBM)]
    # overlapped, in buckets of 10,000 parameters: a pass per bucket, together the same 12 bytes a parameter
    g = predict(job(data_parallel=4, grad_bucket_size_params=10_000), linear_calibration()).sim.graph
    names = [g.names[g.name[t]] for t in range(g.num_tasks)]
    buckets = [g.duration_s[t] for t, n in enumerate(names) if n.startswith("grad_buffer_pass.") and n != passes[0]]
    assert sum(buckets) == pytest.approx(12 * PARAMS / HBM)
    assert len(buckets) == sum(n.startswith("grad_all_reduce") for n in names) > 1
    # PyTorch's own accumulation and FSDP keep no such buffer
    assert task_seconds(job(data_parallel=4, grad_accumulation="autograd"), passes[0]) == []
    assert task_seconds(job(data_parallel=4, zero_stage=3), passes[0]) == []
    # the routed experts averaged in the collective are still scaled, by expert dp / dp = 1/2 (dp 2, ep 2):
    # 2 local experts of gate + up 64·2·32 and down 32·64 weights, 8 bytes each; the rest, nothing
    moe = {"family": "llama", "num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 32}
    j = job(moe, **(avg | dict(data_parallel=2, expert_parallel=2, grad_nan_check=False)))
    assert task_seconds(j, passes[1]) == [pytest.approx(8 * 2 * (64 * 2 * 32 + 32 * 64) / HBM)]


def test_without_zero_every_gpu_steps_every_parameter():
    assert task_seconds(job(data_parallel=4), "optimizer_step") == [pytest.approx(30 * PARAMS / HBM)]
    # bf16 gradient buffers: the step reads 2-byte gradients (4 + 2 + 8 read, 14 written)
    bf16 = job(data_parallel=4, grad_reduce_dtype="bf16")
    assert task_seconds(bf16, "optimizer_step") == [pytest.approx(28 * PARAMS / HBM)]


def test_the_optimizer_step_runs_at_the_optimizer_curves_efficiency():
    # the linear calibration has no optimizer curve: the step is an elementwise pass (efficiency 1, above);
    # with one of e_max 1 (1 / (1 + e^0) = 0.5) the 30 bytes a parameter take twice as long
    cal = linear_calibration()
    cal["memory"]["optimizer"] = flat(e_max=1.0)
    assert task_seconds(job(data_parallel=4), "optimizer_step", cal) == [pytest.approx(30 * PARAMS / (0.5 * HBM))]


def test_fp32_training_gathers_fp32_weights_under_zero():
    # fp32 weights are 4 bytes; Adam reads weight, gradient, m, v (16) and writes weight, m, v (12)
    j = job(data_parallel=2, zero_stage=1, dtype="fp32", overlap_param_gather=False, overlap_grad_reduce=False)
    assert task_seconds(j, "param_all_gather") == [pytest.approx(1 / 2 * 4 * PARAMS / LINK)]
    assert task_seconds(j, "optimizer_step") == [pytest.approx(28 * PARAMS / 2 / HBM)]


def test_qkv_gemm_and_rotary_embedding_count_query_groups():
    # llama with 4 query heads in 2 groups (GQA), head 16, 32 tokens: QKV projects h to
    # (a + 2g)·d = 128 columns: 2·32·64·128 FLOPs; RoPE reads and writes q and k: 2·32·(4 + 2)·16·2 bytes
    llama = {"family": "llama", "num_query_groups": 2}
    ops = {o.name: o.amount for o in layer_forward(job(llama).model, job(llama).plan)}
    assert ops["qkv"] == 2 * 32 * 64 * (4 + 2 * 2) * 16
    assert ops["rope"] == 2 * 32 * (4 + 2) * 16 * 2
    tp2 = job(llama, tensor_parallel=2)  # column-parallel: half the columns per rank
    assert {o.name: o.amount for o in layer_forward(tp2.model, tp2.plan)}["qkv"] == 2 * 32 * 64 * 128 / 2


def test_context_parallel_ring_sends_grouped_keys_and_values_and_doubles_backward():
    # cp 2: 16 local tokens; each of the c − 1 = 1 ring steps passes K and V of the 2 groups:
    # 16 · 2·2·16 · 2 bytes. Backward, Transformer Engine sends at each of the c = 2 steps: the K, V
    # first, their gradients last; 2(c − 1) = 2 × the K, V bytes in all, 2·(2 − 1)/2 = 1 × per send
    j = job({"num_query_groups": 2}, context_parallel=2)
    fwd = {o.name: o for o in layer_forward(j.model, j.plan)}["cp_kv_exchange"]
    bwd = {o.name: o for o in layer_backward(j.model, j.plan)}["cp_kv_exchange.bwd"]
    assert (fwd.amount, fwd.count) == (16 * 2 * 2 * 16 * 2, 1)
    assert (bwd.amount, bwd.count) == (16 * 2 * 2 * 16 * 2, 2)


def test_context_parallel_ring_exposes_what_attention_does_not_hide():
    # cp 4, 2 groups: 8 local tokens, 3 ring steps of 8·64·2 = 1,024 bytes forward, 2,048 backward.
    # Attention: 4 heads × 8 queries × 32 keys, QKᵀ and AV of 2·16 FLOPs each, causal half: 32,768
    # FLOPs at 0.75 of the peak (FlashAttention-2 against GEMMs, costs/analytic.py), 2.5× backward
    j = job({"num_query_groups": 2}, context_parallel=4)
    attention_s = 4 * 8 * 32 * 2 * 2 * 16 / 2 / (0.75 * PEAK)
    exposed = (3 * 1024 / LINK - attention_s) + (3 * 2048 / LINK - 2.5 * attention_s)
    assert predict(j, linear_calibration()).family_time_s["cp_p2p_exposed"] == pytest.approx(exposed)


def test_pipeline_sends_one_tensor_parallel_shard_under_sequence_parallelism():
    # two layers on two stages; a micro-batch's activations are 32 tokens × 64 × 2 bytes = 4,096;
    # with sequence parallelism each of the t = 2 ranks sends its 1/t (Megatron's scatter-gather)
    two = {"num_layers": 2}
    sp = job(two, tensor_parallel=2, pipeline_parallel=2, sequence_parallel=True)
    assert task_seconds(sp, "send_act.m0.c0") == [pytest.approx(4096 / 2 / LINK)]
    assert task_seconds(job(two, tensor_parallel=2, pipeline_parallel=2), "send_act.m0.c0") == [
        pytest.approx(4096 / LINK)
    ]
    cp = job(two, context_parallel=2, pipeline_parallel=2)  # 16 tokens per context-parallel rank
    assert task_seconds(cp, "send_grad.m0.c0") == [pytest.approx(4096 / 2 / LINK)]


def test_a_send_between_nodes_runs_on_the_gpus_share_of_the_nics():
    # 2 GPUs per node, tp 2: the two stages sit on two nodes. A node's 8 NICs of LINK serve its
    # 2 GPUs: 4·LINK per GPU (SystemConfig.nic_bandwidth_per_gpu_bytes_per_s)
    j = job({"num_layers": 2}, gpus_per_node=2, tensor_parallel=2, pipeline_parallel=2)
    assert task_seconds(j, "send_act.m0.c0") == [pytest.approx(4096 / (8 * LINK / 2))]


def test_tied_embedding_gradients_are_all_reduced_in_fp32_between_first_and_last_stage():
    # pp 2: the first stage's embedding and the last stage's copy, V·h/t = 128·64 fp32 gradients,
    # all-reduced over those 2 ranks: 2·1/2 of the buffer
    j = job({"num_layers": 2}, pipeline_parallel=2)
    assert task_seconds(j, "tied_embedding_all_reduce") == [pytest.approx(V * H * 4 / LINK)] * 2


def test_memory_bound_bytes_of_a_sequence_parallel_llama_layer():
    # llama, 4 heads in 2 groups, SwiGLU of 128, tp 2 with sequence parallelism: norms and residuals
    # run on 32 / 2 = 16 tokens (Korthikanti §4.2.2); RMSNorm reads and writes 16·64·2 bytes, a
    # residual add reads two and writes one; RoPE and SwiGLU act on all 32 tokens of their heads
    # and columns (a tensor-parallel shard): (4 + 2) / 2 heads of 16, gate and up of 128 / 2 read,
    # their product written
    llama = job(
        {"family": "llama", "num_query_groups": 2, "ffn_hidden_size": 128}, tensor_parallel=2, sequence_parallel=True
    )
    ops = {o.name: o.amount for o in layer_forward(llama.model, llama.plan) if o.family != "gemm"}
    assert ops["input_norm"] == ops["post_attn_norm"] == 2 * 16 * 64 * 2
    assert ops["residual_1"] == ops["residual_2"] == 3 * 16 * 64 * 2
    assert ops["rope"] == 2 * 32 * (4 + 2) / 2 * 16 * 2
    assert ops["mlp_act"] == 3 * 32 * 128 / 2 * 2


def test_output_layer_splits_the_vocabulary_over_tensor_parallel_ranks():
    # tp 2: each rank computes 32 tokens × 128 / 2 logits (2·32·64·64 FLOPs) and Megatron-Core's
    # unfused vocab-parallel cross-entropy over them, bytes per bf16 logit: forward .float() (read 2,
    # write 4), max (read 4), subtract (4 + 4), exp (4 + 4), sum (4), divide (4 + 4) = 38; backward
    # mul_ by the loss gradient (4 + 4) and the cast of the fp32 gradient back to bf16 (4 + 2) = 14.
    # The max, the target's logit and the sum of exponentials over the two vocabulary shards: three fp32
    # all-reduces of one value a token (VocabParallelCrossEntropy.forward).
    # Unpadded (make_vocab_size_divisible_by 1): 128 / 2 = 64 rows a rank.
    j = job(tensor_parallel=2, make_vocab_size_divisible_by=1)
    head = head_forward(j.model, j.plan)
    ops = {o.name: o.amount for o in head}
    assert ops["logits"] == 2 * 32 * 64 * 128 / 2
    assert ops["cross_entropy"] == 32 * 128 / 2 * 38
    back = {o.name: o.amount for o in layer_backward_of_head(j)}
    assert back["cross_entropy.bwd"] == 32 * 128 / 2 * 14
    losses = [(o.name, o.comm_kind, o.amount) for o in head if o.name.startswith("cross_entropy.tp")]
    assert losses == [(f"cross_entropy.tp{s}", "all_reduce", 32 * 4) for s in ("", "1", "2")]
    # fused: the max, then the other two batched; TE's Triton loss: one all-gather of 3 values a token from
    # each of the 2 ranks (3 · 32 · 4 · 2 bytes in all); flash-attn's: the log-sum-exp gathered, the losses summed
    for kernel, want in (
        ("megatron_fused", [("all_reduce", 32 * 4), ("all_reduce", 2 * 32 * 4)]),
        ("te", [("all_gather", 3 * 32 * 4 * 2)]),
        ("flash_attn", [("all_gather", 32 * 4 * 2), ("all_reduce", 32 * 4)]),
    ):
        k = job(tensor_parallel=2, make_vocab_size_divisible_by=1, cross_entropy=kernel)
        got = [(o.comm_kind, o.amount) for o in head_forward(k.model, k.plan) if o.name.startswith("cross_entropy.tp")]
        assert got == want, kernel
    # Megatron's default pads 128 up to a multiple of 128 × tp = 256: 128 rows a rank, twice the logits
    padded = {o.name: o.amount for o in head_forward(job(tensor_parallel=2).model, job(tensor_parallel=2).plan)}
    assert padded["logits"] == 2 * 32 * 64 * 128
    assert padded["cross_entropy"] == 32 * 128 * 38


@pytest.mark.parametrize(
    ("kernel", "forward_b", "backward_b"),
    [
        # jit-fused: cast with max (2 + 4), subtract+exp in place (4 + 4), sum (4), divide (4 + 4);
        # backward scale in place (4 + 4) and the explicit cast (4 + 2)
        ("megatron_fused", 2 + 4 + 8 + 4 + 8, 8 + 6),
        # Transformer Engine's Triton kernel: one read forward, read and write in place backward
        ("te", 2, 2 + 2),
        # torch F.cross_entropy(logits.float()): cast (2 + 4), log_softmax 3 reads + 1 write of 4;
        # backward zero-filled nll gradient (4), log_softmax backward (4 + 4 + 4 + 4), cast (4 + 2)
        ("torch", 6 + 16, 4 + 16 + 6),
        # the same under torch.compile (Inductor): one online-softmax read of the bf16 logits forward;
        # backward one read of them and the bf16 gradient written
        ("torch_compiled", 2, 2 + 2),
        # flash-attn's CrossEntropyLoss: one kernel reads the logits forward; backward reads them, writes
        # a new bf16 gradient
        ("flash_attn", 2, 2 + 2),
    ],
)
def test_cross_entropy_kernels_move_the_bytes_their_sources_show(kernel: str, forward_b: int, backward_b: int):
    j = job(cross_entropy=kernel)
    fwd = {o.name: o.amount for o in head_forward(j.model, j.plan)}
    bwd = {o.name: o.amount for o in layer_backward_of_head(j)}
    assert fwd["cross_entropy"] == 32 * 128 * forward_b
    assert bwd["cross_entropy.bwd"] == 32 * 128 * backward_b


def test_cross_entropy_of_fp32_logits_casts_nothing():
    # fp32 training: .float() is the tensor itself, no cast either way: 32 forward (max 4, subtract
    # 8, exp 8, sum 4, divide 8), 8 backward
    j = job(dtype="fp32")
    assert {o.name: o.amount for o in head_forward(j.model, j.plan)}["cross_entropy"] == 32 * 128 * 32
    assert {o.name: o.amount for o in layer_backward_of_head(j)}["cross_entropy.bwd"] == 32 * 128 * 8


def layer_backward_of_head(j: Job) -> list:
    """The head's backward ops as the step builds them (backward_of its forward)."""
    return backward_of(head_forward(j.model, j.plan), j.plan)


def test_megatron_selective_recompute_runs_fused_attention_forward_again():
    # Megatron-Core checkpoints the fused kernel too: its forward (4 heads × 32 queries × 32 keys ×
    # 4·16 FLOPs, the causal half) runs once more before the backward; nothing else does
    plain, selective = job(), job(recompute="selective")
    extra = layer_backward(selective.model, selective.plan)[: -len(layer_backward(plain.model, plain.plan))]
    assert [o.name for o in extra] == ["recompute.core_attention"]
    assert extra[0].amount == 4 * 32 * 32 * 4 * 16 / 2
    # torchtitan's per-op policy saves the attention kernel's output: it does not run again
    op = job(recompute="selective", selective_recompute="op")
    assert not any(
        "core_attention" in o.name and o.name.startswith("recompute.") for o in layer_backward(op.model, op.plan)
    )


def test_megatron_selective_recompute_under_context_parallelism_passes_the_ring_again():
    # cp 2: the recomputed attention call runs Transformer Engine's ring again: one more K/V exchange
    j = job(recompute="selective", context_parallel=2)
    names = [o.name for o in layer_backward(j.model, j.plan) if o.name.startswith("recompute.")]
    # (the diagonal call, the other ring steps' call and their merge: tests/test_context_parallel.py)
    assert names == [
        "recompute.core_attention",
        "recompute.core_attention.ring",
        "recompute.core_attention.merge",
        "recompute.cp_kv_exchange",
    ]


def test_context_parallel_ring_crosses_nodes_when_its_ranks_sit_tensor_parallel_apart():
    # tp 2 × cp 2 on nodes of 2 GPUs with one NIC of LINK / 8 each: Megatron's rank order puts the
    # two context-parallel ranks tp = 2 apart, on two nodes; a GPU drives (LINK / 8) / 2 of the
    # network. Each rank's ring step: 16 tokens × K and V of 2 groups / tp × 16 × 2 bytes = 1,024.
    # Attention per rank: 2 heads × 16 queries × 32 keys × 2·2·16 FLOPs, causal half, at 0.75 of
    # the peak; backward 2.5× that against twice the ring
    network = {**SYSTEM["network"], "nics_per_node": 1, "nic_bandwidth_bytes_per_s": LINK / 8}
    system = {**SYSTEM, "network": network, "node": {**SYSTEM["node"], "gpus_per_node": 2}, "num_nodes": 2}
    plan = {"tensor_parallel": 2, "context_parallel": 2, "data_parallel": 1}
    j = Job.from_dicts({**MODEL, "num_query_groups": 2}, plan, system)
    step_s, attention_s = 1024 / (LINK / 16), 2 * 16 * 32 * 2 * 2 * 16 / 2 / (0.75 * PEAK)
    exposed = (step_s - attention_s) + (2 * step_s - 2.5 * attention_s)
    assert predict(j, linear_calibration()).family_time_s["cp_p2p_exposed"] == pytest.approx(exposed)


def test_moe_tokens_are_permuted_before_and_unpermuted_after_the_experts():
    # 32 tokens, top-2, even load: 64 routed rows of h = 64. Permute: read and write each copy
    # (2·64·64·2 bytes); unpermute: read the copies and their routing weights, write 32 rows
    moe = {"family": "llama", "num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 32}
    j = job(moe, data_parallel=2, expert_parallel=2)
    ops = {o.name: o.amount for o in layer_forward(j.model, j.plan, moe=True)}
    assert ops["moe_permute"] == 2 * 64 * 64 * 2
    assert ops["moe_unpermute"] == (2 * 64 + 32) * 64 * 2
    # the permute's backward (index_select's): 32 rows zero-filled, the 64 routed rows' gradients read and
    # index-added into them (read and write 32): (64 + 2·32)·64·2 bytes
    bwd = {o.name: o.amount for o in layer_backward(j.model, j.plan, moe=True)}
    assert bwd["moe_permute.bwd"] == (64 + 2 * 32) * 64 * 2


def test_received_tokens_are_sorted_by_local_expert_and_back():
    # Megatron-Core's permutation 2: with 2 local experts (4 over ep 2) the 64 received rows of h = 64
    # are copied into expert order before the experts and back after, read and write each way
    # (2·64·64·2 bytes), the backward the same copies of the gradients; one local expert (ep 4): none.
    # torchtitan sorts whenever ep > 1, its backward an index scatter priced at twice the bytes
    moe = {"family": "llama", "num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 32}
    copy = 2 * 64 * 64 * 2
    for dispatcher, ep, backward in (("alltoall", 2, copy), ("torchtitan", 2, 2 * copy), ("torchtitan", 4, 2 * copy)):
        j = job(moe, data_parallel=ep, expert_parallel=ep, moe_token_dispatcher=dispatcher)
        fwd = [o.name for o in layer_forward(j.model, j.plan, moe=True)]
        assert fwd.index("moe_dispatch") < fwd.index("moe_sort") < fwd.index("expert_up")
        assert fwd.index("expert_down") < fwd.index("moe_unsort") < fwd.index("moe_combine")
        bwd = {o.name: o.amount for o in layer_backward(j.model, j.plan, moe=True)}
        fwd_amount = {o.name: o.amount for o in layer_forward(j.model, j.plan, moe=True)}
        assert (fwd_amount["moe_sort"], fwd_amount["moe_unsort"]) == (copy, copy)
        assert (bwd["moe_sort.bwd"], bwd["moe_unsort.bwd"]) == (backward, backward)
    for dispatcher, ep in (("alltoall", 4), ("torchtitan", 1)):
        j = job(moe, data_parallel=ep, expert_parallel=ep, moe_token_dispatcher=dispatcher)
        assert not any(o.name.startswith("moe_sort") for o in layer_forward(j.model, j.plan, moe=True))


def test_megatron_rank_order_places_tensor_then_context_then_data_parallel_ranks():
    # tp 2 × cp 2 × dp 2 on nodes of 2 GPUs: tensor-parallel ranks adjacent (0, 1: one node);
    # context-parallel ranks tp = 2 apart (0, 2: two nodes); gradients over the 4 data × context
    # ranks 0, 2, 4, 6 (four nodes); the next pipeline stage 8 ranks on
    j = job(
        {"num_layers": 2}, gpus_per_node=2, tensor_parallel=2, context_parallel=2, data_parallel=2, pipeline_parallel=2
    )
    groups = Groups.of(j)
    assert (groups.tp, groups.cp, groups.grad) == (
        GroupPlacement(2, 1, 2),
        GroupPlacement(2, 2, 1),
        GroupPlacement(4, 4, 1),
    )
    assert groups.stage_cross_node


def test_each_local_expert_runs_its_own_gemms():
    # 2 local experts (4 over ep 2) share the 64 routed rows: up (gate + up) 2·64·64·2·32 FLOPs and
    # down 2·64·32·64 in all, one GEMM per expert; SwiGLU reads 2 and writes 1 of 64 × 32 × 2 bytes.
    # Forward and backward (2 GEMMs per GEMM, twice the bytes): 3× the forward. Grouped: no copies
    moe = {"family": "llama", "num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 32}
    j = job(moe, data_parallel=2, expert_parallel=2, moe_grouped_gemm=True)
    forward_s = (2 * 64 * 64 * 2 * 32 + 2 * 64 * 32 * 64) / PEAK + 3 * 64 * 32 * 2 / HBM
    assert predict(j, linear_calibration()).family_time_s["experts"] == pytest.approx(3 * forward_s)
