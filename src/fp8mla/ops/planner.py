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
MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 64


@dataclass(frozen=True)
class KernelConfig:
    """Tile shape and launch parameters of one attention launch."""

    block_m: int  # query rows ((token, head) pairs) per program
    block_n: int  # KV tokens per inner-loop step
    num_warps: int
    num_stages: int
    swap_ab: bool = False  # tokens × rows orientation (few rows per request)


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


def choose_config(rows: int, interpreted: bool) -> KernelConfig:
    """Tiles for ``rows`` query rows per request (query tokens × heads)."""
    if rows <= 16:
        block_m = 16
    elif rows <= 32:
        block_m = 32
    else:
        block_m = 64
    num_warps = 8 if block_m >= 64 else 4
    return KernelConfig(block_m=block_m, block_n=64 if not interpreted else 32,
                        num_warps=num_warps, num_stages=2)


def choose_splits(
    work_items: int,
    max_kv_len: int | None,
    sms: int,
    max_splits_by_workspace: int,
) -> int:
    """Splits per request so that ``work_items × splits`` programs fill the GPU.

    ``max_kv_len=None`` (CUDA-graph plans, where lengths change between replays) plans for
    long contexts; the kernel leaves surplus splits empty when a request is short.
    """
    target_programs = 2 * sms
    splits = -(-target_programs // max(work_items, 1))
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
    num_splits: int | None = None,
    config: KernelConfig | None = None,
) -> LaunchPlan:
    rows = max_qo_len * num_heads
    config = config or choose_config(rows, interpreted)
    m_tiles = max(1, -(-rows // config.block_m))
    if num_splits is None:
        num_splits = choose_splits(batch * m_tiles, max_kv_len, sms, max_splits_by_workspace)
    return LaunchPlan(config=config, m_tiles=m_tiles, num_splits=num_splits)
