"""What llm-foundry runs beside its model's kernels: Composer's training metrics (plan.metric_cross_entropies),
LanguageCrossEntropy and LanguagePerplexity, each running torch's cross-entropy over every micro-batch's logits
again in fp32 without gradient (composer/trainer/trainer.py _eval_train_metrics, composer/metrics/nlp.py at
v0.17.2), and its flash path's unpadding copies (plan.attention_unpad). Expected values worked out by hand."""

from __future__ import annotations

import pytest

from itercast.config.job import Job
from itercast.errors import ConfigError
from itercast.workloads.transformer_ops import backward_of, head_forward, layer_forward


def test_composers_metric_cross_entropies_read_the_logits_again_without_a_backward():
    # a dense gpt head over 32 tokens × 128 logits = 4,096 bf16 logits; each metric's fp32 cross-entropy: the cast
    # (2 + 4 B) and log_softmax's 3 reads and 1 write of 4 B: 22 B a logit, 4 kernels; two metrics 180,224 B
    j = Job.from_dicts(
        {"family": "gpt", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32}
        | {"vocab_size": 128},
        {"tensor_parallel": 1, "metric_cross_entropies": 2, "make_vocab_size_divisible_by": 1},
        {"preset": "dgx-h100", "num_nodes": 1, "node": {"gpus_per_node": 1}},
    )
    fwd = head_forward(j.model, j.plan)
    metric = [o for o in fwd if o.name == "metric_cross_entropy"]
    assert [(o.amount, o.count) for o in metric] == [(2 * 4096 * 22, 8)]
    # torch's fp32 cross-entropy, as the loss: at the 0.853 of the elementwise bandwidth the lent H200's reached
    assert [o.bandwidth_share for o in fwd if "cross_entropy" in o.name] == [0.853, 0.853]
    assert not [o for o in backward_of(fwd, j.plan) if o.name.startswith("metric_cross_entropy")]


def test_llm_foundrys_flash_path_gathers_q_k_v_and_scatters_the_output():
    # 32 tokens, 4 heads of 16 (MHA): q, k, v 3 × 32 × 64 × 2 B = 12,288 B gathered (read and write: 24,576 B;
    # backward zeros and scatter 36,864 B); the output 4,096 B scattered into zeros (12,288 B; backward gather 8,192)
    j = Job.from_dicts(
        {"family": "gpt", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32},
        {"tensor_parallel": 1, "attention_unpad": True},
        {"preset": "dgx-h100", "num_nodes": 1, "node": {"gpus_per_node": 1}},
    )
    ops = {o.name: o for o in layer_forward(j.model, j.plan)}
    unpad, pad = ops["core_attention.unpad"], ops["core_attention.pad"]
    assert (unpad.amount, unpad.backward_amount, pad.amount, pad.backward_amount) == (24576, 36864, 12288, 8192)
    names = list(ops)
    assert (
        names.index("core_attention.unpad") + 1
        == names.index("core_attention")
        == names.index("core_attention.pad") - 1
    )


def test_unpadding_is_refused_where_the_layer_has_no_single_fused_kernel_to_wrap():
    model = {"family": "gpt", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32}
    system = {"preset": "dgx-h100", "num_nodes": 1, "node": {"gpus_per_node": 2}}
    for plan, got in (
        ({"flash_attention": False}, "flash_attention=False"),
        ({"context_parallel": 2}, "context_parallel=2"),
    ):
        with pytest.raises(ConfigError, match=r"plan\.attention_unpad is llm-foundry's flash path") as err:
            Job.from_dicts(model, {"tensor_parallel": 1, "attention_unpad": True} | plan, system)
        assert got in str(err.value)
