"""validation/sharding.py's combination of two profiling databases (with_families_from): the rows of
one, and the families it lacks from the other, on rows written by hand (nothing is measured)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
from sharding import with_families_from

from itercast.measurements import Measurement
from itercast.profile.db import ProfileDB


def _row(family: str, op: str, time_s: float, **params: object) -> Measurement:
    return Measurement(family, op, 1024.0, time_s, "fp32", params=dict(params))


def test_families_the_first_lacks_come_from_the_second(tmp_path: Path):
    corun = ProfileDB(tmp_path / "corun.db")
    c = corun.device("cpu", {"threads": 1, "corun": True})
    corun.add(c, [_row("embedding", "embedding_bag_fwd", t, rows=10, **{"pass": p}) for p, t in ((1, 1.0), (2, 3.0))])
    corun.add(c, [_row("elementwise", "add", 0.5, elements=256)])
    alone = ProfileDB(tmp_path / "alone.db")
    a = alone.device("cpu", {"threads": 1})
    alone.add(a, [_row("embedding", "embedding_bag_fwd", 10.0, rows=10), _row("gemm", "mm", 7.0, m=4)])

    both = with_families_from(corun, alone)
    assert [fp for _, _, fp in both.devices()] == [{"threads": 1, "corun": True}]  # the first database's device
    rows = {(m.family, m.op): m for m in both.measurements()}
    assert sorted(rows) == [("elementwise", "add"), ("embedding", "embedding_bag_fwd"), ("gemm", "mm")]
    # the first database's two passes stay passes: read as their median (1.0 + 3.0) / 2 = 2.0, not alone's 10.0
    assert rows["embedding", "embedding_bag_fwd"].time_s == pytest.approx(2.0)
    assert rows["embedding", "embedding_bag_fwd"].params["passes"] == 2
    assert rows["gemm", "mm"].time_s == pytest.approx(7.0)  # the family the first lacks, from the second


def test_named_operators_come_from_the_second_and_replace_the_firsts(tmp_path: Path):
    first = ProfileDB(tmp_path / "first.db")
    f = first.device("cpu", {"flush_mib": 64})
    first.add(f, [_row("gemm", "mm", 4.0, m=4), _row("embedding", "embedding_bag_fwd", 1.0, rows=10)])
    first.add(f, [_row("embedding", "embedding_bag_update", 2.0, rows=10)])
    second = ProfileDB(tmp_path / "second.db")
    s = second.device("cpu", {"flush_mib": 16})
    second.add(s, [_row("gemm", "mm", 3.0, m=4), _row("embedding", "embedding_bag_fwd", 0.5, rows=10)])
    second.add(s, [_row("embedding", "embedding_bag_update", 1.5, rows=10), _row("elementwise", "add", 9.0)])

    both = with_families_from(first, second, ops=("embedding_bag_fwd",))
    rows = {(m.family, m.op): m.time_s for m in both.measurements()}
    # the named operator from the second (0.5, not 1.0); the other rows of its family and the rest from the
    # first; a family the first lacks (elementwise) from the second
    assert rows == {
        ("gemm", "mm"): 4.0,
        ("embedding", "embedding_bag_fwd"): 0.5,
        ("embedding", "embedding_bag_update"): 2.0,
        ("elementwise", "add"): 9.0,
    }


def test_the_fastest_is_reproducible_only_when_both_halves_of_the_rounds_name_it():
    from sharding_tasks import reproducible_fastest

    # a: 10 ms in every round; b: 9 ms in rounds 0, 2 (even), 11 ms in rounds 1, 3 (odd)
    drift = {"a": {k: [0.010] for k in range(4)}, "b": {0: [0.009], 1: [0.011], 2: [0.009], 3: [0.011]}}
    assert reproducible_fastest(drift) is None  # even rounds: b; odd rounds: a
    steady = {"a": {k: [0.010, 0.012] for k in range(4)}, "b": {k: [0.009, 0.0095] for k in range(4)}}
    assert reproducible_fastest(steady) == "b"
