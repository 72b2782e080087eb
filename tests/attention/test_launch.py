"""The launcher's direct path: a kernel compiled by Triton's first launch is called again only
with arguments of the same specialization (16-byte aligned pointers, strides divisible by 16),
in parameter order, constexpr defaults included; anything else takes Triton's own path."""

from __future__ import annotations

import torch

from fp8mla.attention import launch as L


class _Param:
    def __init__(self, name, default=None):
        self.name = name
        self.default = default
        self.has_default = default is not None


class _Compiled:
    packed_metadata = "meta"
    function = "fn"

    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args)


class _Kernel:
    """Stands in for a JITFunction: records Triton-path launches, returns a compiled kernel."""

    arg_names = ["a_ptr", "n", "BLOCK"]
    params = [_Param("a_ptr"), _Param("n"), _Param("BLOCK", 64)]

    def __init__(self):
        self.compiled = _Compiled()
        self.triton_launches = []

    def __getitem__(self, grid):
        def launch(**kw):
            self.triton_launches.append((grid, kw))
            return self.compiled

        return launch


def test_first_launch_compiles_then_direct_calls(monkeypatch):
    monkeypatch.setattr(L, "_current_stream", lambda device: 7)
    monkeypatch.setattr(L.KernelLauncher, "_direct_ok", staticmethod(lambda: True))
    k = _Kernel()
    launcher = L.KernelLauncher(k, (2, 3, 4), {"num_warps": 4})
    launcher.launch({"a_ptr": "A", "n": 5}, key=("aligned",))
    assert len(k.triton_launches) == 1 and k.triton_launches[0][1]["num_warps"] == 4
    launcher.launch({"a_ptr": "B", "n": 6}, key=("aligned",))
    assert len(k.triton_launches) == 1
    (call,) = k.compiled.calls
    assert call == (2, 3, 4, 7, "fn", "meta", None, None, None, "B", 6, 64)
    # another specialization, or none: Triton's path
    launcher.launch({"a_ptr": "C", "n": 7}, key=("other",))
    launcher.launch({"a_ptr": "D", "n": 8}, key=None)
    assert len(k.triton_launches) == 3 and len(k.compiled.calls) == 1


def test_profiler_hooks_take_tritons_path(monkeypatch):
    monkeypatch.setattr(L.KernelLauncher, "_direct_ok", staticmethod(lambda: False))
    k = _Kernel()
    launcher = L.KernelLauncher(k, (1, 1, 1), {})
    for _ in range(3):
        launcher.launch({"a_ptr": "A", "n": 1}, key=("aligned",))
    assert len(k.triton_launches) == 3 and not k.compiled.calls


def test_specialization_checks():
    base = torch.empty(64, dtype=torch.uint8)
    assert L._aligned(base[0:16], base[32:48]) == (base.data_ptr() % 16 == 0)
    assert not L._aligned(base[0:16], base[1:17]) or base.data_ptr() % 16 != 0
    assert L._strides16(16, 576, 512 * 16)
    assert not L._strides16(16, 8)
    assert not L._strides16(0, 16)  # 0 is not divisible in Triton's sense
    assert not L._strides16(1)
