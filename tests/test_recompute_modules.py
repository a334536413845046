"""Megatron-Core's selective recompute by module (plan.recompute_modules; transformer_config.py,
transformer_layer.py, moe/experts.py and tensor_parallel/random.py): what each module stops keeping,
what runs again before the layer's backward, and the launch settings that ask for it. Every expected
value is worked out by hand in the comments."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from itercast.cli.app import app
from itercast.config.job import Job
from itercast.errors import ConfigError
from itercast.memory import activation_bytes_per_token_layer
from itercast.predict import predict
from itercast.workloads.transformer_ops import layer_backward

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


@pytest.mark.parametrize(
    ("model", "plan", "message"),
    [
        ({}, {"recompute_modules": ["mlp"]}, "needs recompute=selective and selective_recompute=modules"),
        ({}, {"recompute": "full", "recompute_modules": ["mlp"]}, "got recompute=full"),
        (MOE, selective("moe_act"), "moe_act needs moe_grouped_gemm=true"),
        (MOE, {"moe_grouped_gemm": True, **selective()}, "expected one or more distinct modules; got []"),
        ({}, selective("mlp", "mlp"), "got ['mlp', 'mlp']"),
        ({}, {"dtype": "fp8", "fp8_recipe": "delayed", **selective("layernorm")}, "got fp8_recipe=delayed"),
        ({}, selective("moe"), "plan.recompute_modules"),
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
