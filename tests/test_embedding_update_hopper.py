"""The eager row-wise Adagrad update (itercast::rowwise_adagrad_update, what the point-to-point emulation of
tools/measure_dlrm_sharding.py runs) on a Hopper GPU without a calibration: priced on the model fitted to a lent
H200's calls of it (curves.json `embedding_update`), not as streaming memory traffic; TorchRec's fused update
(FBGEMM, one kernel) keeps the streaming price and its warning.

By hand, from data/measured/h200_campaign/embedding_bag.csv: a 10,000,000 × 128 fp32 table, 8,192 uniform
lookups (8,191 distinct rows), took 0.467 ms; streaming what it moves (each distinct row and its state read and
written, 8,191 · 2 · (512 + 4) B = 8.45 MB, with the lookups' gradient rows read, 4.19 MB) at 4.8 TB/s is under
3 µs. The fitted model (curves.json): 337.28 µs a call + 2.7558e-10 s a lookup + 3.4373e-12 s per byte of the
distinct rows (8,192 · 512 B: the table is uniform over 10M rows, so each lookup a distinct row); its
accumulator (4.2 MB) is below the 32 MiB past which gathered bytes cost more: 337.28 + 2.26 + 14.42 = 353.96 µs.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import Job
from itercast.costs.analytic import AnalyticCostModel
from itercast.workloads.dlrm.config import EmbeddingTable, Shard
from itercast.workloads.dlrm.embedding import (
    builtin_update_model,
    embedding_seconds,
    shard_work,
    unmeasured_update,
)

MODEL = {"family": "llama", "num_layers": 1, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 256}


def backward_s(preset: str, eager: bool) -> float:
    system = Job.from_dicts({**MODEL, "seq_length": 32}, {}, {"preset": preset}).system
    table = EmbeddingTable(name="t", num_rows=10_000_000, embedding_dim=128, pooling_factor=1)
    work = shard_work(table, Shard("table_wise", (0,)), 0, 1, 8192)
    assert work is not None
    return embedding_seconds(AnalyticCostModel(system, "fp32"), table, work, eager_update=eager)[1]


def test_the_eager_update_on_hopper_costs_what_the_h200_measured():
    # the backward: the update (353.96 µs by hand) and the pooled and per-lookup gradient rows streamed (µs)
    eager = backward_s("h200", eager=True)
    assert 353.96e-6 < eager < 353.96e-6 + 10e-6
    assert eager == pytest.approx(0.467e-3, rel=0.25)  # the H200's own call of it, 0.467 ms
    # one model for the family: the H100 adds the same 353.96 µs to its own (slower) streamed rows
    assert 353.96e-6 < backward_s("dgx-h100", eager=True) < 353.96e-6 + 10e-6


def test_fused_updates_and_other_gpus_keep_streaming():
    # TorchRec's fused update on the same GPU: streamed, a few µs, not the eager call's 0.34 ms floor
    assert backward_s("h200", eager=False) < 20e-6
    assert builtin_update_model("A100-SXM4-80GB") is None
    assert backward_s("dgx-a100", eager=True) == backward_s("dgx-a100", eager=False)
    # the warning says so where it applies
    assert unmeasured_update("H200-SXM-141GB", None, eager_update=True) == ""
    assert "streaming memory traffic" in unmeasured_update("H200-SXM-141GB", None, eager_update=False)
    assert "streaming memory traffic" in unmeasured_update("A100-SXM4-80GB", None, eager_update=True)


def test_predict_says_nothing_of_an_eager_update_it_priced():
    def stderr(*args: str) -> str:
        done = CliRunner().invoke(app, list(args))
        assert done.exit_code == 0, done.output
        return done.stderr

    base = ["predict", "--model", "dlrm-small", "--system", "h200"]
    assert "Adagrad update" in stderr(*base)  # TorchRec's exchange: the fused update is streamed, and said
    assert "Adagrad update" not in stderr(*base, "--set", "model.exchange=point_to_point")


def test_only_the_emulations_step_pays_the_eager_update():
    import json

    def embedding_s(*extra: str) -> float:
        done = CliRunner().invoke(app, ["predict", "--model", "dlrm-small", "--system", "h200", "--json", *extra])
        assert done.exit_code == 0, done.output
        return json.loads(done.stdout)["family_time_s"]["embedding"]

    # dlrm-small on 8 H200: the busiest rank's tables each pay at least the eager call's 337 µs under the
    # point-to-point emulation; under TorchRec its lookups and fused (streamed) update take a third of that
    assert embedding_s("--set", "model.exchange=point_to_point") > 337e-6 > 3 * embedding_s()
