"""`itercast report`: one self-contained HTML file (opens without a network) for a job's predicted
step, its variability, a plan search, or a trace replay.

Figures are drawn by matplotlib as inline SVG (text kept as text), tables are HTML; no script, no
external resource. What a job's report shows: the step by cause per pipeline stage (stacked bars),
the simulated step's timeline (a Gantt chart of every stream of every stage, the same data as the
Perfetto export), memory per GPU against the GPU's capacity, the step-time CDF of the Monte Carlo
with a deadline drawn, and the critical path by family; a search adds its time × memory front and
top plans; a replay the measured vs replayed time per step and the critical path by kernel class.
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from itercast.errors import ConfigError
from itercast.graph.execgraph import Category
from itercast.memory import MemoryEstimate
from itercast.report.plots import pyplot, step_cdf_figure
from itercast.sim.analysis import Breakdown
from itercast.sim.engine import SimResult

#: breakdown parts, in stacking order, with their colours (matplotlib's tab10)
PARTS = {
    "compute_s": ("compute", "#1f77b4"),
    "exposed_comm_s": ("exposed communication", "#d62728"),
    "bubble_s": ("pipeline bubble", "#ff7f0e"),
    "host_overhead_s": ("host overhead", "#9467bd"),
    "idle_s": ("idle", "#c7c7c7"),
}
CATEGORY_COLOUR = {Category.COMPUTE: "#1f77b4", Category.COMMUNICATION: "#d62728", Category.HOST: "#9467bd"}
MAX_TIMELINE_TASKS = 200_000  # a Gantt chart of more bars is unreadable and slow to draw


@dataclass(frozen=True)
class Section:
    title: str
    body_html: str


def _pyplot() -> Any:
    plt = pyplot()
    plt.rcParams["svg.fonttype"] = "none"  # text stays text: smaller, searchable
    return plt


def _svg(fig: Any) -> str:
    """The figure as an inline <svg> element (closed: matplotlib keeps nothing)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    _pyplot().close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def table_html(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def stage_breakdown_svg(per_stage: Sequence[Breakdown], unit: str = "stage") -> str:
    """One horizontal bar per pipeline stage (a DLRM: per rank, `unit`), stacked by cause; each sums to
    the step time."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 0.5 + 0.4 * len(per_stage)), dpi=100)
    left = np.zeros(len(per_stage))
    y = np.arange(len(per_stage))
    for key, (label, colour) in PARTS.items():
        width = np.array([getattr(b, key) for b in per_stage])
        if width.any():
            ax.barh(y, width, left=left, color=colour, label=label, height=0.7)
        left += width
    ax.set_yticks(y, [f"{unit.split()[-1]} {b.rank}" for b in per_stage])
    ax.invert_yaxis()
    ax.set_xlabel("seconds of the step")
    ax.legend(fontsize=8, ncols=3, loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.6 / len(per_stage)))
    ax.grid(axis="x", alpha=0.3)
    return _svg(fig)


def timeline_svg(sim: SimResult) -> str:
    """Gantt chart of the simulated step: a row per stream of each stage, a bar per task, coloured by
    category (compute, communication, host)."""
    g = sim.graph
    if g.num_tasks > MAX_TIMELINE_TASKS:
        raise ConfigError(f"the step has {g.num_tasks:,} tasks; a timeline is drawn for ≤ {MAX_TIMELINE_TASKS:,}")
    plt = _pyplot()
    resources = np.unique(g.resource)
    order = sorted(resources.tolist(), key=lambda r: (int(g.resource_rank[r]), g.kinds[g.resource_kind[r]]))
    fig, ax = plt.subplots(figsize=(10, 0.6 + 0.28 * len(order)), dpi=100)
    duration = sim.end_s - sim.start_s
    for row, res in enumerate(order):
        on = np.flatnonzero((g.resource == res) & (duration > 0))
        for category, colour in CATEGORY_COLOUR.items():
            sel = on[g.category[on] == category]
            if sel.size:
                spans = np.stack([sim.start_s[sel], duration[sel]], axis=1)
                ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=colour, linewidth=0)
    ax.set_yticks(range(len(order)), [f"{g.resource_rank[r]} {g.kinds[g.resource_kind[r]]}" for r in order])
    ax.invert_yaxis()
    ax.set_xlim(0, sim.step_time_s)
    ax.set_xlabel("seconds (stage, stream)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in CATEGORY_COLOUR.values()]
    ax.legend(handles, ["compute", "communication", "host"], fontsize=8, loc="upper right")
    return _svg(fig)


def memory_svg(mem: MemoryEstimate) -> str:
    """Memory of the most loaded GPU, stacked by kind, against the GPU's capacity."""
    plt = _pyplot()
    parts = {
        "weights": mem.weights_bytes,
        "gradients": mem.gradients_bytes,
        "optimizer": mem.optimizer_bytes,
        "activations": mem.activations_bytes,
        "reserved": mem.reserved_bytes,
    }
    fig, ax = plt.subplots(figsize=(7.5, 1.6), dpi=100)
    left = 0.0
    for i, (name, nbytes) in enumerate(parts.items()):
        ax.barh([0], [nbytes / 2**30], left=left, color=f"C{i}", label=f"{name} {nbytes / 2**30:.1f}")
        left += nbytes / 2**30
    cap = mem.capacity_bytes / 2**30
    ax.axvline(cap, color="black", lw=1.5, ls="--")
    ax.text(cap, 0.45, f" HBM {cap:.0f} GiB", va="bottom", fontsize=8)
    ax.set_yticks([0], [f"stage {mem.stage}"])
    ax.set_xlabel("GiB per GPU" + (" — does not fit" if mem.oom else ""))
    ax.legend(fontsize=8, ncols=5, loc="upper center", bbox_to_anchor=(0.5, -0.6))
    return _svg(fig)


def cdf_svg(samples_s: np.ndarray, deterministic_s: float, within_s: float | None) -> str:
    """The step-time CDF (plots.step_cdf_figure) with the deadline drawn."""
    _pyplot()
    return _svg(step_cdf_figure(samples_s, deterministic_s, within_s))


def seconds_by_family_svg(runs: Sequence[dict[str, Any]], title: str) -> str:
    """Seconds of the critical path per family (kernel class), longest first."""
    plt = _pyplot()
    total: dict[str, float] = {}
    for r in runs:
        total[r["family"]] = total.get(r["family"], 0.0) + r["end_s"] - r["start_s"]
    items = sorted(total.items(), key=lambda kv: -kv[1])[:15]
    fig, ax = plt.subplots(figsize=(7.5, 0.5 + 0.3 * max(len(items), 1)), dpi=100)
    ax.barh([k for k, _ in items], [v for _, v in items], color="#1f77b4")
    ax.invert_yaxis()
    ax.set_xlabel(title)
    ax.grid(axis="x", alpha=0.3)
    return _svg(fig)


def pareto_svg(points: Sequence[dict[str, Any]], front: Sequence[dict[str, Any]]) -> str:
    """Step time against memory per GPU of the ranked plans, the time × memory front drawn."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 3.6), dpi=100)
    ax.scatter(
        [p["memory_per_gpu_bytes"] / 2**30 for p in points],
        [p["fast_step_time_s"] for p in points],
        s=12,
        alpha=0.5,
        label="top plans",
    )
    ordered = sorted(front, key=lambda p: p["memory_per_gpu_bytes"])
    ax.plot(
        [p["memory_per_gpu_bytes"] / 2**30 for p in ordered],
        [p["fast_step_time_s"] for p in ordered],
        "o-",
        color="C3",
        label="time × memory front",
    )
    ax.set_xlabel("GiB per GPU")
    ax.set_ylabel("step time (s, fast path)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _svg(fig)


def replay_steps_svg(steps: Sequence[dict[str, Any]]) -> str:
    """Measured and replayed seconds of every step (rank r, step s), side by side."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 3.2), dpi=100)
    x = np.arange(len(steps))
    ax.bar(x - 0.2, [s["measured_s"] for s in steps], width=0.4, label="measured")
    ax.bar(x + 0.2, [s["replayed_s"] for s in steps], width=0.4, label="replayed")
    ax.set_xticks(x, [f"r{s['rank']} s{s['step']}" for s in steps], rotation=90, fontsize=7)
    ax.set_ylabel("seconds")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _svg(fig)


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
.sub { color: #555; } table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; } th { background: #f2f2f2; }
svg { max-width: 100%; height: auto; } .note { color: #555; font-size: 0.9em; }
"""


def render_html(title: str, subtitle: str, sections: Sequence[Section]) -> str:
    """The whole document: one file, inline styles and figures, nothing fetched."""
    body = "".join(f"<section><h2>{html.escape(s.title)}</h2>{s.body_html}</section>" for s in sections)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        f'<h1>{html.escape(title)}</h1><p class="sub">{html.escape(subtitle)}</p>{body}</body></html>\n'
    )
