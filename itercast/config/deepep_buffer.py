"""DeepEP's normal-mode buffers as torchtitan's DeepEP backend sizes them: which expert-parallel sizes DeepEP
has kernel configurations for, and the bytes its Buffer allocates on each GPU.

Sources (DeepEP 567632d, 2026-02-03, the last before torchtitan 9810191^; bfded34 has the same tables):
torchtitan/distributed/deepep/deepep.py get_buffer: one Buffer per process, sized by the larger of
`Buffer.get_dispatch_config(ep)` and `Buffer.get_combine_config(ep)`'s `get_nvl_buffer_size_hint` and
`get_rdma_buffer_size_hint`, for `hidden_bytes = hidden × max(element size, 2)`; deep_ep/buffer.py's config maps
(Config(num_sms=20, nvl send, nvl receive, rdma send, rdma receive chunk tokens), any other size asserts
'Unsupported number of EP ranks'); csrc/config.hpp's two hints (NUM_MAX_NVL_PEERS 8, kNumMaxTopK and kNumMaxScales
128, int64 top-k indices, an 8-byte SourceMeta, 128-byte alignment; the receive chunk aligned up to the send chunk);
csrc/deep_ep.cpp's fixed 32 MiB workspace (NUM_WORKSPACE_BYTES). The NVLink buffer is cudaMalloc'ed, the RDMA
buffer (groups beyond one node of 8) comes from NVSHMEM's symmetric heap: what NVSHMEM itself reserves beyond
it (DeepEP sets its cuMem granularity to 512 MiB) is not priced.
"""

from __future__ import annotations

from typing import NamedTuple


class DeepEPConfig(NamedTuple):
    """Tokens a channel's chunks hold (deep_ep/buffer.py Config, num_sms 20 by default: 10 channels)."""

    nvl_send: int
    nvl_recv: int
    rdma_send: int
    rdma_recv: int


#: deep_ep/buffer.py Buffer.get_dispatch_config and get_combine_config: expert-parallel size -> (dispatch, combine)
DEEPEP_CONFIGS: dict[int, tuple[DeepEPConfig, DeepEPConfig]] = {
    2: (DeepEPConfig(24, 256, 6, 128), DeepEPConfig(10, 256, 6, 128)),
    4: (DeepEPConfig(6, 256, 6, 128), DeepEPConfig(9, 256, 6, 128)),
    8: (DeepEPConfig(6, 256, 6, 128), DeepEPConfig(4, 256, 6, 128)),
    16: (DeepEPConfig(36, 288, 20, 128), DeepEPConfig(4, 288, 12, 128)),
    24: (DeepEPConfig(32, 288, 8, 128), DeepEPConfig(1, 288, 8, 128)),
    32: (DeepEPConfig(32, 288, 8, 128), DeepEPConfig(1, 288, 8, 128)),
    48: (DeepEPConfig(32, 288, 8, 128), DeepEPConfig(1, 288, 8, 128)),
    64: (DeepEPConfig(32, 288, 8, 128), DeepEPConfig(1, 288, 8, 128)),
    96: (DeepEPConfig(20, 480, 12, 128), DeepEPConfig(1, 480, 8, 128)),
    128: (DeepEPConfig(20, 560, 12, 128), DeepEPConfig(1, 560, 8, 128)),
    144: (DeepEPConfig(32, 720, 12, 128), DeepEPConfig(2, 720, 8, 128)),
    160: (DeepEPConfig(28, 720, 12, 128), DeepEPConfig(2, 720, 8, 128)),
}
#: the expert-parallel sizes DeepEP runs (any other asserts in get_dispatch_config)
DEEPEP_EP_SIZES = tuple(DEEPEP_CONFIGS)

_CHANNELS = 20 // 2  # Buffer.num_sms 20; a channel is two SMs
_NVL_PEERS = 8  # NUM_MAX_NVL_PEERS
_WORKSPACE_BYTES = 32 * 2**20  # NUM_WORKSPACE_BYTES
# per received token beyond its hidden bytes: SourceMeta (8), 128 int64 top-k indices, 128 fp32 weights and scales
_TOKEN_META_BYTES = 8 + 128 * 8 + 128 * 4 + 128 * 4


def _align128(num_bytes: int) -> int:
    return -(-num_bytes // 128) * 128


def _nvl_bytes(c: DeepEPConfig, hidden_bytes: int, ep: int) -> int:
    """config.hpp get_nvl_buffer_size_hint."""
    nvl_ranks, rdma_ranks = min(ep, _NVL_PEERS), max(ep // _NVL_PEERS, 1)
    slots = _CHANNELS * nvl_ranks
    return _align128(slots * (2 * rdma_ranks + 3) * 4 + slots * c.nvl_recv * (hidden_bytes + _TOKEN_META_BYTES))


def _rdma_bytes(c: DeepEPConfig, hidden_bytes: int, ep: int) -> int:
    """config.hpp get_rdma_buffer_size_hint (0 within one node of 8); the receive chunk aligned up to the send
    chunk (Config's constructor); an int4 more a token."""
    if ep <= _NVL_PEERS:
        return 0
    recv = -(-c.rdma_recv // c.rdma_send) * c.rdma_send
    slots = _CHANNELS * (ep // _NVL_PEERS)
    return _align128(slots * (2 * _NVL_PEERS + 2) * 2 * 4 + slots * recv * 2 * (hidden_bytes + _TOKEN_META_BYTES + 16))


def deepep_buffer_bytes(hidden_size: int, dtype_bytes: int, ep: int) -> int:
    """Bytes one GPU of an expert-parallel group of `ep` holds for torchtitan's DeepEP Buffer: its NVLink and RDMA
    buffers at the larger of the dispatch and combine hints, and the workspace (module docstring). Hidden 2048 in
    bf16 at EP 8: 125,994,624 + 33,554,432 bytes."""
    if ep not in DEEPEP_CONFIGS:
        raise ValueError(f"DeepEP has no configuration for {ep} expert-parallel ranks: expected {DEEPEP_EP_SIZES}")
    hidden_bytes = hidden_size * max(dtype_bytes, 2)
    configs = DEEPEP_CONFIGS[ep]
    nvl = max(_nvl_bytes(c, hidden_bytes, ep) for c in configs)
    rdma = max(_rdma_bytes(c, hidden_bytes, ep) for c in configs)
    return nvl + rdma + _WORKSPACE_BYTES
