"""Launch planning for MLA attention: tile shapes, warps and the number of KV splits.

Pure host-side arithmetic on the batch description, so it can be unit-tested anywhere and
called once per ``plan()``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

# Fewest KV tokens worth giving a split of its own: below this the merge costs more than the
# extra parallelism buys.
MIN_TOKENS_PER_SPLIT = 128
MAX_SPLITS = 64


@dataclass(frozen=True)
class KernelConfig:
    """Tile shape and launch parameters of one attention launch."""

    block_m: int  # query rows ((token, head) pairs) per program
    block_n: int  # KV tokens per inner-loop step
    num_warps: int
    num_stages: int
    swap_ab: bool = False  # tokens × rows orientation (few rows per request)
    fp8_cvt: str = "auto"  # FP8 → fp16: "auto", "native", "ptx" (SM89+) or "int" (any CUDA)
    occupancy: int = 1  # programs resident per SM (registers and shared memory, SM90 build)


@dataclass(frozen=True)
class LaunchPlan:
    """Grid of one attention launch: ``(m_tiles, batch, num_splits)`` programs."""

    config: KernelConfig
    m_tiles: int  # row tiles of the longest request (shorter ones exit early)
    num_splits: int


@functools.lru_cache(maxsize=16)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device``; a small nominal count for the CPU interpreter."""
    if device.type == "cuda":
        return sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return 8


def choose_config(rows: int, kv_dtype: torch.dtype, interpreted: bool) -> KernelConfig:
    """Tiles for ``rows`` query rows per request (query tokens × heads).

    From the H200 tuning rounds (benchmarks/NOTES.md): up to 32 rows take 16-row tiles (two
    programs per SM: 142 registers, 92 KB of shared memory for FP8; a 32-head request runs
    as two tiles whose shared KV reads hit L2), more rows the 64-row tile (one per SM).
    """
    if interpreted:
        block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
        return KernelConfig(block_m=block_m, block_n=32, num_warps=4, num_stages=1)
    if rows <= 32:
        if kv_dtype.itemsize == 1:
            return KernelConfig(16, 64, 8, 1, occupancy=2)
        return KernelConfig(16, 64, 4, 2, occupancy=2)
    return KernelConfig(64, 64, 8, 1, occupancy=1)


def choose_splits(
    work_items: int,
    max_kv_len: int | None,
    sms: int,
    max_splits_by_workspace: int,
    config: KernelConfig | None = None,
) -> int:
    """Splits per request: as many as keep ``work_items × splits`` programs within one wave
    (``sms × occupancy``) -- a partial second wave costs more than the merge saves.

    ``max_kv_len=None`` (CUDA-graph plans, where lengths change between replays) plans for
    long contexts; the kernel leaves surplus splits empty when a request is short.
    """
    slots = sms * (config.occupancy if config is not None else 1)
    splits = max(1, slots // max(work_items, 1))
    if max_kv_len is not None:
        splits = min(splits, max(1, max_kv_len // MIN_TOKENS_PER_SPLIT))
    return max(1, min(splits, MAX_SPLITS, max_splits_by_workspace))


def make_launch_plan(
    *,
    batch: int,
    num_heads: int,
    max_qo_len: int,
    max_kv_len: int | None,
    sms: int,
    max_splits_by_workspace: int,
    interpreted: bool,
    kv_dtype: torch.dtype = torch.float8_e4m3fn,
    num_splits: int | None = None,
    config: KernelConfig | None = None,
) -> LaunchPlan:
    rows = max_qo_len * num_heads
    config = config or choose_config(rows, kv_dtype, interpreted)
    m_tiles = max(1, -(-rows // config.block_m))
    if num_splits is None:
        num_splits = choose_splits(batch * m_tiles, max_kv_len, sms, max_splits_by_workspace,
                                   config)
    return LaunchPlan(config=config, m_tiles=m_tiles, num_splits=num_splits)
