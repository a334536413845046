"""Plan search: fast estimates over many plans (more arrives with the search issue)."""
