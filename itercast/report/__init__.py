"""Reports and plots (kept out of the analysis code; matplotlib is the optional `plot` extra)."""
