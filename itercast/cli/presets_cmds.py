"""`itercast fields` and `itercast presets [show NAME]`: what a job file may say, and the presets it may name."""

from __future__ import annotations

from typing import Annotated

import typer
import yaml

from itercast.cli.app import Group, app, console, fail
from itercast.config.presets import preset, preset_names, preset_source
from itercast.errors import ConfigError


@app.command("fields")
def fields_cmd() -> None:
    """The canonical job fields, one a line: section.field, type, default, meaning (units in the names),
    a transformer's first, then a DLRM's model and plan (a job whose model is a DLRM). Set them with
    `--set SECTION.FIELD=VALUE`, or as the same keys in a job file."""
    from pydantic import BaseModel

    from itercast.config.model import ModelConfig
    from itercast.config.plan import PlanConfig
    from itercast.config.system import SystemConfig
    from itercast.workloads.dlrm.config import DLRMConfig, DLRMPlan

    def lines(prefix: str, schema: type[BaseModel]) -> list[str]:
        out = []
        for name, info in schema.model_fields.items():
            ann = info.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                out += lines(f"{prefix}.{name}", ann)
                continue
            kind = _type_name(ann)
            default = "required" if info.is_required() else repr(info.get_default(call_default_factory=True))
            out.append(f"{prefix}.{name:<34} {kind:<44} {default:<12} {info.description or ''}".rstrip())
        return out

    Sections = list[tuple[str, type[BaseModel]]]
    transformer: Sections = [("model", ModelConfig), ("plan", PlanConfig), ("system", SystemConfig)]
    dlrm: Sections = [("model", DLRMConfig), ("plan", DLRMPlan)]
    typer.echo("\n".join(line for section, schema in transformer for line in lines(section, schema)))
    typer.echo("\n# a DLRM job (model: a DLRM preset or file; system as above)")
    typer.echo("\n".join(line for section, schema in dlrm for line in lines(section, schema)))


def _type_name(ann: object) -> str:
    """A field's type as a user reads it: `int | None`, `tuple[int, ...]`, `'1f1b' | 'gpipe'` (the
    constraints of Annotated types are left to the error messages)."""
    import types
    import typing

    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else _type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    return "None" if ann is type(None) else getattr(ann, "__name__", str(ann))


presets_app = typer.Typer(
    cls=Group,
    rich_markup_mode="markdown",
    help="Model and system presets: list them, or show one.",
    invoke_without_command=True,
)
app.add_typer(presets_app, name="presets")


@presets_app.callback()
def presets_cmd(ctx: typer.Context) -> None:
    """List the model and system presets (`itercast presets show NAME` for one)."""
    if ctx.invoked_subcommand is None:
        for section, label in (("model", "models"), ("dlrm", "DLRM models"), ("system", "systems")):
            console.print(f"[bold]{label}:[/] " + ", ".join(preset_names(section)), highlight=False)


@presets_app.command("show")
def presets_show_cmd(name: Annotated[str, typer.Argument(help="A preset name (see `itercast presets`).")]) -> None:
    """Every field of a preset as written, with units in the field names and sources in the comments,
    as a job file's `model:` or `system:` section (YAML: `> h100.yaml` writes a section to edit)."""
    try:
        section, text = preset_source(name)
    except ConfigError as exc:
        fail(str(exc))
    key = "system" if section == "system" else "model"
    flag = f"--{key} {name}"
    first, *fields = text.splitlines()  # `NAME:` with the fields below it indented by two, or
    flow = first.partition(":")[2]  # `NAME: {field: value, …}  # source` on one line (the model presets)
    if flow.lstrip().startswith("{"):
        comment = flow.rpartition("}")[2].strip().lstrip("#").strip()
        parsed = {k: v for k, v in preset(section, name).items() if k != "name"}
        block = yaml.safe_dump(parsed, sort_keys=False, default_flow_style=False, width=1000)
        fields = [f"  # {comment}"] * bool(comment) + [f"  {line}" for line in block.splitlines()]
    typer.echo(
        f"# {section} preset {name}: a job file's `{key}:` section as written (or `{key}: {name}`, {flag});\n"
        f"# edit the fields and append it to a job file with model/plan sections\n{key}:\n  name: {name}"
    )
    typer.echo("\n".join(fields))
