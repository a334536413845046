"""Placement of process groups on nodes (Megatron rank order: tensor, context, data, pipeline)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GroupPlacement:
    """A process group: `size` ranks over `nodes` nodes, `per_node` of them in each."""

    size: int
    nodes: int
    per_node: int

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
    return GroupPlacement(size, nodes, per_node)


def same_node(rank_a: int, rank_b: int, gpus_per_node: int) -> bool:
    return rank_a // gpus_per_node == rank_b // gpus_per_node
