"""FP8 (e4m3) queries in the portable attention kernel (``rows.py``'s ``Q_FP8`` builds).

The query's true value is ``q_fp8 × q_scale`` with one scale per tensor or per (token, head)
row (``Q_SCALE``). Two builds:

- ``QF8_DOT`` (targets with FP8 tensor cores, SM89+, and e4m3 pools with per-tensor scales):
  ``Q·Kᵀ`` as e4m3 × e4m3 dots over the pool's own bytes with fp32 accumulation, the row's
  ``q_scale`` × key scale × softmax scale applied to the fp32 scores; ``P`` rounded to e4m3
  with a scale per row (the tile's largest probability of the row maps to 448) against ``V``
  in e4m3, the row's scale taken out of the fp32 product.
- ``QF8_CVT`` (SM80/86, AMD, e5m2 and 16-bit pools, per-token-group scales): the query
  codes decoded to the dot dtype in registers (exact: every e4m3 value is an fp16 value) and
  the 16-bit kernel's dots, ``P`` in the 16-bit dot dtype.

Both keep the two parts' dots apart (``q_pe`` cannot carry the ratio of the key scales as
the 16-bit build's does without rounding it again) and add them in fp32.
"""

import triton
import triton.language as tl

from fp8mla.kernels.portable.codec import encode_fp8
from fp8mla.kernels.portable.fp8_decode import CVT_TRITON_INT_E4M3, fp8_bytes_to_f16
from fp8mla.kernels.portable.tiles import safe_pages

# The kernels' ``Q_FP8`` constexpr:
QF8_NONE = tl.constexpr(0)  # 16-bit queries
QF8_CVT = tl.constexpr(1)  # e4m3 queries decoded to the dot dtype
QF8_DOT = tl.constexpr(2)  # e4m3 × e4m3 dots, P in e4m3

# The kernels' ``Q_SCALE`` constexpr: where the query scale comes from
QS_VALUE = tl.constexpr(0)  # q_scale_val, a float argument
QS_TENSOR = tl.constexpr(1)  # one fp32 value at q_scale_ptr, read on the device
QS_ROWS = tl.constexpr(2)  # [T, H] fp32 at q_scale_ptr, one per (token, head)

E4M3_MAX = tl.constexpr(448.0)  # largest finite e4m3fn value


@triton.jit
def query_scale(
    q_scale_ptr, q_scale_val, tok, head, row_ok, stride_qs_t, BLOCK_M: tl.constexpr,
    Q_SCALE: tl.constexpr,
):  # fmt: skip
    """The query scale of each of the program's ``BLOCK_M`` rows (fp32)."""
    if Q_SCALE == QS_ROWS:
        return tl.load(q_scale_ptr + tok * stride_qs_t + head, mask=row_ok, other=1.0)
    if Q_SCALE == QS_TENSOR:
        return tl.zeros([BLOCK_M], tl.float32) + tl.load(q_scale_ptr).to(tl.float32)
    return tl.zeros([BLOCK_M], tl.float32) + q_scale_val


@triton.jit
def score_scale(
    q_scale_ptr, q_scale_val, tok, head, row_ok, stride_qs_t, qk_scale, BLOCK_M: tl.constexpr,
    Q_SCALE: tl.constexpr, FP8_DOT: tl.constexpr,
):  # fmt: skip
    """``[BLOCK_M, 1]``: each row's factor on the fp32 scores of its e4m3 query, the query
    scale times ``qk_scale`` (and 2^8 where the codes were decoded: they are 2^-8 × the
    query)."""
    q_row = query_scale(q_scale_ptr, q_scale_val, tok, head, row_ok, stride_qs_t, BLOCK_M,
                        Q_SCALE)  # fmt: skip
    if not FP8_DOT:
        q_row = q_row * 256.0
    return (q_row * qk_scale)[:, None]


@triton.jit
def load_fp8_query(
    q_ptr, tok, head, row_ok, stride_t, stride_h, D: tl.constexpr, DOT_DTYPE: tl.constexpr,
    AS_FP8: tl.constexpr,
):  # fmt: skip
    """``[BLOCK_M, D]`` e4m3 query codes (bytes): as e4m3 (``AS_FP8``), else decoded to
    ``DOT_DTYPE`` as 2^-8 × the value (the caller's scale carries the 2^8)."""
    d = tl.arange(0, D)
    codes = tl.load(
        q_ptr + tok[:, None] * stride_t + head[:, None] * stride_h + d[None, :],
        mask=row_ok[:, None],
        other=0,
    )
    if AS_FP8:  # (one return: a compiled kernel types every return statement it reads)
        q = codes.to(tl.float8e4nv, bitcast=True)
    else:
        q = fp8_bytes_to_f16(codes, CVT_TRITON_INT_E4M3).to(DOT_DTYPE)
    return q


@triton.jit
def load_fp8_cols(
    ptr, page, off, n_ok, c0, stride_p, stride_s, COLS: tl.constexpr,
):  # fmt: skip
    """Columns ``[c0, c0 + COLS)`` of ``BLOCK_N`` tokens of an e4m3 pool as e4m3, no
    conversion (``page``/``off`` from the page table, clamped as in ``tiles.safe_pages``).
    Masked tokens load as +0."""
    d = tl.arange(0, COLS)
    row = page * stride_p + off * stride_s + c0
    k = tl.load(ptr + row[:, None] + d[None, :], mask=n_ok[:, None], other=0)
    return k.to(tl.float8e4nv, bitcast=True)


@triton.jit
def load_fp8_kv_tile(
    ckv_ptr, kpe_ptr, page_base, n_entries, num_pages, pos, n_ok, stride_ckv_p, stride_ckv_s,
    stride_kpe_p, stride_kpe_s, PAGE_SIZE: tl.constexpr, D_CKV: tl.constexpr,
    D_KPE: tl.constexpr,
):  # fmt: skip
    """``BLOCK_N`` tokens of an e4m3 pool as e4m3: ``k [BLOCK_N, D_CKV]`` (keys and values)
    and ``kpe [BLOCK_N, D_KPE]`` (``k`` without a RoPE part)."""
    page = safe_pages(page_base, n_entries, num_pages, pos, n_ok, PAGE_SIZE)
    off = pos % PAGE_SIZE
    k = load_fp8_cols(ckv_ptr, page, off, n_ok, 0, stride_ckv_p, stride_ckv_s, D_CKV)
    kpe = k
    if D_KPE > 0:
        kpe = load_fp8_cols(kpe_ptr, page, off, n_ok, 0, stride_kpe_p, stride_kpe_s, D_KPE)
    return k, kpe


@triton.jit
def fp8_scores(q_nope, q_pe, k, kpe, pe_factor, D_KPE: tl.constexpr):
    """``q_nope·kᵀ + pe_factor × q_pe·kpeᵀ`` in fp32 (two dots: the parts' key scales
    differ)."""
    s = tl.dot(q_nope, tl.trans(k))
    if D_KPE > 0:
        s += pe_factor * tl.dot(q_pe, tl.trans(kpe))
    return s


@triton.jit
def _to_e4m3(x, ROUND_INT: tl.constexpr):
    """fp32 ``x`` (within ±448) to e4m3, to nearest even: by integer operations
    (``ROUND_INT``: the interpreter's own cast truncates) or Triton's cast
    (``cvt.rn.satfinite``)."""
    if ROUND_INT:
        return encode_fp8(x, 3, -6, 7).to(tl.float8e4nv, bitcast=True)
    return x.to(tl.float8e4nv)


@triton.jit
def fp8_pv(p, v, P_PARTS: tl.constexpr, ROUND_INT: tl.constexpr):
    """``P·V`` with ``V`` e4m3 and ``P`` in e4m3 under a scale per row (the row's largest
    value becomes 448), the scale taken out of the fp32 product. ``P_PARTS`` 1: ``P`` rounded
    to e4m3 once (4 significant bits); 2: ``P = hi + lo / 16``, two e4m3 dots into one fp32
    sum (8 significant bits, as the 16-bit dot's ``P``; ``V`` still read as e4m3)."""
    p_max = tl.max(p, axis=1)
    up = tl.where(p_max > 0.0, E4M3_MAX / p_max, 1.0)
    x = tl.minimum(p * up[:, None], E4M3_MAX)
    hi = _to_e4m3(x, ROUND_INT)
    pv = tl.dot(hi, v)
    if P_PARTS == 2:
        lo = _to_e4m3((x - hi.to(tl.float32)) * 16.0, ROUND_INT)
        pv = tl.dot(lo, v, pv * 16.0) * 0.0625  # (16 hi + lo)·V / 16
    return pv * (1.0 / up)[:, None]
