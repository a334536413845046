"""Forward embedding lookups on a Hopper GPU without a calibration: priced on the model fitted to this
project's H100 lookups (curves.json `embedding_lookup`), not as streaming memory traffic.

By hand, from data/measured/h100_profile.db (3 passes each, caches flushed): a 1,000,000 × 128 fp32 table,
8,192 bags of 32 uniform lookups, took 95.7 / 95.8 / 96.0 µs. It gathers 8,192 · 32 rows of 512 bytes
(134,217,728 B) and writes 8,192 pooled rows (4,194,304 B): 138,412,032 B, which HBM streams in
138,412,032 / 3.35e12 = 41.3 µs at the datasheet rate. A lookup of one row a bag (18.4 µs measured for
1M × 128, 8,192 bags) moves 8.4 MB: 2.5 µs at that rate.
"""

from __future__ import annotations

import pytest

from itercast.config.job import Job
from itercast.costs.analytic import AnalyticCostModel
from itercast.workloads.dlrm.config import EmbeddingTable, Shard
from itercast.workloads.dlrm.embedding import builtin_lookup_model, embedding_seconds, shard_work

MODEL = {"family": "llama", "num_layers": 1, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 256}


def forward_s(preset: str, pooling: float, rows: int = 1_000_000, dim: int = 128, bags: int = 8192) -> float:
    system = Job.from_dicts({**MODEL, "seq_length": 32}, {}, {"preset": preset}).system
    table = EmbeddingTable(name="t", num_rows=rows, embedding_dim=dim, pooling_factor=pooling)
    work = shard_work(table, Shard("table_wise", (0,)), 0, 1, bags)
    assert work is not None
    return embedding_seconds(AnalyticCostModel(system, "fp32"), table, work)[0]


def test_an_h100_lookup_is_priced_as_the_h100_measured_it():
    assert forward_s("dgx-h100", 32) == pytest.approx(95.8e-6, rel=0.10)
    assert forward_s("dgx-h100", 1) == pytest.approx(18.4e-6, rel=0.15)
    # both well above what streaming the same bytes at the datasheet rate takes
    assert forward_s("dgx-h100", 32) > 2 * 41.3e-6
    assert forward_s("dgx-h100", 1) > 5 * 2.5e-6


def test_the_h200_shares_the_model_and_other_gpus_keep_streaming():
    # one model for the family: the H200 prices the H100's lookup alike (a lent H200 measured its
    # lookups at 0.998 of this model, geomean: validation/gpu_campaign_check.py)
    assert builtin_lookup_model("H200-SXM-141GB") is not None
    assert forward_s("h200", 32) == forward_s("dgx-h100", 32)
    assert builtin_lookup_model("A100-SXM4-80GB") is None
    assert builtin_lookup_model("V100-SXM2-16GB") is None
    # an A100 without a calibration streams: 138,412,032 B at 2,039 GB/s × at most 0.904 ≥ 75.1 µs,
    # and no more than twice that (the curve's ramp at 138 MB is near its top)
    a100 = forward_s("dgx-a100", 32)
    assert 138_412_032 / (2.039e12 * 0.904) <= a100 < 2 * 138_412_032 / (2.039e12 * 0.904)


def test_predict_and_shard_say_when_lookups_are_streamed():
    from typer.testing import CliRunner

    from itercast.cli import app

    def stderr(*args: str) -> str:
        done = CliRunner().invoke(app, list(args))
        assert done.exit_code == 0, done.output
        return done.stderr

    said = "embedding lookups on A100-SXM4-80GB are priced as streaming memory traffic"
    assert said in stderr("predict", "--model", "dlrm-dcnv2-criteo", "--system", "dgx-a100")
    assert said in stderr("shard", "--model", "dlrm-dcnv2-criteo", "--system", "dgx-a100", "--top", "1")
    assert "embedding lookups on" not in stderr("predict", "--model", "dlrm-dcnv2-criteo", "--system", "h200")
    # a calibration with a lookup model: nothing to say on the A100 either
    from itercast.workloads.dlrm import unmeasured_lookups

    model = {"form": "lookup", "alpha_s": 1e-5, "s_per_gathered_byte": 1e-12, "max_lookups": 1e6, "points": 8}
    calibration = {"operators": {"models": {"aten::_embedding_bag:embedding_bag_fwd": model}}}
    assert unmeasured_lookups("A100-SXM4-80GB", calibration) == ""
    assert unmeasured_lookups("A100-SXM4-80GB", None).startswith("embedding lookups on A100-SXM4-80GB")


def test_the_unmeasured_update_and_the_built_in_models_range_are_said():
    from itercast.workloads.dlrm import DLRMConfig, beyond_profile, unmeasured_embedding_ops

    # no GPU's update is built in: said on an H200 too, not when a calibration models it
    update = "the row-wise Adagrad update of sharded tables on H200-SXM-141GB is priced as streaming memory traffic"
    assert [n[: len(update)] for n in unmeasured_embedding_ops("H200-SXM-141GB", None)] == [update]
    calibration = {"operators": {"models": {"itercast::rowwise_adagrad_update:embedding_bag_update": {}}}}
    assert unmeasured_embedding_ops("H200-SXM-141GB", calibration) == []
    # the built-in lookup model was profiled up to 1,048,576 lookups a call (the H100 profile's largest):
    # pooling 100 × 4,096 samples × 8 ranks = 3,276,800 a table-wise owner's call, 3.1× beyond; 1,024 samples: 0.8×
    table = {"name": "t0", "num_rows": 1000, "embedding_dim": 64, "pooling_factor": 100}
    dlrm = DLRMConfig(dense_features=13, bottom_mlp=(64,), top_mlp=(1,), tables=(table,))
    note = beyond_profile(dlrm, 8, 4096, None, "H200-SXM-141GB")
    assert (
        "a table-wise owner of t0 looks up 3,276,800 rows per call, 3.1× the largest" in note and "(1,048,576)" in note
    )
    assert beyond_profile(dlrm, 8, 1024, None, "H200-SXM-141GB") == ""
    assert beyond_profile(dlrm, 8, 4096, None, "A100-SXM4-80GB") == ""  # nothing profiled to compare with
    assert "row-wise Adagrad update of sharded tables on H200" in stderr_of(
        "predict", "--model", "dlrm-dcnv2-criteo", "--system", "h200"
    )


def stderr_of(*args: str) -> str:
    from typer.testing import CliRunner

    from itercast.cli import app

    done = CliRunner().invoke(app, list(args))
    assert done.exit_code == 0, done.output
    return done.stderr
