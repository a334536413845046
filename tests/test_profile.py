"""Profiling database: round trip, versions, importers (good and malformed input), microbenchmarks."""

from __future__ import annotations

import sqlite3

import pytest
from typer.testing import CliRunner

from itercast.cli import app
from itercast.profile.db import Measurement, ProfileDB, ProfileError
from itercast.profile.importers import import_alpa, import_nccl_log, import_nccl_tidy

LOG = """# nThread 1 nGpus 1 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20
#  Rank  0 Group  0 Pid 1 on host device  0 [0000:19:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid 2 on host device  1 [0000:2d:00] NVIDIA H100 80GB HBM3
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
           0             0     float     sum      -1     1.00    0.00    0.00      0     1.00    0.00    0.00      0
        1024           256     float     sum      -1    16.94    0.06    0.11      0    16.17    0.06    0.11      0
     1048576        262144     float     sum      -1    27.37   38.31   67.04      0    26.93   38.94   68.14      0
"""

ALPA = (
    "\n".join(
        [
            "cluster_key,mesh_hosts,mesh_gpus_per_host,op,n_groups,group_size,replica_groups,dtype,x,x_meaning,bytes,"
            "time_s,available_memory_per_device",
            'default,2,8,all_reduce,8,2,"[[0, 8], [1, 9]]",f16,1024,num_elements,2048,3.5e-05,1',
            'default,1,16,all_reduce,1,16,"[[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]]",'
            "f16,1024,num_elements,2048,inf,1",
            "default,1,1,dot,1,1,[[0]],f16,2000000,flops,0,1e-05,1",
        ]
    )
    + "\n"
)


def test_round_trip_keeps_every_field(tmp_path):
    db = ProfileDB(tmp_path / "p.db")
    dev = db.device("cpu", {"cpu": "x"})
    row = Measurement("gemm", "mm", 2e9, 0.01, "fp32", time_std_s=1e-4, repeats=7, params={"m": 1000}, source="s")
    db.add(dev, [row])
    again = ProfileDB(tmp_path / "p.db")
    assert list(again.measurements(family="gemm")) == [row] and again.device("cpu", {"cpu": "x"}) == dev


def test_a_bad_row_inserts_nothing(tmp_path):
    db = ProfileDB(tmp_path / "p.db")
    dev = db.device("cpu", {})
    with pytest.raises(ProfileError, match="expected time_s > 0"):
        db.add(dev, [Measurement("gemm", "mm", 1.0, 0.01), Measurement("gemm", "mm", 1.0, 0.0)])
    assert db.count() == 0


def test_other_schema_versions_and_other_files_are_refused_with_the_reason(tmp_path):
    path = tmp_path / "p.db"
    ProfileDB(path).close()
    with sqlite3.connect(path) as c:
        c.execute("UPDATE meta SET value='9.0' WHERE key='schema_version'")
    with pytest.raises(ProfileError, match=r"schema version 9\.0; this itercast reads 1\.0\.x"):
        ProfileDB(path)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as c:
        c.execute("CREATE TABLE t (x)")
    with pytest.raises(ProfileError, match="not a profiling database"):
        ProfileDB(other)
    (tmp_path / "junk.db").write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(ProfileError, match="not a profiling database"):
        ProfileDB(tmp_path / "junk.db")


def test_nccl_tests_log_import(tmp_path):
    log = tmp_path / "all_reduce.log"
    log.write_text(LOG)
    db = ProfileDB(tmp_path / "p.db")
    counts = import_nccl_log(db, log, "all_reduce", 1, "H100")
    rows = list(db.measurements())
    assert counts == {"imported": 2, "skipped (empty message)": 1}
    assert [(r.size, r.time_s, r.group_size) for r in rows] == [
        (1024.0, pytest.approx(16.94e-6), 2),
        (1048576.0, pytest.approx(27.37e-6), 2),
    ]
    log.write_text(LOG + "        2048   512  float\\n")
    with pytest.raises(ProfileError, match=r"all_reduce\.log: line 8: expected ≥ 8 columns"):
        import_nccl_log(db, log, "all_reduce", 1, "H100")


def test_alpa_import_skips_unprofiled_rows_and_counts_nodes_from_groups(tmp_path):
    csv = tmp_path / "alpa.csv"
    csv.write_text(ALPA)
    db = ProfileDB(tmp_path / "p.db")
    assert import_alpa(db, csv) == {"imported": 2, "skipped (not profiled: time inf or 0)": 1}
    coll = next(db.measurements(family="collective"))
    assert (coll.op, coll.size, coll.group_size, coll.nodes) == ("all_reduce", 2048.0, 2, 2)  # ranks 0 and 8: 2 hosts
    dot = next(db.measurements(family="gemm"))
    assert (dot.size, dot.params) == (2e6, {"n": 100})
    csv.write_text(ALPA.replace("3.5e-05", "fast"))
    with pytest.raises(ProfileError, match=r"alpa\.csv: line 2: `time_s` should be a number"):
        import_alpa(ProfileDB(tmp_path / "q.db"), csv)


def test_tidy_nccl_import_needs_its_columns(tmp_path):
    bad = tmp_path / "tidy.csv"
    bad.write_text("system,collective,size_B\nX,all_reduce,1024\n")
    with pytest.raises(ProfileError, match="missing column `oop_time_us`"):
        import_nccl_tidy(ProfileDB(tmp_path / "p.db"), bad)


def test_microbenchmarks_measure_once_and_resume(tmp_path):
    pytest.importorskip("torch")
    from itercast.profile.microbench import QUICK, configs, run

    db = ProfileDB(tmp_path / "p.db")
    first = run(db, quick=True, families=("gemm", "elementwise"), warmup=1, repeats=2)
    expected = sum(1 for f, _, _ in configs(QUICK) if f in ("gemm", "elementwise"))
    assert first == {"measured": expected, "already there": 0}
    assert run(db, quick=True, families=("gemm", "elementwise"), warmup=1, repeats=2) == {
        "measured": 0,
        "already there": expected,
    }
    gemm = {tuple(m.params[k] for k in "mnk"): m for m in db.measurements(family="gemm")}
    assert gemm[(64, 64, 64)].size == 2 * 64**3 and gemm[(64, 64, 64)].repeats == 2
    assert all(m.time_s > 0 and m.time_std_s >= 0 for m in gemm.values())


def test_cli_import_and_bad_kind(tmp_path):
    csv = tmp_path / "alpa.csv"
    csv.write_text(ALPA)
    runner = CliRunner()
    res = runner.invoke(app, ["profile", "import", "alpa", str(csv), "--db", str(tmp_path / "p.db")])
    assert res.exit_code == 0 and "imported: 2" in res.output
    res = runner.invoke(app, ["profile", "import", "nccl", str(csv), "--db", str(tmp_path / "p.db")])
    assert res.exit_code == 2 and "expected one of alpa" in res.output


def test_alpa_import_drops_empty_shards_and_make_monotonic_points(tmp_path):
    """An all-gather over 16 ranks: 8 elements leave every rank nothing; 32 elements at exactly
    twice the time of 16 is make_monotonic's clamp (same bandwidth to 1e-6); 64 is measured."""
    head = ALPA.splitlines()[0]
    group = '"[[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]]"'
    lines = [
        f"default,2,8,all_gather,1,16,{group},f16,{x},num_elements,{2 * x},{t},1"
        for x, t in ((8, 1.7e-05), (16, 5.0e-04), (32, 1.0e-03), (64, 1.1e-03))
    ]
    csv = tmp_path / "alpa.csv"
    csv.write_text("\n".join([head, *lines]) + "\n")
    db = ProfileDB(tmp_path / "p.db")
    assert import_alpa(db, csv) == {
        "imported": 2,
        "skipped (empty message or per-rank shard)": 1,
        "skipped (synthetic: make_monotonic clamp)": 1,
    }
    assert [m.size for m in db.measurements(family="collective")] == [32.0, 128.0]


def test_collectives_run_across_two_gloo_processes_and_resume(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from itercast.profile import microbench

    monkeypatch.setitem(microbench.QUICK, "collective", {"sizes": [4096], "ranks": [2]})
    db = ProfileDB(tmp_path / "p.db")
    assert microbench.run(db, quick=True, families=("collective",), warmup=1, repeats=3) == {
        "measured": 4,
        "already there": 0,
    }
    rows = {m.op: m for m in db.measurements(family="collective")}
    assert sorted(rows) == ["all_gather", "all_reduce", "alltoall", "reduce_scatter"]
    assert all((m.size, m.group_size, m.nodes) == (4096.0, 2, 1) and 3 <= m.repeats <= 200 for m in rows.values())
    assert all(m.time_s > 0 and m.params == {"ranks": 2, "bytes": 4096} for m in rows.values())
    assert microbench.run(db, quick=True, families=("collective",), warmup=1, repeats=3)["measured"] == 0
