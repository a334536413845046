"""DeepSpeed ZeRO-3's memory computed by hand (deepspeed v0.3.13 stage3.py, 12a53b4, the version
Narayanan et al. SC'21 compared against): a Linear's weights gathered whole, the next module's
prefetched only below stage3_max_live_parameters (1e9), full 16-bit gradients waiting in the reduce
bucket (5e8 elements) beside the newest one, and 16-bit gradient partitions; FSDP's two whole layers
for plan.zero3_fetch=layer.
"""

from __future__ import annotations

import pytest

from itercast.config.job import Job
from itercast.memory import estimate_memory, zero3_live_columns
from itercast.parallel.plan_table import PlanTable


def _job(hidden: int, fetch: str, **plan: object) -> Job:
    model = {"family": "gpt", "num_layers": 4, "hidden_size": hidden, "num_attention_heads": hidden // 128}
    model |= {"vocab_size": 51200, "seq_length": 2048}
    base = {"micro_batch_size": 1, "dtype": "fp16", "zero_stage": 3, "recompute": "full"}
    base |= {"flash_attention": False, "zero3_fetch": fetch, "grad_reduce_dtype": "fp32"}
    return Job.from_dicts(model, base | plan, {"preset": "dgx-a100", "num_nodes": 8})


def _live(job: Job) -> tuple[float, float]:
    params, grad_bytes = zero3_live_columns(job.model, PlanTable.of_jobs([job]))
    return float(params[0]), float(grad_bytes[0])


def test_deepspeed_prefetches_the_next_linear_below_max_live_parameters():
    # h 8192: QKV 3h² = 201,326,592, projection h² = 67,108,864, MLP up and down 4h² = 268,435,456
    # each; all below 1e9 live parameters, all above the 5e7 prefetch bucket: one module prefetched.
    # forward QKV+proj 4h², proj+up 5h², up+down 8h², down+next QKV 7h²; backward the same pairs:
    # peak 8h² = 536,870,912 parameters gathered
    h2 = 8192 * 8192
    params, _ = _live(_job(8192, "deepspeed"))
    assert params == pytest.approx(8 * h2)  # 536,870,912


def test_deepspeed_prefetches_nothing_beside_a_linear_above_max_live_parameters():
    # h 20480 (GPT 530B): h² = 419,430,400; QKV 3h² = 1.26e9 and the MLP's 4h² = 1.68e9 exceed 1e9,
    # so only the projection (h² < 1e9) prefetches the next module: forward proj + up = 5h²,
    # backward proj + QKV = 4h², up or down alone 4h² -> peak 5h² = 2,097,152,000
    h2 = 20480 * 20480
    params, _ = _live(_job(20480, "deepspeed"))
    assert params == pytest.approx(5 * h2)  # 2,097,152,000


def test_deepspeed_full_gradients_wait_in_the_reduce_bucket_beside_the_newest():
    # backward order down, up, proj, QKV. h 20480: every Linear exceeds the 5e8 bucket, so the
    # previous module's full gradient waits alone: up + down = 8h² fp16 elements at the peak
    h2 = 20480 * 20480
    _, grad_bytes = _live(_job(20480, "deepspeed"))
    assert grad_bytes == pytest.approx(2 * 8 * h2)  # 6,710,886,400 bytes
    # h 8192: modules below the bucket wait up to a bucket, 5e8 elements (the layer holds
    # 12h² = 805,306,368 > 5e8): down + 5e8 = 268,435,456 + 500,000,000 = 768,435,456 elements
    _, grad_bytes = _live(_job(8192, "deepspeed"))
    assert grad_bytes == pytest.approx(2 * (4 * 8192 * 8192 + 5e8))  # 1,536,870,912 bytes


def test_deepspeed_zero3_keeps_16_bit_gradient_partitions_and_fsdp_two_whole_layers():
    # 64 GPUs (dp 64), h 8192, 4 layers. Same shards of weights and optimizer; gradient partition
    # fp16 (2 bytes) under DeepSpeed, fp32 (4, grad_reduce_dtype) under FSDP; FSDP gathers two
    # whole layers (12h² + 13h weights and biases, 2 LayerNorms of 2h: 12h² + 13h each).
    h = 8192
    ds, fsdp = estimate_memory(_job(h, "deepspeed")), estimate_memory(_job(h, "layer"))
    assert ds.optimizer_bytes == fsdp.optimizer_bytes
    shards = ds.gradients_bytes - 2 * (4 * h * h + 5e8)
    assert shards == pytest.approx(fsdp.gradients_bytes / 2)  # 2 bytes instead of 4 per parameter
    layer = 12 * h * h + 13 * h  # 805,412,864
    assert fsdp.weights_bytes - ds.weights_bytes == pytest.approx(2 * (2 * layer - 8 * h * h))


def test_nemotron4_340b_as_dgxc_benchmarking_ran_it_fits_80_gib():
    # dgxc-benchmarking v24.11.1 nemotron4-340b-synth.yaml on 128 H100: TP 8, PP 8, VP 12, MBS 1, GBS 32
    # (dp 2, 16 micro-batches), sequence parallel, no dropout, distributed_fused_adam with optim.dtype bf16
    # (no copy of the weights, bf16 moments), grad_sync_dtype bf16, selective recompute.
    # Stage 0 per GPU: 12 layers of (QKV 18432·(96 + 2·8)·192 + projection 18432² + MLP 2·18432·73728)/8
    # = 431,751,168 plus two LayerNorms (4·18432 = 73,728, whole on every rank), and the embedding
    # 256000·18432/8 = 589,824,000: P = 12·431,824,896 + 589,824,000 = 5,771,722,752.
    # States: weights 2P, gradients 2P, optimizer (m, v: 4 bytes) over dp 2: 2P, so 6P = 34,630,336,512.
    # Activations per token and layer: norm inputs 2·2h, QKV and MLP inputs 2h each (8h / 8 with SP)
    # + (q 96 + k, v 2·8 heads of 192, 2 bytes; attention output 96·192·2; MLP up and activation
    # output 2·73728·2) / 8 = 18,432 + 46,848 = 65,280 bytes; 4096 tokens; interleaved 1F1B holds on
    # rank 0 (pp - 1)·2 + (vp - 1)·pp + 1 = 103 chunks of one layer (Megatron-Core
    # get_num_warmup_microbatches): 103·65,280·4096 = 27,540,848,640. Reserved: the CUDA context 0.75 GiB and
    # NCCL's 256 MiB for each of the tensor, data and pipeline groups.
    plan = {"tensor_parallel": 8, "pipeline_parallel": 8, "virtual_pipeline": 12, "schedule": "interleaved-1f1b"}
    plan |= {"micro_batch_size": 1, "global_batch_size": 32, "sequence_parallel": True, "zero_stage": 1}
    plan |= {"flash_attention": True, "recompute": "selective", "grad_reduce_dtype": "bf16"}
    plan |= {"main_params": "none", "adam_state_dtype": "bf16"}
    job = Job.from_dicts({"preset": "nemotron4-340b"}, plan, {"preset": "dgx-h100", "num_nodes": 16})
    est = estimate_memory(job)
    p = 5_771_722_752
    assert est.weights_bytes == pytest.approx(2 * p)
    assert est.gradients_bytes == pytest.approx(2 * p)
    assert est.optimizer_bytes == pytest.approx(2 * p)
    assert est.activations_bytes == pytest.approx(103 * 65_280 * 4096)
    assert est.reserved_bytes == 805_306_368 + 3 * 268_435_456
    total = 6 * p + 103 * 65_280 * 4096 + 1_610_612_736  # 63,781,797,888 bytes = 59.4 GiB
    assert est.total_bytes == pytest.approx(total)
    assert total < 80 * 2**30
