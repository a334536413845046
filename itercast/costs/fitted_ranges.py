"""Where a fitted cost model is priced beyond the sizes it was fitted on.

A calibrated curve (costs/analytic.py) or a profiled operator model (costs/op_model.py) is fitted on
rows from a least to a most size (FLOPs or bytes). Priced far outside them, its price is the fitted
form carried on, not a measurement: a job that does so is told, once per model, with both ranges.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

#: a fitted model's key for the [least, most] size (FLOPs, bytes, bus bytes) of the rows it was fitted on
MEASURED_RANGE = "measured_range"
#: how far beyond its fitted sizes a model may be priced before a job is told (either side: a size
#: below the least / this, or above the most × this)
EXTRAPOLATION_FACTOR = 2.0


class FittedRanges:
    """The sizes each fitted model was fitted on (name -> (least, most)) and the least and most sizes
    priced on it since. `label` names the kind of model in what `lines` says ("calibrated"),
    `noun` what is carried on beyond ("curve"), `unit_of` the unit of a model's sizes by its name;
    `below` False: sizes under the least are not reported (a form that holds its least size's behaviour
    there)."""

    def __init__(
        self,
        fitted: dict[str, tuple[float, float]],
        label: str,
        noun: str,
        unit_of: Callable[[str], str],
        below: bool = True,
    ) -> None:
        self.fitted = fitted
        self.label, self.noun, self.unit_of, self.below = label, noun, unit_of, below
        self.priced: dict[str, tuple[float, float]] = {}

    def note(self, name: str, sizes: np.ndarray | float) -> None:
        """Widen the range of sizes priced on model `name` (nothing for a model without a fitted range)."""
        if name not in self.fitted:
            return
        if isinstance(sizes, int | float):  # one call's size: the operator models' hot path, without numpy
            least = most = float(sizes)
            if least <= 0:
                return
        else:
            x = np.asarray(sizes, dtype=np.float64)
            x = x[x > 0]
            if not x.size:
                return
            least, most = float(x.min()), float(x.max())
        lo, hi = self.priced.get(name, (math.inf, 0.0))
        self.priced[name] = (min(lo, least), max(hi, most))

    def lines(self, beyond: float = EXTRAPOLATION_FACTOR) -> list[str]:
        """One line per model priced on sizes more than `beyond` times outside those it was fitted on."""
        out = []
        for name, (lo, hi) in sorted(self.priced.items()):
            fit_lo, fit_hi = self.fitted[name]
            if (self.below and lo * beyond < fit_lo) or hi > fit_hi * beyond:
                out.append(
                    f"{self.label} {name} was fitted on {fit_lo:.3g}–{fit_hi:.3g} {self.unit_of(name)}; this job "
                    f"prices {lo:.3g}–{hi:.3g} on it: beyond that range the {self.noun} is extrapolated (profile "
                    "larger or smaller sizes to measure them)"
                )
        return out
