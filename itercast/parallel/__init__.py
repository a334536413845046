"""Pipeline schedules and process-group layout."""
