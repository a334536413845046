"""A mixed cluster (system.device_groups): pipeline stages on the groups in order, each priced on its
group's GPU; memory against the smallest GPU, MFU against the mean peak; errors named."""

from __future__ import annotations

import pytest
from test_golden import HBM, PEAK, SYSTEM, linear_calibration

from itercast.config.job import Job
from itercast.costs.analytic import AnalyticCostModel
from itercast.errors import ConfigError
from itercast.predict import predict
from itercast.workloads.transformer import TransformerStepBuilder

# 4 layers, 2 stages on 2 single-GPU nodes, GPipe-free 1F1B with 4 micro-batches
MODEL = {"family": "gpt", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32}
MODEL |= {"vocab_size": 128}
PLAN = {"pipeline_parallel": 2, "global_batch_size": 4}
NODE = {**SYSTEM["node"], "gpus_per_node": 1}
FAST = SYSTEM["gpu"]
SLOW = {
    **FAST,
    "name": "half",
    "peak_flops": {"fp32": PEAK / 2, "bf16": PEAK / 2},
    "hbm_bandwidth_bytes_per_s": HBM / 2,
}
SLOW |= {"hbm_bytes": FAST["hbm_bytes"] / 4}


def mixed(first: dict, second: dict, **system) -> Job:
    groups = [{"gpu": first, "num_nodes": 1}, {"gpu": second, "num_nodes": 1}]
    return Job.from_dicts(MODEL, PLAN, {**SYSTEM, "node": NODE, "device_groups": groups, **system})


def uniform(gpu: dict) -> Job:
    return Job.from_dicts(MODEL, PLAN, {**SYSTEM, "gpu": gpu, "node": NODE, "num_nodes": 2})


def test_one_gpu_kind_in_groups_is_the_uniform_cluster():
    j = mixed(FAST, FAST)
    assert j.system.num_nodes == 2  # the groups' sum
    cal = linear_calibration()
    assert predict(j, cal).step_time_s == predict(uniform(FAST), cal).step_time_s


def test_each_stage_is_priced_on_its_groups_gpu():
    cal = linear_calibration()
    j = mixed(FAST, SLOW)
    b = TransformerStepBuilder(j, AnalyticCostModel(j.system, j.plan.dtype, cal))
    assert [c.system.gpu.name for c in b.stage_costs] == ["linear", "half"]
    # flat curves, no latency: half the FLOP/s and half the bandwidth take twice as long
    fast, slow = b.stage_units
    assert slow.layer_fwd.compute_s == pytest.approx(2 * fast.layer_fwd.compute_s)
    assert slow.layer_bwd.compute_s == pytest.approx(2 * fast.layer_bwd.compute_s)
    step = predict(j, cal).step_time_s
    assert predict(uniform(FAST), cal).step_time_s < step < predict(uniform(SLOW), cal).step_time_s


def test_memory_against_the_smallest_gpu_and_mfu_against_the_mean_peak():
    cal = linear_calibration()
    r = predict(mixed(FAST, SLOW), cal)
    assert r.memory.capacity_bytes == SLOW["hbm_bytes"]
    assert r.mfu == pytest.approx(r.model_tflops_per_gpu * 1e12 / ((PEAK + PEAK / 2) / 2))


def test_group_presets_and_errors():
    groups = [{"preset": "dgx-h100", "num_nodes": 1}, {"preset": "dgx-a100", "num_nodes": 1}]
    j = Job.from_dicts(MODEL, PLAN | {"global_batch_size": 8}, {"preset": "dgx-h100", "device_groups": groups})
    assert j.plan.data_parallel == 8 and [g.name for g in j.stage_gpus()] == ["H100-SXM5-80GB", "A100-SXM4-80GB"]
    with pytest.raises(ConfigError, match="the device groups hold 3 nodes"):
        Job.from_dicts(MODEL, PLAN, {**SYSTEM, "node": NODE, "num_nodes": 2, "device_groups": [
            {"gpu": FAST, "num_nodes": 1}, {"gpu": SLOW, "num_nodes": 2}]})  # fmt: skip
    node2 = {**NODE, "gpus_per_node": 2}
    with pytest.raises(ConfigError, match="a device group of 2 linear GPUs does not hold whole stages of 4 GPUs"):
        Job.from_dicts(MODEL, {"pipeline_parallel": 1, "data_parallel": 4}, {**SYSTEM, "node": node2, "device_groups": [
            {"gpu": FAST, "num_nodes": 1}, {"gpu": SLOW, "num_nodes": 1}]})  # fmt: skip


def test_search_refuses_a_mixed_cluster():
    from typer.testing import CliRunner

    from itercast.cli import app

    res = CliRunner().invoke(
        app,
        [
            "search",
            "--model",
            "gpt3-1.3b",
            "--system",
            "dgx-h100",
            "--set",
            "system.device_groups=[{preset: dgx-a100, num_nodes: 1}]",
            "--set",
            "plan.global_batch_size=8",
        ],
    )
    assert res.exit_code == 2 and "search covers clusters of one GPU kind" in res.output


def test_predict_names_each_stage_gpu():
    from typer.testing import CliRunner

    from itercast.cli import app

    groups = "system.device_groups=[{preset: dgx-h100, num_nodes: 1}, {preset: dgx-a100, num_nodes: 1}]"
    args = ["predict", "--model", "gpt3-1.3b", "--system", "dgx-h100", "--set", groups]
    res = CliRunner().invoke(app, [*args, "--set", "plan.pipeline_parallel=2", "--set", "plan.tensor_parallel=8"])
    assert res.exit_code == 0, res.output
    assert "8× H100-SXM5-80GB + 8× A100-SXM4-80GB" in res.output
    assert "0: H100-SXM5-80GB, 1: A100-SXM4-80GB" in res.output
