"""The split merge (``kernels/merge.py``) against the float64 merge of the same partials, with
an empty split (LSE -inf, its bytes garbage), a NaN split (a bad page entry: the row is NaN),
LSEs far apart, and as many splits as the planner lets one pass read (one request of 32
heads: 64 splits in 128-column programs)."""

from __future__ import annotations

import pytest
import torch

from fp8mla.attention.planner import merge_block_s
from fp8mla.kernels.portable.merge import mla_merge_kernel


def _merge64(mid_o: torch.Tensor, mid_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 merge of ``mid_o [S, R, D]`` with base-2 LSEs ``mid_lse [S, R]``."""
    o, lse = mid_o.double(), mid_lse.double()
    live = lse > float("-inf")
    m = torch.where(live, lse, torch.full_like(lse, float("-inf"))).amax(0)
    w = torch.where(live, torch.exp2(lse - m), torch.zeros_like(lse))
    out = (w[..., None] * torch.where(live[..., None], o, torch.zeros_like(o))).sum(0) / w.sum(0)[
        :, None
    ]
    return out, m + torch.log2(w.sum(0))


@pytest.mark.parametrize("splits, block_d", [(3, 512), (16, 256), (64, 128)])
def test_merge_matches_float64(splits, block_d, device):
    g = torch.Generator().manual_seed(splits)
    heads, D = 4, 512
    mid_o = torch.randn(splits, heads, D, generator=g) * 3.0
    mid_lse = torch.randn(splits, heads, generator=g) * 20.0  # weights 2^±60 apart
    mid_lse[1, 0] = float("-inf")  # an empty split: its bytes must not count
    mid_o[1, 0] = float("nan")
    mid_lse[0, 3] = float("nan")  # a bad page entry in one split: the row turns NaN
    mid_o, mid_lse = mid_o.to(device), mid_lse.to(device)
    out = torch.empty(1, heads, D, dtype=torch.bfloat16, device=device)
    lse = torch.empty(1, heads, device=device)
    qo = torch.tensor([0, 1], dtype=torch.int32, device=device)
    grid = (D // block_d, heads, 1)
    mla_merge_kernel[grid](
        mid_o, mid_lse, out, lse, qo, splits, heads, 1, mid_o.stride(0), mid_lse.stride(0),
        out.stride(0), out.stride(1), lse.stride(0), D=D, BLOCK_D=block_d,
        BLOCK_S=merge_block_s(splits, block_d), WRITE_LSE=True,
    )  # fmt: skip
    want, want_lse = _merge64(mid_o, mid_lse)
    assert torch.isnan(out[0, 3]).all() and torch.isnan(lse[0, 3])
    ok = slice(0, 3)
    err = (out[0, ok].double() - want[ok]).norm() / want[ok].norm()
    assert err < 4e-3  # bf16 output rounding only
    assert torch.allclose(lse[0, ok].double(), want_lse[ok], rtol=0, atol=1e-4)


def test_merge_imports_without_gluon():
    """A Triton without Gluon (older than the Gluon kernels) still has the split merge: its
    wait for the attention grid does not pull in the Gluon trigger's imports."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import importlib.abc, sys
        class Hide(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.startswith("triton.experimental.gluon"):
                    raise ImportError(name)
        sys.meta_path.insert(0, Hide())
        import fp8mla.kernels.portable.grid_dependency as g
        from fp8mla.kernels.portable.merge import mla_merge_kernel
        assert not hasattr(g, "launch_dependents")
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize("splits, block_d, warps", [(4, 512, 2), (16, 256, 1), (64, 128, 4)])
def test_merge_of_fp16_partials_with_their_factor(splits, block_d, warps, device):
    """fp16 partials as the FP8 × FP8 kernel stores them (``workspace.Partials``): ``o / l``
    without the V scale (averages of FP8 values, up to e5m2's 57,344), the V scale beside
    them; merged outputs far past fp16's range against the float64 merge, with an empty
    split whose bytes are garbage."""
    from fp8mla.attention.workspace import split_partials

    g = torch.Generator().manual_seed(splits)
    heads, D, v_scale = 4, 512, 37.5
    stored = (torch.rand(splits, heads, D, generator=g) * 2 - 1) * 57344.0
    stored = stored.half().float()  # what the kernel stores, exactly
    mid_lse = torch.randn(splits, heads, generator=g) * 20.0
    mid_lse[1, 0] = float("-inf")
    work = torch.zeros(splits * (D + 1) * heads, dtype=torch.float32, device=device)
    part = split_partials(work, splits, heads, D, half=True)
    part.o[:, :heads] = stored.to(device)
    part.o[1, 0] = float("nan")
    part.lse[:, :heads] = mid_lse.to(device)
    part.mult.fill_(v_scale)
    out = torch.empty(1, heads, D, dtype=torch.bfloat16, device=device)
    lse = torch.empty(1, heads, device=device)
    qo = torch.tensor([0, 1], dtype=torch.int32, device=device)
    mla_merge_kernel[(D // block_d, heads, 1)](
        part.o, part.lse, out, lse, qo, splits, heads, 1, part.o.stride(0), part.lse.stride(0),
        out.stride(0), out.stride(1), lse.stride(0), D=D, BLOCK_D=block_d,
        BLOCK_S=merge_block_s(splits, block_d, warps, True), WRITE_LSE=True,
        mid_mult_ptr=part.mult, num_warps=warps,
    )  # fmt: skip
    want, want_lse = _merge64(stored * v_scale, mid_lse)
    assert out.float().abs().max() > 65504
    err = (out[0].double().cpu() - want).norm() / want.norm()
    assert err < 4e-3  # bf16 output rounding only
    assert torch.allclose(lse[0].double().cpu(), want_lse, rtol=0, atol=1e-4)


def test_half_partials_views_leave_the_lse_in_place():
    """fp16 partials take the first half of the fp32 outputs' bytes and their factors the
    start of the second: the LSEs stay where fp32 plans have them, nothing overlaps, and a
    re-plan of the same split count sees the same addresses (what a CUDA graph replays)."""
    from fp8mla.attention.workspace import split_partials

    work = torch.zeros(3 * 513 * 40 + 7, dtype=torch.float32)
    wide = split_partials(work, 3, 24, 512)
    half = split_partials(work, 3, 24, 512, half=True)
    assert half.lse.data_ptr() == wide.lse.data_ptr() and wide.mult is None
    assert half.mult.numel() == 1
    assert half.o.dtype == torch.float16 and half.o.shape == wide.o.shape
    spans = sorted(
        (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
        for t in (half.o, half.mult, half.lse)
    )
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    end = work.data_ptr() + work.numel() * 4
    assert spans[0][0] == work.data_ptr() and spans[-1][1] <= end
    again = split_partials(work, 3, 10, 512, half=True)
    assert again.mult.data_ptr() == half.mult.data_ptr() and again.o.stride() == half.o.stride()


def test_empty_rows_of_fp16_partials_stay_zero(device):
    """A row whose every split is empty is 0 whatever the factor's bytes (the workspace is
    uninitialized until an attention grid writes it)."""
    from fp8mla.attention.workspace import split_partials

    splits, heads, D = 2, 2, 512
    work = torch.full((splits * (D + 1) * heads,), float("nan"), device=device)
    part = split_partials(work, splits, heads, D, half=True)
    part.lse[:, 0] = float("-inf")  # row 0: no split has a token
    out = torch.empty(1, heads, D, dtype=torch.bfloat16, device=device)
    qo = torch.tensor([0, 1], dtype=torch.int32, device=device)
    mla_merge_kernel[(1, heads, 1)](
        part.o, part.lse, out, out, qo, splits, heads, 1, part.o.stride(0), part.lse.stride(0),
        out.stride(0), out.stride(1), 0, D=D, BLOCK_D=D, BLOCK_S=2, WRITE_LSE=False,
        mid_mult_ptr=part.mult, num_warps=2,
    )  # fmt: skip
    assert torch.equal(out[0, 0], torch.zeros_like(out[0, 0]))
    assert torch.isnan(out[0, 1]).all()  # a NaN partial of a live split: NaN, as with fp32
