"""What `search` says beside the plans it shows: every note `predict` would say of each (priced_notes), once,
with the ranks of the plans it holds for."""

from __future__ import annotations

from itercast.cli.search_cmds import noted_plans, ranks_text
from itercast.config.job import Job, parse_section
from itercast.workloads.transformer_ops import priced_notes


def test_ranks_are_said_as_the_table_numbers_them_with_runs_as_ranges():
    assert ranks_text([1, 2, 3, 5]) == "1-3, 5"
    assert ranks_text([4]) == "4"
    assert ranks_text([1, 3, 4, 7, 8, 9]) == "1, 3-4, 7-9"


def test_each_note_is_said_once_with_the_plans_it_holds_for_in_first_said_order():
    plans = [{"notes": ["b"]}, {"notes": ["a", "b"]}, {"notes": []}, {"notes": ["a"]}]
    assert noted_plans(plans) == {"b": [1, 2], "a": [2, 4]}


def test_priced_notes_are_the_notes_that_hold_for_the_plan():
    def job(pad: int) -> Job:  # GPT-2's 50,257 rows: unaligned without make_vocab_size_divisible_by's padding
        plan = {"global_batch_size": 8, "data_parallel": 1, "make_vocab_size_divisible_by": pad}
        system = {"preset": "dgx-h100", "num_nodes": 1, "node": {"gpus_per_node": 1}}
        return Job.from_dicts({"preset": "gpt3-1.3b", "vocab_size": 50257}, plan, system)

    padded, unpadded = job(128), job(1)
    assert priced_notes(padded.model, padded.plan, padded.system) == []
    (said,) = priced_notes(unpadded.model, unpadded.plan, unpadded.system)
    assert said.startswith("the logits GEMMs run over 50,257 vocabulary rows per rank")


def test_a_gradient_bucket_smaller_than_a_layer_is_said_to_be_priced_one_a_layer():
    """User probe 9: grad_bucket_size_params from 1 to 40M left GPT-3 1.3B's step unchanged, silently. One layer
    of it on a GPU at tp 1 holds 12·h² + 13·h parameters (h 2,048): 50,331,648 + 26,624 = 50,358,272; a bucket
    below that is said to be priced one a layer, one of that size or more is not."""
    from itercast.workloads.transformer_ops import small_bucket_note

    model = parse_section("model", {"preset": "gpt3-1.3b"})
    layer = 12 * 2048**2 + 13 * 2048
    small = small_bucket_note(model, parse_section("plan", {"grad_bucket_size_params": 10_000}))
    assert small is not None and f"below one layer's {layer:,} parameters a GPU" in small
    assert small_bucket_note(model, parse_section("plan", {"grad_bucket_size_params": layer})) is None
    assert small_bucket_note(model, parse_section("plan", {})) is None  # Megatron's default, 40M or more: priced
