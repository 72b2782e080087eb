"""The rows that a batch's compacted index lists reference, each dequantized once into a 16-bit
copy, and the lists rewritten to the copy's rows.

A prefill chunk's query tokens share most of their chosen rows (each row of the bench's random
lists is chosen ~8 times at 4,096 tokens, a real chunk's far more), so dequantizing each
referenced row once and running a 16-bit attention kernel over the copy does less conversion
work than converting every row at every use (``dsa/sparse_copy.py``). Five launches: two over
the lists, which the compaction (``sparse_compact.py``) left as rows of the cache at the front
of each token's ``topk`` entries, ``counts[t]`` of them, two over the cache's rows and one
over the copy's:

1. ``claim``: each entry whose row is inside the cache stores 1 in ``claimed[row]`` (int8; a
   plain store, the same value whichever entry lands last).
2. ``count``: each block of ``SCAN_BLOCK`` cache rows counts its claimed rows into
   ``block_sums``.
3. ``number``: the claimed rows numbered in the cache's order, an exclusive prefix sum (the
   blocks before this one, then this block's own): ``copy_row[row] = id``,
   ``source[id] = row``; each ``claimed[row]`` reset to 0 for the next call (so ``claimed``
   is set up once); the last block stores the number of copy rows in ``counter``.
4. ``rewrite``: every entry becomes its row's copy row, ``copy_row[row]``; a row outside the
   cache becomes -2, which the attention kernels take as an entry outside their cache (its
   token's output NaN, nothing read).
5. ``dequantize``: copy row ``id < counter`` is ``e4m3 × scale`` of its 128-value group and
   the bf16 RoPE part, in the copy's dtype. Copy rows follow the cache's order, so the reads
   go through the cache in order rather than at random.

No atomics: every result, the copy rows' order included, is the same whatever order the
programs run in. Every grid is sized by the plan (tokens × list blocks, or the copy's
capacity) or the cache (its rows), never by the data: CUDA-graph replays with new lists run
the same launches.
"""

import triton
import triton.language as tl

from fp8mla.dsa.layout import NOPE_DIM, ROPE_DIM, ROPE_OFFSET, SCALE_OFFSET
from fp8mla.kernels.portable.fp8_decode import CVT_TRITON_INT_E4M3, fp8_bytes_to_f16

INT32_MAX = 2**31 - 1  # the list passes address entry t · topk + k by an int32: fewer than this
GATHER_BLOCK = 1024  # list entries a program of the list passes handles
SCAN_BLOCK = 4096  # cache rows a program of the count and number passes handles
SCAN_SUMS = 1024  # block sums the number pass adds at a time
DEQUANT_ROWS = 8  # copy rows a dequantize program writes
DEQUANT_WARPS = 8  # its warps (the shapes timed: docs/design/sparse.md, the fp16 copy)
# the packed row's layout, as the compiled kernels read globals
_LATENT = tl.constexpr(NOPE_DIM)
_ROPE = tl.constexpr(ROPE_DIM)
_SCALES_AT = tl.constexpr(SCALE_OFFSET)
_ROPE_AT = tl.constexpr(ROPE_OFFSET)


@triton.jit
def _entries(lists_ptr, counts_ptr, topk, BLOCK: tl.constexpr):
    """This program's block of its token's list: entry ids, rows, and which are kept."""
    t = tl.program_id(0)
    k = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    kept = k < tl.load(counts_ptr + t)
    e = t * topk + k
    row = tl.load(lists_ptr + e, mask=kept, other=-1)
    return e, row, kept


@triton.jit(do_not_specialize=["topk", "num_rows"])
def claim_kernel(lists_ptr, counts_ptr, claimed_ptr, topk, num_rows, BLOCK: tl.constexpr):
    e, row, kept = _entries(lists_ptr, counts_ptr, topk, BLOCK)
    inside = kept & (row >= 0) & (row < num_rows)
    tl.store(claimed_ptr + row, tl.full([BLOCK], 1, tl.int8), mask=inside)


@triton.jit(do_not_specialize=["num_rows"])
def count_kernel(claimed_ptr, block_sums_ptr, num_rows, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    claimed = tl.load(claimed_ptr + rows, mask=rows < num_rows, other=0).to(tl.int32)
    tl.store(block_sums_ptr + tl.program_id(0), tl.sum(claimed, axis=0))


@triton.jit(do_not_specialize=["num_rows"])
def number_kernel(claimed_ptr, block_sums_ptr, copy_row_ptr, source_ptr, counter_ptr,
                   num_rows, BLOCK: tl.constexpr, SUMS: tl.constexpr):  # fmt: skip
    b = tl.program_id(0)
    base = 0
    for s0 in range(0, b, SUMS):  # the blocks before this one
        i = s0 + tl.arange(0, SUMS)
        base += tl.sum(tl.load(block_sums_ptr + i, mask=i < b, other=0), axis=0)
    rows = b * BLOCK + tl.arange(0, BLOCK)
    inside = rows < num_rows
    claimed = tl.load(claimed_ptr + rows, mask=inside, other=0).to(tl.int32)
    ids = base + tl.cumsum(claimed, axis=0) - 1
    mine = claimed > 0
    tl.store(copy_row_ptr + rows, ids, mask=mine)
    tl.store(source_ptr + ids, rows, mask=mine)
    tl.store(claimed_ptr + rows, tl.zeros([BLOCK], tl.int8), mask=mine)
    if b == tl.num_programs(0) - 1:
        tl.store(counter_ptr, base + tl.sum(claimed, axis=0))


@triton.jit(do_not_specialize=["topk", "num_rows"])
def rewrite_kernel(lists_ptr, counts_ptr, copy_row_ptr, topk, num_rows, BLOCK: tl.constexpr):
    e, row, kept = _entries(lists_ptr, counts_ptr, topk, BLOCK)
    inside = kept & (row >= 0) & (row < num_rows)
    new = tl.load(copy_row_ptr + row, mask=inside, other=-2)
    tl.store(lists_ptr + e, tl.where(inside, new, -2), mask=kept)


@triton.jit(do_not_specialize=["row_stride"])
def dequantize_kernel(rows_ptr, row_stride, source_ptr, counter_ptr, copy_ptr,
                       ROWS: tl.constexpr):  # fmt: skip
    ids = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ok = ids < tl.load(counter_ptr)
    row = tl.load(source_ptr + ids, mask=ok, other=0)
    src = rows_ptr + row.to(tl.int64) * row_stride
    dst = copy_ptr + ids.to(tl.int64) * (_LATENT + _ROPE)
    c = tl.arange(0, _LATENT)
    codes = tl.load(src[:, None] + c[None, :], mask=ok[:, None], other=0)
    # integer bit moves, exact on every target (SM80/86 have no e4m3 type): 2^-8 × the value
    values = fp8_bytes_to_f16(codes, CVT_TRITON_INT_E4M3).to(tl.float32) * 256.0
    scale_ptr = (src + _SCALES_AT).to(tl.pointer_type(tl.float32), bitcast=True)
    g = tl.arange(0, _LATENT // 128)
    scales = tl.load(scale_ptr[:, None] + g[None, :], mask=ok[:, None], other=0.0)
    values = tl.reshape(values, [ROWS, _LATENT // 128, 128]) * scales[:, :, None]
    values = tl.reshape(values, [ROWS, _LATENT])
    tl.store(dst[:, None] + c[None, :], values.to(copy_ptr.dtype.element_ty), mask=ok[:, None])
    rope_ptr = (src + _ROPE_AT).to(tl.pointer_type(tl.bfloat16), bitcast=True)
    d = tl.arange(0, _ROPE)
    rope = tl.load(rope_ptr[:, None] + d[None, :], mask=ok[:, None], other=0.0)
    tl.store(dst[:, None] + _LATENT + d[None, :], rope.to(copy_ptr.dtype.element_ty),
             mask=ok[:, None])  # fmt: skip


def gather_rows(lists, counts, topk: int, rows, claimed, block_sums, counter, source, copy_row,
                copy) -> None:  # fmt: skip
    """Rewrite the compacted ``lists`` (``[T, topk]`` int32, ``counts [T]``) from rows of the
    packed cache ``rows`` (``[num_rows, 656]`` uint8, rows a whole number of 16 bytes apart) to
    rows of ``copy`` (``[capacity, 576]``, fp16 for the attention: bf16 would round the
    values' 4 + 24 significant bits to 8, capacity ≥ the distinct rows the lists
    reference), each referenced row dequantized into it once, in the cache's order. Work
    buffers: ``claimed [num_rows]`` int8 of zeros (left so), ``block_sums
    [scan_blocks(num_rows)]``, ``counter [1]`` (left with the number of copy rows),
    ``source [capacity]`` and ``copy_row [num_rows]``, int32."""
    num_tokens = counts.shape[0]
    if num_tokens == 0 or topk == 0:
        return
    num_rows = rows.shape[0]
    grid = (num_tokens, triton.cdiv(topk, GATHER_BLOCK))
    blocks = (scan_blocks(num_rows),)
    claim_kernel[grid](lists, counts, claimed, topk, num_rows, BLOCK=GATHER_BLOCK)
    count_kernel[blocks](claimed, block_sums, num_rows, BLOCK=SCAN_BLOCK)
    number_kernel[blocks](claimed, block_sums, copy_row, source, counter, num_rows,
                           BLOCK=SCAN_BLOCK, SUMS=SCAN_SUMS)  # fmt: skip
    rewrite_kernel[grid](lists, counts, copy_row, topk, num_rows, BLOCK=GATHER_BLOCK)
    dequantize_kernel[(triton.cdiv(copy.shape[0], DEQUANT_ROWS),)](
        rows, rows.stride(0), source, counter, copy, ROWS=DEQUANT_ROWS, num_warps=DEQUANT_WARPS
    )


def scan_blocks(num_rows: int) -> int:
    """The count and number passes' programs (and block sums) for a cache of ``num_rows``."""
    return max(1, triton.cdiv(num_rows, SCAN_BLOCK))
