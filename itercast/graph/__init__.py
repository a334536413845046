"""ExecGraph: the one task-DAG representation shared by workload builders and trace importers."""

from itercast.graph.execgraph import Category, ExecGraph, GraphBuilder

__all__ = ["Category", "ExecGraph", "GraphBuilder"]
