"""Guarded streaming of large profiler JSON files (Kineto traces, PyTorch execution traces): open
plain or gzip, refuse hostile nesting or strings before the parser sees them, and keep the file's
first and last bytes, where the small top-level keys lie."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

#: Bounds on hostile input, checked on the bytes as they stream by (before the JSON parser sees
#: them): Kineto nests a few levels (events, args, input dims) and its longest strings are kernel
#: names and stacks of a few KB; a 40,000-deep array or a 2 GiB string would exhaust the parser.
MAX_DEPTH = 256  # brackets are counted without regard to strings: a string full of `[` counts too
MAX_STRING_BYTES = 16 << 20  # bytes between two quote characters


class TraceError(ValueError):
    """A trace file is unreadable, malformed or truncated; the message names the file."""


def _open(path: Path) -> BinaryIO:
    with path.open("rb") as probe:
        magic = probe.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else path.open("rb")  # type: ignore[return-value]


class _HeadTailReader:
    """File wrapper that keeps the first and last EDGE_BYTES it hands out. Kineto's small top-level
    keys (distributedInfo, baseTimeNanoseconds, …) lie before or after the huge traceEvents array,
    so they are found there without a second pass or holding the file in memory. It also refuses
    input nested deeper than MAX_DEPTH or with a string longer than MAX_STRING_BYTES (numpy over
    each chunk: no Python work per byte)."""

    EDGE_BYTES = 1 << 18
    CHUNK = 1 << 20

    def __init__(self, raw: BinaryIO, path: Path) -> None:
        self.raw, self.path, self.head, self.tail = raw, path, bytearray(), bytearray()
        self.total = self.depth = self.since_quote = 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(self.CHUNK if n < 0 else min(n, self.CHUNK))
        self._guard(data)
        if len(self.head) < self.EDGE_BYTES:
            self.head += data[: self.EDGE_BYTES - len(self.head)]
        self.tail += data
        del self.tail[: max(0, len(self.tail) - self.EDGE_BYTES)]
        self.total += len(data)
        return data

    def _guard(self, data: bytes) -> None:
        if not data:
            return
        b = np.frombuffer(data, dtype=np.uint8)
        step = (b == ord("[")).astype(np.int64) + (b == ord("{")) - (b == ord("]")) - (b == ord("}"))
        depth = self.depth + np.cumsum(step)
        if depth.max() > MAX_DEPTH:
            raise TraceError(f"{self.path}: nested deeper than {MAX_DEPTH} levels; not a profiler trace")
        self.depth = int(depth[-1])
        quotes = np.flatnonzero(b == ord('"'))
        run = self.since_quote + (quotes[0] if quotes.size else b.size)
        inner = int(np.diff(quotes).max()) if quotes.size > 1 else 0
        if max(run, inner) > MAX_STRING_BYTES:
            raise TraceError(f"{self.path}: a string longer than {MAX_STRING_BYTES >> 20} MiB; not a profiler trace")
        self.since_quote = b.size - 1 - int(quotes[-1]) if quotes.size else run

    def edges(self) -> str:
        if self.total <= self.EDGE_BYTES:  # the whole file is in the head
            return bytes(self.head).decode("utf-8", "replace")
        return (bytes(self.head) + b"\n" + bytes(self.tail)).decode("utf-8", "replace")


def _top_level_value(text: str, key: str) -> Any:
    """The JSON value after `"key":` in text, or None."""
    m = re.search(rf'"{key}"\s*:\s*', text)
    if not m:
        return None
    try:
        return json.JSONDecoder().raw_decode(text, m.end())[0]
    except json.JSONDecodeError:
        return None
