"""Random batches through both backends against the float64 reference, in plain and CUDA-graph
mode, with re-plans on the same wrapper: every step either matches the reference or raises
``ValueError`` naming the limit the first plan fixed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fp8mla import BatchMLAPagedAttentionWrapper
from fp8mla.testing import make_batch

from attention_utils import SM_SCALE, assert_matches_reference, workspace

CAP, PAGES = 6, 1024

batches = st.fixed_dictionaries(
    {
        "lens": st.lists(st.integers(0, 70), min_size=1, max_size=CAP),
        "qo_len": st.sampled_from([1, 1, 2, 3]),
        "heads": st.sampled_from([1, 4, 16]),
        "seed": st.integers(0, 2**16),
    }
)


def _batch(spec, device, page_size, kv_dtype):
    qo = spec["qo_len"]
    lens = [max(n, qo) for n in spec["lens"]]  # causal rows need their own KV
    return make_batch(
        lens, spec["heads"], qo_lens=qo, page_size=page_size, kv_dtype=kv_dtype,
        pool_pages=PAGES, device=device, generator=torch.Generator().manual_seed(spec["seed"]),
    )  # fmt: skip


@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(batches, min_size=2, max_size=3),
    backend=st.sampled_from(["triton", "torch"]),
    graph=st.booleans(),
    page_size=st.sampled_from([1, 16]),
    kv_dtype=st.sampled_from([torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16]),
)
def test_random_replans_match_the_reference(device, steps, backend, graph, page_size, kv_dtype):
    i32 = dict(dtype=torch.int32, device=device)
    bufs = ()
    if graph:
        bufs = (torch.empty(CAP + 1, **i32), torch.empty(CAP + 1, **i32),
                torch.empty(PAGES, **i32), torch.empty(CAP, **i32))  # fmt: skip
    w = BatchMLAPagedAttentionWrapper(workspace(device), graph, *bufs, backend=backend)
    first = None
    for spec in steps:
        b = _batch(spec, device, page_size, kv_dtype)
        causal = spec["qo_len"] > 1
        try:
            w.plan(*b.plan_args(), spec["heads"], 512, 64, page_size, causal, SM_SCALE,
                   torch.bfloat16, kv_dtype)  # fmt: skip
        except ValueError as exc:
            # only a CUDA-graph wrapper refuses a later plan, and only past the first one's launch
            assert graph and first is not None, exc
            assert "under CUDA graphs" in str(exc), exc
            continue
        first = first or spec
        out, lse = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, return_lse=True, **b.scale_kwargs())
        assert_matches_reference(b, out, lse, causal=causal)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_first_graph_plan_sets_the_capacity(device, backend):
    """The deterministic core of the property: a larger first plan serves smaller later ones."""
    i32 = dict(dtype=torch.int32, device=device)
    bufs = (torch.empty(CAP + 1, **i32), torch.empty(CAP + 1, **i32),
            torch.empty(PAGES, **i32), torch.empty(CAP, **i32))  # fmt: skip
    w = BatchMLAPagedAttentionWrapper(workspace(device), True, *bufs, backend=backend)
    for spec in ({"lens": [40] * 4, "qo_len": 2, "heads": 16, "seed": 1},
                 {"lens": [7, 90], "qo_len": 1, "heads": 16, "seed": 2}):  # fmt: skip
        b = _batch(spec, device, 16, torch.float8_e4m3fn)
        w.plan(*b.plan_args(), 16, 512, 64, 16, True, SM_SCALE, torch.bfloat16, b.ckv.dtype)
        out, lse = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, return_lse=True, **b.scale_kwargs())
        assert_matches_reference(b, out, lse, causal=True)
