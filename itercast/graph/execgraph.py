"""A columnar DAG of tasks on resources (DESIGN.md §3).

A task has a duration in seconds (a scalar, or a vector of samples for Monte Carlo), runs on one
resource (a rank's host thread or one of its GPU streams), and carries a category (what the
breakdown charges it to), an op family (what cost model times it) and a name. Names, families and
resource kinds are interned to integer ids. Tasks on one resource run in the order they were
added (stream order). A collective is a group of member tasks, one per participating rank, that
start together.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum

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


class GraphBuilder:
    """Append-only builder. Dependencies must name tasks already added."""

    def __init__(self) -> None:
        self._names, self._families, self._kinds = Interner(), Interner(), Interner()
        self._res: dict[tuple[int, int], int] = {}
        self._res_rank: list[int] = []
        self._res_kind: list[int] = []
        self._dur: list[float] = []
        self._resource: list[int] = []
        self._cat: list[int] = []
        self._fam: list[int] = []
        self._name: list[int] = []
        self._coll: list[int] = []
        self._src: list[int] = []
        self._dst: list[int] = []
        self._lat: list[float] = []
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
        tid = len(self._dur)
        for d in deps:
            if not 0 <= d < tid:
                raise ValueError(f"task {name}: dependency {d} is not an existing task")
            self._src.append(d)
            self._dst.append(tid)
            self._lat.append(latency_s)
        self._dur.append(duration_s)
        self._resource.append(resource)
        self._cat.append(int(category))
        self._fam.append(self._families(family))
        self._name.append(self._names(name))
        self._coll.append(collective)
        return tid

    @property
    def num_tasks(self) -> int:
        return len(self._dur)

    def duration(self, task: int) -> float:
        return self._dur[task]

    def set_duration(self, task: int, duration_s: float) -> None:
        """Correct a task's duration after the fact (e.g. a synchronisation's own time, once its wait is known)."""
        if duration_s < 0:
            raise ValueError(f"task {task}: negative duration {duration_s}")
        self._dur[task] = duration_s

    def join_collective(self, task: int, collective: int) -> None:
        """Make an existing task a member of `collective` (members matched after they were added)."""
        self._coll[task] = collective

    def edge(self, src: int, dst: int, latency_s: float = 0.0) -> None:
        """An extra dependency between existing tasks."""
        n = len(self._dur)
        if not (0 <= src < n and 0 <= dst < n):
            raise ValueError(f"edge {src}->{dst}: both ends must be existing tasks (0..{n - 1})")
        self._src.append(src)
        self._dst.append(dst)
        self._lat.append(latency_s)

    def build(self) -> ExecGraph:
        return ExecGraph(
            duration_s=np.asarray(self._dur, dtype=np.float64),
            resource=np.asarray(self._resource, dtype=np.int32),
            category=np.asarray(self._cat, dtype=np.int8),
            family=np.asarray(self._fam, dtype=np.int32),
            name=np.asarray(self._name, dtype=np.int32),
            collective=np.asarray(self._coll, dtype=np.int64),
            edge_src=np.asarray(self._src, dtype=np.int64),
            edge_dst=np.asarray(self._dst, dtype=np.int64),
            edge_latency_s=np.asarray(self._lat, dtype=np.float64),
            resource_rank=np.asarray(self._res_rank, dtype=np.int32),
            resource_kind=np.asarray(self._res_kind, dtype=np.int32),
            names=self._names.names,
            families=self._families.names,
            kinds=self._kinds.names,
        )
