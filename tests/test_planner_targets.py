"""Per-target launch planning: the H200-measured table where it applies, shared-memory-fitting
tiles elsewhere, AMD wavefronts; and mapping torch devices to targets."""

from __future__ import annotations

import pytest
import torch

from fp8mla.ops import targets as targets_mod
from fp8mla.ops.planner import (
    MEASURED_TABLE,
    TRITON_TABLE,
    WGMMA_TILE,
    KernelConfig,
    choose_config,
    config_table,
    make_launch_plan,
    selectable_configs,
)
from fp8mla.ops.targets import KB, TARGETS, cuda_target, current_target, hip_target

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
KV_DTYPES = [E4M3, E5M2, torch.bfloat16, torch.float16]
ROWS = [1, 16, 17, 32, 33, 64, 128, 16 * 128, 4096 * 128]


@pytest.mark.parametrize(
    "target", [None, TARGETS["sm90"], TARGETS["sm100"]], ids=["none", "sm90", "sm100"]
)
def test_h200_table_unchanged(target):
    assert choose_config(16, E4M3, False, target) == KernelConfig(16, 64, 8, 1, occupancy=2)
    assert choose_config(32, E5M2, False, target) == KernelConfig(16, 64, 8, 1, occupancy=2)
    assert choose_config(32, torch.bfloat16, False, target) == KernelConfig(
        16, 64, 4, 2, occupancy=2
    )
    # FP8, many rows: the wgmma kernel on SM90; on SM100 value-split tiles (64 rows: two
    # programs per SM; more: 128-row tiles)
    for dtype in (E4M3, E5M2):
        if target is not TARGETS["sm100"]:
            for rows in (33, 64, 128, 4096 * 128):
                assert choose_config(rows, dtype, False, target) == WGMMA_TILE
            continue
        assert choose_config(64, dtype, False, target) == KernelConfig(
            64, 32, 4, 3, value_split=True, occupancy=2
        )
        assert choose_config(128, dtype, False, target) == KernelConfig(
            128,
            64,
            8,
            1,
            value_split=True,
            q_fp16_copy=True,  # 2 stages need 251 KB there
        )
    for dtype in (torch.bfloat16, torch.float16):  # 16-bit KV: one stage above 64 rows
        assert choose_config(64, dtype, False, target) == KernelConfig(64, 64, 8, 1)
        assert choose_config(128, dtype, False, target) == KernelConfig(
            128, 64, 8, 1, value_split=True, q_fp16_copy=True
        )
    assert (config_table(target) is MEASURED_TABLE) == (target is not TARGETS["sm100"])


def plan_kw(**kw):
    base = dict(
        batch=1, num_heads=128, max_qo_len=4096, max_kv_len=36864, sms=132,
        max_splits_by_workspace=64, interpreted=False, kv_dtype=E4M3, target=TARGETS["sm90"],
    )  # fmt: skip
    return {**base, **kw}


def test_wgmma_tile_gives_way_without_a_rope_part():
    assert make_launch_plan(**plan_kw()).config == WGMMA_TILE
    plan = make_launch_plan(**plan_kw(head_dim_kpe=0))
    assert plan.config == TRITON_TABLE.wide_fp8 and plan.m_tiles == 4096 * 128 // 128
    assert make_launch_plan(**plan_kw(max_qo_len=1, num_heads=64, head_dim_kpe=0)).config == (
        TRITON_TABLE.many_fp8
    )


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(interpreted=True), "SM90 GPU for the wgmma kernel, got the interpreter"),
        (dict(target=TARGETS["sm100"]), "SM90 GPU for the wgmma kernel, got cuda 100"),
        (dict(target=TARGETS["sm86"]), "SM90 GPU for the wgmma kernel, got cuda 86"),
        (dict(kv_dtype=torch.bfloat16), "FP8 KV with head_dim_kpe 64 for the wgmma kernel"),
        (dict(head_dim_kpe=0), "FP8 KV with head_dim_kpe 64 for the wgmma kernel"),
    ],
)
def test_wgmma_tile_asked_for_where_it_cannot_run(kw, match):
    with pytest.raises(ValueError, match=match):
        make_launch_plan(**plan_kw(config=WGMMA_TILE, **kw))


@pytest.mark.parametrize(
    "cfg",
    [
        dict(block_m=128, block_n=64, num_warps=8, num_stages=1, wgmma=True),
        dict(block_m=64, block_n=64, num_warps=4, num_stages=1, wgmma=True),
        dict(block_m=64, block_n=64, num_warps=8, num_stages=1, wgmma=True, value_split=True),
    ],
)
def test_wgmma_config_is_checked(cfg):
    with pytest.raises(ValueError, match="wgmma"):
        KernelConfig(**cfg)


def test_default_arguments_keep_the_measured_plan():
    kw = dict(
        batch=4,
        num_heads=128,
        max_qo_len=1,
        max_kv_len=4096,
        sms=132,
        max_splits_by_workspace=64,
        interpreted=False,
    )
    assert make_launch_plan(**kw) == make_launch_plan(**kw, target=TARGETS["sm90"])
    plan = make_launch_plan(**kw)
    assert plan.config == WGMMA_TILE
    # 4 requests × 2 row tiles: 16 splits fill the 132 SMs
    assert plan.num_splits == 132 // 8


@pytest.mark.parametrize("name", ["sm86", "sm89", "sm120"])
def test_99kb_targets_take_tiles_that_fit(name):
    """An FP8 tile stages ``(BLOCK_M + BLOCK_N) × 576`` fp16 values in shared memory
    (docs/compile_matrix.md): 64-row tiles (144 KB) do not fit 99 KB."""
    t = TARGETS[name]
    assert t.smem_per_block == 99 * KB
    for dtype in KV_DTYPES:
        for rows in ROWS:
            cfg = choose_config(rows, dtype, False, t)
            assert (cfg.block_m + cfg.block_n) * 576 * 2 <= t.smem_per_block, (rows, cfg)
            assert cfg.occupancy == 1
    assert choose_config(128, E4M3, False, t) == KernelConfig(32, 32, 8, 1)


def test_sm80_keeps_the_h200_tiles_that_fit_163kb():
    t = TARGETS["sm80"]
    assert choose_config(16, E4M3, False, t) == KernelConfig(16, 64, 8, 1)
    assert choose_config(128, E4M3, False, t) == KernelConfig(64, 64, 8, 1)
    assert choose_config(128, torch.bfloat16, False, t) == KernelConfig(32, 32, 8, 2)


@pytest.mark.parametrize("name", ["gfx90a", "gfx942", "gfx950"])
def test_cdna_wave64_tiles(name):
    """num_warps counts 64-wide wavefronts on CDNA: 4 of them (256 threads) keep one wave per
    SIMD with 512 VGPRs; MFMA needs M, N, K ≥ 16."""
    t = TARGETS[name]
    assert t.warp_size == 64 and t.is_hip
    for dtype in KV_DTYPES:
        for cfg in selectable_configs(t, dtype):
            assert cfg.num_warps * t.warp_size == 256
            assert cfg.block_m >= 16 and cfg.block_n >= 16
            assert cfg.block_m * 512 * 2 <= t.smem_per_block  # the query tile in LDS
    assert choose_config(128, E4M3, False, t) == KernelConfig(64, 16, 4, 1)
    assert choose_config(16, E4M3, False, t) == KernelConfig(16, 32, 4, 2)


def test_rdna3_wave32_tiles():
    t = TARGETS["gfx1100"]
    assert t.warp_size == 32
    for dtype in KV_DTYPES:
        for rows in ROWS:
            assert choose_config(rows, dtype, False, t) == KernelConfig(16, 16, 8, 1)


@pytest.mark.parametrize("name", list(TARGETS))
def test_selectable_configs_cover_every_choice(name):
    t = TARGETS[name]
    for dtype in KV_DTYPES:
        picked = {choose_config(rows, dtype, False, t) for rows in ROWS}
        assert picked == set(selectable_configs(t, dtype))


def test_interpreter_ignores_the_target():
    for name in ("sm86", "gfx942"):
        assert choose_config(128, E4M3, True, TARGETS[name]) == choose_config(128, E4M3, True)


def test_launch_plan_uses_the_target():
    kw = dict(
        batch=2,
        num_heads=128,
        max_qo_len=1,
        max_kv_len=8192,
        sms=84,
        max_splits_by_workspace=64,
        interpreted=False,
    )
    plan = make_launch_plan(**kw, target=TARGETS["sm86"])
    assert plan.config == KernelConfig(32, 32, 8, 1) and plan.m_tiles == 4
    plan = make_launch_plan(**kw, target=TARGETS["gfx942"])
    assert plan.config.block_m == 64 and plan.m_tiles == 2


def test_target_presets():
    assert [t.name for t in TARGETS.values()] == [
        "sm80",
        "sm86",
        "sm89",
        "sm90",
        "sm100",
        "sm120",
        "gfx90a",
        "gfx942",
        "gfx950",
        "gfx1100",
    ]
    assert not TARGETS["sm80"].native_fp8 and not TARGETS["sm86"].native_fp8
    assert TARGETS["sm89"].native_fp8 and TARGETS["sm120"].native_fp8
    assert not TARGETS["gfx942"].native_fp8  # FNUZ FP8 only, not torch's OCP formats
    assert TARGETS["gfx950"].native_fp8
    assert TARGETS["sm90"].smem_per_block == 227 * KB
    assert all(TARGETS[n].smem_per_block == 64 * KB for n in ("gfx90a", "gfx942", "gfx1100"))


def test_unlisted_architectures():
    assert cuda_target(103).smem_per_block == TARGETS["sm100"].smem_per_block
    assert cuda_target(121).smem_per_block == 99 * KB and cuda_target(121).native_fp8
    assert cuda_target(87).smem_per_block == 99 * KB  # conservative: the SM86 preset
    assert hip_target("gfx942:sramecc+:xnack-") is TARGETS["gfx942"]
    assert hip_target("gfx1201").warp_size == 32
    assert hip_target("gfx908").warp_size == 64


def test_current_target_asks_torch(monkeypatch, request):
    request.addfinalizer(targets_mod._device_target.cache_clear)  # no fake targets survive
    targets_mod._device_target.cache_clear()
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (8, 9))
    assert current_target("cuda:0") is TARGETS["sm89"]
    targets_mod._device_target.cache_clear()

    class Props:
        gcnArchName = "gfx90a:sramecc+:xnack-"

    monkeypatch.setattr(torch.version, "hip", "6.4")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())
    assert current_target("cuda:1") is TARGETS["gfx90a"]
    targets_mod._device_target.cache_clear()
    with pytest.raises(ValueError, match="expected a CUDA/ROCm device"):
        current_target("cpu")
