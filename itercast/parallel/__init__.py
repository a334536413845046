"""Pipeline schedules (schedules.py) and many plans as numpy columns (plan_table.py)."""
