"""The profiling database: one SQLite file of kernel and collective timings (never pickle).

Schema (version SCHEMA_VERSION; a file of another major version is refused with the reason):
  meta(key, value)                      schema_version, created_by
  imports(key, rows)                    importer:device:SHA-256 of each imported file (imports are idempotent)
  devices(id, name, fingerprint)        fingerprint: JSON describing the machine that measured
  measurements(id, device_id, family, op, dtype, size, group_size, nodes, time_s, time_std_s,
               repeats, params, source)
    family: gemm | conv | attention | elementwise | norm | embedding | memcpy | collective | p2p | host
    size: FLOPs (gemm, conv, attention) or bytes (everything else); time_s: median seconds; time_std_s:
    the spread of the repeats (0 when the source gives one number); params: JSON of the exact shape
    or configuration; source: where the row came from (file, repository@commit, or 'measured').
    A configuration measured in several passes (`itercast profile run --passes N`, minutes apart,
    against a host whose speed drifts) has one row per pass, params["pass"] = 1 … N (a row without
    it, from a single pass, counts as pass 1); `measurements` reads the passes of one configuration
    as one row: the median of their times, the total spread (within and between them) and the
    summed repeats.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from itercast.measurements import MAX_MEASURED_S, Measurement, ProfileError

SCHEMA_VERSION = "1.1"  # 1.1: the imports table (1.0 files gain it when opened for writing)
BUSY_S = 60.0  # how long a writer waits for another to finish
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS devices (id INTEGER PRIMARY KEY, name TEXT NOT NULL, fingerprint TEXT NOT NULL UNIQUE)",
    """CREATE TABLE IF NOT EXISTS measurements (
        id INTEGER PRIMARY KEY, device_id INTEGER NOT NULL REFERENCES devices(id),
        family TEXT NOT NULL, op TEXT NOT NULL, dtype TEXT NOT NULL, size REAL NOT NULL,
        group_size INTEGER NOT NULL, nodes INTEGER NOT NULL, time_s REAL NOT NULL,
        time_std_s REAL NOT NULL, repeats INTEGER NOT NULL, params TEXT NOT NULL, source TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS by_family ON measurements (device_id, family, op)",
    "CREATE TABLE IF NOT EXISTS imports (key TEXT PRIMARY KEY, rows INTEGER NOT NULL)",
)


def _while_locked(step: Callable[[], object]) -> None:
    """Run `step`, again while another process holds the lock (up to BUSY_S seconds): switching a
    new file to WAL needs it exclusively, and SQLite answers "locked" there without waiting."""
    deadline = time.monotonic() + BUSY_S
    while True:
        try:
            step()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def file_key(path: Path, importer: str, device: str) -> str:
    """What identifies an import: the importer, the device and the SHA-256 of the file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return f"{importer}:{device}:{digest.hexdigest()}"


#: params that a pass measured (differ from pass to pass): not part of a configuration's identity
PASS_KEYS = ("pass", "host_issue_s")


def _merge_passes(passes: list[Measurement]) -> Measurement:
    """One row for a configuration measured in several passes: the median of their times (and of
    their host issue times, where measured); as spread, the square root of the mean within-pass
    variance plus the variance between the passes' times."""
    times = np.array([m.time_s for m in passes])
    within = np.mean([m.time_std_s**2 for m in passes])
    first = passes[0]
    issue = [m.params["host_issue_s"] for m in passes if "host_issue_s" in m.params]
    return Measurement(
        first.family,
        first.op,
        first.size,
        float(np.median(times)),
        first.dtype,
        first.group_size,
        first.nodes,
        float(np.sqrt(within + times.var())),
        sum(m.repeats for m in passes),
        {k: v for k, v in first.params.items() if k not in PASS_KEYS}
        | {"passes": len(passes)}
        | ({"host_issue_s": float(np.median(issue))} if issue else {}),
        first.source,
    )


class ProfileDB:
    """Open (or create) a profiling database file; `readonly` opens an existing one without writing.

    Safe under concurrent writers (several `profile import`s into one new file): SQLite in WAL mode
    with a busy timeout, the schema created inside one immediate transaction, each import's rows and
    its record committed together. An import records its source file's SHA-256: importing the same
    file again adds nothing."""

    def __init__(self, path: str | Path, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        if readonly and not self.path.is_file():
            raise ProfileError(f"{self.path}: no such profiling database")
        try:
            if readonly:
                self.conn = sqlite3.connect(f"{self.path.absolute().as_uri()}?mode=ro", uri=True, timeout=BUSY_S)
                self.conn.execute("PRAGMA foreign_keys = ON")
                self._init_schema()
            else:
                self.conn = sqlite3.connect(self.path, timeout=BUSY_S, isolation_level=None)
                self.conn.execute("PRAGMA foreign_keys = ON")
                _while_locked(lambda: self.conn.execute("PRAGMA journal_mode=WAL"))
                _while_locked(self._init_schema)
        except sqlite3.DatabaseError as exc:
            raise ProfileError(
                f"{self.path}: not a profiling database ({exc}); a table of measurements (Alpa's, nccl-tests', XLA's) "
                "becomes one with `itercast profile import KIND FILE --db DB`"
            ) from None

    def _write(self, sql_and_args: list[tuple[str, Any]]) -> None:
        """Statements in one immediate transaction (other writers wait up to BUSY_S seconds)."""
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            for sql, args in sql_and_args:
                c.execute(sql, args)
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise

    def _init_schema(self) -> None:
        c = self.conn
        if not self.readonly:
            c.execute("BEGIN IMMEDIATE")  # two creators of one new file: one creates, the other sees it
        try:
            tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if "meta" in tables:
                row = c.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
                found = row[0] if row else "?"
                if found.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
                    raise ProfileError(
                        f"{self.path}: schema version {found}; this itercast reads {SCHEMA_VERSION.split('.')[0]}.x "
                        f"(re-import the sources, or use the itercast that wrote it)"
                    )
            elif tables:
                raise ProfileError(
                    f"{self.path}: an SQLite file, but not a profiling database (tables {sorted(tables)})"
                )
            elif self.readonly:
                raise ProfileError(f"{self.path}: an empty SQLite file, not a profiling database")
            if not self.readonly:
                for statement in SCHEMA:
                    c.execute(statement)
                c.executemany(
                    "INSERT OR IGNORE INTO meta VALUES (?, ?)",
                    [("schema_version", SCHEMA_VERSION), ("created_by", "itercast")],
                )
                c.execute("COMMIT")
        except BaseException:
            if not self.readonly:
                c.execute("ROLLBACK")
            raise

    def device(self, name: str, fingerprint: dict[str, Any]) -> int:
        """Id of the device with this fingerprint (created if new)."""
        fp = json.dumps(fingerprint, sort_keys=True)
        self._write([("INSERT OR IGNORE INTO devices (name, fingerprint) VALUES (?, ?)", (name, fp))])
        return int(self.conn.execute("SELECT id FROM devices WHERE fingerprint=?", (fp,)).fetchone()[0])

    def devices(self) -> list[tuple[int, str, dict[str, Any]]]:
        return [(i, n, json.loads(f)) for i, n, f in self.conn.execute("SELECT id, name, fingerprint FROM devices")]

    def choose_device(self, device: int | None, option: str = "--device") -> int:
        """The device asked for, or the only one; else an error naming the ids there are."""
        ids = [i for i, _, _ in self.devices()]
        if device is None and len(ids) != 1:
            raise ProfileError(f"{self.path}: {len(ids)} devices; choose one with {option} ({ids})")
        chosen = device if device is not None else ids[0]
        if chosen not in ids:
            raise ProfileError(f"{self.path}: no device {chosen} (have {ids})")
        return chosen

    def add(self, device_id: int, rows: Iterable[Measurement], source_key: str | None = None) -> int:
        """Insert measurements (all checked first: a bad row inserts nothing). Returns the count: 0 when
        `source_key` (a source file's digest, see `file_key`) was imported before."""
        rows = list(rows)
        for r in rows:
            try:
                r.check()
            except ProfileError as exc:  # an imported row names its file (Measurement.source)
                raise ProfileError(f"{r.source}: {exc}" if r.source else str(exc)) from None
        values = [
            (
                device_id,
                r.family,
                r.op,
                r.dtype,
                float(r.size),
                int(r.group_size),
                int(r.nodes),
                float(r.time_s),
                float(r.time_std_s),
                int(r.repeats),
                json.dumps(r.params, sort_keys=True),
                r.source,
            )
            for r in rows
        ]
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            if source_key is not None:
                seen = c.execute("SELECT 1 FROM imports WHERE key=?", (source_key,)).fetchone()
                if seen:
                    c.execute("ROLLBACK")
                    return 0
                c.execute("INSERT INTO imports VALUES (?, ?)", (source_key, len(values)))
            c.executemany(
                "INSERT INTO measurements (device_id, family, op, dtype, size, group_size, nodes, time_s, "
                "time_std_s, repeats, params, source) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                values,
            )
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        return len(rows)

    def measurements(
        self, device_id: int | None = None, family: str | None = None, op: str | None = None, passes: bool = False
    ) -> Iterator[Measurement]:
        """The rows selected, in the order stored; a configuration's passes merged into one row (at the
        place of its first pass) unless `passes` (then every pass as stored)."""
        rows = self._rows(device_id, family, op)
        if passes:
            yield from rows
            return
        merged: dict[str, list[Measurement]] = {}  # configurations in order of first appearance
        for m in rows:
            config = {k: v for k, v in m.params.items() if k not in PASS_KEYS}
            key = json.dumps([m.family, m.op, m.dtype, m.size, m.group_size, m.nodes, config], sort_keys=True)
            merged.setdefault(key, []).append(m)
        for group in merged.values():  # rows of the same fields that no pass produced stay apart
            if any("pass" in m.params for m in group):
                yield _merge_passes(group)
            else:
                yield from group

    def _rows(self, device_id: int | None, family: str | None, op: str | None) -> Iterator[Measurement]:
        sql = (
            "SELECT family, op, size, time_s, dtype, group_size, nodes, time_std_s, repeats, params, source "
            "FROM measurements WHERE 1=1"
        )
        args: list[Any] = []
        for col, val in (("device_id", device_id), ("family", family), ("op", op)):
            if val is not None:
                sql += f" AND {col}=?"
                args.append(val)
        try:
            rows = self.conn.execute(sql + " ORDER BY id", args).fetchall()
        except sqlite3.DatabaseError as exc:  # a damaged page reads only when its rows are asked for
            raise ProfileError(f"{self.path}: the measurements cannot be read ({exc})") from None
        for family, op_, size, time_s, dtype, group, nodes, std, repeats, params, source in rows:
            number = isinstance(time_s, int | float) and isinstance(size, int | float)
            if not number or not 0 < time_s <= MAX_MEASURED_S or not math.isfinite(size) or size < 0:
                raise ProfileError(
                    f"{self.path}: measurement {family}/{op_}: expected 0 < time_s ≤ {MAX_MEASURED_S:.0f} s and a "
                    f"finite size ≥ 0; got time_s={time_s!r}, size={size!r}"
                )
            fields = self._params(params)
            yield Measurement(family, op_, size, time_s, dtype, group, nodes, std, repeats, fields, source)

    def _params(self, text: Any) -> dict[str, Any]:
        """A row's `params` column: a JSON object (ProfileError otherwise, naming the database)."""
        try:
            params = json.loads(text)
        except (TypeError, ValueError):
            params = None
        if not isinstance(params, dict):
            raise ProfileError(f"{self.path}: a measurement's params: expected a JSON object; got {str(text)[:60]!r}")
        return params

    def arrays(self, **where: Any) -> dict[str, np.ndarray]:
        """Columns of the selected rows as arrays (size, time_s, time_std_s, group_size, nodes)."""
        rows = list(self.measurements(**where))
        return {
            k: np.array([getattr(r, k) for r in rows], dtype=float)
            for k in ("size", "time_s", "time_std_s", "group_size", "nodes")
        }

    def count(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0])

    def close(self) -> None:
        self.conn.close()
