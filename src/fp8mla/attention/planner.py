"""Launch planning for MLA attention: which kernel variant, in which tile, with how many KV
splits.

Pure host-side arithmetic on the batch description, so it can be unit-tested anywhere and is
called once per ``plan()``. Each target family has a :class:`ConfigTable` (measured on the H200
for SM90; compiled, not timed, elsewhere: ``docs/compile_matrix.md``); a table's choice that its
variant cannot serve (``variants.REGISTRY``) gives way to the table's fallback, and a variant's
own rule (``Variant.refine``) may hand the batch to another tile. The measurements behind each
entry are in ``docs/design/planner.md``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fp8mla.attention.config import KernelConfig, LaunchPlan
from fp8mla.attention.targets import INTERPRETER, KB, MEASURED, Target
from fp8mla.attention.variants import PlannedBatch, get_variant

MAX_SPLITS = 64
# Row counts per request (query tokens × heads) that separate the table's entries.
TINY_ROWS = 16
FEW_ROWS = 32
MANY_ROWS = 64
SELECTION_ROWS = (1, TINY_ROWS + 1, FEW_ROWS + 1, MANY_ROWS + 1)  # one per table entry


@dataclass(frozen=True)
class ConfigTable:
    """The tiles of one family of targets, by KV dtype (FP8 / 16-bit) and rows per request:
    up to 16 (``tiny_*``, None: the ``few_*`` tile), up to 32, up to 64, more (``wide_*``,
    None: the up-to-64 tile); FP8 pools with bf16 queries of 33 to ``row_tiles_fp8_rows``
    rows take ``row_tiles_fp8`` where set, 16-bit pools of at least ``shared_16bit_rows`` rows
    (more than one row tile: each KV tile serves several programs) ``shared_16bit``.
    ``fallback`` serves batches a chosen variant cannot."""

    few_fp8: KernelConfig
    few_16bit: KernelConfig
    many_fp8: KernelConfig
    many_16bit: KernelConfig
    wide_fp8: KernelConfig | None = None
    wide_16bit: KernelConfig | None = None
    tiny_fp8: KernelConfig | None = None
    tiny_16bit: KernelConfig | None = None
    fallback: ConfigTable | None = None
    # FP8 pools are staged in fp16 (attention/stage.py) and run by the 16-bit kernel when the
    # batch's row tiles read each staged KV token at least this many times (None: never)
    stage_min_reuse: int | None = None
    # FP8 pools, bf16 queries, FEW_ROWS + 1 to row_tiles_fp8_rows rows a request: this tile,
    # one program per row tile (None: many_fp8 / wide_fp8)
    row_tiles_fp8: KernelConfig | None = None
    row_tiles_fp8_rows: int = 0
    # 16-bit pools (and FP8 ones staged in fp16), at least shared_16bit_rows rows a request:
    # this tile (None: wide_16bit)
    shared_16bit: KernelConfig | None = None
    shared_16bit_rows: int = 0
    # FP8 pools whose requests of more than MANY_ROWS rows take row_tiles_fp8: this tile
    # instead where its programs fill the GPU without KV splits (make_launch_plan)
    unsplit_fp8: KernelConfig | None = None
    # FP8 pools, bf16 queries, row_tiles_fp8_rows + 1 to multi_fp8_rows rows a request (a few
    # speculative tokens at many heads): this tile (None: many_fp8 / wide_fp8)
    multi_fp8: KernelConfig | None = None
    multi_fp8_rows: int = 0

    def pick(
        self, rows: int, kv_dtype: torch.dtype, q_dtype: torch.dtype = torch.bfloat16
    ) -> KernelConfig:
        fp8 = kv_dtype.itemsize == 1
        tiles = self.row_tiles_fp8 if FEW_ROWS < rows <= self.row_tiles_fp8_rows else None
        if fp8 and tiles is not None and q_dtype == torch.bfloat16:
            return tiles
        multi = self.row_tiles_fp8_rows < rows <= self.multi_fp8_rows
        if fp8 and multi and self.multi_fp8 is not None and q_dtype == torch.bfloat16:
            return self.multi_fp8
        if not fp8 and self.shared_16bit is not None and rows >= self.shared_16bit_rows:
            return self.shared_16bit
        if rows <= TINY_ROWS:
            tiny = self.tiny_fp8 if fp8 else self.tiny_16bit
            if tiny is not None:
                return tiny
        if rows <= FEW_ROWS:
            return self.few_fp8 if fp8 else self.few_16bit
        many = self.many_fp8 if fp8 else self.many_16bit
        if rows <= MANY_ROWS:
            return many
        return (self.wide_fp8 if fp8 else self.wide_16bit) or many

    def chain(self) -> list[ConfigTable]:
        """This table and its fallbacks, in the order they are tried."""
        tables, t = [], self
        while t is not None:
            tables.append(t)
            t = t.fallback
        return tables


# The Triton tiles of SM90/SM100 (227 KB), from the H200 tuning sweeps. Up to 32 rows 16-row
# tiles (a 32-head request runs as two tiles whose shared KV reads hit L2). FP8, 33-64 rows:
# value-split 64-row tiles, 4 warps, 3 stages, two programs per SM (109 KB each); more rows:
# value-split 128-row tiles with fp16 queries. 16-bit KV: the 64-row tile up to 64 rows, then
# value-split 128-row tiles in one stage (two stages need 295 KB). These tiles spill and still
# measured fastest. This table serves SM100 and, on SM90, the batches the Gluon kernels cannot
# (no 64-dim RoPE part).
TRITON_TABLE = ConfigTable(
    few_fp8=KernelConfig(16, 64, 8, 1, occupancy=2),
    few_16bit=KernelConfig(16, 64, 4, 2, occupancy=2),
    many_fp8=KernelConfig(64, 32, 4, 3, variant="vsplit", occupancy=2),
    many_16bit=KernelConfig(64, 64, 8, 1, occupancy=1),
    wide_fp8=KernelConfig(128, 64, 8, 2, variant="vsplit", q_fp16_copy=True),
    wide_16bit=KernelConfig(128, 64, 8, 1, variant="vsplit", q_fp16_copy=True),
)
# SM90 above 32 rows: the warp-specialized Gluon wgmma kernel (FP8 decoded with cvt.rn.f16x2,
# 16-bit pools copied by cp.async), about twice the Triton tiles' rate there.
WGMMA_TILE = KernelConfig(64, 64, 8, 1, variant="wgmma", fp8_cvt="ptx")
# SM90 16-bit pools above 32 rows: two consumer warpgroups on alternate 32-token tiles
# (kernels/sm90/pingpong.py), faster than the wgmma kernel at every many-row case measured.
PINGPONG_TILE = KernelConfig(64, 32, 4, 1, variant="pingpong", fp8_cvt="ptx")
# The same kernel on 64-token tiles (16-bit pools): two buffers released by column halves.
PINGPONG64_TILE = KernelConfig(64, 64, 4, 1, variant="pingpong64")
# SM90 FP8 pools, 65-128 rows a request where no KV split is needed: the ping-pong order on
# 64-token FP8 tiles, Q·Kᵀ in FP8 × FP8 wgmma, V converted by the consumers
# (kernels/sm90/pingpong8.py).
PINGPONG8_TILE = KernelConfig(64, 64, 4, 1, variant="pingpong8", fp8_cvt="ptx")
# SM90 up to 32 rows: the few-row Gluon kernel, 16 or 32 rows as wgmma's N (faster than the
# 16-row Triton tile for both FP8 and bf16 pools).
FEWROWS_TILE_16 = KernelConfig(16, 64, 4, 1, variant="fewrows", fp8_cvt="ptx")
FEWROWS_TILE_32 = KernelConfig(32, 64, 4, 1, variant="fewrows", fp8_cvt="ptx")
# SM90 FP8 pools up to 32 rows: Q·Kᵀ in FP8 × FP8 from cp.async stages (faster than the few-row
# kernel), but where every program has one 64-token tile its longer start (query staging, four
# partitions) loses: the fp8qk variant's rule (variants.py) hands those batches to the few-row
# kernel.
FP8QK_TILE_16 = KernelConfig(16, 64, 4, 1, variant="fp8qk", fp8_cvt="ptx")
FP8QK_TILE_32 = KernelConfig(32, 64, 4, 1, variant="fp8qk", fp8_cvt="ptx")
SM90_TABLE = dataclasses.replace(
    TRITON_TABLE,
    tiny_fp8=FP8QK_TILE_16,
    few_fp8=FP8QK_TILE_32,
    tiny_16bit=FEWROWS_TILE_16,
    few_16bit=FEWROWS_TILE_32,
    many_16bit=PINGPONG_TILE,
    wide_16bit=PINGPONG_TILE,
    many_fp8=WGMMA_TILE,
    wide_fp8=WGMMA_TILE,
    # FP8 pools, 33-128 rows, bf16 queries: the FP8 × FP8 kernel in 32-row tiles, one
    # program each, the tiles of one request adjacent in the grid so that the later ones read
    # its KV from the L2 (faster than the wgmma kernel up to 128 rows; more rows tie, then
    # lose). Other queries take the wgmma kernel.
    row_tiles_fp8=FP8QK_TILE_32,
    row_tiles_fp8_rows=128,
    # 16-bit pools (and FP8 ones staged in fp16), more than one 64-row tile a request: the
    # ping-pong kernel on 64-token tiles, whose copies arrive on their own (faster than
    # 32-token tiles wherever a request has more than one row tile; one row tile loses)
    shared_16bit=PINGPONG64_TILE,
    shared_16bit_rows=65,
    # FP8 requests of 65-128 rows (bf16 queries) whose 64-row programs fill at least 90% of the
    # SMs without KV splits: the ping-pong order on FP8 tiles, which reads, copies and converts
    # each tile once for 64 rows (faster than the 32-row tiles there; with KV splits it loses):
    # the fp8qk variant's rule (variants.py) applies it
    unsplit_fp8=PINGPONG8_TILE,
    # FP8 requests of 129-256 rows (two query tokens at 128 heads), bf16 queries: the same
    # ping-pong kernel, split as planned (faster than the wgmma kernel and the 32-row tiles
    # there; more rows were not timed)
    multi_fp8=PINGPONG8_TILE,
    multi_fp8_rows=256,
    fallback=TRITON_TABLE,
    # FP8 batches whose 64-row tiles read each KV token >= 16 times staged in fp16 for the
    # ping-pong kernel (faster from a reuse of 16; slower at 8 and below)
    stage_min_reuse=16,
)
# The other targets were compiled, not timed (docs/compile_matrix.md, whose numbers the comments
# quote). Rule: the H200 choice where it fits the target's shared memory without spilling more
# than on the H200, else the largest tile that fits unspilled. Occupancy 1: in every one of
# these builds registers or shared memory leave no room for a second program per SM/CU.
TABLES: dict[str, ConfigTable] = {
    "sm90": SM90_TABLE,
    # SM100: the H200's Triton table (the Gluon kernels are Hopper-only); Triton lays the
    # two-stage 128-row value-split tile out in 251 KB there (> 227 KB), one stage fits.
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
    # Triton's CPU interpreter: small tiles (its time grows with the tile), the smallest that
    # holds the rows, and the value-split kernel above 64 rows as on the GPUs.
    "interpreter": ConfigTable(
        few_fp8=KernelConfig(32, 32, 4, 1),
        few_16bit=KernelConfig(32, 32, 4, 1),
        many_fp8=KernelConfig(64, 32, 4, 1),
        many_16bit=KernelConfig(64, 32, 4, 1),
        wide_fp8=KernelConfig(64, 32, 4, 1, variant="vsplit"),
        wide_16bit=KernelConfig(64, 32, 4, 1, variant="vsplit"),
        tiny_fp8=KernelConfig(16, 32, 4, 1),
        tiny_16bit=KernelConfig(16, 32, 4, 1),
    ),
}


def config_table(target: Target | None) -> ConfigTable:
    """The table for ``target``; None means the H200 the SM90 table was measured on."""
    if target is None:
        return TABLES["sm90"]
    if target is INTERPRETER or target.backend == "interpreter":
        return TABLES["interpreter"]
    if target.is_hip:
        return TABLES["wave64" if target.warp_size == 64 else "wave32"]
    if target.smem_per_block >= 227 * KB:
        if int(target.arch) == 90:
            return TABLES["sm90"]
        return TABLES["sm100"]
    return TABLES["smem163" if target.smem_per_block >= 163 * KB else "smem99"]


def choose_config(
    rows: int,
    kv_dtype: torch.dtype,
    target: Target | None,
    head_dim_kpe: int = 64,
    q_dtype: torch.dtype = torch.bfloat16,
) -> KernelConfig:
    """The tile for ``rows`` query rows per request (query tokens × heads) of ``q_dtype``
    queries on ``target``: the first table of the chain whose choice its variant can run."""
    reasons = []
    for table in config_table(target).chain():
        config = table.pick(rows, kv_dtype, q_dtype)
        why = get_variant(config.variant).reason_against(
            config, target or MEASURED, kv_dtype, rows, head_dim_kpe
        )
        if why is None:
            return config
        reasons.append(f"{config.variant}: {why}")
    raise ValueError(f"expected a kernel variant for this batch, got none ({'; '.join(reasons)})")


def selectable_configs(target: Target | None, kv_dtype: torch.dtype) -> list[KernelConfig]:
    """Every config the planner can pick for ``target`` and ``kv_dtype``, with and without a
    RoPE part (what the compile matrix builds): :func:`choose_config`'s, and the tiles a
    chosen variant's own rule can hand a batch to (``Variant.alternatives``)."""
    out = []
    chain = config_table(target).chain()
    shared_rows = tuple(t.shared_16bit_rows for t in chain if t.shared_16bit is not None)
    for kpe in (64, 0):
        for rows in SELECTION_ROWS + shared_rows:
            for q_dtype in (torch.bfloat16, torch.float16):
                config = choose_config(rows, kv_dtype, target, kpe, q_dtype)
                out.append(config)
                variant = get_variant(config.variant)
                if variant.alternatives is not None:
                    out.extend(variant.alternatives(config, chain, rows))
    return list(dict.fromkeys(out))


def stage_reuse(
    qo_lens: Sequence[int], kv_tokens: Sequence[int], heads: int, block_m: int, staged: int
) -> float:
    """Row tiles that read each staged KV token, on average: each request's row tiles
    (``ceil(qo_len × heads / block_m)``, a tile per program) times its KV tokens, summed, over
    the ``staged`` tokens (page-table entries × page size)."""
    reads = sum(-(-q * heads // block_m) * k for q, k in zip(qo_lens, kv_tokens))
    return reads / staged if staged else 0.0


def stage_fp8(target: Target | None, kv_dtype: torch.dtype, reuse: float) -> bool:
    """Whether an FP8 batch whose row tiles read each KV token ``reuse`` times (see
    :func:`stage_reuse`) runs faster staged in fp16 on ``target``: its table's
    ``stage_min_reuse``."""
    least = config_table(target).stage_min_reuse
    return kv_dtype.itemsize == 1 and least is not None and reuse >= least


def tile_for_variant(
    name: str, rows: int, kv_dtype: torch.dtype, target: Target | None
) -> KernelConfig:
    """The tile a variant named in ``plan(kernel_config=name)`` runs in: the table's choice
    for these rows when it is that variant, else the first tile of that variant in the chain
    (for a variant that takes one row tile per request, the first that holds ``rows``)."""
    variant = get_variant(name)  # raises for an unknown name
    chain = config_table(target).chain()
    for table in chain:
        config = table.pick(rows, kv_dtype)
        if config.variant == name:
            return config
    tiles = [
        config
        for table in chain
        for config in (table.tiny_fp8, table.few_fp8, table.many_fp8, table.wide_fp8,
                       table.row_tiles_fp8, table.tiny_16bit, table.few_16bit, table.many_16bit,
                       table.wide_16bit, table.shared_16bit, table.unsplit_fp8, table.multi_fp8)
        if config is not None and config.variant == name
    ]  # fmt: skip
    holding = [c for c in tiles if c.block_m >= rows] if variant.one_row_tile else tiles
    if holding or tiles:
        return (holding or tiles)[0]  # (none holds the rows: make_launch_plan says why)
    where = target.name if target is not None else "sm90"
    raise ValueError(f"expected a KernelConfig for variant {name!r}: {where}'s tables have none")


@functools.lru_cache(maxsize=16)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device``; a small nominal count for the CPU interpreter."""
    if device.type == "cuda":
        return sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return 8


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
    long contexts; the kernel leaves surplus splits empty when a request is short. Below the
    variant's ``min_split_tokens`` a split costs more in the merge than it buys."""
    slots = sms * (config.occupancy if config is not None else 1)
    splits = max(1, slots // max(work_items, 1))
    if max_kv_len is not None:
        min_tokens = get_variant(config.variant).min_split_tokens if config else 128
        splits = min(splits, max(1, max_kv_len // min_tokens))
    return max(1, min(splits, MAX_SPLITS, max_splits_by_workspace))


def make_launch_plan(
    *,
    batch: int,
    num_heads: int,
    max_qo_len: int,
    max_kv_len: int | None,
    sms: int,
    max_splits_by_workspace: int,
    target: Target | None,
    kv_dtype: torch.dtype = torch.float8_e4m3fn,
    num_splits: int | None = None,
    config: KernelConfig | str | None = None,
    head_dim_kpe: int = 64,
    q_dtype: torch.dtype = torch.bfloat16,
    portable: bool = False,
) -> LaunchPlan:
    """Variant, tile and grid of one launch on ``target`` (None: the H200 the SM90 table was
    measured on). ``config`` overrides the table (a :class:`KernelConfig`, or a variant name
    run in its table tile) and raises when its variant cannot serve the batch there.
    ``portable``: the batch needs what only the portable Triton kernels offer (FP8 queries
    with an fp16 output; the Gluon kernels write bf16): row tiles up to 64 rows a request,
    the value split above, in their tables' tiles."""
    rows = max_qo_len * num_heads
    chosen = config is None
    if config is None and portable:
        config = "rows" if rows <= 64 else "vsplit"
    if config is None:
        config = choose_config(rows, kv_dtype, target, head_dim_kpe, q_dtype)
    else:
        if isinstance(config, str):
            config = tile_for_variant(config, rows, kv_dtype, target)
        why = get_variant(config.variant).reason_against(
            config, target or MEASURED, kv_dtype, rows, head_dim_kpe
        )
        if why is not None:
            raise ValueError(
                f"expected a kernel config that serves this batch, got {config.variant} ({why})"
            )
    m_tiles = max(1, -(-rows // config.block_m))
    auto_splits = num_splits is None
    if num_splits is None:
        num_splits = choose_splits(
            batch * m_tiles * get_variant(config.variant).programs_per_tile,
            max_kv_len,
            sms,
            max_splits_by_workspace,
            config,
        )
    refine = get_variant(config.variant).refine
    if refine is not None:  # the variant's own rule (variants.py)
        batch_view = PlannedBatch(
            rows=rows, batch=batch, m_tiles=m_tiles, num_splits=num_splits,
            max_kv_len=max_kv_len, q_dtype=q_dtype, sms=sms, chosen=chosen,
            auto_splits=auto_splits, tables=config_table(target).chain(),
        )  # fmt: skip
        config, m_tiles, num_splits = refine(config, batch_view)
    rows_per_request = m_tiles * config.block_m
    variant = get_variant(config.variant)
    half = num_splits > 1 and variant.half_partials
    block_d = merge_block_d(rows_per_request * batch, sms)
    return LaunchPlan(
        config=config,
        m_tiles=m_tiles,
        num_splits=num_splits,
        merge_block_d=block_d,
        half_partials=half,
        merge_warps=merge_warps(block_d, half),
        merge_waits=num_splits > 1
        and variant.launches_dependents
        and (target or MEASURED).dependent_launch,
        attention_waits=variant.launches_dependents
        and (target or MEASURED).dependent_launch
        and os.environ.get("FP8MLA_DEPENDENT_LAUNCH", "1") != "0",
    )


MERGE_VALUES_PER_PROGRAM = 8192  # partial values one merge program loads at once (64 a thread)


def merge_block_s(num_splits: int, block_d: int, warps: int = 4, half: bool = False) -> int:
    """Splits the merge reads at once for ``block_d`` columns: as many as 64 values a thread
    allow (8192 per program of 4 warps; 128 fp16 values, which take half the registers until
    they are widened), so that a narrow merge of many splits is one round trip to the L2
    instead of one per 16 splits (one request of 32 heads, 64 splits, 128 columns: four
    dependent passes became one)."""
    pow2 = 1 << max(0, num_splits - 1).bit_length()
    values = MERGE_VALUES_PER_PROGRAM * warps // 4 * (2 if half else 1)
    return min(pow2, max(1, values // block_d))


def merge_warps(block_d: int, half_partials: bool) -> int:
    """Warps per merge program: 4, or with fp16 partials one per 256 columns (at least 256).
    Triton gives each thread 16 bytes of a row, 8 fp16 values: with 4 warps a 512-column
    program of fp16 partials spread its splits over two warps, and the sum over splits went
    through shared memory, twice as slow."""
    if half_partials and block_d >= 256:
        return block_d // 256
    return 4


def merge_block_d(rows: int, sms: int) -> int:
    """Output columns per program of the split merge for ``rows`` query rows: all 512 when
    that gives two programs per SM (many small programs cost more than they spread: 64 × 16
    rows merged 4× slower in 128-column programs on the H200), else down to 128 so that a
    small batch still spreads (one request of 32 heads)."""
    for block in (512, 256):
        if rows * (512 // block) >= 2 * sms:
            return block
    return 128
