"""A power-capped GPU (GPUSpec.power_limit_w) by hand, on test_golden's linear calibration (every
efficiency 1, every latency 0): compute-bound kernels slow by the measured fraction, the rest do not.

The H100 fraction at 500 W, from data/published/kernels/power_limit_gemm.csv (pytorch/FBGEMM PR #2546,
cuBLAS bf16 at 500 W): 585.23, 575.12, 546.31 TFLOP/s measured where the bf16 curve as fitted gives
695.7, 705.5, 703.2 TFLOP/s, so time ratios 0.841, 0.815, 0.777 and their geomean
(0.841 × 0.815 × 0.777)^(1/3) = 0.5326^(1/3) = 0.811.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from test_golden import HBM, LINK, PEAK, SYSTEM, linear_calibration

from itercast.config.job import Job
from itercast.config.system import GPUSpec, SystemConfig
from itercast.costs.analytic import AnalyticCostModel
from itercast.hardware.topology import place_group

H100 = {**SYSTEM["gpu"], "name": "H100-SXM5-80GB", "peak_flops": {"fp32": PEAK, "bf16": PEAK, "fp8": 2 * PEAK}}


def costs(power_limit_w: float | None, dtype: str = "bf16") -> AnalyticCostModel:
    system = SystemConfig.model_validate({**SYSTEM, "gpu": {**H100, "power_limit_w": power_limit_w}})
    return AnalyticCostModel(system, dtype, linear_calibration())


def test_a_500_w_h100_runs_gemms_and_attention_at_0_811_of_the_nominal_rate():
    # 1e9 FLOPs at PEAK = 1e12 FLOP/s × 0.811 → 1e9 / 8.11e11 = 1.2330 ms (nominal: 1 ms)
    assert float(costs(500).gemm_s(1e9)) == pytest.approx(1e9 / 8.11e11)
    assert float(costs(None).gemm_s(1e9)) == pytest.approx(1e-3)
    # FP8 GEMMs on the same clock: 1e9 / (2e12 × 0.811) = 0.6165 ms
    assert float(costs(500, "fp8").gemm_s(1e9)) == pytest.approx(1e9 / 1.622e12)
    # attention (the GEMM rate × 0.75 on a GPU without a fitted kernel): 1e9 / (0.75 × 8.11e11) = 1.6441 ms
    assert float(costs(500).attention_s(1e9)) == pytest.approx(1e9 / 6.0825e11)
    # fp8 training keeps attention in bf16, at the same capped clock
    assert float(costs(500, "fp8").attention_s(1e9)) == pytest.approx(1e9 / 6.0825e11)


def test_the_nominal_power_prices_as_unset_and_600_w_interpolates_linearly():
    assert float(costs(700).gemm_s(1e9)) == float(costs(None).gemm_s(1e9))
    # 0.811 at 500 W, 1 at 700 W: 0.811 + (1 − 0.811) × 100 / 200 = 0.9055 at 600 W
    assert float(costs(600).gemm_s(1e9)) == pytest.approx(1e9 / 9.055e11)


def test_memory_bound_kernels_and_collectives_do_not_slow_under_the_cap():
    capped, nominal = costs(500), costs(None)
    # 1e8 bytes at HBM = 1e11 B/s: 1 ms either way
    assert float(capped.memory_s("elementwise", 1e8)) == pytest.approx(1e8 / HBM)
    assert float(nominal.memory_s("elementwise", 1e8)) == pytest.approx(1e8 / HBM)
    group = place_group(8, 1, 8)  # one node's 8 GPUs
    # all-reduce of 8e7 bytes over 8 GPUs on LINK = 1e10 B/s: 2 × 7/8 × 8e7 / 1e10 = 14 ms either way
    assert capped.collective_s("all_reduce", 8e7, group) == pytest.approx(2 * 7 / 8 * 8e7 / LINK)
    assert nominal.collective_s("all_reduce", 8e7, group) == pytest.approx(2 * 7 / 8 * 8e7 / LINK)


def test_a_job_sets_the_limit_on_a_preset_gpu_with_a_dotted_override():
    job = Job.load(overrides=["system.gpu.power_limit_w=500"], model="llama3-8b", system="dgx-h100")
    assert job.system.gpu.power_limit_w == 500
    assert job.system.gpu.compute_throughput_fraction() == pytest.approx(0.811)


@pytest.mark.parametrize(
    ("name", "watts", "message"),
    [
        ("H100-SXM5-80GB", 0, "greater than 0"),
        ("H100-SXM5-80GB", -500, "greater than 0"),
        ("H100-SXM5-80GB", 701, "expected 500 to 700 W"),  # above the 700 W rating
        ("H100-SXM5-80GB", 450, "no kernel-level measurement below 500 W"),  # no extrapolation
        ("A100-SXM4-80GB", 300, "no kernel-level measurement below 400 W"),  # nothing measured for A100
        ("linear", 500, "the nominal power of linear is not known"),
    ],
)
def test_a_limit_out_of_range_or_unmeasured_is_an_error_naming_the_field(name: str, watts: float, message: str):
    with pytest.raises(ValidationError, match=message) as err:
        GPUSpec.model_validate({**H100, "name": name, "power_limit_w": watts})
    assert "power_limit_w" in str(err.value)
