"""The validation every config section shares: unknown fields, wrong types and non-finite numbers fail.

Strict: `num_layers: true` is not one layer and `"8"` is not 8 (YAML gives real numbers and
booleans); an int is still accepted where a float is expected. No inf or NaN anywhere: they would
travel to the outputs as `Infinity`/`NaN`, which strict JSON readers reject.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

STRICT = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

# Upper bounds far above any real job, so that a typo (1e7 layers, 10^30 nodes) is an error and
# not an hour of work or an exhausted memory.
Layers = Annotated[int, Field(gt=0, le=100_000)]
Width = Annotated[int, Field(gt=0, le=100_000_000)]  # hidden, ffn, heads, vocabulary, sequence
Ranks = Annotated[int, Field(gt=0, le=10_000_000)]  # parallel sizes, GPUs per node, nodes, NICs
Batch = Annotated[int, Field(gt=0, le=1_000_000_000)]
