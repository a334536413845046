"""Placement from a measured speed map (stochastic/placement.py map_speeds, read_speed_map), by hand on a
two-rank graph, and every bad speed map as one line (file, field, expected, got), exit 2 on the CLI."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from itercast.cli import app
from itercast.errors import ConfigError
from itercast.graph.execgraph import Category, GraphBuilder
from itercast.stochastic.placement import map_speeds, read_speed_map


def two_ranks():
    """Rank 0 computes 1 s, rank 1 computes 2 s, side by side: the step is the slower of the two."""
    b = GraphBuilder()
    b.task("a", b.resource(0, "compute"), 1.0, Category.COMPUTE, "gemm")
    b.task("b", b.resource(1, "compute"), 2.0, Category.COMPUTE, "gemm")
    return b.build()


def test_the_slow_gpus_go_together_to_the_rank_that_can_afford_them():
    # 2 GPUs per rank, GPU 1 at 0.6 and GPU 2 at 0.8. Rank order: rank 0 {0, 1} runs at 0.6, rank 1
    # {2, 3} at 0.8: max(1/0.6, 2/0.8) = 2.5 s. Best: both slow GPUs on rank 0 (its slowest 0.6), rank 1
    # at full speed: max(1/0.6, 2/1) = 2 s; the other way max(1, 2/0.6) = 3.333 s. Gain 2.5/2 = 1.25
    m = map_speeds(two_ranks(), 2, np.array([1.0, 0.6, 0.8, 1.0]))
    assert m.naive_s == pytest.approx(2.5) and m.best_s == pytest.approx(2.0) and m.gain == pytest.approx(1.25)
    assert m.best_gpus == ((1, 2), (0, 3)) and m.method == "exhaustive" and m.baseline_s == 2.0


def test_a_speed_map_names_gpus_or_nodes(tmp_path):
    path = tmp_path / "speeds.csv"
    path.write_text("gpu,speed\n1,0.6\n2,0.8\n")
    assert read_speed_map(path, 4, 2).tolist() == [1.0, 0.6, 0.8, 1.0]  # unnamed GPUs run at 1
    path.write_text("node,speed\n1,0.9\n")
    assert read_speed_map(path, 4, 2).tolist() == [1.0, 1.0, 0.9, 0.9]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu,speed\n4,0.9\n", "gpu 4: the job has 4 gpus"),
        ("node,speed\n2,0.9\n", "node 2: the job has 2 nodes"),
        ("gpu,speed\n1,0\n", "speed: expected a finite number > 0; got 0"),
        ("gpu,speed\n1,nan\n", "speed: expected a finite number > 0; got nan"),
        ("gpu,speed\n1,-2\n", "speed: expected a finite number > 0; got -2"),
        ("gpu,speed\none,1\n", "expected an integer gpu and a number speed"),
        ("rank,factor\n1,1\n", "header: expected columns gpu,speed or node,speed"),
        ("gpu,speed\n1,0.5\n1,0.6\n", "gpu 1 named twice"),
        ("gpu,speed\n0,1\n1,1\n2,1\n3,1\n0,1\n", "more rows than the job's 4 gpus"),
    ],
)
def test_a_bad_speed_map_is_one_line_naming_file_line_and_field(tmp_path, text, message):
    path = tmp_path / "speeds.csv"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_speed_map(path, 4, 2)


def test_the_cli_refuses_a_speed_map_of_gpus_the_job_does_not_have(tmp_path):
    path = tmp_path / "speeds.csv"
    path.write_text("gpu,speed\n5000,0.8\n")  # the example has 1,024 GPUs
    result = CliRunner().invoke(app, ["variability", "--example", "--samples", "100", "--speed-map", str(path)])
    assert result.exit_code == 2 and "gpu 5000: the job has 1024 gpus" in result.output
    assert len(result.output.strip().splitlines()) == 1
