"""Test helpers: a cost model that charges nothing, so tests can set durations by hand."""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from types import SimpleNamespace
from typing import Any

import numpy as np
from typer.testing import CliRunner

from itercast.cli import app
from itercast.config.job import Job
from itercast.workloads.transformer import PassCost, TransformerStepBuilder, UnitCosts


class FreeCosts:
    """Same interface as AnalyticCostModel; every op takes zero seconds, nothing slows beside a collective."""

    system = SimpleNamespace(gpu=SimpleNamespace(overlap_compute_slowdown=0.0))

    def gemm_s(self, flops, te=True):
        return np.zeros_like(np.asarray(flops, dtype=float))

    attention_s = gemm_s

    def memory_s(self, kind, nbytes):
        return np.zeros_like(np.asarray(nbytes, dtype=float))

    def collective_s(self, kind, nbytes, group):
        return 0.0

    def p2p_s(self, nbytes, cross_node, stride):
        return 0.0


def pipeline_builder(job: Job, fwd_s: float, bwd_s: float, p2p_s: float = 0.0) -> TransformerStepBuilder:
    """A builder whose whole-stage forward takes fwd_s and backward bwd_s; nothing else costs time."""
    b = TransformerStepBuilder(job, costs=FreeCosts())
    layers = job.model.num_layers // job.plan.pipeline_parallel
    zero = PassCost(0.0, 0.0, 0)
    units = UnitCosts(PassCost(fwd_s / layers, 0.0, 0), PassCost(bwd_s / layers, 0.0, 0), zero, zero, zero, zero)
    b.stage_units = [units] * job.plan.pipeline_parallel
    b.p2p_s = dict.fromkeys(b.p2p_s, p2p_s)
    return b


def tiny_job(num_nodes: int = 1, **plan) -> Job:
    """A small llama on 8-GPU H100 nodes (one by default); plan fields as keyword arguments."""
    model = {
        "family": "llama",
        "num_layers": 8,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "seq_length": 128,
        "vocab_size": 1000,
    }
    return Job.from_dicts(model, plan, {"preset": "dgx-h100", "num_nodes": num_nodes})


def gpt3_on_1024_a100() -> Job:
    """GPT-3 175B on 128 DGX A100 nodes, tp 8 × pp 8 × dp 16, 1F1B, 96 micro-batches, sequence parallel."""
    plan = {"tensor_parallel": 8, "pipeline_parallel": 8, "global_batch_size": 1536, "sequence_parallel": True}
    return Job.from_presets("gpt3-175b", "dgx-a100", 128, plan)


def plan_of(tp: int, pp: int, cp: int, schedule: str, zero: int, **fields: object) -> dict:
    """A plan's fields: tensor, pipeline and context parallel, schedule (interleaved with 2 chunks
    per stage), ZeRO stage, and any other field as a keyword."""
    return dict(
        tensor_parallel=tp,
        pipeline_parallel=pp,
        context_parallel=cp,
        schedule=schedule,
        virtual_pipeline=2 if schedule == "interleaved-1f1b" else 1,
        zero_stage=zero,
        **fields,
    )


def graph_step_time_s(job: Job) -> float:
    """The graph simulation's step time of `job` (predict), a function a worker process can run."""
    from itercast.predict import predict

    return predict(job).step_time_s


def fast_vs_graph(model: str | dict, system: dict, plans: list[dict]) -> tuple[list[Job], np.ndarray]:
    """The valid jobs of `plans` (every plan must be valid) on `model` (a preset's name, or a model section) and
    |fast path / graph simulation − 1| of each; from 8 jobs on, the graph simulations run in two processes (each is
    independent of the others)."""
    from itercast.search.fast_estimate import FastEstimator

    fe = FastEstimator({"preset": model} if isinstance(model, str) else model, system)
    jobs, errors = fe.jobs(plans)
    assert not any(errors), [e for e in errors if e][:3]
    valid = [j for j in jobs if j is not None]
    if len(valid) >= 8:
        with ProcessPoolExecutor(max_workers=2) as pool:
            exact = np.array(list(pool.map(graph_step_time_s, valid, chunksize=4)))
    else:
        exact = np.array([graph_step_time_s(j) for j in valid])
    return valid, np.abs(fe.step_time_s(valid) / exact - 1)


@cache
def searched_top_plan(framework: str, *extra: str) -> dict[str, Any]:
    """The plan `itercast search --example --framework framework *extra` ranks first over a small space (pipeline 8,
    micro-batch 1: the fields the tests read are the framework's, whichever plan ranks first), one search per
    distinct call: several tests read fields of the same plan."""
    args = ["search", "--example", "--json", "--top", "1", "--workers", "1", "--framework", framework, *extra]
    args += ["--set", "plan.pipeline_parallel=8", "--set", "plan.micro_batch_size=1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["plans"][0]["plan"]
