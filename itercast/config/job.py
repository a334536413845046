"""A job = model + plan + system, loaded from presets, YAML and `section.field=value` overrides.

Every check names the fields and their values; all problems are reported at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, cast, get_args, get_origin

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from itercast.config.deepep_buffer import DEEPEP_EP_SIZES
from itercast.config.model import ModelConfig
from itercast.config.plan import PlanConfig, torchtitan_expert_layout_ok
from itercast.config.presets import preset
from itercast.config.system import GPUSpec, SystemConfig
from itercast.errors import ConfigError, did_you_mean
from itercast.user_files import read_small_text

_SCHEMAS: dict[str, type[BaseModel]] = {"model": ModelConfig, "plan": PlanConfig, "system": SystemConfig}
MAX_JOB_FILE_BYTES = 1 << 20  # a job file is a few hundred bytes; refuse anything huge
MAX_YAML_DEPTH = 32  # a job nests 3 deep (system.gpu.peak_flops)
MAX_PASSES = 1_000_000  # forward passes of one step's graph (its size): far above real jobs


@dataclass(frozen=True)
class Job:
    """A validated model, plan and system. `plan.data_parallel` is always resolved here."""

    model: ModelConfig
    plan: PlanConfig
    system: SystemConfig

    @classmethod
    def from_dicts(
        cls, model: dict[str, Any], plan: dict[str, Any], system: dict[str, Any], source: str = "<input>"
    ) -> Job:
        """Build from raw sections; a section may hold `preset: NAME` plus overrides."""
        return _cross_validate(
            cast(ModelConfig, _parse("model", model, source)),
            cast(PlanConfig, _parse("plan", plan, source)),
            cast(SystemConfig, _parse("system", system, source)),
            source,
        )

    @classmethod
    def from_presets(cls, model: str, system: str, num_nodes: int = 1, plan: dict[str, Any] | None = None) -> Job:
        return cls.from_dicts({"preset": model}, plan or {}, {"preset": system, "num_nodes": num_nodes})

    @classmethod
    def load(
        cls,
        path: str | Path | None = None,
        overrides: list[str] | tuple[str, ...] = (),
        model: str | None = None,
        system: str | None = None,
    ) -> Job:
        """The CLI path: an optional YAML job file, preset names, then `section.field=value` overrides."""
        raw = raw_sections(path, overrides, model, system)
        return cls.from_dicts(raw["model"], raw["plan"], raw["system"], str(path) if path else "<command line>")

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step on one data-parallel replica."""
        p = self.plan
        return p.gbs // (p.micro_batch_size * p.dp)

    def stage_gpus(self) -> list[GPUSpec]:
        """The GPU kind of each pipeline stage (a mixed cluster's device groups, in order)."""
        p = self.plan
        return self.system.stage_gpus(p.pipeline_parallel, p.dp * p.tensor_parallel * p.context_parallel)

    def to_dict(self) -> dict[str, Any]:
        return {s: getattr(self, s).model_dump(mode="json") for s in ("model", "plan", "system")}


def raw_sections(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    model: str | None = None,
    system: str | None = None,
) -> dict[str, Any]:
    """Sections model / plan / system before validation: the job file, preset names, overrides."""
    raw: dict[str, Any] = {"model": {}, "plan": {}, "system": {}}
    if path is not None:
        raw.update(read_job_file(Path(path)))
    if model is not None:
        raw["model"] = {"preset": model}
    if system is not None:
        raw["system"] = {**raw["system"], "preset": system}
    for item in overrides:
        apply_override(raw, item)
    return raw


def parse_section(section: str, raw: dict[str, Any], source: str = "<input>") -> BaseModel:
    """One section (model | plan | system) on its own: `preset: NAME` plus overrides, validated."""
    return _parse(section, raw, source)


def load_system(name: str, **overrides: Any) -> SystemConfig:
    """A system preset (with field overrides) on its own, without a model or plan."""
    return cast(SystemConfig, _parse("system", {"preset": name, **overrides}, "<preset>"))


def plain_yaml(text: str, where: str) -> Any:
    """yaml.safe_load of text without aliases and nested at most MAX_YAML_DEPTH deep: an alias
    lets 500 bytes expand to gigabytes (billion laughs), and a job is a few flat mappings."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            raise ConfigError(f"{where}: YAML aliases (*name) are not accepted; write the value out")
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise ConfigError(f"{where}: YAML nested deeper than {MAX_YAML_DEPTH} levels")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        nodes = [root]
        while nodes:  # a key given twice: YAML keeps the last silently; say which
            node = nodes.pop()
            if isinstance(node, yaml.MappingNode):
                seen: set[str] = set()
                for key, value in node.value:
                    if isinstance(key, yaml.ScalarNode):
                        if key.value in seen:
                            line = key.start_mark.line + 1
                            raise ConfigError(f"{where}: line {line}: key `{key.value}` given twice; keep one")
                        seen.add(key.value)
                    nodes.append(value)
            elif isinstance(node, yaml.SequenceNode):
                nodes.extend(node.value)
        return None if root is None else loader.construct_document(root)
    finally:
        loader.dispose()


def read_yaml_file(path: Path, what: str, max_bytes: int) -> Any:
    """A small YAML input file (a job, a sharding, a DLRM model) parsed by plain_yaml; malformed YAML or
    a tag the safe loader refuses is a ConfigError naming the line."""
    text = read_small_text(path, what, max_bytes)
    try:
        return plain_yaml(text, str(path))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} malformed YAML ({getattr(exc, 'problem', exc)})") from None


def read_job_file(path: Path) -> dict[str, Any]:
    """Read a YAML job file with sections model / plan / system (safe loader, bounded size)."""
    data = read_yaml_file(path, "job file", MAX_JOB_FILE_BYTES)
    if data is None:
        raise ConfigError(f"{path}: an empty file; expected a mapping with sections model, plan, system")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with sections model, plan, system; got {type(data).__name__}")
    unknown = [k for k in data if k not in _SCHEMAS]
    if unknown and ("plans" in data or "steps" in data):  # JSON is YAML: a saved search or replay
        raise ConfigError(
            f"{path}: expected a job (sections model, plan, system); got the saved result of `itercast "
            f"{'search' if 'plans' in data else 'replay'} --json` (field `{'plans' if 'plans' in data else 'steps'}`):"
            " `itercast report --result FILE` and `itercast compare A B` read those"
        )
    if unknown:
        raise ConfigError(f"{path}: unknown section `{unknown[0]}`{did_you_mean(unknown[0], _SCHEMAS)}")
    out: dict[str, Any] = {}
    for name, section in data.items():
        if isinstance(section, str):
            section = {"preset": section}
        if not isinstance(section, dict):
            raise ConfigError(f"{path}: section `{name}`: expected a preset name or a mapping; got {section!r}")
        out[name] = section
    return out


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply `section.field[.sub]=value` to raw sections; the value is parsed as YAML (safe)."""
    key, sep, text = item.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) < 2 or parts[0] not in _SCHEMAS:
        raise ConfigError(f"--set {item!r}: expected SECTION.FIELD=VALUE with SECTION one of model, plan, system")
    try:
        value = plain_yaml(text, f"--set {key}") if text.strip() else None
    except yaml.YAMLError:
        value = text
    if isinstance(value, str):
        value = _float_literal(value)
    target = raw.setdefault(parts[0], {})
    if isinstance(target, str):
        target = raw[parts[0]] = {"preset": target}
    for i, part in enumerate(parts[1:], start=1):
        where = ".".join(parts[: i + 1])
        if isinstance(target, list):  # a job file's own list (model.tables): an item by its index
            if not (part.isdigit() and int(part) < len(target)):
                raise ConfigError(
                    f"--set {item}: `{where}`: expected an index below {len(target)} (the list's items); got {part}"
                )
            if i == len(parts) - 1:
                target[int(part)] = value
                return
            target = target[int(part)]
        elif i == len(parts) - 1:
            target[part] = value
            return
        else:
            target = target.setdefault(part, {})
        if not isinstance(target, dict | list):
            raise ConfigError(f"--set {item!r}: `{where}` is a value ({target!r}), not a section with fields")


def _float_literal(text: str) -> Any:
    """A finite number Python's float() reads (`2e11`, `1_000.5`), which YAML 1.1 leaves a string
    (it wants `2.0e+11`): a whole one as an int (`2e3` → 2000, for integer fields; float fields take
    ints too), else a float; anything else as given."""
    try:
        value = float(text)
    except ValueError:
        return text
    if not math.isfinite(value):
        return text
    return int(value) if value.is_integer() else value


def blame_overrides(exc: ConfigError, source: str, overrides: list[str] | tuple[str, ...]) -> ConfigError:
    """The error with each line about a field a `--set` gave, or about the list item or mapping it lies in
    (`model.tables.4` of `--set model.tables.4.dim=8`), naming that option instead of `source` (a packaged
    example or a job file the user did not write that value in)."""
    given = {item.partition("=")[0].strip(): item for item in overrides}
    lines = []
    for line in str(exc).splitlines():
        field = line.removeprefix(f"{source}: `").partition("`")[0] if line.startswith(f"{source}: `") else ""
        key = next((k for k in given if "." in field and f"{k}.".startswith(f"{field}.")), None)
        if key:
            lines.append(f"--set {given[key]}{line.removeprefix(source)}")
            continue
        # a rule across fields, or an unknown one, that names a field a --set gave (`plan.x`, or x(value))
        named = [item for k, item in given.items() if f"`{k}`" in line or f"{k.rpartition('.')[2]}(" in line]
        lines.append(line + (f" (given by --set {', --set '.join(named)})" if named else ""))
    return ConfigError("\n".join(lines))


def _parse(section: str, raw: dict[str, Any], source: str) -> BaseModel:
    fields = dict(raw)
    name = fields.pop("preset", None)
    if name is not None:
        try:
            base = preset(section, name)
        except ConfigError as exc:  # the file (or the command line) that names it
            raise ConfigError(f"{source}: {exc}") from None
        if section == "system":
            _check_kept_ceiling(base.get("gpu", {}), fields.get("gpu"), f"{source}: `system", name)
        fields = merge_fields(base, fields)
    if section == "system" and isinstance(fields.get("device_groups"), list):
        fields["device_groups"] = [_group_gpu(g) for g in fields["device_groups"]]
    return validated(_SCHEMAS[section], fields, section, source)


def validated(schema: type[BaseModel], fields: dict[str, Any], section: str, source: str) -> Any:
    """`fields` as a `schema` (section `section` of `source`); a ConfigError of _format_validation's lines otherwise."""
    try:
        return schema.model_validate(fields)
    except ValidationError as exc:
        raise ConfigError(_format_validation(exc, schema, section, source)) from None


def check_values(schema: type[BaseModel], fields: dict[str, Any], section: str, source: str) -> None:
    """Each of `fields` against its own field of `schema` (type and bounds, no rule across fields): what a command that
    replaces them (search varies the plan's sizes) still refuses as predict would, one line each."""
    lines = []
    for name, value in fields.items():
        info = schema.model_fields[name]
        try:
            TypeAdapter(cast(Any, Annotated[info.annotation, info])).validate_python(value)
        except ValidationError as exc:
            lines += [f"{source}: `{section}.{name}`: {err['msg']}; got {value!r}" for err in exc.errors()[:1]]
    if lines:
        raise ConfigError("\n".join(lines))


def _group_gpu(group: Any) -> Any:
    """A device group `{preset: SYSTEM, num_nodes: N}` takes that system preset's GPU."""
    if not isinstance(group, dict) or "preset" not in group:
        return group
    rest = {k: v for k, v in group.items() if k != "preset"}
    base = preset("system", str(group["preset"]))["gpu"]
    _check_kept_ceiling(base, rest.get("gpu"), "`system.device_groups", str(group["preset"]))
    return {"gpu": merge_fields(base, rest.pop("gpu", {})), **rest}


def _check_kept_ceiling(base: dict[str, Any], over: Any, where: str, name: str) -> None:
    """A preset's GPU whose peak FLOP/s an override changes keeps the sustained GEMM rate measured on the preset's
    GPU (GPUSpec.sustained_gemm_flops), a ceiling that would silently hold a faster GPU's GEMMs to it: unless the
    override sets that field too (an empty mapping clears it), a ConfigError naming both fields (`where`: the
    source and the section's path, a backtick opening it)."""
    if not isinstance(over, dict) or "sustained_gemm_flops" in over or not isinstance(over.get("peak_flops"), dict):
        return
    kept = sorted(set(over["peak_flops"]) & set(base.get("sustained_gemm_flops", {})))
    if kept:
        ceilings = ", ".join(f"{k} {base['sustained_gemm_flops'][k] / 1e12:g}" for k in kept)
        raise ConfigError(
            f"{where}.gpu.peak_flops`: changed for {', '.join(kept)} from preset {name}, whose GEMMs are held to the "
            f"rate measured sustained on its GPU at its power limit (system.gpu.sustained_gemm_flops: {ceilings} "
            "TFLOP/s): set system.gpu.sustained_gemm_flops too (the new GPU's measured rate, or {} for none)"
        )


def merge_fields(base: dict[str, Any], over: dict[str, Any], where: str = "") -> dict[str, Any]:
    """`over`'s fields over a preset's `base`, mapping by mapping (an empty mapping replaces the preset's: `{}`
    clears it). A list of `base` takes a mapping of its
    indices (`--set model.tables.0.pooling_factor=50` gives tables {"0": {...}}), each merged into its item;
    an index beyond the list is a ConfigError naming the field (`where`: the path so far)."""
    out = dict(base)
    for k, v in over.items():
        old, path = out.get(k), f"{where}{k}"
        if isinstance(v, dict) and isinstance(old, dict) and v:  # an empty mapping clears the preset's
            out[k] = merge_fields(old, v, f"{path}.")
        elif isinstance(v, dict) and isinstance(old, list) and v and all(str(i).isdigit() for i in v):
            items = list(old)
            for i, item in v.items():
                if int(i) >= len(items):
                    raise ConfigError(f"`{path}.{i}`: expected an index below {len(items)} (the list's items); got {i}")
                fits = isinstance(item, dict) and isinstance(items[int(i)], dict)
                items[int(i)] = merge_fields(items[int(i)], item, f"{path}.{i}.") if fits else item
            out[k] = items
        else:
            out[k] = v
    return out


def _format_validation(exc: ValidationError, schema: type[BaseModel], section: str, source: str) -> str:
    """A section's validation errors, one line each naming the source and the field (`section.a.0.b`, an index of a
    list field as a number): an unknown field with the nearest known one, a missing one, a check's own message
    (a validator's, which says what it got) or the expected value and what the input gave."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in (section, *err["loc"]))
        if err["type"] == "extra_forbidden":
            at = _schema_at(schema, err["loc"][:-1])
            hint = did_you_mean(str(err["loc"][-1]), at.model_fields) if at else ""
            lines.append(f"{source}: unknown field `{loc}`{hint}")
        elif err["type"] == "missing":
            lines.append(f"{source}: missing field `{loc}`")
        elif err["type"] == "value_error":
            lines.append(f"{source}: `{loc}`: {err['ctx']['error']}")
        else:
            lines.append(f"{source}: `{loc}`: {err['msg']}; got {err.get('input')!r}")
    return "\n".join(lines)


def _schema_at(schema: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model a validation error's location leads to: a field's, or the items' of a tuple or list field (the
    index that follows it skipped); None where it leads to no model."""
    for part in loc:
        if isinstance(part, int):
            continue
        field = schema.model_fields.get(str(part))
        ann = getattr(field, "annotation", None)
        if get_origin(ann) in (tuple, list):
            ann = get_args(ann)[0]
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        schema = ann
    return schema


def with_system_defaults(plan: PlanConfig, system: SystemConfig) -> PlanConfig:
    """The plan with the fields it leaves out that depend on the GPUs set for them: dtype fp16 where a GPU has no
    bf16, flash_attention where every GPU runs FlashAttention (SystemConfig.supports_flash_attention)."""
    update: dict[str, object] = {}
    if "dtype" not in plan.model_fields_set and any("bf16" not in g.peak_flops for g in system.gpu_kinds):
        update["dtype"] = "fp16"
    if "flash_attention" not in plan.model_fields_set:
        update["flash_attention"] = system.supports_flash_attention
    return plan.model_copy(update=update) if update else plan


def _cross_validate(model: ModelConfig, plan: PlanConfig, system: SystemConfig, source: str) -> Job:
    """Checks that involve more than one section. Resolves data_parallel and global_batch_size."""
    p, gpus = with_system_defaults(plan, system), system.num_gpus
    problems: list[str] = []
    if p.flash_attention and not system.supports_flash_attention:
        lacking = next(g.name for g in system.gpu_kinds if not g.supports_flash_attention)
        problems.append(
            f"plan.flash_attention: true, but {lacking} runs no FlashAttention (compute capability < 8.0, "
            "gpu.supports_flash_attention); expected false or left out"
        )
    inner = p.tensor_parallel * p.pipeline_parallel * p.context_parallel
    dp = p.data_parallel if p.data_parallel is not None else max(gpus // inner, 1)
    gbs = p.global_batch_size if p.global_batch_size is not None else p.micro_batch_size * dp
    if dp * inner != gpus:
        derived = "" if p.data_parallel is not None else f": left out, {gpus} GPUs ÷ {inner} rounded down"
        problems.append(
            f"data_parallel({dp}{derived}) × tensor_parallel({p.tensor_parallel}) × pipeline_parallel"
            f"({p.pipeline_parallel}) × context_parallel({p.context_parallel}) = {dp * inner} ≠ "
            f"{gpus} GPUs (num_nodes({system.num_nodes}) × gpus_per_node({system.node.gpus_per_node}))"
        )
    problems += _divisibility_problems(model, p, dp, gbs)
    problems += _stage_layer_problems(model, p)
    if "mla_up_proj" in p.recompute_modules and not model.mla:
        problems.append(  # transformer_config.py __post_init__
            "plan.recompute_modules: mla_up_proj recomputes multi-latent attention's up projections ('mla_up_proj in "
            f"recompute_modules is only supported with multi_latent_attention', Megatron-Core); {model.name} has none"
        )
    if p.context_parallel > 1 and model.sliding_window is not None and p.cp_comm == "p2p":
        problems.append(  # transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py
            "plan.cp_comm: Transformer Engine runs sliding-window attention under context parallelism over all_gather "
            "or a2a only (context_parallel.py: 'The context parallel running configs cannot support sliding window "
            f"attention'); {model.name} attends within {model.sliding_window} tokens: expected all_gather; got p2p"
        )
    micro = gbs // max(p.micro_batch_size * dp, 1)
    passes = p.pipeline_parallel * p.virtual_pipeline * micro
    if passes > MAX_PASSES:
        problems.append(
            f"pipeline_parallel({p.pipeline_parallel}) × virtual_pipeline({p.virtual_pipeline}) × micro-batches "
            f"({micro}) = {passes:,} forward passes to simulate; expected ≤ {MAX_PASSES:,}"
        )
    problems += _schedule_problems(p, micro)
    problems += _support_problems(model, p, system)
    if system.device_groups and not problems:
        try:
            system.stage_gpus(p.pipeline_parallel, dp * p.tensor_parallel * p.context_parallel)
        except ValueError as exc:
            problems.append(f"system.device_groups: {exc}")
    etp = p.expert_tensor_parallel or p.default_etp(model.is_moe, p.tensor_parallel, p.expert_parallel)
    problems += _expert_problems(model, p, dp, etp)
    problems += _zero_shard_problems(model, p, dp, etp)
    if problems:
        raise ConfigError("\n".join(f"{source}: {x}" for x in problems))
    resolved = {"data_parallel": dp, "global_batch_size": gbs, "expert_tensor_parallel": etp}
    return Job(model, p.model_copy(update=resolved), system)


def _divisibility_problems(model: ModelConfig, p: PlanConfig, dp: int, gbs: int) -> list[str]:
    tp = f"tensor_parallel({p.tensor_parallel})"
    checks = [("model.num_attention_heads", model.num_attention_heads, p.tensor_parallel, tp)]
    if model.kv_heads != model.num_attention_heads:
        checks.append(("model.num_query_groups", model.kv_heads, p.tensor_parallel, tp))
    checks += [
        (
            "model.num_layers",
            model.num_layers,
            p.pipeline_parallel * p.virtual_pipeline if p.stage_layers is None else 1,
            f"pipeline_parallel({p.pipeline_parallel}) × virtual_pipeline({p.virtual_pipeline})",
        ),
        (
            "model.seq_length",
            model.seq_length,
            p.context_parallel * (2 if p.context_parallel > 1 else 1),
            f"2 × context_parallel({p.context_parallel})",
        ),
        (
            "plan.global_batch_size",
            gbs,
            p.micro_batch_size * dp,
            f"micro_batch_size({p.micro_batch_size}) × data_parallel({dp})",
        ),
    ]
    if p.sequence_parallel:  # each rank's tokens scattered over the tensor ranks (Megatron-Core mappings.py: 'First
        # dimension of the tensor should be divisible by tensor parallel size'; torchtitan trainer.py alike)
        checks.append(
            (
                "model.seq_length",
                model.seq_length,
                p.context_parallel * p.tensor_parallel,
                f"context_parallel({p.context_parallel}) × tensor_parallel({p.tensor_parallel}) under sequence "
                "parallelism",
            )
        )
    return [f"{what}({value}) not divisible by {by}" for what, value, div, by in checks if value % div]


def _zero_shard_problems(model: ModelConfig, p: PlanConfig, dp: int, etp: int) -> list[str]:
    """plan.zero_shard_ranks: groups of data × context-parallel ranks that each hold one copy of ZeRO's state."""
    shard = p.zero_shard_ranks
    if shard is None:
        return []
    ranks = dp * p.context_parallel
    problems = []
    if p.zero_stage == 0:
        problems.append(f"plan.zero_shard_ranks({shard}) shards ZeRO's state: needs zero_stage >= 1; got 0")
    if ranks % shard:
        problems.append(
            f"plan.zero_shard_ranks({shard}) does not divide data_parallel({dp}) × context_parallel"
            f"({p.context_parallel}) = {ranks}"
        )
    tp, ep = p.tensor_parallel, p.expert_parallel
    if model.is_moe and not ranks % shard and (tp * shard) % (ep * etp):
        problems.append(
            f"plan.zero_shard_ranks({shard}): each of the {ranks // shard} copies would hold tensor_parallel({tp}) × "
            f"{shard} / (expert_parallel({ep}) × expert_tensor_parallel({etp})) expert-data-parallel ranks, not a "
            "whole number (Megatron-Core parallel_state.py: 'Expert data parallel size should be divisible by "
            "partial DistOpt shard factor')"
        )
    if p.zero_stage == 3 and p.zero3_fetch == "deepspeed":
        problems.append(
            "plan.zero_shard_ranks: DeepSpeed's ZeRO-3 (zero3_fetch deepspeed) is priced sharded over every rank "
            "(its MiCS and hpZ are not): expected zero3_fetch layer"
        )
    return problems


def _stage_layer_problems(model: ModelConfig, p: PlanConfig) -> list[str]:
    """plan.stage_layers: one count per virtual stage, summing to the layers; only the first and
    the last may be empty (they still hold the embedding or the head)."""
    layers = p.stage_layers
    if layers is None:
        return []
    stages = p.pipeline_parallel * p.virtual_pipeline
    problems = []
    if len(layers) != stages:
        problems.append(
            f"plan.stage_layers has {len(layers)} entries; expected pipeline_parallel({p.pipeline_parallel}) × "
            f"virtual_pipeline({p.virtual_pipeline}) = {stages}"
        )
    if sum(layers) != model.num_layers:
        problems.append(f"plan.stage_layers sums to {sum(layers)}; expected model.num_layers({model.num_layers})")
    if any(n == 0 for n in layers[1:-1]):
        problems.append("plan.stage_layers: a stage between the first and the last has no layer")
    return problems


def _schedule_problems(p: PlanConfig, microbatches: int) -> list[str]:
    problems = []
    if p.virtual_pipeline > 1 and p.schedule != "interleaved-1f1b":
        problems.append(
            f"plan.virtual_pipeline({p.virtual_pipeline}) > 1 needs plan.schedule=interleaved-1f1b; got {p.schedule}"
        )
    if p.virtual_pipeline > 1 and p.pipeline_parallel == 1:
        problems.append(
            f"plan.virtual_pipeline({p.virtual_pipeline}) > 1 needs pipeline_parallel > 1 (Megatron-LM arguments.py: "
            "'When interleaved schedule is used, pipeline-model-parallel size should be greater than 1'); got 1"
        )
    if p.schedule == "interleaved-1f1b" and p.pipeline_parallel > 1 and p.virtual_pipeline == 1:
        problems.append(
            "plan.schedule=interleaved-1f1b needs plan.virtual_pipeline >= 2; got 1 (Megatron-LM runs one chunk a "
            "stage as 1F1B: arguments.py drops a virtual pipeline size of 1): set plan.schedule=1f1b"
        )
    if p.schedule == "interleaved-1f1b" and p.pipeline_parallel > 1 and microbatches % p.pipeline_parallel:
        problems.append(
            f"interleaved-1f1b: micro-batches per replica ({microbatches}) not divisible by "
            f"pipeline_parallel({p.pipeline_parallel})"
        )
    if p.context_parallel > 1 and not p.flash_attention:
        problems.append(
            f"plan.context_parallel({p.context_parallel}) needs plan.flash_attention=true "
            "(ring attention runs inside the fused attention kernel)"
        )
    if p.sequence_parallel and p.tensor_parallel == 1:
        problems.append("plan.sequence_parallel needs tensor_parallel > 1")
    if p.tp_comm_overlap and p.tensor_parallel > 1 and not p.sequence_parallel:
        problems.append("plan.tp_comm_overlap needs sequence_parallel with tensor_parallel > 1 (as Megatron-Core)")
    return problems


def _imbalance_problems(model: ModelConfig, p: PlanConfig) -> list[str]:
    """model.moe_token_imbalance beyond what routing can reach. Megatron-Core's (and torchtitan's) is the busiest
    expert-parallel rank's routed copies over the mean: a token sends at most min(k, E/ep) copies to one rank, whose
    mean is k/ep, so at most min(ep, E/k), 1 without expert parallelism (every copy on the one rank). DeepSpeed's
    dropless gating reads it per expert (the busiest expert's count, which pads every expert: sharded_moe.py): a
    token reaches an expert once, of a mean k/E, so at most E/k."""
    e, k, ep = model.experts, model.moe_top_k, p.expert_parallel
    most = e / k if p.deepspeed_moe else min(ep, e / k)
    if model.moe_token_imbalance <= most:
        return []
    what = "busiest expert's (DeepSpeed)" if p.deepspeed_moe else "busiest expert-parallel rank's"
    return [
        f"model.moe_token_imbalance({model.moe_token_imbalance:g}), the {what} routed tokens over the mean, cannot "
        f"exceed {most:g} with {e} experts, top-{k} routing and expert_parallel {ep}: expected ≤ {most:g}"
    ]


def _expert_problems(model: ModelConfig, p: PlanConfig, dp: int, etp: int) -> list[str]:
    """Expert parallelism as Megatron-Core folds it: the tensor × context × data-parallel ranks of
    the attention are, in an MoE layer, expert-tensor × expert × expert-data-parallel ranks."""
    ep = p.expert_parallel
    if not model.is_moe:
        wrong: list[tuple[str, object]] = [
            (n, v) for n, v in (("expert_parallel", ep), ("expert_tensor_parallel", etp)) if v != 1
        ]
        wrong += [("moe_a2a_overlap", True)] if p.moe_a2a_overlap else []
        wrong += [("moe_shared_expert_overlap", True)] if p.moe_shared_expert_overlap else []
        if p.dedup_dispatch or p.deepspeed_moe:
            wrong.append(("moe_token_dispatcher", p.moe_token_dispatcher))
        return [f"plan.{n}({v}) needs a mixture-of-experts model (model.num_experts)" for n, v in wrong]
    problems = []
    if p.moe_token_dispatcher == "flex":
        # Megatron-Core token_dispatcher.py MoEFlexTokenDispatcher: 'DeepEP dispatcher requires TPxEP > 1', over
        # the expert-tensor × expert group as tp·k of tp·E slots; transformer_config.py: 'Flex token dispatcher
        # with deepep backend does not support moe_pad_expert_input_to_capacity'
        if ep == 1 and etp == 1:
            problems.append(
                "plan.moe_token_dispatcher(flex) needs expert_parallel > 1 (Megatron-Core: 'DeepEP "
                "dispatcher requires TPxEP > 1')"
            )
        if etp > 1:
            problems.append(
                f"plan.moe_token_dispatcher(flex) with expert_tensor_parallel({etp}) > 1 is not priced "
                "(Megatron-Core's flex dispatcher sends over the expert-tensor × expert group, tp·k of tp·E "
                "expert slots): use expert_tensor_parallel 1 or the alltoall dispatcher"
            )
        if model.moe_pad_to_capacity:
            problems.append(
                "plan.moe_token_dispatcher(flex) does not run with model.moe_pad_to_capacity "
                "(Megatron-Core: 'Flex token dispatcher with deepep backend does not support "
                "moe_pad_expert_input_to_capacity')"
            )
    if model.experts % ep:
        problems.append(f"model.num_experts({model.experts}) not divisible by plan.expert_parallel({ep})")
    problems += _imbalance_problems(model, p)
    folded = p.tensor_parallel * p.context_parallel * dp
    if folded % (ep * etp):
        problems.append(
            f"plan.expert_parallel({ep}) × expert_tensor_parallel({etp}) = {ep * etp} does not divide "
            f"tensor_parallel({p.tensor_parallel}) × context_parallel({p.context_parallel}) × data_parallel({dp}) "
            f"= {folded} (Megatron-Core folds expert ranks into those)"
        )
    if model.biases and etp > 1 and not (p.torchtitan_moe or p.deepspeed_moe):
        problems.append(
            f"plan.expert_tensor_parallel({etp}): Megatron-Core's experts with biases (model.add_bias) run with "
            "expert_tensor_parallel 1 only (transformer_config.py: 'Bias in Moe is only supported when ETP==1'): "
            f"expected expert_tensor_parallel 1; got {etp}"
        )
    if p.moe_a2a_overlap and not p.deepspeed_moe:  # DeepSpeed's MOELayer: _deepspeed_moe_problems
        problems += _a2a_overlap_problems(p)
    if p.torchtitan_moe:
        problems += _torchtitan_expert_problems(p, dp, etp)
    if p.moe_token_dispatcher == "flex" and p.moe_flex_backend == "deepep" and p.expert_parallel not in DEEPEP_EP_SIZES:
        problems.append(_deepep_sizes_problem("plan.moe_flex_backend(deepep)", p.expert_parallel))
    if p.deepspeed_moe:
        problems += _deepspeed_moe_problems(model, p, etp)
    elif p.tensor_parallel > 1 and not p.sequence_parallel:
        problems.append(
            "a mixture-of-experts model with tensor_parallel > 1 needs plan.sequence_parallel (Megatron-Core)"
        )
    return problems


def _a2a_overlap_problems(p: PlanConfig) -> list[str]:
    """plan.moe_a2a_overlap as Megatron-Core's TransformerConfig accepts overlap_moe_expert_parallel_comm
    (transformer_config.py __post_init__ at b0cc2706 and d98e8a64): one line per rule it breaks."""
    rules = [
        (
            p.torchtitan_moe,
            "is Megatron-Core's ('overlap_moe_expert_parallel_comm is supported with alltoall/flex token "
            f"dispatcher'): expected moe_token_dispatcher alltoall or flex; got {p.moe_token_dispatcher}",
        ),
        (
            p.expert_parallel == 1,
            "needs expert parallelism ('overlap_moe_expert_parallel_comm is only supported with expert model "
            "parallelism'): expected expert_parallel > 1; got 1",
        ),
        (
            p.pipeline_parallel > 1 and p.virtual_pipeline == 1,
            "needs virtual pipelining under pipelining ('virtual_pipeline_model_parallel_size must be specified "
            f"when pipeline_model_parallel_size > 1'): expected virtual_pipeline > 1 with pipeline_parallel "
            f"{p.pipeline_parallel}; got 1",
        ),
        (
            p.recompute == "full",
            "does not run with full recompute ('disable full recomputation when enabling "
            "overlap_moe_expert_parallel_comm'): expected recompute none or selective; got full",
        ),
        (
            p.dtype == "fp32",
            "runs a 16-bit model only ('overlap_moe_expert_parallel_comm is only supported with bf16 or fp16 "
            "model'): expected dtype bf16, fp16 or fp8; got fp32",
        ),
    ]
    return [f"plan.moe_a2a_overlap {why}" for broken, why in rules if broken]


def _torchtitan_expert_problems(p: PlanConfig, dp: int, etp: int) -> list[str]:
    """torchtitan's expert layouts (config/plan.py torchtitan_expert_layout_ok): one line naming its rule, or none."""
    tp, cp, ep = p.tensor_parallel, p.context_parallel, p.expert_parallel
    deepep = p.moe_token_dispatcher == "torchtitan_deepep"
    if torchtitan_expert_layout_ok(ep, etp, tp, cp, dp, deepep):
        return []
    if deepep and torchtitan_expert_layout_ok(ep, etp, tp, cp, dp):
        return [_torchtitan_deepep_problem(ep, etp, tp)]
    if ep == 1:
        want = f"expert_tensor_parallel = tensor_parallel({tp}) with expert_parallel 1"
    elif etp == tp:
        want = f"with expert_tensor_parallel = tensor_parallel an expert_parallel that context_parallel({cp}) divides "
        want += f"and that divides data_parallel × context_parallel ({dp * cp})"
    elif etp == 1:
        want = f"with expert_tensor_parallel 1 an expert_parallel that context_parallel × tensor_parallel ({cp * tp}) "
        want += f"divides and that divides data_parallel × context_parallel × tensor_parallel ({dp * cp * tp})"
    else:
        want = f"expert_tensor_parallel 1 or tensor_parallel({tp})"
    return [
        f"plan.moe_token_dispatcher({p.moe_token_dispatcher}): torchtitan's ParallelDims takes {want} "
        f"(torchtitan/distributed/parallel_dims.py); got expert_parallel {ep}, expert_tensor_parallel {etp}"
    ]


def _torchtitan_deepep_problem(ep: int, etp: int, tp: int) -> str:
    """Why torchtitan's DeepEP backend does not take a layout ParallelDims takes (its models' parallelize.py at
    9810191^, e.g. models/llama4/infra/parallelize.py; config/plan.py torchtitan_expert_layout_ok): one line."""
    name = "plan.moe_token_dispatcher(torchtitan_deepep)"
    if ep == 1:
        return f"{name} needs expert_parallel > 1 (torchtitan: 'DeepEP requires expert parallelism (ep_degree > 1)')"
    if ep not in DEEPEP_EP_SIZES:
        return _deepep_sizes_problem(name, ep)
    if etp > 1:
        return (
            f"{name} takes whole experts (torchtitan: 'DeepEP with Expert Tensor Parallelism (ETP) is not supported "
            f"yet'): expected expert_tensor_parallel 1; got {etp}"
        )
    return (
        f"{name} with tensor_parallel({tp}) > 1 is not priced: torchtitan's DeepEPMoE drops the reorderer that splits "
        "the layer's gathered tokens over the tensor-parallel ranks (models/moe/moe_deepep.py `self.reorderer = "
        "None`), so each rank would send all of them: expected tensor_parallel 1, or the torchtitan dispatcher"
    )


def _deepep_sizes_problem(name: str, ep: int) -> str:
    """That DeepEP runs no expert-parallel group of `ep` ranks (config/deepep_buffer.py DEEPEP_EP_SIZES): one line."""
    return (
        f"{name}: DeepEP has kernel configurations for expert_parallel in {', '.join(map(str, DEEPEP_EP_SIZES))} "
        f"(deep_ep/buffer.py Buffer.get_dispatch_config: 'Unsupported number of EP ranks'); got {ep}"
    )


def pr_moe_problem(model: ModelConfig) -> str | None:
    """DeepSpeed runs a shared expert only as PR-MoE's residual MLP, a copy of one routed expert (deepspeed/moe/
    layer.py MoE use_residual: `self.mlp = expert`): a one-line problem for another width, else None."""
    if model.moe_shared_ffn_hidden_size in (0, model.expert_ffn):
        return None
    return (
        "model.moe_shared_ffn_hidden_size: DeepSpeed runs a shared expert only as PR-MoE's residual MLP, a copy of a "
        f"routed expert (deepspeed/moe/layer.py MoE use_residual: expected 0 or {model.expert_ffn}); {model.name} "
        f"sets {model.moe_shared_ffn_hidden_size}"
    )


def _deepspeed_moe_problems(model: ModelConfig, p: PlanConfig, etp: int) -> list[str]:
    """plan.moe_token_dispatcher einsum or gather, DeepSpeed's MOELayer, as it runs (deepspeed/moe/sharded_moe.py at
    38327e0 and from v0.19.4):
    drop_tokens=True pads every expert to its capacity (Megatron-DeepSpeed --moe-train-capacity-factor, default
    1.0), and its dropless gating (--disable-moe-token-dropping, model.moe_capacity_factor unset) pads every expert
    to the busiest one's count (transformer_ops._deepspeed_moe_block): a capacity factor without padding is not
    DeepSpeed's; every tensor-parallel rank holds the whole sequence, whose capacity
    drop_tokens splits (sequence parallelism would split it twice); with tensor parallelism, either whole experts
    (expert_tensor_parallel 1, its default: groups.py _create_expert_and_data_parallel folds the expert-parallel
    and expert-data-parallel groups over the pipeline stage's tensor × data ranks, consecutive ranks an expert
    group, as Megatron-Core's folding) or experts split over all its ranks (Megatron-DeepSpeed
    --enable-expert-tensor-parallelism, the expert-tensor group groups.py _create_expert_data_and_model_parallel
    makes) with their tokens gathered back over them (sharded_moe.py: `if tensor_model_world_size > 1 and
    groups._get_expert_model_parallel_world_size() > 1`, the expert-tensor size); its experts run one after another
    (deepspeed/moe/experts.py), beside no all-to-all."""
    d = p.moe_token_dispatcher
    problems = [problem] if (problem := pr_moe_problem(model)) else []
    if model.moe_capacity_factor is not None and not model.moe_pad_to_capacity:
        problems.append(
            f"plan.moe_token_dispatcher({d}) pads every expert to its capacity (DeepSpeed's drop_tokens, "
            "Megatron-DeepSpeed --moe-train-capacity-factor): expected model.moe_pad_to_capacity true with "
            f"model.moe_capacity_factor {model.moe_capacity_factor}, or no capacity factor (its dropless gating); "
            "got false"
        )
    if p.tensor_parallel > 1 and p.sequence_parallel:
        problems.append(
            f"plan.moe_token_dispatcher({d}) takes the whole sequence on every tensor-parallel rank (DeepSpeed's "
            "drop_tokens splits its capacity over them): expected sequence_parallel false; got true"
        )
    tp = p.tensor_parallel
    if etp not in (1, tp):
        problems.append(
            f"plan.moe_token_dispatcher({d}): Megatron-DeepSpeed runs whole experts or splits them over all "
            "tensor-parallel ranks (--enable-expert-tensor-parallelism; megatron/core/tensor_parallel/layers.py): "
            f"expected expert_tensor_parallel 1 or tensor_parallel({tp}); got {etp}"
        )
    tokens = p.micro_batch_size * model.seq_length
    if tp > 1 and model.moe_capacity_factor is not None and (capacity := int(model.deepspeed_capacity(tokens))) % tp:
        problems.append(
            f"plan.moe_token_dispatcher({d}): DeepSpeed's drop_tokens splits every expert's capacity over the "
            "tensor-parallel ranks (deepspeed/moe/mappings.py _drop_tokens asserts they divide it): expected a "
            f"capacity divisible by tensor_parallel({tp}); got {capacity} slots (micro_batch_size "
            f"{p.micro_batch_size} × seq_length {model.seq_length} tokens / {model.experts} experts × top-"
            f"{model.moe_top_k} × capacity factor {model.moe_capacity_factor}, rounded up)"
        )
    if p.zero_stage == 3:
        problems.append(
            f"plan.moe_token_dispatcher({d}): DeepSpeed runs its MoE layer with ZeRO 0-2 (runtime/engine.py: 'Native "
            "DeepSpeed MoE is not supported with ZeRO Stage 3'): expected zero_stage 0, 1 or 2; got 3"
        )
    if p.context_parallel > 1:
        problems.append(
            f"plan.moe_token_dispatcher({d}): Megatron-DeepSpeed has no ring context parallelism (DeepSpeed-Ulysses "
            f"splits heads): expected context_parallel 1; got {p.context_parallel}"
        )
    if p.dtype == "fp8":
        problems.append(
            f"plan.moe_token_dispatcher({d}): DeepSpeed's experts are Megatron-DeepSpeed's ParallelMLP, outside "
            "Transformer Engine's FP8 modules: expected dtype bf16, fp16 or fp32; got fp8"
        )
    running = [("moe_grouped_gemm", p.moe_grouped_gemm), ("moe_a2a_overlap", p.moe_a2a_overlap)]
    problems += [
        f"plan.{name}: DeepSpeed's MOELayer (moe_token_dispatcher {d}) runs its experts in turn and overlaps "
        "no all-to-all: expected false; got true"
        for name, on in running
        if on
    ]
    return problems


def _support_problems(model: ModelConfig, p: PlanConfig, system: SystemConfig) -> list[str]:
    problems = []
    peak_key = "tf32" if p.dtype == "fp32" and "tf32" in system.gpu.peak_flops else p.dtype
    if peak_key not in system.gpu.peak_flops:
        problems.append(
            f"plan.dtype({p.dtype}) not supported by {system.gpu.name} (has {', '.join(system.gpu.peak_flops)})"
        )
    return problems
