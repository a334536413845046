"""A measurement: one timed configuration of an operator or collective (a row of the profiling
database, profile/db.py), the record that calibration fits cost models to (costs/, profile/calibrate.py)
and variability models read (stochastic/). Sizes are FLOPs or bytes, times seconds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FAMILIES = ("gemm", "conv", "attention", "elementwise", "norm", "embedding", "memcpy", "collective", "p2p", "host")

#: the longest time a row may hold, in seconds: an hour. A profile times one kernel, collective or host call,
#: milliseconds to seconds; an hour or more is a unit slip or a corrupt row, whose fit would price every step
#: as absurdly long (a time of 1e300 s once calibrated a 3e31 s step without a word)
MAX_MEASURED_S = 3600.0


class ProfileError(ValueError):
    """A profiling database or an input to it is unusable; the message names the file and why."""


@dataclass(frozen=True)
class Measurement:
    family: str
    op: str
    size: float
    time_s: float
    dtype: str = ""
    group_size: int = 1
    nodes: int = 1
    time_std_s: float = 0.0
    repeats: int = 1
    params: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    def check(self) -> None:
        if self.family not in FAMILIES:
            raise ProfileError(f"measurement family {self.family!r}: expected one of {', '.join(FAMILIES)}")
        timed = 0 < self.time_s <= MAX_MEASURED_S and 0 <= self.size < float("inf")
        if not (timed and self.group_size >= 1 and self.repeats >= 1):
            raise ProfileError(
                f"measurement {self.op} size {self.size}: expected 0 < time_s ≤ {MAX_MEASURED_S:.0f} s, a finite "
                f"size ≥ 0, group_size ≥ 1, repeats ≥ 1; got {self.time_s}, {self.size}, {self.group_size}, "
                f"{self.repeats}"
            )
