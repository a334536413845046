"""Workload builders: a transformer's ops per layer and step graph, a DLRM's step under an embedding
sharding; itercast/workload.py puts them behind one interface."""
