"""Launch planning for MLA attention: tile shapes, warps and the number of KV splits.

Pure host-side arithmetic on the batch description, so it can be unit-tested anywhere and
called once per ``plan()``.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import KW_ONLY, dataclass

import torch

from fp8mla.ops.targets import KB, Target

# Fewest KV tokens worth giving a split of its own: below this the merge costs more than the
# extra parallelism buys.
MIN_TOKENS_PER_SPLIT = 128
MAX_SPLITS = 64


@dataclass(frozen=True)
class KernelConfig:
    """Tile shape and launch parameters of one attention launch."""

    block_m: int  # query rows ((token, head) pairs) per program
    block_n: int  # KV tokens per inner-loop step
    num_warps: int
    num_stages: int
    _: KW_ONLY  # the options below are named at every call: new ones cannot shift them
    swap_ab: bool = False  # tokens × rows orientation (few rows per request)
    # two programs per row tile, each with half of the 512 output columns (many rows)
    value_split: bool = False
    # bf16 queries converted to fp16 by the launcher (a copy the size of q_nope) when the dots
    # run in fp16: Triton then stages the query tile from global memory into shared memory;
    # converted in-kernel, it is re-read into registers every KV step (value split, FP8 KV).
    q_fp16_copy: bool = False
    # SM90 only: the warp-specialized Gluon kernel whose two consumer warpgroups split the
    # columns of one Q·Kᵀ and of the output while a producer warpgroup converts the next FP8
    # tile (``kernels/mla_wgmma.py``): 64 × 64 tiles, 8 consumer warps (the producer's 4 come on
    # top), FP8 KV with a 64-dim RoPE part.
    wgmma: bool = False
    fp8_cvt: str = "auto"  # FP8 → fp16: auto, native, ptx (SM89+), int (CUDA), portable (any)
    # Programs per SM the split count aims for: 2 fills two full waves when one program is
    # resident per SM (the H200's 16-row FP8 tile: 4 splits beat 2 and 3 for 64 requests).
    occupancy: int = 1

    def __post_init__(self) -> None:
        if self.swap_ab + self.value_split + self.wgmma > 1:
            raise ValueError("expected at most one of swap_ab, value_split and wgmma")
        if self.wgmma and (self.block_m, self.block_n, self.num_warps) != (64, 64, 8):
            raise ValueError(
                f"expected 64 × 64 tiles and 8 warps for the wgmma kernel, got "
                f"{self.block_m} × {self.block_n} and {self.num_warps} warps"
            )

    @property
    def programs_per_tile(self) -> int:
        """Programs the grid launches per row tile and split."""
        return 2 if self.value_split else 1


@dataclass(frozen=True)
class LaunchPlan:
    """Grid of one attention launch: ``(m_tiles, batch, num_splits)`` programs."""

    config: KernelConfig
    m_tiles: int  # row tiles of the longest request (shorter ones exit early)
    num_splits: int


@functools.lru_cache(maxsize=16)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device``; a small nominal count for the CPU interpreter."""
    if device.type == "cuda":
        return sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return 8


@dataclass(frozen=True)
class ConfigTable:
    """The tiles of one family of targets: FP8 / 16-bit KV; up to 32 rows, up to 64, more
    (``wide_*``, None: the up-to-64 tile)."""

    few_fp8: KernelConfig
    few_16bit: KernelConfig
    many_fp8: KernelConfig
    many_16bit: KernelConfig
    wide_fp8: KernelConfig | None = None
    wide_16bit: KernelConfig | None = None
    # the table without the wgmma kernel, for batches it cannot serve (no RoPE part)
    no_wgmma: ConfigTable | None = None

    def pick(self, rows: int, kv_dtype: torch.dtype) -> KernelConfig:
        fp8 = kv_dtype.itemsize == 1
        if rows <= FEW_ROWS:
            return self.few_fp8 if fp8 else self.few_16bit
        many = self.many_fp8 if fp8 else self.many_16bit
        if rows <= MANY_ROWS:
            return many
        return (self.wide_fp8 if fp8 else self.wide_16bit) or many


FEW_ROWS = 32
MANY_ROWS = 64
# A request with more rows than MANY_ROWS (extend chunks, 128 heads) fills 128-row tiles.
SELECTION_ROWS = (1, FEW_ROWS + 1, MANY_ROWS + 1)  # one row count per table entry
# SM90/SM100 (227 KB): the H200 tuning rounds (benchmarks/NOTES.md). Up to 32 rows 16-row tiles
# (a 32-head request runs as two tiles whose shared KV reads hit L2). FP8, 33-64 rows: value-split
# 64-row tiles, 4 warps, 3 stages, two programs per SM (109 KB each); more rows: value-split
# 128-row tiles with fp16 queries (round 6: 216 vs 162 TFLOP/s for a 4096-token chunk, 190 vs
# 146 for 64 × 128-head decode). 16-bit KV: the 64-row tile up to 64 rows, then value-split
# 128-row tiles in one stage (two stages need 295 KB: cp.async stages the KV tile; bf16 pool:
# 185 vs 146 TFLOP/s for the chunk, 430 vs 564 us for the decode). These tiles spill 150-900 B
# per thread and still measured fastest. This Triton-only table serves SM100 and the batches the
# wgmma kernel cannot (no RoPE part).
TRITON_TABLE = ConfigTable(
    KernelConfig(16, 64, 8, 1, occupancy=2),
    KernelConfig(16, 64, 4, 2, occupancy=2),
    KernelConfig(64, 32, 4, 3, value_split=True, occupancy=2),
    KernelConfig(64, 64, 8, 1, occupancy=1),
    KernelConfig(128, 64, 8, 2, value_split=True, q_fp16_copy=True),
    KernelConfig(128, 64, 8, 1, value_split=True, q_fp16_copy=True),
)
# SM90, FP8 KV above 32 rows: the warp-specialized Gluon wgmma kernel (round 10: 448 vs 215
# TFLOP/s for the 4096-token chunk with 128 heads, 44 vs 77 us for 8 x 4 speculative tokens,
# 188 vs 361 us for 64 x 128-head decode). It decodes FP8 with cvt.rn.f16x2 (round 7: 322 vs 299
# TFLOP/s for the integer bit moves, when the consumers still converted).
WGMMA_TILE = KernelConfig(64, 64, 8, 1, wgmma=True, fp8_cvt="ptx")
MEASURED_TABLE = dataclasses.replace(
    TRITON_TABLE, many_fp8=WGMMA_TILE, wide_fp8=WGMMA_TILE, no_wgmma=TRITON_TABLE
)
# The other targets were compiled, not timed (docs/compile_matrix.md, whose numbers the comments
# quote). Rule: the H200 choice where it fits the target's shared memory without spilling more
# than on the H200, else the largest tile that fits unspilled. Occupancy 1: in every one of
# these builds registers or shared memory leave no room for a second program per SM/CU.
TABLES: dict[str, ConfigTable] = {
    "measured": MEASURED_TABLE,
    # SM100: the H200 table without the wgmma kernel (Hopper only); Triton lays the two-stage
    # 128-row value-split tile out in 251 KB there (> 227 KB), one stage fits.
    "sm100": dataclasses.replace(
        TRITON_TABLE, wide_fp8=dataclasses.replace(TRITON_TABLE.wide_fp8, num_stages=1)
    ),
    # SM80 (163 KB): the H200 tiles but for 16-bit KV with many rows, whose 64-row tile needs
    # 200 KB there (no wgmma); 32×32 in two stages needs 74 KB.
    "smem163": ConfigTable(
        KernelConfig(16, 64, 8, 1),
        KernelConfig(16, 64, 4, 2),
        KernelConfig(64, 64, 8, 1),
        KernelConfig(32, 32, 8, 2),
    ),
    # SM86/89/120 (99 KB): 64-row tiles need 144-200 KB, 32×32 tiles 72-74 KB; the 16-bit 16×64
    # two-stage tile fits (92 KB) but spills 180-270 B, 16×32 (55 KB) does not.
    "smem99": ConfigTable(
        KernelConfig(16, 64, 8, 1),
        KernelConfig(16, 32, 4, 2),
        KernelConfig(32, 32, 8, 1),
        KernelConfig(32, 32, 8, 2),
    ),
    # CDNA (wave64, 64 KB LDS): 4 wavefronts keep the 512-VGPR budget of one wave per SIMD
    # (8 wavefronts halve it and spill); 16×64 spills on gfx90a, 16×32 in two stages nowhere;
    # the 64-row tile uses all 64 KB of LDS.
    "wave64": ConfigTable(
        KernelConfig(16, 32, 4, 2),
        KernelConfig(16, 32, 4, 2),
        KernelConfig(64, 16, 4, 1),
        KernelConfig(64, 16, 4, 1),
    ),
    # RDNA3 (wave32, 256 VGPRs): WMMA holds 16 values per lane per 16×16 operand tile, so the
    # 576-deep Q·Kᵀ operands alone need ~576 VGPRs: every tile spills, the smallest least.
    "wave32": ConfigTable(*(KernelConfig(16, 16, 8, 1),) * 4),
}


def config_table(target: Target | None) -> ConfigTable:
    """The table for ``target``; None and SM90 get the H200-measured one, SM100 its variant."""
    if target is None:
        return MEASURED_TABLE
    if target.is_hip:
        return TABLES["wave64" if target.warp_size == 64 else "wave32"]
    if target.smem_per_block >= 227 * KB:
        return TABLES["sm100"] if int(target.arch) >= 100 else MEASURED_TABLE
    return TABLES["smem163" if target.smem_per_block >= 163 * KB else "smem99"]


def selectable_configs(target: Target | None, kv_dtype: torch.dtype) -> list[KernelConfig]:
    """Every config :func:`choose_config` can pick for ``target`` and ``kv_dtype`` (compiled)."""
    table = config_table(target)
    out = [table.pick(rows, kv_dtype) for rows in SELECTION_ROWS]
    return list(dict.fromkeys(out))


def choose_config(
    rows: int, kv_dtype: torch.dtype, interpreted: bool, target: Target | None = None
) -> KernelConfig:
    """Tiles for ``rows`` query rows per request (query tokens × heads) on ``target`` (the
    H200-measured table when None); the interpreter takes small tiles."""
    if interpreted:
        if rows > MANY_ROWS:  # the value-split kernel, as on the GPU
            return KernelConfig(block_m=64, block_n=32, num_warps=4, num_stages=1, value_split=True)
        block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
        return KernelConfig(block_m=block_m, block_n=32, num_warps=4, num_stages=1)
    return config_table(target).pick(rows, kv_dtype)


def choose_splits(
    work_items: int,
    max_kv_len: int | None,
    sms: int,
    max_splits_by_workspace: int,
    config: KernelConfig | None = None,
) -> int:
    """Splits per request: as many as keep ``work_items × splits`` within ``sms × occupancy``
    programs (whole waves) -- a partial extra wave costs more than the merge saves.

    ``max_kv_len=None`` (CUDA-graph plans, where lengths change between replays) plans for
    long contexts; the kernel leaves surplus splits empty when a request is short.
    """
    slots = sms * (config.occupancy if config is not None else 1)
    splits = max(1, slots // max(work_items, 1))
    if max_kv_len is not None:
        splits = min(splits, max(1, max_kv_len // MIN_TOKENS_PER_SPLIT))
    return max(1, min(splits, MAX_SPLITS, max_splits_by_workspace))


def check_wgmma(
    config: KernelConfig, kv_dtype: torch.dtype, head_dim_kpe: int, interpreted: bool,
    target: Target | None,
) -> None:  # fmt: skip
    """Raise unless the wgmma kernel can run: compiled on SM90 (``target`` None: the H200 the
    table was measured on), FP8 KV, a 64-dim RoPE part."""
    if not config.wgmma:
        return
    if interpreted:
        raise ValueError("expected an SM90 GPU for the wgmma kernel, got the interpreter")
    if target is not None and (target.backend != "cuda" or target.arch != 90):
        raise ValueError(
            f"expected an SM90 GPU for the wgmma kernel, got {target.backend} {target.arch}"
        )
    if kv_dtype.itemsize != 1 or head_dim_kpe != 64:
        raise ValueError(
            f"expected FP8 KV with head_dim_kpe 64 for the wgmma kernel, got {kv_dtype} with "
            f"head_dim_kpe {head_dim_kpe}"
        )


def make_launch_plan(
    *,
    batch: int,
    num_heads: int,
    max_qo_len: int,
    max_kv_len: int | None,
    sms: int,
    max_splits_by_workspace: int,
    interpreted: bool,
    kv_dtype: torch.dtype = torch.float8_e4m3fn,
    num_splits: int | None = None,
    config: KernelConfig | None = None,
    target: Target | None = None,
    head_dim_kpe: int = 64,
) -> LaunchPlan:
    """Tiles and grid of one launch; ``target`` (the device's architecture) picks the
    config table, None meaning the H200-measured one. A chosen wgmma tile that cannot run
    (no RoPE part) gives way to the table's ``no_wgmma`` choice; a given one raises."""
    rows = max_qo_len * num_heads
    if config is None:
        config = choose_config(rows, kv_dtype, interpreted, target)
        table = config_table(target)
        if config.wgmma and (kv_dtype.itemsize != 1 or head_dim_kpe != 64) and table.no_wgmma:
            config = table.no_wgmma.pick(rows, kv_dtype)
    check_wgmma(config, kv_dtype, head_dim_kpe, interpreted, target)
    m_tiles = max(1, -(-rows // config.block_m))
    if num_splits is None:
        num_splits = choose_splits(
            batch * m_tiles * config.programs_per_tile,
            max_kv_len,
            sms,
            max_splits_by_workspace,
            config,
        )
    return LaunchPlan(config=config, m_tiles=m_tiles, num_splits=num_splits)
