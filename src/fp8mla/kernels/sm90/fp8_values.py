"""The FP8 value path of the SM90 FP8 × FP8 kernels (``fp8qk.py``, ``pingpong8.py``): ``Vᵀ``
built from a stage's FP8 bytes into wgmma's fp16 register operand (:func:`value_operand`) or,
for a product on FP8 tensor cores, its FP8 register operand (:func:`value_operand8`),
and a value warpgroup's transposed output ``Oᵀ`` stored in whole sectors
(:func:`store_output`).

The register operand fixes which (row, token) each thread holds; the output columns are
permuted instead: accumulator row ``m = g + 8h + 16w + 64a + 128b`` is latent column
``π(m) = 64w + 8g + 4b + 2a + h``, so a thread's 8 rows are 8 adjacent bytes of the FP8 row
(and 8 adjacent outputs).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from fp8mla.kernels.portable.fp8_decode import fp8_bytes_to_f16
from fp8mla.kernels.sm90.common import HALF_N, tile_rows

HALF = gl.constexpr(256)  # output columns per value warpgroup


# Half a value tile [32 tokens, 256 latent columns] as the value warpgroups read it: 8 adjacent
# bytes per thread and token (the register operand's rows m8, m64, m128), its tokens as the
# register operand's K (k1, k8, k16 in registers, k2, k4 across lanes)
V_LOAD = gl.constexpr(
    gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [1, 0], [8, 0], [16, 0]],
        lane_bases=[[2, 0], [4, 0], [0, 8], [0, 16], [0, 32]],
        warp_bases=[[0, 64], [0, 128]],
        block_bases=[],
        shape=[32, 256],
    )
)


# the scales a value warpgroup applies, [32 tokens, 2 groups]: each thread the 8 tokens it
# holds in V_LOAD, of the group its warp's columns belong to (V_LOAD's warp bit [0, 128])
SC_HALF = gl.constexpr(
    gl.DistributedLinearLayout(
        reg_bases=[[1, 0], [8, 0], [16, 0]],
        lane_bases=[[2, 0], [4, 0], [0, 0], [0, 0], [0, 0]],
        warp_bases=[[0, 0], [0, 1]],
        block_bases=[],
        shape=[32, 2],
    )
)


@gluon.jit
def _permuted_operand(v, a_l: gl.constexpr):
    """A half tile ``v [32 tokens, 256 columns]`` as ``Vᵀ`` with its rows permuted,
    ``a[m, k] = v[k, π(m)]``, in the register operand's layout ``a_l``."""
    v = gl.reshape(v, [HALF_N, 4, 8, 2, 2, 2])  # [k, w, g, b, a, h]
    v = gl.permute(v, (3, 4, 1, 5, 2, 0))  # [b, a, w, h, g, k]
    return gl.convert_layout(gl.reshape(v, [HALF, HALF_N]), a_l)


@gluon.jit
def value_operand(
    k_stages, sc_stages, st, kh: gl.constexpr, H: gl.constexpr, TOKEN_GROUP: gl.constexpr,
    FP8_CVT: gl.constexpr, a_l: gl.constexpr,
):  # fmt: skip
    """``Vᵀ`` of tokens ``32kh … 32kh + 31`` of stage ``st``, latent columns ``256H + π(m)``,
    as wgmma's fp16 register operand ``[256, 32]`` (token-group scales applied)."""
    v8 = k_stages.index(st).slice(H * HALF, HALF, dim=1).slice(kh * HALF_N, HALF_N, dim=0)
    v = fp8_bytes_to_f16(v8.load(V_LOAD).to(gl.uint8, bitcast=True), FP8_CVT)  # exact
    if TOKEN_GROUP:  # this warpgroup's two groups: columns 0-127 and 128-255
        sc = sc_stages.index(st).slice(kh * HALF_N, HALF_N, dim=0).slice(2 * H, 2, dim=1)
        sc = sc.load(SC_HALF)
        v3 = gl.reshape(v.to(gl.float32), [HALF_N, 2, 128])  # [token, group, column]
        sc = gl.convert_layout(sc, gl.SliceLayout(2, v3.type.layout), assert_trivial=True)
        v = gl.reshape(v3 * sc[:, :, None], [HALF_N, HALF]).to(gl.float16)
    return _permuted_operand(v, a_l)


# The same half tile as the FP8 register operand of an FP8 product (``value_operand8``): 8
# adjacent bytes a token and thread as in V_LOAD, its tokens as that operand's K with four
# adjacent tokens to a register (k1, k2 and k16 in registers, k4 and k8 across lanes)
V_LOAD8 = gl.constexpr(
    gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [1, 0], [2, 0], [16, 0]],
        lane_bases=[[4, 0], [8, 0], [0, 8], [0, 16], [0, 32]],
        warp_bases=[[0, 64], [0, 128]],
        block_bases=[],
        shape=[32, 256],
    )
)


@gluon.jit
def value_operand8(k_stages, st, kh: gl.constexpr, H: gl.constexpr, a_l: gl.constexpr):
    """``Vᵀ`` of tokens ``32kh … 32kh + 31`` of stage ``st``, latent columns ``256H + π(m)``,
    as an FP8 product's register operand ``[256, 32]``: the stage's bytes as they are (per-tensor
    scales only), moved between a thread's registers (four tokens' bytes of a column to a
    register), never converted."""
    v = k_stages.index(st).slice(H * HALF, HALF, dim=1).slice(kh * HALF_N, HALF_N, dim=0)
    return _permuted_operand(v.load(V_LOAD8), a_l)


@gluon.jit
def store_output(
    o, o_ptr, q_start, rows_total, split, num_heads, num_tokens, stride_o_split, stride_o_t,
    stride_o_h, H: gl.constexpr, BLOCK_R: gl.constexpr, ROW_TILES: gl.constexpr,
):  # fmt: skip
    """Value warpgroup ``H``'s output ``Oᵀ [256, R]`` (accumulator layout, already scaled) into
    columns ``256H …`` of the row tile's outputs (:func:`tile_rows`; split ``split``'s
    partials, or the output)."""
    # accumulator row m = g + 8h + 16w + 64a + 128b is latent column 64w + 8g + 4b + 2a + h:
    # reordered in registers (each thread then holds 8 adjacent columns of a row), then put
    # in the store layout: 16-bit values as they are, fp32 4 adjacent columns per thread
    out = gl.reshape(o, [2, 2, 4, 2, 8, BLOCK_R])  # [b, a, w, h, g, n]
    out = gl.reshape(gl.permute(out, (2, 4, 0, 1, 3, 5)), [HALF, BLOCK_R])
    if o_ptr.dtype.element_ty.primitive_bitwidth == 16:
        # fp16 partials or a 16-bit output: each thread's 8 adjacent columns of a row are
        # 16 contiguous bytes, and a store instruction's lanes write 4 rows × 128 contiguous
        # bytes (whole sectors) from where the reorder left them: only the registers' order
        # changes (n: j, t, k of the accumulator; columns: h, a, b in registers, g in lanes)
        if BLOCK_R == 64:  # (the FP8 ping-pong kernel's 64 rows, pingpong8.py)
            o_st: gl.constexpr = gl.DistributedLinearLayout(
                reg_bases=[[1, 0], [2, 0], [4, 0], [0, 1], [0, 8], [0, 16], [0, 32]],
                lane_bases=[[0, 2], [0, 4], [8, 0], [16, 0], [32, 0]],
                warp_bases=[[64, 0], [128, 0]], block_bases=[], shape=[HALF, BLOCK_R],
            )  # fmt: skip
        elif BLOCK_R == 32:
            o_st: gl.constexpr = gl.DistributedLinearLayout(
                reg_bases=[[1, 0], [2, 0], [4, 0], [0, 1], [0, 8], [0, 16]],
                lane_bases=[[0, 2], [0, 4], [8, 0], [16, 0], [32, 0]],
                warp_bases=[[64, 0], [128, 0]], block_bases=[], shape=[HALF, BLOCK_R],
            )  # fmt: skip
        else:
            o_st: gl.constexpr = gl.DistributedLinearLayout(
                reg_bases=[[1, 0], [2, 0], [4, 0], [0, 1], [0, 8]],
                lane_bases=[[0, 2], [0, 4], [8, 0], [16, 0], [32, 0]],
                warp_bases=[[64, 0], [128, 0]], block_bases=[], shape=[HALF, BLOCK_R],
            )  # fmt: skip
        out = gl.convert_layout(out, o_st, assert_trivial=True)
    else:
        # fp32: each store instruction: 16 lanes × 16 bytes = one row's 256 contiguous bytes,
        # two rows (whole 32-byte sectors; 16 bytes per lane at a 32-byte stride half-filled
        # each sector and took twice the L2 writes)
        if BLOCK_R == 64:
            o_st: gl.constexpr = gl.DistributedLinearLayout(
                reg_bases=[[1, 0], [2, 0], [0, 2], [0, 4], [0, 8], [0, 16], [0, 32]],
                lane_bases=[[4, 0], [8, 0], [16, 0], [32, 0], [0, 1]],
                warp_bases=[[64, 0], [128, 0]], block_bases=[], shape=[HALF, BLOCK_R],
            )  # fmt: skip
        elif BLOCK_R == 32:
            o_st: gl.constexpr = gl.DistributedLinearLayout(
                reg_bases=[[1, 0], [2, 0], [0, 2], [0, 4], [0, 8], [0, 16]],
                lane_bases=[[4, 0], [8, 0], [16, 0], [32, 0], [0, 1]],
                warp_bases=[[64, 0], [128, 0]], block_bases=[], shape=[HALF, BLOCK_R],
            )  # fmt: skip
        else:
            o_st: gl.constexpr = gl.DistributedLinearLayout(
                reg_bases=[[1, 0], [2, 0], [0, 2], [0, 4], [0, 8]],
                lane_bases=[[4, 0], [8, 0], [16, 0], [32, 0], [0, 1]],
                warp_bases=[[64, 0], [128, 0]], block_bases=[], shape=[HALF, BLOCK_R],
            )  # fmt: skip
        out = gl.convert_layout(out, o_st)
    row0, rows_end = tile_rows(rows_total, BLOCK_R, ROW_TILES)
    r = row0 + gl.arange(0, BLOCK_R, layout=gl.SliceLayout(0, o_st))
    tok = q_start + r // num_heads
    r_ok = (r < rows_end) & (tok < num_tokens)
    base = o_ptr + split * stride_o_split + tok.to(gl.int64) * stride_o_t
    base += (r % num_heads) * stride_o_h + H * HALF
    col = gl.arange(0, HALF, layout=gl.SliceLayout(1, o_st))
    gl.store(base[None, :] + col[:, None], out.to(o_ptr.dtype.element_ty), mask=r_ok[None, :])
