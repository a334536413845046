"""Cost models: seconds for an op family given its features (DESIGN.md §4)."""

from itercast.costs.analytic import AnalyticCostModel

__all__ = ["AnalyticCostModel"]
