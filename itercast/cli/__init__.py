"""Command line: `itercast predict | compare | search | slice | shard | replay | variability | report |
profile run|import | calibrate | presets | fields`.

Where things live: cli/app.py holds what every command shares (the app, the job options, errors,
output helpers); each area's commands live beside it in one module (predict_cmds: predict and
compare; presets_cmds: presets and fields; search_cmds, slice_cmds, shard_cmds, variability_cmds,
report_cmds, replay_cmds, calibration_cmds; et_cmds and et_ranks: `predict --et`). Importing them
registers them on `app`.
"""

from __future__ import annotations

import sys

# re-exported: `itercast.cli:app` is the console script; replay_cmds and tests import these from here
from itercast.cli.app import JsonOpt, _interrupted, app, console, echo_json, fail, working


def main() -> None:  # pragma: no cover - console entry for `python -m itercast`
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


from itercast.cli import (  # noqa: E402  (register the commands)
    calibration_cmds,
    predict_cmds,
    presets_cmds,
    replay_cmds,
    report_cmds,
    search_cmds,
    shard_cmds,
    slice_cmds,
    variability_cmds,
)

__all__ = [
    "JsonOpt",
    "_interrupted",
    "app",
    "calibration_cmds",
    "console",
    "echo_json",
    "fail",
    "main",
    "predict_cmds",
    "presets_cmds",
    "replay_cmds",
    "report_cmds",
    "search_cmds",
    "shard_cmds",
    "slice_cmds",
    "variability_cmds",
    "working",
]
