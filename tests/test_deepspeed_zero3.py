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


def job(dp: int = 2, launch_s: float = LAUNCH_S, **plan: object) -> Job:
    gpu = {**SYSTEM["gpu"], "kernel_launch_overhead_s": launch_s}
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
    # LayerNorm (2). Each unit, forward and backward, gathers each tensor through a list (its copies out
    # launched after the gather is enqueued, beside it); a backward also reduce-scatters each gradient
    # through a list (its copies in launched before). dp 2: two copies a tensor and list, 1 µs each
    tensors = {"0": 2, "1": 12, "2": 2}
    for unit, n in tensors.items():
        for p in ("F", "B"):
            name = f"zero3_all_gather.{p}0.c0.{unit}"
            copies, gather = t[f"list_copies.{name}"], t[name]
            assert copies[0] == pytest.approx(n * 2 * LAUNCH_S)
            assert copies[1] == pytest.approx(gather[1], abs=1e-15)  # beside the gather, from its start
            launch = t[f"launch.{p}0.c0.{unit}"]  # the unit's compute, issued after both have ended
            assert launch[1] == pytest.approx(max(copies[2], gather[2]), abs=1e-15)
            scatter = t.get(f"scatter_copies.{name}")
            if p == "F":
                assert scatter is None
            else:  # before the gather and its copies
                assert scatter[0] == pytest.approx(n * 2 * LAUNCH_S)
                assert gather[1] == pytest.approx(scatter[2], abs=1e-15)
    # the layer's gathers, 49,984 parameters (LayerNorms 4·64, QKV 12,288 + 192, output 4,096 + 64, fc1 16,384
    # + 256, fc2 16,384 + 64) in bf16 over dp 2 at 1e10 B/s: 1/2 · 2 · 49,984 / 1e10 = 4.9984 µs on the linear
    # calibration; its 24 copies 24 µs: the host binds
    forward = t["zero3_all_gather.F0.c0.1"]
    assert forward[0] == pytest.approx(4.9984e-6)
    assert t["launch.F0.c0.1"][1] - forward[1] == pytest.approx(24e-6)
    assert not any(name.startswith("fsdp_all_gather") for name in t)
    # FSDP's coalesced gathers (the default): no copies, the next unit's gather prefetched
    coalesced = tasks(job())
    assert not any(name.startswith(("list_copies", "scatter_copies")) for name in coalesced)
    assert any(name.startswith("fsdp_all_gather") for name in coalesced)


@pytest.mark.parametrize(
    ("launch_s", "expected_s"),
    [
        # 0.01 µs a launch, 0.02 µs a tensor's 2 copies: the weights' gathers bind (QKV 12,288 parameters 1.2288 µs,
        # output 0.4096, fc1 and fc2 1.6384 each, fc1's bias 0.0256), the other 7 tensors' copies (their gathers
        # 0.0064 or 0.0192 µs): 4.9408 + 7 · 0.02 = 5.0808 µs
        (1e-8, 5.0808e-6),
        # 0.5 µs a launch, 1 µs a tensor: QKV's, fc1's and fc2's gathers bind, 1.2288 + 2 · 1.6384, the other 9
        # tensors' copies: 4.5056 + 9 = 13.5056 µs, where the gathers beside the copies take max(4.9984, 12) = 12
        (0.5e-6, 13.5056e-6),
        # 1 µs a launch, 2 µs a tensor: every tensor's copies bind, 12 · 2 = 24 µs
        (1e-6, 24e-6),
    ],
)
def test_each_tensor_takes_its_gather_or_its_copies_whichever_is_longer(launch_s: float, expected_s: float):
    # the layer's 12 tensors, each gathered over dp 2 at 1e10 B/s in bf16: n · 1e-10 s for n parameters
    t = tasks(job(launch_s=launch_s, zero3_collectives="per_tensor_list"))
    forward = t["zero3_all_gather.F0.c0.1"]
    assert t["launch.F0.c0.1"][1] - forward[1] == pytest.approx(expected_s)


def test_the_per_tensor_lists_lengthen_the_step_by_at_least_their_copies():
    # here every unit's gathers are shorter than its copies (above), so every copy is on the step's path
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
