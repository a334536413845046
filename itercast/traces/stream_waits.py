"""Stream waits of a Kineto trace: which producer op each GPU op waited for on another stream (DESIGN.md §7)."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from itercast.traces.host_waits import EPS_US
from itercast.traces.kineto import RankTrace

WAIT_CALL = "cudaStreamWaitEvent"


def stream_wait_sources(t: RankTrace, call_of: np.ndarray, notes: Counter) -> dict[int, list[int]]:
    """Producer ops each GPU op waits for on other streams. One sweep over calls in time order.

    Explicit (a "Stream Wait Event" cuda_sync record names the producer stream and the
    cudaEventRecord): the next op launched on the waiting stream waits for the last op launched on
    the producer stream before that record. Otherwise (inferred from cudaStreamWaitEvent): the next
    op the calling thread launches waits for the latest-ending op launched before the call on
    another stream. Both only when the measured times allow it."""
    explicit = {int(w[3]): (int(w[0]), int(w[1]), int(w[2])) for w in t.stream_waits.tolist()}
    records = {rec for _, _, rec in explicit.values()}
    if WAIT_CALL not in t.names and not explicit:
        return {}
    ends = t.op_ts_us + t.op_dur_us
    op_of_call = dict(zip(call_of[call_of >= 0].tolist(), np.flatnonzero(call_of >= 0).tolist(), strict=True))
    wait_name = t.names.index(WAIT_CALL) if WAIT_CALL in t.names else -1
    next_launch: dict[int, int] = {}  # wait call -> the op it holds back
    by_thread: dict[int, list[int]] = defaultdict(list)  # inferred waits still looking for a launch
    by_stream: dict[int, list[int]] = defaultdict(list)  # explicit waits still looking for a launch
    last_per_stream: dict[int, int] = {}
    snapshot: dict[int, dict[int, int]] = {}  # record correlation -> streams' last ops at the record
    found: list[tuple[int, dict[int, int], int | None]] = []  # (wait call, candidates, explicit producer stream)
    for c in np.argsort(t.call_ts_us, kind="stable").tolist():
        corr = int(t.call_corr[c])
        if corr in records:
            snapshot[corr] = dict(last_per_stream)
        if corr in explicit:
            stream, producer, rec = explicit[corr]
            by_stream[stream].append(c)
            found.append((c, snapshot.get(rec, {}), producer))
        elif int(t.call_name[c]) == wait_name:
            by_thread[int(t.call_tid[c])].append(c)
            found.append((c, dict(last_per_stream), None))
        k = op_of_call.get(c)
        if k is not None:
            for w in by_thread.pop(int(t.call_tid[c]), []) + by_stream.pop(int(t.op_stream[k]), []):
                next_launch[w] = k
            last_per_stream[int(t.op_stream[k])] = k
    out: dict[int, list[int]] = defaultdict(list)
    for w, last, named in found:
        nxt = next_launch.get(w)
        if nxt is None:
            notes["stream waits with no later launch"] += 1
            continue
        if named is not None:
            cands = [last[named]] if named in last else []
        else:
            cands = [k for s_, k in last.items() if s_ != t.op_stream[nxt]]
        cands = [k for k in cands if ends[k] <= t.op_ts_us[nxt] + EPS_US]
        if cands:
            out[nxt].append(max(cands, key=lambda k: ends[k]))
            notes["stream waits from cuda_sync records" if named is not None else "stream waits inferred"] += 1
        else:
            notes["stream waits the measured times rule out"] += 1
    return out
