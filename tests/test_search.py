"""`itercast search`: the vectorised plan space is Job validation's, exhaustive search is brute
force over predict(), and the command's outputs and errors."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import Job, parse_section
from itercast.errors import ConfigError
from itercast.parallel.plan_table import COLUMNS
from itercast.predict import predict
from itercast.search.objectives import pareto_front
from itercast.search.plan_search import SearchRequest, run_search
from itercast.search.plan_space import SpaceOptions, enumerate_plans

MODEL = {"family": "llama", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8}
MODEL |= {"num_query_groups": 4, "seq_length": 256, "vocab_size": 1000}
SYSTEM = {"preset": "dgx-h100", "num_nodes": 1}
OPTIONS = SpaceOptions(micro_batch_sizes=(1, 2), max_context_parallel=2, max_virtual_pipeline=2)


def small_request(**plan) -> SearchRequest:
    base = parse_section("plan", {"global_batch_size": 16, **plan})
    model, system = parse_section("model", MODEL), parse_section("system", SYSTEM)
    return SearchRequest(model, system, base, (1,), OPTIONS, top_k=10_000)  # type: ignore[arg-type]


def job_accepted_plans() -> set[tuple]:
    """Every combination of the searched fields that Job validation accepts, by brute force."""
    accepted = set()
    sizes = [1, 2, 4, 8]
    grid = itertools.product(sizes, sizes, [1, 2], [1, 2], [1, 2], ["gpipe", "1f1b", "interleaved-1f1b"])
    for tp, pp, cp, vp, mbs, sched in grid:
        if 8 % (tp * pp * cp):
            continue
        for zero, rc, sp in itertools.product(range(4), ["none", "selective", "full"], [False, True]):
            plan = dict(tensor_parallel=tp, pipeline_parallel=pp, context_parallel=cp, virtual_pipeline=vp)
            plan |= dict(micro_batch_size=mbs, schedule=sched, zero_stage=zero, recompute=rc, sequence_parallel=sp)
            try:
                Job.from_dicts(MODEL, {**plan, "global_batch_size": 16}, SYSTEM)
            except ConfigError:
                continue
            accepted.add((tp, pp, cp, 8 // (tp * pp * cp), vp, mbs, sched, zero, rc, sp))
    return accepted


def table_plans(request: SearchRequest) -> set[tuple]:
    table, _ = enumerate_plans(request.model, request.system, request.base, 8, request.options)
    out = set()
    for row in range(len(table)):
        p = table.plan_fields(row)
        out.add(
            tuple(p[COLUMNS[k]] for k in ("tp", "pp", "cp", "dp", "vp", "mbs", "schedule", "zero", "recompute", "sp"))
        )
    return out


def test_vectorised_space_is_what_job_validation_accepts():
    # overlap switches fixed: the brute force would otherwise take minutes; identical plans
    # (selective recompute of fused attention, ZeRO without data parallelism) are folded in both
    fixed = {"overlap_grad_reduce": True, "overlap_param_gather": True}
    request = small_request()
    request = SearchRequest(
        request.model, request.system, request.base, (1,), SpaceOptions(**{**OPTIONS.__dict__, "fixed": fixed})
    )
    brute = set()
    for tp, pp, cp, dp, vp, mbs, sched, zero, rc, sp in job_accepted_plans():
        # the search folds plans that run the same: one schedule without pipelining, interleaving
        # only with vp > 1 (Megatron's), ZeRO without data parallelism, selective recompute of fused attention
        if (pp == 1 and sched != "1f1b") or (sched == "interleaved-1f1b" and vp == 1):
            continue
        if rc == "selective" or (dp * cp == 1 and zero > 0):
            continue
        # Megatron-Core (the default framework) has no GPipe, and no ZeRO-2/3 (Megatron-FSDP) with pipelining
        if sched == "gpipe" or (pp > 1 and zero >= 2):
            continue
        brute.add((tp, pp, cp, dp, vp, mbs, sched, zero, rc, sp))
    assert table_plans(request) == brute


def test_exhaustive_search_equals_brute_force_over_predict():
    fixed = {"overlap_grad_reduce": True, "overlap_param_gather": True, "recompute": "none"}
    req = small_request()
    req = SearchRequest(
        req.model, req.system, req.base, (1,), SpaceOptions(**{**OPTIONS.__dict__, "fixed": fixed}), top_k=10_000
    )
    result = run_search(req)
    brute = []
    for tp, pp, cp, dp, vp, mbs, sched, zero, rc, sp in table_plans(req):
        plan = dict(
            tensor_parallel=tp, pipeline_parallel=pp, context_parallel=cp, data_parallel=dp, virtual_pipeline=vp
        )
        plan |= dict(micro_batch_size=mbs, schedule=sched, zero_stage=zero, recompute=rc, sequence_parallel=sp)
        brute.append(predict(Job.from_dicts(MODEL, {**plan, "global_batch_size": 16}, SYSTEM)).step_time_s)
    assert len(result.plans) == len(brute) == result.valid
    assert result.plans[0]["step_time_s"] == min(brute)
    assert [r["step_time_s"] for r in result.plans] == sorted(brute)


def test_pareto_front_by_hand():
    time_s = np.array([3.0, 1.0, 2.0, 2.0, 4.0])
    memory = np.array([1.0, 5.0, 3.0, 4.0, 0.5])
    # fastest first: 1.0 s @ 5, then 2.0 s @ 3 (2.0 s @ 4 is dominated), 3.0 s @ 1, 4.0 s @ 0.5
    assert pareto_front(time_s, memory, np.arange(5)) == [1, 2, 0, 4]


def test_search_json_top_plan_is_what_predict_says():
    runner = CliRunner()
    args = ["search", "--model", "llama3-8b", "--system", "dgx-h100", "--set", "plan.global_batch_size=64"]
    out = runner.invoke(app, [*args, "--top", "3", "--micro-batch-sizes", "1", "--json", "--workers", "1"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert set(data) >= {"plans", "evaluated", "valid", "seconds", "fitting"}
    times = [p["step_time_s"] for p in data["plans"]]
    assert times == sorted(times) and all(p["fits"] for p in data["plans"])
    top = data["plans"][0]
    sets = [f"plan.{k}={json.dumps(v)}" for k, v in top["plan"].items()]
    pred = runner.invoke(
        app,
        ["predict", "--model", "llama3-8b", "--system", "dgx-h100", "--json", *[a for s in sets for a in ("--set", s)]],
    )
    assert pred.exit_code == 0, pred.output
    assert json.loads(pred.stdout)["step_time_s"] == pytest.approx(top["step_time_s"], rel=1e-12)


def test_fixed_field_is_kept_and_empty_space_names_the_tightest_constraint():
    runner = CliRunner()
    base = ["search", "--model", "llama3-8b", "--system", "dgx-h100", "--set", "plan.global_batch_size=64", "--json"]
    out = runner.invoke(app, [*base, "--set", "plan.tensor_parallel=2", "--top", "2", "--micro-batch-sizes", "1"])
    assert out.exit_code == 0 and {p["plan"]["tensor_parallel"] for p in json.loads(out.stdout)["plans"]} == {2}
    out = runner.invoke(app, [*base, "--set", "plan.tensor_parallel=3"])
    assert out.exit_code == 2
    assert "no valid plan" in out.output and "num_attention_heads" in out.output


def test_nothing_fits_says_how_much_memory_the_smallest_plan_needs():
    runner = CliRunner()
    args = ["search", "--model", "llama3-405b", "--system", "dgx-h100", "--set", "plan.global_batch_size=8"]
    out = runner.invoke(app, [*args, "--micro-batch-sizes", "1"])
    assert out.exit_code == 2 and "no plan fits" in out.output and "GiB per GPU" in out.output


def test_bad_options_are_one_line_errors():
    runner = CliRunner()
    args = ["search", "--model", "llama3-8b", "--system", "dgx-h100"]
    assert "global_batch_size" in runner.invoke(app, args).output
    out = runner.invoke(app, [*args, "--set", "plan.global_batch_size=8", "--num-nodes-range", "4:2"])
    assert out.exit_code == 2 and "--num-nodes-range" in out.output
    # a list takes the range's ceiling too (it allowed 10,000,000 nodes where LO:HI stopped at 100,000)
    out = runner.invoke(app, [*args, "--set", "plan.global_batch_size=8", "--num-nodes-range", "2,200000"])
    assert out.exit_code == 2 and "expected node counts ≤ 100000; got '2,200000'" in out.output
    out = runner.invoke(app, [*args, "--set", "plan.global_batch_size=8", "--backend", "spark"])
    assert out.exit_code == 2 and "local or ray" in out.output


def test_several_node_counts_in_processes_give_the_single_process_answer():
    request = small_request()
    wide = SearchRequest(request.model, request.system, request.base, (1, 2), OPTIONS, top_k=5)
    local = run_search(wide, workers=1)
    pooled = run_search(wide, workers=2)
    assert [p["plan"] for p in local.plans] == [p["plan"] for p in pooled.plans]
    assert {p["num_gpus"] for p in local.pareto_gpus} <= {8, 16}


def test_ray_backend_gives_the_local_answer():
    ray = pytest.importorskip("ray")
    request = small_request()
    wide = SearchRequest(request.model, request.system, request.base, (1, 2), OPTIONS, top_k=5)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = run_search(wide, backend="ray")
    finally:
        ray.shutdown()
    assert [p["plan"] for p in on_ray.plans] == [p["plan"] for p in run_search(wide).plans]


def test_a_range_of_global_batches_is_ranked_per_sequence():
    request = small_request()
    options = SpaceOptions(**{**OPTIONS.__dict__, "global_batch_sizes": (8, 32)})
    result = run_search(SearchRequest(request.model, request.system, request.base, (1,), options, top_k=40))
    per_sequence = [p["step_time_s"] / p["plan"]["global_batch_size"] for p in result.plans]
    assert per_sequence == sorted(per_sequence)
    assert {p["plan"]["global_batch_size"] for p in result.plans} <= {8, 32}
    assert result.plans[0]["plan"]["global_batch_size"] == 32  # more micro-batches fill the pipeline


def test_search_keeps_fixed_uneven_stages():
    runner = CliRunner()
    args = ["search", "--model", "llama3-8b", "--system", "dgx-h100", "--set", "plan.global_batch_size=64"]
    args += ["--set", "plan.pipeline_parallel=2", "--set", "plan.stage_layers=[10, 22]", "--micro-batch-sizes", "1"]
    out = runner.invoke(app, [*args, "--top", "3", "--json"])
    assert out.exit_code == 0, out.output
    plans = [p["plan"] for p in json.loads(out.stdout)["plans"]]
    assert plans and all(p["stage_layers"] == [10, 22] and p["pipeline_parallel"] == 2 for p in plans)
    no_pp = ["search", "--model", "llama3-8b", "--system", "dgx-h100", "--set", "plan.global_batch_size=64"]
    unfixed = runner.invoke(app, [*no_pp, "--set", "plan.stage_layers=[10, 22]", "--micro-batch-sizes", "1"])
    assert unfixed.exit_code == 2 and "plan.stage_layers fixes pipeline_parallel" in unfixed.output


def test_tp_comm_overlap_keeps_the_search_to_sequence_parallel_plans():
    """Megatron-Core overlaps its tensor-parallel gathers only with sequence parallelism: with the
    switch on, every plan with tp > 1 has it (Job validation would refuse the others), tp 1 plans stay."""
    plans = table_plans(small_request(tp_comm_overlap=True))
    everything = table_plans(small_request())
    tp, sp = 0, 9  # positions in table_plans' tuples
    assert plans == {p for p in everything if p[tp] == 1 or p[sp]}
    assert any(p[tp] > 1 for p in plans)


def test_context_parallel_sizes_split_the_sequence_into_two_chunks_per_rank():
    # Megatron-LM's load-balanced context parallelism cuts the sequence into 2·cp chunks (utils.py
    # get_batch_on_this_cp_rank: view(2 * cp_size, s / (2 * cp_size))): 2,052 tokens = 4 × 513 allow
    # cp 2 (2,052 / 4 = 513) but not cp 4 (2,052 / 8 = 256.5), though 4 divides 2,052
    model = parse_section("model", {**MODEL, "seq_length": 2052})
    system, base = parse_section("system", SYSTEM), parse_section("plan", {"global_batch_size": 16})
    fixed = {"tensor_parallel": 1, "pipeline_parallel": 1, "micro_batch_size": 1}
    fixed |= {"overlap_grad_reduce": True, "overlap_param_gather": True, "zero_stage": 0, "recompute": "none"}
    options = SpaceOptions(max_context_parallel=4, fixed=fixed)
    table, _ = enumerate_plans(model, system, base, 8, options)  # type: ignore[arg-type]
    assert sorted({table.plan_fields(row)["context_parallel"] for row in range(len(table))}) == [1, 2]


def test_a_job_files_searched_fields_are_still_checked(tmp_path):
    # the search replaces tensor_parallel, but a value predict refuses in the job file is refused here too (it ran)
    for value, message in (('"two"', "Input should be a valid integer"), ("-4", "Input should be greater than 0")):
        job = tmp_path / "job.yaml"
        job.write_text(
            f"model: gpt3-1.3b\nsystem: dgx-a100\nplan: {{tensor_parallel: {value}, global_batch_size: 64}}\n"
        )
        for command in (["search", str(job), "--top", "1"], ["predict", str(job)]):
            res = CliRunner().invoke(app, command)
            assert res.exit_code == 2 and f"`plan.tensor_parallel`: {message}" in res.output, (command, res.output)
