"""Workload builders: a model + plan → the ops of one micro-batch and the ExecGraph of one step."""
