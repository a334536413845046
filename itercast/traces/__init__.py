"""Outside trace formats: Kineto and PyTorch execution-trace import, the replay graph and its what-ifs,
execution traces priced on cost models, host overheads, and the Chrome/Perfetto export."""
