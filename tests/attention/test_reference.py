"""The reference against an independent, loop-based computation."""

from __future__ import annotations

import math

import pytest
import torch

from fp8mla.reference import dequantize, mla_reference
from fp8mla.testing import make_batch


def loop_attention(batch, *, sm_scale, causal, lse_base="2"):
    """Token by token, head by head, key by key: nothing shared with the reference."""
    qo, kvp, kl = batch.qo_indptr.tolist(), batch.kv_indptr.tolist(), batch.kv_len.tolist()
    tokens, heads, _ = batch.q_nope.shape
    out = torch.zeros(tokens, heads, 512, dtype=torch.float64)
    lse = torch.full((tokens, heads), -math.inf, dtype=torch.float64)
    ps = batch.page_size
    for b in range(len(kl)):
        n, length = qo[b + 1] - qo[b], kl[b]
        keys, vals = [], []
        for pos in range(length):
            page = int(batch.kv_indices[kvp[b] + pos // ps])
            ckv = batch.ckv[page, pos % ps].double()
            if batch.ckv_scale_arr is not None:
                group = batch.ckv_scale_arr[page, pos % ps].double()
                ckv = ckv * group.repeat_interleave(128)
            else:
                ckv = ckv * batch.ckv_scale
            kpe = batch.kpe[page, pos % ps].double() * batch.kpe_scale
            keys.append(torch.cat([ckv, kpe]))
            vals.append(ckv)
        for i in range(n):
            t = qo[b] + i
            visible = length - n + i + 1 if causal else length
            for h in range(heads):
                q = torch.cat([batch.q_nope[t, h], batch.q_pe[t, h]]).double()
                scores = [float(q @ keys[j]) * sm_scale for j in range(visible)]
                if not scores:
                    continue
                m = max(scores)
                weights = [math.exp(s - m) for s in scores]
                total = sum(weights)
                out[t, h] = sum(w * vals[j] for j, w in enumerate(weights)) / total
                natural = m + math.log(total)
                lse[t, h] = natural / math.log(2) if lse_base == "2" else natural
    return out, lse


def run_ref(batch, **kw):
    return mla_reference(
        batch.q_nope,
        batch.q_pe,
        batch.ckv,
        batch.kpe,
        *batch.plan_args(),
        ckv_scale=batch.ckv_scale,
        kpe_scale=batch.kpe_scale,
        ckv_scale_arr=batch.ckv_scale_arr,
        **kw,
    )


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale_mode", ["tensor", "token_group"])
def test_reference_matches_loops(page_size, causal, scale_mode):
    g = torch.Generator().manual_seed(1)
    batch = make_batch(
        [5, 0, 9], 2, qo_lens=[2, 1, 3], page_size=page_size, scale_mode=scale_mode, generator=g
    )
    if causal:  # kv_len 0 with queries is the empty-request case, not a causal one
        batch.kv_len[1] = 0
    out, lse = run_ref(batch, sm_scale=0.07, causal=causal)
    want_out, want_lse = loop_attention(batch, sm_scale=0.07, causal=causal)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-10, atol=1e-12)


def test_causal_mask_is_bottom_right_aligned():
    g = torch.Generator().manual_seed(2)
    batch = make_batch([6], 1, qo_lens=3, generator=g)
    out, _ = run_ref(batch, sm_scale=0.1, causal=True)
    # The last query sees every key, so it equals the non-causal result for that token;
    # the first sees keys 0..3 only.
    full, _ = run_ref(batch, sm_scale=0.1, causal=False)
    torch.testing.assert_close(out[2], full[2])
    assert not torch.allclose(out[0], full[0])
    trimmed = make_batch([6], 1, generator=g)
    trimmed.q_nope, trimmed.q_pe = batch.q_nope[:1], batch.q_pe[:1]
    trimmed.ckv, trimmed.kpe, trimmed.kv_indices = batch.ckv, batch.kpe, batch.kv_indices
    trimmed.kv_len = torch.tensor([4], dtype=torch.int32)
    first, _ = run_ref(trimmed, sm_scale=0.1, causal=False)
    torch.testing.assert_close(out[0], first[0])


def test_lse_bases_and_float32():
    g = torch.Generator().manual_seed(3)
    batch = make_batch([7, 3], 4, generator=g)
    _, lse2 = run_ref(batch, sm_scale=0.1)
    _, lse_e = run_ref(batch, sm_scale=0.1, lse_base="e")
    torch.testing.assert_close(lse2 * math.log(2), lse_e)
    out32, lse32 = run_ref(batch, sm_scale=0.1, dtype=torch.float32)
    out64, _ = run_ref(batch, sm_scale=0.1)
    assert out32.dtype == lse32.dtype == torch.float32
    torch.testing.assert_close(out32.double(), out64, rtol=1e-5, atol=1e-6)


def test_empty_request_gives_zeros_and_minus_inf():
    g = torch.Generator().manual_seed(4)
    batch = make_batch([0, 4, 0], 3, generator=g)
    out, lse = run_ref(batch, sm_scale=0.1)
    assert torch.all(out[[0, 2]] == 0)
    assert torch.all(lse[[0, 2]] == -math.inf)
    assert torch.isfinite(out[1]).all() and torch.isfinite(lse[1]).all()


def test_unused_nan_slots_never_reach_the_output():
    g = torch.Generator().manual_seed(5)
    batch = make_batch([3, 5], 2, page_size=4, generator=g)  # partly filled pages hold NaN
    assert torch.isnan(batch.ckv.float()).any()
    out, lse = run_ref(batch, sm_scale=0.1)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


def test_causal_query_longer_than_kv_is_rejected():
    batch = make_batch([2], 1, qo_lens=3)
    with pytest.raises(ValueError, match="qo_len <= kv_len"):
        run_ref(batch, sm_scale=0.1, causal=True)


def test_dequantize_groups():
    x = torch.arange(256, dtype=torch.float32).view(1, 256).to(torch.bfloat16)
    s = torch.tensor([[2.0, 3.0]])
    d = dequantize(x, scale_arr=s)
    assert d[0, 0] == 0 and d[0, 127] == 254 and d[0, 128] == 384
