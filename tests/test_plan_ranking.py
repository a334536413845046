"""validation/plan_ranking.py: Kendall τ, a row's measurement made time-like, and a row's model / system /
overrides read into a Job (no prediction is made here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
import plan_ranking as pr

from itercast.costs.analytic import AnalyticCostModel
from itercast.data_paths import read_csv_rows
from itercast.errors import ConfigError
from itercast.hardware.topology import GroupPlacement

MEASURED = Path(__file__).resolve().parents[1] / "data" / "published" / "collectives" / "jean_zay_all_reduce.csv"


def test_kendall_tau_of_three_plans_counts_each_pair_once():
    # Pairs (0,1) and (0,2) agree in order, (1,2) disagrees: (2 − 1) / 3.
    assert pr.kendall_tau([1.0, 2.0, 3.0], [10.0, 30.0, 20.0]) == pytest.approx((2 - 1) / 3)
    # Reversed order: all three pairs disagree.
    assert pr.kendall_tau([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-3 / 3)


def test_measured_time_like_inverts_rates_and_keeps_seconds():
    assert pr.measured_time_like({"s_per_step": "123.5"}, "r") == pytest.approx(123.5)
    assert pr.measured_time_like({"mfu": "0.5", "s_per_step": ""}, "r") == pytest.approx(1 / 0.5)
    assert pr.measured_time_like({"tokens_per_s_per_gpu": "4000"}, "r") == pytest.approx(1 / 4000)


@pytest.mark.parametrize("row", [{"s_per_step": "1", "mfu": "0.4"}, {"s_per_step": ""}])
def test_measured_time_like_wants_exactly_one_measurement(row):
    with pytest.raises(ConfigError, match=r"f\.csv data row 3: expected exactly one of s_per_step"):
        pr.measured_time_like(row, "f.csv data row 3")


def _row(**over: str) -> dict[str, str]:
    row = {
        "model": "",
        "system": "dgx-a100",
        "gpus": "8",
        "seq_length": "512",
        "global_batch_size": "8",
        "micro_batch_size": "1",
        "data_parallel": "2",
        "tensor_parallel": "2",
        "pipeline_parallel": "2",
        "virtual_pipeline": "1",
        "schedule": "1f1b",
        "zero_stage": "1",
        "recompute": "full",
        "dtype": "fp16",
        "tp_comm_overlap": "false",
        "stage_layers": "3 1",
        "overrides": "model.family=gpt model.num_layers=4 model.hidden_size=256 model.num_attention_heads=4 "
        "model.vocab_size=1024 plan.sequence_parallel=false system.network.nics_per_node=4 "
        "system.network.nic_bandwidth_bytes_per_s=12.5e9",
    }
    return row | over


def test_a_row_builds_its_model_from_overrides_and_overrides_the_system_preset():
    job = pr._plan_job(_row())
    assert (job.model.num_layers, job.model.hidden_size, job.model.seq_length) == (4, 256, 512)
    assert job.plan.stage_layers == (3, 1)
    assert job.plan.sequence_parallel is False  # the override beats the tp > 1 default
    assert job.system.gpu.name == "A100-SXM4-80GB"
    assert (job.system.network.nics_per_node, job.system.network.nic_bandwidth_bytes_per_s) == (4, 12.5e9)
    assert job.system.num_nodes == 8 // 8


def test_a_row_without_system_or_overrides_is_a_preset_on_dgx_h100():
    row = _row(model="llama3-8b", system="", overrides="", stage_layers="", seq_length="8192")
    del row["system"], row["overrides"]
    job = pr._plan_job(row)
    assert job.system.gpu.name == "H100-SXM5-80GB"
    assert job.model.num_layers == 32 and job.plan.sequence_parallel is True  # tp 2 > 1


def test_every_published_row_builds_a_job_with_at_least_two_plans_per_job():
    jobs = pr.jobs()
    assert all(len(plans) >= 2 for plans in jobs.values())


def test_checking_jobs_group_the_checking_tables_plans_and_leave_out_what_the_ranking_files_hold():
    jobs = pr.checking_jobs()
    assert all(len(plans) >= 2 for plans in jobs.values())
    assert not any("bloom" in name for name in jobs)  # BLOOM's prequel tables: in the plan_ranking files
    # torchtitan's Llama 2 13B on 64 A100 at global batch 128: no, layer and op activation checkpointing
    (thirteen,) = [plans for name, plans in jobs.items() if name.startswith("llama2-13b 64 A100")]
    assert sorted(label for label, _, _ in thirteen) == [
        "Llama 2 13B FSDP bs2 no AC x64 A100",
        "Llama 2 13B FSDP bs2 selective layer AC x64 A100",
        "Llama 2 13B FSDP bs2 selective op AC x64 A100",
    ]
    # torchtitan's async-TP pairs of Llama 3 70B on 256 H100 are in torchtitan_h100.csv: not counted twice
    assert not any(name.startswith("llama3-70b 256") for name in jobs)
    # each of Narayanan et al.'s ZeRO-3 vs PTD-P pairs, five GPU counts
    zero3 = [plans for name, plans in jobs.items() if "narayanan2021" in name]
    assert len(zero3) == 5 and all({j.plan.zero_stage for _, j, _ in plans} == {0, 3} for plans in zero3)


def test_rows_of_one_configuration_are_one_plan_at_the_median_of_their_measurements():
    # ZeRO-1's state sharded within groups of 2 of 2 data-parallel ranks is one copy over every rank: the same plan
    plain = pr._plan_job(_row())
    whole = pr._plan_job(_row(overrides=_row()["overrides"] + " plan.zero_shard_ranks=2"))
    assert whole.plan.zero_shard_ranks == 2 and pr.configuration_key(whole) == pr.configuration_key(plain)
    # 2 groups of 2 over 4 data-parallel ranks: two copies of the state, another plan
    four = dict(data_parallel="4", tensor_parallel="1", gpus="8")
    halved = pr._plan_job(_row(**four, overrides=_row()["overrides"] + " plan.zero_shard_ranks=2"))
    assert pr.configuration_key(halved) != pr.configuration_key(pr._plan_job(_row(**four)))
    merged = pr.one_row_per_configuration([("a", plain, 10.0), ("b", halved, 11.0), ("c", whole, 13.0)])
    assert [(label, m) for label, _, m in merged] == [("a", 11.5), ("b", 11.0)]  # (10 + 13) / 2


def test_internlm_8_gpu_job_has_each_plan_once():
    # at 8 GPUs zero1=8 (tp 1, dp 8) and zero1=4 (tp 2, dp 4) shard over every data-parallel rank: 4 rows, 2 plans
    (eight,) = [plans for name, plans in pr.jobs().items() if name == "internlm7b 8 A100 gbs64"]
    assert sorted(job.plan.tensor_parallel for _, job, _ in eight) == [1, 2]


def _file_rows(name: str) -> list[dict[str, str]]:
    return pr._read(pr.DATA / name)


def test_zero_bubble_rows_give_the_first_and_last_stage_one_layer_fewer():
    # Table 4's 1.5B model: 22 layers on 8 stages. 1F1B: (22 + 2) / 8 = 3 layers a stage, 2 on the first and last;
    # 1F1B-I: one layer a chunk, (22 + 2) / 8 = 3 chunks a stage, the first and the last chunk empty.
    jobs = pr.jobs()
    (one_f, inter) = [job for _, job, _ in jobs["zb gpt-1.5B 8 A100 gbs144"]]
    assert one_f.plan.stage_layers == (2, 3, 3, 3, 3, 3, 3, 2) and one_f.plan.virtual_pipeline == 1
    assert inter.plan.virtual_pipeline == 3 and inter.plan.schedule == "interleaved-1f1b"
    assert inter.plan.stage_layers == (0, *[1] * 22, 0) and sum(inter.plan.stage_layers) == 22
    # samples/s per GPU x 1024 tokens: 11.8 and 13.1 in the paper's table
    assert [float(r["tokens_per_s_per_gpu"]) for r in _file_rows("zero_bubble_a100.csv")[:2]] == [
        pytest.approx(11.8 * 1024),
        pytest.approx(13.1 * 1024),
    ]


def test_lucie_rows_run_deepspeed_0_12_6s_optimizers():
    """ZeRO 0 in bf16 is BF16_Optimizer: fp32 accumulation after autograd's add into the bf16 .grad it zeroed
    (clear_lp_grads at v0.12.6), cast to bf16 for the all-reduce (the engine's
    communication_data_type, bf16 under bf16 when no config names one), weights sharded and gathered (itercast's
    ZeRO-1); ZeRO 1 is DeepSpeedZeroOptimizer: autograd's bf16 sums, a bf16 all-reduce of each bucket."""
    rows = _file_rows("lucie7b_a100_jean_zay.csv")
    bf16_optimizer = [r for r in rows if r["source"].endswith("(ZeRO stage 0: DeepSpeed's BF16_Optimizer)")]
    assert 0 < len(bf16_optimizer) < len(rows)
    for r in rows:
        job = pr._plan_job(r)
        p = job.plan
        assert p.cuda_launch_blocking is True and p.zero_stage == 1 and p.zero_grad_reduce == "all_reduce"
        expected = ("bf16", "fp32_copy_add_zeroed") if r in bf16_optimizer else ("bf16", "autograd")
        assert (p.grad_reduce_dtype, p.grad_accumulation) == expected
        assert p.global_batch_size % (p.micro_batch_size * p.data_parallel) == 0
        assert (job.model.num_layers, job.model.hidden_size, job.model.ffn_hidden_size) == (32, 4096, 11008)
    # 32 GPUs, sequence 4096, GBS 512, TP 1 PP 2 MBS 2: 102,907.904 tokens/s over 32 GPUs in the summary (3,215.87)
    (first,) = [
        r
        for r in rows
        if r["job"] == "lucie7b 32 A100 seq4096 gbs512"
        and r["micro_batch_size"] == "2"
        and r["pipeline_parallel"] == "2"
        and r["tensor_parallel"] == "1"
    ]
    assert float(first["tokens_per_s_per_gpu"]) == pytest.approx(3215.9, abs=0.05)


def test_bloom_prequel_rows_reduce_their_fp16_buckets_in_fp16():
    """BigScience's February 2022 candidates ran fp16 with ZeRO 1 (DeepSpeed 3401d2516): autograd's fp16 sums,
    each bucket's slices reduced to their rank as they are, 2 bytes on the wire."""
    rows = _file_rows("bloom_a100_jean_zay.csv")
    assert len(rows) == 45
    for r in rows:
        p = pr._plan_job(r).plan
        assert (p.dtype, p.grad_bytes, p.grad_accumulation) == ("fp16", 2, "autograd")
        assert p.zero_grad_reduce == "reduce_per_rank"


def test_internlm_rows_run_july_2023s_hybrid_zero():
    """InternLM's HybridZeroOptimizer at the table's commit (c18bec9): bf16 buckets all-reduced from the last
    micro-batch's backward, autograd's sums in between, each rank's updated shard broadcast in turn after the step."""
    rows = _file_rows("internlm7b_a100.csv")
    assert len(rows) == 32 and sum("plan.zero_shard_ranks=" in r["overrides"] for r in rows) == 16
    for r in rows:
        p = pr._plan_job(r).plan
        # version 3: zero1=8 (tp 1) and zero1=4 (tp 2), one node's data-parallel ranks; version 1: all of them
        assert p.zero_shard_ranks in (None, 8 // p.tensor_parallel)
        assert (p.zero_stage, p.zero_grad_reduce, p.zero_param_gather) == (1, "all_reduce", "broadcast_per_rank")
        assert (p.overlap_grad_reduce, p.overlap_param_gather) == (True, False)
        assert (p.grad_reduce_dtype, p.grad_accumulation) == ("bf16", "autograd")
        # the same tokens per GPU in every iteration: micro_num 4 of micro_bsz 2 (tp 1) or 4 (tp 2), sequence 2048
        assert (
            p.global_batch_size * 2048 / int(r["gpus"])
            == 4 * {1: 2, 2: 4}[p.tensor_parallel] * 2048 / p.tensor_parallel
        )


@pytest.mark.parametrize("name", ["lucie7b_a100_jean_zay.csv", "bloom_a100_jean_zay.csv"])
def test_jean_zay_rows_price_the_all_reduce_measured_on_that_cluster(name):
    """BigScience's fp32 all-reduce of 4e9 bytes on 4 Jean Zay nodes of 8 A100 took 1.529 s (trials 2-5; the committed
    measurement): every Jean Zay A100 row's network prices it within 1%, where Omni-Path's port speed priced 0.187 s."""
    (a100,) = [r for r in read_csv_rows(MEASURED) if r["gpu"].startswith("A100")]
    assert float(a100["seconds"]) == pytest.approx(1.529)
    systems = {pr._plan_job(r).system.network for r in _file_rows(name)}
    assert len(systems) == 1
    (network,) = systems
    system = pr._plan_job(_file_rows(name)[0]).system.model_copy(update={"network": network, "num_nodes": 4})
    seconds = AnalyticCostModel(system, "fp32").collective_s("all_reduce", 4e9, GroupPlacement(32, 4, 8))
    assert seconds == pytest.approx(1.529, rel=0.01)
