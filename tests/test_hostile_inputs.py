"""Every case of the hostile-input corpus (tests/hostile_inputs.py) ends in one clear error line and
exit code 2: no traceback, no output file, no exhausted memory; and real traces mutated at random
replay with finite numbers or fail the same way (hypothesis)."""

from __future__ import annotations

import gzip
import json
import math
import traceback
from pathlib import Path

import pytest
from hostile_inputs import cases
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from itercast.cli import app

CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input_is_one_clear_error(case, tmp_path: Path):
    for name, data in case.files.items():
        (tmp_path / name).write_bytes(data)
    before = {p.name for p in tmp_path.iterdir()}
    res = CliRunner().invoke(app, [a.replace("{dir}", str(tmp_path)) for a in case.args])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and (res.exception is None or isinstance(res.exception, SystemExit))
    assert res.output.startswith("error:"), res.output  # ours or click's usage error, in one line (cli/app.Group)
    assert case.message in res.output, res.output
    # one line, or one per problem (indented continuations)
    assert all(line.startswith("  ") for line in res.output.strip().splitlines()[1:]), res.output
    assert {p.name for p in tmp_path.iterdir()} == before  # nothing written beside the inputs


REAL = Path(__file__).resolve().parents[1] / "data" / "measured" / "h100_traces" / "gpt_8.kineto.json.gz"
FIELDS = ("ts", "dur", "tid", "ph", "cat", "name", "args")
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


@pytest.fixture(scope="module")
def real_events() -> dict:
    return json.loads(gzip.decompress(REAL.read_bytes()))


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(FIELDS), VALUES, st.booleans()), max_size=6))
def test_mutated_real_traces_replay_or_fail_in_one_line(real_events, tmp_path_factory, mutations):
    doc = json.loads(json.dumps(real_events))
    events = doc["traceEvents"]
    for index, field, value, delete in mutations:
        event = events[index % len(events)]
        if delete:
            event.pop(field, None)
        else:
            event[field] = value
    path = tmp_path_factory.mktemp("mutated") / "t.json"
    path.write_text(json.dumps(doc, allow_nan=True))
    res = CliRunner().invoke(app, ["replay", str(path), "--json"])
    if res.exit_code == 0:
        out = json.loads(res.output)  # strict JSON: no NaN or Infinity
        assert all(math.isfinite(s["replayed_s"]) and math.isfinite(s["measured_s"]) for s in out["steps"])
        assert math.isfinite(out["replayed_span_s"])
    else:
        trace = "".join(traceback.format_exception(res.exception)) if res.exception else ""
        assert res.exit_code == 2, res.output + trace
        assert res.output.startswith("error:") and res.output.strip().count("\n") == 0, res.output
