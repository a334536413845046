"""The parts of the GPU measurement campaign (tools/gpu_campaign.py)."""
