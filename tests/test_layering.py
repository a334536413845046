"""The package's floors: a module imports only from its own floor or lower ones, so no two packages
import each other (every import counts, those inside functions too)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "itercast"
#: lowest first. sim runs any ExecGraph and knows no workload, so it sits under the workloads that build
#: graphs (DESIGN.md §8 lists it above them); memory under workloads (the transformer graph reads the
#: stage parameters it counts); traces and profile above the cost models they feed and read; workload,
#: the one interface the commands use, over all of them; figures (README figures recomputed) beside the CLI;
#: checked_runs (the checking table's steps kept, to say beside a forecast) beside predict
FLOORS: list[set[str]] = [
    {"errors", "user_files", "measurements", "data_paths"},
    {"config"},
    {"hardware", "graph", "parallel"},
    {"costs"},
    {"sim"},
    {"memory"},
    {"workloads"},
    {"traces"},
    {"profile"},
    {"predict", "checked_runs"},
    {"replay"},
    {"search", "stochastic"},
    {"report"},
    {"workload"},
    {"cli", "__main__", "__init__", "figures"},
]


def floor_of(unit: str) -> int:
    for i, units in enumerate(FLOORS):
        if unit in units:
            return i
    raise AssertionError(f"{unit} has no floor in tests/test_layering.py FLOORS: place it")


def unit_of(module: str) -> str:
    """itercast.costs.analytic → costs; itercast.memory → memory; itercast → __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports() -> list[tuple[str, str, int]]:
    """(importing file, imported itercast module, line) for every import in the package."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("itercast"):
                out.append((str(path.relative_to(PACKAGE.parent)), node.module, node.lineno))
            elif isinstance(node, ast.Import):
                out += [(str(path.relative_to(PACKAGE.parent)), a.name, node.lineno) for a in node.names]
    return [(f, m, n) for f, m, n in out if m == "itercast" or m.startswith("itercast.")]


def test_no_module_imports_from_a_higher_floor() -> None:
    upward = []
    for path, module, line in imports():
        here = unit_of(".".join(Path(path).with_suffix("").parts))
        if floor_of(unit_of(module)) > floor_of(here):
            upward.append(f"{path}:{line} ({here}) imports {module} ({unit_of(module)})")
    assert not upward, "imports that climb a floor:\n" + "\n".join(upward)


def test_the_floor_check_sees_an_upward_import() -> None:
    # the check itself: memory importing the plan search, or costs the profiler, would be caught
    assert floor_of(unit_of("itercast.search.plan_space")) > floor_of("memory")
    assert floor_of(unit_of("itercast.profile.db")) > floor_of("costs")
    assert unit_of("itercast") == "__init__" and unit_of("itercast.memory") == "memory"
    assert any(m == "itercast.measurements" for _, m, _ in imports())
