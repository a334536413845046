"""GPU memory a training process holds beyond its tensors: what the search leaves free on every GPU.

A plan fits when its tensors (memory model total less the system's flat `reserved_bytes`, which this
replaces) plus this headroom stay within the GPU's memory. Default headroom, per GPU:

- CUDA context: 0.75 GiB. Measured 723 MiB after the first CUDA call of a PyTorch process
  (discuss.pytorch.org/t/73021), "~700+ MB" depending on CUDA version and device (discuss.pytorch.org/t/81330).
- NCCL buffers: NCCL_BUFFSIZE (4 MiB default, NCCL environment-variable docs) per connection, 2
  connections (send and receive peers of a ring) per channel, up to 32 channels (NCCL's MAXCHANNELS,
  src/include/device.h): 256 MiB per communicator, for each process group of more than one rank the plan
  uses (tensor, context, data × context, pipeline, expert).
- Allocator fragmentation: 15% of activation bytes. GMLake (Guo et al., ASPLOS'24) removes 15% on
  average (up to 33%) of the PyTorch caching allocator's fragmentation over eight LLMs on A100-80GB;
  only activations are counted, since weights, gradients and optimizer state live in buffers allocated
  once (Megatron-Core param_and_grad_buffer, FSDP2 flat shards, DeepSpeed contiguous_gradients).
"""

from __future__ import annotations

import numpy as np

CUDA_CONTEXT_BYTES = 0.75 * 2**30
NCCL_COMMUNICATOR_BYTES = 4 * 2**20 * 2 * 32
FRAGMENTATION_OF_ACTIVATIONS = 0.15


def communicators(cols: dict[str, np.ndarray]) -> np.ndarray:
    """Process groups of more than one rank each GPU of a plan joins (NCCL allocates per communicator)."""
    c = cols
    groups = (c["tp"] > 1, c["cp"] > 1, c["dp"] * c["cp"] > 1, c["pp"] > 1, c["ep"] > 1)
    return np.sum(groups, axis=0)


def default_headroom_bytes(cols: dict[str, np.ndarray], activations_bytes: np.ndarray) -> np.ndarray:
    """Bytes per GPU left free for the CUDA context, NCCL buffers and allocator fragmentation."""
    nccl = NCCL_COMMUNICATOR_BYTES * communicators(cols)
    return CUDA_CONTEXT_BYTES + nccl + FRAGMENTATION_OF_ACTIVATIONS * activations_bytes


def describe(fixed_bytes: float | None) -> str:
    """One line for the search's header."""
    if fixed_bytes is not None:
        return f"headroom {fixed_bytes / 2**30:.2f} GiB per GPU (--memory-headroom-gib)"
    return (
        f"headroom per GPU: CUDA context {CUDA_CONTEXT_BYTES / 2**30:.2f} GiB + NCCL "
        f"{NCCL_COMMUNICATOR_BYTES / 2**20:.0f} MiB per communicator + {FRAGMENTATION_OF_ACTIVATIONS:.0%} of "
        "activations (fragmentation)"
    )
