"""FP8 codes to fp16 in registers, for every target.

``FP8_CVT`` (a constexpr of the kernels) says how: Triton's own cast, the SM89+ ``cvt``
instructions, or integer bit moves that need no FP8 hardware (SM80/86, AMD, the CPU
interpreter). Every mode is exact for all 256 codes, NaN included; the integer e4m3 modes
yield 2^-8 × the value, and the kernels fold the 2^8 into their scales.
"""

import triton
import triton.language as tl

# How FP8 tiles become fp16 (the ``FP8_CVT`` constexpr):
CVT_NATIVE = tl.constexpr(0)  # ``.to(fp16)``: the interpreter, AMD
CVT_PTX_E4M3 = tl.constexpr(1)  # cvt.rn.f16x2.e4m3x2 (SM89+)
CVT_PTX_E5M2 = tl.constexpr(2)  # cvt.rn.f16x2.e5m2x2 (SM89+)
CVT_INT_E4M3 = tl.constexpr(3)  # byte → fp16 bits with prmt/shift/lop3 (any CUDA GPU), value × 2^-8
CVT_INT_E5M2 = tl.constexpr(4)  # byte → fp16 high byte (any CUDA GPU), exact
CVT_TRITON_INT_E4M3 = tl.constexpr(5)  # the same bit moves in Triton integer ops (any target)
CVT_TRITON_INT_E5M2 = tl.constexpr(6)  # (AMD, which has no inline PTX; the interpreter)


@triton.jit
def fp8_bytes_to_f16(b, FP8_CVT: tl.constexpr):
    """uint8 FP8 codes → fp16 in registers, four codes per PTX block.

    The conversion is opaque inline assembly on purpose: Triton then keeps the fp16 tile as
    the value both dots read, staging it through shared memory in fp16 (``ldmatrix``,
    transposed for P·V) instead of re-loading FP8 bytes one by one for each dot.

    ``CVT_TRITON_INT_*`` are the same bit moves as Triton integer operations, for targets
    without inline PTX (AMD) and the interpreter: e4m3 → ``((b & 0x80) << 8) | t`` with
    ``t = (b & 0x7F) << 7`` = 2^-8 × value, where the NaN code (``t == 0x3F80``) also sets bit
    14 (``t | ((t + 0x80) & 0x4000)``: all exponent bits, an fp16 NaN); e5m2 → ``b << 8``.
    Both are exact for all 256 codes, NaN included."""
    if FP8_CVT == CVT_TRITON_INT_E4M3:
        h = b.to(tl.uint16)
        t = (h & 0x7F) << 7
        t = t | ((t + 0x80) & 0x4000)
        return (((h & 0x80) << 8) | t).to(tl.float16, bitcast=True)
    if FP8_CVT == CVT_TRITON_INT_E5M2:
        return (b.to(tl.uint16) << 8).to(tl.float16, bitcast=True)
    return _four_codes(b, FP8_CVT, False)


@triton.jit
def fp8_words_to_f16x2(w, FP8_CVT: tl.constexpr):
    """int32 words of four FP8 codes each (a code's byte order in memory) → two int32 words of
    fp16 pairs: codes 0-1 and codes 2-3, each pair low half first, as
    :func:`fp8_bytes_to_f16` converts them (the PTX and CUDA integer modes only). For kernels
    that carry FP8 tiles in registers as words and store them as fp16 pairs."""
    tl.static_assert(
        FP8_CVT >= CVT_PTX_E4M3 and FP8_CVT <= CVT_INT_E5M2,
        "fp8_words_to_f16x2 takes the PTX and CUDA integer modes only",
    )
    return _four_codes(w, FP8_CVT, True)


@triton.jit
def _four_codes(x, FP8_CVT: tl.constexpr, WORDS: tl.constexpr):
    """The PTX block of ``FP8_CVT`` on four codes in a 32-bit register: ``x`` uint8 codes →
    fp16 values (four a block), or with ``WORDS`` int32 words → two int32 words of fp16
    pairs."""
    if FP8_CVT == CVT_PTX_E4M3:
        asm: tl.constexpr = """{ .reg .b16 lo, hi;
        mov.b32 {lo, hi}, $2;
        cvt.rn.f16x2.e4m3x2 $0, lo;
        cvt.rn.f16x2.e4m3x2 $1, hi; }"""
    elif FP8_CVT == CVT_PTX_E5M2:
        asm: tl.constexpr = """{ .reg .b16 lo, hi;
        mov.b32 {lo, hi}, $2;
        cvt.rn.f16x2.e5m2x2 $0, lo;
        cvt.rn.f16x2.e5m2x2 $1, hi; }"""
    elif FP8_CVT == CVT_INT_E4M3:
        # each code to the high byte of an fp16 lane; then the sign stays and exponent and
        # mantissa move right by one: ((b & 0x80) << 8) | ((b & 0x7F) << 7) = 2^-8 × value;
        # the NaN code's lane (0x3F80) + 0x80 carries into bit 14: OR-ed in, an fp16 NaN
        asm: tl.constexpr = """{ .reg .b32 w0, w1, t0, t1, n0, n1;
        prmt.b32 w0, $2, 0, 0x1404;
        prmt.b32 w1, $2, 0, 0x3424;
        and.b32 t0, w0, 0x7F007F00;
        and.b32 t1, w1, 0x7F007F00;
        shr.b32 t0, t0, 1;
        shr.b32 t1, t1, 1;
        add.u32 n0, t0, 0x00800080;
        add.u32 n1, t1, 0x00800080;
        lop3.b32 t0, n0, 0x40004000, t0, 0xEA;
        lop3.b32 t1, n1, 0x40004000, t1, 0xEA;
        lop3.b32 $0, w0, t0, 0x80008000, 0xEC;
        lop3.b32 $1, w1, t1, 0x80008000, 0xEC; }"""
    else:
        asm: tl.constexpr = """{ prmt.b32 $0, $2, 0, 0x1404;
        prmt.b32 $1, $2, 0, 0x3424; }"""
    if WORDS:
        return tl.inline_asm_elementwise(
            asm=asm, constraints="=r,=r,r", args=[x], dtype=(tl.int32, tl.int32), is_pure=True,
            pack=1,
        )  # fmt: skip
    else:
        return tl.inline_asm_elementwise(
            asm=asm, constraints="=r,=r,r", args=[x], dtype=tl.float16, is_pure=False, pack=4
        )
