"""The hardware: GPU, node and network specs, in seconds, bytes and FLOP/s (DESIGN.md §2)."""

from __future__ import annotations

from itertools import pairwise
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from itercast.config.presets import preset, preset_names
from itercast.config.strict import STRICT, Ranks


class PowerLimits(NamedTuple):
    """A GPU family's rated board power and the compute throughput it sustains below it."""

    nominal_w: float
    #: (power limit in W, fraction of the nominal compute throughput), ascending, all below nominal_w
    measured: tuple[tuple[float, float], ...] = ()


#: By GPU name prefix. Fractions measured at kernel level (data/published/kernels/power_limit_gemm.csv,
#: derived by the rule in its NOTES: validation/kernel_tables.py prints the derivation).
POWER_LIMITS: dict[str, PowerLimits] = {
    # H100 SXM5 datasheet: up to 700 W. 500 W: pytorch/FBGEMM PR #2546, cuBLAS bf16 at 500 W (stated) over the
    # bf16 curve as fitted, 3 shapes: time ratios 0.841, 0.815, 0.777, geomean 0.811 (one source: thin)
    "H100-SXM": PowerLimits(700.0, ((500.0, 0.811),)),
    "H200-SXM": PowerLimits(700.0),  # H200 datasheet (SXM): up to 700 W
    "A100-SXM4": PowerLimits(400.0),  # A100 datasheet (SXM4): 400 W
    "V100-SXM2": PowerLimits(300.0),  # V100 datasheet (SXM2): 300 W
}


class GPUSpec(BaseModel):
    """One accelerator. Peak FLOP/s are dense (no sparsity); a missing dtype is unsupported."""

    model_config = STRICT

    name: str
    peak_flops: dict[Literal["fp32", "tf32", "bf16", "fp16", "fp8"], PositiveFloat]
    hbm_bytes: PositiveFloat
    hbm_bandwidth_bytes_per_s: PositiveFloat
    l2_bytes: PositiveFloat
    kernel_launch_overhead_s: NonNegativeFloat = Field(
        11.3e-6,
        description="Host time per operator that launches one kernel: PyTorch's dispatch and the CUDA driver's "
        "launch, 11.28 µs measured on an H100 host (`itercast calibrate data/measured/h100_profile.db --system "
        "dgx-h100`, NNLS over its 21 `host` program rows), the default for every GPU whose host was not measured. "
        "Lin et al. HiPC'22's T_launch ≈ 4–6 µs is the runtime call alone; their T1–T3 around it are host time too. "
        "A transformer's: a DLRM's host is priced from T1–T5 measured on traces (workloads/dlrm/host.py; "
        "`calibrate --host-trace` for your own), which this field does not change.",
    )
    supports_flash_attention: bool = Field(
        True,
        description="FlashAttention-2 runs on it (Ampere or newer, compute capability ≥ 8.0: Dao-AILab/"
        "flash-attention README, 'Installation and features'); where false, plans default to unfused attention.",
    )
    executes_on_host: bool = Field(
        False,
        description="The accelerator is the host CPU itself (the cpu-host preset): operators run on the "
        "thread that dispatches them, so host overheads add to the compute instead of overlapping it.",
    )
    sm_count: PositiveInt | None = Field(
        None,
        description="Streaming multiprocessors (NVIDIA whitepapers): the GEMMs of Transformer Engine's "
        "tensor-parallel overlaps run on those their communication leaves (PlanConfig.tp_comm_overlap_sms).",
    )
    overlap_compute_slowdown: NonNegativeFloat = Field(
        0.0,
        description="How much longer compute runs while a collective is in flight beside it on the same GPU "
        "(another stream): its time alone × (1 + this) when fully overlapped. NCCL's kernels hold SMs (one CTA "
        "per channel) and HBM bandwidth: Lee et al., arXiv 2507.03114, measured 0.189 on average on A100, H100, "
        "MI250 and MI210 (max 0.40); presets cite theirs. 0 (the default) treats hidden communication as free. "
        "Read by predict() on model-built transformer steps (sim/contention.py), by the search's fast path "
        "(search/fast_estimate.py, each segment's compute before its blocking communication) and within each "
        "layer pass (workloads/transformer.py pass_cost: a kernel beside a tensor-, expert- or context-parallel "
        "collective, unless the SMs it takes are priced or copy engines move it).",
    )
    reserved_bytes: NonNegativeFloat | None = Field(
        None,
        description="Memory per GPU not available to tensors. None (the default): per plan, the CUDA context "
        "(0.75 GiB, measured) and NCCL's buffers (256 MiB per communicator the plan uses): memory.reserve_bytes, "
        "with sources. A number: that flat reserve instead (torchtitan's DeepEP buffers, a plan's, stay on top).",
    )
    sustained_gemm_flops: dict[Literal["fp32", "tf32", "bf16", "fp16", "fp8"], PositiveFloat] = Field(
        default_factory=dict,
        description="Dense GEMM FLOP/s the GPU sustains at its nominal power limit once its clocks settle (tensor "
        "cores busy for seconds, as through a training step): a ceiling on every GEMM of that dtype, above the "
        "fitted curve's short-burst rate where that is higher. Presets cite their measurement; a dtype left out "
        "has no ceiling (the curve alone), but fp16, which takes bf16's (the same tensor cores, operand width and "
        "GEMM curve).",
    )
    power_limit_w: PositiveFloat | None = Field(
        None,
        description="The board power limit in watts (`nvidia-smi -pl`, or a lower-TDP part of the family such "
        "as the 500 W H100 SXM of Meta's Grand Teton hosts); None runs at the family's nominal power, the curves "
        "as fitted. Below nominal the SM clock drops for compute-bound kernels: GEMMs and attention run at "
        "compute_throughput_fraction() of their nominal FLOP/s; memory-bound kernels and collectives are unchanged. "
        "Only families and limits with kernel-level measurements are accepted (POWER_LIMITS).",
    )

    @model_validator(mode="after")
    def _power_limit_measured(self) -> GPUSpec:
        """A power limit must be one whose throughput was measured (see compute_throughput_fraction)."""
        self.compute_throughput_fraction()
        return self

    def compute_throughput_fraction(self) -> float:
        """Fraction of the nominal compute FLOP/s sustained at `power_limit_w` (1 when unset or nominal):
        linear in watts between the measured limits of POWER_LIMITS and 1.0 at nominal (two points for
        H100: a straight line between them is an assumption). A limit above the family's nominal power,
        below its lowest measured limit, or on a GPU without a known nominal power is an error."""
        limit_w = self.power_limit_w
        if limit_w is None:
            return 1.0
        family = next((f for f in POWER_LIMITS if self.name.startswith(f)), None)
        if family is None:
            raise ValueError(
                f"gpu.power_limit_w({limit_w:g}): the nominal power of {self.name} is not known (GPU names starting "
                f"with {', '.join(POWER_LIMITS)} are); leave power_limit_w unset"
            )
        nominal_w, measured = POWER_LIMITS[family]
        points = (*measured, (nominal_w, 1.0))
        if limit_w > nominal_w or limit_w < points[0][0]:
            raise ValueError(
                f"gpu.power_limit_w({limit_w:g}) for {self.name}: expected {points[0][0]:g} to {nominal_w:g} W "
                f"(nominal {nominal_w:g} W; no kernel-level measurement below {points[0][0]:g} W)"
            )
        for (low_w, low), (high_w, high) in pairwise(points):
            if limit_w <= high_w:
                return low + (high - low) * (limit_w - low_w) / (high_w - low_w)
        return 1.0  # limit_w == nominal_w with no measured limit below it


class NodeSpec(BaseModel):
    """GPUs in one host and the fabric between them."""

    model_config = STRICT

    gpus_per_node: Ranks
    intra_node_bandwidth_bytes_per_s: PositiveFloat = Field(
        description="Per GPU, one direction (e.g. NVLink4: 900 GB/s bidirectional → 450e9)."
    )
    intra_node_latency_s: NonNegativeFloat = Field(
        2e-6, description="One NVLink/NVSwitch hop; an order-of-magnitude estimate. Floors collectives in a node."
    )
    nvlink_links: Annotated[
        tuple[Annotated[tuple[Annotated[int, Field(ge=0, le=64)], ...], Field(strict=False, max_length=64)], ...]
        | None,
        Field(strict=False, max_length=64),
    ] = Field(
        None,
        description="A node whose GPUs are joined by direct links, not a switch (DGX-1's and the p3.16xlarge's "
        "hybrid cube-mesh): the links between each two of its GPUs, `nvidia-smi topo -m`'s NV# (0 where it says "
        "SYS), symmetric with a zero diagonal. One link carries intra_node_bandwidth_bytes_per_s / the most links "
        "a GPU has. A node of fewer GPUs than the matrix (gpus_per_node set below it: a job on GPUs 0 … k − 1) uses "
        "the links among its first gpus_per_node GPUs. Left out: a switch, on which every group of the node's GPUs "
        "gets the GPU's whole bandwidth.",
    )
    host_path_bandwidth_bytes_per_s: PositiveFloat | None = Field(
        None,
        description="Per GPU, one direction, on a node with nvlink_links: what a GPU sends in all, at once, to the "
        "GPUs of its node it has no link to, through PCIe and the CPUs (NCCL's PATH_SYS): an all-to-all's exchanges "
        "with such peers, which the NCCL of Alpa's measurements did not route over another GPU's links, a "
        "pipeline's or a context-parallel ring's sends to one, and a ring collective's GPU with no link to its "
        "group, priced alike. Required "
        "where nvlink_links leaves two of the node's GPUs without a link.",
    )

    @model_validator(mode="after")
    def _mesh_shape(self) -> NodeSpec:
        """A link matrix is square, of gpus_per_node GPUs or more, symmetric, zero on its diagonal and holds a link;
        where it leaves two of the node's GPUs without one, the node says what they send each other through the
        host."""
        links, n = self.nvlink_links, self.gpus_per_node
        if links is None:
            return self
        size = len(links)
        if size < n or any(len(row) != size for row in links):
            got = [len(row) for row in links]
            raise ValueError(
                f"nvlink_links: expected {n} rows (gpus_per_node) or more, each as long as there are rows; got rows "
                f"of {got}: give the links of this node's GPUs, or null for a switch"
            )
        for i in range(size):
            for j in range(size):
                if links[i][j] != links[j][i] or (i == j and links[i][j]):
                    raise ValueError(
                        f"nvlink_links: expected a symmetric matrix with a zero diagonal; got [{i}][{j}] = "
                        f"{links[i][j]} and [{j}][{i}] = {links[j][i]}"
                    )
        if not any(map(any, links)):
            raise ValueError(
                "nvlink_links: expected at least one link; got none (a node whose GPUs share no NVLink, PCIe only, is "
                "not priced): give the links of this node's GPUs, or null for a switch"
            )
        unlinked = next(((i, j) for i in range(n) for j in range(i + 1, n) if not links[i][j]), None)
        if unlinked is not None and self.host_path_bandwidth_bytes_per_s is None:
            raise ValueError(
                f"host_path_bandwidth_bytes_per_s: expected a bandwidth (bytes/s per GPU) where nvlink_links leaves "
                f"GPUs {unlinked[0]} and {unlinked[1]} without a link (an all-to-all's exchanges and the sends between "
                "them go through PCIe and the CPUs); got none"
            )
        return self

    def group_bandwidth_bytes_per_s(self, size: int, stride: int) -> float:
        """Per GPU, one direction: what a collective's ring over `size` GPUs of this node, `stride` apart, can
        send at once, in the worst of the node's groups so laid out (Megatron's: blocks of size × stride GPUs
        holding `stride` interleaved groups; pairs wider than half the node: every pair that fits), which the
        others wait for.

        On a switch (no nvlink_links) the GPU's bandwidth. On a mesh, one link's bandwidth × the links the
        worst-joined GPU of the worst group has to the rest of its group (the rings NCCL lays over a group pass
        each GPU through those links alone, in both directions). A GPU with none rides the host path: NCCL's
        topology holds only the communicator's own GPUs (src/graph/topo.cc ncclTopoGetSystem: "Detect only the
        GPU managed by this process. We'll get any others through XML fusion" of the local ranks;
        ncclTopoAddNvLinks adds no link to a GPU outside it), so it has no path through another GPU's links
        (PATH_NVB) to one of the group, and Alpa's measured exchanges without a link ran at the host path's rate
        (alltoall_bandwidth_bytes_per_s). On the p3.16xlarge this gives 1 link for GPUs 0 and 1, 4 for GPUs 0–3,
        2 for GPUs 0, 2, 4, 6 and 6 for all 8, where Alpa's measured all-reduces from 128 MiB reach 22.4, 82, 44
        and 131 GB/s of bus bandwidth, 0.82–0.90 of those links at 25 GB/s
        (data/profiling/alpa_v100_p3.16xlarge_prof_db.csv; validation/kernel_tables.py), and the host path for
        GPUs 0 and 7 (no link; 2 links through GPU 4 until session 38)."""
        links = self.nvlink_links
        if links is None or size <= 1:
            return self.intra_node_bandwidth_bytes_per_s
        link_bw, host_bw = self._link_bandwidth_bytes_per_s(links), self.host_path_bandwidth_bytes_per_s
        joined = (sum(links[i][j] for j in group) for group in self._groups(size, stride) for i in group)
        return min(link_bw * count if count else host_bw for count in joined)  # type: ignore[type-var, return-value]

    def in_node_bandwidth_bytes_per_s(self, kind: str, size: int, stride: int) -> float:
        """Per GPU, one direction: what collective `kind` over `size` GPUs of this node, `stride` apart, rides: an
        all-to-all its exchanges with each peer (alltoall_bandwidth_bytes_per_s), any other collective its ring
        (group_bandwidth_bytes_per_s). What the cost model prices a group with and a calibration fits it against."""
        if kind == "alltoall":
            return self.alltoall_bandwidth_bytes_per_s(size, stride)
        return self.group_bandwidth_bytes_per_s(size, stride)

    def alltoall_bandwidth_bytes_per_s(self, size: int, stride: int) -> float:
        """Per GPU, one direction: what an all-to-all over `size` GPUs of this node, `stride` apart, sends at once,
        in the worst of the node's groups so laid out (as group_bandwidth_bytes_per_s lays them): size − 1 times
        the slowest peer's rate, as every GPU sends each peer as much and the exchange ends with the slowest.

        On a switch the GPU's bandwidth. On a mesh NCCL's all-to-all sends each peer over a point-to-point
        connection of its own: a linked peer at the bandwidth of the links between them, a peer without a link at
        an even share of what the GPU sends through the host to all such peers of its group
        (host_path_bandwidth_bytes_per_s; the NCCL Alpa ran did not send them through another GPU's links: the same
        database's 4-GPU all-to-all of GPUs 0, 2, 4 and 6, which a ring rides at 2 links a GPU, reaches 3.2 GB/s a
        peer). Alpa's p3.16xlarge all-to-alls of 2 and 4 GPUs cannot tell one link a peer from all of the pair's:
        every layout it ran (GPUs 0 and 4 beside 2 and 6, …) has a slowest pair joined by one link, 14.2 GB/s a peer
        from 1 GiB. All the pair's, since a 2-GPU exchange over many links is far faster than one: vidur's 2-GPU
        all-reduces on Azure's NC A100 v4 pairs (network__a100_pairwise_nvlink__all_reduce.csv), a ring of the
        same point-to-point connection, reach 195 GB/s of bus bandwidth at 512 MiB, where one NVLink3 link carries
        25 (three NVLink bridges join two A100s by 12). Until session 38's end a linked peer took one link's
        bandwidth however many."""
        links = self.nvlink_links
        if links is None or size <= 1:
            return self.intra_node_bandwidth_bytes_per_s
        slowest = min(
            self._peer_rate_bytes_per_s(links, i, j, sum(not links[i][k] for k in group if k != i))
            for group in self._groups(size, stride)
            for i in group
            for j in group
            if j != i
        )
        return (size - 1) * slowest

    def _peer_rate_bytes_per_s(self, links: tuple[tuple[int, ...], ...], i: int, j: int, unlinked_peers: int) -> float:
        """One direction, from GPU i of this mesh to GPU j over NCCL's point-to-point connection while i sends to
        `unlinked_peers` GPUs it has no link to at once: the links i and j share × one link's bandwidth; without
        one, an even share of the host path (alltoall_bandwidth_bytes_per_s gives the measurements)."""
        if links[i][j]:
            return self._link_bandwidth_bytes_per_s(links) * links[i][j]
        return self.host_path_bandwidth_bytes_per_s / unlinked_peers  # type: ignore[operator]

    def _groups(self, size: int, stride: int) -> list[list[int]]:
        """The groups of `size` GPUs `stride` apart Megatron lays over this node: blocks of size × stride GPUs
        holding `stride` interleaved groups; where a block is wider than the node, the pairs {r, r + stride} of its
        embedding groups, as many as fit."""
        n = self.gpus_per_node
        block, span = size * stride, (size - 1) * stride
        if span >= n:
            raise ValueError(f"a group of {size} GPUs {stride} apart does not fit in a node of {n}")
        starts = (
            [s + o for s in range(0, n - block + 1, block) for o in range(stride)] if block <= n else range(n - span)
        )
        return [[b + k * stride for k in range(size)] for b in starts]

    def _link_bandwidth_bytes_per_s(self, links: tuple[tuple[int, ...], ...]) -> float:
        """One link's bandwidth, one direction: the GPU's over the most links a GPU of the matrix has."""
        return self.intra_node_bandwidth_bytes_per_s / max(sum(row) for row in links)

    def pair_bandwidth_bytes_per_s(self, stride: int) -> float:
        """Per GPU, one direction: what every GPU of this node sends at once to the GPU `stride` after it over NCCL's
        point-to-point transport (pipeline stages `stride` GPUs apart, a context-parallel ring's neighbours), in the
        worst pair. On a switch the GPU's bandwidth; on a mesh what one exchange of an all-to-all with that peer
        rides (alltoall_bandwidth_bytes_per_s): the pair's links, the whole host path where it has none. On the
        p3.16xlarge: 25 GB/s for GPUs 0 and 1 (1 link), 50 for 0 and 4 (2), 4.96 GB/s for 3 and 4 (none), where the
        path through GPU 0 (NCCL's PATH_NVB) gave 50 until session 38. An NCCL
        that relays such a send through an intermediate GPU of its communicator (p2p.cc's P2P/indirect) could do
        better; the only measured exchange without a link (Alpa's all-to-all of GPUs 0, 2, 4 and 6, whose 2 and 4
        have GPU 0 between them in the communicator) ran at the host path's rate."""
        links, n = self.nvlink_links, self.gpus_per_node
        if links is None or stride >= n:
            return self.intra_node_bandwidth_bytes_per_s
        return min(self._peer_rate_bytes_per_s(links, r, r + stride, 1) for r in range(n - stride))


class NetworkSpec(BaseModel):
    """Scale-out network between nodes."""

    model_config = STRICT

    nics_per_node: Ranks
    nic_bandwidth_bytes_per_s: PositiveFloat = Field(description="Per NIC, one direction.")
    latency_s: NonNegativeFloat = Field(
        20e-6, description="One hop between nodes (NIC + switch). Floors collectives and sends across nodes."
    )
    collective_curves: Literal["polaris-slingshot11", "h100-400g", "h100-efa"] = Field(
        "polaris-slingshot11",
        description="The measured cluster whose inter-node collective curves price this network "
        "(costs/curves.json, tools/fit_efficiency_curves.py): ALCF Polaris, Slingshot 11 with 2 NICs "
        "per 4 A100, whose large all-reduces reach 0.65 of the NICs; or 10 nodes of 8×H100 with "
        "400 Gb/s per GPU (xxrjun/nccl-tests-cluster): 0.97–0.98 of the NICs a group's GPUs drive, a full node's "
        "ring capped at 0.65–0.82 of its 8 NICs (all-to-all uncapped); or AWS p5.48xlarge nodes over EFA "
        "(crazyguitar/aws-gpu-communication-benchmark, 2–16 nodes of 8 H100): all-gather and all-reduce measured, "
        "the all-gather's latency growing with the ring's steps, the all-reduce's with log2 of the nodes, "
        "reduce-scatter as the all-gather, all-to-all as h100-400g's "
        "(not measured on EFA). A calibration's inter-node fits replace any of them.",
    )


class DeviceGroup(BaseModel):
    """Nodes of one GPU kind in a mixed cluster (the system's node and network specs apply)."""

    model_config = STRICT

    gpu: GPUSpec
    num_nodes: Ranks


class SystemConfig(BaseModel):
    """A cluster of identical nodes, or with `device_groups` of nodes whose GPUs differ."""

    model_config = STRICT

    name: str = "custom"
    gpu: GPUSpec
    node: NodeSpec
    network: NetworkSpec
    num_nodes: Ranks = 1
    device_groups: Annotated[tuple[DeviceGroup, ...], Field(strict=False, max_length=64)] = Field(
        (),
        description="A mixed cluster: groups of nodes, each with its GPU (`{preset: SYSTEM, num_nodes: N}` or "
        "`{gpu: {...}, num_nodes: N}`); pipeline stages run on the groups in this order, each group hosting "
        "as many stages as it has tensor × context × data-parallel GPU sets. num_nodes is their sum.",
    )

    @model_validator(mode="before")
    @classmethod
    def _nodes_of_groups(cls, data: Any) -> Any:
        """With device groups, num_nodes is their sum (given, it must agree)."""
        groups = data.get("device_groups") if isinstance(data, dict) else None
        if not groups or not isinstance(groups, list | tuple):
            return data
        total = sum(
            g.get("num_nodes", 0) for g in groups if isinstance(g, dict) and isinstance(g.get("num_nodes"), int)
        )
        given = data.get("num_nodes")
        if given is not None and given != total:
            raise ValueError(
                f"num_nodes is {given} but the device groups hold {total} nodes; give one or make them agree"
            )
        return {**data, "num_nodes": total}

    @property
    def gpu_kinds(self) -> list[GPUSpec]:
        """The GPU of each device group, or the system's one GPU without groups."""
        return [g.gpu for g in self.device_groups] or [self.gpu]

    @property
    def supports_flash_attention(self) -> bool:
        """Every GPU of the system runs FlashAttention (GPUSpec.supports_flash_attention)."""
        return all(g.supports_flash_attention for g in self.gpu_kinds)

    def stage_gpus(self, stages: int, gpus_per_stage: int) -> list[GPUSpec]:
        """The GPU of each of `stages` pipeline stages of `gpus_per_stage` GPUs each: the groups in
        order, each hosting its GPUs // gpus_per_stage stages (one GPU kind without groups)."""
        if not self.device_groups:
            return [self.gpu] * stages
        out: list[GPUSpec] = []
        for g in self.device_groups:
            gpus = g.num_nodes * self.node.gpus_per_node
            if gpus % gpus_per_stage:
                raise ValueError(
                    f"a device group of {gpus} {g.gpu.name} GPUs does not hold whole stages of {gpus_per_stage} GPUs "
                    "(tensor × context × data parallel)"
                )
            out += [g.gpu] * (gpus // gpus_per_stage)
        if len(out) != stages:
            raise ValueError(f"the device groups hold {len(out)} pipeline stages; the plan has {stages}")
        return out

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.node.gpus_per_node

    def nic_bandwidth_per_gpu_bytes_per_s(self) -> float:
        """Scale-out bandwidth one GPU can drive when all GPUs of a node send at once."""
        node_bw = self.network.nics_per_node * self.network.nic_bandwidth_bytes_per_s
        return node_bw / self.node.gpus_per_node


def renamed_gpu_note(system: SystemConfig) -> str | None:
    """That the system's GPU was given a name of its own while every spec it is priced on is still its preset's (a
    user who writes `gpu: {name: B200}` over dgx-h100 gets H100 numbers under a B200 label); None otherwise."""
    if system.name not in preset_names("system"):
        return None
    own = GPUSpec.model_validate(preset("system", system.name)["gpu"])
    if system.gpu.name == own.name or system.gpu.model_copy(update={"name": own.name}) != own:
        return None
    return (
        f"system.gpu.name {system.gpu.name!r}: a name only; every spec priced (peak FLOP/s, HBM, bandwidths, the "
        f"fitted curves) is still {system.name}'s {own.name}: set them (itercast fields system.gpu) for another GPU"
    )
