"""Plots of results. Needs matplotlib (pip install 'itercast[plot]'); the analysis never does."""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from itercast.errors import ConfigError
from itercast.user_files import write_output


def step_cdf_png(
    samples_s: np.ndarray,
    deterministic_s: float,
    path: str | Path,
    title: str = "",
    inputs: Iterable[str | Path | None] = (),
) -> Path:
    """Empirical CDF of sampled step times, with the deterministic step and p50/p95/p99 marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("plots need matplotlib: pip install 'itercast[plot]'") from None
    x = np.sort(np.asarray(samples_s))
    y = np.arange(1, x.size + 1) / x.size
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    ax.plot(x, y, lw=1.6, label=f"Monte Carlo, {x.size:,} samples")
    ax.axvline(deterministic_s, color="0.4", ls="--", lw=1, label=f"deterministic {deterministic_s:.3f} s")
    for q, style in ((50, ":"), (95, "-."), (99, "-")):
        v = float(np.percentile(x, q))
        ax.axvline(v, color="C3", ls=style, lw=0.8, label=f"p{q} {v:.3f} s")
    ax.set_xlabel("step time (s)")
    ax.set_ylabel("P(step ≤ t)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    return write_output(path, png.getvalue(), inputs)
