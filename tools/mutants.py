"""One-line mutants of itercast's formulas: does the test suite notice when one is wrong?

    python tools/mutants.py                  # every mutant, one at a time (a long run); prints the score
    python tools/mutants.py --list           # the mutants, numbered, with the physics each one breaks
    python tools/mutants.py --only dlrm      # those whose file, snippet or description contains "dlrm"
    python tools/mutants.py --jobs 2         # two at a time, each in a copy of its own

A mutant replaces one exact snippet of one source file with a plausible mistake (a factor dropped,
the wrong group, the wrong dtype). The working tree is never touched: the repository is copied to a
temporary directory (itercast/, tests/ and tools/ copied, everything else linked), the mutant is written
into the copy, and `python -m pytest -x -q` runs there on the test files that cover it (the copy's
`itercast` is imported, checked before the first mutant; no bytecode is written, so no stale .pyc
survives a mutant). First the union of those test files must pass unmutated (the baseline).

Killed: the tests fail (or run past --timeout). Survived: they pass, so a formula can be wrong
without any test noticing: an equivalent mutant (no result can change) or a gap in the tests.
Not applicable: the snippet is not (exactly once) in the file any more; the code changed, so update
the list. The score is "killed K of N applicable".
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("itercast", "tests", "tools")  # copied (mutated, and tests import the copy); the rest is linked
NOT_LINKED = {".git", ".venv", "itercast.egg-info", ".pytest_cache", ".ruff_cache", ".mypy_cache"}


class Mutant(NamedTuple):
    """`before` occurs exactly once in `file` (relative to itercast/); `tests` default per file."""

    file: str
    before: str
    after: str
    breaks: str
    tests: tuple[str, ...] = ()


def _t(*names: str) -> tuple[str, ...]:
    return tuple(f"tests/test_{n}.py" for n in names)


#: the test files that cover each source file (a mutant may name its own)
TESTS = {
    "workloads/transformer_ops.py": _t(
        "golden",
        "step_by_hand",
        "moe",
        "ops_and_costs",
        "fp8_recipes",
        "fp8_moe",
        "fp8_weight_cast",
        "moe_paths",
        "context_parallel",
        "eager_pointwise",
        "optimizer_state",
    ),
    "workloads/transformer.py": _t(
        "golden",
        "step_by_hand",
        "bounds_by_hand",
        "moe",
        "ops_and_costs",
        "pipeline",
        "context_parallel",
        "optimizer_state",
    ),
    "memory.py": _t(
        "memory",
        "memory_by_hand",
        "memory_moe_by_hand",
        "memory_runs_that_ran",
        "golden",
        "moe",
        "eager_pointwise",
        "optimizer_state",
    ),
    "config/plan.py": _t("optimizer_state", "memory_runs_that_ran", "golden"),
    "search/fast_estimate.py": _t("fast_estimate", "bounds_by_hand"),
    "workloads/dlrm/step.py": _t("dlrm", "dlrm_by_hand"),
    "workloads/dlrm/embedding.py": _t("dlrm", "dlrm_by_hand"),
    "workloads/dlrm/host.py": _t("dlrm_host"),
    "workloads/dlrm/sharding.py": _t("dlrm"),
    "costs/analytic.py": _t("costs_by_hand", "ops_and_costs", "golden", "attention_kernels"),
    "costs/attention.py": _t("attention_kernels"),
    "hardware/topology.py": _t("costs_by_hand", "ops_and_costs"),
    "parallel/schedules.py": _t("pipeline", "memory", "golden"),
    "sim/kernels.py": _t("engine", "sim_kernels"),
    "sim/engine.py": _t("engine", "engine_properties"),
    "sim/montecarlo.py": _t("montecarlo"),
    "sim/sharing.py": _t("replay_sharing"),
    "sim/contention.py": _t("contention", "corunning"),
    "stochastic/variability.py": _t("variability", "variability_cpu"),
    "costs/host_overheads.py": _t("et_runtime_calls", "host_overheads_other"),
    "traces/tensor_parallel.py": _t("replay_tp"),
    "traces/parallel_whatifs.py": _t("replay_parallel", "replay_sharing"),
    "traces/cpu_collectives.py": _t("replay_parallel", "replay_sharing", "replay_tp"),
    "stochastic/placement.py": _t("speed_map", "placement"),
    "stochastic/time_to_train.py": _t("time_to_train"),
    "search/stage_slicing.py": _t("stage_slicing", "bounds_by_hand"),
}

OPS, TF, MEM, FAST = "workloads/transformer_ops.py", "workloads/transformer.py", "memory.py", "search/fast_estimate.py"
DLRM, COST, TOPO, SCHED = "workloads/dlrm/step.py", "costs/analytic.py", "hardware/topology.py", "parallel/schedules.py"
EMB, ATT, HOST = "workloads/dlrm/embedding.py", "costs/attention.py", "workloads/dlrm/host.py"
PLAN, SHARDING = "config/plan.py", "workloads/dlrm/sharding.py"
VAR, TTT, SLICE = "stochastic/variability.py", "stochastic/time_to_train.py", "search/stage_slicing.py"
M = Mutant
# fmt: off
MUTANTS: tuple[Mutant, ...] = (
    # -- the layer's ops: FLOPs and bytes per micro-batch (Megatron-LM shapes) --------------------
    M(OPS, "2 * T * h * (a + 2 * g) * d / t, f_bytes", "2 * T * h * 3 * a * d / t, f_bytes", "QKV GEMM ignores GQA"),
    M(OPS, '"rope", "elementwise", 2 * T * (a + g) * d / t * e)', '"rope", "elementwise", 2 * T * a * d / t * e)',
      "rotary embedding skips the keys"),
    M(OPS, "(qk + av) * kept, attention=shape)", "(qk + av), attention=shape)",
      "causal flash attention does every block"),
    M(OPS, '"norm", 2 * scores * e)', '"norm", scores * e)', "unfused softmax only reads its scores"),
    M(OPS, "scores * (2 * e + 1)", "scores * 2 * e", "attention dropout without its 1-byte mask"),
    M(OPS, "heads = plan.micro_batch_size * a / t", "heads = plan.micro_batch_size * a", "heads not split by t"),
    M(OPS, "s_loc = model.seq_length / plan.context_parallel", "s_loc = model.seq_length", "CP does not split tokens"),
    M(OPS, "sp = tokens / plan.tensor_parallel if", "sp = tokens if", "SP does not shard norms and residuals"),
    M(OPS, "return 2 * model.kv_heads * model.head_dim", "return 2 * model.num_attention_heads * model.head_dim",
      "CP ring passes K and V of every head (GQA ignored)"),
    M(OPS, 'nbytes, "p2p", c - 1)]', 'nbytes, "p2p", c)]', "CP ring of c steps, not c − 1"),
    M(OPS, "2 * T * a * model.value_head_dim * h / t, kn", "2 * T * a * model.value_head_dim * h, kn",
      "attention output projection not split by t"),
    M(OPS, "residual = Tsp * h * (3 * e", "residual = T * h * (3 * e", "residual not SP-split"),
    M(OPS, "(3 * e + (1 if model.has_dropout else 0))", "(3 * e)", "residual adds write no dropout mask"),
    M(OPS, 'Op("input_norm", "norm", 2 * Tsp', 'Op("input_norm", "norm", Tsp', "layer norm only reads"),
    M(OPS, "2 * T * h * up * width / t, f_bytes", "2 * T * h * width / t, f_bytes", "SwiGLU up GEMM without the gate"),
    M(OPS, '"autograd": (3 * e, 1)', '"autograd": (2 * e, 1)', "autograd's add does not write its sum",
      _t("grad_accumulation")),
    M(OPS, '"fp32_copy_add": (e + 4 + 4 + 4 + 4, 2)', '"fp32_copy_add": (4 + 4 + 4, 2)',
      "BF16_Optimizer's fp32 copy of each gradient left out", _t("grad_accumulation")),
    M(OPS, '"fp32_add": (4 + e + 4, 1)', '"fp32_add": (4 + 4 + 4, 1)', "FSDP2's mixed add read as fp32 + fp32",
      _t("grad_accumulation")),
    M(OPS, "mlp = 1 + 2 * model.experts // plan.expert_parallel + shared",
      "mlp = 1 + 2 * model.experts + shared", "every expert's tensors on every expert-parallel rank",
      _t("grad_accumulation")),
    M(OPS, "        params += model.expert_params_per_rank(plan.expert_parallel, plan.etp)\n", "",
      "routed experts' gradients not accumulated", _t("grad_accumulation")),
    M(TF, "ops_mod.backward_of(emb, p) + embed_acc", "ops_mod.backward_of(emb, p)",
      "the word table's gradients not accumulated", _t("grad_accumulation")),
    M(MEM, "autograd writes it\n        g_b = base.dtype_bytes\n", "autograd writes it\n        g_b = g_b\n",
      "autograd's gradients counted in the fp32 reduction's bytes", _t("grad_accumulation")),
    M(MEM, "np.where(whole_fp32_sums(base.grad_accumulation, pp, z), 4.0,", "np.where(False, 4.0,",
      "FSDP2's fp32 sums under pipelining sharded like its reduced gradients", _t("grad_accumulation")),
    M(PLAN, "pipelined_fsdp = (np.asarray(pp) > 1) & (np.asarray(zero) >= 2)",
      "pipelined_fsdp = np.asarray(zero) >= 2", "FSDP2 accumulates whole fp32 sums without pipelining too",
      _t("grad_accumulation")),
    M(FAST, "        key += tuple(k for k in _FSDP2_KEY if k not in key)\n", "",
      "the fast path's unit costs not told apart by pp and ZeRO under fsdp2", _t("grad_accumulation")),
    # -- one calibration in every command -------------------------------------------------------------
    M("search/plan_search.py", "FastEstimator(model, system, calibration)", "FastEstimator(model, system)",
      "the search's fast path on the built-in curves under --calibration", _t("calibration_everywhere")),
    M("search/plan_search.py", "predict(plan_job(request, row), request.calibration)",
      "predict(plan_job(request, row))", "the search's re-score on the built-in curves under --calibration",
      _t("calibration_everywhere")),
    M("stochastic/variability.py", "builder, sim = simulate_transformer_step(job, calibration)",
      "builder, sim = simulate_transformer_step(job)", "variability's step graph on the built-in curves",
      _t("calibration_everywhere")),
    M("cli/report_cmds.py", "r = w.predict(calibration)", "r = w.predict()", "the report's step on the built-in curves",
      _t("calibration_everywhere")),
    M("cli/search_cmds.py", "search_dlrm(w.job, sizes, calibration)", "search_dlrm(w.job, sizes)",
      "a DLRM search on the built-in curves under --calibration", _t("calibration_everywhere")),
    M("cli/predict_cmds.py", "compare_figures(a, a.predict(cal_a))", "compare_figures(a, a.predict())",
      "compare prices its first job on the built-in curves under --calibration", _t("calibration_everywhere")),
    M("predict.py", "    job = Job(job.model, job.plan, host_calibrated(job.system, calibration))\n", "",
      "a host calibration's T1-T5 ignored by a transformer step", _t("calibration_everywhere")),
    M(FAST, "        self.system = host_calibrated(", "        self.system = (lambda s, c: s)(",
      "the search's fast path ignores a host calibration", _t("calibration_everywhere")),
    M("costs/host_overheads.py", "self.t1_us + around_launch_us + self.silent_per_launching",
      "around_launch_us + self.silent_per_launching", "a launching operator's host time without its gap T1",
      _t("calibration_everywhere", "dlrm_host")),
    M("stochastic/variability.py", "transformer_step(job, sim.graph, builder.expert_share()",
      "transformer_step(job, builder.graph, builder.expert_share()",
      "variability samples the step without the contention predict prices", _t("calibration_everywhere")),
    M(OPS, "(3 if model.gated_mlp else 2) * T * width", "2 * T * width", "SwiGLU activation reads one input"),
    M(OPS, "2 * T * width * h / t, kn", "2 * T * width * h, kn", "MLP down GEMM not split by t"),
    M(OPS, "if plan.tensor_parallel == 1 or not plan.sequence_parallel:", "if plan.tensor_parallel == 1:",
      "all-gathers before column-parallel GEMMs without SP"),
    M(OPS, '"reduce_scatter", backward_comm="all_gather")]', '"reduce_scatter")]', "SP's g has no backward all-gather"),
    M(OPS, 'if plan.sequence_parallel:\n                    margin = _sm_margin(plan, op.name, "dgrad")',
      'if False:\n                    margin = _sm_margin(plan, op.name, "dgrad")',
      "SP backward does not re-gather the saved sharded input"),
    M(OPS, 'kind = "reduce_scatter" if plan.sequence_parallel else "all_reduce"', 'kind = "all_reduce"',
      "SP's input gradient all-reduced, not reduce-scattered"),
    M(OPS, '"attention", 2.5 * op.amount)', '"attention", 2.0 * op.amount)', "flash backward 2× forward, not 2.5×"),
    M(OPS, '"cp_comm", 2 * (c - 1) / c * op.amount, "p2p", c)', '"cp_comm", op.amount, "p2p", c)',
      "CP backward ring not doubled (K, V and their gradients)"),
    M(OPS, "else 2 * op.amount", "else op.amount", "memory-bound backward moves its forward bytes once"),
    M(OPS, 'elif kind == "selective":', 'elif kind == "selective" and not plan.flash_attention:',
      "Megatron's selective recompute does not re-run fused attention"),
    M(OPS, "if o.name.startswith(CORE_ATTENTION_RUN)", "if o.name.startswith(CORE_ATTENTION)",
      "recomputed ring attention without its K/V ring"),
    # -- context parallelism as each implementation runs it (plan.cp_comm; tests/test_context_parallel.py)
    M(OPS, "ring = replace(shape, causal=False, calls=c - 1)", "ring = replace(shape, calls=c - 1)",
      "CP ring steps priced as causal calls", _t("context_parallel", "attention_kernels")),
    M(OPS, "attention=replace(shape, calls=2))]", "attention=shape)]", "CP, TE all-gather as one call, not two",
      _t("context_parallel")),
    M(OPS, "(2 * e + 3 * e * (c - 1)) * o", "(2 * e + 2 * e * (c - 1)) * o",
      "CP, TE's output correction does not read the running output", _t("context_parallel")),
    M(OPS, "(e + 1.5 * e * (c - 2) + 3 * e) * kv", "(2 * e + 3 * e * (c - 1)) * kv",
      "CP, TE's last rank adds whole key/value gradients at every step", _t("context_parallel")),
    M(OPS, "fwd = 2 * e * c * kv + 2 * e * o", "fwd = 2 * e * o", "CP, TE all-gather: gathered K, V not reordered",
      _t("context_parallel")),
    M(OPS, "3 * e * (c + 0.5)", "3 * e * c", "CP, TE all-gather: each call's dk, dv added over c of the rank's chunks",
      _t("context_parallel")),
    M(OPS, "+ 32 * (c - 1) * o", "+ 24 * (c - 1) * o", "CP, PyTorch's fp32 merge: one pass less per step",
      _t("context_parallel")),
    M(OPS, "((8 + e) / 2 + 8) * (c - 1)", "(8 + e) * (c - 1)",
      "CP, PyTorch's partial gradient update: whole add, no torch.cat", _t("context_parallel")),
    M(OPS, 'if model.mla or plan.cp_comm.startswith("torch"):', "if model.mla:",
      "CP, torchtitan's repeated key-value heads ignored under PyTorch's", _t("context_parallel")),
    M(OPS, '"all_gather", overlaps=CORE_ATTENTION)]', '"all_gather")]',
      "CP, PyTorch's all-gather not hidden behind the diagonal call", _t("context_parallel")),
    M(OPS, 'c * nbytes / 2, "all_gather", count=2)]', 'c * nbytes / 2, "all_gather")]',
      "CP, TE gathers K and V in one all-gather of half their bytes", _t("context_parallel")),
    M(OPS, "* 4 / plan.dtype_bytes", "* 1", "CP, PyTorch sends key/value gradients in bf16, not fp32",
      _t("context_parallel")),
    M(OPS, 'Op("cp_dkv_exchange.last", "cp_comm", dkv_bytes, "send"),', "",
      "CP, PyTorch's last gradient send hidden", _t("context_parallel")),
    M(TF, "sec = op.count * one", "sec = one", "CP collectives priced once whatever their count",
      _t("context_parallel")),
    M(ATT, 'calls * fit["alpha_s"]', 'fit["alpha_s"]', "CP's calls pay one kernel latency between them",
      _t("attention_kernels", "context_parallel")),
    M(OPS, '{"delayed": 4,', '{"delayed": 2,', "FP8 cast writes no transpose"),
    M(OPS, "return cast + 32, 8 + cast", "return cast + 24, 8 + cast", "Megatron's cross-entropy: one fp32 pass less"),
    M(OPS, "return e, 2 * e", "return e, e", "TE's cross-entropy backward only reads the logits"),
    M(OPS, "cast = 0 if e == 4 else e + 4", "cast = e + 4", "fp32 logits cast to fp32 again"),
    M(OPS, '"tp_comm", 2 * sh.tokens * 4, "all_reduce"', '"tp_comm", sh.tokens * 4, "all_reduce"',
      "vocab-parallel cross-entropy reduces one scalar per token, not two"),
    M(OPS, "2 * sh.tokens * h * v_loc, f_bytes", "2 * sh.tokens * h * model.vocab_size, f_bytes",
      "logits GEMM not split over the vocabulary"),
    M(OPS, '"embedding_lookup", "elementwise", 2 * sh.tokens', '"embedding_lookup", "elementwise", sh.tokens',
      "embedding lookup only writes"),
    M(OPS, "routed = n * k * model.moe_load()", "routed = n * k", "MoE busiest rank at the mean load"),
    M(OPS, "rows = routed * etp", "rows = routed", "expert-tensor gather does not multiply rows"),
    M(OPS, "2 * rows * h * up * fe / etp / local", "2 * rows * h * up * fe / etp", "every local expert gets all rows"),
    M(OPS, "(2 * routed + n) * h * e", "2 * routed * h * e", "MoE unpermute writes nothing"),
    M(OPS, '"tensorwise": 6 - fused_read', '"tensorwise": 6', "the layer norm does not compute the FP8 amax"),
    M(OPS, '"rowwise": 8 - fused_read', '"rowwise": 6 - fused_read', "rowwise FP8 casts without its bf16 transpose"),
    M(OPS, "return tensors * (2 if", "return (2 if", "TE current scaling casts every expert in one launch"),
    M(OPS, 'Op("moe_fp8_pad", "elementwise", 2 * nbytes, label="experts"',
      'Op("moe_fp8_pad", "elementwise", nbytes, label="experts"', "the FP8 padding copy only writes"),
    M(OPS, "count=1 if plan.moe_grouped_gemm else local,", "count=1,",
      "sequential experts run one activation kernel for all of them"),
    M(OPS, "return fp8_cast_bytes(plan.fp8_recipe, after_norm=False) * weights",
      "return fp8_cast_bytes(plan.fp8_recipe, after_norm=True) * weights",
      "Transformer Engine's per-step weight cast reads no amax"),
    M(OPS, "fwd = cast + 8 + 4 + 8 + cast + 2 * e", "fwd = cast + 8 + 4 + 8 + 2 * e",
      "eager RMSNorm without its .type_as down-cast"),
    M(OPS, "bwd = 6 * e + cast + 24 + 4 + 28 + 12 + cast", "bwd = 6 * e + cast + 24 + 4 + 28 + cast",
      "autograd's sum of the eager RMSNorm input's two gradients left out"),
    M(OPS, "2 * cast + 8, 2 + 2 * cast_kernels", "2 * cast + 8, 1 + 2 * cast_kernels",
      "eager rotary's backward without the conjugated table's copy"),
    M(OPS, "return 5 * e, 2, 9 * e, 3", "return 5 * e, 2, 10 * e, 3", "eager SwiGLU's backward twice its forward"),
    M(OPS, "nbytes = 2 * sh.tokens * (a + g) * model.head_dim", "nbytes = 2 * sh.tokens * a * model.head_dim",
      "repeat_kv only writes the repeated heads"),
    M(OPS, '        family="elementwise",\n        label=op.label or op.family,\n', "",
      "eager chains priced on the fused norm and activation curves"),
    # -- the step graph: groups, bytes, optimizer ------------------------------------------------
    M(TF, "grad=place_group(d * c, t, gpn)", "grad=place_group(d, t * c, gpn)", "gradients reduced over dp, not dp×cp"),
    M(TF, "cp=place_group(c, t, gpn)", "cp=place_group(c, 1, gpn)", "CP ranks placed adjacent, not at stride tp"),
    M(TF, "tp=place_group(t, 1, gpn)", "tp=place_group(t, c, gpn)", "TP ranks placed at stride cp"),
    M(TF, "stage_cross_node=not same_node(0, stage_stride, gpn)", "stage_cross_node=False",
      "pipeline sends never cross nodes"),
    M(TF, "stage_stride // (ep * etp) if", "stage_stride // ep if", "expert data parallel ignores expert TP"),
    M(TF, 'return "all_reduce" if job.plan.zero_stage == 0 else "reduce_scatter"', 'return "all_reduce"',
      "ZeRO still all-reduces gradients"),
    M(TF, 'return 4 if job.plan.dtype == "fp32" else 2', "return 2", "fp32 weights gathered as 16-bit"),
    M(TF, "copy + rebuilt + p.grad_bytes + moments", "copy + rebuilt + 4 + moments",
      "Adam reads fp32 gradients under bf16 reduction"),
    M(TF, "(4 + p.grad_bytes + moments + 4 + moments)", "(4 + p.grad_bytes + moments + 4 + moments + 2)",
      "fp32 training writes a 16-bit copy too"),
    M(TF, 'rebuilt = w if p.main_params in ("fp32_remainders", "none") else 0', "rebuilt = 0",
      "16-bit remainders rebuild fp32 without reading the bf16 weight"),
    M(TF, "moments = 2 * DTYPE_BYTES[p.adam_state_dtype]", "moments = 8", "bf16 Adam moments moved as fp32"),
    M(TF, "return nbytes / p.tensor_parallel if p.sequence_parallel else nbytes", "return nbytes",
      "pipeline message not divided by t under SP"),
    M(TF, 'return nbytes / p.tensor_parallel if p.pipeline_p2p == "deepspeed" else nbytes', "return nbytes",
      "DeepSpeed's pipe engine sends whole activations, not 1/t partitions", _t("deepspeed_pipeline")),
    M(TF, '"gather": [full, 2 * part, *[2 * part] * tp, 2 * full],', '"gather": [full, 2 * part, 2 * full],',
      "PyTorch's list all_gather writes straight into its outputs, no copy from its flat buffer",
      _t("deepspeed_pipeline")),
    M(TF, '"receive": [2 * header, 2 * part],', '"receive": [2 * part],',
      "DeepSpeed's receiver clones the partitioned part but not its header", _t("deepspeed_pipeline")),
    M(TF, "return max(self.p2p_s[args[0], args[1]], self.p2p_s[args[1], args[0]])",
      "return self.p2p_s[args[0], args[1]] + self.p2p_s[args[1], args[0]]",
      "Megatron-Core's batched send and receive run one after the other", _t("megatron_pipeline")),
    M(TF, "if send and recv and send[0] != recv[0] and steady:", "if send and recv and send[0] != recv[0]:",
      "Megatron-Core batches the last warm-up send of a stage without a steady state", _t("megatron_pipeline")),
    M(TF, '"cuda_synchronize", list(self._tails[stage].values()))', '"cuda_synchronize", [])',
      "torch.cuda.synchronize waits for nothing: the host keeps running ahead", _t("host_sync")),
    M(TF, "            deps = [*deps, *tails.values()]\n", "            deps = list(deps)\n",
      "CUDA_LAUNCH_BLOCKING leaves a stage's streams overlapping", _t("host_sync")),
    M(TF, "first = first_launch if p.cuda_launch_blocking else body", "first = body",
      "under CUDA_LAUNCH_BLOCKING the host launches before its receive returns", _t("host_sync")),
    M(FAST, "return d_f * (np.arange(pp) > 0) + d_b * (np.arange(pp) < pp - 1)", "return d_f + d_b",
      "the first stage's forward and the last stage's backward priced as following a sync", _t("host_sync")),
    M(FAST, "np.maximum(launch_s, n * launch_s + compute / many - compute)", "launch_s + 0 * many",
      "a host-bound pass after a sync priced one launch late only", _t("host_sync")),
    M(OPS, 'return waited, "moe_permute"', "return waited, waited",
      "Megatron-Core's EP wait launches permutation 1 after it", _t("moe_host_sync")),
    M(OPS, 'return ("moe_counts", "moe_counts") if plan.expert_parallel > 1 else None',
      'return ("moe_permute", "moe_permute")', "torchtitan waits with EP 1", _t("moe_host_sync")),
    M(OPS, '"all_gather", group="ep" if ep > 1 else "etp")', '"all_gather", group="etp")',
      "Megatron-Core's counts gathered over the expert-TP group, not the expert ranks", _t("moe_host_sync")),
    M(OPS, "8 * E * ep * etp", "8 * E",
      "Megatron-Core's counts gather priced as one rank's counts", _t("moe_host_sync")),
    M(TF, "run, back = after, 2 if between.kernels else 1", "run, back = after, 1",
      "the MoE wait waits for permutation 1 too", _t("moe_host_sync")),
    M(TF, 'if not forward and (p.recompute != "full" or again < 1):', "if not forward:",
      "a fully recomputed MoE forward does not wait", _t("moe_host_sync")),
    M(TF, '"moe_host_wait", [waited])', '"moe_host_wait", [])',
      "the MoE wait waits for nothing: the host keeps running ahead", _t("moe_host_sync")),
    M(FAST, "max(h, b) + c_x + m_x", "h + b + c_x + m_x",
      "the fast path's MoE wait: permutation 1 hides nothing of the launch after it", _t("moe_host_sync")),
    M(FAST, "return period - c_x - m_x - b, period - (n_x + n_y) * h", "return period - c_x - m_x - b, 0.0",
      "the fast path's MoE wait never idles the host", _t("moe_host_sync")),
    M(TF, "m.seq_length / p.context_parallel * m.hidden_size", "m.seq_length * m.hidden_size", "p2p ignores CP"),
    M(TF, "return experts / groups.expert_grad.size + rest / groups.grad.size", "return experts + rest",
      "ZeRO-sharded optimizer step over every parameter"),
    M(TF, "sec, stretch_s = _beside_s(op, sec, kernel_s[op.overlaps], chunks.get(op.overlaps, 1), costs, groups)",
      "stretch_s = 0.0", "overlapped collectives fully exposed"),
    M(TF, "exposed_cp = max(0.0, cp_ring - attention - ring_stretch_s)", "exposed_cp = cp_ring",
      "CP ring hides behind nothing"),
    M(TF, "sec = op.count * n * float(costs.gemm_s(", "sec = n * float(costs.gemm_s(",
      "one GEMM for all local experts"),
    M(TF, "cp_ring += op.count * costs.p2p_s(", "cp_ring += costs.p2p_s(", "CP ring priced as one step"),
    M(TF, '("dp", stage, "all_gather", w, w_bytes)', '("dp", stage, "all_gather", w, grad_bytes)',
      "ZeRO parameter gather moves gradient bytes"),
    M(TF, '("collective", stage, "all_reduce", vocab * grad_bytes, "embedding")',
      '("collective", stage, "all_reduce", vocab * 2, "embedding")', "tied embedding reduced in 16-bit"),
    M(TF, "head = vocab if not m.tied or p.pipeline_parallel > 1 else 0.0", "head = vocab",
      "a tied head on one stage counted twice"),
    M(TF, "(p.zero_stage >= 2 or i == last_bwd[ps.chunk])", "(i == last_bwd[ps.chunk])",
      "ZeRO-2/3 reduce once, not after every micro-batch"),
    # -- memory per GPU (Korthikanti et al. 2022; ZeRO) ------------------------------------------
    M(MEM, 'shard = c["dp"] * c["cp"]', 'shard = c["dp"]', "ZeRO shards over dp, not dp×cp"),
    M(MEM, 'c["dp"] * c["cp"] > 1, c["pp"] > 1', 'c["pp"] > 1', "no NCCL buffers for the data-parallel group",
      _t("memory_runs_that_ran", "frameworks")),
    M(MEM, "+ NCCL_COMMUNICATOR_BYTES * count", "+ NCCL_COMMUNICATOR_BYTES", "NCCL's buffers for one communicator only",
      _t("memory_runs_that_ran", "frameworks")),
    M(MEM, 'out["reserved"] = reserve_bytes(self.gpu, communicators(c)) + np.zeros_like(acts)',
      'out["reserved"] = np.zeros_like(acts)', "predict's memory without the CUDA context and NCCL buffers",
      _t("memory_runs_that_ran", "frameworks", "workload")),
    M("search/plan_search.py", "needed = mem + margin", "needed = mem", "the search keeps no margin beside a plan",
      _t("frameworks")),
    M(DLRM, "float(reserve_bytes(gpu, int(system.num_gpus > 1)))", "float(reserve_bytes(gpu, 0))",
      "a DLRM's process group holds no NCCL buffers", _t("workload")),
    M(MEM, "else 2 * (4 * h + 4)", "else 2 * (2 * h + 4)", "eager RMSNorm's saved x.float() counted 16-bit"),
    M(MEM, "return norms, repeated_kv + e * mlp_width", "return norms, repeated_kv",
      "the silu output eager SwiGLU's product saves left out"),
    M(MEM, 'c["tp"] * shard // (c["ep"] * c["etp"])', 'c["tp"] * shard // c["ep"]', "expert ZeRO shard ignores ETP"),
    M(MEM, "self.recomputing = again * self.tokens", "self.recomputing = 0 * again * self.tokens",
      "full recompute needs no whole layer"),
    M(MEM, "full = r * e * h / rep / group", "full = r * e * h / group",
      "full recompute's layer input not SP-sharded"),
    M(MEM, "sharded = e * (a + 2 * g) * d + (e", "sharded = e * 3 * a * d + (e", "activations ignore GQA"),
    M(MEM, "up = 2 if m.gated_mlp else 1\n    sharded", "up = 1\n    sharded",
      "SwiGLU keeps one up output"),
    M(MEM, "gemm_in * h + mlp_in + 2 * dropout", "gemm_in * h + mlp_in", "dropout masks not kept"),
    M(MEM, 'per_copy = gemm_in * t.cols["etp"] * h +', "per_copy = gemm_in * h +",
      "an expert copy's fc1 input not gathered over the expert-tensor ranks"),
    M(MEM, 'g_b = base.stored_weight_bytes, 4 if base.dtype == "fp32" else base.grad_bytes',
      "g_b = base.stored_weight_bytes, 4", "bf16 gradient buffers counted as fp32"),
    M(PLAN, "return -(-vocab_size // unit) * divisible_by", "return vocab_size // unit * divisible_by",
      "the vocabulary truncated, not padded, to its multiple", _t("vocab_padding", "step_by_hand")),
    M(PLAN, "unit = divisible_by * np.asarray(tp, dtype=np.int64)", "unit = divisible_by",
      "the padding's multiple without tensor parallelism", _t("vocab_padding", "memory_by_hand")),
    M("workloads/transformer_ops.py", "if rows * plan.dtype_bytes % 16 == 0:", "if rows % 16 == 0:",
      "an unaligned logits GEMM judged in rows, not bytes", _t("vocab_padding")),
    M(PLAN, '"fp32_remainders": 2, "bf16": 2', '"fp32_remainders": 4, "bf16": 2',
      "remainders counted as a whole fp32 copy"),
    M(PLAN, '"bf16": 2, "none": 0,', '"bf16": 4, "none": 0,', "a bf16 copy counted as fp32"),
    M(MEM, "np.where(fsdp2 & (z == 2), base.dtype_bytes, 0)", "0", "FSDP2 without resharding keeps no 16-bit weights"),
    M(MEM, "(2 if fsdp2 else 3)", "3", "FSDP2's fp32 weights sharded only at ZeRO 3"),
    M(MEM, "whole_w_b = base.dtype_bytes", "whole_w_b = base.stored_weight_bytes", "layers gathered in fp32"),
    M(PLAN, 'return 4 if self.dtype == "fp32" or self.main_params == "fp32_weights" else 2',
      'return 4 if self.dtype == "fp32" else 2', "fp32 weights kept as 16-bit"),
    M(TF, 'if p.dtype == "fp32" or p.main_params == "fp32_weights":', 'if p.dtype == "fp32":',
      "FSDP2's Adam step writes a 16-bit copy"),
    M(TF, "return sms / (sms - margin)", "return 1.0", "userbuffers take no SMs from the GEMM they overlap"),
    M(OPS, 'margin = _sm_margin(plan, ops[j].name, "fprop") if', 'margin = 0 if',
      "pipeline reduce-scatters take no SMs from the forward GEMM"),
    M(OPS, 'margin = _sm_margin(plan, op.name, "dgrad")', "margin = 0", "bulk all-gathers take no SMs from dgrad"),
    M(OPS, 'margin = _sm_margin(plan, op.name, "wgrad")', "margin = 0", "bulk reduce-scatters take no SMs from wgrad"),
    M(OPS, "                        sm_margin=0,\n", "", "the ring exchange beside dgrad takes the forward's SMs"),
    M(OPS, 'chunked = "ring_exchange" if op.chunked else ""', "chunked = op.chunked",
      "the all-gather beside proj's dgrad split as the forward reduce-scatter is"),
    M(OPS, "chunked = plan.tp_comm_overlap_rs if rs else", 'chunked = "pipeline" if rs else',
      "plan.tp_comm_overlap_rs ring_exchange priced as the pipeline"),
    M(TF, 'return TE_PIPELINE_SPLITS if op.chunked == "pipeline" else',
      'return getattr(groups, op.group).size if True else',
      "the pipeline method splits its GEMM in tp, not 4"),
    M(TF, "s = 0.0 if op.sm_margin or op.chunked", "s = 0.0 if op.chunked",
      "a userbuffers overlap both takes its SMs and slows the GEMM"),
    M(TF, 'op.sm_margin or op.chunked == "ring_exchange" else', "op.sm_margin else",
      "copy-engine ring exchanges slow the GEMM as NCCL's kernels do"),
    M(TF, "return s / (1 + s) * min(comm_s, kernel_s * (1 + s))", "return s * min(comm_s, kernel_s)",
      "the fluid model's overlap counted at the kernel's speed alone"),
    M(TF, "return max(0.0, comm_s - kernel_s - stretch_s), stretch_s", "return max(0.0, comm_s - kernel_s), stretch_s",
      "a slowed kernel hides no more of its collective"),
    M(TF, "stretch_s = _stretch_s(s, step_s, chunk_s)", "stretch_s = 0.0",
      "a pipeline without SM margin leaves its GEMM chunks unslowed"),
    M(TF, "ring_stretch_s = _stretch_s(", "ring_stretch_s = 0.0 * _stretch_s(",
      "the CP ring's NCCL kernels leave attention unslowed"),
    M(TF, "step_s = tail_s = costs.collective_s(op.comm_kind, op.amount / n, group)",
      "step_s, tail_s = costs.collective_s(op.comm_kind, op.amount / n, group), 0.0",
      "the pipeline's last reduce-scatter hidden"),
    M(TF, "step_s = costs.p2p_s(op.amount / n,", "step_s = costs.p2p_s(op.amount,",
      "a ring step sends the whole buffer"),
    M(TF, 'memory_s("elementwise", op.amount * (n + 1) / n)', 'memory_s("elementwise", op.amount / n)',
      "the ring reduce-scatter's sum reads one chunk"),
    M(TF, "return (n - 1) * max(0.0, step_s - chunk_s - stretch_s) + tail_s,",
      "return max(0.0, step_s - chunk_s - stretch_s) + tail_s,",
      "one chunk step exposed, not n - 1"),
    M(TF, "sec = op.count * n * float(costs.gemm_s(op.amount / n, op.te)) * share",
      "sec = op.count * float(costs.gemm_s(op.amount, op.te)) * share", "a chunked GEMM runs whole"),
    M(TF, "kernels += op.count * chunks.get(op.name, 1)", "kernels += op.count", "a chunked GEMM launched once"),
    M(PLAN, "self.tp_comm_overlap_sms.get(layer, TE_OVERLAP_DEFAULT_SMS)", "self.tp_comm_overlap_sms.get(layer, 0)",
      "TE's default margin dropped"),
    M(PLAN, "self.master_param_bytes + 2 * DTYPE_BYTES[self.adam_state_dtype]", "self.master_param_bytes + 8",
      "bf16 Adam moments kept as fp32"),
    M(MEM, "(2 if fsdp2 else 3)", "2", "ZeRO-2 shards weights"),
    M(MEM, "grad_b / np.where(z >= 2, shard, 1)", "grad_b / np.where(z >= 1, shard, 1)", "ZeRO-1 shards gradients"),
    M(MEM, "own + np.where(own < DS_MAX_LIVE_PARAMS, fetched, 0)", "own + fetched",
      "DeepSpeed ZeRO-3 prefetches beside a module above stage3_max_live_parameters"),
    M(MEM, "[own + wait for own, wait in", "[own + 0 * wait for own, wait in",
      "DeepSpeed ZeRO-3's previous full gradient freed before the next one is computed"),
    M(MEM, "np.where(zero3, 2 * layer, 0.0)", "np.where(zero3, layer, 0.0)", "FSDP gathers one layer, not two"),
    M(MEM, 'return plan.dtype_bytes if plan.cross_entropy in ("te", "torch_compiled") else 4',
      "return plan.dtype_bytes", "the loss keeps bf16 logits, not its fp32 softmax"),
    M(MEM, 'plan.cross_entropy in ("te", "torch_compiled") else 4', 'plan.cross_entropy == "te" else 4',
      "Inductor's compiled loss keeps an fp32 softmax"),
    M(OPS, 'if plan.cross_entropy in ("te", "torch_compiled"):', 'if plan.cross_entropy == "te":',
      "the compiled loss priced as eager F.cross_entropy"),
    M(MEM, 'self.tokens = c["mbs"] * m.seq_length / c["cp"]', 'self.tokens = c["mbs"] * m.seq_length',
      "CP does not split activations"),
    M(MEM, "np.where(last & ((not m.tied) | (pp > 1)), vocab, 0.0)", "np.where(last, vocab, 0.0)",
      "tied head on one stage stored twice"),
    M(SCHED, "peak = np.where(warmup < total, warmup + 1, warmup)", "peak = warmup",
      "1F1B holds its warm-up only, not the first steady forward"),
    M(SCHED, "warmup = min(stages - stage - 1, microbatches)", "warmup = min(stages - stage, microbatches)",
      "1F1B warm-up one forward too many"),
    M(SCHED, "chunk if forward else chunks - 1 - chunk, micro)", "chunk, micro)",
      "interleaved backward runs chunks in forward order"),
    # -- collectives and devices (nccl-tests bus bandwidth) --------------------------------------
    M(COST, '"all_reduce": lambda n: 2.0 * (n - 1) / n', '"all_reduce": lambda n: (n - 1) / n', "all-reduce bus 1×"),
    M(COST, '"all_gather": lambda n: (n - 1) / n', '"all_gather": lambda n: 1.0', "all-gather bus factor 1"),
    M(COST, '"reduce_scatter": lambda n: (n - 1) / n', '"reduce_scatter": lambda n: 1.0', "reduce-scatter bus 1"),
    M(COST, '"alltoall": lambda n: (n - 1) / n', '"alltoall": lambda n: 1.0', "all-to-all sends to itself"),
    M(COST, "return nbytes * ranks / nodes * (nodes - 1) / nodes", "return nbytes * (nodes - 1) / nodes",
      "cross-node all-to-all: one GPU's bytes through the NIC"),
    M(COST, "f / np.minimum(peak * c(f), ceiling)", "f / (peak * c(f))", "GEMMs above the sustained ceiling"),
    M(COST, 'ceiling.get("bf16", np.inf) if dtype == "fp8"', 'np.inf if dtype == "fp8"',
      "fp8 training's bf16 GEMMs without bf16's ceiling"),
    M(COST, "ATTENTION_VS_GEMM = 0.75", "ATTENTION_VS_GEMM = 1.0",
      "guessed attention (no fitted kernel) at the GEMM rate"),
    M(COST, 'kernel["bwd" if shape.backward else "fwd"]', 'kernel["fwd"]',
      "attention backward at the forward's fitted efficiency"),
    # -- power-capped GPUs (tests/test_power_limit.py by hand)
    M(COST, "self.peak_flops = nominal * fraction", "self.peak_flops = nominal",
      "GEMMs run at the nominal clock under a power cap", _t("power_limit")),
    M("config/system.py", "return low + (high - low) * (limit_w - low_w) / (high_w - low_w)", "return low",
      "a limit between measured ones at the lower one's throughput", _t("power_limit")),
    M(TF, 'if split == "bucket" and self.job.plan.zero_stage <= 1 and (stage > 0 or chunk > 0):',
      'if split == "bucket" and self.job.plan.zero_stage <= 1 and stage > 0:',
      "Megatron splits later chunks of the first stage into buckets too"),
    M(FAST, "own = chunk_k", "own = np.zeros_like(pass_s)", "a later chunk's single bucket never exposed"),
    M(FAST, "for tail in range(4):", "for tail in (0, 3):",
      "ZeRO-1's first chunk: only its whole and its last bucket (not the embedding's bucket after the layers')"),
    # -- host dispatch (tests/test_host_dispatch.py by hand; the fast path's host bounds against the graph)
    M(TF, "first = min(kernels, 1)", "first = kernels", "a segment's first kernel waits for all its launches",
      _t("host_dispatch")),
    M(TF, "body_share = (cost.kernels - 1) / cost.kernels if cost.kernels > 1 else 0.0", "body_share = 0.0",
      "a segment's kernels all wait for its last launch", _t("host_dispatch")),
    M(FAST, "host_s[rows] = (M[rows, None] * issued + below + last_pass).max(axis=1)",
      "host_s[rows] = (issued + below + last_pass).max(axis=1)", "a stage's host issues one micro-batch, not M",
      _t("host_dispatch")),
    M(FAST, "done[:, s] = np.maximum(done[:, s], done[:, s + 1] + down[:, s + 1])",
      "done[:, s] = np.maximum(done[:, s], done[:, s + 1])",
      "GPipe: micro-batch 0's first backward reaches a stage without running on the stages after it",
      _t("fast_estimate")),
    M(FAST, "done[:, s] = np.maximum(done[:, s], done[:, s + 1] + down[:, s + 1])",
      "done[:, s] = np.maximum(done[:, s], done[:, s + 1] + np.maximum(down, issued - issued_f)[:, s + 1])",
      "GPipe: each step down the stages waits for the host to issue a backward it issued during the forwards",
      _t("fast_estimate")),
    M(FAST, "after_launch = np.where(split, in_buckets, last_kernel[rows, None] + whole)",
      "after_launch = 0 * np.where(split, in_buckets, last_kernel[rows, None] + whole)",
      "nothing of the last backward runs after its last launch", _t("host_dispatch", "fast_estimate")),
    M(FAST, 'return np.maximum(tail(1), np.where(units(2, "k_") > 0, before, 0.0))', "return tail(1)",
      "a bucketed backward ends with its last bucket, not the bucket before's communication behind it",
      _t("host_dispatch", "context_parallel")),
    M(FAST, "return np.maximum(stream_s - (end_s - stream_end_s), host_s - (end_s - host_end_s))",
      "return stream_s", "overlapped reductions released at the stream's pace when the host binds",
      _t("host_dispatch", "context_parallel")),
    M(FAST, "host_pace = {n: kernels[n] * launch_s + f[f\"w_{n}\"] for n in",
      "host_pace = {n: f[n] + 0 * launch_s for n in",
      "behind its host a unit's backward ends its stream time after the one before, not its launches'",
      _t("host_dispatch")),
    M(FAST, "return np.minimum(compute_s * (1 + slowdown), compute_s + slowdown / (1 + slowdown) * comm_s)",
      "return (compute_s + slowdown / (1 + slowdown) * comm_s)",
      "compute beside a collective longer than it is slowed past (1 + s) × itself", _t("fast_estimate")),
    M(FAST, "    compute_s = pass_s - blocking_s\n", "    compute_s = pass_s\n",
      "a segment's blocking TP communication slowed like its compute", _t("fast_estimate")),
    M(FAST, "end = start + _slowed(seconds, np.maximum(free - start, 0.0), slowdown, blocking[j] if blocking else 0.0)",
      "end = start + _slowed(seconds, np.maximum(free - end, 0.0), slowdown, blocking[j] if blocking else 0.0)",
      "a ZeRO-3 unit's overlap counted from the unit before's end, not its own start", _t("fast_estimate")),
    M(FAST, "reducing = vp * (inner + _slowed(after, one, slowdown, after_blocking) - after)",
      "reducing = vp * (inner + _slowed(segment, one, slowdown, segment_blocking) - segment)",
      "a backward's last bucket reduction beside its own backward, not the pass after it", _t("fast_estimate")),
    M(FAST, "sends_b = np.where(reduce_s[:, None] > 0, 0.0, vp - (np.arange(pp) == 0)[None, :])",
      "sends_b = vp - (np.arange(pp) == 0)[None, :]",
      "a backward's send counted again inside its last bucket's ZeRO-2 reduction", _t("fast_estimate")),
    M(FAST, "1 + stretch_f / np.maximum(tf, 1e-300), 1 + stretch_b / np.maximum(tb, 1e-300)",
      "np.ones(len(t)), np.ones(len(t))",
      "what outlasts the slowed passes priced as if they ran alone (the reductions' end held still)",
      _t("fast_estimate", "context_parallel")),
    M(ATT, 'and entry.get("kernel", kernel) == kernel', "",
      "any fitted attention kernel prices the one the plan names"),
    M(COST, 'get("bf16", nominal) if dtype == "fp8" else', 'get("fp8", nominal) if dtype == "fp8" else',
      "fused attention runs in FP8"),
    M(COST, "group.per_node * self.system.nic_bandwidth_per_gpu_bytes_per_s()",
      "self.system.nic_bandwidth_per_gpu_bytes_per_s()", "a node's NICs serve one rank of the group"),
    M(COST, 'one_way * (2 if kind == "all_reduce" else 1)', "one_way", "all-reduce latency one way"),
    M(COST, "hops_intra = float(group.size - 1) - hops_inter", "hops_intra = float(group.per_node - 1)",
      "a ring's steps inside the nodes counted in one node only"),
    M(COST, "hops_inter = float(group.nodes - 1)", "hops_inter = float(np.ceil(np.log2(group.nodes)))",
      "a ring's steps across nodes counted as a tree's"),
    M(COST, "node_nic_bw = self.system.network.nics_per_node * self.system.network.nic_bandwidth_bytes_per_s",
      "node_nic_bw = self.system.nic_bandwidth_per_gpu_bytes_per_s()",
      "a full node's NIC cap taken as one GPU's share of the NICs", _t("collective_full_node")),
    M("costs/fitting.py", 'fit.get("node_nic_fraction", 1.0) * np.asarray(node_nic_bw', "np.asarray(node_nic_bw",
      "full nodes drive every NIC at the partial groups' rate (fitted fraction ignored)",
      _t("collective_full_node")),
    M(COST, "if cross_node\n            else self.system.node.intra_node_bandwidth_bytes_per_s",
      "if not cross_node\n            else self.system.node.intra_node_bandwidth_bytes_per_s",
      "pipeline sends on the wrong link"),
    M(TOPO, "per_node = max(1, min(size, gpus_per_node // stride))", "per_node = max(1, min(size, gpus_per_node))",
      "placement ignores the stride"),
    # -- DeepSpeed v0.3's ZeRO-3: per-tensor list collectives (workloads/transformer.py _deepspeed_fetch) ---------
    M(TF, "lists = len(tensors) * (1 if forward else 2)", "lists = len(tensors)",
      "the backward's gradient reduce-scatter lists not copied apart", _t("deepspeed_zero3")),
    M(TF, 'norm = (h,) if m.family == "llama" else (h, h)', "norm = (h,)", "a LayerNorm's bias not a tensor of its own",
      _t("deepspeed_zero3")),
    M(TF, "((m.seq_length * h,) if m.learned_positions else ())", "()",
      "learned positions not gathered", _t("deepspeed_zero3")),
    M(TF, "return sum(costs.collective_s(op, n * nbytes, self.groups.grad) for n in tensors)",
      "return costs.collective_s(op, sum(tensors) * nbytes, self.groups.grad)",
      "a unit's tensors gathered as one collective, paying one latency", _t("deepspeed_zero3")),
    M(TF, "if per_tensor\n                        else", "if False\n                        else",
      "the gradients reduce-scattered as one collective per unit", _t("deepspeed_zero3")),
    M(TF, "(2 if m.gated_mlp else 1) * h * f, f * h)", "h * f, f * h)",
      "a gated MLP's fused first weight half its size", _t("deepspeed_zero3")),
    M(TF, "return args[1] * self.groups.grad.size * self.stage_gpus[args[0]].kernel_launch_overhead_s",
      "return args[1] * self.stage_gpus[args[0]].kernel_launch_overhead_s",
      "a list collective copies one view, not one per data-parallel rank", _t("deepspeed_zero3")),
    # -- DLRM (TorchRec sharding) -----------------------------------------------------------------
    M(DLRM, '"alltoall", float(a2a_bytes.max()), group)', '"alltoall", float(a2a_bytes.mean()), group)',
      "pooled all-to-all priced at the mean rank, not the busiest"),
    M(DLRM, "rw_bytes += b * world * t.embedding_dim * F32", "rw_bytes += b * t.embedding_dim * F32",
      "row-wise reduce-scatter of the local batch, not all B"),
    M(DLRM, "model.mlp_params() * ADAM_STEP_ACCESSES * F32", "model.mlp_params() * ADAM_BYTES * 2",
      "Adam moves its weight, gradient and state once each way, not what its 7 operators read and write"),
    M(DLRM, 'costs.memory_s("elementwise", 2 * dense_bytes)),', 'costs.memory_s("elementwise", 4 * dense_bytes)),',
      "dense gradients copied into the buffer, then divided in a second pass before the all-reduce"),
    M(DLRM, '(2 * mlp_bytes if model.exchange == "point_to_point" else 0.0)', "0.0",
      "the MLPs' gradients never copied back out of the all-reduced buffer"),
    M(DLRM, '(2 * mlp_bytes if model.exchange == "point_to_point" else 0.0)', "2 * mlp_bytes",
      "DDP's buckets priced as the emulation's flat buffer"),
    M(EMB, "table.num_rows * (4 * table.embedding_dim * F32", "table.num_rows * (3 * table.embedding_dim * F32",
      "replica update reads its gradient once, not for the norms and again for addcmul_"),
    M(EMB, "pooled + 2 * per_lookup + (work.rows", "pooled + per_lookup + (work.rows",
      "replica backward never reads its lookups' gathered gradient rows back (index_add_)"),
    M(HOST, '"replica_embedding_bwd": REPLICA_BWD_OPS * replicas', '"replica_embedding_bwd": replicas',
      "a replica's backward one operator, not zeros_like, index and index_add_"),
    M(HOST, '"ddp_from_buckets": 1 + mlp_tensors if ddp', '"ddp_from_buckets": mlp_tensors if ddp',
      "the all-reduced buffer never divided by the world size"),
    M(EMB, "ShardWork(B * P / world, table.num_rows / world", "ShardWork(B * P, table.num_rows / world",
      "row-wise shard looks up every index"),
    M(EMB, "part = d // len(shard.ranks)", "part = d", "column-wise shard holds every column"),
    M(DLRM, "model.dense_features + outputs + f * d + model.interaction_width() + cross_inputs",
      "model.dense_features + outputs + model.interaction_width() + cross_inputs",
      "the interaction's input (the bottom output beside the pooled vectors) not kept for its backward"),
    M(DLRM, 'held["activations"][on] += work.index_bytes', 'held["activations"][on] += 0.0',
      "a shard's indices and bag lengths not kept for the embedding backward"),
    M(DLRM, "(model.dcn_layers - 1) * f * d if", "model.dcn_layers * f * d if",
      "the cross net's last output counted twice (it is the top MLP's input)"),
    M(SHARDING, "tuple(sorted(load[r] for r in shard.ranks))", "()",
      "the greedy planner treats every rank as equal whatever it holds"),
    M(DLRM, "load[r].append((name, s.strategy, len(s.ranks)))", "load[r].append((s.strategy, len(s.ranks)))",
      "ranks holding different tables of one strategy counted as equal"),
    M(DLRM, "if not every_rank and co_running is None and not shared_cores:",
      "if not every_rank and co_running is None:",
      "the planner's CPU ranks, which share their host's cores, simulated one of each load", _t("dlrm", "dlrm_host")),
    M(DLRM, "first.setdefault(load, r)", "first[load] = r",
      "the planner's step simulated on the last rank of each load, not the first (rank 0 left out)"),
    M(DLRM, "dx = input_grad or n > 0", "dx = True", "the bottom MLP computes a gradient for its dense input"),
    M(DLRM, "relu = last_relu or n < len(layers) - 1", "relu = True", "the top MLP's logit layer priced with a ReLU"),
    M(HOST, "(MLP_FWD_OPS + MLP_BWD_OPS) * top - 2,", "(MLP_FWD_OPS + MLP_BWD_OPS) * top,",
      "the logit layer issues a ReLU and its backward"),
    M(DLRM, 'bottom = issue("bottom_mlp_fwd", comp, bottom_fwd, comp_, "mlp")\n'
            '        emb = issue("embedding_fwd", comp, emb_fwd[r], comp_, "embedding", [indices])\n',
      'emb = issue("embedding_fwd", comp, emb_fwd[r], comp_, "embedding", [indices])\n'
      '        bottom = issue("bottom_mlp_fwd", comp, bottom_fwd, comp_, "mlp")\n',
      "the bottom MLP after the lookups, hiding the pooled exchange"),
    M(DLRM, '"host", before if host.on_compute else []', '"host", []',
      "a CPU's host issues the operators that read an exchange before the exchange has ended", _t("dlrm_host")),
    M(DLRM, "shared = simulate_shared(graph, system.node.gpus_per_node, {})", "shared = simulate_shared(graph, 1, {})",
      "a CPU host's ranks share one core among them all", _t("dlrm_host")),
    M(DLRM, "shared_cores = system.gpu.executes_on_host and system.num_nodes == 1",
      "shared_cores = system.gpu.executes_on_host",
      "CPU ranks on several hosts share one host's cores", _t("dlrm_host")),
    M(DLRM, "sim = simulate(graph.with_durations(shared.end_s - shared.start_s))", "sim = simulate(graph)",
      "a CPU rank's collectives run beside its compute on a core of their own", _t("dlrm_host")),
    M(HOST, "forward = owns * (1 + 2 * (world - 1)) + peers + row_wise", "forward = owns + peers + row_wise",
      "an owner sends its peers their pooled parts without a concatenation and an isend each"),
    M(HOST, '"embedding_bwd": 2 * sharded + owned_pooled * ddp,', '"embedding_bwd": 2 * sharded,',
      "a table-wise shard updated without concatenating the pooled gradients its peers sent"),
    M(HOST, 'if model.exchange == "torchrec":', 'if model.exchange != "torchrec":',
      "TorchRec's collectives counted as the point-to-point emulation's operators"),
    M(HOST, '"grad_all_reduce": math.ceil(dense_bytes / TORCH_DDP_BUCKET_BYTES) if ddp else 0,',
      '"grad_all_reduce": 1 if ddp else 0,', "DDP all-reduces one bucket whatever the gradients' size"),
    M(DLRM, "top_bwd += 2 * float(costs.gemm_s(", "top_bwd += float(costs.gemm_s(", "dot interaction backward 1 GEMM"),
    M(EMB, "self.lookups * INDEX_BYTES + self.bags * LENGTH_BYTES", "self.lookups * INDEX_BYTES",
      "input distribution without bag lengths"),
    M(EMB, "distinct * 2 * (work.dim * F32 + ADAGRAD_ROW_BYTES)", "distinct * (work.dim * F32 + ADAGRAD_ROW_BYTES)",
      "Adagrad update reads rows but writes none"),
    M(DLRM, "dense_bytes = mlp_bytes + dp_bytes", "dense_bytes = mlp_bytes",
      "replicated tables' gradients not all-reduced"),
    # -- the fast path (closed form) --------------------------------------------------------------
    M(FAST, "(total - slowest) / v + 2 * (p - 1) * g", "(total - slowest) / v + (p - 1) * g", "one send per hop"),
    M(FAST, "fill_drain = (total - slowest) / v", "fill_drain = (total - slowest)", "interleaving shrinks no bubble"),
    M(FAST, '(period > slowest), 2 * g["p2p"], 0.0)', '(period > slowest), 0.0, 0.0)',
      "1F1B's fill and drain sends off its round trips"),
    M(FAST, "stream = vp * send + (vp - 1) * np", "stream = vp * send + 0 * np",
      "an interleaved p2p stream never waits for a pass"),
    M(FAST, "(2 * pp * vp + pp - 3) * send", "2 * (pp - 1) * send",
      "the last micro-batch's trip over the first chunk only"),
    M(FAST, "window = pass_s * (per_chunk - 1) / per_chunk", "window = pass_s", "last bucket hides behind its pass"),
    M(FAST, 'gathering = ((zero == 1) | (zero == 2)) & (c["overlap_param"] > 0)',
      'gathering = (zero == 1) & (c["overlap_param"] > 0)', "ZeRO-2 gathers no parameters"),
    # -- the simulator and variability -------------------------------------------------------------
    M("sim/kernels.py", "e = end[in_src[k]] + in_lat[k]\n", "e = end[in_src[k]]\n", "edge latency ignored"),
    M("sim/montecarlo.py", "dur = dur[head]", "dur = dur", "collective members draw apart"),
    M("sim/contention.py", "stretch = slowdown / (1.0 + slowdown)", "stretch = slowdown",
      "overlap stretched by s, not s/(1 + s): the work done during the overlap charged at full rate"),
    M("sim/contention.py", "new[1:] = starts[1:] > ends[:-1]", "new[1:] = True",
      "collectives in flight together slow compute once each"),
    M("sim/contention.py", "np.where(compute, s, 0.0)", "np.where(graph.category != Category.HOST, s, 0.0)",
      "a blocking collective on the compute stream slowed by itself"),
    M("sim/contention.py", " & (rank_of_task != rank))", ")", "a co-running rank slowed by its own compute"),
    M("sim/contention.py", "compute & (node_of_task == node_of[rank]) & ", "compute & ",
      "ranks on other nodes co-run"),
    M(DLRM, "alone.duration_s, 1.0) - 1.0, 0.0)", "alone.duration_s, 1.0), 0.0)",
      "co-running s taken as the ratio of prices, not the ratio − 1", _t("corunning")),
    M(VAR, "            dur[self.comm] *= shared\n", "", "the per-step shared factor spares communication"),
    M("costs/host_overheads.py", "max(sum(counts.values()) - 1.0, 0.0) * self.op_us",
      "sum(counts.values()) * self.op_us", "T5 after an operator's last runtime call too"),
    M("traces/tensor_parallel.py", 'durations[task] *= group_time_ratio(model, "all_reduce", nbytes, old, tp)',
      "durations[task] *= 1.0", "TP all-reduces not re-timed for the new group"),
    M("sim/sharing.py", "rate = min(1.0, cores / load) if load > cores else 1.0", "rate = 1.0",
      "ranks beyond the host's cores run at full speed"),
    M("sim/sharing.py", "rate = np.where(load > cores, cores / np.maximum(load, cores), 1.0)",
      "rate = np.ones_like(load)", "the trace's own sharing not divided out"),
    M("sim/sharing.py", "if uses_core[task] and work[task] > DONE_S:", "if work[task] > DONE_S:",
      "GPU kernels take a host core"),
    M("sim/sharing.py", "if ranks <= cores or kind not in", "if ranks < cores or kind not in",
      "a collective waits for the scheduler when every rank has a core"),
    M(TF, '("memory", stage, "optimizer", optimizer_bytes)', '("memory", stage, "elementwise", optimizer_bytes)',
      "the graph's optimizer step at an elementwise pass's efficiency", _t("step_by_hand")),
    M(FAST, 'costs.memory_s("optimizer", optimizer_step_bytes(', 'costs.memory_s("elementwise", optimizer_step_bytes(',
      "the fast path's optimizer step at an elementwise pass's efficiency"),
    M(COST, '        self.memory.setdefault("optimizer", self.memory["elementwise"])\n', "",
      "curves without an optimizer curve cannot price the optimizer step", _t("step_by_hand")),
    M(SHARDING, "plans = [chosen, *(u for u in uniform if u != chosen)]", "plans = [chosen, *uniform]",
      "the greedy choice priced and listed again when it is a uniform plan", _t("dlrm")),
    M(TTT, "    last = rest_s + fm.checkpoint_s if rest_s > 0 else 0.0", "    last = 0.0",
      "the Monte Carlo drops the last, shorter segment of work"),
    M("traces/cpu_collectives.py", 'if m["end_us"] < last_start_us - EPS_US and m["piece"] >= 0:',
      'if False:', "a thread that resumed before its last peer arrived made to wait for it"),
    M("traces/parallel_whatifs.py", "own_s = max(duration_s - scheduler_wait_s(kind, old, cores), 0.0)",
      "own_s = duration_s", "the trace's scheduler waits kept and scaled with the group"),
    M(VAR, "k_task = p.tensor_parallel * p.context_parallel", "k_task = p.tensor_parallel",
      "compute noise: max over tp, not tp×cp"),
    M(VAR, "k_task, p.dp * k_task, None", "k_task, k_task, None",
      "slowest GPU of a stage among tp·cp, not dp·tp·cp"),
    M(VAR, "np.exp(sigma * z - sigma * sigma / 2)", "np.exp(sigma * z)", "log-normal factor's mean above 1"),
    M(VAR, "noise *= lognormal(m.network_cv, rng.standard_normal((1, n)))",
      "noise *= lognormal(m.network_cv, rng.standard_normal((self.comm.size, n)))", "network factor per task"),
    M(VAR, '"dp95_per_cv_s": float((np.percentile(noisy, 95) - base) / delta_cv)',
      '"dp95_per_cv_s": float(np.percentile(noisy, 95) - base)', "sensitivity not per unit of CV"),
    M(VAR, "path_s = float(np.sum(g.duration_s * share * on_path))", "path_s = float(np.sum(g.duration_s * share))",
      "a class's whole time counted as on the critical path"),
    M(VAR, "2 * rho * (1 - rho**n) / (n * (1 - rho) ** 2)", "2 * rho / (n * (1 - rho) ** 2)",
      "an AR(1) mean's variance without its finite-n term", _t("variability_runs", "variability_series")),
    M(VAR, "base = simulate_samples(graph, GraphSampler(step, model, runs), samples, seed)",
      "base = simulate_samples(graph, GraphSampler(step, model), samples, seed)",
      "attribution's base within one run while the halved runs pool across runs", _t("variability_runs")),
    M(VAR, "        super().__init__(step, model, runs)\n", "        super().__init__(step, model)\n",
      "sensitivity's class noise added to a base without the run level", _t("variability_runs")),
    M(VAR, 'or (source == "run_cv" and runs is None)', 'or (source == "run_cv" and runs is not None)',
      "the run level a source within one run (a 0% row), none across runs", _t("variability_runs")),
    M("stochastic/placement.py", "naive = speeds.reshape(n_ranks, gpus_per_rank).min(axis=1)",
      "naive = speeds.reshape(n_ranks, gpus_per_rank).mean(axis=1)", "a stage at its GPUs' mean speed"),
    M("search/job_slicing.py", "costs.time_s / stage_speed[c % p.pipeline_parallel]",
      "costs.time_s * stage_speed[c % p.pipeline_parallel]", "a slow stage's layers re-sliced as if faster",
      _t("speed_map")),
    M(SLICE, "_slice_on(devices, list(range(stages)), microbatches, slack)",
      "_slice_on(devices, [0] * stages, microbatches, slack)", "every stage re-sliced at the first stage's speed",
      _t("speed_map")),
    M(TTT, "/ rate * math.exp(rate * fm.restart_s)", "/ rate", "failures cost no restart"),
    M(TTT, "return num_gpus / self.mtbf_per_gpu_s", "return 1 / self.mtbf_per_gpu_s", "failure rate of one GPU"),
    M(TTT, "/ steps * ar1_mean_variance_factor(steps, step_autocorrelation)", "/ steps",
      "correlated steps average out like independent ones", _t("variability_runs")),
    M(SLICE, "held = min(stages - stage, microbatches)", "held = stages - stage", "in-flight micro-batches unbounded"),
    M(SLICE, "(microbatches - 1) * max(times) + sum(times)", "microbatches * max(times) + sum(times)",
      "pipeline step counts the bottleneck once too often"),
    M("search/distribution_rank.py", "options.samples, options.seed, options.across_runs)",
      "options.samples, options.seed)", "a distribution ranking of one run whatever --across-runs",
      _t("search_objectives")),
    M("cli/search_cmds.py", "            vm = replace(vm, run_cv=run_cv)\n", "",
      "search --run-cv dropped from the ranking's model", _t("search_objectives")),
    M("cli/search_cmds.py", "DistributionOptions(vm, samples, seed, distribution_top, across_runs)",
      "DistributionOptions(vm, samples, seed, distribution_top)", "search --across-runs not passed to the sampling",
      _t("search_objectives")),
    M("search/launch_settings.py", '("model", plan["pointwise_kernels"] == "fused"),',
      '("model", plan["pointwise_kernels"] != "fused"),', "torchtitan launched eager where fused kernels were priced",
      _t("frameworks")),
    M("search/launch_settings.py", '"--moe-token-dispatcher-type alltoall",', '',
      "Megatron-Core launched with its default allgather dispatcher where alltoall was priced", _t("frameworks")),
    M("search/frameworks.py", 'if pointwise_kernels != "fused" and tp_comm_overlap:',
      'if pointwise_kernels != "fused" and not tp_comm_overlap:',
      "torchtitan's async TP searched without the torch.compile it needs", _t("frameworks")),
    # -- tools/ analyses the cost model does not use (their files relative to itercast/ too) -----------
    M("../tools/gemm_waves.py", "return t / (sm_count * np.ceil(t / sm_count))", "return t / (sm_count * t / sm_count)",
      "a GEMM's last wave of tiles fills every SM", _t("gemm_shape")),
    M("../tools/gemm_waves.py", "return wave_fraction(tiles, sm_count) * tile_fill(m_, n_, tile_m, tile_n)",
      "return wave_fraction(tiles, sm_count)", "a GEMM's partial edge tiles do useful work", _t("gemm_shape")),
    M("costs/fitting.py", "pinned: list[float] = [] if e_max is None else [e_max]", "pinned: list[float] = []",
      "a pinned asymptotic efficiency refitted from the points", _t("hbm_ceiling")),
    M("../tools/fit_efficiency_curves.py", "for m in rows if m.size >= HBM_BOUND_BYTES]", "for m in rows]",
      "HBM's ceiling read off kernels the L2 and the launch latency hold back", _t("hbm_ceiling")),
    M(EMB, "(builtin_update_model(costs.system.gpu.name) if eager_update else None)", "None",
      "the eager update on Hopper streamed", _t("embedding_update_hopper")),
    M("workloads/dlrm/config.py", 'return self.exchange == "point_to_point"', "return True",
      "TorchRec's fused update priced as the eager one", _t("embedding_update_hopper")),
    M(EMB, "else builtin_lookup_model(costs.system.gpu.name)", "else None",
      "a Hopper GPU's lookups streamed at HBM speed where the H100 measured gathers", _t("embedding_lookup_hopper")),
    M(FAST, "host_pace = {n: kernels[n] * launch_s + f[f\"w_{n}\"] for n in",
      "host_pace = {n: kernels[n] * launch_s for n in",
      "the host releases a recomputed MoE layer's bucket before its stream could", _t("moe_host_sync")),
    M("../tools/measure_sharding_tasks.py", "rank = min(range(WORLD), key=lambda r: load[r])",
      "rank = max(range(WORLD), key=lambda r: load[r])", "greedy sharders place a table on the most-loaded rank",
      _t("sharding_tasks")),
    M("../tools/measure_sharding_tasks.py", "t.num_rows * t.embedding_dim * 4 <= SMALL_BYTES",
      "t.num_rows * t.embedding_dim <= SMALL_BYTES", "dp_small sizes tables in elements, not fp32 bytes",
      _t("sharding_tasks")),
    M("costs/host_overheads.py", "around_launch_us = 0.0 if on_host else",
      'around_launch_us = self.pooled["t2_us"] + self.pooled["t3_us"] if on_host else',
      "a CPU operator's T2 and T3 charged again on top of its measured time (dispatch counted twice)",
      _t("dlrm_host", "dlrm_host_cpu")),
    M(HOST, 'other = calibration.get("host_overheads_source")', "other = None",
      "host overheads measured on another workload's traces reported as the job's own trace"),
    M("../tools/measure_sharding_tasks.py", '{**cal, "host_overheads": host, "host_overheads_source"',
      '{**cal, "host_overheads_source"', "the planner priced with the TorchRec defaults, not this CPU's MLP traces",
      _t("dlrm_host_cpu")),
    M("costs/op_model.py", '"distinct_row_if_large": cols["lookup"] * unique * large,',
      '"distinct_row_if_large": cols["lookup"] * large,', "every lookup of a large table priced as a distinct row",
      _t("op_model")),
    M("costs/op_model.py", 'cols["gathered_byte"] * (distinct >= accumulator_bytes)',
      'cols["gathered_byte"] * (cols["gathered_byte"] >= accumulator_bytes)',
      "the accumulator's size taken as every lookup's gradient, not the distinct rows'", _t("op_model")),
    M("costs/op_model.py", 'breaks = {name: fit[name] for name, _ in SECOND_BREAKS.values() if name in fit}',
      'breaks = {name: fit[name] for name, _ in SECOND_BREAKS.values() if name in fit and name != "accumulator_bytes"}',
      "a fitted accumulator break ignored when pricing", _t("op_model")),
    M("profile/microbench.py",
      'fingerprint(device) | ({"flush_bytes": flush_bytes} if flush_bytes != FLUSH_BYTES else {})',
      "fingerprint(device)", "rows timed after another flush merged with the default's", _t("profile")),
)
# fmt: on


def _copy(dest: Path) -> None:
    """The repository at `dest`: itercast/ and tests/ copied without bytecode, the rest linked."""
    dest.mkdir(parents=True)
    for entry in ROOT.iterdir():
        if entry.name in COPIED:
            shutil.copytree(entry, dest / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
        elif entry.name not in NOT_LINKED:
            (dest / entry.name).symlink_to(entry)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": ""}


def _pytest(copy: Path, tests: tuple[str, ...], timeout_s: float) -> str:
    """'passed', 'failed' or 'timeout' of `pytest -x -q` on `tests` in `copy`."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        done = subprocess.run(cmd, cwd=copy, env=_env(), capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "timeout"
    return "passed" if done.returncode == 0 else "failed"


def _check_import(copy: Path) -> None:
    """Stop unless a run in `copy` imports the copy's itercast (not the editable install's)."""
    out = subprocess.run(
        [sys.executable, "-c", "import itercast; print(itercast.__file__)"],
        cwd=copy,
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(out).resolve().is_relative_to(copy.resolve()):
        sys.exit(f"a run in {copy} imports itercast from {out}, not from the copy: the mutants would not be tested")


def _run(m: Mutant, copies: queue.Queue[Path], timeout_s: float) -> tuple[str, float]:
    """(killed | survived | timeout | not found | not unique, seconds) of one mutant, in a free copy."""
    copy = copies.get()
    path = copy / "itercast" / m.file
    try:
        text = path.read_text()
        found = text.count(m.before)
        if found != 1:
            return ("not found" if found == 0 else "not unique"), 0.0
        start = time.perf_counter()
        path.write_text(text.replace(m.before, m.after))
        try:
            outcome = _pytest(copy, m.tests or TESTS[m.file], timeout_s)
        finally:
            path.write_text(text)
        return {"passed": "survived", "failed": "killed"}.get(outcome, outcome), time.perf_counter() - start
    finally:
        copies.put(copy)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run the mutants whose file, snippet or description contains this")
    ap.add_argument("--jobs", type=int, default=1, help="mutants at a time, each in its own copy")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per mutant before it counts as killed")
    args = ap.parse_args()
    chosen = [(i, m) for i, m in enumerate(MUTANTS, 1) if args.only in f"{m.file} {m.before} {m.breaks}"]
    if args.list:
        for i, m in chosen:
            found = (ROOT / "itercast" / m.file).read_text().count(m.before)
            state = "" if found == 1 else f"  [{'not found' if found == 0 else 'not unique'} in the working tree]"
            print(f"{i:3d}  {m.file}: {m.breaks}{state}\n     - {m.before!r}\n     + {m.after!r}")
        return 0
    if not chosen:
        sys.exit(f"no mutant matches --only {args.only!r}")
    with tempfile.TemporaryDirectory(prefix="itercast-mutants-") as tmp:
        copies: queue.Queue[Path] = queue.Queue()
        for j in range(max(1, args.jobs)):
            _copy(Path(tmp) / str(j))
            copies.put(Path(tmp) / str(j))
        first = Path(tmp) / "0"
        _check_import(first)
        union = tuple(sorted({t for _, m in chosen for t in (m.tests or TESTS[m.file])}))
        if _pytest(first, union, args.timeout) != "passed":
            sys.exit(f"the unmutated tests fail ({' '.join(union)}): fix them before scoring mutants")
        counts: dict[str, int] = {}
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            runs = [(i, m, pool.submit(_run, m, copies, args.timeout)) for i, m in chosen]
            for i, m, future in runs:
                outcome, seconds = future.result()
                counts[outcome] = counts.get(outcome, 0) + 1
                print(f"{i:3d} {outcome:10s} {seconds:5.0f} s  {m.file}: {m.breaks}", flush=True)
    killed = counts.get("killed", 0) + counts.get("timeout", 0)
    applicable = killed + counts.get("survived", 0)
    missing = counts.get("not found", 0) + counts.get("not unique", 0)
    print(f"killed {killed} of {applicable} applicable one-line mutants ({missing} not applicable)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
