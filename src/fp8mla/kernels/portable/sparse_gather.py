"""The rows that a batch's compacted index lists reference, each dequantized once into a 16-bit
copy, and the lists rewritten to the copy's rows.

A prefill chunk's query tokens share most of their chosen rows (each row of the bench's random
lists is chosen ~8 times at 4,096 tokens, a real chunk's far more), so dequantizing each
referenced row once and running a 16-bit attention kernel over the copy does less conversion
work than converting every row at every use (``dsa/sparse_copy.py``). Four launches over the
lists, which the compaction (``sparse_compact.py``) left as rows of the cache at the front of
each token's ``topk`` entries, ``counts[t]`` of them:

1. ``claim``: each entry ``e = t · topk + k`` whose row is inside the cache writes
   ``owner[row] = min(owner[row], e)`` (``owner`` starts at ``INT32_MAX``); program 0 zeroes
   the row counter.
2. ``assign``: the entry that owns its row takes the next copy row (one counter add a program,
   the program's owners numbered by a prefix sum): ``source[id] = row``, ``copy_id[e] = id``.
3. ``rewrite``: every entry becomes its row's copy row, ``copy_id[owner[row]]``; a row outside
   the cache becomes -2, which the attention kernels take as an entry outside their cache
   (its token's output NaN, nothing read).
4. ``dequantize``: copy row ``id < counter`` is ``e4m3 × scale`` of its 128-value group and the
   bf16 RoPE part, in the copy's dtype; then ``owner[source[id]]`` is reset to ``INT32_MAX``
   for the next call (so ``owner`` is set up once).

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
# the packed row's layout and the free owner, as the compiled kernels read globals
_LATENT = tl.constexpr(NOPE_DIM)
_ROPE = tl.constexpr(ROPE_DIM)
_SCALES_AT = tl.constexpr(SCALE_OFFSET)
_ROPE_AT = tl.constexpr(ROPE_OFFSET)
_FREE = tl.constexpr(INT32_MAX)


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
def _claim_kernel(lists_ptr, counts_ptr, owner_ptr, counter_ptr, topk, num_rows,
                  BLOCK: tl.constexpr):  # fmt: skip
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        tl.store(counter_ptr, 0)
    e, row, kept = _entries(lists_ptr, counts_ptr, topk, BLOCK)
    inside = kept & (row >= 0) & (row < num_rows)
    tl.atomic_min(owner_ptr + row, e, mask=inside)


@triton.jit(do_not_specialize=["topk", "num_rows"])
def _assign_kernel(lists_ptr, counts_ptr, owner_ptr, counter_ptr, source_ptr, copy_id_ptr,
                   topk, num_rows, BLOCK: tl.constexpr):  # fmt: skip
    e, row, kept = _entries(lists_ptr, counts_ptr, topk, BLOCK)
    inside = kept & (row >= 0) & (row < num_rows)
    owns = inside & (tl.load(owner_ptr + row, mask=inside, other=-1) == e)
    n_own = tl.sum(owns.to(tl.int32), axis=0)
    if n_own > 0:
        first = tl.atomic_add(counter_ptr, n_own)
        ids = first + tl.cumsum(owns.to(tl.int32), axis=0) - 1
        tl.store(source_ptr + ids, row, mask=owns)
        tl.store(copy_id_ptr + e, ids, mask=owns)


@triton.jit(do_not_specialize=["topk", "num_rows"])
def _rewrite_kernel(lists_ptr, counts_ptr, owner_ptr, copy_id_ptr, topk, num_rows,
                    BLOCK: tl.constexpr):  # fmt: skip
    e, row, kept = _entries(lists_ptr, counts_ptr, topk, BLOCK)
    inside = kept & (row >= 0) & (row < num_rows)
    owner = tl.load(owner_ptr + row, mask=inside, other=0)
    new = tl.load(copy_id_ptr + owner, mask=inside, other=-2)
    tl.store(lists_ptr + e, tl.where(inside, new, -2), mask=kept)


@triton.jit(do_not_specialize=["row_stride"])
def _dequantize_kernel(rows_ptr, row_stride, source_ptr, counter_ptr, owner_ptr, copy_ptr,
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
    tl.store(owner_ptr + row, _FREE, mask=ok)


def gather_rows(lists, counts, topk: int, rows, owner, counter, source, copy_id, copy) -> None:
    """Rewrite the compacted ``lists`` (``[T, topk]`` int32, ``counts [T]``) from rows of the
    packed cache ``rows`` (``[num_rows, 656]`` uint8, rows a whole number of 16 bytes apart) to
    rows of ``copy`` (``[capacity, 576]``, fp16 for the attention: bf16 would round the
    values' 4 + 24 significant bits to 8, capacity ≥ the distinct rows the lists
    reference), each referenced row dequantized into it once. Work buffers: ``owner
    [num_rows]`` int32 of ``INT32_MAX`` (left so), ``counter [1]`` int32, ``source
    [capacity]`` and ``copy_id [T · topk]`` int32."""
    num_tokens = counts.shape[0]
    if num_tokens == 0 or topk == 0:
        return
    num_rows = rows.shape[0]
    grid = (num_tokens, triton.cdiv(topk, GATHER_BLOCK))
    _claim_kernel[grid](lists, counts, owner, counter, topk, num_rows, BLOCK=GATHER_BLOCK)
    _assign_kernel[grid](lists, counts, owner, counter, source, copy_id, topk, num_rows,
                         BLOCK=GATHER_BLOCK)  # fmt: skip
    _rewrite_kernel[grid](lists, counts, owner, copy_id, topk, num_rows, BLOCK=GATHER_BLOCK)
    _dequantize_kernel[(triton.cdiv(copy.shape[0], DEQUANT_ROWS),)](
        rows, rows.stride(0), source, counter, owner, copy, ROWS=DEQUANT_ROWS
    )
