"""Profiling database: round trip, versions, importers (good and malformed input), microbenchmarks."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from itercast.cli import app
from itercast.costs.aten_ops import OpCall, features
from itercast.measurements import Measurement, ProfileError
from itercast.profile.db import ProfileDB
from itercast.profile.importers import import_alpa, import_nccl_log, import_nccl_tidy, import_xla_collectives

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
    with pytest.raises(ProfileError, match="expected 0 < time_s ≤ 3600 s"):
        db.add(dev, [Measurement("gemm", "mm", 1.0, 0.01), Measurement("gemm", "mm", 1.0, 0.0)])
    assert db.count() == 0


def test_passes_of_a_configuration_read_as_their_median_with_the_total_spread(tmp_path):
    """Three passes of one mm (10, 12 and 20 ms, each ±1 ms over 5 repeats) read as one row:
    median 12 ms, spread sqrt(1 + var(10, 12, 20)) = sqrt(1 + 56/3) ms, 15 repeats; a row without
    passes is read as stored, and passes=True gives the rows as stored."""
    db = ProfileDB(tmp_path / "p.db")
    dev = db.device("cpu", {})
    one = [  # the host issue time each pass measured (on a GPU) differs too; its median is kept
        Measurement(
            "gemm", "mm", 2e9, t, "fp32", time_std_s=1e-3, repeats=5, params={"m": 1000, "pass": k, "host_issue_s": h}
        )
        for k, t, h in ((1, 0.010, 3e-5), (2, 0.020, 1e-5), (3, 0.012, 2e-5))
    ]
    plain = Measurement("gemm", "mm", 1e9, 0.004, "fp32", repeats=2, params={"m": 500})
    db.add(dev, [one[0], plain, *one[1:]])
    merged, alone = db.measurements()
    assert (merged.time_s, merged.repeats, merged.params) == (0.012, 15, {"m": 1000, "passes": 3, "host_issue_s": 2e-5})
    assert merged.time_std_s == pytest.approx(1e-3 * (1 + 56 / 3) ** 0.5)
    assert alone == plain
    assert list(db.measurements(passes=True)) == [one[0], plain, *one[1:]]


def test_other_schema_versions_and_other_files_are_refused_with_the_reason(tmp_path):
    path = tmp_path / "p.db"
    ProfileDB(path).close()
    with sqlite3.connect(path) as c:
        c.execute("UPDATE meta SET value='9.0' WHERE key='schema_version'")
    with pytest.raises(ProfileError, match=r"schema version 9\.0; this itercast reads 1\.x"):
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


XLA_HEADER = "device,opcode,element_type,dims,num_elements,num_replica_groups,num_devices_per_group,"
XLA_HEADER += "replica_groups_explicit,throughput_Bps\n"


def test_xla_collective_table_import(tmp_path):
    table = tmp_path / "xla.csv"
    table.write_text(
        XLA_HEADER
        + "sm_90,all-reduce,F32,65536,65536,1,8,0,4940892641\n"  # 256 KiB over 8 GPUs
        + "sm_90,reduce-scatter,BF16,512,512,2,4,0,100000000\n"  # a 1 KiB shard of a 4 KiB input
        + "sm_90,all-to-all,F32,1024,1024,2,4,0,155528554\n"
        + "sm_90,collective-permute,F32,4194304,4194304,,,0,75804898766\n"
    )
    db = ProfileDB(tmp_path / "p.db")
    counts = import_xla_collectives(db, table)
    assert counts["imported"] == 2 and sum(n for k, n in counts.items() if k.startswith("skipped")) == 2
    rows = {m.op: m for m in db.measurements(family="collective")}
    ar, rs = rows["all_reduce"], rows["reduce_scatter"]
    assert (ar.size, ar.group_size, ar.nodes, ar.dtype) == (262144, 8, 1, "f32")
    assert ar.time_s == pytest.approx(262144 / 4940892641)  # XLA: bytes transferred / throughput
    assert (rs.size, rs.group_size) == (4096, 4) and rs.time_s == pytest.approx(4096 / 1e8)
    table.write_text(XLA_HEADER + "sm_90,all-gather,S4,64,64,1,8,0,1000\n")
    with pytest.raises(ProfileError, match=r"xla.csv: line 2: `element_type` should be one of .*; got 'S4'"):
        import_xla_collectives(ProfileDB(tmp_path / "q.db"), table)
    table.write_text(XLA_HEADER.replace("throughput_Bps", "rate") + "sm_90,all-gather,F32,64,64,1,8,0,1000\n")
    with pytest.raises(ProfileError, match="line 2: missing column `throughput_Bps`"):
        import_xla_collectives(ProfileDB(tmp_path / "r.db"), table)


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


def test_microbenchmark_passes_each_store_a_row_and_resume(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from itercast.profile import microbench

    monkeypatch.setitem(microbench.QUICK, "elementwise", [1024])
    db = ProfileDB(tmp_path / "p.db")
    ops = len(microbench.ELEMENTWISE_OPS)
    single = microbench.run(db, quick=True, families=("elementwise",), warmup=1, repeats=2)
    assert single == {"measured": ops, "already there": 0}
    more = microbench.run(db, quick=True, families=("elementwise",), warmup=1, repeats=2, passes=3)
    assert more == {"measured": 2 * ops, "already there": ops}  # the single pass counts as pass 1
    assert sorted({m.params.get("pass") for m in db.measurements(passes=True)}, key=str) == [2, 3, None]
    merged = list(db.measurements())
    assert len(merged) == ops and all(m.repeats == 6 and m.params["passes"] == 3 for m in merged)
    assert microbench.run(db, quick=True, families=("elementwise",), passes=3)["measured"] == 0
    with pytest.raises(ProfileError, match="passes: expected 1 or more, got 0"):
        microbench.run(db, quick=True, families=("elementwise",), passes=0)


def test_cli_import_and_bad_kind(tmp_path):
    csv = tmp_path / "alpa.csv"
    csv.write_text(ALPA)
    runner = CliRunner()
    res = runner.invoke(app, ["profile", "import", "alpa", str(csv), "--db", str(tmp_path / "p.db")])
    assert res.exit_code == 0 and "imported: 2" in res.output
    res = runner.invoke(app, ["profile", "import", "nccl", str(csv), "--db", str(tmp_path / "p.db")])
    assert res.exit_code == 2 and "expected one of alpa" in res.output


def test_a_table_of_another_kind_or_a_bad_run_leaves_no_database(tmp_path):
    """A CSV without XLA's columns is refused (line 2, the first row), not imported as zero rows; neither it nor
    a run of an unknown family leaves the database it would have created."""
    other = tmp_path / "other.csv"
    other.write_text("layer,time_s\n1,2\n")
    with pytest.raises(ProfileError, match=r"line 2: missing column `opcode`"):
        import_xla_collectives(ProfileDB(tmp_path / "direct.db"), other)
    for args in (
        ["profile", "import", "xla-collective", str(other), "--db", str(tmp_path / "a.db")],
        ["profile", "run", "--db", str(tmp_path / "b.db"), "--families", "bogus"],
    ):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2, res.output
    assert not (tmp_path / "a.db").exists() and not (tmp_path / "b.db").exists()


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
        "skipped (empty message, shard or peer chunk)": 1,
        "skipped (synthetic: make_monotonic clamp)": 1,
    }
    assert [m.size for m in db.measurements(family="collective")] == [32.0, 128.0]


def test_alpa_all_to_all_keeps_only_non_empty_peer_chunks_as_per_rank_buffers(tmp_path):
    """An all-to-all over 8 ranks splits x/8 elements per rank 8 ways again: x = 32 leaves every
    peer chunk empty (x < 64) and is dropped; x = 64 (1 element per peer) and 128 are kept, stored
    as the per-rank buffer, bytes / 8."""
    head = ALPA.splitlines()[0]
    group = '"[[0, 2, 4, 6, 8, 10, 12, 14], [1, 3, 5, 7, 9, 11, 13, 15]]"'
    lines = [
        f"default,2,8,all_to_all,2,8,{group},f16,{x},num_elements,{2 * x},{t},1"
        for x, t in ((32, 1.8e-05), (64, 6.3e-04), (128, 6.2e-04))
    ]
    csv = tmp_path / "alpa.csv"
    csv.write_text("\n".join([head, *lines]) + "\n")
    db = ProfileDB(tmp_path / "p.db")
    assert import_alpa(db, csv) == {"imported": 2, "skipped (empty message, shard or peer chunk)": 1}
    rows = list(db.measurements(family="collective"))
    assert [(m.op, m.size, m.group_size, m.nodes) for m in rows] == [("alltoall", 16.0, 8, 2), ("alltoall", 32.0, 8, 2)]


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


def test_importing_the_same_file_twice_adds_nothing(tmp_path):
    log = tmp_path / "all_reduce.log"
    log.write_text(LOG)
    db = ProfileDB(tmp_path / "p.db")
    import_nccl_log(db, log, "all_reduce", 1, "H100")
    again = import_nccl_log(db, log, "all_reduce", 1, "H100")
    assert db.count() == 2 and again["imported"] == 0
    assert again["already imported (same file, nothing added)"] == 2
    log.write_text(LOG.replace("16.94", "17.94"))  # a changed file is a new import
    assert import_nccl_log(db, log, "all_reduce", 1, "H100")["imported"] == 2


def _import_worker(args: tuple[str, str, int]) -> int:
    db_path, log_path, n = args
    return import_nccl_log(ProfileDB(db_path), Path(log_path), "all_reduce", n, f"H100-{n}")["imported"]


def test_concurrent_imports_into_a_new_database_keep_every_row(tmp_path):
    from concurrent.futures import ProcessPoolExecutor

    logs = []
    for n in range(1, 5):
        log = tmp_path / f"all_reduce_{n}.log"
        log.write_text(LOG)
        logs.append((str(tmp_path / "new.db"), str(log), n))
    with ProcessPoolExecutor(max_workers=4) as pool:
        imported = list(pool.map(_import_worker, logs))
    assert imported == [2, 2, 2, 2] and ProfileDB(tmp_path / "new.db").count() == 8


def test_a_read_only_database_is_read_and_never_written(tmp_path):
    path = tmp_path / "p.db"
    db = ProfileDB(path)
    db.add(db.device("cpu", {"k": 1}), [Measurement("gemm", "mm", 1e6, 1e-3)])
    db.close()
    path.chmod(0o444)
    ro = ProfileDB(path, readonly=True)
    assert ro.count() == 1
    with pytest.raises(sqlite3.OperationalError):  # attempts to write fail; nothing is created
        ro.add(1, [Measurement("gemm", "mm", 1e6, 1e-3)])
    with pytest.raises(ProfileError, match="no such profiling database"):
        ProfileDB(tmp_path / "missing.db", readonly=True)


def test_a_one_thread_profile_is_another_device_and_the_update_is_measured(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from itercast.profile import microbench

    monkeypatch.setitem(microbench.QUICK, "pooling", [4])
    monkeypatch.setitem(microbench.QUICK, "distributions", ["uniform"])
    db = ProfileDB(tmp_path / "p.db")
    threads = torch.get_num_threads()
    try:
        assert microbench.run(db, quick=True, families=("embedding",), warmup=1, repeats=2, threads=1)["measured"] == 3
    finally:
        torch.set_num_threads(threads)
    ((device, _, fp),) = db.devices()
    assert fp["threads"] == 1
    update = [m for m in db.measurements(device_id=device) if m.op == "embedding_bag_update"]
    assert len(update) == 1 and update[0].params["call"]["name"] == "itercast::rowwise_adagrad_update"
    f = features(OpCall(**update[0].params["call"]))
    # QUICK: 512 bags × 4 lookups of a 10,000 × 64 table
    assert (f.family, f.size, f.dims["lookups"], f.dims["table_bytes"]) == (
        "embedding_bag_update",
        2048 * 256,
        2048,
        10_000 * 256,
    )


def test_another_flush_size_is_another_device(tmp_path, monkeypatch):
    """Rows timed after a 1 MiB flush are not the default's: a device of their own, measured anew."""
    pytest.importorskip("torch")
    from itercast.profile import microbench

    monkeypatch.setitem(microbench.QUICK, "pooling", [2])
    monkeypatch.setitem(microbench.QUICK, "distributions", ["uniform"])
    db = ProfileDB(tmp_path / "p.db")
    first = microbench.run(db, quick=True, families=("embedding",), warmup=1, repeats=1)
    again = microbench.run(db, quick=True, families=("embedding",), warmup=1, repeats=1, flush_bytes=1 << 20)
    assert first["measured"] == again["measured"] == 3 and again["already there"] == 0
    flushes = sorted(fp.get("flush_bytes", 0) for _, _, fp in db.devices())
    assert flushes == [0, 1 << 20]  # the default is not written into the fingerprint


@pytest.mark.parametrize(
    ("option", "param", "bad", "refusal"),
    [
        ("batches", "batch", "8,x", "expected whole numbers separated by commas"),  # bags per call
        ("dims", "dim", "0", "expected sizes in 1..10000000"),  # the tables' widths
    ],
)
def test_embedding_sizes_set_the_grid_and_bad_ones_are_refused(tmp_path, monkeypatch, option, param, bad, refusal):
    pytest.importorskip("torch")
    from itercast.profile import microbench

    monkeypatch.setitem(microbench.QUICK, "pooling", [2])
    monkeypatch.setitem(microbench.QUICK, "distributions", ["uniform"])
    db = ProfileDB(tmp_path / "p.db")
    sizes = {f"embedding_{option}": (8, 16)}
    counts = microbench.run(db, quick=True, families=("embedding",), warmup=1, repeats=1, **sizes)
    assert counts["measured"] == 2 * 3  # two sizes × forward, backward, update
    assert sorted({m.params[param] for m in db.measurements()}) == [8, 16]
    flag = f"--embedding-{option}"
    refused = CliRunner().invoke(
        app, ["profile", "run", "--db", str(tmp_path / "q.db"), "--families", "embedding", flag, bad]
    )
    assert refused.exit_code == 2 and f"{flag}: {refusal}" in refused.output
    assert not (tmp_path / "q.db").exists()


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ('default,2,8,all_reduce,8,2,"[[0, 8]]",f16,1024,num_elements,2048,-0.001,1', "`time_s`: expected seconds ≥ 0"),
        ('default,2,8,all_reduce,8,2,"[[0, 8]]",f16,1024,num_elements,2048,nan,1', "got nan"),
        ('default,2,8,all_reduce,8,2,"[[0, 8]]",f16,1024,num_elements,-100,3.5e-05,1', "got -100.0, 2"),
        ('default,2,8,all_reduce,8,0,"[[0, 8]]",f16,1024,num_elements,2048,3.5e-05,1', "got 2048.0, 0"),
    ],
)
def test_a_corrupt_alpa_row_is_one_line_naming_its_line_not_skipped_as_unprofiled(tmp_path, row, message):
    # Alpa writes inf for what it could not profile (skipped, counted); a negative or NaN time, a negative size or an
    # empty group is no measurement at all
    csv = tmp_path / "alpa.csv"
    csv.write_text(ALPA.splitlines()[0] + "\n" + row + "\n")
    res = CliRunner().invoke(app, ["profile", "import", "alpa", str(csv), "--db", str(tmp_path / "p.db")])
    assert res.exit_code == 2 and f"{csv}: line 2: " in res.output and message in res.output, res.output
