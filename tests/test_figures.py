"""README figures recomputed (itercast/figures.py): the cheap ones hold, and the check and the
rewrite work on a README written here."""

from __future__ import annotations

import pytest

from itercast import figures
from itercast.figures import NUMBER, Figure

TEXT = "A step of 1,234.5 s, worst −2.0% and +0.4%, 7 plans.\n"
# the values "recomputed": the step and the worst drifted beyond their tolerance, the best and the count did not
HAND = (
    Figure("step", "of " + NUMBER + " s", lambda: 2345.67, 0.05),
    Figure("worst", "worst " + NUMBER + "%", lambda: -3.26, 0.05),
    Figure("best", "and " + NUMBER + "%", lambda: 0.43, 0.05),
    Figure("plans", NUMBER + " plans", lambda: 7, 0),
)


def test_the_cheap_readme_figures_are_within_their_tolerance() -> None:
    drifts = figures.recompute(figures.chosen(cheap_only=True), figures.README.read_text(encoding="utf-8"))
    drifted = [f"{d.figure.name}: README {d.readme_text}, recomputed {d.value:.6g}" for d in drifts if d.drifted]
    assert not drifted, "run `python -m itercast.figures --write`:\n" + "\n".join(drifted)


def test_write_replaces_only_the_drifted_figures_in_the_readme_format() -> None:
    drifts = figures.recompute(HAND, TEXT)
    assert [d.drifted for d in drifts] == [True, True, False, False]  # |0.43 − 0.4| = 0.03 ≤ 0.05
    new = figures.rewritten(TEXT, drifts)
    # 2345.67 at one decimal with separators; −3.26 at one decimal with the README's minus sign
    assert new == "A step of 2,345.7 s, worst −3.3% and +0.4%, 7 plans.\n"
    assert not any(d.drifted for d in figures.recompute(HAND, new))


def test_check_names_figure_readme_and_recomputed_value_and_exits_1(tmp_path, monkeypatch, capsys) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(TEXT, encoding="utf-8")
    monkeypatch.setattr(figures, "FIGURES", HAND)
    assert figures.main(["--check", "--readme", str(readme)]) == 1
    out = capsys.readouterr().out
    assert "step: README 1,234.5, recomputed 2,345.7" in out and "worst: README −2.0, recomputed −3.3" in out
    assert "2 of 4 figures within tolerance" in out
    assert figures.main(["--write", "--readme", str(readme)]) == 0
    assert readme.read_text(encoding="utf-8") == "A step of 2,345.7 s, worst −3.3% and +0.4%, 7 plans.\n"
    assert figures.main(["--check", "--readme", str(readme)]) == 0


def test_a_pattern_matching_twice_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("7 plans, then 8 plans.\n", encoding="utf-8")
    monkeypatch.setattr(figures, "FIGURES", HAND[3:])
    assert figures.main(["--check", "--readme", str(readme)]) == 2
    assert capsys.readouterr().err.strip() == f"{readme}: figure 'plans': its pattern matches 2 times; expected once"


@pytest.mark.parametrize(
    ("value", "like", "written"), [(-1.0, "+2.0", "−1.0"), (3.0, "−2.5", "+3.0"), (1e6, "7", "1000000")]
)
def test_a_rewritten_number_keeps_sign_convention_and_decimals(value: float, like: str, written: str) -> None:
    assert figures._formatted(value, like) == written
