"""validation/step_times.py and the long-sequence checking file: each row prices the attention kernel its launch
scripts ran (plan.attention_kernel), read from the scripts at the row's release, not from a step time. Where
NVTE_FUSED_ATTN=0, Transformer Engine runs FlashAttention-2 (fa2) instead of cuDNN's fused attention."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
import checking_step_times as chk
import step_times as st

from itercast.data_paths import shared_data_dir

SOURCE = "NVIDIA/dgxc-benchmarking @ {} (2025-06-09 v24.11.1) : nemo_megatron/README_175b.md"
V24_11_1, V25_01_1, V25_02, V25_04_02, V25_05_05 = "35a9aecc", "e6afea3a", "8f5cbb37", "0efdb235", "c5c765f2"


def test_dgxc_kernels_by_model_and_release():
    # nemo_megatron/launch.sh at v24.11.1 and configure.sh at v25.01.1 export NVTE_FUSED_ATTN=0; v25.02 and
    # 25.04.02 export 1
    for commit, kernel in ((V24_11_1, "fa2"), (V25_01_1, "fa2"), (V25_02, "cudnn"), (V25_04_02, "cudnn")):
        assert st.dgxc_attention_kernel("gpt3-175b", SOURCE.format(commit + "0" * 32)) == kernel
    # nemotron/configure.sh: the 340b branch 0, the 15b branch 1; llama3.1 sets 1; v25.05.05 sets nothing
    assert st.dgxc_attention_kernel("nemotron4-340b", SOURCE.format(V24_11_1)) == "fa2"
    assert st.dgxc_attention_kernel("nemotron4-15b", SOURCE.format(V24_11_1)) == "cudnn"
    assert st.dgxc_attention_kernel("llama3-70b", SOURCE.format(V25_01_1)) == "cudnn"
    assert st.dgxc_attention_kernel("nemotron4-340b", SOURCE.format(V25_05_05)) == "cudnn"


def test_rows_of_the_launcher_era_run_flash_attention_2():
    data = shared_data_dir()
    if data is not None:  # without the shared data, only the committed checking file
        nemo = {r.label: r.plan["attention_kernel"] for r in st.nemo_rows(data) if not r.skipped}
        # NeMo-Framework-Launcher's config.yaml NVTE_FUSED_ATTN: 0; its GPT-3 175B example sets 1
        assert nemo["LLAMA3-8B ×8"] == "fa2" and nemo["GPT3-175B ×128"] == "cudnn"
        assert {r.plan["attention_kernel"] for r in st.grok_rows(data)} == {"fa2"}  # grok1/configure.sh: 0
    long_sequence = [r for r in chk.load_rows() if r.source == "nemo_long_sequence_h100"]
    assert len(long_sequence) == 9 and all(r.plan["attention_kernel"] == "fa2" for r in long_sequence)
