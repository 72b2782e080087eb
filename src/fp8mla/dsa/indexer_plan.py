"""Launch planning for the lightning indexer: the logits tile and dot mode per target family,
how a row's positions are cut among programs, and the top-k's chunks and merge levels.

Pure host arithmetic on shapes (never on lengths held on the device), so one plan serves every
step of a shape, captured in a CUDA graph or not.
"""

from __future__ import annotations

from dataclasses import dataclass

from fp8mla.attention.targets import INTERPRETER, Target

# fused="auto" takes the fused logits + top-k kernel only where the two-pass path's logits
# would take more than this many bytes of workspace (docs/design/indexer.md)
FUSED_MIN_LOGITS_BYTES = 1 << 30
MAX_TOPK = 8192
SELECT_ENTRIES = 8192  # candidates one top-k program holds at once (registers)
MIN_LOGITS_CHUNK = 512  # positions per logits program, at least
HIST_BITS = 11  # the histogram path's bins: the keys' top 11 bits (2,048 bins)


@dataclass(frozen=True)
class LogitsTile:
    """``block_n`` keys a step, ``num_warps`` warps, ``num_stages`` pipeline stages; ``dot``:
    how the e4m3 codes reach the dot (``"fp8"``: e4m3 × e4m3 tensor-core dot, ``"fp16"``:
    decoded exactly to fp16, ``"fp32"``: the interpreter)."""

    block_n: int
    num_warps: int
    num_stages: int
    dot: str

    @property
    def name(self) -> str:
        return f"{self.block_n} keys {self.dot} w{self.num_warps}s{self.num_stages}"


TOPK_PATHS = ("levels", "histogram", "digits", "auto")
DIGIT_MAX_CHUNKS = 64  # chunks a row the "auto" path gives the digits path at most


@dataclass(frozen=True)
class IndexerTable:
    """One target family's choices: the logits tile, the fused kernel's warps (its candidate
    lists live in its registers while they are compacted), the entries a top-k program holds
    per warp (at most ``max_warps`` warps), and the candidates one top-k program selects from
    (``select_entries``, a power of two: the first level's chunk and a merge's input)."""

    logits: LogitsTile
    fused_warps: int
    entries_per_warp: int
    max_warps: int
    select_entries: int = SELECT_ENTRIES
    # rows longer than one program's candidates: "levels" (chunks' exact top-k, merged level by
    # level), "histogram" (a threshold from the row's histogram of key bits, then one
    # selection over the keys above it), "digits" (the k-th key's four 8-bit digits, a grid
    # each over the row's chunks of digit_chunk columns, digit_warps warps a program, then
    # each chunk writes its share; all in kernels/portable/indexer_topk.py) or "auto" (the
    # digits where the levels' first grid has fewer programs than the GPU has SMs -- its later
    # levels have fewer still, each a long selection -- and a row has at most
    # DIGIT_MAX_CHUNKS chunks; else the levels: TopkPlan.path)
    topk_path: str = "levels"
    # how a top-k program finds its k-th key (kernels/portable/indexer_topk.kth_key): 0, two
    # bits a step (16 block-wide sums); else this many bits a step (a block-wide histogram of
    # 2^radix_bits bins each, which must be a multiple of the warp's lanes: >= 5 on 32-lane
    # warps, >= 6 on 64-lane)
    radix_bits: int = 0
    digit_chunk: int = 4096
    digit_warps: int = 8

    def __post_init__(self) -> None:
        if self.topk_path not in TOPK_PATHS:
            raise ValueError(f"topk_path {self.topk_path!r}: one of {TOPK_PATHS}")
        if self.radix_bits != 0 and not 5 <= self.radix_bits <= 11:
            raise ValueError(f"radix_bits {self.radix_bits}: 0, or 5 to 11 bits a step")
        for name in ("digit_chunk", "digit_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"{name} {v}: a power of two")


# Compiled for every target (docs/compile_matrix.md has the report). On the H200 the "fp8"
# table's top-k choices (8,192 candidates, 16 warps a program, the k-th key by 5-bit
# histogram steps) were timed against the other sizes, warp counts and steps and kept
# (docs/design/indexer.md); its logits tile was not swept.
# 64 keys a step is one page of the engines' caches.
INDEXER_TABLES: dict[str, IndexerTable] = {
    # SM89+ (e4m3 tensor-core dots): SM90/SM100 lower the dot to wgmma
    "fp8": IndexerTable(LogitsTile(64, 4, 3, "fp8"), 8, 512, 16, topk_path="auto", radix_bits=5),
    # SM80/86: no FP8 instructions, fp16 decoded by bit moves (inline PTX)
    "fp16": IndexerTable(LogitsTile(64, 4, 3, "fp16"), 8, 512, 16),
    # CDNA (wave64): the same bit moves in Triton integer ops
    "wave64": IndexerTable(LogitsTile(64, 4, 2, "fp16"), 8, 2048, 16),
    # RDNA3 (wave32): WMMA's operand tiles crowd the 256 VGPRs; 32 keys a step spill least
    "wave32": IndexerTable(LogitsTile(32, 8, 2, "fp16"), 8, 256, 32),
    # Triton's CPU interpreter: fp32 dots; few, wide programs (its time grows per program)
    "interpreter": IndexerTable(LogitsTile(64, 4, 1, "fp32"), 4, 1024, 16),
}


def logits_warps(tile: LogitsTile, qrows: int) -> int:
    """Warps of a logits program whose query tile is ``qrows`` (rows × heads) wide: twice the
    tile's from 128 on (the score tile's accumulator then spans two warp groups)."""
    return tile.num_warps * (2 if qrows >= 128 else 1)


def indexer_table(target: Target | None) -> IndexerTable:
    """The table of ``target``'s family (None: the H200)."""
    if target is None:
        return INDEXER_TABLES["fp8"]
    if target is INTERPRETER or target.backend == "interpreter":
        return INDEXER_TABLES["interpreter"]
    if target.is_hip:
        return INDEXER_TABLES["wave64" if target.warp_size == 64 else "wave32"]
    return INDEXER_TABLES["fp8" if int(target.arch) >= 89 else "fp16"]


def pow2_at_least(n: int, floor: int = 1) -> int:
    return max(floor, 1 << max(0, n - 1).bit_length())


def select_warps(entries: int, table: IndexerTable) -> int:
    """Warps of a top-k program holding ``entries`` candidates."""
    warps = pow2_at_least(-(-entries // table.entries_per_warp), 4)
    return min(warps, table.max_warps)


def logits_chunk(programs_per_row: int, max_context_len: int, block_n: int) -> int:
    """Positions per logits program so that each row spreads over ``programs_per_row``
    programs: a multiple of ``block_n``, at least :data:`MIN_LOGITS_CHUNK`."""
    per = -(-max_context_len // max(1, programs_per_row))
    per = max(per, MIN_LOGITS_CHUNK)
    return -(-per // block_n) * block_n


def logits_grid(requests: int, max_context_len: int, sms: int, tile: LogitsTile,
                waves: int = 4) -> tuple[int, int]:  # fmt: skip
    """``(chunk, programs per request)`` of the logits kernels: ``waves`` × SMs programs in
    all, each request's positions cut evenly."""
    per_row = max(1, -(-waves * sms // max(1, requests)))
    chunk = logits_chunk(per_row, max(1, max_context_len), tile.block_n)
    return chunk, max(1, -(-max_context_len // chunk))


@dataclass(frozen=True)
class TopkPlan:
    """The top-k of ``rows`` rows of ``cols`` columns: ``chunk`` columns per first-level
    program (a power of two), ``regions`` chunks a row, then merge levels of ``group`` regions
    each (``levels``: regions in after each level)."""

    k: int
    kp: int  # k rounded up to a power of two: a region's capacity
    chunk: int
    regions: int
    group: int
    levels: tuple[int, ...]

    @property
    def single(self) -> bool:
        """One program a row writes the output: no merge."""
        return self.regions == 1

    def path(self, table: IndexerTable, rows: int, sms: int) -> str:
        """The top-k path ``table`` takes for this plan of ``rows`` rows (rows of one program
        take the levels' single grid whatever the table says)."""
        if self.single:
            return "levels"
        if table.topk_path == "auto":  # the digits' programs sum every chunk's histograms:
            # up to DIGIT_MAX_CHUNKS a row (256K columns in chunks of 4,096)
            few_programs = rows * self.regions < sms
            chunks = -(-self.regions * self.chunk // table.digit_chunk)
            return "digits" if few_programs and chunks <= DIGIT_MAX_CHUNKS else "levels"
        if table.topk_path == "histogram" and not self.histogram_serves(table.select_entries):
            return "levels"
        return table.topk_path

    def histogram_serves(self, select_entries: int) -> bool:
        """Whether the histogram path takes this plan: more than one chunk, and room in its
        last program's list for ``k`` kept entries and one more region."""
        return not self.single and 2 * self.kp <= select_entries


def merge_levels(regions: int, group: int) -> tuple[int, ...]:
    """Regions left after each merge level (the last is 1)."""
    levels = []
    while regions > 1:
        regions = -(-regions // group)
        levels.append(regions)
    return tuple(levels)


def topk_plan(rows: int, cols: int, k: int, sms: int,
              select_entries: int = SELECT_ENTRIES) -> TopkPlan:  # fmt: skip
    """Rows up to ``select_entries`` columns take one program each; longer rows are cut into
    chunks of that many (each keeps at most ``k`` of them), merged ``select_entries // kp``
    regions at a time: the fewest levels (launches), each level's programs as wide as the
    registers allow."""
    kp = pow2_at_least(k, 16)
    group = max(2, select_entries // kp)
    if cols <= select_entries:
        return TopkPlan(k, kp, pow2_at_least(max(cols, 1), 16), 1, group, ())
    chunk = max(select_entries, 2 * kp)
    regions = -(-cols // chunk)
    return TopkPlan(k, kp, chunk, regions, group, merge_levels(regions, group))


@dataclass(frozen=True)
class FusedPlan:
    """The fused logits + top-k kernel: ``chunk`` positions per program, ``regions`` programs
    a request, candidate lists of ``cap`` entries (``k`` kept and a tile's worth of room:
    2 × ``kp`` from ``k`` = 64 on), then merge levels of ``group`` regions."""

    k: int
    kp: int
    cap: int
    chunk: int
    regions: int
    group: int
    levels: tuple[int, ...]


def fused_plan(requests: int, max_context_len: int, k: int, sms: int, tile: LogitsTile,
               select_entries: int = SELECT_ENTRIES) -> FusedPlan:  # fmt: skip
    """Chunks of at least 4 × ``kp`` positions (so that a list keeps a fraction of its
    chunk), as many as give two programs per SM; merges of ``select_entries`` candidates."""
    kp = pow2_at_least(k, 16)
    group = max(2, select_entries // kp)
    per_row = max(1, -(-2 * sms // max(1, requests)))
    chunk = max(-(-max_context_len // per_row), 4 * kp)
    chunk = -(-chunk // tile.block_n) * tile.block_n
    regions = max(1, -(-max_context_len // chunk))
    cap = pow2_at_least(kp + tile.block_n)  # room for the k kept and one more tile
    return FusedPlan(k, kp, cap, chunk, regions, group, merge_levels(regions, group))


def fused_serves(rows: int, max_context_len: int) -> bool:
    """``fused="auto"``: the fused kernel only where the two-pass path's ``[rows,
    max_context_len]`` float32 logits would exceed :data:`FUSED_MIN_LOGITS_BYTES`: the
    two-pass path is the faster one wherever both were timed (``docs/design/indexer.md``),
    and its logits are small beside the keys it reads (4 bytes a position against 132)."""
    return rows * max_context_len * 4 > FUSED_MIN_LOGITS_BYTES
