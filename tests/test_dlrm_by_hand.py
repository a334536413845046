"""A DLRM step's exchanges and updates computed by hand, on test_golden's linear calibration (a
collective takes its nccl-tests bus bytes over the link: (n − 1)/n of an all-to-all's,
reduce-scatter's or all-gather's buffer, 2(n − 1)/n of an all-reduce's; a memory-bound kernel its
bytes over HBM; a GEMM its FLOPs over the peak).

The model: 2 tables of 1,000 rows × 16 (fp32), 4 lookups a sample; bottom MLP 8 → 16, top MLP
19 → 8 → 1 (3 pairwise dots of the F = 3 vectors and the 16-wide dense vector), 313 parameters;
2 ranks of 64 samples: B = 128 samples a step.
"""

from __future__ import annotations

import pytest
from test_dlrm import model, system
from test_golden import HBM, LINK, PEAK, linear_calibration

from itercast.workloads.dlrm import DLRMStep, Shard, dlrm_step, no_overheads

B, D, MLP = 128, 16, 313  # samples of the step, embedding width, MLP parameters


def seconds(plan: dict[str, Shard]) -> dict[str, list[float]]:
    """Durations of the step's tasks by name (one per rank), on the linear calibration, without host
    time (a task split at its operators' launches would be listed in parts)."""
    step: DLRMStep = dlrm_step(model(2), system(2), plan, B // 2, linear_calibration(), host_overheads=no_overheads())
    g, out = step.graph, {}
    for t in range(g.num_tasks):
        out.setdefault(g.names[g.name[t]], []).append(float(g.duration_s[t]))
    return out


def test_pooled_all_to_all_is_set_by_the_busiest_rank():
    # rank 0 owns both tables: it sends 2 tables × B × 16 × 4 bytes of pooled vectors, rank 1
    # nothing; the all-to-all lasts as long as rank 0's half leaving it (Mudigere et al. 2022)
    stacked = seconds({"t0": Shard("table_wise", (0,)), "t1": Shard("table_wise", (0,))})
    assert stacked["pooled_exchange"] == pytest.approx([1 / 2 * 2 * B * D * 4 / LINK] * 2)
    assert stacked["pooled_grad_exchange"] == pytest.approx([1 / 2 * 2 * B * D * 4 / LINK] * 2)


def test_table_wise_and_column_wise_shards_exchange_in_one_all_to_all_each():
    # 4 ranks of 32 samples (B = 128). TorchRec runs one output dist per sharding type: t0 table-wise on
    # rank 0 sends B × 16 × 4 bytes, t1 column-wise on ranks 2 and 3 8 of its 16 columns each, B × 8 × 4;
    # two all-to-alls, each as long as its busiest rank's 3/4 leaving it (one all-to-all of rank 0's
    # bytes alone, the busiest of a merged exchange, before)
    plan = {"t0": Shard("table_wise", (0,)), "t1": Shard("column_wise", (2, 3))}
    step = dlrm_step(model(2), system(4), plan, B // 4, linear_calibration(), host_overheads=no_overheads())
    g = step.graph
    names = [g.names[g.name[t]] for t in range(g.num_tasks)]
    two = 3 / 4 * B * D * 4 / LINK + 3 / 4 * B * 8 * 4 / LINK
    for name in ("pooled_exchange", "pooled_grad_exchange"):
        assert [float(g.duration_s[t]) for t, n in enumerate(names) if n == name] == pytest.approx([two] * 4)


def test_row_wise_partial_sums_of_every_sample_are_reduce_scattered():
    # each rank's shard of a row-wise table pools partial sums for all B samples (B × 16 × 4
    # bytes a table), reduce-scattered forward and their gradients all-gathered backward
    rows = seconds({"t0": Shard("row_wise", (0, 1)), "t1": Shard("row_wise", (0, 1))})
    assert rows["pooled_exchange"] == pytest.approx([1 / 2 * 2 * B * D * 4 / LINK] * 2)
    assert rows["pooled_grad_exchange"] == pytest.approx([1 / 2 * 2 * B * D * 4 / LINK] * 2)


def test_adam_and_the_replicas_adagrad_move_what_their_operators_read_and_write():
    # Adam over the MLPs, per parameter (torch's _single_tensor_adam): lerp_ of m (reads m and the
    # gradient, writes m: 3 fp32 accesses), mul_ of v (2), addcmul_ of v (v and the gradient twice
    # read, v written: 4), sqrt (2), divided by the bias correction (2), + ε (2), addcdiv_ of the
    # weight (weight, m and the denominator read, weight written: 4): 19 × 4 bytes. Each replicated
    # table's dense row-wise Adagrad reads its all-reduced gradient twice (row norms, addcmul_) and
    # reads and writes every row (4 × 16 × 4 bytes), and its per-row chain makes 17 fp32 accesses
    # (norm 1, pow_ 2, div_ 2, state += 3, sqrt 2, + ε 2, −lr / x 4, scale 1)
    table_wise = seconds({"t0": Shard("table_wise", (0,)), "t1": Shard("table_wise", (1,))})
    assert table_wise["optimizer"] == pytest.approx([MLP * 19 * 4 / HBM] * 2)
    replicas = seconds({"t0": Shard("data_parallel", (0, 1)), "t1": Shard("data_parallel", (0, 1))})
    assert replicas["optimizer"] == pytest.approx([(MLP * 19 * 4 + 2 * 1000 * (4 * D * 4 + 17 * 4)) / HBM] * 2)


def test_replicated_tables_gradients_are_all_reduced_with_the_mlps():
    # (313 + 2 tables × 1,000 × 16) fp32 gradients all-reduced over 2 ranks: 2·1/2 of the buffer
    replicas = seconds({"t0": Shard("data_parallel", (0, 1)), "t1": Shard("data_parallel", (0, 1))})
    assert replicas["grad_all_reduce"] == pytest.approx([(MLP + 2 * 1000 * D) * 4 / LINK] * 2)


def test_dot_interaction_and_top_mlp_forward_and_backward_by_hand():
    # per rank 64 rows. Top MLP layers (19 → 8, 8 → 1): GEMM 2·64·in·out FLOPs and, on the first,
    # the ReLU output written and read (2·64·8·4 bytes) forward, twice both backward; the last layer
    # is the logit, a bare Linear (no ReLU). The interaction: pairwise dots of the 3 vectors, a
    # batched GEMM of 2·64·3·3·16 FLOPs forward, two backward
    b = B // 2
    mlp_fwd = (2 * b * 19 * 8 / PEAK + 2 * b * 8 * 4 / HBM) + 2 * b * 8 * 1 / PEAK
    dots = 2 * b * 3 * 3 * D / PEAK
    got = seconds({"t0": Shard("table_wise", (0,)), "t1": Shard("table_wise", (1,))})
    assert got["interaction_top_mlp_fwd_bwd"] == pytest.approx([3 * mlp_fwd + 3 * dots] * 2)


def test_the_bottom_mlp_computes_no_gradient_for_its_dense_input():
    # bottom MLP 8 → 16 on 64 rows: forward GEMM 2·64·8·16 FLOPs and the ReLU output (2·64·16·4
    # bytes); backward the weight gradient GEMM alone (the dense features need no gradient) and the
    # ReLU's gradient twice the activation's bytes, as the curve prices a backward
    b = B // 2
    gemm, act = 2 * b * 8 * 16 / PEAK, 2 * b * 16 * 4 / HBM
    got = seconds({"t0": Shard("table_wise", (0,)), "t1": Shard("table_wise", (1,))})
    assert got["bottom_mlp_fwd"] == pytest.approx([gemm + act] * 2)
    assert got["bottom_mlp_bwd"] == pytest.approx([gemm + 2 * act] * 2)


def test_the_bottom_mlp_runs_before_the_lookups_and_never_hides_the_pooled_exchange():
    # no input distribution; t0 on rank 0, t1 on rank 1. Each rank: the bottom MLP (8 → 16 on 64
    # rows: 2·64·8·16 FLOPs and its ReLU output 2·64·16·4 bytes), then its table's lookups for all
    # B = 128 samples (512 rows of 16 × 4 bytes read, 128 pooled vectors written); the pooled
    # all-to-all starts when both ranks have done both (TorchRec's DLRM.forward: dense_arch first)
    m = model(2).model_copy(update={"input_distribution": False})
    plan = {"t0": Shard("table_wise", (0,)), "t1": Shard("table_wise", (1,))}
    step = dlrm_step(m, system(2), plan, B // 2, linear_calibration(), host_overheads=no_overheads())
    g, sim = step.graph, step.sim
    bottom = 2 * 64 * 8 * 16 / PEAK + 2 * 64 * 16 * 4 / HBM
    lookups = (512 * 16 * 4 + 128 * 16 * 4) / HBM
    starts = [float(sim.start_s[t]) for t in range(g.num_tasks) if g.names[g.name[t]] == "pooled_exchange"]
    assert starts == pytest.approx([bottom + lookups] * 2)
