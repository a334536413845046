"""Named presets, stored as YAML beside this file (each number cites its source there)."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import yaml

from itercast.errors import ConfigError, did_you_mean

SECTIONS = ("model", "system", "dlrm")


@cache
def _text(section: str) -> str:
    return resources.files(__package__).joinpath(f"{section}s.yaml").read_text()


@cache
def _table(section: str) -> dict[str, dict[str, Any]]:
    return yaml.safe_load(_text(section))


def preset_source(name: str) -> tuple[str, str]:
    """(section, the preset's lines as written in its YAML file, comments and sources included)."""
    for section in SECTIONS:
        if name in _table(section):
            lines = _text(section).splitlines()
            start = next(i for i, line in enumerate(lines) if line.startswith(f"{name}:"))
            end = next((j for j in range(start + 1, len(lines)) if lines[j][:1] not in (" ", "")), len(lines))
            return section, "\n".join(lines[start:end]).rstrip()
    known = [n for section in SECTIONS for n in _table(section)]
    raise ConfigError(f"unknown preset `{name}`{did_you_mean(name, known)} (known: {', '.join(sorted(known))})")


def preset_names(section: str) -> list[str]:
    return sorted(_table(section))


def preset(section: str, name: str) -> dict[str, Any]:
    """The raw fields of a preset (a fresh copy), with its name."""
    table = _table(section)
    if name not in table:
        # a job's model is a transformer or a DLRM preset (workload.py): both are named
        dlrm = sorted(_table("dlrm")) if section == "model" else []
        known = ", ".join(sorted(table)) + (f"; DLRM: {', '.join(dlrm)}" if dlrm else "")
        is_file = name.endswith((".yaml", ".yml"))
        file = " (a file's fields go in a job file's section, not a preset name)" if is_file else ""
        raise ConfigError(
            f"{section}: unknown preset `{name}`{did_you_mean(name, [*table, *dlrm])}{file} (known: {known})"
        )
    return {"name": name, **_deep_copy(table[name])}


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    return value
