"""Named presets, stored as YAML beside this file (each number cites its source there)."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import yaml

from itercast.errors import ConfigError, did_you_mean

SECTIONS = ("model", "system")


@cache
def _table(section: str) -> dict[str, dict[str, Any]]:
    text = resources.files(__package__).joinpath(f"{section}s.yaml").read_text()
    return yaml.safe_load(text)


def preset_names(section: str) -> list[str]:
    return sorted(_table(section))


def preset(section: str, name: str) -> dict[str, Any]:
    """The raw fields of a preset (a fresh copy), with its name."""
    table = _table(section)
    if name not in table:
        raise ConfigError(
            f"{section}: unknown preset `{name}`{did_you_mean(name, table)} (known: {', '.join(sorted(table))})"
        )
    return {"name": name, **_deep_copy(table[name])}


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    return value
