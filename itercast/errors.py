"""User-facing errors: each names the file, the field, what was expected and what was got."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable


class ConfigError(ValueError):
    """An input (config file, override, plan) is invalid. The message is one line per problem."""


class DeadlockError(RuntimeError):
    """The execution graph has a cycle: the tasks named in the message wait on each other."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return ' — did you mean `x`?' for the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" — did you mean `{close[0]}`?" if close else ""


def non_negative(text: str, where: str, what: str = "number") -> float:
    """`text` as a finite float ≥ 0; otherwise a ConfigError naming `where` (file and line, or option)."""
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{where}: expected a {what}; got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where}: expected a finite {what} ≥ 0; got {text!r}")
    return value
