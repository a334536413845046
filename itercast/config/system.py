"""The hardware: GPU, node and network specs, in seconds, bytes and FLOP/s (DESIGN.md §2)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, NonNegativeFloat, PositiveFloat

from itercast.config.strict import STRICT, Ranks


class GPUSpec(BaseModel):
    """One accelerator. Peak FLOP/s are dense (no sparsity); a missing dtype is unsupported."""

    model_config = STRICT

    name: str
    peak_flops: dict[Literal["fp32", "tf32", "bf16", "fp16", "fp8"], PositiveFloat]
    hbm_bytes: PositiveFloat
    hbm_bandwidth_bytes_per_s: PositiveFloat
    l2_bytes: PositiveFloat
    kernel_launch_overhead_s: NonNegativeFloat = Field(
        5e-6, description="CPU time to launch one kernel (Lin et al. HiPC'22, T_launch ≈ 4–6 µs)."
    )
    reserved_bytes: NonNegativeFloat = Field(
        2 * 1024**3,
        description="Memory not available to tensors: CUDA context, cuBLAS/NCCL workspaces, "
        "allocator fragmentation. An estimate, not a measurement.",
    )


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


class NetworkSpec(BaseModel):
    """Scale-out network between nodes."""

    model_config = STRICT

    nics_per_node: Ranks
    nic_bandwidth_bytes_per_s: PositiveFloat = Field(description="Per NIC, one direction.")
    latency_s: NonNegativeFloat = Field(
        20e-6, description="One hop between nodes (NIC + switch). Floors collectives and sends across nodes."
    )


class SystemConfig(BaseModel):
    """A cluster of identical nodes."""

    model_config = STRICT

    name: str = "custom"
    gpu: GPUSpec
    node: NodeSpec
    network: NetworkSpec
    num_nodes: Ranks = 1

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.node.gpus_per_node

    def nic_bandwidth_per_gpu_bytes_per_s(self) -> float:
        """Scale-out bandwidth one GPU can drive when all GPUs of a node send at once."""
        node_bw = self.network.nics_per_node * self.network.nic_bandwidth_bytes_per_s
        return node_bw / self.node.gpus_per_node
