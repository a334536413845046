"""Each framework's plan space (frameworks.py), its launch settings (launch_settings.py) and the memory
beyond the tensors (memory.reserve_bytes): rules checked by hand on enumerated plans, one launch text field
by field."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import searched_top_plan
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import Job, parse_section
from itercast.errors import ConfigError
from itercast.memory import communicators, estimate_memory, reserve_bytes
from itercast.search.frameworks import check_fixed, framework, framework_fields, runnable_plan
from itercast.search.launch_settings import launch_settings
from itercast.search.plan_space import SpaceOptions, enumerate_plans

MODEL = {"family": "llama", "num_layers": 8, "hidden_size": 256, "num_attention_heads": 8}
MODEL |= {"num_query_groups": 8, "seq_length": 256, "vocab_size": 1000}
GPUS = 16


def plans(framework: str, **fixed) -> list[dict]:
    model = parse_section("model", MODEL)
    system = parse_section("system", {"preset": "dgx-h100", "num_nodes": 2})
    base = parse_section("plan", {"global_batch_size": 32, **fixed})
    options = SpaceOptions(micro_batch_sizes=(1, 2), max_context_parallel=2, framework=framework, fixed=fixed)
    table, _ = enumerate_plans(model, system, base, GPUS, options)  # type: ignore[arg-type]
    return [table.plan_fields(r) for r in range(len(table))]


@pytest.mark.parametrize("framework", ["megatron-core", "nemo", "deepspeed"])
def test_megatron_and_deepspeed_never_shard_gradients_with_pipelining(framework):
    found = plans(framework)
    assert found
    assert not [p for p in found if p["pipeline_parallel"] > 1 and p["zero_stage"] >= 2]
    # without pipelining they do offer ZeRO-2/3 (Megatron-FSDP; DeepSpeed stages 2-3)
    assert {p["zero_stage"] for p in found if p["pipeline_parallel"] == 1} == {0, 1, 2, 3}


def test_megatron_core_has_no_gpipe_and_interleaves_down_to_one_layer_per_chunk():
    found = plans("megatron-core")
    assert {p["schedule"] for p in found if p["pipeline_parallel"] > 1} == {"1f1b", "interleaved-1f1b"}
    # 8 layers on pp 2: 4 per stage, so chunks of 1 layer at vp 4 (no cap by default)
    assert max(p["virtual_pipeline"] for p in found if p["pipeline_parallel"] == 2) == 8 // 2


def test_overlap_param_gather_only_with_overlap_grad_reduce_under_megatron():
    found = plans("megatron-core")
    sharded = [p for p in found if p["zero_stage"] in (1, 2)]
    assert sharded and all(p["overlap_grad_reduce"] for p in sharded if p["overlap_param_gather"])


def test_torchtitan_runs_fsdp_with_pipelining_and_no_zero1():
    found = plans("torchtitan")
    with_pp = {p["zero_stage"] for p in found if p["pipeline_parallel"] > 1 and p["data_parallel"] > 1}
    assert with_pp == {2, 3}  # FSDP2 reshard never / always
    assert 1 not in {p["zero_stage"] for p in found}
    # DDP only as 1-D parallelism: zero 0 with data parallelism means no tp, pp, cp
    ddp = [p for p in found if p["zero_stage"] == 0 and p["data_parallel"] > 1]
    assert ddp and all(p["tensor_parallel"] == p["pipeline_parallel"] == p["context_parallel"] == 1 for p in ddp)
    assert all(p["sequence_parallel"] == (p["tensor_parallel"] > 1) for p in found)
    assert "gpipe" in {p["schedule"] for p in found}


def test_deepspeed_pipelines_with_1f1b_only_and_reduces_after_the_schedule():
    found = plans("deepspeed")
    piped = [p for p in found if p["pipeline_parallel"] > 1]
    assert piped and {p["schedule"] for p in piped} == {"1f1b"}
    assert {p["virtual_pipeline"] for p in piped} == {1}
    assert not [p for p in piped if p["data_parallel"] > 1 and p["overlap_grad_reduce"]]
    assert {p["context_parallel"] for p in found} == {1}


def test_deepspeed_runs_bf16_zero0_under_pipelining_as_its_sharded_bf16_optimizer():
    """User probe 7: DeepSpeed's engine runs bf16 with ZeRO disabled under its pipeline engine as BF16_Optimizer,
    whose fp32 weights and Adam state are split over the data-parallel ranks; the search priced it as an unsharded
    ZeRO-0 (a 70B plan at 72.2 GiB where ZeRO-1's price is 34.1). Its bf16 pipelined plans are ZeRO-1 only; in fp16
    (FP16_Optimizer, unsharded) ZeRO-0 stays; without pipelining (DDP_BFLOAT16, unsharded) too."""
    bf16 = plans("deepspeed")
    assert {p["zero_stage"] for p in bf16 if p["pipeline_parallel"] > 1} == {1}
    assert 0 in {p["zero_stage"] for p in bf16 if p["pipeline_parallel"] == 1}
    fp16 = plans("deepspeed", dtype="fp16")
    assert {p["zero_stage"] for p in fp16 if p["pipeline_parallel"] > 1} == {0, 1}
    with pytest.raises(ConfigError, match=r"deepspeed: runtime/engine.py _do_optimizer_sanity_check: bf16 with ZeRO"):
        plans("deepspeed", zero_stage=0, pipeline_parallel=2)
    args = ["search", "--example", "--framework", "deepspeed", "--set", "plan.zero_stage=0"]
    result = CliRunner().invoke(app, [*args, "--set", "plan.pipeline_parallel=2", "--set", "plan.dtype=bf16"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "give zero_stage 1" in result.output and result.output.rstrip().endswith("got 0 with pipeline_parallel 2")


def test_a_fixed_field_the_framework_does_not_run_is_a_one_line_error():
    with pytest.raises(ConfigError, match=r"plan.zero_stage: torchtitan runs zero_stage \[0, 2, 3\]"):
        plans("torchtitan", zero_stage=1)
    with pytest.raises(ConfigError, match=r"plan.schedule: deepspeed runs 1f1b; got 'gpipe'"):
        plans("deepspeed", schedule="gpipe", pipeline_parallel=2)
    # interleaving fixed by its chunks alone: the schedule's rule, not the plan validator's ZeRO quote (user probe 7)
    args = ["search", "--example", "--framework", "deepspeed", "--set", "plan.pipeline_parallel=2"]
    result = CliRunner().invoke(app, [*args, "--set", "plan.virtual_pipeline=2"])
    assert result.exit_code == 2 and result.output == (
        "error: plan.virtual_pipeline: deepspeed runs 1f1b, one model chunk a stage (expected 1); got 2\n"
    )
    with pytest.raises(ConfigError, match="--framework: expected one of megatron-core, nemo, torchtitan, deepspeed"):
        plans("colossal")
    result = CliRunner().invoke(app, ["search", "--example", "--framework", "colossal"])
    assert result.exit_code == 2 and "--framework: expected one of" in result.output
    # ZeRO-3 fixed beside a fixed pipeline: DeepSpeed's rule in one line, where the plan's own validator
    # once answered first, naming plan.pipeline_p2p and printing the whole plan as a dict
    args = ["search", "--example", "--framework", "deepspeed", "--set", "plan.zero_stage=3"]
    result = CliRunner().invoke(app, [*args, "--set", "plan.pipeline_parallel=2"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(
        "error: plan.zero_stage: deepspeed runs zero_stage [0, 1] with pipelining (pipe/engine.py: 'ZeRO-2 and "
        "ZeRO-3 are incompatible with pipeline parallelism'); got 3 with pipeline_parallel 2"
    )
    with pytest.raises(ConfigError, match=r"torchtitan runs zero_stage \[2, 3\] with pipelining .* got 0 with"):
        plans("torchtitan", zero_stage=0, pipeline_parallel=2)


def test_eager_pointwise_kernels_are_torchtitans_alone_and_never_with_its_async_tp():
    # eager is torchtitan's model code without torch.compile: Megatron-Core runs fused kernels
    with pytest.raises(ConfigError, match=r"plan.pointwise_kernels: megatron-core runs fused .* got 'eager'"):
        check_fixed(framework("megatron-core"), {}, False, "eager")
    # torchtitan's async TP raises 'Async TP requires torch.compile' without the compiled model: every command
    for kernels in ("eager", "eager_fused_norm"):
        with pytest.raises(ConfigError, match=r"plan.tp_comm_overlap: torchtitan's async tensor parallelism needs"):
            parse_section("plan", {"tp_comm_overlap": True, "pointwise_kernels": kernels})
    check_fixed(framework("torchtitan"), {}, False, "eager")  # eager without async TP runs
    check_fixed(framework("torchtitan"), {}, True, "fused")  # compiled with async TP runs
    check_fixed(framework("torchtitan"), {}, True, "compiled")
    with pytest.raises(ConfigError, match=r"plan.pointwise_kernels: nemo runs fused .* got 'compiled'"):
        check_fixed(framework("nemo"), {}, False, "compiled")


PLAN = {
    "tensor_parallel": 4,
    "pipeline_parallel": 8,
    "context_parallel": 1,
    "data_parallel": 32,
    "expert_parallel": 1,
    "expert_tensor_parallel": 4,
    "virtual_pipeline": 12,
    "sequence_parallel": True,
    "micro_batch_size": 1,
    "global_batch_size": 1536,
    "schedule": "interleaved-1f1b",
    "recompute": "full",
    "recompute_method": "uniform",
    "recompute_num_layers": 1,
    "recompute_every": 1,
    "selective_recompute": "modules",
    "zero_stage": 1,
    "main_params": "fp32",
    "adam_state_dtype": "fp32",
    "tp_comm_overlap_sms": {},
    "tp_comm_overlap_rs": "pipeline",
    "dtype": "bf16",
    "flash_attention": True,
    "grad_bucket_size_params": 40_000_000,
    "grad_reduce_dtype": "fp32",
    "overlap_grad_reduce": True,
    "overlap_param_gather": True,
    "tp_comm_overlap": True,
    "cross_entropy": "megatron",
    "make_vocab_size_divisible_by": 128,
    "pointwise_kernels": "fused",
}
GPT3 = parse_section("model", {"preset": "gpt3-175b"})


def test_megatron_launch_arguments_of_nemos_gpt3_recipe_field_by_field():
    text = launch_settings("megatron-core", PLAN, GPT3)  # type: ignore[arg-type]
    args = [line.strip(" \\") for line in text.splitlines()]
    assert args == [
        # arguments.py asserts it on Hopper with tensor parallelism (and refuses it with Megatron-FSDP)
        "# environment: CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron-LM up to Hopper, tensor or context parallel)",
        "# Megatron-LM arguments",
        "--tensor-model-parallel-size 4",
        "--pipeline-model-parallel-size 8",
        "--context-parallel-size 1",
        "--num-layers-per-virtual-pipeline-stage 1",  # 96 layers / (8 stages × 12 chunks)
        "--sequence-parallel",
        "--micro-batch-size 1",
        "--global-batch-size 1536",
        "--recompute-granularity full",
        "--recompute-method uniform",
        "--recompute-num-layers 1",
        "--use-distributed-optimizer",
        "--overlap-grad-reduce",
        "--overlap-param-gather",
        "--tp-comm-overlap",
        "--ddp-bucket-size 40000000",
        "--bf16",
        "--accumulate-allreduce-grads-in-fp32",
    ]


def test_torchtitan_and_deepspeed_launch_texts_carry_the_sizes():
    titan = launch_settings("torchtitan", {**PLAN, "zero_stage": 3}, GPT3)  # type: ignore[arg-type]
    assert "data_parallel_shard_degree = 32" in titan and 'fsdp_reshard_after_forward = "always"' in titan
    assert 'pipeline_parallel_schedule = "Interleaved1F1B"' in titan
    assert "local_batch_size = 48" in titan  # 1536 sequences / 32 data-parallel ranks, split into micro-batches
    ds = launch_settings("deepspeed", {**PLAN, "virtual_pipeline": 1, "schedule": "1f1b"}, GPT3)  # type: ignore[arg-type]
    # sequence parallel: Megatron-DeepSpeed's arguments.py raises without CUDA_DEVICE_MAX_CONNECTIONS=1
    assert ds.startswith("# environment: CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron-DeepSpeed, sequence parallel)\n")
    config = json.loads(ds.split("# Megatron-DeepSpeed arguments")[0].split("# ds_config.json\n")[1])
    assert config["train_batch_size"] == 1536
    assert config["gradient_accumulation_steps"] == 1536 // (1 * 32)  # 48
    assert config["zero_optimization"]["stage"] == 1
    assert "--pipeline-model-parallel-size 8" in ds
    # Megatron-DeepSpeed asserts a micro-batch size and takes its batch sizes from its own arguments, not the JSON
    assert "--micro-batch-size 1 \\\n  --global-batch-size 1536" in ds
    assert "--zero-stage 1" in ds  # Megatron-DeepSpeed's own copy, which decides zero.Init (stage 3)
    zero3 = launch_settings("deepspeed", {**PLAN, "pipeline_parallel": 1, "virtual_pipeline": 1, "zero_stage": 3}, GPT3)  # type: ignore[arg-type]
    assert (
        "--zero-stage 3" in zero3
        and json.loads(zero3.split("# ds_config.json\n")[1].split("\n# Megatron")[0])["zero_optimization"]["stage"] == 3
    )
    assert "data_types" not in config  # autograd's accumulation: DeepSpeed's default grad_accum_dtype
    assert config["communication_data_type"] == "fp32"  # PLAN prices an fp32 reduction
    for dtype, wire in (("bf16", "bf16"), ("fp16", "fp16"), ("fp8", "bf16")):
        sixteen = launch_settings("deepspeed", {**PLAN, "dtype": dtype, "grad_reduce_dtype": "bf16"}, GPT3)  # type: ignore[arg-type]
        sent = json.loads(sixteen.split("# ds_config.json\n")[1].split("\n# Megatron")[0])["communication_data_type"]
        assert sent == wire
    # DeepSpeed's own default: the training's 16-bit dtype on the wire (engine.py communication_data_type)
    assert framework("deepspeed").plan_fields["grad_reduce_dtype"] == "bf16"
    bf16_optimizer = {**PLAN, "virtual_pipeline": 1, "schedule": "1f1b", "grad_accumulation": "fp32_copy_add"}
    ds = launch_settings("deepspeed", bf16_optimizer, GPT3)  # type: ignore[arg-type]
    config = json.loads(ds.split("# Megatron-DeepSpeed arguments")[0].split("# ds_config.json\n")[1])
    assert config["data_types"] == {"grad_accum_dtype": "fp32"}
    # the bucket reduction the plan priced (PlanConfig.zero_grad_reduce): DeepSpeed's all-reduce unless one reduce
    # per rank was priced; ZeRO-3 has no such switch
    assert config["zero_optimization"]["use_multi_rank_bucket_allreduce"] is True
    per_rank = launch_settings("deepspeed", {**bf16_optimizer, "zero_grad_reduce": "reduce_per_rank"}, GPT3)  # type: ignore[arg-type]
    config = json.loads(per_rank.split("# Megatron-DeepSpeed arguments")[0].split("# ds_config.json\n")[1])
    assert config["zero_optimization"]["use_multi_rank_bucket_allreduce"] is False
    zero3_config = json.loads(zero3.split("# ds_config.json\n")[1].split("\n# Megatron")[0])
    assert "use_multi_rank_bucket_allreduce" not in zero3_config["zero_optimization"]


def test_launch_settings_run_what_was_priced_under_each_frameworks_parser():
    """What each framework's own parser needs to run the priced plan (a helper's audit ran them):"""
    lines = launch_settings("megatron-core", {**PLAN, "grad_reduce_dtype": "bf16"}, GPT3).splitlines()  # type: ignore[arg-type]
    # under --bf16 arguments.py reduces gradients in fp32 unless --grad-reduce-in-bf16
    assert "  --grad-reduce-in-bf16" in lines and not any("accumulate-allreduce" in line for line in lines)
    fsdp = launch_settings("megatron-core", {**PLAN, "zero_stage": 3}, GPT3)  # type: ignore[arg-type]
    # Megatron-FSDP's gradients take their dtype from its own flag (default auto: bf16 parameters')
    assert "--megatron-fsdp-main-grads-dtype fp32" in fsdp and "--accumulate-allreduce-grads-in-fp32" not in fsdp
    assert fsdp.startswith("# environment: CUDA_DEVICE_MAX_CONNECTIONS unset or > 1")
    uneven = {**PLAN, "virtual_pipeline": 1, "schedule": "1f1b", "stage_layers": [11, *[12] * 6, 13]}
    args = launch_settings("megatron-core", uneven, GPT3)  # type: ignore[arg-type]
    assert "--decoder-first-pipeline-num-layers 11" in args and "--decoder-last-pipeline-num-layers 13" in args
    # torchtitan counts the embedding and the output as a layer of the first and last stages by default
    titan = launch_settings("torchtitan", {**PLAN, "zero_stage": 3}, GPT3)  # type: ignore[arg-type]
    assert "pipeline_parallel_first_stage_less_layers = 0" in titan.splitlines()
    assert "pipeline_parallel_last_stage_less_layers = 0" in titan.splitlines()
    # the output layer's GEMM was priced in bf16: torchtitan's float8 converter must skip it (filter_fqns)
    fp8 = launch_settings("torchtitan", {**PLAN, "zero_stage": 3, "dtype": "fp8", "fp8_recipe": "tensorwise"}, GPT3)  # type: ignore[arg-type]
    assert 'filter_fqns = ["output"]' in fp8.splitlines()
    # Megatron-DeepSpeed: FlashAttention-2 and the JSON's checkpointing each need their flag
    ds = launch_settings("deepspeed", {**PLAN, "virtual_pipeline": 1, "schedule": "1f1b"}, GPT3)  # type: ignore[arg-type]
    assert "--use-flash-attn-v2" in ds and "--deepspeed-activation-checkpointing" in ds


def test_launch_settings_give_an_uneven_split_or_say_they_cannot():
    """User probe 7: torchtitan's TOML printed an even 8/8/8/8 for stage_layers [7, 9, 9, 7] (priced 5.24 s, run as
    the 4.83 s plan), NeMo and DeepSpeed dropped it silently, and Megatron-LM's layout was not used. GPT-3's 96
    layers over pp 8 here, the middle stages uneven: [10, 13, 12, 12, 12, 12, 12, 13], written out by hand."""
    split = [10, 13, 12, 12, 12, 12, 12, 13]
    plan = {**PLAN, "virtual_pipeline": 1, "schedule": "1f1b", "stage_layers": split}
    megatron = launch_settings("megatron-core", plan, GPT3)  # type: ignore[arg-type]
    layout = "Et*10|t*13|t*12|t*12|t*12|t*12|t*12|t*13L"
    assert f'  --pipeline-model-parallel-layout "{layout}"' in megatron.splitlines()
    assert "--decoder-first-pipeline-num-layers" not in megatron and "#" not in megatron.split("arguments")[1]
    # interleaved: one chunk a virtual stage, dealt round-robin; no --num-layers-per-virtual-pipeline-stage beside it
    chunks = [6, *[6] * 14, 6]
    chunks[0], chunks[1] = 5, 7
    interleaved = launch_settings("megatron-core", {**PLAN, "virtual_pipeline": 2, "stage_layers": chunks}, GPT3)  # type: ignore[arg-type]
    assert '--pipeline-model-parallel-layout "Et*5|t*7|' + "t*6|" * 13 + 't*6L"' in interleaved
    assert "--num-layers-per-virtual-pipeline-stage" not in interleaved
    titan = launch_settings("torchtitan", {**plan, "zero_stage": 3}, GPT3)  # type: ignore[arg-type]
    parts = json.loads(titan.split("module_fqns_per_model_part = ")[1].splitlines()[0])
    assert parts[0] == ["tok_embeddings", *(f"layers.{i}" for i in range(10))]
    assert parts[1] == [f"layers.{i}" for i in range(10, 23)]
    assert parts[-1] == [*(f"layers.{i}" for i in range(83, 96)), "norm", "output"]
    assert "pipeline_parallel_layers_per_stage" not in titan
    nemo = launch_settings("nemo", plan, GPT3)  # type: ignore[arg-type]
    assert "# stage_layers [10, 13, 12, 12, 12, 12, 12, 13]: not of the first/last form" in nemo
    ends = {**plan, "stage_layers": [11, *[12] * 6, 13]}
    nemo_ends = launch_settings("nemo", ends, GPT3).splitlines()  # type: ignore[arg-type]
    assert "model.config.num_layers_in_first_pipeline_stage=11" in nemo_ends
    assert "model.config.num_layers_in_last_pipeline_stage=13" in nemo_ends
    ds = launch_settings("deepspeed", plan, GPT3)  # type: ignore[arg-type]
    head, command = ds.split("# Megatron-DeepSpeed arguments\n")
    assert "# stage_layers [10, 13, 12, 12, 12, 12, 12, 13]: Megatron-DeepSpeed's GPTModelPipe splits" in head
    assert "#" not in command  # a comment inside the continued command would end it
    assert "  --bf16 \\" in command.splitlines()  # its params_dtype and casts, beside the JSON's bf16
    fp16 = launch_settings("deepspeed", {**plan, "dtype": "fp16"}, GPT3).split("arguments\n")[1]  # type: ignore[arg-type]
    assert "--fp16" in fp16 and "--bf16" not in fp16


def test_launch_settings_carry_the_recompute_the_plan_priced():
    block = {**PLAN, "recompute_method": "block", "recompute_num_layers": 5}
    mcore = launch_settings("megatron-core", block, GPT3)  # type: ignore[arg-type]
    assert "--recompute-method block" in mcore and "--recompute-num-layers 5" in mcore
    nemo = launch_settings("nemo", block, GPT3)  # type: ignore[arg-type]
    assert "model.config.recompute_method=block" in nemo and "model.config.recompute_num_layers=5" in nemo
    every = launch_settings("torchtitan", {**PLAN, "zero_stage": 3, "recompute_every": 2}, GPT3)  # type: ignore[arg-type]
    assert 'mode = "selective"\nselective_ac_option = "2"' in every
    op = {**PLAN, "zero_stage": 3, "recompute": "selective", "selective_recompute": "op"}
    assert 'mode = "selective"\nselective_ac_option = "op"' in launch_settings("torchtitan", op, GPT3)  # type: ignore[arg-type]


def compile_section(plan: dict) -> list[str]:
    titan = launch_settings("torchtitan", {**PLAN, "zero_stage": 3, **plan}, GPT3)  # type: ignore[arg-type]
    return titan.split("[compile]\n")[1].split("\n\n")[0].splitlines()


def test_torchtitan_toml_compiles_the_model_and_loss_whose_fused_kernels_were_priced():
    # torchtitan's [compile] enable defaults to false (eager); async TP (PLAN's tp_comm_overlap) needs it on
    section = compile_section({"cross_entropy": "torch_compiled"})
    assert section[0].startswith("# the plan priced torch.compile's kernels for: model and loss")
    assert section[1:] == ["enable = true", 'components = ["model", "loss"]']
    # the loss priced eager: the model alone compiled
    assert compile_section({"cross_entropy": "torch"})[1:] == ["enable = true", 'components = ["model"]']
    compiled = {"pointwise_kernels": "compiled", "cross_entropy": "torch"}
    assert compile_section(compiled)[1:] == ["enable = true", 'components = ["model"]']
    # eager pointwise kernels with the compiled loss: the loss alone
    eager_model = {"pointwise_kernels": "eager", "cross_entropy": "torch_compiled"}
    assert compile_section(eager_model)[1:] == ["enable = true", 'components = ["loss"]']
    # a job that sets eager kernels everywhere is priced so, and its TOML says so
    eager = {"pointwise_kernels": "eager", "cross_entropy": "torch"}
    assert compile_section(eager)[1:] == ["enable = false"]


def test_launch_settings_name_the_loss_kernels_the_plan_priced():
    fused = launch_settings("megatron-core", {**PLAN, "cross_entropy": "megatron_fused"}, GPT3)  # type: ignore[arg-type]
    assert "--cross-entropy-loss-fusion" in fused and "--cross-entropy-fusion-impl" not in fused
    nemo = launch_settings("nemo", PLAN, GPT3)  # type: ignore[arg-type]
    assert "model.config.cross_entropy_loss_fusion=False" in nemo.splitlines()
    # Megatron-LM's arguments.py refuses Transformer Engine's loss ("disabled due to stability issues"); NeMo's
    # GPTConfig passes it to Megatron-Core without that check
    te = launch_settings("nemo", {**PLAN, "cross_entropy": "te"}, GPT3)  # type: ignore[arg-type]
    assert "model.config.cross_entropy_fusion_impl=te" in te.splitlines()
    refused = CliRunner().invoke(app, ["search", "--example", "--set", "plan.cross_entropy=te"])
    assert (
        refused.exit_code == 2 and "plan.cross_entropy: megatron-core runs megatron or megatron_fused" in refused.output
    )


@pytest.mark.parametrize(
    ("framework", "loss", "message"),
    [
        ("torchtitan", "te", "torchtitan runs torch_compiled or torch, the job sets te"),
        ("deepspeed", "torch", "deepspeed runs megatron"),
    ],
)
def test_a_loss_the_framework_cannot_run_is_a_one_line_error(framework, loss, message):
    args = ["search", "--example", "--framework", framework, "--set", f"plan.cross_entropy={loss}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and f"plan.cross_entropy: {message}" in result.output


@pytest.mark.parametrize(
    ("framework", "loss"), [("nemo", "megatron_fused"), ("torchtitan", "torch_compiled"), ("megatron-core", "megatron")]
)
def test_the_search_prices_the_loss_its_framework_runs(framework, loss):
    assert searched_top_plan(framework)["cross_entropy"] == loss


@pytest.mark.parametrize(("framework", "dispatcher"), [("torchtitan", "torchtitan"), ("megatron-core", "alltoall")])
def test_the_search_prices_the_moe_host_wait_its_framework_runs(framework, dispatcher):
    # torchtitan's ExpertParallel waits for its counts' all-to-all; Megatron-Core's alltoall dispatcher
    assert searched_top_plan(framework)["moe_token_dispatcher"] == dispatcher


def test_framework_fields_fit_the_model():
    """A sliding window runs Transformer Engine's context parallelism over all_gather, not its p2p ring (user
    probe 10), where the framework's kernels are TE's; a dense model carries no grouped-expert switch."""
    window = parse_section("model", {"preset": "gpt-oss-20b"})
    full = parse_section("model", {"preset": "llama3-8b"})
    assert framework_fields(framework("megatron-core"), window, {})["cp_comm"] == "all_gather"
    assert framework_fields(framework("nemo"), window, {})["cp_comm"] == "all_gather"
    assert framework_fields(framework("megatron-core"), full, {})["cp_comm"] == "p2p"
    assert framework_fields(framework("torchtitan"), window, {})["cp_comm"] == "torch_allgather"
    assert "moe_grouped_gemm" not in framework_fields(framework("nemo"), full, {})
    assert framework_fields(framework("nemo"), window, {})["moe_grouped_gemm"] is True


def test_default_reserve_and_margin_by_hand():
    cols = {k: np.array([v]) for k, v in {"tp": 4, "cp": 1, "dp": 32, "pp": 8, "ep": 1, "etp": 1, "shard": 0}.items()}
    assert communicators(cols)[0] == 3  # tensor, data, pipeline groups
    # 0.75 GiB context + 3 × (4 MiB × 2 peers × 32 channels = 256 MiB)
    h100 = parse_section("system", {"preset": "dgx-h100"}).gpu
    assert reserve_bytes(h100, communicators(cols))[0] == 0.75 * 2**30 + 3 * 256 * 2**20
    flat = h100.model_copy(update={"reserved_bytes": 3 * 2**30})
    assert reserve_bytes(flat, communicators(cols))[0] == 3 * 2**30
    # user probe 8: a tied embedding's group (first and last stage) and the optimizer sharded within groups of 8
    # of the 32 data-parallel ranks (the groups' own and the one across them) are communicators too
    assert communicators(cols, embedding=True)[0] == 4
    assert communicators({**cols, "shard": np.array([8])})[0] == 4
    assert communicators({**cols, "shard": np.array([32])})[0] == 3  # sharded over all of them: one group
    # user probe 10: a stage with MoE layers at ep 8 × etp 1 of tp 4 × dp 32 joins the expert group, the experts'
    # data-parallel group (4 × 32 / 8 = 16 ranks) and, under Megatron-Core's dispatchers, the tensor × expert group
    # (8 ranks, a group of its own); etp 2 adds the expert-tensor group; ep 1 × etp 1 at tp 1 × dp 1: none
    moe = {**cols, "ep": np.array([8])}
    assert communicators(moe, moe=True)[0] == 3 + 1 + 1
    assert communicators(moe, moe=True, megatron_moe=True)[0] == 3 + 1 + 1 + 1
    assert communicators({**moe, "etp": np.array([2])}, moe=True, megatron_moe=True)[0] == 3 + 1 + 1 + 1 + 1
    alone = {k: np.array([1]) for k in ("tp", "cp", "dp", "pp", "ep", "etp")} | {"shard": np.array([0])}
    assert communicators(alone, moe=True, megatron_moe=True)[0] == 0
    assert communicators(moe, moe=False, megatron_moe=True)[0] == 3 + 1  # a stage without MoE layers


def test_the_tied_embedding_group_is_reserved_on_the_first_and_last_stage():
    """A tied GPT over tp 2 × pp 2 × dp 2 on 8 H100: stage 0 and the last join the embedding group besides the
    tensor, data and pipeline groups: 0.75 GiB + 4 × 256 MiB = 1.75 GiB; untied, 1.5 GiB."""
    model = {"family": "gpt", "num_layers": 8, "hidden_size": 2048, "num_attention_heads": 16}
    model |= {"seq_length": 2048, "vocab_size": 32768}
    plan = {"tensor_parallel": 2, "pipeline_parallel": 2, "global_batch_size": 64}
    for tied, reserved in ((True, 1.75 * 2**30), (False, 1.5 * 2**30)):
        job = Job.from_dicts({**model, "tie_embeddings": tied}, plan, {"preset": "dgx-h100"})
        assert estimate_memory(job).reserved_bytes == reserved


def test_margin_excludes_plans_and_is_shown():
    runner = CliRunner()
    args = ["search", "--example", "--json", "--top", "2", "--workers", "1", "--set", "plan.pipeline_parallel=8"]
    small = json.loads(runner.invoke(app, [*args, "--memory-headroom-gib", "0"]).output)
    large = json.loads(runner.invoke(app, [*args, "--memory-headroom-gib", "40"]).output)
    assert large["fitting"] < small["fitting"]
    assert large["memory_headroom"] == (
        "reserved per GPU: CUDA context 0.75 GiB + NCCL 256 MiB per communicator; "
        "kept free beside it: 40.00 GiB (--memory-headroom-gib)"
    )
    top = large["plans"][0]
    assert top["margin_bytes"] == 40 * 2**30 and "--tensor-model-parallel-size" in top["launch"]
    assert top["memory_per_gpu_bytes"] + 40 * 2**30 <= 80 * 2**30


def test_search_and_predict_judge_a_plan_by_one_memory_model():
    """Every plan the search shows carries predict's memory total, reserve included, and fits in
    predict's judgement too (search had priced its own reserve in place of predict's flat 2 GiB: a plan
    could fit in one and not in the other); the search keeps 15% of the activations free beside it."""
    runner = CliRunner()
    found = json.loads(runner.invoke(app, ["search", "--example", "--json", "--top", "3", "--workers", "1"]).stdout)
    for plan in found["plans"]:
        system = {"preset": "dgx-a100", "num_nodes": plan["num_nodes"]}
        est = estimate_memory(Job.from_dicts({"preset": "gpt3-175b"}, plan["plan"], system))
        assert plan["memory_per_gpu_bytes"] == pytest.approx(est.total_bytes, rel=1e-12)
        tp, pp, cp = (plan["plan"][k] for k in ("tensor_parallel", "pipeline_parallel", "context_parallel"))
        groups = (tp > 1) + (pp > 1) + (cp > 1) + (1024 // (tp * pp) > 1)  # data × context over 1,024 GPUs
        shard = plan["plan"].get("zero_shard_ranks") or 0  # the optimizer in groups: theirs and the one across
        groups += 0 < shard < 1024 // (tp * pp)
        groups += pp > 1 and est.stage in (0, pp - 1)  # GPT-3's tied embedding: first and last stage's group
        assert plan["reserved_bytes"] == est.reserved_bytes == 0.75 * 2**30 + groups * 256 * 2**20
        assert plan["margin_bytes"] == pytest.approx(0.15 * est.activations_bytes, rel=1e-12)
        assert plan["fits"] and not est.oom and est.total_bytes + 0.15 * est.activations_bytes <= 80 * 2**30


@pytest.mark.parametrize(
    ("framework", "extra", "kernel"),
    [
        ("torchtitan", [], "fa2"),  # torch SDPA's flash backend on H100 (FlashAttention-2)
        ("megatron-core", [], "cudnn"),  # Transformer Engine's FusedAttention on Hopper
        # the job's own choice wins (a small space: tp fixed)
        ("torchtitan", ["--set", "plan.attention_kernel=fa3", "--set", "plan.tensor_parallel=8"], "fa3"),
    ],
)
def test_the_search_prices_the_attention_kernel_its_framework_runs(framework, extra, kernel):
    assert searched_top_plan(framework, *extra)["attention_kernel"] == kernel


def test_megatron_cores_bucket_grows_with_the_data_parallel_ranks():
    # DistributedDataParallel, bucket_size None: max(40M, 1M × dp) parameters, dp the data-parallel group
    # without the context-parallel ranks (get_data_parallel_group(with_context_parallel=False))
    def bucket(**plan) -> int:
        return parse_section("plan", {"data_parallel": 1, **plan}).bucket_params  # type: ignore[attr-defined]

    assert bucket(data_parallel=8) == 40_000_000  # 8M < 40M
    assert bucket(data_parallel=64) == 64_000_000
    assert bucket(data_parallel=32, context_parallel=2) == 40_000_000  # 32M < 40M: cp 2 adds nothing
    assert bucket(data_parallel=64, context_parallel=2) == 64_000_000
    assert bucket(data_parallel=64, grad_bucket_size_params=5) == 5  # the plan's own wins


@pytest.mark.parametrize(
    ("framework", "bucket"),
    [("torchtitan", 25 * 1024 * 1024 // 4), ("deepspeed", 500_000_000), ("megatron-core", None)],
)
def test_the_search_prices_each_frameworks_gradient_bucket(framework, bucket):
    # torch DDP: bucket_cap_mb 25 of fp32 gradients = 6,553,600; DeepSpeed: reduce_bucket_size 5e8;
    # Megatron-Core: its DP-scaled default (left out)
    plan = searched_top_plan(framework)
    assert plan["grad_bucket_size_params"] == bucket
    # ZeRO-3's memory: DeepSpeed's per-submodule fetch, everyone else FSDP's per-layer one
    assert plan["zero3_fetch"] == ("deepspeed" if framework == "deepspeed" else "layer")
    if framework == "torchtitan":  # its selective checkpointing is per op, the only kind it has
        assert plan["selective_recompute"] == "op"
    # Megatron-DeepSpeed turns Megatron's asynchronous input-gradient all-reduce off under DeepSpeed (validate_args)
    assert plan.get("tp_allreduce_overlap", True) is (framework != "deepspeed")


def test_zero3_plans_are_not_repeated_for_overlap_switches_that_do_not_act():
    # FSDP gathers and reduce-scatters layer by layer ahead whatever the switches: one plan, not four
    zero3 = [p for p in plans("megatron-core") if p["zero_stage"] == 3]
    assert zero3
    assert {(p["overlap_grad_reduce"], p["overlap_param_gather"]) for p in zero3} == {(True, True)}


def test_megatron_launch_settings_name_the_moe_dispatcher_priced():
    # TransformerConfig's moe_token_dispatcher_type defaults to allgather; the plans are priced with alltoall
    mixtral = parse_section("model", {"preset": "mixtral-8x7b"})
    moe = {**PLAN, "pipeline_parallel": 4, "virtual_pipeline": 1, "expert_parallel": 8, "moe_grouped_gemm": True}
    mcore = launch_settings("megatron-core", moe, mixtral)  # type: ignore[arg-type]
    assert "  --moe-token-dispatcher-type alltoall \\\n" in mcore
    assert "model.config.moe_token_dispatcher_type=alltoall" in launch_settings("nemo", moe, mixtral)  # type: ignore[arg-type]
    # Megatron-DeepSpeed splits experts over tp only when told (--enable-expert-tensor-parallelism, off by default)
    ds = launch_settings("deepspeed", {**moe, "pipeline_parallel": 1}, mixtral)  # type: ignore[arg-type]
    assert "--moe-expert-parallel-size 8" in ds and "--enable-expert-tensor-parallelism" in ds  # etp 4 = tp 4
    unsplit = launch_settings("deepspeed", {**moe, "pipeline_parallel": 1, "expert_tensor_parallel": 1}, mixtral)  # type: ignore[arg-type]
    assert "--enable-expert-tensor-parallelism" not in unsplit
    assert "moe-token-dispatcher" not in launch_settings("megatron-core", PLAN, GPT3)  # type: ignore[arg-type]
    # no tensor or context parallelism, no environment line: the arguments keep their heading all the same
    alone = {**moe, "tensor_parallel": 1, "expert_tensor_parallel": 1}
    assert launch_settings("megatron-core", alone, mixtral).startswith(  # type: ignore[arg-type]
        "# Megatron-LM arguments\n--tensor-model-parallel-size 1 \\\n"
    )


@pytest.mark.parametrize(
    ("framework", "sets", "message"),
    [
        # torch AdamW over torchtitan's fp32 weights: fp32 moments only
        (
            "torchtitan",
            ["plan.adam_state_dtype=bf16"],
            "torchtitan runs fp32_weights/fp32, the job sets fp32_weights/bf16",
        ),
        # Megatron-Core's precision-aware optimizer always keeps remainders (no flag turns them off)
        ("megatron-core", ["plan.main_params=none"], "fp32_remainders/bf16, the job sets none/fp32"),
    ],
)
def test_an_optimizer_state_the_framework_cannot_keep_is_a_one_line_error(framework, sets, message):
    args = ["search", "--example", "--framework", framework]
    for item in sets:
        args += ["--set", item]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and f"plan.main_params/adam_state_dtype: {framework} runs" in result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_torchtitan_trains_in_no_fp16_and_says_so_in_one_line():
    # torchtitan's job_config.py: mixed_precision_param: Literal["bfloat16", "float32"], no loss scaling
    v100 = ["search", "--model", "gpt3-1.3b", "--system", "v100-p3.16xlarge", "--set", "plan.global_batch_size=64"]
    result = CliRunner().invoke(app, [*v100, "--framework", "torchtitan"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "plan.dtype: torchtitan runs bf16 or fp32 or fp8, the job sets fp16 (left out:" in result.output
    set_fp16 = CliRunner().invoke(app, ["search", "--example", "--framework", "torchtitan", "--set", "plan.dtype=fp16"])
    assert set_fp16.exit_code == 2 and "the job sets fp16\n" in set_fp16.output  # set, not left out
    # Megatron-Core runs --fp16: the same V100 job is searched
    assert CliRunner().invoke(app, [*v100, "--top", "1", "--workers", "1"]).exit_code == 0


def test_launch_settings_write_the_userbuffers_cfg_priced():
    # a recipe's cfg: proj_fprop 24 SMs with the margin, qkv_dgrad without; Megatron-LM reads it from
    # --tp-comm-overlap-cfg (a YAML handed to TE's initialize_ub), NeMo from its callback's cfg
    plan = {**PLAN, "tp_comm_overlap": True, "tp_comm_overlap_sms": {"proj_fprop": 24, "qkv_dgrad": 0}}
    args = launch_settings("megatron-core", plan, GPT3)  # type: ignore[arg-type]
    assert "--tp-comm-overlap-cfg tp_comm_overlap.yaml" in args
    assert "proj_fprop:\n  num_sm: 24\n  set_sm_margin: true\nqkv_dgrad:\n  set_sm_margin: false" in args
    # NeMo: only MegatronCommOverlapCallback (performance mode) runs it, its cfg a Python object: a comment
    nemo = launch_settings("nemo", plan, GPT3)  # type: ignore[arg-type]
    assert (
        "set that callback's tp_comm_overlap=True and its tp_comm_overlap_cfg, a TransformerLayerTPOverlapCfg" in nemo
    )
    assert "proj_fprop num_sm=24,set_sm_margin=True; qkv_dgrad set_sm_margin=False" in nemo
    assert "MegatronCommOverlapCallback." not in nemo  # no KEY=VALUE path reaches a callback (nemo-run's parser)
    assert "--tp-comm-overlap-cfg" not in launch_settings("megatron-core", {**plan, "tp_comm_overlap_sms": {}}, GPT3)  # type: ignore[arg-type]
    # Megatron-Bridge's FP8 H100 cfgs: the reduce-scatters after proj and fc2 by ring exchange, 1 SM with margin
    ring = {**plan, "tp_comm_overlap_sms": {"proj_fprop": 1}, "tp_comm_overlap_rs": "ring_exchange"}
    args = launch_settings("megatron-core", ring, GPT3)  # type: ignore[arg-type]
    assert "fc2_fprop:\n  method: ring_exchange\nproj_fprop:\n  method: ring_exchange\n  num_sm: 1\n" in args
    nemo = launch_settings("nemo", ring, GPT3)  # type: ignore[arg-type]
    assert "with fc2_fprop method=ring_exchange; proj_fprop method=ring_exchange,num_sm=1,set_sm_margin=True" in nemo


def test_torchtitan_refuses_a_userbuffers_margin(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(
        "model: {preset: llama3-8b}\nsystem: {preset: dgx-h100, num_nodes: 1}\n"
        "plan: {global_batch_size: 8, tp_comm_overlap_sms: {proj_fprop: 24}}\n"
    )
    result = CliRunner().invoke(app, ["search", str(job), "--framework", "torchtitan"])
    assert result.exit_code == 2 and "torchtitan's async TP takes no SMs" in result.output
    # PyTorch's async TP reduce-scatters by sending each chunk to the rank that sums it: no pipeline method
    job.write_text(job.read_text().replace("tp_comm_overlap_sms: {proj_fprop: 24}", "tp_comm_overlap_rs: pipeline"))
    result = CliRunner().invoke(app, ["search", str(job), "--framework", "torchtitan"])
    assert result.exit_code == 2
    assert (
        result.output.strip() == "error: plan.tp_comm_overlap_rs: torchtitan runs ring_exchange, the job sets pipeline"
    )


def test_nemo_sets_precision_on_its_plugin_which_overwrites_the_strategys_ddp_config():
    # NeMo 8cfedd7: MegatronStrategy copies the precision plugin's DtypeConfig over its DDP config
    # (update_config_with_dtype_overrides), and bf16_mixed() sets grad_reduce_in_fp32=True, so a strategy.ddp
    # field would be overwritten: the reduction dtype goes on the plugin
    bf16 = launch_settings("nemo", PLAN, GPT3).splitlines()  # type: ignore[arg-type]
    assert "trainer.plugins=bf16_mixed" in bf16 and "trainer.plugins.grad_reduce_in_fp32=True" in bf16
    assert not any("ddp.grad_reduce_in_fp32" in line or ".fp8" in line for line in bf16)
    reduce_bf16 = launch_settings("nemo", {**PLAN, "grad_reduce_dtype": "bf16"}, GPT3).splitlines()  # type: ignore[arg-type]
    assert "trainer.plugins.grad_reduce_in_fp32=False" in reduce_bf16
    # FP8 on the same plugin, every layer in FP8 and 16-bit gathers as priced (the plugin's defaults, which
    # NeMo's own current-scaling recipe changes: first_last_layers_bf16 True, fp8_param_gather True)
    tensorwise = launch_settings("nemo", {**PLAN, "dtype": "fp8", "fp8_recipe": "tensorwise"}, GPT3).splitlines()  # type: ignore[arg-type]
    assert "trainer.plugins.fp8=hybrid" in tensorwise and "trainer.plugins.fp8_recipe=tensorwise" in tensorwise
    assert not any("amax" in line for line in tensorwise)
    delayed = launch_settings("nemo", {**PLAN, "dtype": "fp8", "fp8_recipe": "delayed"}, GPT3).splitlines()  # type: ignore[arg-type]
    assert {"trainer.plugins.fp8_recipe=delayed", "trainer.plugins.fp8_amax_history_len=1024"} <= set(delayed)
    fp16 = launch_settings("nemo", {**PLAN, "dtype": "fp16", "grad_reduce_dtype": "bf16"}, GPT3).splitlines()  # type: ignore[arg-type]
    assert "trainer.plugins=fp16_mixed" in fp16 and "trainer.plugins.grad_reduce_in_fp32=False" in fp16


def test_nemo_names_its_trainers_gpus_the_bucket_and_megatron_fsdps_averaging():
    # 1536 sequences, tp 4 × pp 8 × dp 32 = 1024 GPUs on 128 nodes: 8 a node
    nemo = launch_settings("nemo", PLAN, GPT3, num_nodes=128).splitlines()  # type: ignore[arg-type]
    assert nemo[:2] == ["trainer.num_nodes=128", "trainer.devices=8"]
    assert "trainer.strategy.ddp.bucket_size=40000000" in nemo
    assert "model.config.overlap_p2p_comm=True" in nemo and "model.config.batch_p2p_comm=False" in nemo
    assert "average_in_collective" not in "\n".join(nemo)
    # Megatron-FSDP raises on the recipes' average_in_collective=True
    fsdp = launch_settings("nemo", {**PLAN, "zero_stage": 3}, GPT3).splitlines()  # type: ignore[arg-type]
    assert "trainer.strategy.ddp.average_in_collective=False" in fsdp
    assert "trainer.strategy.ddp.data_parallel_sharding_strategy=optim_grads_params" in fsdp
    assert not any(line.startswith("trainer.num_nodes") for line in fsdp)  # no node count given: none written


def test_launch_settings_switch_on_the_moe_overlaps_the_plan_priced():
    """transformer_ops._moe_block hides an MoE layer's all-to-alls behind another micro-batch's attention
    (plan.moe_a2a_overlap) or else behind the shared experts: Megatron-Core runs neither unless told
    (overlap_moe_expert_parallel_comm, moe_shared_expert_overlap default False), and refuses both together."""
    mixtral = parse_section("model", {"preset": "mixtral-8x7b"})
    qwen2 = parse_section("model", {"preset": "qwen2-57b-a14b"})  # shared experts
    moe = {**PLAN, "pipeline_parallel": 4, "expert_parallel": 8, "moe_grouped_gemm": True}
    for model, a2a, shared, flag in (
        (mixtral, True, False, "--overlap-moe-expert-parallel-comm"),
        (qwen2, True, False, "--overlap-moe-expert-parallel-comm"),
        (qwen2, False, True, "--moe-shared-expert-overlap"),
    ):
        plan = {**moe, "moe_a2a_overlap": a2a, "moe_shared_expert_overlap": shared}
        mcore = launch_settings("megatron-core", plan, model)  # type: ignore[arg-type]
        nemo = launch_settings("nemo", plan, model).splitlines()  # type: ignore[arg-type]
        other = ({"--overlap-moe-expert-parallel-comm", "--moe-shared-expert-overlap"} - {flag}).pop()
        assert f"  {flag} \\\n" in mcore and other not in mcore
        name = flag.removeprefix("--").replace("-", "_")
        assert f"model.config.{name}=True" in nemo
    plain = launch_settings("megatron-core", {**moe, "moe_a2a_overlap": False}, mixtral)  # type: ignore[arg-type]
    assert "overlap-moe" not in plain and "shared-expert-overlap" not in plain  # no shared experts to hide behind
    # shared experts priced in turn with the all-to-alls (the flex dispatcher's, say): no switch
    alone = launch_settings("megatron-core", {**moe, "moe_shared_expert_overlap": False}, qwen2)  # type: ignore[arg-type]
    assert "shared-expert-overlap" not in alone


SHARED_MOE = MODEL | {"num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 128, "moe_shared_ffn_hidden_size": 128}


def moe_plans(framework: str, model: dict, **fixed) -> list[dict]:
    system = parse_section("system", {"preset": "dgx-h100", "num_nodes": 2})
    base = parse_section("plan", {"global_batch_size": 32, **fixed})
    options = SpaceOptions(micro_batch_sizes=(1,), max_context_parallel=1, framework=framework, fixed=fixed)
    table, _ = enumerate_plans(parse_section("model", model), system, base, GPUS, options)  # type: ignore[arg-type]
    return [table.plan_fields(r) for r in range(len(table))]


def test_deepspeed_moe_plans_run_whole_experts_or_split_them_over_every_tensor_parallel_rank():
    """DeepSpeed's MOELayer (the einsum dispatcher) takes the whole sequence on every tensor-parallel rank, its
    experts whole (its default) or, and PR-MoE's residual copy of one, split over all of them (--enable-expert-
    tensor-parallelism), with or without expert parallelism; Megatron-Core folds experts freely and runs tensor
    parallelism of an MoE model with sequence parallelism."""
    padded = SHARED_MOE | {"moe_capacity_factor": 1.0, "moe_pad_to_capacity": True}
    ds = moe_plans("deepspeed", padded, moe_token_dispatcher="einsum")
    tp = [p for p in ds if p["tensor_parallel"] > 1]
    assert tp and all(p["expert_tensor_parallel"] in (1, p["tensor_parallel"]) for p in tp)
    kinds = {(p["expert_tensor_parallel"] == 1, p["expert_parallel"] == 1) for p in tp}
    assert kinds == {(True, True), (True, False), (False, True), (False, False)}
    assert not any(p["sequence_parallel"] for p in ds)
    mcore = [p for p in moe_plans("megatron-core", SHARED_MOE) if p["tensor_parallel"] > 1]
    assert all(p["sequence_parallel"] for p in mcore)
    assert [p for p in mcore if p["expert_tensor_parallel"] == 1] and [p for p in mcore if p["expert_parallel"] == 1]


def test_torchtitan_moe_plans_follow_its_parallel_dims():
    """torchtitan's ParallelDims (distributed/parallel_dims.py _validate) with expert parallelism: whole experts
    (etp 1) take an expert group that tp divides (it borrows every tensor-parallel rank), split ones (etp = tp) a
    group within the data-parallel ranks; without expert parallelism the experts are split over tp."""
    plans = moe_plans("torchtitan", SHARED_MOE, moe_token_dispatcher="torchtitan")  # the search sets it
    tp = [p for p in plans if p["tensor_parallel"] > 1]
    for p in tp:
        ep, etp, t, dp = p["expert_parallel"], p["expert_tensor_parallel"], p["tensor_parallel"], p["data_parallel"]
        if ep == 1:
            assert etp == t
        elif etp == 1:
            assert ep % t == 0 and (dp * t) % ep == 0
        else:
            assert etp == t and dp % ep == 0
    kinds = {(p["expert_tensor_parallel"] == 1, p["expert_parallel"] == 1) for p in tp}
    assert kinds == {(True, False), (False, True), (False, False)}


def test_deepspeed_runs_a_routed_experts_copy_as_pr_moe():
    args = ["search", "--model", "moe-tiny", "--system", "dgx-h100", "--num-nodes-range", "1", "--framework"]
    args += ["deepspeed", "--set", "plan.global_batch_size=64", "--top", "1", "--workers", "1", "--json"]
    args += ["--set", "model.moe_capacity_factor=1.0", "--set", "model.moe_pad_to_capacity=true"]
    result = CliRunner().invoke(app, [*args, "--set", "model.moe_shared_ffn_hidden_size=512"])  # moe-tiny's expert
    assert result.exit_code == 0, result.output
    assert "  --mlp-type residual \\" in json.loads(result.stdout)["plans"][0]["launch"]
    assert "mixing coefficient" not in result.stderr  # priced (tests/test_deepspeed_moe.py), not warned of
    plain = CliRunner().invoke(app, [*args, "--set", "model.moe_shared_ffn_hidden_size=0"])
    assert "mlp-type" not in json.loads(plain.stdout)["plans"][0]["launch"]


def test_frameworks_refuse_shared_experts_they_do_not_run():
    args = ["search", "--system", "dgx-h100", "--num-nodes-range", "8", "--set", "plan.global_batch_size=512"]
    for model, framework_name, extra, message in (
        # Qwen2-57B's shared expert is 8 routed experts wide: not a copy of one
        (
            "qwen2-57b-a14b",
            "deepspeed",
            [],
            "model.moe_shared_ffn_hidden_size: DeepSpeed runs a shared expert only as PR-MoE's residual MLP, a "
            "copy of a routed expert (deepspeed/moe/layer.py MoE use_residual: expected 0 or 2560); "
            "qwen2-57b-a14b sets 20480",
        ),
        (
            "llama4-scout",
            "deepspeed",
            ["--set", "plan.moe_shared_expert_overlap=true"],
            "plan.moe_shared_expert_overlap: deepspeed has no Megatron-Core shared-expert overlap",
        ),
        (
            "llama4-scout",
            "torchtitan",
            ["--set", "plan.moe_shared_expert_overlap=true"],
            "plan.moe_shared_expert_overlap: torchtitan has no Megatron-Core shared-expert overlap",
        ),
    ):
        result = CliRunner().invoke(app, [*args, "--model", model, "--framework", framework_name, *extra])
        assert result.exit_code == 2 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def test_nemo_megatron_fsdp_saves_its_own_checkpoint_format_and_unfused_attention_is_a_note():
    # MegatronStrategy's save_ckpt_format torch_dist raises under Megatron-FSDP (megatron_strategy.py)
    fsdp = launch_settings("nemo", {**PLAN, "zero_stage": 3}, GPT3).splitlines()  # type: ignore[arg-type]
    assert "trainer.strategy.save_ckpt_format=fsdp_dtensor" in fsdp
    unfused = launch_settings("nemo", {**PLAN, "flash_attention": False}, GPT3)  # type: ignore[arg-type]
    assert "model.config.attention_backend = AttnBackend.unfused" in unfused
    assert "attention_backend" not in launch_settings("nemo", PLAN, GPT3)  # type: ignore[arg-type]


def test_megatron_overlaps_moe_all_to_alls_only_where_transformer_config_allows():
    """transformer_config.py: overlap_moe_expert_parallel_comm needs expert parallelism, a virtual pipeline when
    pipelined, and no full recompute."""
    model = parse_section("model", {"preset": "mixtral-8x7b", "num_layers": 8, "seq_length": 256})
    system = parse_section("system", {"preset": "dgx-h100", "num_nodes": 2})
    base = parse_section("plan", {"global_batch_size": 32, "moe_a2a_overlap": True})
    options = SpaceOptions(micro_batch_sizes=(1,), max_context_parallel=1, framework="megatron-core")
    table, _ = enumerate_plans(model, system, base, GPUS, options)  # type: ignore[arg-type]
    found = [table.plan_fields(r) for r in range(len(table))]
    without, _ = enumerate_plans(model, system, base.model_copy(update={"moe_a2a_overlap": False}), GPUS, options)  # type: ignore[arg-type]
    assert "full" in {without.plan_fields(r)["recompute"] for r in range(len(without))}
    assert found and "full" not in {p["recompute"] for p in found}
    assert all(p["expert_parallel"] > 1 for p in found)
    assert all(p["virtual_pipeline"] > 1 for p in found if p["pipeline_parallel"] > 1)
    assert any(p["pipeline_parallel"] > 1 for p in found) and any(p["pipeline_parallel"] == 1 for p in found)


def test_a_plan_without_tensor_parallelism_is_shown_without_its_overlap():
    # Megatron-LM arguments.py: sequence parallelism off at tensor_parallel 1, then 'Tensor parallel
    # communication/GEMM overlap can happen only when sequence parallelism is enabled'
    found = plans("megatron-core", tp_comm_overlap=True)
    shown = {p["tensor_parallel"]: runnable_plan(framework("megatron-core"), p)["tp_comm_overlap"] for p in found}
    assert shown == {1: False, 2: True, 4: True, 8: True}
    one = next(p for p in found if p["tensor_parallel"] == 1)
    shown_one = runnable_plan(framework("megatron-core"), one)
    assert "--tp-comm-overlap" not in launch_settings("megatron-core", shown_one, parse_section("model", MODEL))


def test_the_search_splits_a_sequence_over_the_tensor_ranks_only_evenly():
    # 260 tokens: 2 context ranks of 130, each 4 chunks of 65 at tp 2 but not 32.5 at tp 4; 8 tensor ranks: 32.5
    model = parse_section("model", MODEL | {"seq_length": 260})
    system = parse_section("system", {"preset": "dgx-h100", "num_nodes": 2})
    base = parse_section("plan", {"global_batch_size": 32})
    options = SpaceOptions(micro_batch_sizes=(1,), max_context_parallel=2, framework="megatron-core")
    table, _ = enumerate_plans(model, system, base, GPUS, options)  # type: ignore[arg-type]
    found = [table.plan_fields(r) for r in range(len(table))]
    split = {(p["tensor_parallel"], p["context_parallel"]) for p in found if p["sequence_parallel"]}
    whole = {(p["tensor_parallel"], p["context_parallel"]) for p in found if not p["sequence_parallel"]}
    assert (2, 1) in split and (4, 1) in split and (2, 2) in split
    assert not split & {(8, 1), (4, 2), (8, 2)} and {(8, 1), (4, 2)} <= whole


def test_megatron_splits_no_expert_with_biases_over_tensor_ranks():
    """transformer_config.py: 'Bias in Moe is only supported when ETP==1' (GPT-OSS's experts have biases); the
    same model without biases is searched with its experts split over the tensor-parallel ranks too."""
    system = parse_section("system", {"preset": "dgx-h100", "num_nodes": 2})
    base = parse_section("plan", {"global_batch_size": 32})
    options = SpaceOptions(micro_batch_sizes=(1,), max_context_parallel=1, framework="megatron-core")
    etps = {}
    for bias in (True, False):
        model = parse_section("model", {"preset": "gpt-oss-20b", "num_layers": 4, "seq_length": 256, "add_bias": bias})
        table, _ = enumerate_plans(model, system, base, GPUS, options)  # type: ignore[arg-type]
        etps[bias] = {table.plan_fields(r)["expert_tensor_parallel"] for r in range(len(table))}
    assert etps[True] == {1} and etps[False] > {1}


def test_deepspeed_runs_moe_without_zero3():
    # runtime/engine.py: 'Native DeepSpeed MoE is not supported with ZeRO Stage 3'
    model = parse_section("model", {"preset": "mixtral-8x7b", "num_layers": 8, "seq_length": 256})
    system = parse_section("system", {"preset": "dgx-h100", "num_nodes": 2})
    base = parse_section("plan", {"global_batch_size": 32})
    options = SpaceOptions(micro_batch_sizes=(1,), max_context_parallel=1, framework="deepspeed")
    table, _ = enumerate_plans(model, system, base, GPUS, options)  # type: ignore[arg-type]
    assert {table.plan_fields(r)["zero_stage"] for r in range(len(table))} == {0, 1, 2}


@pytest.mark.parametrize(
    ("framework", "sets", "message"),
    [
        ("megatron-core", ["selective_recompute=op"], "plan.selective_recompute: megatron-core runs modules"),
        ("torchtitan", ["selective_recompute=modules"], "plan.selective_recompute: torchtitan runs op"),
        (
            "torchtitan",
            ["recompute=full", "recompute_method=block", "recompute_num_layers=2"],
            "plan.recompute_method/recompute_num_layers: torchtitan's full recompute checkpoints every layer",
        ),
        (
            "deepspeed",
            ["recompute=full", "recompute_every=2"],
            "plan.recompute_every: deepspeed recomputes groups of layers",
        ),
        ("nemo", ["recompute=full", "recompute_every=3"], "plan.recompute_every: nemo recomputes groups of layers"),
        ("torchtitan", ["moe_a2a_overlap=true"], "plan.moe_a2a_overlap: torchtitan has no expert all-to-all overlap"),
        (
            "megatron-core",
            ["moe_token_dispatcher=torchtitan"],
            "plan.moe_token_dispatcher: megatron-core runs alltoall or flex",
        ),
        (
            "deepspeed",
            ["moe_token_dispatcher=flex"],
            "plan.moe_token_dispatcher: deepspeed runs einsum or gather, the job sets flex",
        ),
        (
            "megatron-core",
            ["moe_a2a_overlap=true", "recompute=full"],
            "plan.moe_a2a_overlap: megatron-core refuses it with full recompute",
        ),
        # Megatron-Core's input-gradient all-reduce is always asynchronous, Megatron-DeepSpeed's never; neither sends
        # Megatron-LM 2021's scattered pipeline messages
        ("nemo", ["tp_allreduce_overlap=false"], "plan.tp_allreduce_overlap: nemo runs true"),
        ("deepspeed", ["tp_allreduce_overlap=true"], "plan.tp_allreduce_overlap: deepspeed runs false"),
        (
            "megatron-core",
            ["pipeline_p2p=megatron", "p2p_scatter_gather=true"],
            "plan.p2p_scatter_gather: Megatron-LM's pipeline exchange of 2021-2023, which megatron-core does not run",
        ),
        # Megatron's blocking interleaved exchanges: torchtitan's and DeepSpeed's pipelines send otherwise
        (
            "torchtitan",
            ["overlap_p2p_comm=false"],
            "plan.overlap_p2p_comm: Megatron's switch for its interleaved exchanges, which torchtitan does not run",
        ),
        # torchtitan's launch settings cannot ask for a bf16 reduction (a probe's finding: priced, then run in fp32)
        (
            "torchtitan",
            ["grad_reduce_dtype=bf16"],
            "plan.grad_reduce_dtype: torchtitan reduces gradients in float32 only",
        ),
    ],
)
def test_a_recompute_or_dispatcher_the_framework_cannot_run_is_a_one_line_error(framework, sets, message):
    args = ["search", "--model", "mixtral-8x7b", "--system", "dgx-h100", "--num-nodes-range", "1", "--framework"]
    args += [framework, "--set", "plan.global_batch_size=64"]
    for s in sets:
        args += ["--set", f"plan.{s}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and message in result.output and len(result.output.strip().splitlines()) == 1


def test_launch_settings_name_the_flex_dispatcher_priced():
    # transformer_config.py: moe_token_dispatcher_type flex, moe_flex_dispatcher_backend deepep (its default)
    mixtral = parse_section("model", {"preset": "mixtral-8x7b"})
    moe = {
        **PLAN,
        "pipeline_parallel": 4,
        "expert_parallel": 8,
        "moe_grouped_gemm": True,
        "moe_token_dispatcher": "flex",
    }
    mcore = launch_settings("megatron-core", moe, mixtral)  # type: ignore[arg-type]
    assert "  --moe-token-dispatcher-type flex \\\n  --moe-flex-dispatcher-backend deepep \\\n" in mcore
    nemo = launch_settings("nemo", moe, mixtral).splitlines()  # type: ignore[arg-type]
    assert "model.config.moe_token_dispatcher_type=flex" in nemo
    assert "model.config.moe_flex_dispatcher_backend=deepep" in nemo
    # over HybridEP (plan.moe_flex_backend) as the plan says
    hybrid = launch_settings("megatron-core", {**moe, "moe_flex_backend": "hybridep"}, mixtral)  # type: ignore[arg-type]
    assert "  --moe-flex-dispatcher-backend hybridep \\\n" in hybrid


def test_torchtitan_launch_settings_name_the_expert_parallel_backend_priced():
    # job_config.py at 9810191^: Parallelism.expert_parallel_comm_backend "standard" (default) or "deepep"
    qwen3 = parse_section("model", {"preset": "qwen3-30b-a3b"})
    moe = {**PLAN, "zero_stage": 3, "tensor_parallel": 1, "expert_parallel": 8, "expert_tensor_parallel": 1}
    standard = launch_settings("torchtitan", {**moe, "moe_token_dispatcher": "torchtitan"}, qwen3).splitlines()  # type: ignore[arg-type]
    deepep = launch_settings("torchtitan", {**moe, "moe_token_dispatcher": "torchtitan_deepep"}, qwen3).splitlines()  # type: ignore[arg-type]
    assert 'expert_parallel_comm_backend = "standard"' in standard
    assert 'expert_parallel_comm_backend = "deepep"' in deepep
    assert "expert_parallel_degree = 8" in deepep
    assert not any("expert_parallel" in line for line in launch_settings("torchtitan", PLAN, GPT3).splitlines())  # type: ignore[arg-type]


def test_deepspeed_trains_in_fp8_only_transformer_engines_own_layer_and_without_pipelining():
    # Megatron-DeepSpeed's --transformer-impl transformer_engine builds TE's TransformerLayer (LayerNorm, GeLU, no
    # GQA: 'Transformer_engine does not support GQA'); its pipelined GPTModelPipe runs its local layers, no FP8
    gpt = parse_section("model", {"preset": "gpt3-175b", "num_layers": 8, "seq_length": 256})
    system = parse_section("system", {"preset": "dgx-h100", "num_nodes": 2})
    options = SpaceOptions(micro_batch_sizes=(1,), max_context_parallel=1, framework="deepspeed")
    found = {}
    for dtype in ("bf16", "fp8"):
        base = parse_section("plan", {"global_batch_size": 32, "dtype": dtype})
        table, _ = enumerate_plans(gpt, system, base, GPUS, options)  # type: ignore[arg-type]
        found[dtype] = {table.plan_fields(r)["pipeline_parallel"] for r in range(len(table))}
    assert found == {"bf16": {1, 2, 4, 8}, "fp8": {1}}
    args = ["search", "--system", "dgx-h100", "--num-nodes-range", "1", "--framework", "deepspeed"]
    args += ["--set", "plan.global_batch_size=64", "--set", "plan.dtype=fp8"]
    for model, extra, message in (
        ("llama3-8b", [], "plan.dtype: deepspeed trains in FP8 only in Transformer Engine's TransformerLayer"),
        ("mixtral-8x7b", [], "mixtral-8x7b is a llama model with 8 key-value heads of 32, with experts"),
        ("gpt3-175b", ["--set", "model.num_query_groups=8"], "gpt3-175b is a gpt model with 8 key-value heads of 96"),
        ("gpt3-175b", ["--set", "plan.pipeline_parallel=2"], "plan.pipeline_parallel: deepspeed trains in FP8 without"),
    ):
        result = CliRunner().invoke(app, [*args, "--model", model, *extra])
        assert result.exit_code == 2 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def test_deepspeed_refuses_multi_latent_attention_which_megatron_deepspeed_does_not_build():
    # Megatron-DeepSpeed's model/transformer.py has no kv_lora_rank: DeepSeek-V3 was once planned under it
    args = ["search", "--model", "deepseek-v3", "--system", "dgx-h100", "--num-nodes-range", "64"]
    args += ["--set", "plan.global_batch_size=1024", "--framework"]
    result = CliRunner().invoke(app, [*args, "deepspeed"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "model.kv_lora_rank: deepspeed has no multi-latent attention" in result.output
    assert "deepseek-v3 sets 512" in result.output
    # Megatron-Core builds it (MLASelfAttention), torchtitan too (its deepseek_v3 model)
    assert framework("megatron-core").multi_latent_attention and framework("torchtitan").multi_latent_attention


def test_megatron_searches_price_and_launch_the_shared_expert_overlap():
    """Megatron-Core's --moe-shared-expert-overlap is off by default: the search turns it on for shared experts
    under the alltoall dispatcher, says so beside predict's default, and leaves it off under flex (Megatron-Bridge
    apply_flex_dispatcher_backend)."""
    args = ["search", "--model", "moe-tiny", "--system", "dgx-h100", "--num-nodes-range", "1", "--json"]
    args += ["--set", "plan.global_batch_size=64", "--top", "1", "--workers", "1"]
    found = json.loads(CliRunner().invoke(app, args).stdout)
    assert found["framework_settings"]["moe_shared_expert_overlap"] == {"search": True, "predict": False}
    top = found["plans"][0]
    assert top["plan"]["moe_shared_expert_overlap"] and "  --moe-shared-expert-overlap \\" in top["launch"]
    flex = json.loads(CliRunner().invoke(app, [*args, "--set", "plan.moe_token_dispatcher=flex"]).stdout)
    assert "moe_shared_expert_overlap" not in flex["framework_settings"]
    assert not flex["plans"][0]["plan"]["moe_shared_expert_overlap"]
    assert "shared-expert-overlap" not in flex["plans"][0]["launch"]


def test_a_searched_plan_without_full_recompute_drops_the_jobs_full_recompute_layers():
    """A job of full recompute by blocks of 2 layers, its recompute searched: the plans without recompute carry
    Megatron's defaults (uniform, 1), which Job validation takes, not the job's block method, which it refuses
    there (PlanConfig: the layers of full recompute need recompute=full)."""
    model = parse_section("model", {"preset": "gpt3-1.3b", "num_layers": 8, "seq_length": 256})
    system = parse_section("system", {"preset": "dgx-h100", "num_nodes": 1})
    fields = {"global_batch_size": 32, "recompute": "full", "recompute_method": "block", "recompute_num_layers": 2}
    base = parse_section("plan", fields)
    options = SpaceOptions(micro_batch_sizes=(1,), max_context_parallel=1)
    table, _ = enumerate_plans(model, system, base, 8, options)  # type: ignore[arg-type]
    rows = [table.plan_fields(r) for r in range(len(table))]
    kinds = {(p["recompute"], p["recompute_method"], p["recompute_num_layers"], p["recompute_every"]) for p in rows}
    assert kinds == {("none", "uniform", 1, 1), ("full", "block", 2, 1)}
    plain = next(p for p in rows if p["recompute"] == "none")
    assert Job.from_dicts(model.model_dump(), plain, system.model_dump()).plan.recompute_method == "uniform"
    with pytest.raises(ConfigError, match=r"need recompute=full; got recompute=none"):
        Job.from_dicts(model.model_dump(), plain | {"recompute_method": "block"}, system.model_dump())
