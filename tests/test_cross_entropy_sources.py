"""validation/step_times.py: each fitting-table row runs the loss kernels its source's config names
(plan.cross_entropy), read from the configs, not from a step time. No prediction is made here."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
import step_times as st


def test_nemo_24_07_rows_fuse_the_loss_only_where_the_launcher_yaml_says_so():
    # NeMo-Framework-Launcher 24.07: llama/llama3_8b.yaml has `cross_entropy_loss_fusion: true`;
    # llama/llama2_7b.yaml and gpt3/175b.yaml do not name it, so Megatron-Core's default (False) runs.
    assert st.cross_entropy("nemo-24.07", "llama3-8b") == "megatron_fused"
    assert st.cross_entropy("nemo-24.07", "llama2-7b") == "megatron"
    assert st.cross_entropy("nemo-24.07", "gpt3-175b") == "megatron"


def test_dgxc_rows_fuse_llama_and_nemotron_but_not_gpt3():
    # dgxc-benchmarking llama3.1/llama3.1_70b.yaml and nemotron/nemotron4-340b-synth.yaml set
    # `cross_entropy_loss_fusion: true`; nemo_megatron/gpt3_175b_hydra.yaml does not.
    assert st.cross_entropy("dgxc-benchmarking", "llama3-70b") == "megatron_fused"
    assert st.cross_entropy("dgxc-benchmarking", "nemotron4-340b") == "megatron_fused"
    assert st.cross_entropy("dgxc-benchmarking", "gpt3-175b") == "megatron"


def test_a_row_takes_its_source_and_model_loss_unless_its_plan_names_one():
    row = st.Row("nemo-24.07", "LLAMA3-70B ×64", 64, 1.0, {"preset": "llama3-70b"}, {"dtype": "fp8"})
    assert row.plan["cross_entropy"] == "megatron_fused"
    custom = st.Row("megatron-core", "GPT ×8", 8, 1.0, {"family": "gpt"}, {"cross_entropy": "te"})
    assert custom.plan["cross_entropy"] == "te"
