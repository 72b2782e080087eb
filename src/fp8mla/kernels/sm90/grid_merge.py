"""The split merge inside the attention grid (SM90 Gluon kernels, ``MERGE_IN_GRID``).

A split plan's merge is otherwise a launch of its own, which waits for the whole attention
grid to end and then reads the partials back: for a decode of a few tokens that costs more
than the merge's work (design/merge.md). Here the programs of a request meet instead, and
merge its rows themselves:

- each program stores its partials, then one thread of the score partition arrives on the
  request's 64-bit counter (:func:`request_barrier`), which only grows: a call's programs
  wait until it reaches the next multiple of their number. It is zero at ``plan()``, and a
  call leaves it a multiple (every program of the grid arrives, past the call's tokens too).
  The partials are released at GPU scope by that thread's fence after the partitions'
  barriers (as a cooperative grid's sync does), and acquired by the waiters' loads;
- each program then merges rows ``split, split + splits, …`` of its request
  (:func:`merge_rows`), every split's partial read from the L2 (``.cg``: never a stale L1
  line), weighted by ``2^(lse_s - max)`` as the merge kernel does. With ``MERGE_IN_GRID`` 2
  a second program a split (the grid's first axis) computes nothing and only merges: the
  request's rows are merged in halves of 256 columns by twice the programs, each reading half
  the bytes (one SM's reads of the partials set the merge's pace, design/sparse-one-token-runs.md).

Waiting for other programs needs them resident at once: the launch is cooperative (CUDA
refuses a grid that cannot be), and the planner chooses this only for grids of at most one
program per multiprocessor (``dsa/sparse_sm90.merges_in_grid``).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

NEG_INF = gl.constexpr(float("-inf"))

# one thread of the calling partition (the element 0 of a [128] tensor over its 4 warps)
# arrives and waits; the rest meet it at the partition barrier after
_BARRIER_ASM = gl.constexpr("""
{
.reg .pred p_skip, p_wait;
.reg .b64 r_old, r_target, r_cur, r_n;
setp.eq.u32 p_skip, $3, 0;
@p_skip bra GM_DONE;
cvt.u64.u32 r_n, $2;
fence.acq_rel.gpu;
atom.relaxed.gpu.global.add.u64 r_old, [$1], 1;
div.u64 r_target, r_old, r_n;
add.u64 r_target, r_target, 1;
mul.lo.u64 r_target, r_target, r_n;
GM_WAIT:
ld.acquire.gpu.global.u64 r_cur, [$1];
setp.lt.u64 p_wait, r_cur, r_target;
@p_wait bra GM_WAIT;
GM_DONE:
mov.u32 $0, 0;
}
""")


@gluon.jit
def request_barrier(sync_ptr, programs):
    """Wait until all ``programs`` programs of the request whose 64-bit arrival counter is at
    ``sync_ptr`` have called this (the counter only grows: a call's programs wait for the
    next multiple of ``programs``); the stores the calling programs made before their
    partitions' barriers are visible after it. Called by a partition of 4 warps, after a
    barrier over it."""
    one: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    first = (gl.arange(0, 128, layout=one) == 0).to(gl.int32)
    gl.inline_asm_elementwise(
        _BARRIER_ASM, "=r,l,r,r", [sync_ptr, programs, first], dtype=gl.int32,
        is_pure=False, pack=1,
    )  # fmt: skip


@gluon.jit
def merge_rows(
    o_ptr, lse_ptr, out_ptr, out_lse_ptr, q_start, rows_total, first, step, splits, num_heads,
    num_tokens, stride_o_split, stride_o_t, stride_o_h, stride_lse_split, stride_lse_t,
    stride_out_t, stride_out_h, stride_out_lse_t, factor, WRITE_OUT_LSE: gl.constexpr,
    D: gl.constexpr, BLOCK_S: gl.constexpr, PARTS: gl.constexpr,
):  # fmt: skip
    """The request's rows (row = token × heads + head, from ``q_start``) in ``PARTS`` column
    parts each, units ``first, first + step, …`` of them (unit ``u``: row ``u // PARTS``,
    columns ``(u % PARTS) · D / PARTS …``), merged from the ``splits`` partial outputs
    (``o_ptr``, fp32 or fp16 times ``factor``) and base-2 LSEs into ``out_ptr`` (and the
    base-2 LSE into ``out_lse_ptr``, by a row's first part): a split that saw nothing is never
    read, a NaN LSE (a bad page entry) makes the row NaN, a row no split saw gets 0 and -inf.
    Rows past ``rows_total`` or the call's tokens are not written. ``BLOCK_S`` splits at a
    time: each thread holds 8 adjacent columns (16 bytes of fp16) of some of them,
    ``2 · PARTS`` lanes a column group, their loads issued together and summed in its
    registers, then across those lanes. Called by a partition of 4 warps, ``D`` = 512."""
    gl.static_assert(D == 512, "4 warps × 16 lanes × 8 columns")
    COLS: gl.constexpr = D // PARTS
    TPW_S: gl.constexpr = 2 * PARTS
    # [BLOCK_S, COLS]: 16-byte loads measured faster than 4 columns of all BLOCK_S splits a
    # thread (8-byte loads) at one and four tokens (design/sparse-one-token-runs.md, s14l)
    ml: gl.constexpr = gl.BlockedLayout([BLOCK_S // TPW_S, 8], [TPW_S, 32 // TPW_S], [1, 4],
                                        [1, 0])  # fmt: skip
    s_l: gl.constexpr = gl.SliceLayout(1, ml)
    c = gl.arange(0, COLS, layout=gl.SliceLayout(0, ml))
    s_idx = gl.arange(0, BLOCK_S, layout=s_l)
    for u in range(first, rows_total * PARTS, step):
        r = u // PARTS
        part = u % PARTS
        tok = q_start + r // num_heads
        if tok < num_tokens:
            h = r % num_heads
            d = part * COLS + c
            o_row = o_ptr + tok.to(gl.int64) * stride_o_t + h * stride_o_h
            lse_row = lse_ptr + tok.to(gl.int64) * stride_lse_t + h
            m = gl.max(gl.full([BLOCK_S], NEG_INF, gl.float32, layout=s_l), axis=0)
            total = gl.sum(gl.zeros([BLOCK_S], gl.float32, layout=s_l), axis=0)
            acc = gl.zeros([COLS], gl.float32, layout=gl.SliceLayout(0, ml))
            nan_seen = gl.zeros([BLOCK_S], gl.int32, layout=s_l)
            for s0 in range(0, splits, BLOCK_S):
                s = s0 + s_idx
                s_ok = s < splits
                lse_s = gl.load(lse_row + s * stride_lse_split, mask=s_ok, other=NEG_INF,
                                cache_modifier=".cg")  # fmt: skip
                o_s = gl.load(
                    o_row + s[:, None].to(gl.int64) * stride_o_split + d[None, :],
                    mask=s_ok[:, None], other=0.0, cache_modifier=".cg",
                ).to(gl.float32)  # fmt: skip
                nan_seen |= (lse_s != lse_s).to(gl.int32)
                live = lse_s > NEG_INF
                m_new = gl.maximum(m, gl.max(gl.where(live, lse_s, NEG_INF), axis=0))
                m_use = gl.where(m_new == NEG_INF, 0.0, m_new)
                alpha = gl.exp2(m - m_use)
                w = gl.where(live, gl.exp2(lse_s - m_use), 0.0)
                o_w = gl.sum(gl.where(live[:, None], w[:, None] * o_s, 0.0), axis=0)
                acc = acc * alpha + o_w
                total = total * alpha + gl.sum(w, axis=0)
                m = m_new
            bad = gl.max(nan_seen, axis=0) > 0
            has = total > 0.0
            inv = gl.where(has, factor / gl.where(has, total, 1.0), 0.0)
            out = gl.where(bad, float("nan"), acc * inv)
            out_row = out_ptr + tok.to(gl.int64) * stride_out_t + h * stride_out_h
            gl.store(out_row + d, out.to(out_ptr.dtype.element_ty))
            if WRITE_OUT_LSE:
                if part == 0:
                    lse = gl.where(has, m + gl.log2(gl.where(has, total, 1.0)), NEG_INF)
                    lse = gl.where(bad, float("nan"), lse)
                    gl.store(out_lse_ptr + tok.to(gl.int64) * stride_out_lse_t + h, lse)
