"""`itercast search`: the fastest plans that fit, over the whole plan space."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Annotated, Any, cast

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

from itercast.checked_runs import checked_note, checked_runs_json
from itercast.cli.app import (
    CalibrationOpt,
    ExampleOpt,
    FormatOpt,
    JobFileArg,
    JsonOpt,
    ModelOpt,
    SetOpt,
    SystemOpt,
    app,
    calibration_curves,
    console,
    echo_json,
    fail,
    finite,
    load_job,
    output_format,
    refuse_options,
    resolve_job_file,
    show_table,
    sizes_option,
    warn,
    working,
)
from itercast.cli.variability_cmds import (
    AcrossRunsOpt,
    CommCvOpt,
    ComputeCvOpt,
    GpuCvOpt,
    MoeImbalanceCvOpt,
    NetworkCvOpt,
    NoiseFromDbOpt,
    RunCvOpt,
    SamplesOpt,
    SeedOpt,
    StepCvOpt,
    run_level_notes,
    variability_model,
)
from itercast.config.job import check_values, parse_section, pr_moe_problem, raw_sections, with_system_defaults
from itercast.config.model import ModelConfig
from itercast.config.plan import DEEPSPEED_MOE_DISPATCHERS, TE_OVERLAP_LAYERS, PlanConfig
from itercast.config.system import SystemConfig
from itercast.errors import ConfigError
from itercast.parallel.plan_table import VARIED
from itercast.search.distribution_rank import DistributionOptions, rank_by_distribution
from itercast.search.dlrm_search import DLRMPlanResult, default_batches, search_dlrm
from itercast.search.dlrm_search import rank_by_distribution as rank_dlrm_by_distribution
from itercast.search.frameworks import (
    RECOMPUTE_FIELDS,
    check_fixed,
    check_recompute,
    framework,
    framework_fields,
)
from itercast.search.objectives import DISTRIBUTION_OBJECTIVES, check_objective, ranked_as
from itercast.search.plan_search import (
    Progress,
    SearchRequest,
    SearchResult,
    check_fast_path_plan,
    plan_job,
    run_search,
)
from itercast.search.plan_space import SpaceOptions, imbalance_note
from itercast.stochastic.variability import VariabilityModel
from itercast.workload import DLRMWorkload, sharding_summary
from itercast.workloads.dlrm import dlrm_notes, is_dlrm_model


@app.command("search")
def search_cmd(
    job_file: JobFileArg = None,
    model: ModelOpt = None,
    system: SystemOpt = None,
    set_: SetOpt = None,
    example: ExampleOpt = False,
    as_json: JsonOpt = False,
    fmt: FormatOpt = "table",
    num_nodes_range: Annotated[
        str | None,
        typer.Option(metavar="LO:HI|N,N,…", help="Node counts: all in LO..HI, or those listed (default: the system's)"),
    ] = None,
    objective: Annotated[
        str,
        typer.Option(
            metavar="step|tokens-per-s|gpu-hours-per-token|p50|p95|p99|mean",
            help="What plans are ranked by; p50/p95/p99/mean: the best plans' sampled step "
            "(--distribution-top, the CV options of `itercast variability`).",
        ),
    ] = "step",
    token_budget: Annotated[
        float | None,
        typer.Option(metavar="TOKENS", callback=finite(1.0, 1e18), help="Tokens to train: time, GPU-hours to them."),
    ] = None,
    top: Annotated[int, typer.Option(min=1, max=1000, help="Plans re-scored by the graph simulation and shown.")] = 20,
    max_memory_fraction: Annotated[
        float, typer.Option(callback=finite(0.01, 1.0), help="Share of each GPU's memory a plan may use.")
    ] = 1.0,
    include_oom: Annotated[bool, typer.Option(metavar="", help="Rank plans that do not fit too.")] = False,
    framework: Annotated[
        str,
        typer.Option(metavar="megatron-core|nemo|torchtitan|deepspeed", help="Search only the plans it runs."),
    ] = "megatron-core",
    memory_headroom_gib: Annotated[
        float | None,
        typer.Option(
            callback=finite(0.0, 1024.0),
            help="GiB per GPU kept free beside a plan's memory (which holds the CUDA context and NCCL's buffers; "
            "default: 15% of its activations, for the allocator's fragmentation).",
        ),
    ] = None,
    micro_batch_sizes: Annotated[
        str | None, typer.Option(metavar="N,N,…", help="Micro-batch sizes to try (default 1,2,4,8).")
    ] = None,
    global_batch_sizes: Annotated[
        str | None,
        typer.Option(metavar="N,N,…", help="Global batches to try (ranked per sequence); default the plan's."),
    ] = None,
    tp_across_nodes: Annotated[bool, typer.Option(metavar="", help="Allow tensor parallelism across nodes.")] = False,
    max_virtual_pipeline: Annotated[
        int | None, typer.Option(min=1, max=1024, help="Largest interleaving (default: one layer per chunk).")
    ] = None,
    max_context_parallel: Annotated[
        int | None,
        typer.Option(
            min=1, max=1024, help="Largest context parallel (default 8, or beyond 128K tokens one rank per 16,384)."
        ),
    ] = None,
    backend: Annotated[str, typer.Option(metavar="local|ray", help="Where node counts are searched.")] = "local",
    workers: Annotated[
        int, typer.Option(min=1, max=256, help="Local processes (default: the CPU count).")
    ] = os.cpu_count() or 1,
    batches: Annotated[
        str | None,
        typer.Option(metavar="N,N,…", help="DLRM: samples per GPU to try (default: ¼× to 4× the plan's)."),
    ] = None,
    distribution_top: Annotated[
        int,
        typer.Option(metavar="K", help="p50/p95/p99/mean: sample the K deterministically best plans (at most --top)."),
    ] = DistributionOptions.top,
    samples: SamplesOpt = DistributionOptions.samples,
    seed: SeedOpt = DistributionOptions.seed,
    compute_cv: ComputeCvOpt = VariabilityModel.compute_cv,
    comm_cv: CommCvOpt = VariabilityModel.comm_cv,
    network_cv: NetworkCvOpt = VariabilityModel.network_cv,
    gpu_cv: GpuCvOpt = VariabilityModel.gpu_cv,
    moe_imbalance_cv: MoeImbalanceCvOpt = VariabilityModel.moe_imbalance_cv,
    step_cv: StepCvOpt = VariabilityModel.step_cv,
    noise_from_db: NoiseFromDbOpt = None,
    run_cv: RunCvOpt = VariabilityModel.run_cv,
    across_runs: AcrossRunsOpt = DistributionOptions.across_runs,
    calibration: CalibrationOpt = None,
) -> None:
    """Search data/tensor/pipeline/context (and, for MoE models, expert) parallel sizes, micro-batch,
    ZeRO (and under megatron-core and nemo, or torchtitan for dense models, its state sharded within
    groups of whole nodes: ZeRO column "1 in 16", plan.zero_shard_ranks), recompute, sequence
    parallelism, schedule and interleaving, overlap switches (and with --num-nodes-range the GPU
    count) for the fastest plans that fit. The job's plan gives the fields
    every plan shares (dtype, global batch, …); `--set plan.FIELD=VALUE` fixes a searched field.
    A DLRM job: its embedding shardings × samples per GPU (--batches), by samples per second.
    --objective p50|p95|p99|mean: the --distribution-top best plans by the deterministic step are
    sampled (--samples, one --seed for all) and re-ranked by that figure of their step, of one run
    or, with --across-runs, pooled over runs (--run-cv in the ranking). --calibration prices every plan
    with that file's curves, as `predict` does."""
    fmt = output_format(fmt, as_json)
    if distribution_top <= 0:
        fail(f"--distribution-top: expected a whole number ≥ 1; got {distribution_top}")
    job_file = resolve_job_file(job_file, example, model, system)
    try:
        raw = raw_sections(job_file, set_ or [], model, system)
    except ConfigError as exc:
        fail(str(exc).replace("\n", "\n  "))
    given = {item.partition("=")[0].strip() for item in set_ or []}

    def sampling_options() -> DistributionOptions | None:
        """How a distribution objective's plans are sampled (`variability`'s CV options), for either workload;
        None for a deterministic objective. ConfigError: a bad --noise-from-db."""
        if objective not in DISTRIBUTION_OBJECTIVES:
            return None
        vm = variability_model(
            compute_cv, comm_cv, network_cv, gpu_cv, moe_imbalance_cv, step_cv, noise_from_db, fmt != "table"
        )
        return DistributionOptions(replace(vm, run_cv=run_cv), samples, seed, distribution_top, across_runs)

    for field, option, value in (
        ("plan.global_batch_size", "--global-batch-sizes", global_batch_sizes),
        ("plan.micro_batch_size", "--micro-batch-sizes", micro_batch_sizes),
        ("system.num_nodes", "--num-nodes-range", num_nodes_range),
        ("plan.batch_per_rank", "--batches", batches),
    ):
        if field in given and value is not None:
            fail(f"--set {field} and {option}: give one (the --set fixes the value, {option} tries several)")
    if objective not in DISTRIBUTION_OBJECTIVES:  # given, they had changed nothing without a word
        vm = VariabilityModel
        refuse_options(
            {
                "--distribution-top": distribution_top != DistributionOptions.top,
                "--samples": samples != DistributionOptions.samples,
                "--seed": seed != DistributionOptions.seed,
                "--compute-cv": compute_cv != vm.compute_cv,
                "--comm-cv": comm_cv != vm.comm_cv,
                "--network-cv": network_cv != vm.network_cv,
                "--gpu-cv": gpu_cv != vm.gpu_cv,
                "--moe-imbalance-cv": moe_imbalance_cv != vm.moe_imbalance_cv,
                "--step-cv": step_cv != vm.step_cv,
                "--noise-from-db": noise_from_db is not None,
                "--run-cv": run_cv != vm.run_cv,
                "--across-runs": across_runs,
            },
            f"they sample the plans' steps for --objective {'|'.join(DISTRIBUTION_OBJECTIVES)}; the objective is "
            f"{objective}",
        )
    if is_dlrm_model(raw["model"]):
        if "plan.sharding" in given:
            fail("--set plan.sharding: a DLRM search searches the sharding; `itercast predict` prices a given one")
        refuse_options(
            {
                "--num-nodes-range": num_nodes_range is not None,
                "--objective tokens-per-s/gpu-hours-per-token": objective not in ("step", *DISTRIBUTION_OBJECTIVES),
                "--token-budget": token_budget is not None,
                "--framework": framework != "megatron-core",
                "--memory-headroom-gib": memory_headroom_gib is not None,
                "--micro-batch-sizes": micro_batch_sizes is not None,
                "--global-batch-sizes": global_batch_sizes is not None,
                "--tp-across-nodes": tp_across_nodes,
                "--max-virtual-pipeline": max_virtual_pipeline is not None,
                "--max-context-parallel": max_context_parallel is not None,
                "--backend": backend != "local",
                "--include-oom": include_oom,
                "--max-memory-fraction": max_memory_fraction != 1.0,
            },
            "a transformer search's options; a DLRM search ranks its shardings × --batches by samples per second on "
            "the job's GPUs (at a sampled step with --objective p50|p95|p99|mean)",
        )
        w = load_job(job_file, False, model, system, set_)
        assert isinstance(w, DLRMWorkload)
        fixed_batch = str(w.job.plan.batch_per_rank) if "plan.batch_per_rank" in given else None
        try:
            dlrm_sampling = sampling_options()
        except ConfigError as exc:
            fail(str(exc))
        cal = calibration_curves(calibration, w.job.system)
        _search_dlrm(w, batches or fixed_batch, top, fmt, cal, objective, dlrm_sampling)
        return
    refuse_options(
        {"--batches": batches is not None},
        "a DLRM search's samples per GPU; a transformer's global batches are --global-batch-sizes",
    )
    try:
        options = SpaceOptions(
            micro_batch_sizes=sizes_option(micro_batch_sizes or "1,2,4,8", "--micro-batch-sizes"),
            global_batch_sizes=sizes_option(global_batch_sizes, "--global-batch-sizes") if global_batch_sizes else (),
            max_context_parallel=max_context_parallel,
            max_virtual_pipeline=max_virtual_pipeline,
            tp_across_nodes=tp_across_nodes,
            framework=framework,
        )
        request = _request(raw, set_ or [], num_nodes_range, options)
        request = replace(request, max_memory_fraction=max_memory_fraction, top_k=top, include_oom=include_oom)
        request = replace(request, objective=check_objective(objective), token_budget=token_budget)
        request = replace(request, calibration=calibration_curves(calibration, request.system))
        if memory_headroom_gib is not None:
            request = replace(request, memory_margin_bytes=memory_headroom_gib * 2**30)
        sampling = sampling_options()  # read --noise-from-db before the search
        with _progress(len(request.node_counts), quiet=fmt != "table") as report:
            result = run_search(request, backend, workers, report)
        if sampling is not None:
            sampling = replace(sampling, top=min(distribution_top, len(result.plans)))
            with _progress(sampling.top, fmt != "table", f"sampling {samples:,} steps of each plan") as report:
                result = rank_by_distribution(result, request, sampling, report)
    except ConfigError as exc:
        fail(str(exc).replace("\n", "\n  "))
    notes = (
        []
        if sampling is None
        else run_level_notes(sampling.model, across_runs, f"the sampled steps ranked by {objective}")
    )
    for note in dict.fromkeys(line for row in result.plans for line in row.get("extrapolated", [])):
        warn(f"{note} (the plans shown)")
    for note, ranks in noted_plans(result.plans).items():
        warn(
            f"{note} ({'every plan shown' if len(ranks) == len(result.plans) else 'plans shown: ' + ranks_text(ranks)})"
        )
    if result.plans and (note := checked_note(plan_job(request, result.plans[0]))):
        warn(note)
    if note := imbalance_note(request.model, request.base):
        warn(note)
    settings = framework_settings(raw["plan"], framework, request.model)
    if fmt == "json":
        doc = {"model": request.model.name, "system": request.system.name, "model_is_moe": request.model.is_moe}
        doc |= result.to_dict()
        doc["framework_settings"] = {k: {"search": v, "predict": d} for k, (v, d) in settings.items()}
        doc["checked_runs"] = checked_runs_json(plan_job(request, result.plans[0])) if result.plans else []
        if sampling is not None:
            doc["distribution"] = {
                "model": sampling.model.__dict__,
                "samples": samples,
                "seed": seed,
                "top": sampling.top,
                "across_runs": sampling.across_runs,
                "notes": notes,
            }
        echo_json(doc)
    elif fmt == "csv":
        show_table(*plan_rows(result.plans, request.model.is_moe), "csv")
    else:
        if len(settings) <= 3:
            fields = ", ".join(f"plan.{k}={v} (predict's default: {d})" for k, (v, d) in settings.items())
        else:  # the values: --json's framework_settings
            fields = f"{', '.join(settings)} (--json: framework_settings)"
        own = f"priced with {result.framework}'s own {fields}, left out by the job: --set for predict to match"
        _print(result, request, [*notes, *([own] if settings else [])])


def noted_plans(plans: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Each note the plans shown carry (their rows' `notes`, `priced_notes` of each), in the order first said,
    with the ranks (from 1) of the plans it holds for."""
    ranks: dict[str, list[int]] = {}
    for rank, row in enumerate(plans, 1):
        for note in row.get("notes", []):
            ranks.setdefault(note, []).append(rank)
    return ranks


def ranks_text(ranks: list[int]) -> str:
    """Ranks as the table's `#` column names them, consecutive ones as ranges: [1, 2, 3, 5] -> '1-3, 5'."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _search_dlrm(
    w: DLRMWorkload,
    batches: str | None,
    top: int,
    fmt: str,
    calibration: dict[str, Any] | None,
    objective: str = "step",
    sampling: DistributionOptions | None = None,
) -> None:
    """A DLRM's shardings × batch per GPU (search/dlrm_search.py), fastest in samples per second first; with
    `sampling`, the first `sampling.top` re-ranked by samples per second at the `objective`'s sampled step."""
    try:
        sizes = sizes_option(batches, "--batches") if batches else default_batches(w.job.plan.batch_per_rank)
        with working("pricing shardings × batches…", fmt != "table"):
            found, evaluated = search_dlrm(w.job, sizes, calibration)
        ranked: list[tuple[DLRMPlanResult, dict[str, float] | None, int]] = [
            (r, None, rank) for rank, r in enumerate(found, 1)
        ]
        ranking = ""
        if sampling is not None:
            sampling = replace(sampling, top=min(sampling.top, len(found)))
            with _progress(sampling.top, fmt != "table", f"sampling {sampling.samples:,} steps of each plan") as report:
                ranked, ranking = rank_dlrm_by_distribution(found, objective, sampling, report)
    except (ConfigError, ValueError) as exc:  # ValueError: no sharding fits
        fail(str(exc).replace("\n", "\n  "))
    shown = ranked[:top]
    plans = [
        {
            "batch_per_rank": r.batch_per_rank,
            "samples_per_s": r.samples_per_s,
            "step_time_s": r.step.step_time_s,
            "memory_per_gpu_bytes": r.step.memory_per_gpu_bytes,
            "fits": r.step.fits,
            "tables": [{"name": n, "strategy": s.strategy, "ranks": list(s.ranks)} for n, s in r.sharding.items()],
            **({"distribution": dist, "deterministic_rank": rank} if sampling is not None else {}),
        }
        for r, dist, rank in shown
    ]
    # what the prices of the plans shown rest on, as predict and shard say it (dlrm_notes of each plan), once each
    notes = list(
        dict.fromkeys(
            n
            for r, _, _ in shown
            for n in dlrm_notes(w.job.model, w.job.system, r.batch_per_rank, calibration, r.sharding)
        )
    )
    if sampling is not None:
        notes += [
            ranking,
            *run_level_notes(sampling.model, sampling.across_runs, f"the sampled steps ranked by {objective}"),
        ]
    if fmt == "json":
        doc: dict[str, Any] = {"model": w.name, "system": w.job.system.name, "world_size": w.num_gpus}
        doc |= {"evaluated": evaluated, "plans": plans}
        doc["notes"] = notes
        if sampling is not None:
            doc["distribution"] = {
                "objective": objective,
                "samples": sampling.samples,
                "seed": sampling.seed,
                "top": sampling.top,
                "across_runs": sampling.across_runs,
            }
        echo_json(doc)
        return
    for note in notes:
        warn(note)
    key = DISTRIBUTION_OBJECTIVES.get(objective)
    rows = [
        [
            str(i),
            str(r.batch_per_rank),
            f"{r.samples_per_s:,.0f}",
            f"{r.step.step_time_s * 1e3:.3f}",
            *(
                [
                    f"{dist[key] * 1e3:.3f}" if dist else "",
                    f"{r.batch_per_rank * r.world / dist[key]:,.0f}" if dist else "",
                ]
                if key
                else []
            ),
            *([str(rank)] if key else []),
            f"{r.step.memory_per_gpu_bytes / 2**30:.1f}" + ("" if r.step.fits else " OOM"),
            sharding_summary(r.sharding),
        ]
        for i, (r, dist, rank) in enumerate(shown, 1)
    ]
    if fmt == "table":
        searched = ", ".join(str(n) for n in sizes)
        console.print(
            f"{w.name} on {w.num_gpus} GPUs, {searched} samples per GPU: {evaluated:,} plans priced",
            highlight=False,
            markup=False,
        )
    sampled = [f"{objective} ms", f"samples/s at {objective}", "det #"] if key else []
    show_table(["#", "batch/GPU", "samples/s", "ms/step", *sampled, "GiB", "sharding"], rows, fmt)


def _request(raw: dict[str, Any], overrides: list[str], nodes: str | None, options: SpaceOptions) -> SearchRequest:
    """Model, system and the shared plan fields from the job; `--set plan.X` fixes a searched field."""
    set_fields = {
        item.partition("=")[0].strip().removeprefix("plan.") for item in overrides if item.startswith("plan.")
    }
    plan_raw = dict(raw["plan"])
    fixed = {k: v for k, v in plan_raw.items() if k in set_fields and k in VARIED and k != "global_batch_size"}
    shared = {k: v for k, v in plan_raw.items() if k not in VARIED or k == "global_batch_size"}
    # the job's values of the searched fields, which the search replaces: still refused where predict would
    check_values(PlanConfig, {k: v for k, v in plan_raw.items() if k not in fixed and k not in shared}, "plan", "plan")
    fw = framework(options.framework)
    m = cast(ModelConfig, parse_section("model", raw["model"], "model"))
    shared = framework_fields(fw, m, plan_raw) | shared  # the job's own fields win
    s = cast(SystemConfig, parse_section("system", raw["system"], "system"))
    # what the framework runs, checked before the plan's own rules (they would name its fields first)
    plan = {**shared, **fixed}
    kernels: list[tuple[str, tuple[str, ...]]] = [("cross_entropy", fw.cross_entropies), ("cp_comm", fw.cp_comms)]
    kernels += [("tp_comm_overlap_rs", fw.tp_comm_overlap_rs), ("selective_recompute", fw.selective_recomputes)]
    kernels.append(("projections", (fw.plan_fields.get("projections", "fused"),)))  # its models' linears
    # every framework searched all-gathers ZeRO-1/2's updated shards (Megatron-Core's distributed optimizer, DeepSpeed's
    # all_gather_dp_groups; FSDP has no ZeRO-1/2): InternLM's broadcast per rank is priced by predict alone
    kernels.append(("zero_param_gather", ("all_gather",)))
    if m.is_moe:
        kernels.append(("moe_token_dispatcher", fw.moe_token_dispatchers))
    if plan.get("dtype") == "fp8":
        kernels += [("fp8_recipe", fw.fp8_recipes), ("fp8_weight_cast", fw.fp8_weight_casts)]
    for name, runs in kernels:
        value = plan.get(name, PlanConfig.model_fields[name].default)
        if value not in runs:
            raise ConfigError(f"plan.{name}: {fw.name} runs {' or '.join(runs)}, the job sets {value}")
    if plan.get("moe_shared_expert_overlap") and not fw.moe_shared_expert_overlap:
        raise ConfigError(
            f"plan.moe_shared_expert_overlap: {fw.name} has no Megatron-Core shared-expert overlap (expected "
            "false; torchtitan runs its shared expert beside the combine, DeepSpeed after the experts); the job "
            "sets true"
        )
    if fw.residual_moe and (problem := pr_moe_problem(m)):
        raise ConfigError(problem)
    if m.mla and not fw.multi_latent_attention:
        raise ConfigError(
            f"model.kv_lora_rank: {fw.name} has no multi-latent attention (Megatron-DeepSpeed's model/transformer.py "
            f"builds none; expected a model without kv_lora_rank); {m.name} sets {m.kv_lora_rank}"
        )
    te_layer = m.family == "gpt" and not m.is_moe and m.kv_heads == m.num_attention_heads
    if plan.get("dtype") == "fp8" and fw.fp8_te_layer_only and not te_layer:
        raise ConfigError(
            f"plan.dtype: {fw.name} trains in FP8 only in Transformer Engine's TransformerLayer (LayerNorm, GeLU, "
            "as many key-value heads as query heads, no experts: Megatron-DeepSpeed model/transformer.py "
            f"'Transformer_engine does not support GQA'); {m.name} is a {m.family} model with {m.kv_heads} "
            f"key-value heads of {m.num_attention_heads}{', with experts' if m.is_moe else ''}, the job sets fp8"
        )
    if plan.get("dtype") == "fp8" and fw.fp8_te_layer_only and int(fixed.get("pipeline_parallel", 1)) > 1:
        raise ConfigError(
            f"plan.pipeline_parallel: {fw.name} trains in FP8 without pipelining only (Megatron-DeepSpeed's "
            f"GPTModelPipe layers run no FP8 autocast); the job sets {fixed['pipeline_parallel']} with dtype fp8"
        )
    shard = plan.get("zero_shard_ranks")
    if shard is not None and (not fw.zero_shard_stages or (m.is_moe and not fw.zero_shard_moe)):
        why = "its MiCS and hpZ are not priced" if not fw.zero_shard_stages else "its experts' meshes are not priced"
        raise ConfigError(
            f"plan.zero_shard_ranks: {fw.name} is searched with ZeRO's state over every data-parallel rank ({why}; "
            f"expected it unset); the job sets {shard}"
        )
    defaults = {k: PlanConfig.model_fields[k].get_default(call_default_factory=True) for k in RECOMPUTE_FIELDS}
    check_recompute(fw, {k: plan.get(k, defaults[k]) for k in RECOMPUTE_FIELDS} | fixed)
    taken = {k: v for k, v in (plan.get("tp_comm_overlap_sms") or {}).items() if v}
    if fw.name == "torchtitan" and (taken or len(plan.get("tp_comm_overlap_sms") or {}) < len(TE_OVERLAP_LAYERS)):
        raise ConfigError(
            "plan.tp_comm_overlap_sms: torchtitan's async TP takes no SMs from its GEMMs (expected 0 for "
            f"{', '.join(TE_OVERLAP_LAYERS)}); the job sets {plan.get('tp_comm_overlap_sms')}"
        )
    state = tuple(plan.get(k, PlanConfig.model_fields[k].default) for k in ("main_params", "adam_state_dtype"))
    if plan.get("dtype", PlanConfig.model_fields["dtype"].default) != "fp32" and state not in fw.optimizer_states:
        kept = " or ".join(f"{m}/{a}" for m, a in fw.optimizer_states)
        raise ConfigError(
            f"plan.main_params/adam_state_dtype: {fw.name} runs {kept}, the job sets {state[0]}/{state[1]}"
        )
    deepspeed = plan.get("moe_token_dispatcher") in DEEPSPEED_MOE_DISPATCHERS
    if m.is_moe and deepspeed and m.moe_capacity_factor is not None and not m.moe_pad_to_capacity:
        raise ConfigError(
            f"model.moe_pad_to_capacity: {fw.name} pads every expert to its capacity (DeepSpeed's drop_tokens, "
            f"Megatron-DeepSpeed --moe-train-capacity-factor): expected true with model.moe_capacity_factor "
            f"{m.moe_capacity_factor}, or no capacity factor (its dropless gating); {m.name} sets false"
        )
    runs_async = fw.plan_fields.get("tp_allreduce_overlap", True)
    given = plan.get("tp_allreduce_overlap", runs_async)
    if fw.name != "torchtitan" and given != runs_async:
        why = (
            "Megatron-DeepSpeed's validate_args turns Megatron's asynchronous all-reduce off under DeepSpeed"
            if fw.name == "deepspeed"
            else "Megatron-Core all-reduces a column-parallel input gradient beside its weight-gradient GEMM, no "
            "switch (tensor_parallel/layers.py allreduce_dgrad; Transformer Engine's linears alike)"
        )
        raise ConfigError(
            f"plan.tp_allreduce_overlap: {fw.name} runs {str(runs_async).lower()} ({why}); the job sets "
            f"{str(given).lower()}"
        )
    if plan.get("p2p_scatter_gather"):
        raise ConfigError(
            f"plan.p2p_scatter_gather: Megatron-LM's pipeline exchange of 2021-2023, which {fw.name} does not run "
            "(Megatron-Core sends each stage's output whole since 39b83c79); expected false; the job sets true"
        )
    engine = plan.get("pipeline_p2p", "overlapped")
    if not plan.get("overlap_p2p_comm", True) and engine != "megatron":
        raise ConfigError(
            f"plan.overlap_p2p_comm: Megatron's switch for its interleaved exchanges, which {fw.name} does not run "
            f"(its pipeline sends: pipeline_p2p {engine}); expected true; the job sets false"
        )
    check_fast_path_plan(plan)
    # the fixed sizes' framework rules before the plan's own, which would name its fields and dump the plan
    # (its overlap and kernels are checked on the parsed plan: plan_space.enumerate_plans)
    check_fixed(fw, fixed, tp_comm_overlap=False, dtype=plan.get("dtype"))
    base = with_system_defaults(cast(PlanConfig, parse_section("plan", plan, "search")), s)
    if base.dtype not in fw.dtypes:
        left_out = "" if "dtype" in plan else f" (left out: {s.gpu.name} has no bf16)"
        raise ConfigError(f"plan.dtype: {fw.name} runs {' or '.join(fw.dtypes)}, the job sets {base.dtype}{left_out}")
    if fw.name == "torchtitan" and base.grad_bytes != 4:  # its launch settings could not ask for what was priced
        raise ConfigError(
            "plan.grad_reduce_dtype: torchtitan reduces gradients in float32 only (job_config.py "
            "mixed_precision_reduce: Literal['float32']); expected fp32; the job sets bf16"
        )
    if base.global_batch_size is None and not options.global_batch_sizes:
        raise ConfigError(
            "the search needs plan.global_batch_size (--set plan.global_batch_size=N) or --global-batch-sizes"
        )
    return SearchRequest(m, s, base, _node_counts(nodes, s), replace(options, fixed=fixed))


def framework_settings(raw_plan: dict[str, Any], framework_name: str, model: ModelConfig) -> dict[str, tuple[Any, Any]]:
    """The framework's own plan fields (frameworks.framework_fields) the job leaves out and that differ from
    PlanConfig's defaults: field -> (what the search prices, what `predict` of the same job uses)."""
    fields = framework_fields(framework(framework_name), model, raw_plan)
    defaults = {k: PlanConfig.model_fields[k].get_default(call_default_factory=True) for k in fields}
    return {k: (v, defaults[k]) for k, v in fields.items() if k not in raw_plan and v != defaults[k]}


#: node counts one search compares (each is searched in full: 1,000 take about 20 s on 2 cores)
MAX_NODE_COUNTS = 1024
#: the most nodes a searched count may have, however the counts are given (LO:HI or a list)
MAX_NODES = 100_000


def _node_counts(text: str | None, system: SystemConfig) -> tuple[int, ...]:
    """LO:HI: every node count between; N,N,…: those listed (at most MAX_NODE_COUNTS)."""
    if text is None:
        return (system.num_nodes,)
    if ":" not in text:
        counts = sizes_option(text, "--num-nodes-range")
        if counts[-1] > MAX_NODES:
            raise ConfigError(f"--num-nodes-range: expected node counts ≤ {MAX_NODES}; got {text!r}")
    else:
        lo, _, hi = text.partition(":")
        try:
            low, high = int(lo), int(hi)
        except ValueError:
            raise ConfigError(f"--num-nodes-range: expected LO:HI (whole numbers); got {text!r}") from None
        if not 1 <= low <= high <= MAX_NODES:
            raise ConfigError(f"--num-nodes-range: expected 1 ≤ LO ≤ HI ≤ {MAX_NODES}; got {text!r}")
        counts = tuple(range(low, high + 1))
    if len(counts) > MAX_NODE_COUNTS:
        raise ConfigError(
            f"--num-nodes-range: {len(counts)} node counts; expected at most {MAX_NODE_COUNTS} "
            "(list the ones to compare, e.g. 64,128,256,512)"
        )
    return counts


@contextmanager
def _progress(total: int, quiet: bool, what: str = "searching node counts") -> Iterator[Progress | None]:
    """A progress bar on stderr over node counts, or over plans sampled (none for one piece or
    with --json: a spinner, or nothing)."""
    if total == 1 or quiet:
        with working(f"{what}…", quiet):
            yield None
        return
    columns = (TextColumn(what), BarColumn(), TextColumn("{task.completed}/{task.total}"))
    with RichProgress(*columns, TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("search", total=total)
        yield lambda done, _total: bar.update(task, completed=done)


def plan_rows(plans: list[dict[str, Any]], moe: bool) -> tuple[list[str], list[list[str]]]:
    """The plans shown (SearchResult.plans, or a saved result's `plans`; an MoE model's with their expert
    sizes): headers and one row each, the terminal's, --csv's and the HTML report's alike."""
    headers = ["#", "GPUs", "dp×tp×pp×cp", *(["ep×etp"] if moe else []), "vp", "gbs", "mbs", "sched", "ZeRO"]
    headers += ["recomp", "SP", "ovl", "s/step", "tok/s", "GPU-h/Mtok", "MFU", "GiB"]
    sampled = plans and "distribution" in plans[0]
    if sampled:  # a distribution objective: the sampled figures and the deterministic rank
        headers += ["p50 s", "p95 s", "p99 s", "mean s", "det #"]
    rows = []
    for i, r in enumerate(plans, 1):
        p = r["plan"]
        sizes = f"{p['data_parallel']}×{p['tensor_parallel']}×{p['pipeline_parallel']}×{p['context_parallel']}"
        rows.append(
            [
                str(i),
                str(r["num_gpus"]),
                sizes,
                *([f"{p['expert_parallel']}×{p['expert_tensor_parallel']}"] if moe else []),
                str(p["virtual_pipeline"]),
                str(p["global_batch_size"]),
                str(p["micro_batch_size"]),
                {"interleaved-1f1b": "i-1f1b"}.get(p["schedule"], p["schedule"]),
                str(p["zero_stage"]) + (f" in {p['zero_shard_ranks']}" if p.get("zero_shard_ranks") else ""),
                p["recompute"],
                "y" if p["sequence_parallel"] else "n",
                ("g" if p["overlap_grad_reduce"] else "-") + ("p" if p["overlap_param_gather"] else "-"),
                f"{r['step_time_s']:.3f}",
                f"{r['tokens_per_s']:,.0f}",
                f"{r['gpu_hours_per_token'] * 1e6:.3g}",
                f"{r['mfu']:.1%}",
                f"{r['memory_per_gpu_bytes'] / 2**30:.1f}" + ("" if r["fits"] else " OOM"),
            ]
        )
        if sampled:
            d = r["distribution"]
            figures = [f"{d[k]:.3f}" for k in ("p50_s", "p95_s", "p99_s", "mean_s")] if d else ["-"] * 4
            rows[-1] += [*figures, str(r["deterministic_rank"])]
    return headers, rows


def _print(result: SearchResult, request: SearchRequest, notes: list[str]) -> None:
    m, s = request.model, request.system
    console.print(
        f"[bold]{m.name}[/] on {s.gpu.name} ({s.name}), global batch "
        f"{', '.join(map(str, request.options.global_batch_sizes)) or request.base.global_batch_size}: "
        f"{result.evaluated:,} plans generated, {result.valid:,} valid, {result.fitting:,} fit "
        f"({result.seconds:.1f} s)",
        highlight=False,
    )
    shown, drawn = len(result.plans), sum(1 for r in result.plans if r.get("distribution"))
    # a sampled objective ranks the plans it sampled; the rest follow unsampled, by their step (user probe 11)
    ranked = f"{drawn}, then {shown - drawn} unsampled" if 0 < drawn < shown else str(shown)
    title = f"{ranked_as(request.objective)} {ranked}: graph simulation (fast path within "
    title += f"{result.fast_vs_graph_max:.1%})"
    show_table(*plan_rows(result.plans, request.model.is_moe), "table", title)
    console.print(f"{result.framework}; {result.headroom}; priced with {result.priced_with}", highlight=False)
    if result.ranking_note:
        console.print(result.ranking_note, highlight=False)
    for note in notes:
        console.print(f"note: {note}", highlight=False, markup=False)
    if result.plans:
        console.print(f"launch settings of plan 1 ({result.framework}):", highlight=False)
        console.print(result.plans[0]["launch"], highlight=False, markup=False)
    front = ", ".join(
        f"{r['fast_step_time_s']:.3f} s @ {r['memory_per_gpu_bytes'] / 2**30:.0f} GiB" for r in result.pareto_memory[:8]
    )
    console.print(f"time × memory front (fast path): {front}", highlight=False)
    if len(request.node_counts) > 1:
        gpus = ", ".join(f"{r['num_gpus']} GPUs {r['fast_step_time_s']:.3f} s" for r in result.pareto_gpus[:12])
        console.print(f"time × GPUs front (fast path): {gpus}", highlight=False)
    if len(request.node_counts) > 1 or request.token_budget is not None:
        _print_cost_front(result)


def _print_cost_front(result: SearchResult) -> None:
    """The plans no other beats on both time per token and GPU-hours per token (fast path figures)."""
    budget = result.token_budget
    title = "time × GPU-hours per token front (fast path)" + (f", to {budget:.3g} tokens" if budget else "")
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    columns = ("nodes", "GPUs", "dp×tp×pp×cp", "tok/s", "GPU-h/Mtok", "days", "GPU-h")
    for col in columns if budget else columns[:-2]:
        table.add_column(col, justify="right", no_wrap=True)
    for r in result.pareto_cost:
        p = r["plan"]
        sizes = f"{p['data_parallel']}×{p['tensor_parallel']}×{p['pipeline_parallel']}×{p['context_parallel']}"
        to_budget = (
            (f"{r['fast_time_to_budget_s'] / 86400:,.2f}", f"{r['fast_gpu_hours_to_budget']:,.0f}") if budget else ()
        )
        table.add_row(
            str(r["num_nodes"]),
            str(r["num_gpus"]),
            sizes,
            f"{1 / r['fast_seconds_per_token']:,.0f}",
            f"{r['fast_gpu_hours_per_token'] * 1e6:.3g}",
            *to_budget,
        )
    console.print(table)
