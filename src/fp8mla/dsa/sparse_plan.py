"""Launch planning for sparse MLA attention: the tile per target family, the head groups, the
split of each token's index list and the merge's blocks.

Pure host arithmetic on ``(tokens, heads, topk)`` -- the plan never reads the indices, so one
plan serves every step of that shape, captured in a CUDA graph or not. The tiles live in ONE
table per target family (:data:`SPARSE_TABLES`, chosen as ``fp8mla.attention.planner`` chooses
its own), picked by head count; the split count then fills the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp8mla.attention.targets import INTERPRETER, KB, Target

MAX_SPLITS = 64
MAX_TOPK = 16384
MERGE_VALUES_PER_PROGRAM = 8192  # partial values one merge program loads at once


@dataclass(frozen=True)
class SparseTile:
    """``block_h`` heads of one query token per program, ``block_n`` index-list entries per
    step, with ``num_warps`` warps and ``num_stages`` pipeline stages; ``occupancy``: programs
    per SM (CU) the split count aims for."""

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    occupancy: int = 1
    value_split: int = 1  # 2: two programs per head group, each 256 of the output columns

    @property
    def name(self) -> str:
        mark = "v" if self.value_split > 1 else ""
        occ = f"o{self.occupancy}" if self.occupancy > 1 else ""
        return f"{self.block_h}x{self.block_n}{mark} w{self.num_warps}s{self.num_stages}{occ}"

    def max_registers(self, warp_size: int = 32) -> int | None:
        """Registers per thread that leave room for ``occupancy`` programs per SM (64K on
        every CUDA target; ptxas's ``maxnreg``), or None when that is the hardware's 255."""
        if self.occupancy <= 1:
            return None
        cap = 65536 // (self.occupancy * self.num_warps * warp_size)
        cap -= cap % 8  # ptxas allocates in steps of 8
        return cap if cap < 255 else None


@dataclass(frozen=True)
class SparseTable:
    """The tiles of one target family by heads per query token: up to 16, up to 32, up to 64,
    more (None: the 64-head tile, two head groups side by side in the grid, so that the second
    reads the token's rows from the L2). ``min_split_entries``: the fewest index-list entries
    worth a split of their own (the merge costs more below)."""

    heads16: SparseTile
    heads32: SparseTile
    heads64: SparseTile
    heads128: SparseTile | None = None
    min_split_entries: int = 64
    # SM90: bf16 queries over the packed cache take the FP8 × FP8 decode kernel
    # (``sparse_sm90.py``: the Gluon kernel of the dense path, each token a request of its own
    # index list) from this many heads on (None: never), the tiles above the rest
    fp8qk_from_heads: int | None = None
    # ... and the FP8 ping-pong kernel (64-row tiles, ``kernels/sm90/pingpong8.py``) from this
    # many heads on (None: only when a plan names it)
    pingpong8_from_heads: int | None = None
    # ... and the 16-bit ping-pong kernel (64-row tiles, each row converted to fp16 once a tile
    # by its producer: ``kernels/sm90/pingpong.py``) at (heads, query tokens) pairs: a call of
    # at least that many heads and tokens takes it (none: only when a plan names it). Its
    # 64-row programs are half as many as the FP8 x FP8 kernel's 32-row ones, and a short
    # list splits into fewer of them, so a small batch fills less of the GPU
    pingpong_from: tuple[tuple[int, int], ...] = ()
    # the portable kernel's e4m3 decoding where a plan asks for "auto"
    # (``attention.launch.fp8_conversion``'s choices)
    fp8_cvt: str = "auto"
    # bf16 queries over the packed cache take the fp16 copy of the referenced rows and the
    # dense 16-bit kernels (``sparse_copy.py``) at (heads, list entries) pairs: a call of at
    # least that many heads and tokens × topk entries takes it (none: only when a plan names
    # it). Prefill chunks, whose tokens choose the same rows again and again
    copy16_from: tuple[tuple[int, int], ...] = ()

    def pick(self, num_heads: int) -> SparseTile:
        if num_heads <= 16:
            return self.heads16
        if num_heads <= 32:
            return self.heads32
        if num_heads <= 64 or self.heads128 is None:
            return self.heads64
        return self.heads128

    def tiles(self) -> list[SparseTile]:
        """Every tile the table can choose (what the compile matrix builds)."""
        tiles = (self.heads16, self.heads32, self.heads64, self.heads128)
        return list(dict.fromkeys(t for t in tiles if t is not None))


# Compiled for every target (docs/sparse.md has the report), not yet timed: H200 measurements
# will replace these choices. Rule: no more than 128 B of spill per thread (RDNA3 excepted:
# every tile spills there), then the most programs per SM, then the widest KV step -- the
# memory-bound cases (16-32 heads) want many loads in flight, the compute-bound ones (64-128
# heads) fewer conversions of each tile. Value-split tiles ("v") compute the scores twice (two
# programs, 256 output columns each): a 64-row tile's full-width accumulator spills everywhere.
SPARSE_TABLES: dict[str, SparseTable] = {
    # SM90/SM100 (227 KB): 16 heads three programs of 4 warps per SM (168 registers; 74 KB);
    # 64 and 128 heads in wgmma-sized tiles (Triton lowers their dots to wgmma on SM90).
    # SM90's portable tiles timed on an H100 (benchmarks/tune_sparse.py, design/sparse-runs.md,
    # s13b): the table's 16- and 32-head tiles were the fastest candidates, 128 heads run
    # faster as two 64-head groups, and ``cvt`` decodes faster than the integer moves
    "sm90": SparseTable(
        heads16=SparseTile(16, 32, 4, 2, occupancy=3),
        heads32=SparseTile(32, 32, 8, 2),
        heads64=SparseTile(64, 16, 4, 3, occupancy=2, value_split=2),
        fp8qk_from_heads=1,
        # 64 heads from 128 tokens on and 128 heads from 64: the 16-bit ping-pong kernel, a row
        # converted once a 64-row program, faster than the FP8 x FP8 kernel there
        # (design/sparse-pingpong16.md, runs s21a and s22a); smaller batches split into fewer
        # of its programs, which leave SMs idle (32 tokens of 128 heads, 32 of 64, one token:
        # fp8qk faster)
        pingpong_from=((64, 128), (128, 64)),
        fp8_cvt="ptx",
        # prefill: the 16-bit kernel over the copy, the copy included, is faster than the
        # FP8 x FP8 kernel at 128 heads from 1,024 tokens of 2,048 entries and at 64 heads
        # from 4,096 (level at 2,048, slower at 1,024: the copy costs as much, the attention
        # it saves is half as long; design/sparse.md)
        copy16_from=((128, 1 << 21), (64, 1 << 23)),
    ),
    "sm100": SparseTable(
        heads16=SparseTile(16, 32, 4, 2, occupancy=3),
        heads32=SparseTile(32, 32, 8, 2),
        heads64=SparseTile(64, 16, 4, 3, occupancy=2, value_split=2),
        heads128=SparseTile(128, 16, 8, 2, value_split=2),
    ),
    # SM80 (163 KB, mma.sync): a 64-row value split spills ~570 B there; 32-head groups instead
    "smem163": SparseTable(
        heads16=SparseTile(16, 32, 4, 2, occupancy=2),
        heads32=SparseTile(32, 16, 4, 3, occupancy=2),
        heads64=SparseTile(32, 32, 8, 2),
    ),
    # SM86/89/120 (99 KB): one program per SM whatever the tile; 32-head groups above 32 heads
    "smem99": SparseTable(
        heads16=SparseTile(16, 32, 4, 2),
        heads32=SparseTile(32, 16, 8, 2),
        heads64=SparseTile(32, 16, 8, 2),
    ),
    # CDNA (wave64, 64 KB LDS; 512 VGPRs with the accumulation registers): nothing spills
    "wave64": SparseTable(
        heads16=SparseTile(16, 32, 4, 2),
        heads32=SparseTile(32, 16, 4, 1),
        heads64=SparseTile(64, 16, 4, 1, value_split=2),
    ),
    # RDNA3 (wave32, 256 VGPRs): WMMA holds 16 values per lane per 16×16 operand tile, so the
    # queries alone outgrow the registers; the smallest tile spills least (16-head groups)
    "wave32": SparseTable(
        heads16=SparseTile(16, 16, 8, 1),
        heads32=SparseTile(16, 16, 8, 1),
        heads64=SparseTile(16, 16, 8, 1),
    ),
    # Triton's CPU interpreter: small steps (its time grows with the tile), the GPUs' head
    # groups and value split, so that the same masks and groupings run there.
    "interpreter": SparseTable(
        heads16=SparseTile(16, 16, 4, 1),
        heads32=SparseTile(32, 16, 4, 1),
        heads64=SparseTile(64, 16, 4, 1, value_split=2),
        min_split_entries=16,
    ),
}


def sparse_table(target: Target | None) -> SparseTable:
    """The table of ``target``'s family (None: the H200, SM90)."""
    if target is None:
        return SPARSE_TABLES["sm90"]
    if target is INTERPRETER or target.backend == "interpreter":
        return SPARSE_TABLES["interpreter"]
    if target.is_hip:
        return SPARSE_TABLES["wave64" if target.warp_size == 64 else "wave32"]
    if target.smem_per_block >= 227 * KB:
        return SPARSE_TABLES["sm90" if int(target.arch) == 90 else "sm100"]
    return SPARSE_TABLES["smem163" if target.smem_per_block >= 163 * KB else "smem99"]


@dataclass(frozen=True)
class SparsePlan:
    """The launch of one ``(tokens, heads, topk)`` shape: ``tokens × num_splits ×
    head_groups × value_split`` programs of ``tile`` (1-D grid, value half fastest, then head
    group, then split), each over
    ``split_len`` entries of its token's list; with splits, a merge of ``merge_block_d``
    columns per program reading ``merge_block_s`` splits at once."""

    tile: SparseTile
    num_tokens: int
    num_heads: int
    topk: int
    head_groups: int
    num_splits: int
    split_len: int
    merge_block_d: int = 512
    merge_block_s: int = 1
    # "portable" (kernels/portable/sparse_mla.py), on SM90 "fp8qk", "pingpong8" or "pingpong"
    # (sparse_sm90.py), or "copy16" (sparse_copy.py: the dense 16-bit kernels over an fp16
    # copy of the referenced rows)
    kernel: str = "portable"

    @property
    def programs(self) -> int:
        return self.num_tokens * self.num_splits * self.head_groups * self.tile.value_split

    @property
    def split(self) -> bool:
        return self.num_splits > 1


def choose_splits(
    programs: int, topk: int, sms: int, tile: SparseTile, min_entries: int, most: int
) -> int:
    """Splits per token: as many as keep ``programs × splits`` within ``sms × occupancy``
    (whole waves: a partial extra wave costs more than the merge saves), none shorter than
    ``min_entries`` entries, at most ``most`` (the workspace's room) and ``MAX_SPLITS``."""
    slots = sms * tile.occupancy
    splits = max(1, slots // max(programs, 1))
    splits = min(splits, max(1, topk // max(min_entries, tile.block_n)))
    return max(1, min(splits, MAX_SPLITS, most))


def merge_blocks(rows: int, splits: int, sms: int) -> tuple[int, int]:
    """``(block_d, block_s)`` of the merge for ``rows`` output rows (tokens × heads): all 512
    columns per program when that still gives two programs per SM, else down to 128 so that a
    small batch spreads; every split read at once, within ``MERGE_VALUES_PER_PROGRAM`` values."""
    block_s = 1 << max(0, splits - 1).bit_length()
    block_d = 128
    for block in (512, 256):
        if rows * (512 // block) >= 2 * sms:
            block_d = block
            break
    while block_d > 32 and block_d * block_s > MERGE_VALUES_PER_PROGRAM:
        block_d //= 2
    return block_d, block_s


# the dense path's Gluon kernels a sparse plan can take
SM90_KERNELS = ("fp8qk", "pingpong8", "pingpong")
COPY16 = "copy16"  # the dense 16-bit kernels over an fp16 copy of the referenced rows


def copy16_route(
    kernel: str,
    target: Target | None,
    num_tokens: int,
    num_heads: int,
    topk: int,
    kv_dtype: torch.dtype,
) -> bool:
    """Whether a plan takes the fp16 copy of the referenced rows (``sparse_copy.py``): where
    named (``kernel="copy16"``: the packed cache, on any target the dense 16-bit kernels run,
    the interpreter included; ``ValueError`` for a 16-bit cache), or with ``"auto"`` where the
    target's table takes it for these heads and list entries."""
    if kernel == COPY16:
        if kv_dtype.itemsize != 1:
            raise ValueError(
                f'expected the packed FP8 cache for kernel "{COPY16}", got a {kv_dtype} cache'
            )
        return True
    if kernel != "auto" or kv_dtype.itemsize != 1 or target is None:
        return False
    entries = num_tokens * topk
    return any(num_heads >= h and entries >= e for h, e in sparse_table(target).copy16_from)


def sm90_kernel(
    kernel: str,
    target: Target | None,
    num_heads: int,
    q_dtype: torch.dtype,
    kv_dtype: torch.dtype,
    interpreted: bool,
    num_tokens: int = 1,
) -> str | None:
    """The SM90 Gluon kernel of the dense path a plan takes (``sparse_sm90.py``), or None for
    the portable kernel: the one asked for (``kernel`` in :data:`SM90_KERNELS`; ``ValueError``
    where it cannot serve) or, with ``"auto"``, the target's table's choice for these heads and
    query tokens.
    Both need SM90 with Gluon, bf16 queries and the packed cache."""
    from fp8mla.attention.variants import get_variant

    why = None
    if interpreted or target is None or target.backend != "cuda" or int(target.arch) != 90:
        why = "it runs on SM90 GPUs only"
    elif get_variant("fp8qk").supports(target, torch.float8_e4m3fn, 32, 64) is not None:
        why = get_variant("fp8qk").supports(target, torch.float8_e4m3fn, 32, 64)
    elif q_dtype != torch.bfloat16:
        why = f"its query split is exact for bf16 queries only, got {q_dtype}"
    elif kv_dtype.itemsize != 1:
        why = f"it reads the packed FP8 cache, got a {kv_dtype} cache"
    if kernel in SM90_KERNELS:
        if why is not None:
            raise ValueError(
                f'expected a batch the kernel "{kernel}" serves, got one it does not: {why}'
            )
        return kernel
    if kernel != "auto" or why is not None:
        return None
    table = sparse_table(target)
    if table.pingpong8_from_heads is not None and num_heads >= table.pingpong8_from_heads:
        return "pingpong8"
    if any(num_heads >= h and num_tokens >= t for h, t in table.pingpong_from):
        return "pingpong"
    if table.fp8qk_from_heads is not None and num_heads >= table.fp8qk_from_heads:
        return "fp8qk"
    return None


def make_sparse_plan(
    *,
    num_tokens: int,
    num_heads: int,
    topk: int,
    sms: int,
    target: Target | None,
    max_splits_by_workspace: int = MAX_SPLITS,
    num_splits: int | None = None,
    tile: SparseTile | None = None,
) -> SparsePlan:
    """The plan of ``num_tokens`` query tokens of ``num_heads`` heads, ``topk`` entries each,
    on ``target`` with ``sms`` multiprocessors. ``tile`` / ``num_splits`` override the table
    and the split count (tuning, tests); ``num_splits`` is capped by the entries (a split of
    no entry would only cost the merge)."""
    table = sparse_table(target)
    tile = tile or table.pick(num_heads)
    head_groups = -(-num_heads // tile.block_h)
    if num_splits is None:
        num_splits = choose_splits(
            num_tokens * head_groups * tile.value_split, topk, sms, tile, table.min_split_entries,
            max_splits_by_workspace,
        )  # fmt: skip
    num_splits = max(1, min(num_splits, -(-topk // tile.block_n)))
    per_split = -(-topk // num_splits)
    split_len = -(-per_split // tile.block_n) * tile.block_n
    num_splits = -(-topk // split_len)  # every split has entries
    block_d, block_s = merge_blocks(num_tokens * num_heads, num_splits, sms)
    return SparsePlan(
        tile=tile,
        num_tokens=num_tokens,
        num_heads=num_heads,
        topk=topk,
        head_groups=head_groups,
        num_splits=num_splits,
        split_len=split_len,
        merge_block_d=block_d,
        merge_block_s=block_s,
    )
