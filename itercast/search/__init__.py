"""Plan search: the plan space each framework runs (plan_space.py, frameworks.py), the closed-form
fast path over many plans (fast_estimate.py), `itercast search` and its objectives (plan_search.py,
objectives.py, launch_settings.py), a DLRM's shardings × batch (dlrm_search.py), and
pipeline stage slicing (stage_slicing.py, layer_costs.py, job_slicing.py)."""
