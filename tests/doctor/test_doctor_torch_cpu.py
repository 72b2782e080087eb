"""A real torch.profiler trace recorded on the CPU: the cast appears as aten::to/_to_copy/copy_
ops with shapes, once per layer per step, and no GPU kernels exist."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fp8mla.doctor import diagnose  # noqa: E402

LAYERS = 4
POOL_ROWS = 20_000
ACTIVE = 300


class _Backend:
    """An attention backend reading an FP8 pool, casting all of it or only the active rows."""

    def __init__(self, pool: torch.Tensor, gather_first: bool) -> None:
        self.pool = pool
        self.gather_first = gather_first

    def forward_decode(self, q: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        if self.gather_first:
            kv = self.pool[idx].to(torch.bfloat16)
        else:
            kv = self.pool.to(torch.bfloat16)[idx]
        return q @ kv.view(-1, 576).T


def _record(path: str, gather_first: bool) -> str:
    from torch.profiler import ProfilerActivity, profile, schedule

    pool = torch.randn(POOL_ROWS, 1, 576).to(torch.float8_e4m3fn)
    backend = _Backend(pool, gather_first)
    w = torch.randn(576, 576, dtype=torch.bfloat16)
    q = torch.randn(1, 576, dtype=torch.bfloat16)
    idx = torch.arange(ACTIVE)
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        with_stack=True,
        schedule=schedule(wait=1, warmup=1, active=3),
    ) as prof:
        for _ in range(5):
            for _ in range(LAYERS):
                h = q @ w
                backend.forward_decode(h, idx)
            prof.step()
    prof.export_chrome_trace(path)
    return path


@pytest.fixture(scope="module")
def full_cast(tmp_path_factory) -> dict:
    return diagnose(_record(str(tmp_path_factory.mktemp("cpu") / "full.json"), False))


def test_cpu_trace_finds_the_pool_cast(full_cast):
    assert full_cast["trace"]["mode"] == "cpu"
    assert full_cast["steps"]["method"] == "markers"
    assert full_cast["steps"]["count"] == 3
    assert full_cast["layers"] == LAYERS
    finding = full_cast["findings"][0]
    assert finding["kind"] == "pool_proportional_cast"
    assert finding["calls_per_step"] == LAYERS
    assert finding["elements_per_call"] == POOL_ROWS * 576
    assert finding["shape"] == [POOL_ROWS, 1, 576]
    assert finding["src_dtype"] == "float8_e4m3fn" and finding["dst_dtype"] == "bfloat16"
    assert finding["source"].endswith("forward_decode")
    assert finding["active_tokens"] == ACTIVE
    assert finding["active_tokens_source"] == "recorded shapes"


def test_cpu_trace_gather_then_cast_is_fine(tmp_path):
    report = diagnose(_record(str(tmp_path / "gathered.json"), True))
    assert not [f for f in report["findings"] if f["kind"] == "pool_proportional_cast"]
