"""A columnar DAG of tasks on resources (DESIGN.md §3).

A task has a duration in seconds (a scalar, or a vector of samples for Monte Carlo), runs on one
resource (a rank's host thread or one of its GPU streams), and carries a category (what the
breakdown charges it to), an op family (what cost model times it) and a name. Names, families and
resource kinds are interned to integer ids. Tasks on one resource run in the order they were
added (stream order). A collective is a group of member tasks, one per participating rank, that
start together.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np


class Category(IntEnum):
    """What the step-time breakdown charges a task to."""

    COMPUTE = 0
    COMMUNICATION = 1
    HOST = 2


class Interner:
    """Strings ↔ dense integer ids."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []

    def __call__(self, name: str) -> int:
        found = self.ids.get(name)
        if found is None:
            found = self.ids[name] = len(self.names)
            self.names.append(name)
        return found


@dataclass
class ExecGraph:
    """Immutable columnar task graph. Build one with `GraphBuilder`.

    Arrays (n tasks, e edges, r resources):
      duration_s[n], resource[n], category[n], family[n], name[n], collective[n] (-1: none);
      edge_src[e], edge_dst[e], edge_latency_s[e]; resource_rank[r], resource_kind[r].
    """

    duration_s: np.ndarray
    resource: np.ndarray
    category: np.ndarray
    family: np.ndarray
    name: np.ndarray
    collective: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_latency_s: np.ndarray
    resource_rank: np.ndarray
    resource_kind: np.ndarray
    names: list[str]
    families: list[str]
    kinds: list[str]
    _order: np.ndarray | None = field(default=None, repr=False)

    @property
    def num_tasks(self) -> int:
        return int(self.duration_s.shape[0])

    def task_label(self, task: int) -> str:
        """`name@rank:kind` for messages."""
        res = int(self.resource[task])
        return f"{self.names[self.name[task]]}@{self.resource_rank[res]}:{self.kinds[self.resource_kind[res]]}"

    def with_durations(self, duration_s: np.ndarray) -> ExecGraph:
        """The same graph with other durations (shape (n,) or (n, samples)); shares structure."""
        if duration_s.shape[0] != self.num_tasks:
            raise ValueError(f"duration_s has {duration_s.shape[0]} rows; graph has {self.num_tasks} tasks")
        clone = ExecGraph(**{**self.__dict__, "duration_s": duration_s})
        clone._order = self._order
        return clone


class _Columns:
    """Columns filled a row at a time (Python lists, cheap per row) or a block at a time (numpy
    arrays, cheap per element); joined once by `array()`."""

    def __init__(self, dtypes: dict[str, type]) -> None:
        self.dtypes = dtypes
        self.rows: dict[str, list] = {k: [] for k in dtypes}
        self.blocks: list[dict[str, np.ndarray]] = []
        self.starts: list[int] = []  # first row of each block, rows kept in the order they came
        self.size = 0

    def flush(self) -> None:
        first = next(iter(self.rows.values()))
        if first:
            count = len(first)
            self.blocks.append({k: np.asarray(v, dtype=self.dtypes[k]) for k, v in self.rows.items()})
            self.starts.append(self.size - count)
            self.rows = {k: [] for k in self.dtypes}

    def extend(self, count: int, **values: np.ndarray | float | int) -> int:
        self.flush()
        first = self.size
        self.blocks.append(
            {k: np.broadcast_to(np.asarray(values[k], dtype=self.dtypes[k]), (count,)).copy() for k in self.dtypes}
        )
        self.starts.append(first)
        self.size += count
        return first

    def get(self, name: str, row: int) -> Any:
        pending_start = self.size - len(self.rows[name])
        if row >= pending_start:
            return self.rows[name][row - pending_start]
        block = bisect.bisect_right(self.starts, row) - 1
        return self.blocks[block][name][row - self.starts[block]].item()

    def array(self, name: str) -> np.ndarray:
        self.flush()
        parts = [b[name] for b in self.blocks]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtypes[name])


class GraphBuilder:
    """Append-only builder. Dependencies must name tasks already added."""

    def __init__(self) -> None:
        self._names, self._families, self._kinds = Interner(), Interner(), Interner()
        self._res: dict[tuple[int, int], int] = {}
        self._res_rank: list[int] = []
        self._res_kind: list[int] = []
        self._tasks = _Columns(
            {
                "dur": np.float64,
                "resource": np.int32,
                "cat": np.int8,
                "fam": np.int32,
                "name": np.int32,
                "coll": np.int64,
            }
        )
        self._edges = _Columns({"src": np.int64, "dst": np.int64, "lat": np.float64})
        self._dur_override: dict[int, float] = {}
        self._coll_override: dict[int, int] = {}
        self._num_collectives = 0

    def resource(self, rank: int, kind: str) -> int:
        """The resource `kind` (e.g. 'compute', 'host', 'dp_comm') of `rank`, created on first use."""
        key = (rank, self._kinds(kind))
        found = self._res.get(key)
        if found is None:
            found = self._res[key] = len(self._res_rank)
            self._res_rank.append(rank)
            self._res_kind.append(key[1])
        return found

    def rank_of(self, resource: int) -> int:
        """The rank a resource (from `resource`) belongs to."""
        return self._res_rank[resource]

    def new_collective(self) -> int:
        """A fresh collective id; pass it to `task(collective=...)` for each member."""
        self._num_collectives += 1
        return self._num_collectives - 1

    def task(
        self,
        name: str,
        resource: int,
        duration_s: float,
        category: Category,
        family: str,
        deps: Iterable[int] = (),
        latency_s: float = 0.0,
        collective: int = -1,
    ) -> int:
        """Add a task after its dependencies (each with the same edge latency); return its id."""
        if duration_s < 0:
            raise ValueError(f"task {name}: negative duration {duration_s}")
        tasks, edges = self._tasks, self._edges
        tid = tasks.size
        rows = edges.rows
        for d in deps:
            if not 0 <= d < tid:
                raise ValueError(f"task {name}: dependency {d} is not an existing task")
            rows["src"].append(d)
            rows["dst"].append(tid)
            rows["lat"].append(latency_s)
            edges.size += 1
        rows = tasks.rows
        rows["dur"].append(duration_s)
        rows["resource"].append(resource)
        rows["cat"].append(int(category))
        rows["fam"].append(self._families(family))
        rows["name"].append(self._names(name))
        rows["coll"].append(collective)
        tasks.size += 1
        return tid

    @property
    def num_tasks(self) -> int:
        return self._tasks.size

    def name_id(self, name: str) -> int:
        return self._names(name)

    def family_id(self, family: str) -> int:
        return self._families(family)

    def duration(self, task: int) -> float:
        found = self._dur_override.get(task)
        return found if found is not None else float(self._tasks.get("dur", task))

    def set_duration(self, task: int, duration_s: float) -> None:
        """Correct a task's duration after the fact (e.g. a synchronisation's own time, once its wait is known)."""
        if duration_s < 0:
            raise ValueError(f"task {task}: negative duration {duration_s}")
        self._dur_override[task] = duration_s

    def join_collective(self, task: int, collective: int) -> None:
        """Make an existing task a member of `collective` (members matched after they were added)."""
        self._coll_override[task] = collective

    def add_tasks(
        self,
        name_ids: np.ndarray,
        resource: np.ndarray,
        duration_s: np.ndarray,
        category: np.ndarray,
        family_ids: np.ndarray,
    ) -> int:
        """Append many tasks at once (ids from name_id/family_id, resources from resource()); no edges.
        Returns the id of the first. Tasks keep their order on each resource."""
        if duration_s.size and float(np.min(duration_s)) < 0:
            raise ValueError("add_tasks: negative duration")
        return self._tasks.extend(
            int(duration_s.shape[0]),
            dur=duration_s,
            resource=resource,
            cat=category,
            fam=family_ids,
            name=name_ids,
            coll=-1,
        )

    def add_edges(self, src: np.ndarray, dst: np.ndarray, latency_s: np.ndarray | float = 0.0) -> None:
        """Append many dependencies between existing tasks."""
        n = self._tasks.size
        if src.size and (min(int(src.min()), int(dst.min())) < 0 or max(int(src.max()), int(dst.max())) >= n):
            raise ValueError(f"add_edges: both ends must be existing tasks (0..{n - 1})")
        self._edges.extend(int(src.shape[0]), src=src, dst=dst, lat=latency_s)

    def edge(self, src: int, dst: int, latency_s: float = 0.0) -> None:
        """An extra dependency between existing tasks."""
        n = self._tasks.size
        if not (0 <= src < n and 0 <= dst < n):
            raise ValueError(f"edge {src}->{dst}: both ends must be existing tasks (0..{n - 1})")
        rows = self._edges.rows
        rows["src"].append(src)
        rows["dst"].append(dst)
        rows["lat"].append(latency_s)
        self._edges.size += 1

    def build(self) -> ExecGraph:
        t, e = self._tasks, self._edges
        duration = t.array("dur")
        collective = t.array("coll")
        if self._dur_override:
            duration[list(self._dur_override)] = list(self._dur_override.values())
        if self._coll_override:
            collective[list(self._coll_override)] = list(self._coll_override.values())
        return ExecGraph(
            duration_s=duration,
            resource=t.array("resource"),
            category=t.array("cat"),
            family=t.array("fam"),
            name=t.array("name"),
            collective=collective,
            edge_src=e.array("src"),
            edge_dst=e.array("dst"),
            edge_latency_s=e.array("lat"),
            resource_rank=np.asarray(self._res_rank, dtype=np.int32),
            resource_kind=np.asarray(self._res_kind, dtype=np.int32),
            names=self._names.names,
            families=self._families.names,
            kinds=self._kinds.names,
        )
