"""Speed of `itercast search`: plans per second, end to end, and the peer-comparable sweep.

    python benchmarks/search_speed.py                 # one node count, then 8..128 DGX A100 nodes
    python benchmarks/search_speed.py --quick         # the one node count only

The sweep is GPT-3 175B (global batch 1536) on 64 to 1024 A100 GPUs (every whole number of 8-GPU
nodes), every plan field the search varies; a peer analytic tool searches its own 10.5M-plan space
of this problem at ~550 plans/s/core with memory pruning. "Generated" counts every combination of
the varied fields before validation, "valid" those Job validation accepts; both are priced per second
of wall time including enumeration, the closed-form step time and memory, and the re-scoring of
the top 20 by the graph simulation. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import time

from itercast.config.job import parse_section
from itercast.search.plan_search import SearchRequest, run_search


def request(nodes: tuple[int, ...]) -> SearchRequest:
    model = parse_section("model", {"preset": "gpt3-175b"})
    system = parse_section("system", {"preset": "dgx-a100", "num_nodes": nodes[0]})
    base = parse_section("plan", {"global_batch_size": 1536})
    return SearchRequest(model, system, base, nodes)  # type: ignore[arg-type]


def report(label: str, nodes: tuple[int, ...], workers: int) -> None:
    t0 = time.perf_counter()
    result = run_search(request(nodes), workers=workers)
    seconds = time.perf_counter() - t0
    top = result.plans[0]
    p = top["plan"]
    print(
        f"{label}, {workers} process(es): {result.evaluated:,} generated, {result.valid:,} valid, "
        f"{result.fitting:,} fit, in {seconds:.1f} s = {result.evaluated / seconds:,.0f} generated/s, "
        f"{result.valid / seconds:,.0f} valid/s ({result.valid / seconds / workers:,.0f} valid/s per process); "
        f"fastest: {top['num_gpus']} GPUs dp {p['data_parallel']} × tp {p['tensor_parallel']} × "
        f"pp {p['pipeline_parallel']} × cp {p['context_parallel']}, vp {p['virtual_pipeline']}, "
        f"mbs {p['micro_batch_size']}, ZeRO {p['zero_stage']}, recompute {p['recompute']}, "
        f"SP {p['sequence_parallel']}: {top['step_time_s']:.2f} s/step (fast path within "
        f"{result.fast_vs_graph_max:.1%} of the graph on the top 20)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="only the 1024-GPU search")
    args = parser.parse_args()
    report("GPT-3 175B on 1024 A100 (128 nodes)", (128,), 1)
    if not args.quick:
        sweep = tuple(range(8, 129))
        report("GPT-3 175B on 64..1024 A100 (8..128 nodes)", sweep, os.cpu_count() or 1)


if __name__ == "__main__":
    main()
