"""Profiling database and microbenchmarks: measurements that calibrate the cost models (issue #4)."""
