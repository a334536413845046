"""Measurements that calibrate the cost models: the profiling database (db.py), microbenchmarks of
this device's operators and collectives (microbench.py, collective_bench.py), importers of outside
tables (importers.py: nccl-tests, Alpa, OpenXLA) and the calibration fitted on them (calibrate.py)."""
