"""tools/mutants.py's list stays applicable: a mutant whose snippet the code no longer holds exactly once is
scored "not applicable" and silently stops checking its formula (three had, after session 52's edits)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import mutants  # noqa: E402


def test_every_mutant_finds_its_snippet_exactly_once_and_names_tests_that_exist():
    stale = []
    for n, m in enumerate(mutants.MUTANTS, start=1):
        text = (ROOT / "itercast" / m.file).read_text()
        if text.count(m.before) != 1:
            stale.append(f"{n} {m.file}: {m.breaks} ({text.count(m.before)} times)")
        if m.before == m.after:
            stale.append(f"{n} {m.file}: {m.breaks} (changes nothing)")
        for test in m.tests or mutants.TESTS[m.file]:
            if not (ROOT / test).is_file():
                stale.append(f"{n} {m.file}: {m.breaks} (no {test})")
    assert not stale, "\n".join(stale)
