"""Stochastic behaviour: variability of a predicted step (variability.py) or fitted on traces
(trace_variability.py, distributions.py), where slow GPUs hurt least (placement.py), and time to
train with failures and checkpoints (time_to_train.py)."""
