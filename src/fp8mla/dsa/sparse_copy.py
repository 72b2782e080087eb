"""Sparse MLA over an fp16 copy of the rows the index lists reference (``kernel="copy16"``).

A prefill chunk's query tokens choose the same rows again and again. The FP8 kernels convert a
row at every use (per 128-channel group at 128 heads: the FP8 × FP8 kernel's row tiles, four a
token, each convert it); here each referenced row is dequantized once per call into an fp16
copy (``kernels/portable/sparse_gather.py``) and the dense path's 16-bit kernels -- on SM90 the
ping-pong kernel the dense planner picks for 128 heads -- attend over the copy, each query token
a page-size-1 request whose page table is its list rewritten to copy rows. fp16 and not bf16:
``e4m3 × a float32 scale`` has up to 28 significant bits, which fp16 rounds to 11 (the output
stays within the 1.7e-3 of float64 that the other routes give) and bf16 to 8 (5-8e-3 in a
float64 simulation of 128 heads × 2,048 rows at arbitrary scales). So it takes the scales the
SM90 FP8 path takes: ``e4m3 × scale`` within fp16's range (scales up to 146).

The copy's capacity is the distinct rows the lists can reference, ``min(cache rows, tokens ×
topk)``, 1,152 bytes each; it and its work arrays over the cache rows (5 bytes a row) are one
set per device, shared by the wrappers there and grown at the first call that needs more,
never shrunk (a 2^20-row pool: 1.2 GB, in the order of the bf16 workspace vLLM keeps for its
FlashMLA prefill, five times the longest context). An engine that sizes its KV pool from a
profiled forward pass counts it when that pass is a prefill of its largest chunk.
"""

from __future__ import annotations

import torch

from fp8mla.attention.targets import launch_target
from fp8mla.dsa.layout import NOPE_DIM, ROPE_DIM
from fp8mla.dsa.sparse_sm90 import (
    cache_rows,
    compact_lists,
    natural_lse,
    token_attention,
    token_requests,
)
from fp8mla.formats import Scales
from fp8mla.kernels.portable.sparse_gather import INT32_MAX, gather_rows, scan_blocks

COPY_DTYPE = torch.float16
# device memory (the driver's count) a growing copy must leave free, for what is allocated
# outside PyTorch's pool: collective buffers, library workspaces, CUDA graphs
KEEP_FREE_BYTES = 1 << 30


def copy_fits(device: torch.device, nbytes: int) -> bool:
    """Whether ``nbytes`` more can be allocated on ``device`` and leave ``KEEP_FREE_BYTES`` of
    it free (memory PyTorch holds cached counts as taken)."""
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return free - nbytes >= KEEP_FREE_BYTES


class CopySparseLaunch:
    """The launch ``SparseMLAWrapper`` keeps for a ``"copy16"`` plan: the dense 16-bit plan and
    the compaction's buffers at ``plan()``; the copy and its work buffers at the first call of
    a cache size. ``fallback``: the launch an automatic plan would have run without the copy,
    run instead by a call whose copy would have to grow past what the device has free (an
    engine sizes its KV pool before any attention runs, so the copy is outside its budget); the
    two share one set of compaction buffers, as a call runs one of them."""

    def __init__(self, num_tokens: int, num_heads: int, topk: int, sm_scale: float,
                 workspace: torch.Tensor, device: torch.device, interpreted: bool,
                 fallback=None) -> None:  # fmt: skip
        if num_tokens * topk >= INT32_MAX:
            raise ValueError(
                f"expected fewer than 2^31 list entries for the copy16 route, got {num_tokens} "
                f"tokens x {topk}"
            )
        self.num_tokens, self.topk, self.device = num_tokens, topk, device
        self.fallback = fallback
        self.buffers = device_buffers(device)  # looked up once: a call only fits them
        shared = getattr(fallback, "sparse", None)
        if shared is not None:  # the FP8 launch's compaction buffers, [T, topk] and [T]
            self.compacted, self.counts = shared.compacted, shared.counts
        else:
            self.compacted = torch.zeros(max(1, num_tokens), topk, dtype=torch.int32,
                                         device=device)  # fmt: skip
            self.counts = torch.zeros(num_tokens, dtype=torch.int32, device=device)
        target = launch_target(device, interpreted)
        self.plan, partials, tokens = token_requests(num_tokens, num_heads, topk, workspace,
                                                     device, target, COPY_DTYPE)  # fmt: skip
        self.launch = token_attention(self.plan, num_heads, sm_scale, tokens, topk,
                                      self.compacted.view(-1), self.counts, partials,
                                      COPY_DTYPE, device, target, interpreted)  # fmt: skip

    def _buffers(self, num_rows: int) -> CopyBuffers | None:
        """The device's copy buffers, fitted to a cache of ``num_rows`` rows and this plan; None
        where they would have to grow past the free memory and a fallback runs instead."""
        bufs = self.buffers
        capacity = max(1, min(num_rows, self.num_tokens * self.topk))
        need = bufs.growth(num_rows, capacity)
        if need and self.fallback is not None and not copy_fits(self.device, need):
            return None
        bufs.fit(num_rows, capacity, self.device)
        return bufs

    def __call__(self, q_nope, q_pe, view, indices, topk_length, out, lse) -> None:
        c = cache_rows(view)
        bufs = self._buffers(c.packed.shape[0])
        if bufs is None:
            self.fallback(q_nope, q_pe, view, indices, topk_length, out, lse)
            return
        compact_lists(self.compacted, self.counts, self.topk, indices, topk_length, c)
        gather_rows(self.compacted, self.counts, self.topk, c.packed, bufs.claimed,
                    bufs.block_sums, bufs.counter, bufs.source, bufs.copy_row, bufs.copy)  # fmt: skip
        copy = bufs.copy.unsqueeze(1)
        self.launch(q_nope, q_pe, copy[..., :NOPE_DIM], copy[..., NOPE_DIM:], out, lse,
                    Scales(ckv=1.0, kpe=1.0))  # fmt: skip
        natural_lse(lse)


class CopyBuffers:
    """The copy, its source rows, the cache rows' claims, block counts and copy rows and the
    row counter: one set per device, shared by every wrapper on it (an engine's layers run one
    after another on one stream, as they share their workspace), grown to the largest call
    and never shrunk. A grown buffer's predecessor is kept, not freed: a CUDA graph captured
    with it replays into it."""

    def __init__(self) -> None:
        self.claimed = self.block_sums = self.copy_row = self.source = self.copy = None
        self.counter = None
        self.retired: list[torch.Tensor] = []

    def growth(self, num_rows: int, capacity: int) -> int:
        """The bytes :meth:`fit` would allocate for ``num_rows`` and ``capacity``."""
        need = 0
        if self.claimed is None or self.claimed.shape[0] < num_rows:
            need += 5 * num_rows + 4 * scan_blocks(num_rows)
        if self.copy is None or self.copy.shape[0] < capacity:
            need += (4 + 2 * (NOPE_DIM + ROPE_DIM)) * capacity
        return need

    def fit(self, num_rows: int, capacity: int, device: torch.device) -> None:
        if self.counter is None:
            self.counter = torch.zeros(1, dtype=torch.int32, device=device)
        if self.claimed is None or self.claimed.shape[0] < num_rows:
            if self.claimed is not None:
                self.retired += [self.claimed, self.block_sums, self.copy_row]
            self.claimed = torch.zeros(num_rows, dtype=torch.int8, device=device)
            self.block_sums = torch.zeros(scan_blocks(num_rows), dtype=torch.int32, device=device)
            self.copy_row = torch.zeros(num_rows, dtype=torch.int32, device=device)
        if self.copy is None or self.copy.shape[0] < capacity:
            self.retired += [self.source, self.copy] if self.copy is not None else []
            self.source = torch.zeros(capacity, dtype=torch.int32, device=device)
            self.copy = torch.empty(capacity, NOPE_DIM + ROPE_DIM, dtype=COPY_DTYPE,
                                    device=device)  # fmt: skip


_BUFFERS: dict[torch.device, CopyBuffers] = {}


def device_buffers(device: torch.device) -> CopyBuffers:
    """The copy buffers of ``device``, one set whichever way it is named (``cuda`` is the
    current device's index)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    bufs = _BUFFERS.get(device)
    if bufs is None:
        bufs = _BUFFERS[device] = CopyBuffers()
    return bufs
