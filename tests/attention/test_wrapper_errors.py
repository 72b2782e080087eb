"""Bad input to plan()/run() gets a ValueError naming what was expected and what came."""

from __future__ import annotations

import pytest
import torch

from fp8mla import BatchMLAPagedAttentionWrapper
from fp8mla.testing import make_batch

from attention_utils import SM_SCALE, workspace


@pytest.fixture
def batch(device):
    return make_batch(
        [17, 40], 16, page_size=16, device=device, generator=torch.Generator().manual_seed(0)
    )


def planned(batch, **overrides):
    w = BatchMLAPagedAttentionWrapper(workspace(batch.q_nope.device), backend="triton")
    args = dict(
        qo_indptr=batch.qo_indptr,
        kv_indptr=batch.kv_indptr,
        kv_indices=batch.kv_indices,
        kv_len_arr=batch.kv_len,
        num_heads=16,
        head_dim_ckv=512,
        head_dim_kpe=64,
        page_size=16,
        causal=False,
        sm_scale=SM_SCALE,
        q_data_type=torch.bfloat16,
        kv_data_type=torch.float8_e4m3fn,
    )
    args.update(overrides)
    w.plan(**args)
    return w


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"num_heads": 129}, "num_heads"),
        ({"head_dim_ckv": 256}, "head_dim_ckv 512"),
        ({"head_dim_kpe": 32}, "head_dim_kpe"),
        ({"page_size": 256}, "page_size"),
        ({"q_data_type": torch.float32}, "q_data_type"),
        ({"kv_data_type": torch.int8}, "kv_data_type"),
        ({"kv_len_arr": [17, 40]}, "kv_len_arr of dtype int32"),
        ({"kv_indptr": [0, 2]}, "kv_indptr of length 3"),
        ({"kv_len_arr": [17, 60]}, "at least 4 pages for request 1"),
        ({"kv_indices": [0, -1, 2, 3, 4]}, "page ids >= 0"),
        ({"kv_indices": [0, 1]}, "kv_indices of length"),
        ({"sm_scale": 0.0}, "sm_scale"),
    ],
)
def test_plan_rejects(batch, overrides, match):
    # kv_indices and kv_len_arr are read by plan() only when they are host (CPU) tensors: on
    # the device they stay unread (no sync) and the kernels bound each request by its pages
    dev = "cpu" if "page ids" in match or "pages for request" in match else batch.q_nope.device
    as_tensor = lambda v: torch.tensor(
        v, device=dev, dtype=torch.int64 if "dtype" in match else torch.int32
    )
    overrides = {k: as_tensor(v) if isinstance(v, list) else v for k, v in overrides.items()}
    with pytest.raises(ValueError, match=match):
        planned(batch, **overrides)


def test_causal_query_longer_than_kv_rejected(device):
    b = make_batch([3], 4, qo_lens=5, device=device)
    with pytest.raises(ValueError, match="qo_len 5 > kv_len 3"):  # host lengths are checked
        planned(b, num_heads=4, page_size=1, causal=True, kv_len_arr=b.kv_len.cpu())


def test_run_before_plan(device):
    w = BatchMLAPagedAttentionWrapper(workspace(device), backend="triton")
    with pytest.raises(ValueError, match="plan"):
        w.run(*[torch.empty(0)] * 4)


@pytest.mark.parametrize(
    "field, bad, match",
    [
        ("q_nope", lambda b: b.q_nope.half(), "q_nope of dtype bfloat16"),
        ("q_nope", lambda b: b.q_nope[:, :8], "q_nope of shape"),
        ("q_pe", lambda b: b.q_pe[..., :32], "q_pe of shape"),
        ("ckv", lambda b: b.ckv.to(torch.bfloat16), "ckv_cache of dtype float8_e4m3fn"),
        ("ckv", lambda b: b.ckv[:, :8], "ckv_cache of shape"),
        ("kpe", lambda b: b.kpe[:1], "kpe_cache of shape"),
        ("ckv", lambda b: b.ckv.transpose(1, 2).contiguous().transpose(1, 2), "unit stride"),
    ],
)
def test_run_rejects(batch, field, bad, match):
    w = planned(batch)
    args = {"q_nope": batch.q_nope, "q_pe": batch.q_pe, "ckv": batch.ckv, "kpe": batch.kpe}
    args[field] = bad(batch)
    with pytest.raises(ValueError, match=match):
        w.run(args["q_nope"], args["q_pe"], args["ckv"], args["kpe"])


def test_page_id_beyond_the_cache(batch):
    """Page ids read at plan() (host indices) are checked against the cache at run(); device
    indices are bounded by the kernels: the requests that read past the cache get NaN."""
    w = planned(batch, kv_indices=batch.kv_indices.cpu())
    with pytest.raises(ValueError, match="page ids in"):
        w.run(batch.q_nope, batch.q_pe, batch.ckv[:2], batch.kpe[:2])
    if batch.kv_indices.device.type == "cpu":
        return
    w = planned(batch)
    out = w.run(batch.q_nope, batch.q_pe, batch.ckv[:2], batch.kpe[:2], **batch.scale_kwargs())
    pages = batch.kv_indices.cpu().tolist()
    for r in range(2):
        mine = pages[int(batch.kv_indptr[r]) : int(batch.kv_indptr[r + 1])]
        assert out[r].isnan().all() == any(p >= 2 for p in mine)


def test_bad_out_and_scales(batch):
    w = planned(batch)
    args = (batch.q_nope, batch.q_pe, batch.ckv, batch.kpe)
    dev = batch.q_nope.device
    with pytest.raises(ValueError, match="out of dtype bfloat16"):
        w.run(*args, out=torch.empty(batch.q_nope.shape, device=dev))
    with pytest.raises(ValueError, match="lse of shape"):
        w.run(*args, lse=torch.empty(3, device=dev))
    with pytest.raises(ValueError, match="finite and > 0"):
        w.run(*args, ckv_scale=-1.0)
    with pytest.raises(ValueError, match="one element"):
        w.run(*args, ckv_scale=torch.ones(2, device=dev))
    with pytest.raises(ValueError, match="ckv_scale_arr of shape"):
        w.run(*args, ckv_scale_arr=torch.ones(3, 16, 4, device=dev))
    with pytest.raises(ValueError, match="either ckv_scale or ckv_scale_arr"):
        w.run(*args, ckv_scale=1.0, ckv_scale_arr=torch.ones(batch.ckv.shape[0], 16, 4, device=dev))


def test_bad_backend_and_graph_buffers(device):
    with pytest.raises(ValueError, match="backend"):
        BatchMLAPagedAttentionWrapper(workspace(device), backend="cuda")
    with pytest.raises(ValueError, match="qo_indptr buffer"):
        BatchMLAPagedAttentionWrapper(workspace(device), True, backend="triton")


def test_triton_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        BatchMLAPagedAttentionWrapper(workspace("cpu"), backend="triton")
