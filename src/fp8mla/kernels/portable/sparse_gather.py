"""The rows that a batch's compacted index lists reference, each dequantized once into a 16-bit
copy, and the lists rewritten to the copy's rows.

A prefill chunk's query tokens share most of their chosen rows (each row of the bench's random
lists is chosen ~8 times at 4,096 tokens, a real chunk's far more), so dequantizing each
referenced row once and running a 16-bit attention kernel over the copy does less conversion
work than converting every row at every use (``dsa/sparse_copy.py``). Three launches over the
lists, which the compaction (``sparse_compact.py``) left as rows of the cache at the front of
each token's ``topk`` entries, ``counts[t]`` of them:

1. ``claim``: each entry whose row is inside the cache and not yet seen claimed (a plain load
   first: most repeats of a row find it taken and skip the atomic) exchanges
   ``claimed[row]`` with 1; the one that found 0 owns the row. A program's owners take the
   next copy rows (one counter add a program, numbered by a prefix sum):
   ``source[id] = row``, ``copy_row[row] = id``.
2. ``rewrite``: every entry becomes its row's copy row, ``copy_row[row]``; a row outside the
   cache becomes -2, which the attention kernels take as an entry outside their cache (its
   token's output NaN, nothing read). Program 0 moves the row count from ``counter[0]`` to
   ``counter[1]`` (the claims are done: the launch before) and zeroes ``counter[0]``.
3. ``dequantize``: copy row ``id < counter[1]`` is ``e4m3 × scale`` of its 128-value group and
   the bf16 RoPE part, in the copy's dtype; then ``claimed[source[id]]`` is reset to 0 for the
   next call (so ``claimed`` is set up once).

The copy rows' order depends on the atomics' order; the lists' order, and so every result, does
not. Every grid is sized by the plan (tokens × list blocks, or the copy's capacity), never by
the data: CUDA-graph replays with new lists run the same launches.
"""

import triton
import triton.language as tl

from fp8mla.dsa.layout import NOPE_DIM, ROPE_DIM, ROPE_OFFSET, SCALE_OFFSET
from fp8mla.kernels.portable.fp8_decode import CVT_TRITON_INT_E4M3, fp8_bytes_to_f16

INT32_MAX = 2**31 - 1
GATHER_BLOCK = 1024  # list entries a program of the list passes handles
DEQUANT_ROWS = 16  # copy rows a dequantize program writes
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
def _claim_kernel(lists_ptr, counts_ptr, claimed_ptr, counter_ptr, source_ptr, copy_row_ptr,
                  topk, num_rows, BLOCK: tl.constexpr):  # fmt: skip
    e, row, kept = _entries(lists_ptr, counts_ptr, topk, BLOCK)
    inside = kept & (row >= 0) & (row < num_rows)
    # a row already claimed stays claimed until the dequantize pass: a stale 0 only costs an
    # exchange that finds it taken
    seen = tl.load(claimed_ptr + row, mask=inside, other=1)
    asks = inside & (seen == 0)
    old = tl.atomic_xchg(claimed_ptr + row, 1, mask=asks)
    owns = asks & (old == 0)
    n_own = tl.sum(owns.to(tl.int32), axis=0)
    if n_own > 0:
        first = tl.atomic_add(counter_ptr, n_own)
        ids = first + tl.cumsum(owns.to(tl.int32), axis=0) - 1
        tl.store(source_ptr + ids, row, mask=owns)
        tl.store(copy_row_ptr + row, ids, mask=owns)


@triton.jit(do_not_specialize=["topk", "num_rows"])
def _rewrite_kernel(lists_ptr, counts_ptr, copy_row_ptr, counter_ptr, topk, num_rows,
                    BLOCK: tl.constexpr):  # fmt: skip
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        tl.store(counter_ptr + 1, tl.load(counter_ptr))
        tl.store(counter_ptr, 0)
    e, row, kept = _entries(lists_ptr, counts_ptr, topk, BLOCK)
    inside = kept & (row >= 0) & (row < num_rows)
    new = tl.load(copy_row_ptr + row, mask=inside, other=-2)
    tl.store(lists_ptr + e, tl.where(inside, new, -2), mask=kept)


@triton.jit(do_not_specialize=["row_stride"])
def _dequantize_kernel(rows_ptr, row_stride, source_ptr, counter_ptr, claimed_ptr, copy_ptr,
                       ROWS: tl.constexpr):  # fmt: skip
    ids = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ok = ids < tl.load(counter_ptr + 1)
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
    tl.store(claimed_ptr + row, 0, mask=ok)


def gather_rows(lists, counts, topk: int, rows, claimed, counter, source, copy_row,
                copy) -> None:  # fmt: skip
    """Rewrite the compacted ``lists`` (``[T, topk]`` int32, ``counts [T]``) from rows of the
    packed cache ``rows`` (``[num_rows, 656]`` uint8, rows a whole number of 16 bytes apart) to
    rows of ``copy`` (``[capacity, 576]``, fp16 for the attention: bf16 would round the
    values' 4 + 24 significant bits to 8, capacity ≥ the distinct rows the lists
    reference), each referenced row dequantized into it once. Work buffers, int32: ``claimed
    [num_rows]`` of zeros (left so), ``counter [2]`` of zeros (left with the copy's row
    count in ``counter[1]``), ``source [capacity]`` and ``copy_row [num_rows]``."""
    num_tokens = counts.shape[0]
    if num_tokens == 0 or topk == 0:
        return
    num_rows = rows.shape[0]
    grid = (num_tokens, triton.cdiv(topk, GATHER_BLOCK))
    _claim_kernel[grid](lists, counts, claimed, counter, source, copy_row, topk, num_rows,
                        BLOCK=GATHER_BLOCK)  # fmt: skip
    _rewrite_kernel[grid](lists, counts, copy_row, counter, topk, num_rows, BLOCK=GATHER_BLOCK)
    _dequantize_kernel[(triton.cdiv(copy.shape[0], DEQUANT_ROWS),)](
        rows, rows.stride(0), source, counter, claimed, copy, ROWS=DEQUANT_ROWS
    )
