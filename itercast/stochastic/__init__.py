"""Stochastic behaviour: failures and time-to-train (variability models arrive with issue #5)."""
