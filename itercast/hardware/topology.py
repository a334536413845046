"""Placement of process groups on nodes (Megatron rank order: tensor, context, data, pipeline)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GroupPlacement:
    """A process group: `size` ranks over `nodes` nodes, `per_node` of them in each, `stride` GPUs apart within a
    node (what a mesh node's links depend on: NodeSpec.group_bandwidth_bytes_per_s; 1 when per_node is 1)."""

    size: int
    nodes: int
    per_node: int
    stride: int = 1

    @property
    def intra_node(self) -> bool:
        return self.nodes == 1


def place_group(size: int, stride: int, gpus_per_node: int) -> GroupPlacement:
    """Ranks r0, r0+stride, …, r0+(size−1)·stride with nodes filled in rank order.

    Exact when gpus_per_node is a multiple of the stride or the stride a multiple of gpus_per_node
    (all plans of powers of two); otherwise an even spread is assumed.
    """
    if size <= 1:
        return GroupPlacement(1, 1, 1)
    if stride < 1:
        raise ValueError(f"group stride must be ≥ 1; got {stride}")
    if stride >= gpus_per_node:
        return GroupPlacement(size, size, 1)
    per_node = max(1, min(size, gpus_per_node // stride))
    nodes = -(-size // per_node)
    return GroupPlacement(size, nodes, per_node, stride if per_node > 1 else 1)


def pair_groups(offset: int, count: int, gpus_per_node: int) -> GroupPlacement:
    """The 2-rank groups {r, r + offset} for r = 0 … count − 1 (Megatron's embedding groups: each first-stage
    rank with its last-stage peer, `offset` = (pp − 1) × a stage's ranks), placed as the slowest of them: on
    one node when every pair shares a node, else across two. A pair shares a node iff r mod g + offset < g
    (g GPUs a node), so some pair crosses iff offset ≥ g or min(count − 1, g − 1) + offset ≥ g."""
    if offset < 1 or count < 1:
        return GroupPlacement(1, 1, 1)
    crosses = offset >= gpus_per_node or min(count - 1, gpus_per_node - 1) + offset >= gpus_per_node
    return GroupPlacement(2, 2, 1) if crosses else GroupPlacement(2, 1, 2, offset)


def same_node(rank_a: int, rank_b: int, gpus_per_node: int) -> bool:
    return rank_a // gpus_per_node == rank_b // gpus_per_node
