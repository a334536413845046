"""DeepSpeed v0.3's ZeRO-3 (plan.zero3_collectives per_tensor_list, workloads/transformer.py _deepspeed_fetch):
each unit's parameters gathered tensor by tensor through lists of world-size views, between host
synchronisations; values computed by hand on test_golden's one-layer GPT."""

from __future__ import annotations

import pytest
from test_golden import MODEL, SYSTEM, linear_calibration

from itercast.config.job import Job
from itercast.errors import ConfigError
from itercast.predict import predict

LAUNCH_S = 1e-6


def job(dp: int = 2, **plan: object) -> Job:
    gpu = {**SYSTEM["gpu"], "kernel_launch_overhead_s": LAUNCH_S}
    system = {**SYSTEM, "gpu": gpu, "node": {**SYSTEM["node"], "gpus_per_node": dp}, "num_nodes": 1}
    base = {"data_parallel": dp, "zero_stage": 3, "zero3_fetch": "deepspeed"}
    return Job.from_dicts(MODEL, base | plan, system)


def tasks(j: Job) -> dict[str, tuple[float, float, float]]:
    """Per task name (one rank: pp 1), (duration, start, end) in seconds."""
    sim = predict(j, linear_calibration()).sim
    g = sim.graph
    return {
        g.names[g.name[t]]: (float(g.duration_s[t]), float(sim.start_s[t]), float(sim.end_s[t]))
        for t in range(g.num_tasks)
    }


def test_each_tensor_is_copied_apart_once_per_rank_and_list_collective():
    t = tasks(job(zero3_collectives="per_tensor_list"))
    # gpt, one layer: the embedding's word and learned position tables (2 tensors); the layer's two
    # LayerNorms (weight, bias) and four linears with biases (2·2 + 4·2 = 12); the tied head's final
    # LayerNorm (2). Forward: one gathering list each; backward (units in reverse) a gather and a
    # gradient reduce-scatter each. dp 2: two copies a tensor and list, 1 µs each
    expected = {"F0.c0.0": 2 * 2, "F0.c0.1": 12 * 2, "F0.c0.2": 2 * 2}
    expected |= {"B0.c0.0": 2 * 2 * 2, "B0.c0.1": 12 * 2 * 2, "B0.c0.2": 2 * 2 * 2}
    for unit, copies in expected.items():
        assert t[f"list_copies.zero3_all_gather.{unit}"][0] == pytest.approx(copies * LAUNCH_S)
        # blocking: the gather after its copies, the unit's compute after the gather
        gather = t[f"zero3_all_gather.{unit}"]
        assert gather[1] >= t[f"list_copies.zero3_all_gather.{unit}"][2] - 1e-15
    assert not any(name.startswith("fsdp_all_gather") for name in t)
    # FSDP's coalesced gathers (the default): no copies, the next unit's gather prefetched
    coalesced = tasks(job())
    assert not any(name.startswith("list_copies") for name in coalesced)
    assert any(name.startswith("fsdp_all_gather") for name in coalesced)


def test_the_per_tensor_lists_lengthen_the_step_by_at_least_their_copies():
    slow = predict(job(zero3_collectives="per_tensor_list"), linear_calibration()).step_time_s
    fast = predict(job(), linear_calibration()).step_time_s
    copies = (2 + 12 + 2) * 2 * (1 + 2) * LAUNCH_S  # 16 tensors, dp 2, one forward and two backward lists
    assert slow - fast >= copies * (1 - 1e-9)


def test_per_tensor_lists_are_deepspeeds_zero3_only():
    with pytest.raises(ConfigError, match="zero3_collectives"):
        job(zero3_fetch="layer", zero3_collectives="per_tensor_list")
    with pytest.raises(ConfigError, match="zero3_collectives"):
        job(zero_stage=2, zero3_collectives="per_tensor_list")


def test_the_search_refuses_what_its_fast_path_does_not_price():
    from itercast.search.plan_search import check_fast_path_plan

    check_fast_path_plan({"zero_stage": 3})  # coalesced by default: searched
    with pytest.raises(ConfigError, match=r"zero3_collectives per_tensor_list .* `itercast predict`"):
        check_fast_path_plan({"zero_stage": 3, "zero3_fetch": "deepspeed", "zero3_collectives": "per_tensor_list"})


def test_an_moe_model_is_refused_not_priced_without_its_experts():
    gpu = {**SYSTEM["gpu"], "kernel_launch_overhead_s": LAUNCH_S}
    system = {**SYSTEM, "gpu": gpu, "node": {**SYSTEM["node"], "gpus_per_node": 2}, "num_nodes": 1}
    moe = MODEL | {"num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 32}
    plan = {"data_parallel": 2, "zero_stage": 3, "zero3_fetch": "deepspeed", "zero3_collectives": "per_tensor_list"}
    with pytest.raises(ConfigError, match="ran no experts: expected a dense model; got 4 experts"):
        predict(Job.from_dicts(moe, plan, system), linear_calibration())


def test_each_tensor_is_a_collective_of_its_own_paying_its_latency():
    """With a 1 ms hop inside the node every tensor's collective costs its floor (dp 2: one hop; the
    largest tensor, the MLP's 64 × 256 weight in bf16, moves 16 KiB of bus bytes: 1.6 µs at 10 GB/s),
    so a unit's gather takes its tensors × 1 ms, where one collective of the unit would take 1 ms."""
    hop_s = 1e-3
    gpu = {**SYSTEM["gpu"], "kernel_launch_overhead_s": LAUNCH_S}
    node = {**SYSTEM["node"], "gpus_per_node": 2, "intra_node_latency_s": hop_s}
    system = {**SYSTEM, "gpu": gpu, "node": node, "num_nodes": 1}
    plan = {"data_parallel": 2, "zero_stage": 3, "zero3_fetch": "deepspeed", "zero3_collectives": "per_tensor_list"}
    sim = predict(Job.from_dicts(MODEL, plan, system), linear_calibration()).sim
    g = sim.graph
    took = {g.names[g.name[t]]: float(g.duration_s[t]) for t in range(g.num_tasks)}
    # embedding: word table, positions (2); layer: 2 LayerNorms × (weight, bias), 4 linears × (weight, bias) (12)
    assert took["zero3_all_gather.F0.c0.0"] == pytest.approx(2 * hop_s)
    assert took["zero3_all_gather.F0.c0.1"] == pytest.approx(12 * hop_s)
    assert took["zero3_all_gather.B0.c0.1"] == pytest.approx(12 * hop_s)
    assert took["grad_reduce_scatter.m0.c0.1"] == pytest.approx(12 * hop_s)  # the layer's gradients, tensor by tensor


@pytest.mark.parametrize(
    ("model", "tp"),
    [
        (MODEL, 1),  # gpt: LayerNorm, biases, learned positions, tied
        (MODEL | {"family": "llama", "num_query_groups": 2, "ffn_hidden_size": 96, "tie_embeddings": False}, 2),
    ],
)
def test_the_tensors_of_a_unit_add_up_to_its_parameters(model, tp):
    from itercast.workloads.transformer import unit_tensors

    j = Job.from_dicts(model, {"tensor_parallel": tp}, {**SYSTEM, "node": {**SYSTEM["node"], "gpus_per_node": tp}})
    m = j.model
    h, s = 64, 32
    v = 128 * tp  # the vocabulary of 128 padded to a multiple of 128 · tp (Megatron's default)
    assert sum(unit_tensors(j, "layer")) == pytest.approx(m.layer_params_per_rank(tp))
    assert sum(unit_tensors(j, "embed")) == pytest.approx(v * h / tp + (s * h if m.family == "gpt" else 0))
    head = 2 * h if m.family == "gpt" else h + v * h / tp  # final norm; llama untied: its output weight
    assert sum(unit_tensors(j, "head")) == pytest.approx(head)
    # llama: RMSNorm weights (2), no biases, GQA (4 query heads of 16, 2 key/value groups), gated MLP
    if m.family == "llama":
        q_kv = (4 + 2 * 2) * 16
        expected = (h, h, h * q_kv / tp, 4 * 16 * h / tp, 2 * h * 96 / tp, 96 * h / tp)
        assert unit_tensors(j, "layer") == pytest.approx(expected)


def test_multi_latent_attention_is_refused_not_priced_with_other_tensors():
    gpu = {**SYSTEM["gpu"], "kernel_launch_overhead_s": LAUNCH_S}
    system = {**SYSTEM, "gpu": gpu, "node": {**SYSTEM["node"], "gpus_per_node": 2}, "num_nodes": 1}
    mla = MODEL | {"kv_lora_rank": 16, "qk_rope_head_dim": 8}
    plan = {"data_parallel": 2, "zero_stage": 3, "zero3_fetch": "deepspeed", "zero3_collectives": "per_tensor_list"}
    with pytest.raises(ConfigError, match="without multi-latent attention; got kv_lora_rank 16"):
        predict(Job.from_dicts(mla, plan, system), linear_calibration())
