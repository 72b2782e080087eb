"""The attention kernel variants, in one registry.

Every variant computes the same function with the same arguments (``kernels/portable/rows.py``
documents them): paged MLA attention of ``BLOCK_M`` query rows of one request over one KV split.
They differ in how the work is laid out on the hardware. A :class:`Variant` says which kernel it
is, where it can run (:attr:`Variant.supports`), which tiles it takes (:attr:`Variant.check_tile`),
how its grid is shaped and, where it has one, its own rule for handing a batch the tables gave
it to another tile (:attr:`Variant.refine`). The planner (``planner.py``) picks a
:class:`KernelConfig` from its per-target tables and asks the registry whether the variant serves
the batch; the launcher, the compile matrix, the tuning script and the tests all read this one
table.

Adding a variant: one kernel module and one :func:`register` call here
(``docs/adding_a_kernel.md``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from fp8mla.attention.config import KernelConfig
from fp8mla.attention.targets import Target

# supports(target, kv_dtype, rows, head_dim_kpe) -> why not, or None
SupportRule = Callable[[Target, torch.dtype, int, int], "str | None"]
TileRule = Callable[[KernelConfig], "str | None"]


@dataclass(frozen=True)
class PlannedBatch:
    """What a variant's own rule (:attr:`Variant.refine`) sees of a batch once the planner has
    its tile and split count."""

    rows: int  # query rows per request (query tokens × heads)
    batch: int  # requests
    m_tiles: int  # row tiles per request in the config's tile
    num_splits: int
    max_kv_len: int | None  # None: lengths unknown at plan time (CUDA graphs)
    q_dtype: torch.dtype
    sms: int
    chosen: bool  # the tables chose the config (False: the caller named it)
    auto_splits: bool  # the planner chose num_splits (False: the caller did)
    tables: Sequence  # the target's ConfigTable chain (planner.ConfigTable), first tried first


# refine(config, batch) -> (config, m_tiles, num_splits): the variant's own choice for a batch
RefineRule = Callable[[KernelConfig, PlannedBatch], "tuple[KernelConfig, int, int]"]
# alternatives(config, tables, rows) -> the other tiles its refine rule can hand a batch to
AlternativesRule = Callable[[KernelConfig, Sequence, int], "list[KernelConfig]"]


@dataclass(frozen=True)
class Variant:
    """One kernel variant: its name, its kernel and what it needs."""

    name: str
    kernel: str  # "module:function"
    summary: str
    supports: SupportRule
    check_tile: TileRule
    programs_per_tile: int = 1  # programs along the grid's first axis per row tile
    gluon: bool = False  # pipeline written out in the kernel (no num_stages); no interpreter
    min_split_tokens: int = 128  # fewest KV tokens worth a split of their own
    # the kernel lets its split merge be scheduled before it ends (griddepcontrol, SM90):
    # the planner launches the merge as its programmatic dependent only then
    launches_dependents: bool = False
    # one row tile per request: a program takes rows 0 … BLOCK_M - 1 of its request and no
    # grid axis carries a row-tile index, so a tile must hold all of a request's query rows
    one_row_tile: bool = False
    # its split partials are fp16: the kernel stores o / l without the V scale (averages of
    # FP8 values, within fp16's range) and the V scale beside them as one factor for the
    # merge (workspace.Partials)
    half_partials: bool = False
    # the variant's own rule, after the tables chose it and the split count is known: the
    # batch may go to another tile (alternatives lists those, for the compile matrix)
    refine: RefineRule | None = None
    alternatives: AlternativesRule | None = None
    # the kernel has an FP8-query build (``Q_FP8``): it reads e4m3 queries and their scale
    # itself. Queries of FP8 plans for any other kernel are converted to bf16 first, in one
    # fused pass (attention/query.py): on SM90 the Gluon kernels, fed that way, are the fast
    # path (the portable kernel is ~2.5x slower than they are at 128 heads on the H200)
    # until a Gluon FP8-query build is measured (docs/design/fp8-queries.md)
    fp8_queries: bool = False
    # the kernel has a Gluon FP8-query build that a plan can name
    # (``plan(kernel_options={"Q_FP8": 2})``): it reads the codes in FP8 wgmma
    fp8_queries_on_request: bool = False
    # ... and the planner sends FP8 queries to that build unasked: it was measured faster
    # than converting them to bf16 for the kernel (docs/design/fp8-queries.md); without
    # this, FP8 queries for the kernel are converted unless a plan names the build
    fp8_queries_planned: bool = False
    # compile-time options of the kernel's FP8-query build, measured for it (a plan's
    # kernel_options still override them)
    fp8_query_options: tuple[tuple[str, int], ...] = ()

    def load(self):
        """The ``@triton.jit`` / ``@gluon.jit`` function (imported on first use)."""
        module, name = self.kernel.split(":")
        return getattr(importlib.import_module(module), name)

    def reason_against(
        self, config: KernelConfig, target: Target, kv_dtype: torch.dtype, rows: int, kpe: int
    ) -> str | None:
        """Why ``config`` of this variant cannot serve the batch on ``target``, or None."""
        why = self.check_tile(config) or self.supports(target, kv_dtype, rows, kpe)
        if why is None and self.one_row_tile and rows > config.block_m:
            why = (
                f"takes one row tile per request: a {config.block_m}-row tile cannot hold "
                f"{rows} query rows (heads × query tokens)"
            )
        return why


REGISTRY: dict[str, Variant] = {}


def register(variant: Variant) -> Variant:
    if variant.name in REGISTRY:
        raise ValueError(f"expected a new variant name, got {variant.name!r} twice")
    REGISTRY[variant.name] = variant
    return variant


def get_variant(name: str) -> Variant:
    if name not in REGISTRY:
        raise ValueError(f"expected a kernel variant in {sorted(REGISTRY)}, got {name!r}")
    return REGISTRY[name]


def tile_name(config: KernelConfig) -> str:
    """``16x64 rows``: the tile's rows × KV tokens and its variant's name."""
    get_variant(config.variant)  # raises for an unknown name
    return f"{config.block_m}x{config.block_n} {config.variant}"


# -- support rules --------------------------------------------------------------------------


def _anywhere(target: Target, kv_dtype: torch.dtype, rows: int, kpe: int) -> str | None:
    return None


def _any_tile(config: KernelConfig) -> str | None:
    return None


GLUON_MIN = (3, 6)  # the Triton release the Gluon kernels are built and tested with


@functools.cache
def gluon_missing() -> str | None:
    """Why this Triton cannot build the Gluon kernels (older than :data:`GLUON_MIN`, or
    without ``triton.experimental.gluon``), or None."""
    import triton

    version = triton.__version__
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return f"needs Triton {GLUON_MIN[0]}.{GLUON_MIN[1]} or later, got version {version!r}"
    if (major, minor) < GLUON_MIN:
        return f"needs Triton {GLUON_MIN[0]}.{GLUON_MIN[1]} or later (Gluon), got {version}"
    if importlib.util.find_spec("triton.experimental.gluon") is None:
        return f"needs Triton's Gluon (triton.experimental.gluon), missing from {version}"
    return None


def _sm90_rope(target: Target, kv_dtype: torch.dtype, rows: int, kpe: int) -> str | None:
    """The Gluon kernels: SM90, a 64-dim RoPE part, a Triton with Gluon; FP8 pools converted,
    16-bit copied."""
    if target.backend != "cuda" or target.arch != 90:
        return f"needs an SM90 GPU (Gluon wgmma), got {target.name}"
    missing = gluon_missing()
    if missing is not None:
        return missing
    if kpe != 64:
        return f"needs a 64-dim RoPE part, got head_dim_kpe {kpe}"
    return None


FEW_ROWS_MAX = 32


def _sm90_rope_few(target: Target, kv_dtype: torch.dtype, rows: int, kpe: int) -> str | None:
    if rows > FEW_ROWS_MAX:
        return f"serves at most {FEW_ROWS_MAX} query rows per request, got {rows}"
    return _sm90_rope(target, kv_dtype, rows, kpe)


def _sm90_fp8(target: Target, kv_dtype: torch.dtype, rows: int, kpe: int) -> str | None:
    if kv_dtype.itemsize != 1:
        return f"reads FP8 pools only, got {kv_dtype}"
    return _sm90_rope(target, kv_dtype, rows, kpe)


def _sm90_16bit(target: Target, kv_dtype: torch.dtype, rows: int, kpe: int) -> str | None:
    if kv_dtype.itemsize != 2:
        return f"reads 16-bit pools only (its tiles are copied, not converted), got {kv_dtype}"
    return _sm90_rope(target, kv_dtype, rows, kpe)


def _fixed_tile(block_m: int, block_n: int, warps: int) -> TileRule:
    """The rule of a kernel written for one tile shape and warp count."""

    def rule(config: KernelConfig) -> str | None:
        if (config.block_m, config.block_n, config.num_warps) != (block_m, block_n, warps):
            return (
                f"takes {block_m} × {block_n} tiles and {warps} warps, got {config.block_m} × "
                f"{config.block_n} and {config.num_warps} warps"
            )
        return None

    return rule


def _tile_few(config: KernelConfig) -> str | None:
    if config.block_m not in (16, 32) or config.block_n != 64 or config.num_warps != 4:
        return (
            f"takes 16- or 32-row tiles of 64 tokens and 4 warps, got {config.block_m} × "
            f"{config.block_n} and {config.num_warps} warps"
        )
    return None


# -- the variants ---------------------------------------------------------------------------

ROWS = register(
    Variant(
        name="rows",
        kernel="fp8mla.kernels.portable.rows:mla_rows_kernel",
        summary="Triton; S = Q·Kᵀ then O += P·V with the query rows as M (any target); "
        "FP8 queries read as they are (e4m3 × e4m3 dots on SM89+)",
        supports=_anywhere,
        check_tile=_any_tile,
        fp8_queries=True,
    )
)
VSPLIT = register(
    Variant(
        name="vsplit",
        kernel="fp8mla.kernels.portable.vsplit:mla_vsplit_kernel",
        summary="Triton; two programs per row tile, each with half of the 512 output columns "
        "(many rows: the accumulator fits in registers); FP8 queries as in rows",
        supports=_anywhere,
        check_tile=_any_tile,
        programs_per_tile=2,
        fp8_queries=True,
    )
)
WGMMA = register(
    Variant(
        name="wgmma",
        kernel="fp8mla.kernels.sm90.wgmma:mla_wgmma_kernel",
        summary="Gluon, SM90; a producer warpgroup converts FP8 tiles into fp16 shared memory "
        "(or copies 16-bit tiles by cp.async), two consumer warpgroups split the columns of "
        "Q·Kᵀ and of the output (many rows)",
        supports=_sm90_rope,
        check_tile=_fixed_tile(64, 64, 8),
        gluon=True,
    )
)
PINGPONG = register(
    Variant(
        name="pingpong",
        kernel="fp8mla.kernels.sm90.pingpong:mla_pingpong_kernel",
        summary="Gluon, SM90; two consumer warpgroups take alternate 32-token KV tiles (one's "
        "softmax beside the other's products), each holding half of the output columns; a "
        "producer warpgroup converts FP8 tiles into fp16 shared memory or copies 16-bit tiles "
        "(many rows)",
        supports=_sm90_rope,
        check_tile=_fixed_tile(64, 32, 4),
        gluon=True,
    )
)
PINGPONG64 = register(
    Variant(
        name="pingpong64",
        kernel="fp8mla.kernels.sm90.pingpong:mla_pingpong_kernel",
        summary="Gluon, SM90; the ping-pong kernel on 64-token tiles of 16-bit pools: two "
        "buffers, each column half refilled as soon as the warpgroup holding those output "
        "columns is done with it and handed over by its own copies' arrivals (the query read "
        "from shared memory once per 64 tokens)",
        supports=_sm90_16bit,
        check_tile=_fixed_tile(64, 64, 4),
        gluon=True,
    )
)
PINGPONG8 = register(
    Variant(
        name="pingpong8",
        kernel="fp8mla.kernels.sm90.pingpong8:mla_pingpong8_kernel",
        summary="Gluon, SM90, FP8 pools; the ping-pong order on 64-token FP8 tiles staged by "
        "cp.async as they are: Q·Kᵀ in FP8 × FP8 wgmma with the query's hi and lo parts in "
        "one accumulator chain (e4m3 queries: their codes, one operand), each consumer "
        "converting its 256 value columns into wgmma's register operand (many rows)",
        supports=_sm90_fp8,
        check_tile=_fixed_tile(64, 64, 4),
        gluon=True,
        launches_dependents=True,
        fp8_queries_on_request=True,
        fp8_queries_planned=True,
        # four stages in the room the e4m3 query's one operand leaves: at three, ptxas
        # serializes the FP8-query build's wgmma for want of registers; at four it is
        # pipelined, and faster (docs/design/fp8-queries.md)
        fp8_query_options=(("STAGES", 4),),
    )
)
FEWROWS = register(
    Variant(
        name="fewrows",
        kernel="fp8mla.kernels.sm90.fewrows:mla_fewrows_kernel",
        summary="Gluon, SM90; KV tokens as wgmma's M and ≤ 32 query rows as N, two producers "
        "convert FP8 tiles into fp16 shared memory, or one copies 16-bit tiles by cp.async "
        "(decode of 16-32 heads)",
        supports=_sm90_rope_few,
        check_tile=_tile_few,
        gluon=True,
        min_split_tokens=64,
        launches_dependents=True,
        one_row_tile=True,
    )
)
# the share of the SMs the table's unsplit_fp8 tile must fill for a batch of the FP8 × FP8
# kernel's row tiles to take it instead (one program per SM, no KV split: a partial wave costs
# more than splits do)
UNSPLIT_FILL = 0.9


def _fp8qk_refine(config: KernelConfig, b: PlannedBatch) -> tuple[KernelConfig, int, int]:
    """The FP8 × FP8 kernel's rule. Its query's e4m3 ``hi + lo/16`` split holds 8 significant
    bits: a bf16 value exactly, not an fp16 one, so other queries go to the few-row kernel of
    the same tile (a named ``fp8qk`` with them is refused). One 64-token tile per program of
    one row tile also goes there (the FP8 × FP8 kernel's longer start loses; the few-row
    kernel has no row-tile axis: same grid, same splits). Requests of more rows than the
    table's ``unsplit_fp8`` tile whose programs fill :data:`UNSPLIT_FILL` of the SMs without
    KV splits take that tile, unsplit (``docs/design/planner.md``)."""
    if b.q_dtype != torch.bfloat16 and not b.chosen:
        raise ValueError(
            f"expected bf16 queries for the fp8qk kernel (its e4m3 split holds 8 "
            f"significant bits), got {b.q_dtype}"
        )
    one_tile_programs = b.max_kv_len is not None and b.max_kv_len <= b.num_splits * config.block_n
    if b.chosen and b.m_tiles == 1 and (b.q_dtype != torch.bfloat16 or one_tile_programs):
        return dataclasses.replace(config, variant="fewrows"), b.m_tiles, b.num_splits
    unsplit = _unsplit_tile(config, b.tables) if b.chosen and b.auto_splits else None
    if unsplit is not None and b.rows > unsplit.block_m:
        tiles = -(-b.rows // unsplit.block_m)
        if b.batch * tiles >= UNSPLIT_FILL * b.sms:
            return unsplit, tiles, 1
    return config, b.m_tiles, b.num_splits


def _unsplit_tile(config: KernelConfig, tables: Sequence) -> KernelConfig | None:
    """The ``unsplit_fp8`` tile of the table whose FP8 row tiles ``config`` is, or None."""
    for table in tables:
        if table.row_tiles_fp8 == config and table.unsplit_fp8 is not None:
            return table.unsplit_fp8
    return None


def _fp8qk_alternatives(config: KernelConfig, tables: Sequence, rows: int) -> list[KernelConfig]:
    """The tiles :func:`_fp8qk_refine` can hand a batch of ``rows`` rows a request to."""
    out = [dataclasses.replace(config, variant="fewrows")]
    unsplit = _unsplit_tile(config, tables)
    if unsplit is not None and rows > unsplit.block_m:
        out.append(unsplit)
    return out


FP8QK = register(
    Variant(
        name="fp8qk",
        kernel="fp8mla.kernels.sm90.fp8qk:mla_fp8qk_kernel",
        summary="Gluon, SM90, FP8 pools; a cp.async copier stages FP8 tiles as they are, Q·Kᵀ "
        "in FP8 × FP8 wgmma with the query split hi/lo (e4m3 queries: their codes, zero lo), "
        "two value warpgroups convert V into wgmma's register operand (decode; more than 32 "
        "rows a request in 32-row tiles)",
        supports=_sm90_fp8,
        check_tile=_tile_few,
        gluon=True,
        min_split_tokens=64,
        launches_dependents=True,
        half_partials=True,
        fp8_queries_on_request=True,
        # faster than the converted route at every case the planner gives it, at the same
        # error (docs/design/fp8-queries.md, run s6b)
        fp8_queries_planned=True,
        refine=_fp8qk_refine,
        alternatives=_fp8qk_alternatives,
    )
)
