"""The FP8 ping-pong kernel's query staging (``kernels/sm90/fp8_stage.stage_query_blocks``) on an SM90 GPU:
both consumers' halves staged into the kernel's shared-memory operands, read back and compared
bit for bit with the same arithmetic in PyTorch: per row and part the power of two ``s``,
``hi = e4m3(q·s)`` in column blocks 0-3, ``lo = e4m3(q·s − hi)`` in blocks 4-7, the RoPE
part's hi and lo, ``1 / s`` of both parts; rows past the request's as zeros."""

from __future__ import annotations

import pytest
import torch

E4M3 = torch.float8_e4m3fn
ROWS = 64


try:  # Gluon (an SM90 build of Triton); the test is skipped without it
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from fp8mla.kernels.sm90.common import thread_barrier
    from fp8mla.kernels.sm90.fp8_stage import stage_query_blocks
except ImportError:
    gluon = None

pytestmark = pytest.mark.skipif(
    gluon is None or not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
    reason="Gluon kernels need an SM90 GPU",
)


def _split(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(hi, lo, 1 / s)`` of rows ``q [R, D]`` as the kernel computes them."""
    amax = q.float().abs().amax(dim=1, keepdim=True)
    amax = torch.where(amax > 0, amax, torch.full_like(amax, 448.0))
    s = torch.exp2(torch.clamp(torch.floor(torch.log2(448.0 / amax)), max=126.0))
    x = q.float() * s
    hi = x.to(E4M3)
    return hi, (x - hi.float()).to(E4M3), (1.0 / s).squeeze(1)


if gluon is not None:

    @gluon.jit
    def staged(q_nope_ptr, q_pe_ptr, blocks_ptr, pe_ptr, inv_ptr, rows_total, num_heads,
               num_tokens, stride_qn_t, stride_qn_h, stride_qp_t,
               stride_qp_h):  # fmt: skip
        k_sh: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=128, element_bitwidth=8, rank=2
        )
        pe_sh: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=64, element_bitwidth=8, rank=2
        )
        vec_sh: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
        q_blocks = gl.allocate_shared_memory(gl.float8e4nv, [8, 64, 128], k_sh)
        qpe = gl.allocate_shared_memory(gl.float8e4nv, [2, 64, 64], pe_sh)
        inv = gl.allocate_shared_memory(gl.float32, [2, 64], vec_sh)
        row0 = gl.program_id(0) * 64
        rows_end = gl.minimum(rows_total, row0 + 64)
        stage_query_blocks(q_blocks, qpe, inv, q_nope_ptr, q_pe_ptr, 0, row0, rows_end, num_heads,
                      num_tokens, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, 512, 64,
                      0)  # fmt: skip
        stage_query_blocks(q_blocks, qpe, inv, q_nope_ptr, q_pe_ptr, 0, row0, rows_end, num_heads,
                      num_tokens, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, 512, 64,
                      1)  # fmt: skip
        thread_barrier()
        ld: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
        r = gl.arange(0, 64, layout=gl.SliceLayout(1, ld))[:, None]
        c = gl.arange(0, 128, layout=gl.SliceLayout(0, ld))[None, :]
        base = gl.program_id(0) * 8
        for b in gl.static_range(8):
            v = q_blocks.index(b).load(ld)
            gl.store(blocks_ptr + ((base + b) * 64 + r) * 128 + c, v)
        pe_l: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
        pr = gl.arange(0, 64, layout=gl.SliceLayout(1, pe_l))[:, None]
        pc = gl.arange(0, 64, layout=gl.SliceLayout(0, pe_l))[None, :]
        vl: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        for h in gl.static_range(2):
            v = qpe.index(h).load(pe_l)
            gl.store(pe_ptr + ((gl.program_id(0) * 2 + h) * 64 + pr) * 64 + pc, v)
            i = gl.arange(0, 64, layout=vl)
            gl.store(inv_ptr + (gl.program_id(0) * 2 + h) * 64 + i, inv.index(h).load(vl))


@pytest.mark.parametrize("tokens, heads", [(1, 128), (5, 16), (3, 40)])
def test_staged_operands_match_the_split(tokens, heads):
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(tokens * 1000 + heads)
    q = torch.randn(tokens, heads, 576, generator=g)
    q[..., ::37] *= 40.0
    q *= torch.exp2(torch.randint(-12, 3, (tokens, heads, 1), generator=g).float())
    q = q.to(torch.bfloat16)
    q_nope, q_pe = q[..., :512].to(dev), q[..., 512:].contiguous().to(dev)
    rows = tokens * heads
    tiles = (rows + ROWS - 1) // ROWS
    blocks = torch.empty(tiles * 8, 64, 128, dtype=E4M3, device=dev)
    pe = torch.empty(tiles * 2, 64, 64, dtype=E4M3, device=dev)
    inv = torch.empty(tiles * 2, 64, dtype=torch.float32, device=dev)
    staged[(tiles,)](
        q_nope, q_pe, blocks, pe, inv, rows, heads, tokens, q_nope.stride(0), q_nope.stride(1),
        q_pe.stride(0), q_pe.stride(1), num_warps=4,
    )  # fmt: skip
    torch.cuda.synchronize()

    padded = torch.zeros(tiles * ROWS, 576, dtype=torch.bfloat16)
    padded[:rows] = q.reshape(rows, 576)
    hi, lo, inv_n = _split(padded[:, :512])
    pe_hi, pe_lo, inv_p = _split(padded[:, 512:])
    blocks, pe, inv = blocks.cpu(), pe.cpu(), inv.cpu()
    for t in range(tiles):
        rs = slice(t * ROWS, (t + 1) * ROWS)
        for b in range(4):
            cs = slice(128 * b, 128 * b + 128)
            assert torch.equal(blocks[8 * t + b].view(torch.uint8), hi[rs, cs].view(torch.uint8))
            assert torch.equal(
                blocks[8 * t + 4 + b].view(torch.uint8), lo[rs, cs].view(torch.uint8)
            )
        assert torch.equal(pe[2 * t].view(torch.uint8), pe_hi[rs].view(torch.uint8))
        assert torch.equal(pe[2 * t + 1].view(torch.uint8), pe_lo[rs].view(torch.uint8))
        assert torch.equal(inv[2 * t], inv_n[rs])
        assert torch.equal(inv[2 * t + 1], inv_p[rs])
