"""FP8 pages of a batch converted once into a 16-bit staging buffer.

A long extend chunk's query rows form thousands of row tiles that all read the same KV. An
FP8 kernel converts every tile it reads, once per row tile; staged, the conversion happens
once per token and the 16-bit kernel reads the staging buffer instead (``attention/stage.py``).
Staged page ``j`` is the pool page named by page-table entry ``j``; FP8 values are exact in
fp16, so attention over the staged pages equals attention over the FP8 pool.
"""

import triton
import triton.language as tl

from fp8mla.kernels.portable.fp8_decode import (
    CVT_INT_E4M3,
    CVT_NATIVE,
    CVT_TRITON_INT_E4M3,
    fp8_bytes_to_f16,
)

STAGE_TOKENS = 16  # staged token rows per program


@triton.jit
def _stage_cols(
    src_ptr,
    dst_ptr,
    scale_arr_ptr,
    src_row,  # [TOKENS] int64 element offset of each token's row in the source
    sa_row,  # [TOKENS] int64 offset of each token's group scales (TOKEN_GROUP)
    dst_row,  # [TOKENS] int64 element offset of each staged row
    ok,  # [TOKENS] the page-table entry names a page of the cache
    live,  # [TOKENS] the staged row exists (within the page-table entries)
    COLS: tl.constexpr,
    TOKEN_GROUP: tl.constexpr,
    FP8_CVT: tl.constexpr,
):
    """``COLS`` columns of each token: FP8 → fp32 (× its group scale) → fp16; NaN where the
    page-table entry is out of range."""
    d = tl.arange(0, COLS)
    src = src_row[:, None] + d[None, :]
    if FP8_CVT != CVT_NATIVE:
        x = fp8_bytes_to_f16(tl.load(src_ptr + src, mask=ok[:, None], other=0), FP8_CVT)
        x = x.to(tl.float32)
        if FP8_CVT == CVT_INT_E4M3 or FP8_CVT == CVT_TRITON_INT_E4M3:
            x = x * 256.0  # the integer e4m3 decoding yields 2^-8 × the value
    else:
        x = tl.load(src_ptr + src, mask=ok[:, None], other=0.0).to(tl.float32)
    if TOKEN_GROUP:  # one scale per 128 channels
        sc = tl.load(scale_arr_ptr + sa_row[:, None] + (d // 128)[None, :], mask=ok[:, None],
                     other=1.0)  # fmt: skip
        x = x * sc
    x = tl.where(ok[:, None], x, float("nan"))
    tl.store(dst_ptr + dst_row[:, None] + d[None, :], x.to(tl.float16), mask=live[:, None])


@triton.jit
def kv_stage_kernel(
    ckv_ptr,  # [num_pages, PAGE_SIZE, D_CKV] FP8 (bytes where FP8_CVT decodes bits)
    kpe_ptr,  # [num_pages, PAGE_SIZE, D_KPE] FP8
    scale_arr_ptr,  # [num_pages, PAGE_SIZE, D_CKV // 128] fp32 (TOKEN_GROUP only)
    out_ptr,  # [num_entries, PAGE_SIZE, D_CKV + D_KPE] fp16, contiguous
    kv_indices_ptr,  # [>= num_entries] int32 page-table entries
    num_entries,
    num_pages,
    stride_ckv_p,
    stride_ckv_s,
    stride_kpe_p,
    stride_kpe_s,
    stride_sa_p,
    stride_sa_s,
    PAGE_SIZE: tl.constexpr,
    D_CKV: tl.constexpr,
    D_KPE: tl.constexpr,
    TOKENS: tl.constexpr,
    TOKEN_GROUP: tl.constexpr,
    FP8_CVT: tl.constexpr,
):
    # -- the program's staged rows: entry × PAGE_SIZE + slot --
    row = tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS)
    entry = row // PAGE_SIZE
    slot = row % PAGE_SIZE
    live = entry < num_entries
    page = tl.load(kv_indices_ptr + entry, mask=live, other=0).to(tl.int64)
    ok = live & (page >= 0) & (page < num_pages)  # a bad entry stages NaN, never reads
    page = tl.where(ok, page, 0)
    dst_row = row * (D_CKV + D_KPE)
    sa_row = page * stride_sa_p + slot * stride_sa_s
    # -- latent part, then the RoPE part --
    _stage_cols(ckv_ptr, out_ptr, scale_arr_ptr, page * stride_ckv_p + slot * stride_ckv_s,
                sa_row, dst_row, ok, live, D_CKV, TOKEN_GROUP, FP8_CVT)  # fmt: skip
    if D_KPE > 0:
        _stage_cols(kpe_ptr, out_ptr, scale_arr_ptr, page * stride_kpe_p + slot * stride_kpe_s,
                    sa_row, dst_row + D_CKV, ok, live, D_KPE, False, FP8_CVT)  # fmt: skip
