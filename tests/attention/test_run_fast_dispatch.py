"""run()'s dispatch to its C path (``attention/native.py``), on the CPU with a stand-in for
the C call: which calls are offered to it, what it is handed, and that a call it declines
(or one it is never offered) gets the Python path's answer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fp8mla import BatchMLAPagedAttentionWrapper
from fp8mla.attention import kernel_launcher
from fp8mla.attention import wrapper as wrapper_module
from fp8mla.attention.reference import run_reference
from fp8mla.testing import make_batch

from attention_utils import SM_SCALE, assert_matches_reference, workspace


class _ReferenceLaunch:
    """Stands in for the plan's launch: its Python path computes the reference."""

    def __init__(self, state):
        self.state = state
        self.native_launches = 0

    def __call__(self, q_nope, q_pe, ckv, kpe, out, lse, scales, q_scale=None):
        run_reference(self.state, q_nope, q_pe, ckv, kpe, out, lse, scales)


@pytest.fixture
def wrapper(monkeypatch):
    """A planned CPU wrapper (its Python path: the reference) whose C path is a recorder
    that takes the calls ``take`` allows."""
    monkeypatch.setattr(wrapper_module, "current_stream", lambda device: 5)
    monkeypatch.setattr(kernel_launcher.KernelLauncher, "_direct_ok", staticmethod(lambda: True))
    b = make_batch([17, 40], 16, page_size=16, generator=torch.Generator().manual_seed(3))
    w = BatchMLAPagedAttentionWrapper(workspace("cpu"), backend="torch")
    w.plan(*b.plan_args(), 16, 512, 64, 16, False, SM_SCALE, torch.bfloat16, b.ckv.dtype)
    calls = []
    state = SimpleNamespace(take=True, calls=calls)

    def fast_run(spec, stream, *args):
        calls.append((spec, stream, args))
        return state.take

    w._fast_run = fast_run
    w._fast = ["plain", "lse", "tensor scales", "tensor scales, lse"]
    w._launch = _ReferenceLaunch(w._plan)
    return w, b, state


def test_taken_calls(wrapper):
    w, b, state = wrapper
    s = b.scale_kwargs()
    out = torch.empty(2, 16, 512, dtype=torch.bfloat16)
    assert w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, out, **s) is out
    spec, stream, args = state.calls[-1]
    assert spec == "plain" and stream == 5 and args[4] is out and args[5] is None
    # no output: run() allocates the planned one and hands it over
    got = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, **s)
    assert got.shape == (2, 16, 512) and got.dtype == torch.bfloat16
    assert state.calls[-1][2][4] is got
    # an LSE passed in, returned when asked
    lse = torch.empty(2, 16)
    o, l_ = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, out, lse, return_lse=True, **s)
    assert o is out and l_ is lse and state.calls[-1][0] == "lse"
    # a scale as a device (here CPU) tensor: the tensor-scale spec
    t = torch.full((1,), 0.5)
    w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, out, ckv_scale=t, kpe_scale=t)
    assert state.calls[-1][0] == "tensor scales" and state.calls[-1][2][6] is t
    assert w._launch.native_launches == 4


def test_calls_never_offered(wrapper):
    """An LSE run() would allocate, per-token scales, or a profiler's launch hooks: the
    Python path, whose answer is the reference."""
    w, b, state = wrapper
    out, lse = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, return_lse=True, **b.scale_kwargs())
    assert not state.calls
    assert_matches_reference(b, out, lse)
    arr = torch.full((b.ckv.shape[0], b.ckv.shape[1], 4), 0.5)
    w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, ckv_scale_arr=arr, kpe_scale=0.5)
    assert not state.calls
    with pytest.MonkeyPatch.context() as mp:  # a profiler hooks Triton's launches
        mp.setattr(kernel_launcher.KernelLauncher, "_direct_ok", staticmethod(lambda: False))
        out = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, **b.scale_kwargs())
    assert not state.calls
    assert_matches_reference(b, out, None)


def test_declined_call_gets_the_python_path(wrapper):
    w, b, state = wrapper
    state.take = False
    out = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, **b.scale_kwargs())
    assert len(state.calls) == 1 and w._launch.native_launches == 0
    lse = torch.empty(2, 16)
    out, lse = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, out, lse, return_lse=True,
                     **b.scale_kwargs())  # fmt: skip
    assert_matches_reference(b, out, lse)
    # and its errors: a bad query shape still raises once the C path declines it
    with pytest.raises(ValueError, match="q_nope"):
        w.run(b.q_nope[:, :8], b.q_pe, b.ckv, b.kpe, out, **b.scale_kwargs())


def test_a_new_plan_drops_the_c_path(wrapper):
    w, b, state = wrapper
    w.plan(*b.plan_args(), 16, 512, 64, 16, False, SM_SCALE, torch.bfloat16, b.ckv.dtype)
    assert w._fast == [None] * 4
    w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, **b.scale_kwargs())
    assert not state.calls
