"""The context parallel sizes the search tries by default: up to 8, and at long sequences as many ranks as keep
16,384 tokens each, so a 1M-token job is not searched only among plans that cannot hold it well."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from itercast.cli import app
from itercast.search.plan_space import context_parallel_cap


def test_the_cap_by_hand():
    assert context_parallel_cap(4096) == 8
    assert context_parallel_cap(131072) == 8  # 131,072 / 16,384 = 8
    assert context_parallel_cap(262144) == 16
    assert context_parallel_cap(1048576) == 64


def test_a_million_token_job_is_searched_beyond_cp_8_unless_capped():
    args = ["search", "--model", "llama2-7b", "--system", "dgx-h100", "--set", "system.num_nodes=128"]
    args += ["--set", "model.seq_length=1048576", "--set", "plan.global_batch_size=4", "--set", "plan.dtype=fp8"]
    args += ["--top", "1", "--json", "--workers", "1", "--micro-batch-sizes", "1", "--set", "plan.zero_stage=1"]
    found = CliRunner().invoke(app, args)
    assert found.exit_code == 0, found.output
    best = json.loads(found.stdout)["plans"][0]
    assert best["plan"]["context_parallel"] > 8
    capped = CliRunner().invoke(app, [*args, "--max-context-parallel", "8"])
    assert capped.exit_code == 0, capped.output
    kept = json.loads(capped.stdout)["plans"][0]
    assert kept["plan"]["context_parallel"] <= 8 and kept["step_time_s"] > best["step_time_s"]
