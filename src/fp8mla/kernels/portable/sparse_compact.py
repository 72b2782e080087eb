"""Each query token's sparse index list compacted for the paged attention kernels: the entries a
token attends to (within ``topk_length``, not ``-1``) moved to the front of its row, in their
order, and their count.

The SM90 kernels read a request's page table as ``kv_len`` tokens of ``kv_indices``; a sparse
token is such a request of page size 1 whose entries are rows of the cache. The SM90 path reads
the lists as the caller gives them where a slot is a row and the lists are ``topk`` entries
apart (``dsa/sparse_sm90.reads_lists``); it compacts them for any other layout. Where the cache's
token rows follow each other a slot is its row (``PAGED=False``: the ids are copied as they
are, and entries below ``-1`` or past the cache stay in the list for the attention kernel to
find). Pages of ``page_size`` slots whose stride is ``rows_per_page`` token rows (pages with a
gap after them, ``PAGED=True``) turn slot ``s`` into row
``(s // page_size) * rows_per_page + s % page_size``, and an id outside ``[0, num_slots)`` into
``-2``, which the attention kernel takes as an entry outside the cache (its token's rows NaN). Entries past the count are left as they were (the
kernels read none of them).
"""

import triton
import triton.language as tl

from fp8mla.kernels.portable.grid_dependency import launch_next_grid


@triton.jit(do_not_specialize=["num_tokens", "num_slots", "page_size", "rows_per_page"])
def sparse_compact_kernel(
    indices_ptr,  # [T, topk] int32 slot ids (-1: no token)
    topk_length_ptr,  # [T] int32 (HAS_TOPK_LENGTH only)
    out_ptr,  # [T_cap, topk] int32: the entries kept, at the front of each row
    count_ptr,  # [T_cap] int32: how many each row keeps
    num_tokens,  # rows of this call: programs of later rows write a count of 0
    topk,
    stride_idx_t,
    num_slots,  # PAGED only: the cache's slots
    page_size,  # PAGED only: slots per page
    rows_per_page,  # PAGED only: the page stride in token rows
    HAS_TOPK_LENGTH: tl.constexpr,
    PAGED: tl.constexpr,  # False: slot ids are row ids
    BLOCK: tl.constexpr,  # entries per step
    # the attention grid (launched as this one's programmatic dependent, SM90+) may be
    # scheduled from the start: its programs set up their barriers and wait for this grid
    LAUNCH_NEXT: tl.constexpr = False,
):
    if LAUNCH_NEXT:
        launch_next_grid()
    t = tl.program_id(0).to(tl.int64)
    if t >= num_tokens:  # a row past this call (a CUDA graph's capacity): nothing to attend to
        tl.store(count_ptr + t, 0)
        return
    n_len = topk
    if HAS_TOPK_LENGTH:
        n_len = tl.minimum(tl.maximum(tl.load(topk_length_ptr + t), 0), topk)
    src = indices_ptr + t * stride_idx_t
    dst = out_ptr + t * topk
    count = 0
    for b0 in range(0, n_len, BLOCK):
        pos = b0 + tl.arange(0, BLOCK)
        idx = tl.load(src + pos, mask=pos < n_len, other=-1)
        keep = (idx != -1).to(tl.int32)
        if PAGED:
            inside = (idx >= 0) & (idx < num_slots)
            row = (idx // page_size) * rows_per_page + idx % page_size
            idx = tl.where(inside, row, -2)
        tl.store(dst + count + tl.cumsum(keep, axis=0) - 1, idx, mask=keep > 0)
        count += tl.sum(keep, axis=0)
    tl.store(count_ptr + t, count)
