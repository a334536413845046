"""Plots of results. Needs matplotlib (pip install 'itercast[plot]'); the analysis never does."""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from itercast.errors import ConfigError
from itercast.user_files import write_output


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, or a clear error naming the extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("plots need matplotlib: pip install 'itercast[plot]'") from None
    return plt


def time_unit(seconds: float) -> tuple[float, str]:
    """(factor, unit) that shows `seconds` with its leading digits before the point: s from 1 s,
    ms from 1 ms, µs below (a 1.4 ms DLRM step labelled 0.001 s said nothing)."""
    for factor, unit in ((1.0, "s"), (1e3, "ms")):
        if abs(seconds) * factor >= 1:
            return factor, unit
    return 1e6, "µs"


def step_cdf_figure(
    samples_s: np.ndarray, deterministic_s: float, within_s: float | None = None, title: str = ""
) -> Any:
    """Empirical CDF of sampled step times, with the deterministic step, p50/p95/p99 and an optional
    deadline (with the probability of meeting it) marked, in the unit of the deterministic step (time_unit)."""
    plt = pyplot()
    factor, unit = time_unit(deterministic_s)
    x = np.sort(np.asarray(samples_s))
    y = np.arange(1, x.size + 1) / x.size
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    ax.plot(x * factor, y, lw=1.6, label=f"Monte Carlo, {x.size:,} samples")
    det = deterministic_s * factor
    ax.axvline(det, color="0.4", ls="--", lw=1, label=f"deterministic {det:.3f} {unit}")
    for q, style in ((50, ":"), (95, "-."), (99, "-")):
        v = float(np.percentile(x, q)) * factor
        ax.axvline(v, color="C3", ls=style, lw=0.8, label=f"p{q} {v:.3f} {unit}")
    if within_s is not None:
        share = float(np.mean(x <= within_s))
        line = within_s * factor
        ax.axvline(line, color="C2", lw=2, label=f"deadline {line:.3f} {unit}: P = {share:.1%}")
    ax.set_xlabel(f"step time ({unit})")
    ax.set_ylabel("P(step ≤ t)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def step_cdf_png(
    samples_s: np.ndarray,
    deterministic_s: float,
    path: str | Path,
    title: str = "",
    inputs: Iterable[str | Path | None] = (),
) -> Path:
    """The step-time CDF (step_cdf_figure) as a PNG file."""
    fig = step_cdf_figure(samples_s, deterministic_s, title=title)
    png = io.BytesIO()
    fig.savefig(png, format="png")
    pyplot().close(fig)
    return write_output(path, png.getvalue(), inputs, (".png",))
