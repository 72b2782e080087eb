"""Per-target launch planning: the H200-measured table where it applies, shared-memory-fitting
tiles elsewhere, AMD wavefronts, the interpreter's own table; the variant registry's rules; and
mapping torch devices to targets."""

from __future__ import annotations

import pytest
import torch

from fp8mla.attention import targets as targets_mod
from fp8mla.attention.config import KernelConfig
from fp8mla.attention.planner import (
    FEWROWS_TILE_16,
    FEWROWS_TILE_32,
    FP8QK_TILE_16,
    FP8QK_TILE_32,
    PINGPONG8_TILE,
    PINGPONG64_TILE,
    PINGPONG_TILE,
    SM90_TABLE,
    TABLES,
    TRITON_TABLE,
    WGMMA_TILE,
    choose_config,
    config_table,
    make_launch_plan,
    selectable_configs,
    tile_for_variant,
)
from fp8mla.attention.targets import (
    INTERPRETER,
    KB,
    TARGETS,
    cuda_target,
    current_target,
    hip_target,
)
from fp8mla.attention.variants import REGISTRY, get_variant, tile_name

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
KV_DTYPES = [E4M3, E5M2, torch.bfloat16, torch.float16]
ROWS = [1, 16, 17, 32, 33, 64, 128, 16 * 128, 4096 * 128]


def test_sm90_table():
    t = TARGETS["sm90"]
    assert config_table(t) is SM90_TABLE and config_table(None) is SM90_TABLE
    # FP8 up to 32 rows: the FP8 × FP8 Gluon kernel, 16 or 32 rows
    for dtype in (E4M3, E5M2):
        assert choose_config(1, dtype, t) == FP8QK_TILE_16
        assert choose_config(16, dtype, t) == FP8QK_TILE_16
        assert choose_config(17, dtype, t) == FP8QK_TILE_32
        assert choose_config(32, dtype, t) == FP8QK_TILE_32
        for rows in (33, 64, 128):  # up to 128 rows: its 32-row tiles
            assert choose_config(rows, dtype, t) == FP8QK_TILE_32
            # queries that are not bf16 (the hi/lo split holds 8 bits): the wgmma kernel
            assert choose_config(rows, dtype, t, q_dtype=torch.float16) == WGMMA_TILE
        # more than 64 rows where 64-row programs fill the SMs without KV splits: the
        # ping-pong kernel on FP8 tiles
        kw = dict(num_heads=128, max_qo_len=1, max_kv_len=4096, sms=132,
                  max_splits_by_workspace=64, target=t, kv_dtype=dtype)  # fmt: skip
        plan = make_launch_plan(batch=64, **kw)
        assert (plan.config, plan.m_tiles, plan.num_splits) == (PINGPONG8_TILE, 2, 1)
        for batch in (8, 32):  # fewer programs: the 32-row tiles with KV splits
            assert make_launch_plan(batch=batch, **kw).config == FP8QK_TILE_32
        assert make_launch_plan(batch=64, num_splits=2, **kw).config == FP8QK_TILE_32
        assert make_launch_plan(batch=64, **dict(kw, num_heads=64)).config == FP8QK_TILE_32
        for rows in (129, 256):  # a few tokens at 128 heads: the ping-pong kernel, split
            assert choose_config(rows, dtype, t) == PINGPONG8_TILE
            assert choose_config(rows, dtype, t, q_dtype=torch.float16) == WGMMA_TILE
        plan = make_launch_plan(batch=64, **dict(kw, max_qo_len=2))
        assert plan.config == PINGPONG8_TILE and plan.m_tiles == 4
        for rows in (257, 4096 * 128):  # more: the wgmma kernel
            assert choose_config(rows, dtype, t) == WGMMA_TILE
    # 16-bit KV: Gluon kernels copying the tiles instead of converting them
    for dtype in (torch.bfloat16, torch.float16):
        assert choose_config(16, dtype, t) == FEWROWS_TILE_16
        assert choose_config(32, dtype, t) == FEWROWS_TILE_32
        for rows in (33, 64):  # one row tile: the ping-pong kernel
            assert choose_config(rows, dtype, t) == PINGPONG_TILE
        for rows in (65, 128, 1024, 4096 * 128):  # more: its 64-token tiles
            assert choose_config(rows, dtype, t) == PINGPONG64_TILE
    # named, in a tile of its own; refused for FP8 pools (its tiles are copied)
    assert tile_for_variant("pingpong64", 16, torch.bfloat16, t) == PINGPONG64_TILE
    with pytest.raises(ValueError, match="reads 16-bit pools only"):
        make_launch_plan(
            batch=1, num_heads=128, max_qo_len=16, max_kv_len=4096, sms=132,
            max_splits_by_workspace=8, target=t, kv_dtype=E4M3, config="pingpong64",
        )  # fmt: skip


def test_sm100_takes_the_triton_tiles():
    t = TARGETS["sm100"]
    assert choose_config(16, E4M3, t) == KernelConfig(16, 64, 8, 1, occupancy=2)
    assert choose_config(64, E4M3, t) == KernelConfig(64, 32, 4, 3, variant="vsplit", occupancy=2)
    # the 128-row value-split tile in one stage: two need 251 KB there
    assert choose_config(128, E5M2, t) == KernelConfig(
        128, 64, 8, 1, variant="vsplit", q_fp16_copy=True
    )


def plan_kw(**kw):
    base = dict(
        batch=1, num_heads=128, max_qo_len=4096, max_kv_len=36864, sms=132,
        max_splits_by_workspace=64, kv_dtype=E4M3, target=TARGETS["sm90"],
    )  # fmt: skip
    return {**base, **kw}


def test_gluon_tiles_give_way_without_a_rope_part():
    assert make_launch_plan(**plan_kw()).config == WGMMA_TILE
    plan = make_launch_plan(**plan_kw(head_dim_kpe=0))
    assert plan.config == TRITON_TABLE.wide_fp8 and plan.m_tiles == 4096 * 128 // 128
    assert make_launch_plan(**plan_kw(max_qo_len=1, num_heads=64, head_dim_kpe=0)).config == (
        TRITON_TABLE.many_fp8
    )
    assert make_launch_plan(**plan_kw(max_qo_len=1, num_heads=16, head_dim_kpe=0)).config == (
        TRITON_TABLE.few_fp8
    )


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(target=INTERPRETER), "needs an SM90 GPU \\(Gluon wgmma\\), got interpreter"),
        (dict(target=TARGETS["sm100"]), "needs an SM90 GPU \\(Gluon wgmma\\), got sm100"),
        (dict(target=TARGETS["sm86"]), "got sm86"),
        (dict(head_dim_kpe=0), "needs a 64-dim RoPE part, got head_dim_kpe 0"),
    ],
)
@pytest.mark.parametrize("config", [WGMMA_TILE, FEWROWS_TILE_32], ids=["wgmma", "fewrows"])
def test_gluon_tiles_asked_for_where_they_cannot_run(kw, match, config):
    small = dict(num_heads=16, max_qo_len=2) if config.variant == "fewrows" else {}
    with pytest.raises(ValueError, match=match):
        make_launch_plan(**plan_kw(config=config, **small, **kw))


def test_fewrows_refuses_more_than_32_rows():
    with pytest.raises(ValueError, match="at most 32 query rows per request, got 64"):
        make_launch_plan(**plan_kw(config=FEWROWS_TILE_32, num_heads=16, max_qo_len=4))
    with pytest.raises(ValueError, match="at most 32"):
        make_launch_plan(**plan_kw(config="fewrows", num_heads=16, max_qo_len=4))


@pytest.mark.parametrize(
    "cfg, match",
    [
        (KernelConfig(128, 64, 8, 1, variant="wgmma"), "64 × 64 tiles and 8 warps"),
        (KernelConfig(64, 64, 4, 1, variant="wgmma"), "64 × 64 tiles and 8 warps"),
        (KernelConfig(64, 64, 4, 1, variant="fewrows"), "16- or 32-row tiles"),
        (KernelConfig(32, 32, 4, 1, variant="fewrows"), "16- or 32-row tiles"),
    ],
)
def test_variant_tiles_are_checked(cfg, match):
    rows = 32 if cfg.variant == "fewrows" else 128
    with pytest.raises(ValueError, match=match):
        make_launch_plan(**plan_kw(config=cfg, num_heads=rows, max_qo_len=1))


def test_unknown_variant_name():
    with pytest.raises(ValueError, match="kernel variant in"):
        make_launch_plan(**plan_kw(config="swap"))
    with pytest.raises(ValueError, match="kernel variant in"):
        get_variant("nope")


def test_variant_names_run_in_their_table_tiles():
    assert tile_for_variant("fewrows", 16, E4M3, TARGETS["sm90"]) == FEWROWS_TILE_16
    assert tile_for_variant("fewrows", 64, E4M3, TARGETS["sm90"]) == FEWROWS_TILE_16
    assert tile_for_variant("wgmma", 1, E4M3, TARGETS["sm90"]) == WGMMA_TILE
    assert tile_for_variant("vsplit", 128, E4M3, INTERPRETER).variant == "vsplit"
    assert make_launch_plan(**plan_kw(config="rows", num_heads=16, max_qo_len=1)).config == (
        TRITON_TABLE.few_fp8
    )
    with pytest.raises(ValueError, match="tables have none"):
        tile_for_variant("wgmma", 1, E4M3, TARGETS["sm86"])


def test_registry_entries_describe_themselves():
    for name, v in REGISTRY.items():
        assert v.name == name and v.summary and ":" in v.kernel
        assert v.programs_per_tile in (1, 2)
    assert tile_name(WGMMA_TILE) == "64x64 wgmma" and tile_name(FEWROWS_TILE_16) == "16x64 fewrows"
    assert tile_name(TRITON_TABLE.wide_fp8) == "128x64 vsplit"


@pytest.fixture
def old_triton(monkeypatch):
    """Triton 3.2 as far as the registry can tell (no Gluon kernels)."""
    import triton

    from fp8mla.attention import variants

    monkeypatch.setattr(triton, "__version__", "3.2.0")
    variants.gluon_missing.cache_clear()
    yield
    variants.gluon_missing.cache_clear()


def test_sm90_without_gluon_takes_the_triton_tiles(old_triton):
    """A Triton too old for the Gluon kernels: SM90 plans fall back to the Triton tiles (no
    import error at plan()), and asking for a Gluon variant names the version."""
    kw = dict(batch=1, num_heads=32, max_qo_len=1, max_kv_len=4096, sms=132,
              max_splits_by_workspace=64, target=TARGETS["sm90"])  # fmt: skip
    for heads in (16, 32, 128):
        plan = make_launch_plan(**{**kw, "num_heads": heads})
        assert not get_variant(plan.config.variant).gluon and not plan.merge_waits
    with pytest.raises(ValueError, match=r"needs Triton 3\.6 or later \(Gluon\), got 3\.2\.0"):
        make_launch_plan(**kw, config="fewrows")


def test_kernels_said_to_launch_the_merge_early_do_so():
    """``launches_dependents`` is a promise the planner acts on: the kernel's module issues
    ``launch_dependents()`` (and only Gluon SM90 kernels make it)."""
    import importlib
    import inspect

    for v in REGISTRY.values():
        module = importlib.import_module(v.kernel.split(":")[0])
        issues = "launch_dependents()" in inspect.getsource(module)
        assert issues == v.launches_dependents, v.name
        assert not v.launches_dependents or v.gluon


def test_default_target_is_the_measured_h200():
    kw = dict(batch=4, num_heads=128, max_qo_len=1, max_kv_len=4096, sms=132,
              max_splits_by_workspace=64)  # fmt: skip
    assert make_launch_plan(**kw, target=None) == make_launch_plan(**kw, target=TARGETS["sm90"])
    plan = make_launch_plan(**kw, target=None)
    assert plan.config == FP8QK_TILE_32
    # 4 requests × 4 row tiles: 8 splits fill the 132 SMs
    assert plan.num_splits == 132 // 16


def test_fewrows_splits_fill_one_wave():
    kw = dict(num_heads=32, max_qo_len=1, sms=132, max_splits_by_workspace=64,
              target=TARGETS["sm90"])  # fmt: skip
    assert make_launch_plan(batch=32, max_kv_len=4096, **kw).num_splits == 4
    assert make_launch_plan(batch=8, max_kv_len=16384, **kw).num_splits == 16
    # one request: a split per 64-token tile, up to 64
    assert make_launch_plan(batch=1, max_kv_len=4096, **kw).num_splits == 64
    assert make_launch_plan(batch=1, max_kv_len=640, **kw).num_splits == 10


def test_fp8_decode_takes_the_few_row_kernel_for_single_tile_programs():
    """The FP8 × FP8 kernel serves FP8 decode, but where each program would get one 64-token
    tile the few-row kernel, which starts sooner, takes the same grid."""
    kw = dict(num_heads=32, max_qo_len=1, sms=132, max_splits_by_workspace=64,
              target=TARGETS["sm90"])  # fmt: skip
    assert make_launch_plan(batch=32, max_kv_len=4096, **kw).config == FP8QK_TILE_32
    one = make_launch_plan(batch=1, max_kv_len=4096, **kw)
    assert (one.config, one.num_splits) == (FEWROWS_TILE_32, 64)
    # lengths unknown at plan() (CUDA graphs): planned for long contexts
    assert make_launch_plan(batch=1, max_kv_len=None, **kw).config == FP8QK_TILE_32
    # 16 rows, two tiles per program; named variants are never swapped
    assert make_launch_plan(batch=64, max_kv_len=4096, **dict(kw, num_heads=16)).config == (
        FP8QK_TILE_16
    )
    forced = make_launch_plan(batch=1, max_kv_len=4096, config="fp8qk", **kw)
    assert forced.config == FP8QK_TILE_32
    # fp16 queries (11 significant bits; the FP8 split holds 8): the few-row kernel
    fp16 = make_launch_plan(batch=32, max_kv_len=4096, q_dtype=torch.float16, **kw)
    assert fp16.config == FEWROWS_TILE_32
    with pytest.raises(ValueError, match="expected bf16 queries for the fp8qk kernel"):
        make_launch_plan(batch=32, max_kv_len=4096, q_dtype=torch.float16, config="fp8qk", **kw)
    # 16-bit pools stay on the few-row kernel
    assert make_launch_plan(batch=32, max_kv_len=4096, kv_dtype=torch.bfloat16, **kw).config == (
        FEWROWS_TILE_32
    )


@pytest.mark.parametrize("name", ["sm86", "sm89", "sm120"])
def test_99kb_targets_take_tiles_that_fit(name):
    """An FP8 tile stages ``(BLOCK_M + BLOCK_N) × 576`` fp16 values in shared memory
    (docs/compile_matrix.md): 64-row tiles (144 KB) do not fit 99 KB."""
    t = TARGETS[name]
    assert t.smem_per_block == 99 * KB
    for dtype in KV_DTYPES:
        for rows in ROWS:
            cfg = choose_config(rows, dtype, t)
            assert (cfg.block_m + cfg.block_n) * 576 * 2 <= t.smem_per_block, (rows, cfg)
            assert cfg.occupancy == 1
    assert choose_config(128, E4M3, t) == KernelConfig(32, 32, 8, 1)


def test_sm80_keeps_the_h200_tiles_that_fit_163kb():
    t = TARGETS["sm80"]
    assert choose_config(16, E4M3, t) == KernelConfig(16, 64, 8, 1)
    assert choose_config(128, E4M3, t) == KernelConfig(64, 64, 8, 1)
    assert choose_config(128, torch.bfloat16, t) == KernelConfig(32, 32, 8, 2)


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
    assert choose_config(128, E4M3, t) == KernelConfig(64, 16, 4, 1)
    assert choose_config(16, E4M3, t) == KernelConfig(16, 32, 4, 2)


def test_rdna3_wave32_tiles():
    t = TARGETS["gfx1100"]
    assert t.warp_size == 32
    for dtype in KV_DTYPES:
        for rows in ROWS:
            assert choose_config(rows, dtype, t) == KernelConfig(16, 16, 8, 1)


@pytest.mark.parametrize("name", list(TARGETS))
def test_selectable_configs_cover_every_choice(name):
    """Every tile make_launch_plan can run: the tables' choices and, for the FP8 × FP8
    kernel's, the few-row tile that stands in for single-tile programs and fp16 queries and
    the FP8 ping-pong tile that does for batches that fill the SMs without KV splits."""
    t = TARGETS[name]
    for dtype in KV_DTYPES:
        picked = set()
        for rows in ROWS:
            for kpe in (64, 0):
                for max_kv, q, batch in (
                    (None, torch.bfloat16, 1),
                    (64, torch.bfloat16, 1),
                    (None, torch.float16, 1),
                    (None, torch.bfloat16, 128),  # programs enough to fill the SMs unsplit
                ):
                    picked.add(
                        make_launch_plan(
                            batch=batch, num_heads=rows, max_qo_len=1, max_kv_len=max_kv, sms=132,
                            max_splits_by_workspace=64, target=t, kv_dtype=dtype,
                            head_dim_kpe=kpe, q_dtype=q,
                        ).config
                    )  # fmt: skip
        assert picked == set(selectable_configs(t, dtype))


def test_interpreter_is_a_target_with_its_own_table():
    assert config_table(INTERPRETER) is TABLES["interpreter"]
    assert choose_config(16, E4M3, INTERPRETER) == KernelConfig(16, 32, 4, 1)
    assert choose_config(32, E4M3, INTERPRETER) == KernelConfig(32, 32, 4, 1)
    assert choose_config(64, torch.bfloat16, INTERPRETER) == KernelConfig(64, 32, 4, 1)
    assert choose_config(128, E4M3, INTERPRETER) == KernelConfig(64, 32, 4, 1, variant="vsplit")
    for dtype in KV_DTYPES:  # no Gluon variant can run there
        assert not any(REGISTRY[c.variant].gluon for c in selectable_configs(INTERPRETER, dtype))


def test_launch_plan_uses_the_target():
    kw = dict(
        batch=2,
        num_heads=128,
        max_qo_len=1,
        max_kv_len=8192,
        sms=84,
        max_splits_by_workspace=64,
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
    assert INTERPRETER.backend == "interpreter" and not INTERPRETER.is_gpu
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


def test_register_cap_keeps_the_programs_per_sm_the_split_count_counts_on():
    # 8 warps, two programs per SM: 65,536 / (2 × 256) registers each
    assert KernelConfig(16, 64, 8, 1, occupancy=2).max_registers() == 128
    assert KernelConfig(16, 64, 8, 1, occupancy=3).max_registers() == 80
    # one program per SM, or a cap at the hardware's 255 anyway: nothing to tell ptxas
    assert KernelConfig(16, 64, 8, 1).max_registers() is None
    assert KernelConfig(16, 64, 4, 2, occupancy=2).max_registers() is None
    fields = ("few_fp8", "few_16bit", "many_fp8", "many_16bit", "wide_fp8", "wide_16bit")
    for table in TABLES.values():
        for cfg in filter(None, (getattr(t, f) for t in table.chain() for f in fields)):
            cap = cfg.max_registers()
            assert cap is None or (
                cap % 8 == 0 and cap * cfg.num_warps * 32 * cfg.occupancy <= 65536
            )


def test_merge_columns_per_program_follow_the_rows():
    from fp8mla.attention.planner import merge_block_d

    assert merge_block_d(64 * 16, 132) == 512  # many rows: whole rows per program
    assert merge_block_d(8 * 32, 132) == 256
    assert merge_block_d(32, 132) == 128  # one request of 32 heads: 128 programs
    plan = make_launch_plan(batch=1, num_heads=32, max_qo_len=1, max_kv_len=4096, sms=132,
                            max_splits_by_workspace=64, target=TARGETS["sm90"])  # fmt: skip
    assert plan.merge_block_d == 128 and plan.num_splits > 1


@pytest.mark.parametrize(
    "target, config, waits",
    [("sm90", None, True), ("sm90", "fp8qk", True), ("sm90", "rows", False),
     ("sm90", "wgmma", False), ("sm100", None, False), ("sm80", None, False)],
)  # fmt: skip
def test_merge_waits_where_the_attention_kernel_lets_it_launch_early(target, config, waits):
    """SM90 kernels that issue griddepcontrol.launch_dependents (few-row, FP8 × FP8) get the
    split merge as their programmatic dependent (no launch gap after them); a kernel that does
    not (Triton tiles, the many-row kernel: measured slower with it), other GPUs, the
    interpreter and unsplit plans get an ordinary launch."""
    kw = dict(batch=1, num_heads=32, max_qo_len=1, max_kv_len=4096, sms=132,
              max_splits_by_workspace=64)  # fmt: skip
    plan = make_launch_plan(target=TARGETS[target], config=config, **kw)
    assert plan.num_splits > 1 and plan.merge_waits == waits
    assert not make_launch_plan(
        target=TARGETS[target], config=config, num_splits=1, **kw
    ).merge_waits
    assert not make_launch_plan(target=INTERPRETER, **kw).merge_waits


@pytest.mark.parametrize(
    "target, config, waits",
    [("sm90", None, True), ("sm90", "fp8qk", True), ("sm90", "fewrows", True),
     ("sm90", "pingpong8", True), ("sm90", "rows", False), ("sm90", "wgmma", False),
     ("sm90", "pingpong", False), ("sm100", None, False), ("sm80", None, False)],
)  # fmt: skip
@pytest.mark.parametrize("splits", [None, 1])
def test_attention_waits_on_the_grid_before_it_where_its_kernel_can(target, config, waits, splits):
    """The few-row, FP8 × FP8 and FP8 ping-pong kernels on SM90 are launched as programmatic
    dependents of the grid before them on the stream (split or not); the other kernels, other
    GPUs and the interpreter get an ordinary launch."""
    kw = dict(batch=1, num_heads=32, max_qo_len=1, max_kv_len=4096, sms=132,
              max_splits_by_workspace=64, num_splits=splits)  # fmt: skip
    assert make_launch_plan(target=TARGETS[target], config=config, **kw).attention_waits == waits
    assert not make_launch_plan(target=INTERPRETER, **kw).attention_waits


def test_dependent_launch_can_be_turned_off(monkeypatch):
    """``FP8MLA_DEPENDENT_LAUNCH=0``: the attention kernel gets an ordinary launch."""
    kw = dict(batch=1, num_heads=32, max_qo_len=1, max_kv_len=4096, sms=132,
              max_splits_by_workspace=64, target=TARGETS["sm90"])  # fmt: skip
    monkeypatch.setenv("FP8MLA_DEPENDENT_LAUNCH", "0")
    assert not make_launch_plan(**kw).attention_waits


def test_merge_reads_as_many_splits_at_once_as_registers_allow():
    from fp8mla.attention.planner import MERGE_VALUES_PER_PROGRAM, merge_block_s

    # one request of 32 heads: 64 splits in 128-column programs, one pass
    assert merge_block_s(64, 128) == 64
    assert merge_block_s(4, 512) == 4 and merge_block_s(3, 512) == 4 and merge_block_s(1, 512) == 1
    for splits in (1, 2, 5, 16, 64, 100, 512):
        for block_d in (128, 256, 512):
            s = merge_block_s(splits, block_d)
            assert s & (s - 1) == 0  # a power of two (tl.arange)
            assert s * block_d <= MERGE_VALUES_PER_PROGRAM  # 64 values a thread at most
            assert s >= min(splits, MERGE_VALUES_PER_PROGRAM // block_d)


@pytest.mark.parametrize("heads, qo_len", [(32, 1), (16, 2), (24, 1), (8, 4)])
def test_one_row_tile_variants_get_a_tile_that_holds_the_rows(heads, qo_len):
    """The few-row kernel takes one row tile per request (no grid axis for a second): named
    in plan(), it runs in a tile that holds every query row (17-32 rows: 32), never as two
    16-row tiles whose second would compute the first's rows again and leave the rest
    unwritten."""
    plan = make_launch_plan(batch=4, num_heads=heads, max_qo_len=qo_len, max_kv_len=4096,
                            sms=132, max_splits_by_workspace=64, target=TARGETS["sm90"],
                            config="fewrows")  # fmt: skip
    assert plan.config.variant == "fewrows" and plan.m_tiles == 1
    assert plan.config.block_m >= heads * qo_len


@pytest.mark.parametrize(
    "heads, qo_len, tiles",
    [(32, 1, 1), (16, 2, 1), (64, 1, 2), (16, 4, 2), (24, 3, 3), (128, 1, 4)],
)
def test_fp8qk_runs_more_rows_in_row_tiles(heads, qo_len, tiles):
    """The FP8 × FP8 kernel has a grid axis of 32-row tiles: more than 32 rows a request run
    as several tiles (never handed to the few-row kernel, which has none, even where each
    program has one KV tile)."""
    for max_kv_len in (4096, 64):
        plan = make_launch_plan(batch=4, num_heads=heads, max_qo_len=qo_len,
                                max_kv_len=max_kv_len, sms=132, max_splits_by_workspace=64,
                                target=TARGETS["sm90"])  # fmt: skip
        if tiles > 1 or max_kv_len > 64:
            assert (plan.config, plan.m_tiles) == (FP8QK_TILE_32, tiles)
        else:  # one 64-token tile per program of one row tile: the few-row kernel
            assert plan.config.variant == "fewrows" and plan.m_tiles == 1


@pytest.mark.parametrize("variant", ["fewrows"])
def test_a_one_row_tile_too_small_for_the_rows_is_refused(variant):
    """A 16-row tile of the few-row Gluon kernel passed as a KernelConfig for 32 rows is a
    ValueError (before: two row tiles, half the heads never computed); for 16 rows it runs."""
    tile = KernelConfig(16, 64, 4, 1, variant=variant, fp8_cvt="ptx")
    kw = dict(batch=4, max_qo_len=1, max_kv_len=4096, sms=132, max_splits_by_workspace=64,
              target=TARGETS["sm90"], config=tile)  # fmt: skip
    with pytest.raises(ValueError, match="one row tile per request: a 16-row tile cannot hold 32"):
        make_launch_plan(num_heads=32, **kw)
    assert make_launch_plan(num_heads=16, **kw).m_tiles == 1
    # the Triton tiles take a grid axis of row tiles: 32 heads as two 16-row tiles
    triton = make_launch_plan(num_heads=32, **{**kw, "config": KernelConfig(16, 64, 8, 1)})
    assert triton.m_tiles == 2


def test_fp16_partials_where_the_kernel_writes_them():
    """Split plans of the FP8 × FP8 kernel take fp16 partials (half the bytes written and
    merged), with merge programs of one warp per 256 columns; the other kernels' split plans
    and plans without splits keep fp32 partials and 4-warp merges."""
    from fp8mla.attention.planner import make_launch_plan, merge_warps

    kw = dict(num_heads=32, max_qo_len=1, max_kv_len=4096, sms=132, max_splits_by_workspace=64,
              target=TARGETS["sm90"])  # fmt: skip
    split = make_launch_plan(batch=32, config="fp8qk", **kw)
    assert split.num_splits > 1 and split.half_partials
    assert split.merge_warps == merge_warps(split.merge_block_d, True) == 2
    one = make_launch_plan(batch=32, config="fp8qk", num_splits=1, **kw)
    assert not one.half_partials
    few = make_launch_plan(batch=32, config="fewrows", **kw)
    assert few.num_splits > 1 and not few.half_partials and few.merge_warps == 4
    assert [merge_warps(d, True) for d in (128, 256, 512)] == [4, 1, 2]
    assert [merge_warps(d, False) for d in (128, 256, 512)] == [4, 4, 4]


def test_merge_of_fp16_partials_reads_at_most_128_values_a_thread():
    from fp8mla.attention.planner import merge_block_s, merge_warps

    for splits in (2, 16, 64, 512):
        for block_d in (128, 256, 512):
            warps = merge_warps(block_d, True)
            s = merge_block_s(splits, block_d, warps, True)
            assert s & (s - 1) == 0 and s * block_d <= 128 * 32 * warps
            assert s >= min(splits, 128 * 32 * warps // block_d)
