"""Outside trace formats: Chrome/Perfetto export (and, later, Kineto / execution-trace import)."""
