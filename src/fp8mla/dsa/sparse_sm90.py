"""Sparse MLA attention on SM90 through the dense path's Gluon kernels: the FP8 × FP8 decode
kernel (``kernels/sm90/fp8qk.py``) or, named by the plan, a ping-pong kernel of 64-row tiles
(many heads): the FP8 one (``kernels/sm90/pingpong8.py``) or the 16-bit one
(``kernels/sm90/pingpong.py``), whose producer warpgroup converts each row to fp16 once, times
its group scales, for both consumers' products.

A sparse query token is a paged-attention request of page size 1 whose page table is its own
index list. Where one program a split reads each list (a token's rows in one row tile) or each
split is one 64-token tile (the plan decides, :func:`plans_lists`), the cache's token rows
follow each other and the lists are ``topk`` entries apart, the dense SM90 kernel reads the
lists as the caller wrote them (``SPARSE_LISTS``: a -1 entry is no token, ``topk_length`` the
request's length); otherwise they are compacted first (``kernels/portable/sparse_compact.py``:
the entries a token attends to at the front, turned into rows, their count as the request's
length). The kernel reads the packed ``fp8_ds_mla`` rows in place -- the latent part's e4m3
bytes as its FP8 pool, the four float32 scales as its per-token, per-128-channel scales, the
bf16 RoPE part in its 16-bit RoPE mode (``ROPE_16BIT``). On the FP8 × FP8 kernel rows of 16 to
32 heads run as one tile a token, more heads as 32-row tiles; on the ping-pong kernels as 64-row
tiles (two a token at 128 heads), over compacted lists only. Long lists split over the GPU
with the dense split merge. The dense path's conventions (base-2 LSE, -inf for a token with
nothing to attend to) are turned into the sparse API's (natural log, +inf) here.

Only what the planner (``sparse_plan.py``) routes here: SM90, bf16 queries, the packed cache;
``run()`` takes a cache whose 656-byte token rows follow each other within a page and whose
page stride is a whole number of rows (the engines' caches; pages with a gap after them too:
the compaction turns slots into rows), and refuses another with a ``ValueError`` (plan
``kernel="portable"`` for it).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton

from fp8mla.attention.config import LaunchPlan
from fp8mla.attention.launch import AttentionLaunch
from fp8mla.attention.planner import device_sm_count, make_launch_plan
from fp8mla.attention.targets import launch_target
from fp8mla.attention.workspace import split_capacity, split_partials
from fp8mla.dsa.layout import NOPE_DIM, ROPE_DIM, ROPE_OFFSET, SCALE_OFFSET, TOKEN_BYTES
from fp8mla.dsa.sparse_plan import SM90_KERNELS as CONFIGS
from fp8mla.formats import Scales

# the ping-pong kernels of 64-row tiles (FP8 stages; fp16 tiles converted by the producer):
# every SM90 kernel a sparse plan takes but the FP8 × FP8 decode kernel
PINGPONG_CONFIGS = tuple(c for c in CONFIGS if c != "fp8qk")
COMPACT_MAX_BLOCK = 4096  # index-list entries per step of the compaction, at most
# 64-token tiles a split of a token's list may read for the plan to read the lists in place
# when a token's rows take several row tiles (each of which reads the list)
LIST_TILES_MAX = 1
LN2 = math.log(2.0)


def compact_shape(topk: int) -> tuple[int, int]:
    """``(BLOCK, num_warps)`` of the compaction for lists of ``topk`` entries: the whole list
    in one step up to 4,096 entries (each step is a load, a scan and a store in turn, on the
    attention's critical path), 16 entries a thread."""
    block = min(COMPACT_MAX_BLOCK, triton.next_power_of_2(max(1, topk)))
    return block, max(1, min(8, block // 512))


def plans_lists(topk: int, num_splits: int, row_tiles: int) -> bool:
    """Whether a plan reads the index lists in place, without the compaction's launch: where
    a token's rows are one row tile (up to 32 heads: one program a split reads each list),
    or each split of a token's list is at most ``LIST_TILES_MAX`` tiles (one token's decode,
    where the compaction is a fixed cost beside little work). Measured in place against
    compacted (``docs/design/sparse-runs.md``, run s8c): faster at 16 heads (decode and prefill)
    and at one token; at 128 heads (four 32-row tiles a token, each reading the list and
    copying its entries) 2% slower, and there the compaction stays."""
    return row_tiles == 1 or triton.cdiv(triton.cdiv(topk, num_splits), 64) <= LIST_TILES_MAX


def merges_in_grid(plan: LaunchPlan, num_tokens: int, sms: int) -> int:
    """Whether the FP8 × FP8 kernel over the index lists merges its splits in its own grid
    (``kernels/sm90/grid_merge.py``, a cooperative launch) instead of a merge launch: a
    split plan of one row tile a token whose programs, one an SM (their shared memory), fit
    the GPU at once: faster than the merge launch from two tokens on, level at one
    (design/sparse-one-token-runs.md, s13n). 2 where twice the programs fit twice over (this
    grid and the next one's, launched early as its dependent): a second program a split
    merges with it, each reading half the partials (one token:
    design/sparse-one-token-runs.md, s14p); 1 where only the programs fit; 0 otherwise.
    ``FP8MLA_MERGE_IN_GRID=0`` keeps the merge launch (a GPU shared with kernels that hold SMs
    for long)."""
    programs = num_tokens * plan.m_tiles * plan.num_splits
    if not (
        plan.config.variant == "fp8qk"
        and plan.num_splits > 1
        and plan.m_tiles == 1
        and programs <= sms
        and os.environ.get("FP8MLA_MERGE_IN_GRID", "1") != "0"
    ):
        return 0
    return 2 if 4 * programs <= sms else 1


@dataclass
class FP8QKSparse:
    """The attention launches of one sparse plan on SM90: over the compacted lists
    (``launch``) with the compaction's buffers, and where the plan reads the index lists as
    they are (:func:`plans_lists`) over those (``lists``)."""

    plan: LaunchPlan
    launch: AttentionLaunch
    compacted: torch.Tensor  # [num_tokens, topk] int32
    counts: torch.Tensor  # [num_tokens] int32
    topk: int
    compact: tuple[int, int]  # the compaction's (BLOCK, num_warps): compact_shape(topk)
    lists: AttentionLaunch | None
    full: torch.Tensor | None  # [num_tokens] int32 of topk: ``lists``' lengths by default


def fp8qk_sparse(
    num_tokens: int,
    num_heads: int,
    topk: int,
    sm_scale: float,
    workspace: torch.Tensor,
    device: torch.device,
    lists: bool | None = None,
    config: str = "fp8qk",
) -> FP8QKSparse:
    """Plan ``num_tokens`` query tokens of ``num_heads`` heads, each over its own ``topk``
    slots, on the dense kernel ``config`` (:data:`CONFIGS`): one request of page size 1 per
    token. The FP8 × FP8 kernel reads the index lists in place where :func:`plans_lists`
    (``lists``: True or False in its place); the ping-pong kernels read compacted lists
    only."""
    if config in PINGPONG_CONFIGS:
        if lists:
            raise ValueError(f'expected compacted lists (lists=None or False) for "{config}"')
        lists = False
    elif config != "fp8qk":
        raise ValueError(f"expected a config among {CONFIGS}, got {config!r}")
    compacted = torch.zeros(max(1, num_tokens * topk), dtype=torch.int32, device=device)
    counts = torch.zeros(num_tokens, dtype=torch.int32, device=device)
    target = launch_target(device, False)
    plan, partials, tokens = token_requests(num_tokens, num_heads, topk, workspace, device,
                                            target, torch.float8_e4m3fn, config)  # fmt: skip

    def attention(lists: bool, lengths: torch.Tensor, in_grid: int = 0) -> AttentionLaunch:
        return token_attention(
            plan, num_heads, sm_scale, tokens, topk, compacted, lengths, partials,
            torch.float8_e4m3fn, device, target,
            kernel_options=sparse_options(config, plan.attention_waits, lists),
            index_lists=lists, merge_in_grid=in_grid,
        )  # fmt: skip

    if lists is None:
        lists = plans_lists(topk, plan.num_splits, plan.m_tiles)
    full = in_place = None
    if lists:
        full = torch.full((max(1, num_tokens),), topk, dtype=torch.int32, device=device)
        in_place = attention(True, full, merges_in_grid(plan, num_tokens, device_sm_count(device)))
    compacted = compacted.view(max(1, num_tokens), -1)
    return FP8QKSparse(plan, attention(False, counts), compacted, counts, topk,
                       compact_shape(topk), in_place, full)  # fmt: skip


def token_requests(num_tokens: int, num_heads: int, topk: int, workspace: torch.Tensor,
                   device: torch.device, target, kv_dtype: torch.dtype,
                   config: str | None = None) -> tuple[LaunchPlan, object, torch.Tensor]:  # fmt: skip
    """The dense path's plan for ``num_tokens`` page-size-1 requests of up to ``topk`` entries
    (each a sparse query token of ``num_heads`` heads) on kernel ``config`` (None: the dense
    planner's choice for ``kv_dtype``), its split partials in ``workspace`` (None unsplit),
    and the requests' offsets ``0 … num_tokens`` (int32)."""
    tokens = torch.arange(num_tokens + 1, dtype=torch.int32, device=device)
    rows = num_tokens * num_heads
    plan = make_launch_plan(
        batch=num_tokens,
        num_heads=num_heads,
        max_qo_len=1,
        max_kv_len=topk,
        sms=device_sm_count(device),
        max_splits_by_workspace=max(1, split_capacity(workspace, 1, NOPE_DIM) // max(1, rows)),
        target=target,
        kv_dtype=kv_dtype,
        config=config,
        head_dim_kpe=ROPE_DIM,
        q_dtype=torch.bfloat16,
    )
    partials = None
    if plan.num_splits > 1:
        partials = split_partials(workspace, plan.num_splits, rows, NOPE_DIM, plan.half_partials)
    return plan, partials, tokens


def token_attention(plan: LaunchPlan, num_heads: int, sm_scale: float, tokens: torch.Tensor,
                    topk: int, lists: torch.Tensor, lengths: torch.Tensor, partials,
                    kv_dtype: torch.dtype, device: torch.device, target,
                    interpreted: bool = False, **options) -> AttentionLaunch:  # fmt: skip
    """The dense kernel's launch over :func:`token_requests`' requests: request ``t``'s page
    table is ``lists[t · topk :]`` (rows of a page-size-1 cache), ``lengths[t]`` entries long;
    ``options``: the launch's further keywords."""
    return AttentionLaunch(
        plan,
        batch=tokens.shape[0] - 1,
        heads=num_heads,
        head_dim_kpe=ROPE_DIM,
        page_size=1,
        causal=False,
        sm_scale=sm_scale,
        indices=(tokens, tokens * topk, lists, lengths),
        partials=partials,
        kv_dtype=kv_dtype,
        device=device,
        target=target,
        interpreted=interpreted,
        **options,
    )


def sparse_options(config: str, waits: bool, lists: bool = False) -> dict:
    """The sparse path's options of the dense kernel ``config``: :func:`fp8qk_options`, or
    for the ping-pong kernels the RoPE part in bf16 (a programmatic dependent of the
    compaction waits for it at its start, as the dense launches do: ``WAIT_PRIOR``, set by
    the launch)."""
    if config in PINGPONG_CONFIGS:
        return {"ROPE_16BIT": True}
    return fp8qk_options(waits, lists)


def fp8qk_options(waits: bool, lists: bool = False) -> dict:
    """The FP8 × FP8 kernel's options on the sparse path (the launches and the compile
    matrix's builds): the RoPE part in bf16. Over the index lists as they are (``lists``,
    ``SPARSE_LISTS``), a programmatic dependent (``waits``) waits for the grid before it
    before its first global read, as the dense launches do; over compacted lists, launched as
    the compaction's dependent, it stages the query before waiting for the compaction
    (``WAIT_PRIOR=2``: the compaction writes only the lists and their counts, and every grid
    before it had ended when it started)."""
    options = {"ROPE_16BIT": True}
    if lists:
        options["SPARSE_LISTS"] = True
    elif waits:
        options["WAIT_PRIOR"] = 2
    return options


def reads_lists(rows: CacheRows, indices: torch.Tensor, topk: int) -> bool:
    """Whether the attention reads ``indices`` as they are (no compaction): a slot is a row
    (the cache's token rows follow each other) and token ``t``'s list starts at entry
    ``t · topk`` (the kernel's page-table offsets, fixed at plan())."""
    return not rows.paged and (indices.shape[0] <= 1 or indices.stride(0) == topk)


@dataclass
class CacheRows:
    """The packed cache as the dense kernel's three inputs, page size 1 -- the latent e4m3 bytes
    ``[rows, 1, 512]``, the RoPE part's bytes ``[rows, 1, 128]`` (the kernel reads them as
    bf16), the scales ``[rows, 1, 4]`` float32, each a strided view of the cache -- and how the
    compaction turns a slot into a row (``paged`` False: the slot is the row)."""

    ckv: torch.Tensor
    kpe: torch.Tensor
    scales: torch.Tensor
    paged: bool
    page_size: int
    rows_per_page: int
    num_slots: int
    packed: torch.Tensor  # [rows, 656] uint8: the token rows the three views read


def cache_rows(view) -> CacheRows:
    """The packed cache (a ``TokenView`` or ``SparseCache`` of uint8 rows) as :class:`CacheRows`;
    ``ValueError`` for a cache whose token rows do not follow each other within a page or
    whose page stride is not a whole number of rows."""
    page_size, page_stride, token_stride = view.addressing()
    if (
        token_stride != TOKEN_BYTES
        or page_stride % TOKEN_BYTES
        or view.data.dtype != torch.uint8
        or view.data.stride(2) != 1
    ):
        raise ValueError(
            "expected a packed cache whose 656-byte token rows follow each other within a page "
            "and whose page stride is a whole number of rows for the SM90 sparse kernel, got "
            f"rows at {view.addressing()} (page size, page and token stride in bytes); plan "
            'kernel="portable" for it'
        )
    pages = view.data.shape[0]
    rows_per_page = page_stride // TOKEN_BYTES
    paged = rows_per_page != page_size
    # every row from the first page's first token to the last page's last one, gaps included
    n_rows = (pages - 1) * rows_per_page + page_size if paged else view.num_slots
    rows = view.data.as_strided((n_rows, TOKEN_BYTES), (TOKEN_BYTES, 1))
    ckv = rows[:, :NOPE_DIM].view(torch.float8_e4m3fn).unsqueeze(1)
    kpe = rows[:, ROPE_OFFSET:].unsqueeze(1)
    scales = rows.view(torch.float32)[:, SCALE_OFFSET // 4 : ROPE_OFFSET // 4].unsqueeze(1)
    return CacheRows(ckv, kpe, scales, paged, page_size, rows_per_page, view.num_slots, rows)


def run_fp8qk_sparse(
    s: FP8QKSparse,
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    view,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor | None,
) -> None:
    """The attention (and the split merge) over the index lists as they are where the plan
    reads them so and :func:`reads_lists`, else over the lists compacted first, into ``out``
    and, when given, ``lse`` in natural log (+inf for a token with nothing to attend to)."""
    c = cache_rows(view)
    scales = Scales(ckv=1.0, kpe=1.0, ckv_arr=c.scales)
    if s.lists is not None and reads_lists(c, indices, s.topk):
        lengths = topk_length if topk_length is not None else s.full
        s.lists(q_nope, q_pe, c.ckv, c.kpe, out, lse, scales, lists=(indices, lengths))
        natural_lse(lse)
        return
    compact_lists(s.compacted, s.counts, s.topk, indices, topk_length, c, s.plan.attention_waits)
    s.launch(q_nope, q_pe, c.ckv, c.kpe, out, lse, scales)
    natural_lse(lse)


def compact_lists(compacted, counts, topk, indices, topk_length, rows: CacheRows,
                  launch_next: bool = False) -> None:  # fmt: skip
    """Token ``t``'s entries of ``indices`` it attends to (within ``topk_length``, not -1)
    at the front of ``compacted[t]``, turned into rows of ``rows``, their number into
    ``counts[t]`` (``kernels/portable/sparse_compact.py``); ``launch_next``: the next grid may
    launch from this one's start (it waits for it)."""
    from fp8mla.kernels.portable.sparse_compact import sparse_compact_kernel

    n = counts.shape[0]
    block, warps = compact_shape(topk)
    sparse_compact_kernel[(n,)](
        indices, topk_length if topk_length is not None else indices, compacted, counts,
        indices.shape[0], topk, indices.stride(0), rows.num_slots, rows.page_size,
        rows.rows_per_page, HAS_TOPK_LENGTH=topk_length is not None, PAGED=rows.paged,
        BLOCK=block, LAUNCH_NEXT=launch_next, num_warps=warps,
    )  # fmt: skip


def natural_lse(lse: torch.Tensor | None) -> None:
    """The kernels' base-2 LSE in natural log; a token that saw nothing: +inf."""
    if lse is not None:
        lse.mul_(LN2).nan_to_num_(nan=float("nan"), posinf=float("inf"), neginf=float("inf"))


class FP8QKSparseLaunch:
    """The launch ``SparseMLAWrapper`` keeps for a plan on an SM90 kernel (``config`` among
    :data:`CONFIGS`): :func:`fp8qk_sparse` once, :func:`run_fp8qk_sparse` per call."""

    def __init__(self, num_tokens: int, num_heads: int, topk: int, sm_scale: float,
                 workspace: torch.Tensor, device: torch.device,
                 config: str = "fp8qk") -> None:  # fmt: skip
        self.sparse = fp8qk_sparse(num_tokens, num_heads, topk, sm_scale, workspace, device,
                                   config=config)  # fmt: skip

    def __call__(self, q_nope, q_pe, view, indices, topk_length, out, lse) -> None:
        run_fp8qk_sparse(self.sparse, q_nope, q_pe, view, indices, topk_length, out, lse)
