"""The three inputs (model, plan, system), their presets, and the job that joins them."""
