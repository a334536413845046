"""Megatron-Core's selective recompute by module (plan.recompute_modules; transformer_config.py,
transformer_layer.py, moe/experts.py and tensor_parallel/random.py): what each module stops keeping,
what runs again before the layer's backward, and the launch settings that ask for it. Every expected
value is worked out by hand in the comments."""

from __future__ import annotations

import itertools

import pytest
from helpers import fast_vs_graph
from typer.testing import CliRunner

from itercast.cli.app import app
from itercast.config.job import Job
from itercast.errors import ConfigError
from itercast.memory import activation_bytes_per_token_layer
from itercast.predict import predict
from itercast.workloads.transformer import TransformerStepBuilder
from itercast.workloads.transformer_ops import layer_backward, layer_forward

# llama: h 64, 4 heads of 16, SwiGLU of 128, 32 tokens; MoE: 4 experts of SwiGLU width 32, top-2
MODEL = {"family": "llama", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 128}
MODEL |= {"seq_length": 32, "vocab_size": 128}
MOE = {"num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 32}


def job(model: dict, **plan: object) -> Job:
    system = {"preset": "dgx-h100", "num_nodes": 1, "node": {"gpus_per_node": 1}}
    return Job.from_dicts(MODEL | model, {"tensor_parallel": 1} | plan, system)


def selective(*modules: str) -> dict:
    return {"recompute": "selective", "recompute_modules": list(modules)}


def test_mlp_keeps_the_dense_mlp_input_only():
    # bf16 dense layer: 1,664 B a token without recompute (norm inputs 256, QKV and MLP inputs 256, q k v 384,
    # projection input 128, SwiGLU outputs 512, activation output 256 — 4 heads in 4 groups: q k v 2·12·16 = 384).
    # The checkpointed MLP keeps the pre-MLP norm's input (already counted) and drops its fc1 input 2·64 = 128,
    # the gate and up outputs 2·2·128 = 512 and the activation output 2·128 = 256
    none = activation_bytes_per_token_layer(job({}))
    assert none == 256 + 256 + 384 + 128 + 512 + 256 == 1792
    assert activation_bytes_per_token_layer(job({}, **selective("mlp"))) == 1792 - 128 - 512 - 256 == 896
    # fused attention keeps nothing core_attn would drop
    assert activation_bytes_per_token_layer(job({}, **selective("core_attn"))) == 1792


def test_layernorm_and_moe_act_drop_the_norm_output_and_the_expert_activation_output():
    # MoE layer, bf16: 1,688 B a token (test_memory_moe_by_hand). layernorm discards the pre-MLP norm's output,
    # the router's 16-bit input 2·64 = 128; moe_act each routed copy's activation output 2·32 = 64, two copies
    base = {"moe_grouped_gemm": True}
    assert activation_bytes_per_token_layer(job(MOE, **base), moe=True) == 1688
    assert activation_bytes_per_token_layer(job(MOE, **base, **selective("layernorm")), moe=True) == 1688 - 128
    assert activation_bytes_per_token_layer(job(MOE, **base, **selective("moe_act")), moe=True) == 1688 - 2 * 64
    both = job(MOE, **base, **selective("layernorm", "moe_act"))
    assert activation_bytes_per_token_layer(both, moe=True) == 1688 - 128 - 128 == 1432
    # a dense layer recomputes neither: its norms are fused into Transformer Engine's linears
    assert activation_bytes_per_token_layer(both) == activation_bytes_per_token_layer(job(MOE, **base))


def test_what_runs_again_before_the_backward_and_the_restored_outputs():
    j = job(MOE, moe_grouped_gemm=True, **selective("layernorm", "moe_act"))
    again = {o.name: o.amount for o in layer_backward(j.model, j.plan, moe=True) if o.name.startswith("recompute.")}
    # the pre-MLP RMSNorm reads and writes 32 tokens × 64 × 2 B = 8,192 B; the SwiGLU reads gate and up and writes
    # one: 3 × 64 copies × 32 × 2 B = 12,288 B; CheckpointWithoutOutput copies each output back into the storage
    # the forward discarded: norm 2 × 4,096 B, activation 2 × 64 × 32 × 2 B = 8,192 B
    assert again == {
        "recompute.post_attn_norm": 8192,
        "recompute.expert_act": 12288,
        "recompute.post_attn_norm.restore": 8192,
        "recompute.expert_act.restore": 8192,
    }
    # a dense layer's norms are fused into Transformer Engine's linears: layernorm and moe_act rerun nothing there
    assert not [o for o in layer_backward(j.model, j.plan) if o.name.startswith("recompute.")]
    dense = job({}, **selective("mlp"))
    names = [o.name for o in layer_backward(dense.model, dense.plan) if o.name.startswith("recompute.")]
    assert names == ["recompute.post_attn_norm", "recompute.mlp_up", "recompute.mlp_act", "recompute.mlp_down"]


def test_mlp_recompute_counts_the_dense_mlp_matmuls_in_hardware_flops():
    # one more forward of each layer's SwiGLU MLP: gate, up and down, 3 × 2 × 64 × 128 = 49,152 FLOPs a token,
    # 2 layers × 32 tokens of 1 sequence
    plain, again = predict(job({})), predict(job({}, **selective("mlp")))
    assert again.hardware_flops_per_step - plain.hardware_flops_per_step == pytest.approx(2 * 32 * 49152)


# multi-latent attention: query latent 48, key-value latent 32, heads of 16 + 8 rotary (query and key) and 16 (value)
MLA = {"q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16}


def test_mla_up_proj_drops_query_key_and_value_and_runs_the_up_projections_again():
    # the fused attention kernel keeps q, k and v: 4 heads × (24 + 24 + 16) × 2 B = 512 B a token, which the
    # output-discarding checkpoint frees; its inputs, the normed latents, stay (in bf16 the up projections' own)
    plain = activation_bytes_per_token_layer(job(MLA))
    assert plain - activation_bytes_per_token_layer(job(MLA, **selective("mla_up_proj"))) == 512
    # under fp8 the up projections kept 1-byte copies of the 48 + 32 latents; the checkpoint keeps them 16-bit
    fp8 = {"dtype": "fp8", "fp8_recipe": "tensorwise"}
    fp8_plain = activation_bytes_per_token_layer(job(MLA, **fp8))
    assert fp8_plain - activation_bytes_per_token_layer(job(MLA, **fp8, **selective("mla_up_proj"))) == 512 - 80
    j = job(MLA, **selective("mla_up_proj"))
    again = {o.name: o.amount for o in layer_backward(j.model, j.plan) if o.name.startswith("recompute.")}
    # 32 tokens: query up 2 · 32 · 48 · (4 · 24) FLOPs, key-value up 2 · 32 · 32 · 4 · (16 + 16), the rotary part
    # of 4 query heads and the one shared key, read and written: 2 · 32 · 5 · 8 · 2 B; q, k and v copied back
    # into the discarded storage: 2 · 32 · 4 · 64 · 2 B
    assert again == {
        "recompute.q_up": 2 * 32 * 48 * 96,
        "recompute.kv_up": 2 * 32 * 32 * 128,
        "recompute.rope": 2 * 32 * 5 * 8 * 2,
        "recompute.mla_up_proj.restore": 2 * 32 * 4 * 64 * 2,
    }
    # without a query latent the query's one projection from h 64 runs again
    no_q = job(MLA | {"q_lora_rank": None}, **selective("mla_up_proj"))
    names = [o.name for o in layer_backward(no_q.model, no_q.plan) if o.name.startswith("recompute.")]
    assert names[0] == "recompute.q_proj"
    # hardware FLOPs: both up projections again, 2 layers × 32 tokens × 2 · (48 · 96 + 32 · 128)
    assert predict(j).hardware_flops_per_step - predict(job(MLA)).hardware_flops_per_step == pytest.approx(
        2 * 32 * 2 * (48 * 96 + 32 * 128)
    )


def test_shared_experts_keep_their_input_only_and_run_again_whole():
    shared = MOE | {"moe_shared_ffn_hidden_size": 32, "moe_first_dense_layers": 1}  # a dense layer, an MoE layer
    # the shared SwiGLU of width 32 keeps gate and up outputs 2 · 2 · 32 and the activation output 2 · 32 = 192 B
    # a token; its input is the router's, kept either way
    plain = activation_bytes_per_token_layer(job(shared), moe=True)
    assert plain - activation_bytes_per_token_layer(job(shared, **selective("shared_experts")), moe=True) == 192
    # under fp8 their fc1 kept its own 1-byte copy of the input, 64 B, and their fc1 input 1 B a unit of width:
    # 2 · 2 · 32 + 32 + 64; with layernorm that copy is dropped already (its drop: the norm output, both copies)
    fp8 = {"dtype": "fp8", "fp8_recipe": "tensorwise"}
    fp8_plain = activation_bytes_per_token_layer(job(shared, **fp8), moe=True)
    fp8_again = activation_bytes_per_token_layer(job(shared, **fp8, **selective("shared_experts")), moe=True)
    assert fp8_plain - fp8_again == 224
    norm, both = (job(shared, **fp8, **selective(*m)) for m in (("layernorm",), ("layernorm", "shared_experts")))
    assert activation_bytes_per_token_layer(norm, moe=True) - activation_bytes_per_token_layer(both, moe=True) == 160
    j = job(shared, **selective("shared_experts"))
    again = {o.name: o.amount for o in layer_backward(j.model, j.plan, moe=True) if o.name.startswith("recompute.")}
    # gate and up 2 · 32 · 64 · 64 FLOPs, SwiGLU reads two and writes one 3 · 32 · 32 · 2 B, down 2 · 32 · 32 · 64
    assert again == {
        "recompute.shared_up": 2 * 32 * 64 * 64,
        "recompute.shared_act": 3 * 32 * 32 * 2,
        "recompute.shared_down": 2 * 32 * 32 * 64,
    }
    # 1 MoE layer × 32 tokens × the three matmuls, 2 · 3 · 64 · 32 FLOPs a token
    assert predict(j).hardware_flops_per_step - predict(job(shared)).hardware_flops_per_step == pytest.approx(
        32 * 2 * 3 * 64 * 32
    )


def test_moe_keeps_the_moe_layers_input_only_and_runs_it_again_whole():
    # of the MoE layer's 1,688 B a token (test_layernorm_and_moe_act_...) the layer checkpointed whole keeps its
    # input, the router's 2 · 64 = 128 B, and drops per routed copy the gathered fc1 input 2 · 64, the gate and up
    # outputs 2 · 2 · 32, the activation output 2 · 32 and the fp32 probability 4 (324 B, two copies), and the
    # router's fp32 scores 4 · 4: 664 B; with layernorm the input too
    base = {"moe_grouped_gemm": True}
    assert activation_bytes_per_token_layer(job(MOE, **base, **selective("moe")), moe=True) == 1688 - 664
    both = job(MOE, **base, **selective("moe", "layernorm"))
    assert activation_bytes_per_token_layer(both, moe=True) == 1688 - 664 - 128
    # with shared experts of width 32 their 192 B too (test_shared_experts_keep_their_input_only_...)
    shared = MOE | {"moe_shared_ffn_hidden_size": 32}
    plain, whole = (job(shared, **base, **selective(*m)) for m in (("core_attn",), ("moe",)))
    assert activation_bytes_per_token_layer(plain, moe=True) - activation_bytes_per_token_layer(whole, moe=True) == (
        664 + 192
    )
    j = job(MOE, **base, **selective("moe"))
    fwd = [o for o in layer_forward(j.model, j.plan, moe=True)]
    again = {o.name: o.amount for o in layer_backward(j.model, j.plan, moe=True) if o.name.startswith("recompute.")}
    block = fwd[[o.name for o in fwd].index("post_attn_norm") + 1 : [o.name for o in fwd].index("residual_2")]
    assert again == {f"recompute.{o.name}": o.amount for o in block}  # the router to the unpermutation
    # the router's GEMM 2 · 32 · 64 · 4 FLOPs; the dispatch's 2 copies of 32 tokens × 64 × 2 B
    assert (again["recompute.router"], again["recompute.moe_dispatch"]) == (2 * 32 * 64 * 4, 2 * 32 * 64 * 2)
    # hardware FLOPs: 2 MoE layers × 32 tokens × (router 2 · 64 · 4 + 2 copies × 2 · 3 · 64 · 32)
    assert predict(j).hardware_flops_per_step - predict(job(MOE, **base)).hardware_flops_per_step == pytest.approx(
        2 * 32 * (512 + 2 * 2 * 3 * 64 * 32)
    )


def test_moe_recompute_waits_for_the_counts_again_in_the_backward():
    # Megatron-Core's alltoall dispatcher over 2 expert-parallel ranks: the host waits for the counts before the
    # forward's all-to-all, and again in the recomputed forward; under core_attn the backward reuses the splits
    system = {"preset": "dgx-h100", "num_nodes": 1, "node": {"gpus_per_node": 2}}
    fields = {"expert_parallel": 2, "data_parallel": 2, "moe_grouped_gemm": True}
    for modules, waits in ((("moe",), True), (("core_attn",), False)):
        j = Job.from_dicts(MODEL | MOE, fields | selective(*modules), system)
        unit = TransformerStepBuilder(j).stage_units[0]
        assert unit.moe_fwd_wait is not None and (unit.moe_bwd_wait is not None) == waits


def test_the_fast_path_prices_the_moe_module_as_the_graph_does():
    # test_moe_host_sync's GPU-bound grid (hidden 1024, 4096 tokens; EP 1, 2, 4 × PP 1, 2 on one node), the host
    # waiting again in each recomputed MoE forward: measured worst 0.66% (0.44% under full recompute)
    mid = {"preset": "moe-tiny", "hidden_size": 1024, "ffn_hidden_size": 2048, "moe_shared_ffn_hidden_size": 1024}
    mid |= {"num_attention_heads": 8, "seq_length": 4096}
    plans = [
        {"expert_parallel": ep, "pipeline_parallel": pp, "data_parallel": 8 // pp, "global_batch_size": 32 // pp}
        | {"moe_grouped_gemm": True, **selective("moe")}
        for ep, pp in itertools.product((1, 2, 4), (1, 2))
    ]
    valid, rel = fast_vs_graph(mid, {"preset": "dgx-h100", "num_nodes": 1}, plans)
    assert len(valid) == 6 and rel.max() < 0.01


@pytest.mark.parametrize(
    ("model", "plan", "message"),
    [
        ({}, {"recompute_modules": ["mlp"]}, "needs recompute=selective and selective_recompute=modules"),
        ({}, {"recompute": "full", "recompute_modules": ["mlp"]}, "got recompute=full"),
        (MOE, selective("moe_act"), "moe_act needs moe_grouped_gemm=true"),
        (MOE, {"moe_grouped_gemm": True, **selective()}, "expected one or more distinct modules; got []"),
        ({}, selective("mlp", "mlp"), "got ['mlp', 'mlp']"),
        ({}, {"dtype": "fp8", "fp8_recipe": "delayed", **selective("layernorm")}, "got fp8_recipe=delayed"),
        ({}, selective("mhc"), "plan.recompute_modules"),  # a module itercast has no model for
        ({}, selective("mla_up_proj"), "'mla_up_proj in recompute_modules is only supported with multi_latent_"),
        (MOE, {"moe_grouped_gemm": True, **selective("moe", "moe_act")}, "moe with moe_act is not priced"),
        (MOE, {"moe_a2a_overlap": True, **selective("moe")}, "moe does not run with moe_a2a_overlap"),
        (
            MOE | {"moe_shared_ffn_hidden_size": 32},
            {"moe_shared_expert_overlap": True, **selective("shared_experts")},
            "shared_experts does not run with moe_shared_expert_overlap",
        ),
    ],
)
def test_modules_megatron_core_refuses_or_itercast_does_not_price_are_config_errors(model, plan, message):
    with pytest.raises(ConfigError, match="recompute_modules") as err:
        job(model, **plan)
    assert message in str(err.value)


def test_launch_settings_name_the_modules_and_deepspeed_refuses_them():
    args = ["search", "--model", "mixtral-8x7b", "--system", "dgx-h100", "--num-nodes-range", "2", "--top", "1"]
    args += ["--set", "plan.global_batch_size=64", "--set", "plan.moe_grouped_gemm=true"]
    args += ["--set", "plan.recompute=selective", "--set", "plan.recompute_modules=[layernorm,moe_act]"]
    # a small space (the launch text does not depend on which plan ranks first)
    args += ["--set", "plan.pipeline_parallel=4", "--set", "plan.micro_batch_size=1", "--workers", "1"]
    megatron = CliRunner().invoke(app, args)
    assert megatron.exit_code == 0, megatron.output
    assert "--recompute-granularity selective \\\n  --recompute-modules layernorm moe_act \\\n" in megatron.output
    nemo = CliRunner().invoke(app, [*args, "--framework", "nemo"])
    assert nemo.exit_code == 0, nemo.output
    assert "model.config.recompute_modules=[layernorm,moe_act]" in nemo.output
    deepspeed = CliRunner().invoke(app, [*args, "--framework", "deepspeed"])
    assert deepspeed.exit_code == 2
    assert "plan.recompute_modules: deepspeed's selective recompute is not Megatron-Core's" in deepspeed.output
