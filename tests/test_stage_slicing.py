"""Stage slicing: the exact DP equals brute force, hand-computed cases, the relaxation, `itercast slice`."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from helpers import tiny_job
from typer.testing import CliRunner

from itercast.cli import app
from itercast.search.layer_costs import job_layer_costs
from itercast.search.stage_slicing import LayerCosts, slice_best_stages, slice_exact, slice_relaxed


def stages_of(num_layers: int, k: int) -> list[list[tuple[int, int]]]:
    """Every way to cut layers 0..L−1 into k non-empty runs, as [(first, end), …]."""
    out = []
    for cuts in itertools.combinations(range(1, num_layers), k - 1):
        bounds = [0, *cuts, num_layers]
        out.append(list(itertools.pairwise(bounds)))
    return out


def step_s(per_stage: list[LayerCosts], runs: list[tuple[int, int]], m: int) -> float:
    """The step of one slicing, written out (Narayanan et al. SC'21 §2.2; Alpa eq. 2): a stage takes
    its layers' time plus the send after its last layer (the last stage sends nothing); with m
    micro-batches the step is (m − 1) × the slowest stage + the sum of the stages."""
    times = [
        c.time_s[a:e].sum() + (c.send_s[e - 1] if s < len(runs) - 1 else 0.0)
        for s, (c, (a, e)) in enumerate(zip(per_stage, runs, strict=True))
    ]
    return (m - 1) * max(times) + sum(times)


def fits(c: LayerCosts, run: tuple[int, int], s: int, k: int, m: int, memory: float) -> bool:
    """Stage s of k holds its layers' resident bytes and the activations of the micro-batches it
    has in flight: 1F1B's warm-up forwards and one more, min(k − s, m)."""
    a, e = run
    return c.static_bytes[a:e].sum() + c.activation_bytes[a:e].sum() * min(k - s, m) <= memory


def brute_force(costs: LayerCosts, k: int, m: int, memory: float = np.inf) -> float:
    """The least step over every slicing into k stages that fits (O(L^(k−1)) slicings)."""
    steps = [
        step_s([costs] * k, runs, m)
        for runs in stages_of(costs.num_layers, k)
        if all(fits(costs, run, s, k, m, memory) for s, run in enumerate(runs))
    ]
    return min(steps, default=np.inf)


@pytest.mark.parametrize("seed", range(12))
def test_exact_slicing_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    L = int(rng.integers(3, 10))
    k, m = int(rng.integers(1, min(L, 5) + 1)), int(rng.choice([1, 2, 8, 64]))
    costs = LayerCosts.of(rng.uniform(0.5, 3, L), rng.uniform(0, 1, L), rng.uniform(1, 3, L), rng.uniform(0, 1, L))
    memory = float(rng.choice([np.inf, 12.0, 8.0]))
    expected = brute_force(costs, k, m, memory)
    if not np.isfinite(expected):
        with pytest.raises(ValueError, match="no slicing"):
            slice_exact(costs, k, m, memory)
        return
    assert slice_exact(costs, k, m, memory).step_time_s == pytest.approx(expected)


def test_four_equal_layers_in_two_stages_by_hand():
    # stages of 2 + 2 layers, 1 s each; the first sends for 0.5 s: times 2.5 and 2;
    # step = (m − 1) · 2.5 + 4.5 = 9.5 for m = 3
    s = slice_exact(LayerCosts.of(np.ones(4), np.full(4, 0.5)), 2, 3)
    assert (s.boundaries, s.stage_times_s, s.step_time_s) == ([0, 2], [2.5, 2.0], 9.5)


def test_a_costly_send_moves_the_boundary():
    # sending after layer 1 costs 3 s, after layer 0 or 2 nothing: [0] | [1, 2, 3] or [0, 1, 2] | [3]
    costs = LayerCosts.of(np.ones(4), np.array([0.0, 3.0, 0.0, 0.0]))
    s = slice_exact(costs, 2, 1)
    assert s.step_time_s == 4.0 and s.boundaries in ([0, 1], [0, 3])


def test_memory_limit_forces_a_stage_off_the_heavy_layer():
    # layer 0 needs 3 bytes: with 4 per stage it cannot share a stage with two more layers
    costs = LayerCosts.of(np.ones(4), static_bytes=np.array([3.0, 1.0, 1.0, 1.0]))
    assert slice_exact(costs, 2, 1, memory_bytes=4.0).boundaries == [0, 2]
    assert slice_exact(costs, 2, 1, memory_bytes=3.0).boundaries == [0, 1]


def test_auto_picks_the_stage_count_with_the_least_step():
    # sends are free: more stages shorten the bottleneck; with 1 micro-batch they change nothing
    costs = LayerCosts.of(np.ones(6))
    assert len(slice_best_stages(costs, 64, 6).boundaries) == 6
    assert slice_best_stages(costs, 1, 6).step_time_s == 6.0


def test_relaxation_never_beats_the_exact_optimum_and_finds_it_on_even_layers():
    rng = np.random.default_rng(3)
    costs = LayerCosts.of(rng.uniform(1, 2, 24), rng.uniform(0, 0.2, 24))
    exact = slice_exact(costs, 4, 16)
    relaxed = slice_relaxed(costs, 4, 16, starts=4)
    assert relaxed.step_time_s >= exact.step_time_s - 1e-12 and len(relaxed.boundaries) == 4
    even = LayerCosts.of(np.ones(16))
    assert slice_relaxed(even, 4, 8, starts=2).boundaries == [0, 4, 8, 12]


def test_layer_costs_of_a_job_are_its_units():
    job = tiny_job(tensor_parallel=2, global_batch_size=8)
    costs, names = job_layer_costs(job)
    assert names[0] == "embedding" and names[-1] == "head" and costs.num_layers == 8 + 2
    assert costs.send_s[-1] == 0.0 and np.all(costs.send_s[:-1] > 0)
    layer_params = job.model.layer_params_per_rank(2)
    assert costs.static_bytes[1] == pytest.approx(layer_params * (2 + 4 + 12))  # bf16, fp32 grads, Adam


def test_slice_cli_from_a_csv(tmp_path):
    csv = tmp_path / "layers.csv"
    csv.write_text("layer,time_s,activation_bytes\n" + "".join(f"l{i},1.0,0\n" for i in range(6)))
    runner = CliRunner()
    out = runner.invoke(app, ["slice", "--layer-times", str(csv), "--stages", "3", "--microbatches", "4", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["boundaries"] == [0, 2, 4] and data["bottleneck_s"] == 2.0 and data["step_time_s"] == 12.0
    both = runner.invoke(app, ["slice", "--layer-times", str(csv), "--stages", "3", "--method", "both", "--json"])
    assert json.loads(both.stdout)["relaxed"]["gap"] >= 0


@pytest.mark.parametrize(
    "text,args,message",
    [
        ("layer,time_s\nl0,1\nl1,2\n", ["--stages", "3"], "--stages 3: expected 1..2"),
        ("layer,time_s\nl0,1\nl1,-2\n", [], "line 3, field time_s: expected a finite number ≥ 0"),
        ("layer,time_s\nl0,1\nl1\n", [], "line 3: 1 fields; the header has 2"),
        ("layer,seconds\nl0,1\n", [], "missing ['time_s']"),
        ("layer,time_s\nl0,nan\n", [], "expected a finite number"),
        # a probe's findings: a layer twice was taken as two; 1e308 s overflowed the step and blamed the memory
        ("layer,time_s\nl0,1\nl0,2\nl1,1\n", [], "layer 'l0' is given 2 times; expected one row a layer"),
        ("layer,time_s\nl0,1e308\nl1,1e308\n", [], "field time_s: expected a layer's seconds ≤ 3600; got 1e+308"),
        (
            "layer,time_s,memory_bytes\nl0,1,5e10\nl1,1,5e10\nl2,1,5e10\n",
            ["--stages", "2", "--memory-gib", "60"],
            "no slicing into 2 stages fits 60 GiB per stage",
        ),
    ],
)
def test_slice_cli_bad_input_is_one_line_and_exit_2(tmp_path, text, args, message):
    csv = tmp_path / "bad.csv"
    csv.write_text(text)
    out = CliRunner().invoke(app, ["slice", "--layer-times", str(csv), *args])
    assert out.exit_code == 2 and message in out.output


def test_uneven_stages_predict_by_graph_and_fast_path_alike():
    from itercast.memory import estimate_memory, stage_params
    from itercast.predict import predict
    from itercast.search.fast_estimate import FastEstimator

    base = {"tensor_parallel": 2, "pipeline_parallel": 2, "global_batch_size": 16}
    even, same = tiny_job(**base), tiny_job(**base, stage_layers=[4, 4])
    assert predict(same).step_time_s == predict(even).step_time_s
    assert estimate_memory(same) == estimate_memory(even)
    skew = tiny_job(**base, stage_layers=[2, 6])
    assert predict(skew).step_time_s > predict(even).step_time_s  # the 6-layer stage is the bottleneck
    mem = estimate_memory(skew)
    assert mem.stage == 1 and mem.weights_bytes == pytest.approx(stage_params(skew, 1)[1] * 2)
    assert stage_params(skew, 1)[1] - stage_params(skew, 0)[1] == pytest.approx(
        4 * skew.model.layer_params_per_rank(2)
        + 1000 * 256 / 2
        - 1000 * 256 / 2  # 4 more layers; untied head vs embedding
        + 256  # the final RMSNorm, whole on the last stage
    )
    interleaved = tiny_job(**base, schedule="interleaved-1f1b", virtual_pipeline=2, stage_layers=[1, 3, 3, 1])
    jobs = [skew, interleaved, tiny_job(**base, stage_layers=[5, 3]), tiny_job(**base, stage_layers=[6, 2])]
    fast = FastEstimator(skew.model, skew.system)
    # measured: −1.0%, +1.1%, +3.9%, +4.7% (the closed form lumps a stage's forward and backward;
    # a heavy first stage is where that shows)
    for job in jobs:
        assert fast.step_time_s([job])[0] == pytest.approx(predict(job).step_time_s, rel=0.05)


def test_a_job_slicing_feeds_predict(tmp_path):
    runner = CliRunner()
    args = ["--model", "llama3-8b", "--system", "dgx-h100", "--set", "plan.pipeline_parallel=4"]
    args += ["--set", "plan.global_batch_size=32"]
    out = runner.invoke(app, ["slice", *args, "--json"])
    assert out.exit_code == 0, out.output
    layers = json.loads(out.stdout)["stage_layers"]
    assert sum(layers) == 32 and len(layers) == 4
    pred = runner.invoke(app, ["predict", *args, "--set", f"plan.stage_layers={layers}", "--json"])
    assert pred.exit_code == 0, pred.output
    bad = runner.invoke(app, ["predict", *args, "--set", "plan.stage_layers=[8, 8, 8]"])
    assert bad.exit_code == 2 and "has 3 entries; expected pipeline_parallel(4)" in bad.output


def brute_force_groups(groups, k: int, m: int) -> float:
    """Every assignment of the k stages to groups in which each group hosts one contiguous run of at
    most its slots stages, every cut of the layers."""
    best = np.inf
    for hosts in itertools.product(range(len(groups)), repeat=k):
        runs_of_groups = [g for g, _ in itertools.groupby(hosts)]
        if len(runs_of_groups) != len(set(runs_of_groups)) or any(
            hosts.count(i) > g.slots for i, g in enumerate(groups)
        ):
            continue
        per_stage = [groups[i] for i in hosts]
        for runs in stages_of(groups[0].costs.num_layers, k):
            if all(
                fits(g.costs, run, s, k, m, g.memory_bytes)
                for s, (g, run) in enumerate(zip(per_stage, runs, strict=True))
            ):
                best = min(best, step_s([g.costs for g in per_stage], runs, m))
    return best


@pytest.mark.parametrize("seed", range(8))
def test_mixed_device_groups_equal_brute_force(seed):
    from itercast.search.stage_slicing import DeviceGroup, slice_groups

    rng = np.random.default_rng(100 + seed)
    L, k, m = int(rng.integers(4, 9)), int(rng.integers(2, 4)), int(rng.choice([1, 4, 32]))
    base = rng.uniform(0.5, 3, L)
    groups = [
        DeviceGroup(
            f"g{i}",
            LayerCosts.of(base * speed, rng.uniform(0, 0.5, L), rng.uniform(1, 3, L), rng.uniform(0, 1, L)),
            slots=int(rng.integers(1, k + 1)),
            memory_bytes=float(rng.choice([np.inf, 10.0])),
        )
        for i, speed in enumerate((1.0, float(rng.uniform(1.2, 3.0))))
    ]
    expected = brute_force_groups(groups, k, m)
    if not np.isfinite(expected):
        with pytest.raises(ValueError):
            slice_groups(groups, k, m)
        return
    found = slice_groups(groups, k, m)
    assert found.step_time_s == pytest.approx(expected, rel=1e-12)
    assert len(found.stage_groups) == k


def test_a_faster_group_takes_more_layers_by_hand():
    from itercast.search.stage_slicing import DeviceGroup, slice_groups

    # 12 equal layers of 1 s on the slow group, 0.5 s on the fast one; one stage slot on each; 1
    # micro-batch: the step is the sum, so the fast group takes as many layers as it can: 11 of
    # 12 (every stage needs a layer): 11 × 0.5 + 1 × 1 = 6.5 s (fast first or last alike).
    fast = DeviceGroup("fast", LayerCosts.of(np.full(12, 0.5)), slots=1)
    slow = DeviceGroup("slow", LayerCosts.of(np.full(12, 1.0)), slots=1)
    found = slice_groups([slow, fast], 2, 1)
    assert found.step_time_s == pytest.approx(6.5)
    # many micro-batches: the bottleneck dominates; balance 0.5·a = 1·(12 − a) → a = 8: 4 s each
    balanced = slice_groups([slow, fast], 2, 1000)
    assert balanced.stage_times_s == pytest.approx([4.0, 4.0])
    layers = dict(zip(balanced.stage_groups, np.diff([*balanced.boundaries, 12]).tolist(), strict=True))
    assert layers == {"fast": 8, "slow": 4}


def test_slice_on_a_mixed_cluster_places_stages_on_groups():
    args = ["slice", "--model", "gpt3-1.3b", "--system", "dgx-h100", "--set", "system.num_nodes=2"]
    args += [
        "--set",
        "plan.pipeline_parallel=4",
        "--set",
        "plan.tensor_parallel=4",
        "--set",
        "plan.global_batch_size=64",
    ]
    res = CliRunner().invoke(app, [*args, "--device-groups", "dgx-h100:1,dgx-a100:1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    # 8 GPUs a node, tp 4 × dp 1: two stage slots per group; 4 stages use them all
    assert sorted(out["stage_groups"]) == ["dgx-a100:1"] * 2 + ["dgx-h100:1"] * 2
    per_group: dict[str, int] = {}
    for group, n in zip(out["stage_groups"], out["stage_layers"], strict=True):
        per_group[group] = per_group.get(group, 0) + n
    assert per_group["dgx-h100:1"] > per_group["dgx-a100:1"]  # the faster GPUs take more layers
    bad = CliRunner().invoke(app, [*args, "--device-groups", "dgx-h100"])
    assert bad.exit_code == 2 and "expected PRESET:NODES" in bad.output


def test_slice_places_stages_on_the_job_files_own_groups(tmp_path):
    # a job file with system.device_groups: the same slicing as --device-groups gives (predict prices the A100
    # stage on its A100; before, slice priced both stages on the job's preset GPU and recommended a slower split)
    plan = "plan: {tensor_parallel: 4, pipeline_parallel: 4, global_batch_size: 64}\n"
    groups = "device_groups: [{preset: dgx-h100, num_nodes: 1}, {preset: dgx-a100, num_nodes: 1}]"
    job = tmp_path / "mixed.yaml"
    job.write_text(f"model: gpt3-1.3b\nsystem: {{preset: dgx-h100, num_nodes: 2, {groups}}}\n{plan}")
    own = CliRunner().invoke(app, ["slice", str(job), "--json"])
    assert own.exit_code == 0, own.output
    flat = tmp_path / "flat.yaml"
    flat.write_text(f"model: gpt3-1.3b\nsystem: {{preset: dgx-h100, num_nodes: 2}}\n{plan}")
    given = CliRunner().invoke(app, ["slice", str(flat), "--device-groups", "dgx-h100:1,dgx-a100:1", "--json"])
    assert json.loads(own.output)["stage_layers"] == json.loads(given.output)["stage_layers"]
    assert sorted(json.loads(own.output)["stage_groups"]) == ["dgx-a100:1"] * 2 + ["dgx-h100:1"] * 2
    # a group with fields of its own is not what slice can place: one line, exit 2
    job.write_text(
        job.read_text().replace("{preset: dgx-a100, num_nodes: 1}", "{preset: dgx-a100, num_nodes: 1, x: 1}")
    )
    bad = CliRunner().invoke(app, ["slice", str(job)])
    assert bad.exit_code == 2 and "system.device_groups[1]: slice places stages on groups of a preset" in bad.output


def test_slice_names_the_group_order_its_slicing_needs(tmp_path):
    """User probe 6: the job lists its H100 node first, the slicing runs the V100 node first; pasting only
    stage_layers put 17 layers on a 16 GiB V100 (predict --strict: exit 3, 16.2 s). slice now prints the groups in
    pipeline order, and the job with both pasted is predicted at slice's step, within each GPU's memory."""
    plan = (
        "plan: {tensor_parallel: 4, pipeline_parallel: 4, global_batch_size: 64, dtype: fp16, flash_attention: false}"
    )
    groups = "[{preset: dgx-h100, num_nodes: 1}, {preset: v100-p3.16xlarge, num_nodes: 1}]"
    job = tmp_path / "mixed.yaml"
    job.write_text(f"model: gpt3-13b\nsystem: {{preset: dgx-h100, device_groups: {groups}}}\n{plan}\n")
    res = CliRunner().invoke(app, ["slice", str(job)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    pasted = lines[lines.index("and under `system:`, the groups in this order (the first stages on the first):") + 1]
    order = "[{preset: v100-p3.16xlarge, num_nodes: 1}, {preset: dgx-h100, num_nodes: 1}]"
    assert pasted == f"  device_groups: {order}"
    out = json.loads(CliRunner().invoke(app, ["slice", str(job), "--json"]).output)
    assert out["device_groups"] == [
        {"preset": "v100-p3.16xlarge", "num_nodes": 1},
        {"preset": "dgx-h100", "num_nodes": 1},
    ]
    layers = f"plan.stage_layers={out['stage_layers']}"
    again = CliRunner().invoke(
        app, ["predict", str(job), "--set", layers, "--set", f"system.device_groups={order}", "--strict", "--json"]
    )
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["step_time_s"] == pytest.approx(out["step_time_s"], rel=1e-9)


def test_slice_device_groups_are_the_cluster():
    """--device-groups holds the cluster's nodes, as system.device_groups does in a job file: 2 nodes here with no
    system.num_nodes (it had said '16 ≠ 8 GPUs'), and a num_nodes the groups contradict is named."""
    args = ["slice", "--model", "gpt3-1.3b", "--system", "dgx-h100", "--set", "plan.pipeline_parallel=4"]
    args += ["--set", "plan.tensor_parallel=4", "--set", "plan.global_batch_size=64", "--json"]
    res = CliRunner().invoke(app, [*args, "--device-groups", "dgx-h100:1,dgx-a100:1"])
    assert res.exit_code == 0, res.output
    assert sorted(json.loads(res.output)["stage_groups"]) == ["dgx-a100:1"] * 2 + ["dgx-h100:1"] * 2
    bad = CliRunner().invoke(app, [*args, "--set", "system.num_nodes=3", "--device-groups", "dgx-h100:1,dgx-a100:1"])
    assert bad.exit_code == 2 and "num_nodes is 3 but the device groups hold 2 nodes" in bad.output


def test_slice_refuses_the_layer_table_options_for_a_job():
    # a job's micro-batches and memory are its plan's and its GPUs': the CSV's options would be ignored silently
    job = ["slice", "--model", "gpt3-1.3b", "--system", "dgx-h100", "--set", "plan.pipeline_parallel=4"]
    for option, said in (("--microbatches", "plan.global_batch_size"), ("--memory-gib", "its GPUs' memory")):
        res = CliRunner().invoke(app, [*job, option, "4"])
        assert res.exit_code == 2 and f"{option} is for --layer-times" in res.output and said in res.output


def test_a_job_whose_layers_do_not_divide_into_its_stages_can_be_sliced():
    # 9 layers into 4 stages: validation needs stage_layers, which slicing is about to find
    job = ["--set", "model.num_layers=9", "--set", "plan.pipeline_parallel=4", "--set", "plan.global_batch_size=32"]
    res = CliRunner().invoke(app, ["slice", "--model", "gpt3-1.3b", "--system", "dgx-h100", *job, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert sum(out["stage_layers"]) == 9 and len(out["stage_layers"]) == 4


def test_slice_prices_a_jobs_layers_with_a_calibration(tmp_path):
    from test_golden import linear_calibration

    from itercast.config.job import Job
    from itercast.profile.calibrate import FORMAT, VERSION, merge_calibration

    doc = {"format": FORMAT, "version": VERSION, "system": "dgx-h100", **linear_calibration()}
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(doc))
    plan = {"pipeline_parallel": 2, "tensor_parallel": 4, "global_batch_size": 16}
    args = ["slice", "--model", "gpt3-1.3b", "--system", "dgx-h100"]
    args += [f"--set=plan.{k}={v}" for k, v in plan.items()]
    res = CliRunner().invoke(app, [*args, "--calibration", str(cal), "--json"])
    assert res.exit_code == 0, res.output
    job = Job.from_presets("gpt3-1.3b", "dgx-h100", 1, plan)
    costs, _ = job_layer_costs(job, merge_calibration(doc))  # flat curves: FLOPs / peak, bytes / bandwidth
    expected = slice_exact(costs, 2, job.num_microbatches)
    assert expected.step_time_s != pytest.approx(
        slice_exact(job_layer_costs(job)[0], 2, job.num_microbatches).step_time_s
    )
    from itercast.search.job_slicing import slice_job  # slice reports predict's step for its slicing

    chosen = slice_job(job, merge_calibration(doc))
    assert json.loads(res.output)["step_time_s"] == pytest.approx(chosen.prediction.step_time_s)
    both = CliRunner().invoke(app, ["slice", "--layer-times", str(cal), "--calibration", str(cal)])
    assert both.exit_code == 2 and "not both" in both.output


def test_a_host_bound_layer_is_sliced_by_its_launches():
    """A pass takes no less than its host's launches (predict's segments): at 1 ms of host a kernel every
    layer of gpt3-1.3b is host-bound, its time its forward's and backward's kernels × 1 ms; at the preset's
    11.3 µs it is its GPU time, far less."""
    from itercast.config.job import Job
    from itercast.costs.analytic import AnalyticCostModel
    from itercast.workloads.transformer import Groups, UnitCosts

    def layer_s(launch_s: float) -> tuple[float, int]:
        job = Job.from_dicts(
            {"preset": "gpt3-1.3b"},
            {"pipeline_parallel": 2},
            {"preset": "dgx-h100", "gpu": {"kernel_launch_overhead_s": launch_s}},
        )
        u = UnitCosts.of(job, AnalyticCostModel(job.system, job.plan.dtype), Groups.of(job))
        kernels = u.forward("layer").kernels + u.backward("layer").kernels
        return float(job_layer_costs(job)[0].time_s[1]), kernels

    slow, kernels = layer_s(1e-3)
    fast, _ = layer_s(11.3e-6)
    assert slow == pytest.approx(kernels * 1e-3) and fast < slow / 5
