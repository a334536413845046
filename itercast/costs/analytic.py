"""Analytic cost model: roofline with size-dependent efficiency curves fitted to public data.

Accuracy (in-sample, see curves.json `fit_mean_abs_err`; held-out errors are issue #4's job):
GEMM ~7% (H100 bf16), memory-bound 11–14%, intra-node collectives 8–11%, p2p 3–5%; inter-node
all-reduce is piecewise (latency regime < 1 MiB, bandwidth regime above) because NCCL's protocol
switches on Polaris defeat one smooth curve; see curves.json for each regime's error. Fused attention
on Hopper (H100, H200): cuDNN's kernel fitted to the FlashAttention-3 paper's benchmarks
(costs/attention.py; 3.6% forward, 2.8% backward in-sample, 3.8% / 3.6% on held-out sequence
lengths); on other GPUs a guess, labelled as such below.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from itercast.config.system import GPUSpec, SystemConfig
from itercast.costs.attention import TRITON_VS_FA2, AttentionShape, fitted_kernel, time_s
from itercast.costs.curves import Curve, curve, curves, own_curves
from itercast.costs.fitted_ranges import MEASURED_RANGE, FittedRanges
from itercast.costs.fitting import collective_time_s
from itercast.hardware.topology import GroupPlacement

#: Bus-bandwidth factors per rank (nccl-tests PERFORMANCE.md): bytes each rank moves per byte of
#: the collective's full buffer.
BUS_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,  # nccl-tests: broadcast's bus bandwidth is its algorithm bandwidth
}
#: collectives without a fitted curve of their own use the curve of a like one (same ring pipelining)
CURVE_OF = {"broadcast": "all_gather"}


def bus_bytes(kind: str, nbytes: float | np.ndarray, ranks: int, nodes: int) -> float | np.ndarray:
    """Bytes per rank that the collective's bandwidth term divides by the placement's bandwidth per
    rank (NVLink within a node; per_node × NIC bandwidth per GPU across nodes): BUS_FACTOR × the
    buffer, except an all-to-all across nodes, which is bound by each node's NIC rather than by a
    ring: its ranks/nodes ranks each send (nodes − 1)/nodes of their `nbytes` buffer off the node,
    so ranks/nodes × (nodes − 1)/nodes × nbytes. On Alpa's V100 database this makes 2 to 32 ranks
    over 2 and 4 hosts reach the same NIC bandwidth at 1 GB (validation/alpa_collectives.py)."""
    if kind == "alltoall" and nodes > 1:
        return nbytes * ranks / nodes * (nodes - 1) / nodes
    return nbytes * BUS_FACTOR[kind](ranks)


#: Fused attention relative to a GEMM of the same FLOPs on a GPU without a fitted attention kernel
#: (A100, V100, any other): a GUESS. FlashAttention-2 (Dao 2023, abstract) reports 50–73% of peak on
#: A100 where large GEMMs reach ~80%, hence ≈ 0.75; its A100 figures are not transcribed here.
ATTENTION_VS_GEMM = 0.75


def unmeasured_network_note(system: SystemConfig) -> str | None:
    """What the built-in curves of the system's network price without a measurement of that network, said beside
    a forecast that crosses nodes: on EFA (collective_curves h100-efa) the reduce-scatter takes the all-gather's
    fit and the all-to-all and messages below the small regime's bound take InfiniBand's (tools/
    fit_efficiency_curves.py _h100_efa). None on the other networks, whose four collectives were measured, and
    on one node."""
    if system.network.collective_curves != "h100-efa" or system.num_nodes < 2:
        return None
    return (
        "network h100-efa: all-gathers and all-reduces across nodes are priced on EFA's measured curves (2-16 "
        "nodes of p5.48xlarge), reduce-scatters as those all-gathers; all-to-alls, and messages under 128 KiB "
        "(all-gather) or 1 MiB (all-reduce) of bus bytes, on the curves of h100-400g: none of these is measured "
        "on EFA"
    )


class AnalyticCostModel:
    """Seconds per op on one GPU of `system`, for training in `dtype`."""

    def __init__(self, system: SystemConfig, dtype: str, calibration: dict[str, Any] | None = None) -> None:
        """`calibration`: curves in the schema of costs/curves.json (profile.calibrate.load_calibration);
        the built-in curves when None."""
        self.system, self.dtype = system, dtype
        gpu = system.gpu
        peak_key = dtype if dtype in gpu.peak_flops else ("tf32" if dtype == "fp32" else "fp32")
        nominal = gpu.peak_flops.get(peak_key) or gpu.peak_flops["fp32"]
        # below its nominal power the GPU's SM clock drops for compute-bound kernels (GEMMs, attention) only:
        # their peak, not the memory-bound kernels' or the collectives' bandwidths (GPUSpec.power_limit_w)
        fraction = gpu.compute_throughput_fraction()
        self.peak_flops = nominal * fraction
        # FP8 training (Transformer Engine) runs only the linear layers in FP8; fused attention
        # stays in bf16 unless FP8 attention is switched on explicitly (TE docs, `fp8_dpa`).
        self.attention_peak_flops = (gpu.peak_flops.get("bf16", nominal) if dtype == "fp8" else nominal) * fraction
        data = calibration if calibration is not None else curves()
        self._calibration = calibration
        # a GPU's own built-in GEMM and intra-node curves, except for those a calibration fitted (all of a
        # calibration that does not say which: a hand-made one)
        fitted = set() if calibration is None else set(calibration.get("gemm_calibrated", calibration["gemm"]))
        gemms = own_curves(curves()["gemm_by_gpu"], gpu.name, data["gemm"], fitted)
        gemm_key = {"fp32": "tf32", "fp8": "fp8"}.get(dtype, "bf16")
        gemm = gemms[gemm_key]
        self.gemm_curve: Curve = curve(gemm)
        self.gemm_alpha_s = float(gemm["alpha_s"])  # fixed kernel latency: absolute, not scaled by the peak
        # the rate a GEMM sustains at the power limit (GPUSpec.sustained_gemm_flops; inf: none measured); fp16
        # GEMMs take bf16's where they have none of their own, as they take its curve (gemm_key)
        ceiling = gpu.sustained_gemm_flops
        fp16_ceiling = ceiling.get("bf16", np.inf) if dtype == "fp16" else np.inf
        self.gemm_ceiling_flops = ceiling.get(peak_key, fp16_ceiling)
        # GEMMs outside Transformer Engine's FP8 autocast (Megatron-Core's output layer is its own
        # ColumnParallelLinear, the MoE router a plain linear) run in bf16 under FP8 training
        high = gemms["bf16"] if dtype == "fp8" else gemm
        high_ceiling = ceiling.get("bf16", np.inf) if dtype == "fp8" else self.gemm_ceiling_flops
        self._outside_fp8 = (float(high["alpha_s"]), curve(high), self.attention_peak_flops, high_ceiling)
        self._gemm_keys = (gemm_key, "bf16" if dtype == "fp8" else gemm_key)  # inside TE's modules, outside them
        # a calibration that fitted GEMM curves, but not this dtype's: its GEMMs keep the built-in curve, said once
        # priced (`extrapolations`), never silently (a tf32-only profile does not describe bf16 GEMMs)
        self._gemm_fitted = sorted(fitted)
        self._uncalibrated_gemms = {k for k in self._gemm_keys if fitted and k not in fitted}
        self._builtin_gemms_priced: set[str] = set()
        self.memory = {k: (v["alpha_s"], curve(v)) for k, v in data["memory"].items() if isinstance(v, dict)}
        # curves without an optimizer curve of their own (a test's, or written before it existed) price the
        # optimizer step as an elementwise pass
        self.memory.setdefault("optimizer", self.memory["elementwise"])
        intra = data["collectives"]["intra_node"]
        calibrated = set() if calibration is None else set(calibration.get("intra_node_calibrated", intra))
        self.intra = own_curves(curves()["collectives"]["intra_node_by_gpu"], gpu.name, intra, calibrated)
        # an all-to-all within a mesh node: a calibration's, fitted on the same bandwidths, or the built-in one
        self.mesh_alltoall_curve = (
            self.intra["alltoall"] if "alltoall" in calibrated else curves()["collectives"]["mesh_alltoall"]
        )
        # the network's measured cluster, with a calibration's own inter-node fits over it
        measured = data["collectives"].get("inter_node_networks", {}).get(system.network.collective_curves, {})
        self.inter = {**measured, **data["collectives"].get("inter_node", {})}
        self.p2p = data["collectives"]["p2p"]
        self._attention_tables: dict = data.get("attention", {})
        # the sizes each calibrated curve was fitted on (profile.calibrate writes MEASURED_RANGE) and the least
        # and most this model has priced on it since: `extrapolations` says where the two part
        measured = {
            f"{section}.{key}": (float(fit[MEASURED_RANGE][0]), float(fit[MEASURED_RANGE][1]))
            for section, fits in (
                ("gemm", data["gemm"]),
                ("memory", data["memory"]),
                ("collectives.intra_node", self.intra),
                ("collectives.inter_node", data["collectives"].get("inter_node", {})),
            )
            for key, fit in fits.items()
            if isinstance(fit, dict) and MEASURED_RANGE in fit
        }
        self._ranges = FittedRanges(
            measured, "calibrated", "curve", lambda name: "FLOPs" if name.startswith("gemm") else "bytes"
        )

    def _note(self, section: str, key: str, sizes: np.ndarray | float) -> None:
        """Widen the range of sizes priced on curve `section.key`, when it is a calibrated one (nothing to do,
        and no name built, without a calibrated range: the built-in curves' hot paths)."""
        if self._ranges.fitted:
            self._ranges.note(f"{section}.{key}", sizes)

    def extrapolations(self) -> list[str]:
        """One line per calibrated curve this model priced sizes on more than EXTRAPOLATION_FACTOR times
        outside the sizes it was fitted on: its fit there is the curve's shape carried on, not a measurement;
        and one per GEMM dtype it priced on the built-in curve although the calibration fitted GEMMs of
        other dtypes only."""
        unfitted = [
            f"the calibration fitted GEMM curves for {', '.join(self._gemm_fitted)} only: this job's {key} GEMMs "
            f"are priced on the built-in {key} curve (profile {key} GEMMs on the device, then calibrate)"
            for key in sorted(self._builtin_gemms_priced)
        ]
        return unfitted + self._ranges.lines()

    def on_gpu(self, gpu: GPUSpec) -> AnalyticCostModel:
        """The same curves on another GPU of the system (a device group of a mixed cluster)."""
        if gpu == self.system.gpu:
            return self
        return AnalyticCostModel(self.system.model_copy(update={"gpu": gpu}), self.dtype, self._calibration)

    def gemm_s(self, flops: np.ndarray | float, te: bool = True) -> np.ndarray:
        """Dense matmul: latency + FLOPs / min(peak · eff(FLOPs), the GPU's sustained ceiling at its power
        limit, GPUSpec.sustained_gemm_flops). `te` False: a GEMM outside
        Transformer Engine's modules, in bf16 when the training dtype is fp8. Every plan.fp8_recipe
        is priced on the one fp8 curve: torchao rowwise runs a row-wise kernel only in each linear's
        forward GEMM (its backward GEMMs run per-tensor cuBLAS and rescale: pytorch/ao@36027d82
        torchao/float8/float8_ops.py addmm_float8_unwrapped), and published kernel times put that
        kernel at x1.00-x1.10 of per-tensor cuBLAS at training shapes, geomean x1.03, under the 5%
        fixed beforehand (data/published/kernels/fp8_rowwise_gemm_h100.csv, validation/kernel_tables.py)."""
        f = np.asarray(flops, dtype=np.float64)
        alpha_s, c, peak, ceiling = (
            (self.gemm_alpha_s, self.gemm_curve, self.peak_flops, self.gemm_ceiling_flops) if te else self._outside_fp8
        )
        key = self._gemm_keys[0 if te else 1]
        self._note("gemm", key, f)
        if key in self._uncalibrated_gemms:
            self._builtin_gemms_priced.add(key)
        return np.where(f > 0, alpha_s + f / np.minimum(peak * c(f), ceiling), 0.0)

    def attention_s(self, flops: np.ndarray | float, shape: AttentionShape | None = None) -> np.ndarray:
        """Fused (flash) attention of the given FLOPs: latency + FLOPs / (bf16 peak · the efficiency
        at `shape` of its kernel, fitted for this GPU) (costs/attention.time_s); on a GPU without a
        fit of that kernel, or without a shape, the guess of ATTENTION_VS_GEMM; llm-foundry's Triton kernel
        FlashAttention-2's time × TRITON_VS_FA2."""
        if shape is not None and shape.kernel == "triton":  # FlashAttention-2's time, slower by TRITON_VS_FA2
            slower = TRITON_VS_FA2["bwd" if shape.backward else "fwd"]
            return slower * self.attention_s(flops, replace(shape, kernel="fa2"))
        f = np.asarray(flops, dtype=np.float64)
        kernel = None if shape is None else fitted_kernel(self._attention_tables, self.system.gpu.name, shape.kernel)
        if kernel is None or shape is None:
            rate = self.attention_peak_flops * self.gemm_curve(f) * ATTENTION_VS_GEMM
            return np.where(f > 0, self.gemm_alpha_s + f / rate, 0.0)
        fit = kernel["bwd" if shape.backward else "fwd"]
        problems = shape.heads * shape.calls
        return time_s(fit, f, problems, shape.head_dim, shape.causal, self.attention_peak_flops, shape.calls)

    def memory_s(self, kind: str, nbytes: np.ndarray | float) -> np.ndarray:
        """Memory-bound kernel of `kind` (elementwise | norm | activation | optimizer) moving `nbytes` of
        HBM; an elementwise pass reaches at most 0.90 of the datasheet bandwidth, what this project's
        H100 kernels measure beyond 1 GiB with caches flushed, and a fused multi-tensor Adam step 0.70,
        what the lent H200's fused AdamW measured, taken as the same fraction on every GPU (measured on the
        H200 alone; tools/fit_efficiency_curves.py fit_memory). Below the curve's least-time size
        (Curve.least_time_size, about 0.7 MB for the elementwise curve) a kernel takes the time it takes
        there (1.1 µs on an H100), not more: kernels this small measure flat, vidur's H100 `add` at 1.0 µs
        from 24 KB (one token of Llama-2-7B, microsoft/vidur@7d47513) and this project's H100 profile's
        pointwise kernels at 3.9–4.3 µs from 12 KB to 0.8 MB (data/measured/h100_profile.db, CUDA events
        after a cache flush, which both add to a kernel inside a step)."""
        floor_s, c = self.memory[kind]
        b = np.asarray(nbytes, dtype=np.float64)
        self._note("memory", kind, b)
        moved = np.maximum(b, c.least_time_size())
        return np.where(b > 0, floor_s + moved / (self.system.gpu.hbm_bandwidth_bytes_per_s * c(moved)), 0.0)

    def collective_s(self, kind: str, nbytes: float, group: GroupPlacement) -> float:
        """NCCL-style collective of a full buffer of `nbytes` over `group`.

        One node: the group's NVLink/NVSwitch bandwidth per GPU (on a mesh node, the links its GPUs have to each
        other: NodeSpec.group_bandwidth_bytes_per_s, its curve's ramp scaled alike: fitting.collective_time_s; an
        all-to-all there, its exchanges with each peer, NodeSpec.alltoall_bandwidth_bytes_per_s, on the curve
        fitted on such exchanges, curves.json collectives.mesh_alltoall).
        Several nodes: the ring is limited by the slowest hop, min(that bandwidth of a node's per_node GPUs,
        per_node × NIC bandwidth per GPU) (a hierarchical/rail approximation), and by the curve's
        `node_nic_fraction` of the node's NICs × NIC bandwidth, what a ring reaches when every GPU of the node
        drives its NIC at once (fitting.collective_time_s; 1, no cap, where a curve has none), with the latency
        its fit chose:
        growing in log2(nodes) (the all-reduce's tree) or with the ranks − 1 steps of NCCL's ring (the
        all-gather and reduce-scatter measured on Polaris up to 2,160 ranks) or with the ranks − 1 peers
        of an all-to-all (Polaris's, to 2,160 ranks); an all-to-all's bytes across nodes are those
        through the NIC (bus_bytes). A collective without an inter-node curve of its own on the
        system's network (a calibration's that fits the all-reduce alone) reuses the all-reduce curve
        per bus byte. Across nodes the curve's ramp, and the size regime it is chosen by, run on the bytes scaled by
        the network's NIC bandwidth against the one the curve was fitted on (network_ramp_scale, _regime).
        """
        n = group.size
        if n <= 1 or nbytes <= 0:
            return 0.0
        bus = float(bus_bytes(kind, nbytes, n, group.nodes))
        node = self.system.node
        curve_kind = kind if kind in self.intra else CURVE_OF.get(kind, kind)
        in_node_bw = node.in_node_bandwidth_bytes_per_s(kind, group.per_node, group.stride)
        if group.intra_node:
            mesh_alltoall = kind == "alltoall" and node.nvlink_links is not None
            fit = self.mesh_alltoall_curve if mesh_alltoall else self.intra[curve_kind]
            ramp_scale = node.intra_node_bandwidth_bytes_per_s / in_node_bw  # > 1 on a share of a mesh's links
            self._note("collectives.intra_node", curve_kind, bus)
            time_s = float(collective_time_s(fit, bus, group.nodes, n, in_node_bw, None, ramp_scale))
        else:
            self._note("collectives.inter_node", curve_kind if curve_kind in self.inter else "all_reduce", bus)
            time_s = self._inter_node_s(self.inter.get(curve_kind, self.inter["all_reduce"]), bus, group, in_node_bw)
        return max(time_s, self.latency_floor_s(kind, group))

    def _inter_node_s(self, entry: dict, bus: float, group: GroupPlacement, in_node_bw: float) -> float:
        """`bus` bytes a rank across nodes on the curve `entry` (its regime for the size: _regime), at most what the
        smallest message of the next regime takes: NCCL can run a smaller message as it runs a larger one, so where a
        regime fitted on small messages prices more than the next regime does at its bound the bound's price holds (at
        128 nodes x 8 an InfiniBand all-gather of 128 KB 4.33 ms, of a little more 2.43 ms; an all-reduce of 1 MB
        across 2 nodes x 1 0.58 ms, of a little more 0.15 ms, where Polaris measured 0.14 ms across 2 nodes x 4)."""
        nic_per_gpu = self.system.nic_bandwidth_per_gpu_bytes_per_s()
        node_nic_bw = self.system.network.nics_per_node * self.system.network.nic_bandwidth_bytes_per_s
        bw = min(in_node_bw, group.per_node * nic_per_gpu)

        def used_nic(fit: dict) -> float:
            """The NIC bandwidth a GPU's share of the ring reaches on `fit`: its own, or the least at which the ring's
            bandwidth stops growing with it (in-node bandwidth, or the fit's share of the node's NICs, binding)."""
            per_nic = min(float(group.per_node), fit.get("node_nic_fraction", 1.0) * node_nic_bw / nic_per_gpu)
            return min(nic_per_gpu, in_node_bw / per_nic)

        def price_s(fit: dict, nbytes: float) -> float:
            scale = network_ramp_scale(fit, used_nic(fit))
            return float(collective_time_s(fit, nbytes, group.nodes, group.size, bw, node_nic_bw, scale))

        nic_per_gpu_used = used_nic(entry.get("regimes", [entry])[0])
        fit = _regime(entry, bus, nic_per_gpu_used)
        if fit.get("max_bus_bytes") is None:
            return price_s(fit, bus)
        bound = fit["max_bus_bytes"] / max(network_ramp_scale(fit, nic_per_gpu_used), 1.0)  # as _regime takes it
        return min(price_s(fit, bus), price_s(_regime(entry, bound, nic_per_gpu_used), bound))

    def latency_floor_s(self, kind: str, group: GroupPlacement) -> float:
        """The least time a collective takes on the spec's hop latencies: ⌈log2⌉ hops within a node
        and across nodes (NCCL's tree for all-reduce, PAT for all-gather / reduce-scatter), twice
        for an all-reduce (reduce up, broadcast down); one round for an all-to-all, whose peers
        exchange at once. An all-gather or reduce-scatter with several GPUs a node across nodes runs
        NCCL's ring instead, ranks − 1 hops of which nodes − 1 cross the network (NCCL src/graph/tuning.cc:
        ncclPatEnable only with one GPU a node; the ring's latency is its intra-node steps plus its
        nNodes − 1 network steps). The fitted curves carry the latency of the clusters they were measured
        on; this floor is what makes a slower network, or a larger ring, than those slow small collectives
        down."""
        if kind == "alltoall":
            hops_intra, hops_inter = float(group.per_node > 1), float(group.nodes > 1)
        elif kind in ("all_gather", "reduce_scatter") and group.nodes > 1 and group.per_node > 1:
            hops_inter = float(group.nodes - 1)
            hops_intra = float(group.size - 1) - hops_inter
        else:
            hops_intra, hops_inter = np.ceil(np.log2(group.per_node)), np.ceil(np.log2(group.nodes))
        one_way = hops_intra * self.system.node.intra_node_latency_s + hops_inter * self.system.network.latency_s
        return float(one_way * (2 if kind == "all_reduce" else 1))

    def p2p_s(self, nbytes: float, cross_node: bool, stride: int) -> float:
        """Point-to-point send of `nbytes` (pipeline activations) to the GPU `stride` ranks on: vidur's H100
        send_recv fits, in one node on the NVLink bandwidth per GPU, across nodes on one GPU's share of the NICs.
        In a mesh node (nvlink_links) a send is one exchange of a 2-GPU all-to-all of twice its bytes, priced as
        such: on the pair's exchange bandwidth (NodeSpec.pair_bandwidth_bytes_per_s), on the curve fitted on Alpa's
        p3.16xlarge 2-GPU all-to-alls (mesh_alltoall_curve), its ramp scaled as a collective's. Those exchanges
        reach 0.57 of one link, where vidur's H100 sends reach 0.83 of the bandwidth they are given, so on the
        pair's links that fit had priced them 32% too fast (validation/kernel_tables.py). Across nodes the curve's ramp
        runs on the bytes scaled by the network's NIC bandwidth against vidur's (network_ramp_scale)."""
        if nbytes <= 0:
            return 0.0
        node = self.system.node
        if not cross_node and node.nvlink_links is not None:
            bw = node.pair_bandwidth_bytes_per_s(stride)
            ramp_scale = node.intra_node_bandwidth_bytes_per_s / bw
            send_s = float(collective_time_s(self.mesh_alltoall_curve, nbytes, 1, 2, bw, None, ramp_scale))
            return max(send_s, node.intra_node_latency_s)
        fit = self.p2p["inter_node" if cross_node else "intra_node"]
        bw = self.system.nic_bandwidth_per_gpu_bytes_per_s() if cross_node else node.intra_node_bandwidth_bytes_per_s
        hop_s = self.system.network.latency_s if cross_node else node.intra_node_latency_s
        ramp_bytes = nbytes * (network_ramp_scale(fit, bw) if cross_node else 1.0)
        return max(float(fit["alpha0_s"] + nbytes / (bw * curve(fit)(ramp_bytes))), hop_s)


def network_ramp_scale(fit: dict, nic_bandwidth_per_gpu_bytes_per_s: float) -> float:
    """How many times faster an inter-node fit's efficiency ramp runs, in bytes, on a network of this NIC bandwidth per
    GPU (bytes/s; SystemConfig.nic_bandwidth_per_gpu_bytes_per_s) than on the one it was measured on (the fit's
    `fitted_nic_bandwidth_per_gpu_bytes_per_s`): their ratio. A ramp in bytes is latency seen as lost bandwidth:
    Hockney's t = α + n/β has the efficiency n / (n + αβ), half at n = αβ bytes, fewer on a slower network by its
    bandwidth's ratio, as a mesh node's share of its links scales the intra-node ramp (AnalyticCostModel.collective_s).
    Unscaled, Polaris's small-message ramp (fitted at 12.5 GB/s a GPU) priced a 1 MB all-reduce across 2 nodes of
    v100-p3.16xlarge (25 Gb/s a node: 0.39 GB/s a GPU) at 45.8 ms and a larger one at 4.5 ms
    (validation/collective_monotonicity.py), and Alpa's measured all-gathers of 1-16 MB across p3.16xlarge hosts
    +263% (mean; scaled, −16%: validation/alpa_collectives.py). A fit without the field (a calibration's, fitted on
    the user's own network) runs as fitted: 1."""
    fitted = fit.get("fitted_nic_bandwidth_per_gpu_bytes_per_s", nic_bandwidth_per_gpu_bytes_per_s)
    return float(fitted) / nic_bandwidth_per_gpu_bytes_per_s


def _regime(entry: dict, bus_bytes: float, nic_bandwidth_per_gpu_bytes_per_s: float) -> dict:
    """A fit may be piecewise in size: the first regime whose `max_bus_bytes` covers the size both in bytes and as
    the bytes it would be on the network the regime was measured on (× network_ramp_scale). NCCL's protocol and
    algorithm switches lie where one's latency stops paying for another's bandwidth, at sizes in proportion to the
    bandwidth, as the ramps': on a network r times slower a regime measured below B bytes covers those below B / r.
    On a faster one it is not carried past B, the sizes it was measured on: Polaris's small-message all-reduce, carried
    to 4 MB on InfiniBand's 4× faster NICs, priced a 4 MB all-reduce across 2 H100 nodes at 1.48 ms where the large
    regime measured at such sizes prices 0.22 ms."""
    for regime in entry.get("regimes", [entry]):
        bound = regime.get("max_bus_bytes")
        scale = max(network_ramp_scale(regime, nic_bandwidth_per_gpu_bytes_per_s), 1.0)
        if bound is None or bus_bytes * scale < bound:
            return regime
    return entry["regimes"][-1]
